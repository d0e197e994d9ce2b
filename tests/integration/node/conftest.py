"""The node tier's shared setup: the chart installed once (package scope), and every scenario's
Job created at once, each in its own namespace with its own DAMProfile, so that the node runs them
side by side while the tests, one per scenario, wait on their own results (the tier's time is the
longest scenario, not their sum). The operator is the one README.md's Kubernetes block installs,
by its own commands (tests/support/node_readme.py), and the README's profile and example Job
(examples/damprofile.yaml, examples/trainer-job.yaml) are one of the scenarios, created by the
README's commands in their namespace. The fault tests come last and share the same operator.

The workloads are light on purpose (two cores run ten Pods at once): loaders that sleep, tiny
models, runs of tens of seconds; a verdict that outlives its Job (the operator keeps the last
verdict once no pod is active) lets the Jobs end early.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support import node_readme
from tests.support.node_jobs import WORKLOADS, as_user, profile, training_job, with_shm
from tests.support.nodecluster import NodeCluster
from tests.support.operator_harness import REPO
from tests.support.procs import wait_for


@pytest.fixture(scope="package")
def operator_installed(node_cluster: NodeCluster) -> Iterator[NodeCluster]:
    with node_readme.operator_installed(node_cluster) as node:
        yield node


@dataclass
class Scenario:
    name: str
    profile: dict[str, Any] | None
    """A DAMProfile; None: the README's commands create the profile, the ConfigMap and the Job."""
    jobs: list[dict[str, Any]]
    script: Path | None
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
    deletion: dict[str, Any] = field(default_factory=dict)
    """What ``delete_truth_rank`` did: ``pod``, ``at`` (Unix s), ``after`` (the status write it
    followed, its ``lastEvaluationTime``); ``error`` if it could not."""

    def ns(self, name: str) -> str:
        return self.scenarios[name].namespace

    def seen(
        self, scenario: str, check: Callable[[dict[str, Any]], bool], timeout_s: float, what: str
    ) -> dict[str, Any]:
        """The first status the scenario's profile had (since the Jobs started) for which ``check`` holds."""
        history = self.history.setdefault(self.ns(scenario), [])
        try:
            return wait_for(
                lambda: next((s for s in list(history) if check(s)), None), timeout_s, what, interval=1.0
            )
        except AssertionError as exc:
            shown = [(s.get("bottleneck") or {}).get("lever") for s in history]
            last = json.dumps(history[-1] if history else {}, indent=1)
            raise AssertionError(f"{exc}; levers seen: {shown}; last status:\n{last}") from None

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


def _truth_step(shared: Path, rank: int) -> int:
    """The latest step rank ``rank``'s truth files (workloads/truth.py) logged, 0 before any."""
    latest = 0
    for path in shared.glob(f"truth-{rank}-*.jsonl"):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if record.get("kind") == "step":
                    latest = max(latest, int(record["step"]))
    return latest


def delete_truth_rank(launched: Launched, shared: Path) -> None:
    """The truth scenario's fault, driven by the job's own progress (no test races it): once rank
    1 logged step TRUTH_DELETE_STEP, at the profile's next status write (a scrape just happened),
    the marker of attempt 2 (the replacements' store) and ``kubectl delete pod`` of rank 1's Pod.
    Gives up after 10 minutes (the test then fails on ``launched.deletion``)."""
    deadline = time.monotonic() + 600
    ns = launched.ns("truth")
    try:
        while _truth_step(shared, 1) < TRUTH_DELETE_STEP:
            if launched.stop.wait(0.5) or time.monotonic() > deadline:
                return
        history = launched.history.setdefault(ns, [])
        seen = len(history)
        while len(history) == seen:
            if launched.stop.wait(0.2) or time.monotonic() > deadline:
                return
        after = history[-1].get("lastEvaluationTime")
        pods = launched.node.api("GET", f"/api/v1/namespaces/{ns}/pods?labelSelector=job-name%3Dtruth")
        (pod,) = [
            p["metadata"]["name"]
            for p in pods.get("items", [])
            if p["metadata"]["annotations"].get("batch.kubernetes.io/job-completion-index") == "1"
            and p["status"].get("phase") == "Running"
        ]
        (shared / "attempt-2").write_text(f"{time.time():.3f}\n")
        launched.node.kubectl("-n", ns, "delete", "pod", pod, "--wait=false")
        launched.deletion.update(pod=pod, at=time.time(), after=after)
    except Exception as exc:  # reported by the test that reads it
        launched.deletion["error"] = repr(exc)


