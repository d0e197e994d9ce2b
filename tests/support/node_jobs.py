"""What the node tier's tests put on the node: the chart installed as users install it, DAMProfiles,
training Jobs with real PyTorch, and the few reads and waits they share.

The training image is the user's: here the locally made base image (python:3.11.13-slim-bookworm)
with this machine's PyTorch mounted read-only from the test environment's site-packages (hostPath,
allowed in the test namespaces, which are not restricted): PyPI's torch for Linux is the CUDA build,
about 3 GB with its nvidia-* wheels, and copying it into an image for every cold run would cost
minutes and gigabytes for nothing the tests check. The training scripts are ConfigMaps
(``examples/train.py`` and ``tests/integration/node/workloads/*.py``) mounted at ``/train``.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from tests.support.nodecluster import NodeCluster
from tests.support.operator_harness import CHART, REPO
from tests.support.procs import wait_for

RELEASE = "dam-operator"
SYSTEM_NS = "dam-system"
OPERATOR_SELECTOR = "app.kubernetes.io/component=operator"
IMAGE_REPOSITORY = "ghcr.io/mlsys/dam-operator"  # what tools/image/build.sh names the image
TRAINER_IMAGE = "python:3.11.13-slim-bookworm"  # the locally made base (tools/image/build.sh base)
HOST_SITE_PACKAGES = Path(torch.__file__).resolve().parents[1]
TORCH_IN_POD = "/opt/host-site-packages"
WORKLOADS = REPO / "tests" / "integration" / "node" / "workloads"
SIDECAR_CONTAINER = "dam-sidecar"  # dam_operator.cluster.steps.injection.SIDECAR_CONTAINER


def version() -> str:
    for line in (REPO / "pyproject.toml").read_text().splitlines():
        if line.startswith("version"):
            return line.split('"')[1]
    raise AssertionError("no version in pyproject.toml")


def get(node: NodeCluster, *args: str) -> Any:
    return json.loads(node.kubectl(*args, "-o", "json").stdout)


def dump(node: NodeCluster, namespace: str) -> None:
    """What a human would look at first, printed for a failed run (pytest shows it then)."""
    for args in (
        ("get", "pods", "-o", "wide"),
        ("get", "events", "--sort-by=.lastTimestamp"),
        ("get", "damp", "-o", "yaml"),
        ("logs", "-l", "app.kubernetes.io/name=dam-operator", "--tail=80", "--all-containers"),
    ):
        done = node.kubectl("-n", namespace, *args, check=False)
        print(f"$ kubectl -n {namespace} {' '.join(args)}\n{done.stdout}{done.stderr}")


@contextlib.contextmanager
def chart_installed(node: NodeCluster) -> Iterator[NodeCluster]:
    """docs/install.md §3 word for word: the namespace, its label, `helm install` with the image.

    The real Helm engine (helm-python-sdk's ``Config.install``: Helm's own install action, release
    stored in a Secret, CRDs from ``crds/``)."""
    import helm_python as helm

    node.kubectl("create", "namespace", SYSTEM_NS)
    node.kubectl("label", "namespace", SYSTEM_NS, "pod-security.kubernetes.io/enforce=restricted")
    config = helm.Config(kubeconfig_path=str(node.kubeconfig), namespace=SYSTEM_NS)
    try:
        with helm.Chart.load(CHART) as chart:
            config.install(
                chart,
                RELEASE,
                {
                    "image": {"repository": IMAGE_REPOSITORY, "tag": version()},
                    # Loosened for the "shared" scenario alone (a profile that asks for a shared
                    # process namespace): every other profile here does not ask, and gets none.
                    "sidecar": {"allowShareProcessNamespace": True},
                    # For the "stall" scenario (spec.actions.onStall: Restart): pods delete.
                    "rbac": {"stallRestart": True},
                },
                namespace=SYSTEM_NS,
                timeout=300,
            )
        node.kubectl(
            "-n", SYSTEM_NS, "rollout", "status", "deploy/dam-operator", "--timeout=240s", timeout_s=260
        )
        yield node
    finally:
        if node.running:
            dump(node, SYSTEM_NS)
            config.uninstall(RELEASE)
            node.kubectl("delete", "namespace", SYSTEM_NS, "--wait=false", check=False)
        config.close()


def profile(
    name: str = "train-profile",
    *,
    window_seconds: float = 10,
    hysteresis_windows: int = 2,
    actions: dict[str, Any] | None = None,
    thresholds: dict[str, float] | None = None,
    evaluation: dict[str, Any] | None = None,
    share_process_namespace: bool = False,
    hardware: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A DAMProfile for the pods labelled app=trainer: examples/damprofile.yaml's sidecar and
    threshold, shorter windows (the scenarios run side by side for tens of seconds each);
    ``thresholds`` are added to its ``dataWaitSuspect``, ``evaluation`` (``stallAfterSeconds``, ...)
    to its windows."""
    spec: dict[str, Any] = {
        "selector": {"matchLabels": {"app": "trainer"}},
        "evaluation": {
            "windowSeconds": window_seconds,
            "hysteresisWindows": hysteresis_windows,
            **(evaluation or {}),
        },
        "thresholds": {"dataWaitSuspect": 0.05, **(thresholds or {})},
        "sidecar": {
            "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}
        },
    }
    if actions:
        spec["actions"] = actions
    if hardware:
        spec["hardware"] = hardware
    if share_process_namespace:
        spec["sidecar"]["shareProcessNamespace"] = True
    return {
        "apiVersion": "dam.mlsys.dev/v1alpha1",
        "kind": "DAMProfile",
        "metadata": {"name": name},
        "spec": spec,
    }


