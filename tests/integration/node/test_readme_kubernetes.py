"""The README's Kubernetes section, as written, on a real node: kubelet + containerd run the
operator from the image built from our Dockerfile, the API server calls its webhook through its
Service, the injected native sidecar and the probe run in a real training Pod of a batch/v1 Job, and
the verdict lands in the DAMProfile's status.

The cluster is tests/support/nodecluster.py (fixture ``node_cluster``); the chart is installed once
for the package (``operator_installed``, tests/integration/node/conftest.py) by the real Helm engine
into ``dam-system`` labelled ``pod-security.kubernetes.io/enforce: restricted`` (docs/install.md §3).
The training image and scripts: tests/support/node_jobs.py. The README's profile and Job are
created by the fixture ``scenarios`` together with the other scenarios' Jobs
(test_node_scenarios.py), in their own namespace, and run beside them; this test then follows the
README's steps on them (the verdict of a Job that has ended stays in the status: ``kubectl wait``
started after it still returns).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.node_jobs import (
    IMAGE_REPOSITORY,
    RELEASE,
    SYSTEM_NS,
    TORCH_IN_POD,
    dump,
    get,
    version,
)
from tests.support.nodecluster import NodeCluster
from tests.support.operator_harness import wait_for

from .conftest import Launched

# The node's start (~10 s), the chart's rollout, the Job's start and two 30 s windows of
# examples/damprofile.yaml, then the Job's end.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PROFILE = "train-profile"


def test_readme_kubernetes_section_on_a_real_node_gives_data_for_a_starved_job(
    scenarios: Launched,
) -> None:
    node: NodeCluster = scenarios.node
    ns = scenarios.ns("readme")
    ml = ("-n", ns)
    try:
        _readme_steps(scenarios, node, ns, ml)
    except BaseException:
        dump(node, ns)
        raise


def _readme_steps(scenarios: Launched, node: NodeCluster, ns: str, ml: tuple[str, str]) -> None:
    # The operator Pod: started by the kubelet from our image, restricted, Ready through its probes.
    (op_pod,) = get(node, "-n", SYSTEM_NS, "get", "pods", "-l", "app.kubernetes.io/component=operator")[
        "items"
    ]
    assert op_pod["status"]["phase"] == "Running"
    assert all(c["ready"] for c in op_pod["status"]["containerStatuses"])
    assert op_pod["spec"]["containers"][0]["image"] == f"{IMAGE_REPOSITORY}:{version()}"
    # The operator filled in the webhook's caBundle (it serves with that certificate).
    ca_bundle = wait_for(
        lambda: get(node, "get", "mutatingwebhookconfiguration", RELEASE)["webhooks"][0]["clientConfig"].get(
            "caBundle"
        ),
        60,
        "the operator to fill in the webhook's caBundle",
    )
    assert ca_bundle

    # README: kubectl apply -f examples/damprofile.yaml, then the training Job (the fixture did both).
    def pod() -> dict[str, Any] | None:
        items = get(node, *ml, "get", "pods", "-l", "job-name=starved")["items"]
        return items[0] if items else None

    created = wait_for(pod, 60, "the Job's Pod")
    # The webhook was called through its Service and injected the native sidecar and the probe.
    init = {c["name"]: c for c in created["spec"].get("initContainers", [])}
    sidecars = [c for c in init.values() if c.get("restartPolicy") == "Always"]
    assert sidecars, f"no native sidecar injected: {sorted(init)}"
    train = next(c for c in created["spec"]["containers"] if c["name"] == "train")
    env = {e["name"]: e.get("value") for e in train.get("env", [])}
    assert env["PYTHONPATH"].endswith(TORCH_IN_POD) and env["PYTHONPATH"] != TORCH_IN_POD, env

    running = wait_for(
        lambda: (p := pod()) and p["status"].get("podIP") and p,
        120,
        "the training Pod to run",
    )
    assert running["status"]["podIP"].startswith("10.244.0.")

    # README: kubectl wait --for=jsonpath='{.status.bottleneck.axis}'=Data damp/train-profile
    node.kubectl(
        *ml,
        "wait",
        "--for=jsonpath={.status.bottleneck.axis}=Data",
        f"damp/{PROFILE}",
        "--timeout=240s",
        timeout_s=260,
    )
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

    # The Job completes with the sidecar in its Pod (a native sidecar does not hold a Job open).
    node.kubectl(*ml, "wait", "--for=condition=Complete", "job/starved", "--timeout=240s", timeout_s=260)
    finished = pod()
    assert finished is not None
    assert finished["status"]["phase"] == "Succeeded"
    assert any(
        s["name"] in {c["name"] for c in sidecars}
        for s in finished["status"].get("initContainerStatuses", [])
    )

    # Events on the profile: the verdict was announced.
    events = get(node, *ml, "get", "events", "--field-selector", f"involvedObject.name={PROFILE}")["items"]
    assert any("Data" in (e.get("message") or "") for e in events), [e.get("message") for e in events]