def _two_ranks(job: dict[str, Any], rendezvous: Path) -> dict[str, Any]:
    """``job`` as two Pods of an Indexed Job, one rank each (the completion index), rendezvousing
    in ``rendezvous`` (a hostPath both Pods mount, /rdv), gloo over the Pods' eth0."""
    job["spec"] |= {"completionMode": "Indexed", "completions": 2, "parallelism": 2}
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


def _ddp_job(rendezvous: Path) -> dict[str, Any]:
    """Rank 1's loader sleeps 20 ms a sample: 150 steps of 0.32 s, ~50 s, three 10 s windows and a
    baseline."""
    return _two_ranks(training_job("ddp", "ddp.py", ["150", "1", "20"]), rendezvous)


STALL_AFTER_SECONDS = 20
"""The stall scenario's spec.evaluation.stallAfterSeconds (its steps are far shorter than 1/10 of it)."""
RESTART_GRACE_SECONDS = 10
"""... and its spec.actions.restartGraceSeconds."""
STALL_STEPS = (120, 48, 15)
"""stall.py's STEPS, STALL_STEP, DELAY_MS: 16 samples of 15 ms a step, ~0.25 s; the first attempt's
rank 1 stops after ~12 s of steps, the second attempt runs ~30 s."""


def _stall_job(rendezvous: Path) -> dict[str, Any]:
    """stall.py's two ranks (workloads/stall.py), in a directory of their own (its marker and
    stores). Each deleted Pod is a failure of the Job (the Job controller counts a Pod deleted
    before it succeeded as failed), so backoffLimit leaves room for the restart's two, and the
    Job's failure backoff (10 s, doubled per failure: ~20 s) passes before the replacements are
    created. podReplacementPolicy Failed: a replacement is created once the deleted Pod has ended,
    not while it terminates (the default, TerminatingOrFailed), so the attempts never overlap."""
    shared = rendezvous / "stall"
    shared.mkdir()
    job = _two_ranks(training_job("stall", "stall.py", [str(n) for n in STALL_STEPS]), shared)
    job["spec"] |= {"backoffLimit": 4, "podReplacementPolicy": "Failed"}
    container = job["spec"]["template"]["spec"]["containers"][0]
    container["env"].append({"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
    return job


TRUTH_PEAK_FLOPS = 1e10
"""The truth scenarios' spec.hardware.peakFlops: a CPU-only job's MFU is against the peak its
profile declares (the GPU table has no CPU)."""
TRUTH_ARGS = {"steps": 600, "save_every": 60, "delay_ms": 1, "ckpt_mib": 96, "tail_s": 15}
"""truth.py's STEPS SAVE_EVERY DELAY_MS CKPT_MIB TAIL_S for the two-Pod layout (600 steps: the
deletion falls mid-run however fast the node; torchrun's Pod runs as many): ~20 steps/s on a quiet
machine (mostly data wait: the tier's other Pods share the 2 cores), 3-5 beside them; rank 0
saving 96 MiB every 60 steps; the quiet tail outlives a window, so the last scrape has seen every
step."""
TRUTH_DELETE_STEP = 220
"""Rank 1's step past which (40 after the save at step 180) the deleter deletes its Pod, right
after the profile's next status write (a window's scrape just happened: the work no scrape saw is
a second or two)."""


def _truth_job(rendezvous: Path) -> dict[str, Any]:
    """truth.py's two Pods (workloads/truth.py, layout ``pods``), in a directory of their own (its
    stores, truth files, checkpoint and attempt markers). Deleting rank 1's Pod fails rank 0's
    collective: both Pods end (one deleted, one Failed) and the Indexed Job replaces them
    (backoffLimit leaves room; ``podReplacementPolicy: Failed``: a replacement once its
    predecessor has ended, so the attempts never overlap)."""
    shared = rendezvous / "truth"
    shared.mkdir()
    args = ["pods", *(str(v) for v in TRUTH_ARGS.values())]
    job = _two_ranks(training_job("truth", "truth.py", args), shared)
    job["spec"] |= {"backoffLimit": 4, "podReplacementPolicy": "Failed"}
    return job


def _truth_torchrun_job(rendezvous: Path) -> dict[str, Any]:
    """The same work as ``_truth_job`` in one Pod: torchrun's two ranks (layout ``torchrun``),
    ``TRUTH_ARGS``' 600 steps, no restart: its MFU is checked in the windows its steps filled,
    and a window is sure to fall inside its steps only when they last two windows and a second
    (21 s); 360 steps at the 21.8 steps/s of a quiet node lasted 16.5 s, and no window did (a
    clean-clone run). 600 last 27 s even at that speed."""
    shared = rendezvous / "truth-1pod"
    shared.mkdir()
    args = ["torchrun", *(str(v) for v in TRUTH_ARGS.values())]
    job = training_job("truth", "truth.py", args)
    container = job["spec"]["template"]["spec"]["containers"][0]
    container["command"] = [
        "python3", "-m", "torch.distributed.run", "--nproc-per-node", "2", "/train/truth.py", *args,
    ]  # fmt: skip
    container["env"].append({"name": "RENDEZVOUS_DIR", "value": "/rdv"})
    container["volumeMounts"].append({"name": "rdv", "mountPath": "/rdv"})
    pod = job["spec"]["template"]["spec"]
    pod["volumes"].append({"name": "rdv", "hostPath": {"path": str(shared), "type": "Directory"}})
    return job


def _contended_jobs(seconds: int = 90) -> list[dict[str, Any]]:
    """The trainer and its neighbours (label app=noisy: the profile's selector skips them)."""
    cpu = str(max(os.sched_getaffinity(0)))
    neighbours = training_job("noisy", "contended.py", ["spin", str(seconds), cpu, "2"])
    neighbours["spec"]["template"]["metadata"]["labels"] = {"app": "noisy"}
    return [neighbours, training_job("contended", "contended.py", ["train", str(seconds), cpu])]


def _scenarios(rendezvous: Path) -> list[Scenario]:
    train = REPO / "examples" / "train.py"
    starved = ["--scenario", "starved", "--sample-delay-ms", "15", "--batch-size", "16"]
    fixed = ["--scenario", "fixed", "--workers", "2", "--sample-delay-ms", "5", "--batch-size", "16"]
    return [
        # README.md's Kubernetes block (test_readme_kubernetes.py), its own commands: examples/
        # damprofile.yaml as it is (30 s windows) and examples/trainer-job.yaml (Job "train", the
        # starved shape for 75 s). Its first window at most 30 s after the profile is a baseline,
        # the next a Data verdict (the first known verdict replaces Unknown at once); the verdict
        # stays after the Job ends.
        Scenario("readme", None, [], None),
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
        # Issue 28 item 8: the fast loader OOM. Each sample keeps 64 MiB in its worker with no
        # pause: under a 1200Mi limit the kernel kills a worker about a second after the loop
        # starts, before any scrape; the trainer then exits 1 on DataLoader's error. As uid 1000:
        # the probe's last words go into the kubelet's termination-message file as a non-root user.
        Scenario(
            "loader-oom-fast",
            profile(),
            [as_user(training_job("leakyfast", "leaky_loader.py", ["64", "0"], limits={"memory": "1200Mi"}))],
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
        # Issue 29: rank 1 of a two-Pod gloo job sleeps in its own code before an all_reduce that
        # rank 0 waits in (the first attempt only). Stalled after 20 s without a batch; 10 s
        # later the operator deletes both Pods (the chart grants it: rbac.stallRestart), the
        # Indexed Job recreates them, and the second attempt runs to its end.
        Scenario(
            "stall",
            profile(
                evaluation={"stallAfterSeconds": STALL_AFTER_SECONDS},
                actions={"onStall": "Restart", "restartGraceSeconds": RESTART_GRACE_SECONDS},
            ),
            [_stall_job(rendezvous)],
            WORKLOADS / "stall.py",
        ),
        # Issue 28's ground truth (test_node_ground_truth.py): a job that logs where its seconds
        # went, as two Pods (rank 1's deleted mid-run by the deleter thread) and as one Pod of
        # torchrun's two ranks; goodput by cause and MFU against the job's own figures.
        Scenario(
            "truth",
            profile(hardware={"peakFlops": TRUTH_PEAK_FLOPS}),
            [_truth_job(rendezvous)],
            WORKLOADS / "truth.py",
        ),
        Scenario(
            "truth-1pod",
            profile(hardware={"peakFlops": TRUTH_PEAK_FLOPS}),
            [_truth_torchrun_job(rendezvous)],
            WORKLOADS / "truth.py",
        ),
        # A single-thread CPU-bound trainer beside a noisy neighbour Pod (two busy loops, not
        # instrumented), both pinned to the last CPU: the trainer waits for it ~2/3 of the time.
        # The default data-wait screen (10 %): under contention the main-process collate waits for
        # the CPU too, a few per cent of the step, over the 5 % the other scenarios use.
        Scenario(
            "contended",
            profile(thresholds={"dataWaitSuspect": 0.10}),
            _contended_jobs(),
            WORKLOADS / "contended.py",
        ),
        # Apply: the Job's second Pod (completions 2, one at a time) is created after the first
        # Pod's verdict; the webhook gives it the lever, and one window of it is the "after".
        # cpuWaitSuspect 0.95: what this scenario checks is the DataLoader lever reaching the next
        # Pod; ten Pods starting at once on two cores can put the trainer's run-queue delay past
        # the default 0.20, and the busy-node rule would then ask for CPU (raise-cpu-request, not
        # an Apply lever) instead. 45 s a Pod: a verdict after two 10 s windows, then the after.
        # A 256 MiB /dev/shm (with_shm): over the default 64 MiB the probe refuses the workers.
        Scenario(
            "apply",
            profile(
                hysteresis_windows=1,
                actions={"mode": "Apply", "warmupWindows": 0},
                thresholds={"cpuWaitSuspect": 0.95},
            ),
            [with_shm(training_job("apply", "train.py", [*starved, "--seconds", "45"], completions=2))],
            train,
        ),
        # Issue 25: the same Job (a loader with two workers) in a Pod of a profile that does not ask
        # for a shared process namespace (the default) and in one of a profile that asks (the chart
        # allows it on this node): test_node_process_namespace.py compares what each sidecar sees.
        *(
            Scenario(
                name,
                profile(share_process_namespace=name == "shared"),
                # Long enough to outlive the tests before it in the tier (the test deletes it).
                [training_job("procs", "train.py", [*fixed, "--seconds", "300"])],
                train,
            )
            for name in ("unshared", "shared")
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
        s.namespace = node.create_namespace(node.namespace_name_for("ml" if s.name == "readme" else s.name))
        launched.scenarios[s.name] = s
        if s.profile is None:  # README.md: the profile, its SpecValid, the ConfigMap and the Job
            kubeconfig = node_readme.kubeconfig_for(node, s.namespace)
            node_readme.run(node_readme.job_part(kubeconfig), kubeconfig, timeout_s=120)
            continue
        node.kubectl("-n", s.namespace, "apply", "-f", "-", input=json.dumps(s.profile))
        node.kubectl("-n", s.namespace, "create", "configmap", "train", f"--from-file={s.script}")
    time.sleep(2)  # the operator's watch delivers the profiles before the Pods are created
    for s in launched.scenarios.values():
        for job in s.jobs:
            node.kubectl("-n", s.namespace, "apply", "-f", "-", input=json.dumps(job))
    recorder = threading.Thread(target=launched.record, name="status-history", daemon=True)
    recorder.start()
    deleter = threading.Thread(
        target=delete_truth_rank, args=(launched, rendezvous / "truth"), name="truth-deleter", daemon=True
    )
    deleter.start()
    try:
        yield launched
    finally:
        launched.stop.set()
        recorder.join(10)
        deleter.join(10)
        if node.running:
            for s in launched.scenarios.values():
                node.kubectl("delete", "namespace", s.namespace, "--wait=false", check=False)
        shutil.rmtree(rendezvous, ignore_errors=True)