def training_container(
    script: str, args: list[str], *, limits: dict[str, str] | None = None
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "train",
        "image": TRAINER_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python3", f"/train/{script}", *args],
        # A literal PYTHONPATH: the webhook puts the probe in front of it.
        "env": [{"name": "PYTHONPATH", "value": TORCH_IN_POD}, {"name": "OMP_NUM_THREADS", "value": "1"}],
        "volumeMounts": [
            {"name": "train", "mountPath": "/train", "readOnly": True},
            {"name": "torch", "mountPath": TORCH_IN_POD, "readOnly": True},
        ],
    }
    if limits:
        container["resources"] = {"limits": limits, "requests": limits}
    return container


def training_job(
    name: str,
    script: str,
    args: list[str],
    *,
    limits: dict[str, str] | None = None,
    completions: int = 1,
    parallelism: int = 1,
) -> dict[str, Any]:
    """A batch/v1 Job (``restartPolicy: Never``, no retries) running ``/train/SCRIPT ARGS``."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,
            "completions": completions,
            "parallelism": parallelism,
            "template": {
                "metadata": {"labels": {"app": "trainer"}},
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 5,
                    "containers": [training_container(script, args, limits=limits)],
                    "volumes": [
                        {"name": "train", "configMap": {"name": "train"}},
                        {"name": "torch", "hostPath": {"path": str(HOST_SITE_PACKAGES), "type": "Directory"}},
                    ],
                },
            },
        },
    }


def as_user(job: dict[str, Any], uid: int = 1000) -> dict[str, Any]:
    """``job`` with its Pod run as ``uid`` (``runAsNonRoot``), as the README's trainer runs."""
    job["spec"]["template"]["spec"]["securityContext"] = {
        "runAsUser": uid,
        "runAsGroup": uid,
        "runAsNonRoot": True,
    }
    return job


def with_shm(job: dict[str, Any], size: str = "256Mi") -> dict[str, Any]:
    """``job`` with a memory-backed ``/dev/shm`` of ``size`` (an ``emptyDir`` with ``medium:
    Memory``), as PyTorch Jobs with DataLoader workers mount one: the container runtime's default
    is 64 MiB, and the probe refuses to add loader workers over a /dev/shm that small (their
    batches travel through it: dam_probe.overrides.MIN_SHM_BYTES)."""
    pod = job["spec"]["template"]["spec"]
    pod["volumes"].append({"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": size}})
    for container in pod["containers"]:
        container["volumeMounts"].append({"name": "shm", "mountPath": "/dev/shm"})
    return job


def pods_of(node: NodeCluster, namespace: str, job: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = get(node, "-n", namespace, "get", "pods", "-l", f"job-name={job}")["items"]
    return sorted(items, key=lambda p: p["metadata"]["creationTimestamp"])


def status_of(node: NodeCluster, namespace: str, name: str = "train-profile") -> dict[str, Any]:
    status: dict[str, Any] = get(node, "-n", namespace, "get", "damp", name).get("status") or {}
    return status


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or () if c.get("type") == kind), {})


def wait_status(
    node: NodeCluster,
    namespace: str,
    check: Callable[[dict[str, Any]], bool],
    timeout_s: float,
    what: str,
    *,
    name: str = "train-profile",
) -> dict[str, Any]:
    """Poll the profile's status until ``check`` holds; fail with the last status seen."""
    seen: list[dict[str, Any]] = [{}]

    def probe() -> dict[str, Any] | None:
        seen[0] = status_of(node, namespace, name)
        return seen[0] if check(seen[0]) else None

    try:
        return wait_for(probe, timeout_s, what, interval=1.0)
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}; last status of {namespace}/{name}:\n{json.dumps(seen[0], indent=1)}"
        ) from None


def events_of(node: NodeCluster, namespace: str, name: str = "train-profile") -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = get(
        node, "-n", namespace, "get", "events", "--field-selector", f"involvedObject.name={name}"
    )["items"]
    return items


def scrape_sidecar(pod: dict[str, Any], port: int = 9450, timeout_s: float = 5.0) -> str:
    """The sidecar's /metrics at the Pod's address (on the node's own bridge)."""
    import urllib.request

    with urllib.request.urlopen(f"http://{pod['status']['podIP']}:{port}/metrics", timeout=timeout_s) as r:
        text: str = r.read().decode()
    return text


def since(t0: float) -> str:
    return f"{time.monotonic() - t0:.0f} s"
