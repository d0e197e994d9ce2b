"""The README's Kubernetes section, as written, on a real node: kubelet + containerd run the
operator from the image built from our Dockerfile, the API server calls its webhook through its
Service, the injected native sidecar and the probe run in a real training Pod of a batch/v1 Job, and
the verdict lands in the DAMProfile's status.

The cluster is tests/support/nodecluster.py (fixture ``node_cluster``). The chart is installed by the
real Helm engine (helm-python-sdk's ``Config.install``: Helm's own install action, release stored in
a Secret, CRDs from ``crds/``), into ``dam-system`` labelled ``pod-security.kubernetes.io/enforce:
restricted`` (docs/install.md §3). The training image is the user's: here the locally made base
image (python:3.11.13-slim-bookworm) with this machine's PyTorch mounted read-only from the test
environment's site-packages (hostPath, allowed in the test namespace, which is not restricted):
PyPI's torch for Linux is the CUDA build, about 3 GB with its nvidia-* wheels, and copying it into an
image for every cold run would cost minutes and gigabytes for nothing the test checks.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support.nodecluster import NodeCluster
from tests.support.operator_harness import CHART, REPO, wait_for

# The node's start (~15 s), the chart's rollout and two 30 s windows of examples/damprofile.yaml.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

RELEASE = "dam-operator"
SYSTEM_NS = "dam-system"
PROFILE = "train-profile"
IMAGE_REPOSITORY = "ghcr.io/mlsys/dam-operator"  # what tools/image/build.sh names the image
TRAINER_IMAGE = "python:3.11.13-slim-bookworm"  # the locally made base (tools/image/build.sh base)
HOST_SITE_PACKAGES = Path(torch.__file__).resolve().parents[1]
TORCH_IN_POD = "/opt/host-site-packages"


def _version() -> str:
    for line in (REPO / "pyproject.toml").read_text().splitlines():
        if line.startswith("version"):
            return line.split('"')[1]
    raise AssertionError("no version in pyproject.toml")


@pytest.fixture(scope="module")
def operator_installed(node_cluster: NodeCluster) -> Iterator[NodeCluster]:
    """docs/install.md §3 word for word: the namespace, its label, `helm install` with the image."""
    import helm_python as helm

    node = node_cluster
    node.kubectl("create", "namespace", SYSTEM_NS)
    node.kubectl("label", "namespace", SYSTEM_NS, "pod-security.kubernetes.io/enforce=restricted")
    config = helm.Config(kubeconfig_path=str(node.kubeconfig), namespace=SYSTEM_NS)
    try:
        with helm.Chart.load(CHART) as chart:
            config.install(
                chart,
                RELEASE,
                {"image": {"repository": IMAGE_REPOSITORY, "tag": _version()}},
                namespace=SYSTEM_NS,
                timeout=300,
            )
        node.kubectl(
            "-n", SYSTEM_NS, "rollout", "status", "deploy/dam-operator", "--timeout=240s", timeout_s=260
        )
        yield node
    finally:
        if node.running:
            _dump(node, SYSTEM_NS)
            config.uninstall(RELEASE)
            node.kubectl("delete", "namespace", SYSTEM_NS, "--wait=false", check=False)
        config.close()


def _dump(node: NodeCluster, namespace: str) -> None:
    """What a human would look at first, printed for a failed run (pytest shows it then)."""
    for args in (
        ("get", "pods", "-o", "wide"),
        ("get", "events", "--sort-by=.lastTimestamp"),
        ("logs", "-l", "app.kubernetes.io/name=dam-operator", "--tail=60", "--all-containers"),
    ):
        done = node.kubectl("-n", namespace, *args, check=False)
        print(f"$ kubectl -n {namespace} {' '.join(args)}\n{done.stdout}{done.stderr}")


def _training_job(name: str, args: list[str], *, limits: dict[str, str] | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "train",
        "image": TRAINER_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python3", "/train/train.py", *args],
        # A literal PYTHONPATH: the webhook puts the probe in front of it.
        "env": [{"name": "PYTHONPATH", "value": TORCH_IN_POD}],
        "volumeMounts": [
            {"name": "train", "mountPath": "/train", "readOnly": True},
            {"name": "torch", "mountPath": TORCH_IN_POD, "readOnly": True},
        ],
    }
    if limits:
        container["resources"] = {"limits": limits, "requests": limits}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {"app": "trainer"}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [container],
                    "volumes": [
                        {"name": "train", "configMap": {"name": "train"}},
                        {"name": "torch", "hostPath": {"path": str(HOST_SITE_PACKAGES), "type": "Directory"}},
                    ],
                },
            },
        },
    }


def _get(node: NodeCluster, *args: str) -> Any:
    return json.loads(node.kubectl(*args, "-o", "json").stdout)


def test_readme_kubernetes_section_on_a_real_node_gives_data_for_a_starved_job(
    operator_installed: NodeCluster,
) -> None:
    node = operator_installed
    ns = node.create_namespace(node.namespace_name_for("ml"))
    ml = ("-n", ns)

    # The operator Pod: started by the kubelet from our image, restricted, Ready through its probes.
    (op_pod,) = _get(node, "-n", SYSTEM_NS, "get", "pods", "-l", "app.kubernetes.io/component=operator")[
        "items"
    ]
    assert op_pod["status"]["phase"] == "Running"
    assert all(c["ready"] for c in op_pod["status"]["containerStatuses"])
    assert op_pod["spec"]["containers"][0]["image"] == f"{IMAGE_REPOSITORY}:{_version()}"
    # The operator filled in the webhook's caBundle (it serves with that certificate).
    ca_bundle = wait_for(
        lambda: _get(node, "get", "mutatingwebhookconfiguration", RELEASE)["webhooks"][0]["clientConfig"].get(
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
    job = _training_job(
        "starved",
        ["--scenario", "starved", "--seconds", "110", "--sample-delay-ms", "15", "--batch-size", "16"],
    )
    node.kubectl(*ml, "apply", "-f", "-", input=json.dumps(job))

    def pod() -> dict[str, Any] | None:
        items = _get(node, *ml, "get", "pods", "-l", "job-name=starved")["items"]
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
    status = _get(node, *ml, "get", "damp", PROFILE)["status"]
    assert status["bottleneck"]["regime"] == "input-bound", status["bottleneck"]
    assert status["bottleneck"]["lever"] == "increase-dataloader-workers", status["bottleneck"]
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
    events = _get(node, *ml, "get", "events", "--field-selector", f"involvedObject.name={PROFILE}")["items"]
    assert any("Data" in (e.get("message") or "") for e in events), [e.get("message") for e in events]
    node.delete_namespace(ns)
