"""README.md's Kubernetes block, run as written on a real node, so that the README cannot drift from
what works: kubelet + containerd run the operator from the image built from our Dockerfile, the API
server calls its webhook through its Service, the injected native sidecar and the probe run in the
example Job's Pod (examples/trainer-job.yaml: real PyTorch, the machine's torch mounted), and the
verdict lands in the DAMProfile's status and in ``kubectl get damp``.

The block's commands run where tests/support/node_readme.py says: its install part is the node tier's
operator (fixture ``operator_installed``), its job part runs in the "readme" scenario's namespace
beside the other scenarios' Jobs (fixture ``scenarios``), and its watch part (the verdict's ``kubectl
wait``, ``kubectl get damp``) runs here. Substituted, and nothing else: ``make cluster`` (the
session's node, the same cluster), the kubeconfig's path (that node's admin kubeconfig; a copy
defaulting to the scenario's namespace), the tier's chart values on the ``helm install`` line, and
``make cluster-down`` (not run: the node stops at the session's end). The verdict of a Job that has
ended stays in the status, so the README's ``kubectl wait`` returns however late this test starts.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support import node_readme
from tests.support.node_jobs import IMAGE_REPOSITORY, RELEASE, SYSTEM_NS, dump, get, version
from tests.support.nodecluster import NodeCluster
from tests.support.operator_harness import wait_for

from .conftest import Launched

# The node's start (~10 s), the chart's rollout, the Job's start and two 30 s windows of
# examples/damprofile.yaml.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PROFILE = "train-profile"  # examples/damprofile.yaml's metadata.name
TORCH_IN_POD = "/opt/torch"  # examples/trainer-job.yaml's torch mount and PYTHONPATH


def test_readme_kubernetes_block_as_written_gives_data_for_the_example_job(scenarios: Launched) -> None:
    node: NodeCluster = scenarios.node
    ns = scenarios.ns("readme")
    try:
        _check(scenarios, node, ns)
    except BaseException:
        dump(node, ns)
        raise


def _check(scenarios: Launched, node: NodeCluster, ns: str) -> None:
    # README: helm install, rollout status. The operator Pod: started by the kubelet from our
    # image, restricted, Ready through its probes; it filled in the webhook's caBundle.
    (op_pod,) = get(node, "-n", SYSTEM_NS, "get", "pods", "-l", "app.kubernetes.io/component=operator")[
        "items"
    ]
    assert op_pod["status"]["phase"] == "Running"
    assert all(c["ready"] for c in op_pod["status"]["containerStatuses"])
    assert op_pod["spec"]["containers"][0]["image"] == f"{IMAGE_REPOSITORY}:{version()}"
    ca_bundle = wait_for(
        lambda: get(node, "get", "mutatingwebhookconfiguration", RELEASE)["webhooks"][0]["clientConfig"].get(
            "caBundle"
        ),
        60,
        "the operator to fill in the webhook's caBundle",
    )
    assert ca_bundle

    # README: the profile, the ConfigMap and examples/trainer-job.yaml (the fixture ran them).
    def pod() -> dict[str, Any] | None:
        items = get(node, "-n", ns, "get", "pods", "-l", f"job-name={node_readme.EXAMPLE_JOB}")["items"]
        return items[0] if items else None

    created = wait_for(pod, 60, "the example Job's Pod")
    assert created["metadata"]["labels"]["app"] == "trainer"
    # The webhook was called through its Service and injected the native sidecar and the probe,
    # the probe's directory in front of the Job's literal PYTHONPATH (the mounted torch).
    init = {c["name"]: c for c in created["spec"].get("initContainers", [])}
    sidecars = [c for c in init.values() if c.get("restartPolicy") == "Always"]
    assert sidecars, f"no native sidecar injected: {sorted(init)}"
    train = next(c for c in created["spec"]["containers"] if c["name"] == "train")
    env = {e["name"]: e.get("value") for e in train.get("env", [])}
    assert env["PYTHONPATH"].endswith(f":{TORCH_IN_POD}"), env
    assert created["spec"]["securityContext"]["runAsNonRoot"] is True

    # README: kubectl wait --for=jsonpath='{.status.bottleneck.axis}'=Data ...; kubectl get damp
    kubeconfig = node_readme.kubeconfig_for(node, ns)
    out = node_readme.run(node_readme.watch_part(kubeconfig), kubeconfig, timeout_s=330)
    assert f"damprofile.dam.mlsys.dev/{PROFILE} condition met" in out, out
    table = _table(out)
    assert table[PROFILE]["AXIS"] == "Data", table
    assert table[PROFILE]["REGIME"] == "input-bound", table
    assert {"LEVER", "CONFIDENCE", "GOODPUT"} <= table[PROFILE].keys(), table

    # The lever: the loader's (a main-process loader asks for workers first, even on a node busy
    # with the other scenarios' Pods: docs/method.md). The status history has every status the
    # profile had, also those of windows that passed while the test waited.
    status = scenarios.seen(
        "readme",
        lambda s: (s.get("bottleneck") or {}).get("lever") == "increase-dataloader-workers",
        120,
        "lever increase-dataloader-workers",
    )
    assert status["bottleneck"]["regime"] == "input-bound", status["bottleneck"]
    assert status["pods"]["matched"] == 1, status["pods"]
    assert status["pods"]["instrumented"] == 1, status["pods"]
    assert status["pods"]["reporting"] == 1, status["pods"]
    assert status["metrics"]["dataWaitRatio"] > 0.05, status["metrics"]  # examples/damprofile.yaml's screen

    # Real PyTorch ran in the Pod (the mounted torch imported, as the user without root).
    running = wait_for(lambda: (p := pod()) and p["status"].get("podIP") and p, 60, "the Pod's address")
    assert running["status"]["podIP"].startswith("10.244.0.")
    logs = node.kubectl("-n", ns, "logs", running["metadata"]["name"], "-c", "train", check=False)
    assert "Traceback" not in logs.stdout + logs.stderr, logs

    # Events on the profile: the verdict was announced.
    selector = f"involvedObject.name={PROFILE}"
    events = get(node, "-n", ns, "get", "events", "--field-selector", selector)["items"]
    assert any("Data" in (e.get("message") or "") for e in events), [e.get("message") for e in events]


def _table(out: str) -> dict[str, dict[str, str]]:
    """``kubectl get damp``'s table in ``out``: rows by NAME, cells by column (single-word cells)."""
    lines = out.splitlines()
    header = next((i for i, line in enumerate(lines) if line.split()[:2] == ["NAME", "AXIS"]), None)
    assert header is not None, f"no `kubectl get damp` table (NAME AXIS ...) in:\n{out}"
    columns = lines[header].split()
    rows: dict[str, dict[str, str]] = {}
    for line in lines[header + 1 :]:
        cells = line.split()
        if not cells or cells[0].startswith(("+", "damprofile")):
            break  # the end of the table: set -x's next command, or kubectl's next line
        assert len(cells) == len(columns), f"a row of `kubectl get damp` with an empty cell: {line!r}"
        rows[cells[0]] = dict(zip(columns, cells, strict=True))
    return rows
