"""The node tier's shared setup: the chart installed once (package scope), and every scenario's
Job created at once, each in its own namespace with its own DAMProfile, so that the node runs them
side by side while the tests, one per scenario, wait on their own results (the tier's time is the
longest scenario, not their sum). The fault tests come last and share the same operator.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.node_jobs import WORKLOADS, chart_installed, profile, training_job
from tests.support.nodecluster import NodeCluster
from tests.support.operator_harness import REPO


@pytest.fixture(scope="package")
def operator_installed(node_cluster: NodeCluster) -> Iterator[NodeCluster]:
    with chart_installed(node_cluster) as node:
        yield node


@dataclass
class Scenario:
    name: str
    profile: dict[str, Any]
    jobs: list[dict[str, Any]]
    script: Path
    namespace: str = ""


@dataclass
class Launched:
    """The scenarios on the node, and every status their profiles had (polled every second):
    a verdict of a Job that finished before its test ran is still in the history."""

    node: NodeCluster
    started: float
    rendezvous: Path
    scenarios: dict[str, Scenario] = field(default_factory=dict)
    history: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def ns(self, name: str) -> str:
        return self.scenarios[name].namespace

    def record(self) -> None:
        while not self.stop.wait(1.0):
            try:
                items = self.node.api("GET", "/apis/dam.mlsys.dev/v1alpha1/damprofiles").get("items", [])
            except Exception:  # the API server restarting, or the node going down: poll again
                continue
            for item in items:
                status = item.get("status") or {}
                seen = self.history.setdefault(item["metadata"]["namespace"], [])
                if status and (not seen or seen[-1] != status):
                    seen.append(status)


def _ddp_job(rendezvous: Path) -> dict[str, Any]:
    """Two Pods of an Indexed Job, one rank each; rank 1's loader sleeps 20 ms a sample."""
    job = training_job("ddp", "ddp.py", ["250", "1", "20"], completions=2, parallelism=2)
    job["spec"]["completionMode"] = "Indexed"
    pod = job["spec"]["template"]["spec"]
    pod["containers"][0]["env"] += [
        {
            "name": "RANK",
            "valueFrom": {
                "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}
            },
        },
        {"name": "WORLD_SIZE", "value": "2"},
        {"name": "GLOO_SOCKET_IFNAME", "value": "eth0"},
        {"name": "RENDEZVOUS_DIR", "value": "/rdv"},
    ]
    pod["containers"][0]["volumeMounts"].append({"name": "rdv", "mountPath": "/rdv"})
    pod["volumes"].append({"name": "rdv", "hostPath": {"path": str(rendezvous), "type": "Directory"}})
    return job


def _scenarios(rendezvous: Path) -> list[Scenario]:
    train = REPO / "examples" / "train.py"
    starved = ["--scenario", "starved", "--sample-delay-ms", "15", "--batch-size", "16"]
    return [
        # limits.cpu 300m: the kubelet's CFS quota throttles the decode in the training process.
        # Long enough to be running when its test scrapes the sidecar (it deletes the Job then).
        Scenario(
            "cpu",
            profile(),
            [training_job("decode", "decode.py", ["240"], limits={"cpu": "300m", "memory": "1Gi"})],
            WORKLOADS / "decode.py",
        ),
        # Two workers grow 32 MiB/s each, in 64 MiB steps (a step near the limit is more than
        # reclaim can free, so the kernel kills at once instead of thrashing the page cache): a
        # worker passes the trainer's resident memory after ~8 s (a scrape sees the workers hold
        # it) and the 2 GiB limit after ~20 s.
        Scenario(
            "loader-oom",
            profile(),
            [training_job("leaky", "leaky_loader.py", ["64", "2"], limits={"memory": "2Gi"})],
            WORKLOADS / "leaky_loader.py",
        ),
        # The training process itself grows 256 MiB a step: killed seconds after it starts, before
        # a window.
        Scenario(
            "trainer-oom",
            profile(),
            [training_job("hog", "hog.py", ["256", "0.5"], limits={"memory": "1Gi"})],
            WORKLOADS / "hog.py",
        ),
        Scenario("ddp", profile(), [_ddp_job(rendezvous)], WORKLOADS / "ddp.py"),
        # Apply: the Job's second Pod (completions 2, one at a time) is created after the first
        # Pod's verdict; the webhook gives it the lever, and one window of it is the "after".
        Scenario(
            "apply",
            profile(hysteresis_windows=1, actions={"mode": "Apply", "warmupWindows": 0}),
            [training_job("apply", "train.py", [*starved, "--seconds", "70"], completions=2)],
            train,
        ),
        # A long starved Job the fault tests act on, after the verdict tests.
        Scenario(
            "faults",
            profile(),
            [training_job("faults", "train.py", [*starved, "--seconds", "900"])],
            train,
        ),
    ]


@pytest.fixture(scope="package")
def scenarios(operator_installed: NodeCluster) -> Iterator[Launched]:
    node = operator_installed
    rendezvous = Path(tempfile.mkdtemp(prefix="dam-node-rdv-"))
    launched = Launched(node, time.monotonic(), rendezvous)
    for s in _scenarios(rendezvous):
        s.namespace = node.create_namespace(node.namespace_name_for(s.name))
        launched.scenarios[s.name] = s
        node.kubectl("-n", s.namespace, "apply", "-f", "-", input=json.dumps(s.profile))
        node.kubectl("-n", s.namespace, "create", "configmap", "train", f"--from-file={s.script}")
    time.sleep(2)  # the operator's watch delivers the profiles before the Pods are created
    for s in launched.scenarios.values():
        for job in s.jobs:
            node.kubectl("-n", s.namespace, "apply", "-f", "-", input=json.dumps(job))
    recorder = threading.Thread(target=launched.record, name="status-history", daemon=True)
    recorder.start()
    try:
        yield launched
    finally:
        launched.stop.set()
        recorder.join(10)
        if node.running:
            for s in launched.scenarios.values():
                node.kubectl("delete", "namespace", s.namespace, "--wait=false", check=False)
        shutil.rmtree(rendezvous, ignore_errors=True)
