"""The README's Kubernetes section, as written, on a real node: kubelet + containerd run the
operator from the image built from our Dockerfile, the API server calls its webhook through its
Service, the injected native sidecar and the probe run in a real training Pod of a batch/v1 Job, and
the verdict lands in the DAMProfile's status.

The cluster is tests/support/nodecluster.py (fixture ``node_cluster``); the chart is installed once
for the package (``operator_installed``, tests/integration/node/conftest.py) by the real Helm engine
into ``dam-system`` labelled ``pod-security.kubernetes.io/enforce: restricted`` (docs/install.md §3).
The training image and scripts: tests/support/node_jobs.py. The other scenarios' Jobs
(test_node_scenarios.py) are started first (fixture ``scenarios``) and run beside this one.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.support.node_jobs import (
    IMAGE_REPOSITORY,
    RELEASE,
    SYSTEM_NS,
    TORCH_IN_POD,
    get,
    training_job,
    version,
    wait_status,
)
from tests.support.nodecluster import NodeCluster
from tests.support.operator_harness import REPO, wait_for

from .conftest import Launched

# The node's start (~15 s), the chart's rollout and two 30 s windows of examples/damprofile.yaml.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PROFILE = "train-profile"


def test_readme_kubernetes_section_on_a_real_node_gives_data_for_a_starved_job(
    scenarios: Launched,
) -> None:
    node: NodeCluster = scenarios.node
    ns = node.create_namespace(node.namespace_name_for("ml"))
    ml = ("-n", ns)

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

    # README: kubectl apply -f examples/damprofile.yaml, then the training Job.
    node.kubectl(*ml, "apply", "-f", str(REPO / "examples" / "damprofile.yaml"))
    node.kubectl(*ml, "create", "configmap", "train", f"--from-file={REPO / 'examples' / 'train.py'}")
    time.sleep(2)  # the operator's watch delivers the profile before the Pod is created (docs/testing.md)
    job = training_job(
        "starved",
        "train.py",
        ["--scenario", "starved", "--seconds", "120", "--sample-delay-ms", "15", "--batch-size", "16"],
    )
    node.kubectl(*ml, "apply", "-f", "-", input=json.dumps(job))

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
        lambda: (p := pod()) and p["status"].get("phase") == "Running" and p,
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
    # The lever: the loader's. While the node starts the other scenarios' ten Pods at once (two
    # cores), the trainer's run-queue delay can pass cpuWaitSuspect and a window says Data with
    # raise-cpu-request (a busy node, docs/method.md); two calm windows later it is the loader's.
    status = wait_status(
        node,
        ns,
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
    node.delete_namespace(ns)
