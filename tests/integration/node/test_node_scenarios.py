"""Verdicts and faults on a real node: the kubelet's own limits, the kernel's OOM killer, DDP between
Pods, Apply mode, and the operator's, sidecar's and webhook's failures, each on real Pods.

Every scenario's Job was created at once by the package fixture ``scenarios``
(tests/integration/node/conftest.py), each in its own namespace with its own DAMProfile (10 s
windows, 2 for a verdict); each test here waits on its own result. The fault tests come last: they
stop and restart parts the verdict tests rely on.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from dam_contract import names
from dam_probe.lastwords import parse as parse_last_words
from tests.support.node_jobs import (
    OPERATOR_SELECTOR,
    SIDECAR_CONTAINER,
    SYSTEM_NS,
    WORKLOADS,
    condition,
    dump,
    events_of,
    get,
    pods_of,
    scrape_sidecar,
    status_of,
    training_job,
    wait_status,
)
from tests.support.nodecluster import NodeCluster
from tests.support.procs import wait_for

from . import ground_truth
from .conftest import RESTART_GRACE_SECONDS, STALL_AFTER_SECONDS, STALL_STEPS, Launched

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@contextlib.contextmanager
def explained(launched: Launched, scenario: str) -> Iterator[str]:
    """The scenario's namespace; on a failure, what a human would look at first is printed."""
    ns = launched.ns(scenario)
    try:
        yield ns
    except BaseException:
        dump(launched.node, ns)
        raise


def _terminated(pod: dict[str, Any], container: str = "train") -> dict[str, Any]:
    for cs in pod["status"].get("containerStatuses") or ():
        if cs["name"] == container:
            terminated: dict[str, Any] = (cs.get("state") or {}).get("terminated") or {}
            return terminated
    return {}


def _metric(text: str, name: str, labels: str = "") -> float | None:
    for line in text.splitlines():
        if line.startswith(f"{name}{labels} ") or (not labels and line.startswith(f"{name}{{")):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_cpu_limit_of_300m_on_a_decode_heavy_loader_gives_raise_cpu_limit(scenarios: Launched) -> None:
    """The kubelet's CFS quota for limits.cpu 300m throttles the trainer. The throttling reaches the
    sidecar through the probe, which reads its own container's cgroup from inside the trainer: the
    sidecar's /sys/fs/cgroup is its own container's, and the trainer's cgroup files behind
    /proc/PID/root need ptrace rights a restricted, non-root sidecar lacks (docs/sidecar.md)."""
    node = scenarios.node
    with explained(scenarios, "cpu") as ns:
        running = wait_for(
            lambda: next(
                (p for p in pods_of(node, ns, "decode") if p["status"].get("phase") == "Running"), None
            ),
            120,
            "the decode Pod to run",
        )
        status = scenarios.seen(
            "cpu",
            lambda s: (s.get("bottleneck") or {}).get("lever") == "raise-cpu-limit",
            180,
            "lever raise-cpu-limit",
        )
        text = scrape_sidecar(running)
        assert _metric(text, names.CONTAINER_CPU_SOURCE, f'{{source="{names.CPU_SOURCE_PROBE}"}}') == 1.0, (
            text
        )
        assert _metric(text, names.CONTAINER_CPU_LIMIT_CORES) == pytest.approx(0.3), text
        assert (_metric(text, names.CONTAINER_CPU_THROTTLED_SECONDS_TOTAL) or 0.0) > 0.0, text
        assert status["bottleneck"]["regime"] == "input-bound", status["bottleneck"]
        assert status["metrics"]["cpuThrottledRatio"] > 0.0, status["metrics"]  # 0.16 on a loaded node
        assert status["pods"]["reporting"] == 1, status["pods"]
        node.kubectl("-n", ns, "delete", "job", "decode", "--wait=false")  # 240 s of 0.3 CPU otherwise


def _memory_capacity(launched: Launched, scenario: str) -> dict[str, Any]:
    """The scenario's first status with a memory-capacity verdict (from the status history)."""
    return launched.seen(
        scenario,
        lambda s: (s.get("bottleneck") or {}).get("regime") == "memory-capacity",
        180,
        "regime memory-capacity",
    )


def _failed(node: NodeCluster, ns: str, job: str) -> dict[str, Any]:
    """The Job's one Pod once it has failed: the container status is read then (the verdict can
    come from the probe's count of a killed worker before the trainer exits)."""
    (pod,) = pods_of(node, ns, job)
    node.kubectl(
        "-n", ns, "wait", "--for=jsonpath={.status.phase}=Failed", f"pod/{pod['metadata']['name']}",
        "--timeout=120s", timeout_s=130,
    )  # fmt: skip
    (pod,) = pods_of(node, ns, job)
    return pod


def test_loader_workers_over_the_memory_limit_are_oom_killed_and_give_reduce_loader_memory(
    scenarios: Launched,
) -> None:
    node = scenarios.node
    with explained(scenarios, "loader-oom") as ns:
        status = _memory_capacity(scenarios, "loader-oom")
        assert status["bottleneck"]["lever"] == "reduce-loader-memory", status["bottleneck"]
        # The verdict can come (from the probe's count of the killed worker) before the trainer has
        # exited on DataLoader's error: the container status is read once the Pod has failed.
        pod = _failed(node, ns, "leaky")
        # The kernel took a worker; the trainer then exited on DataLoader's error (exit 1).
        assert _terminated(pod) == _terminated(pod) | {"reason": "OOMKilled", "exitCode": 1}, pod["status"]
        assert pod["status"]["phase"] == "Failed"


def test_a_loader_killed_a_second_after_start_gives_reduce_loader_memory_from_the_probes_last_words(
    scenarios: Launched,
) -> None:
    """Issue 28 item 8: whichever process the kernel picked and however fast, the loader's lever.
    The kernel takes a worker within about a second of the loop's start, before any scrape; the
    trainer exits 1 on DataLoader's error (not 137). The probe's last words (its loader's workers
    and the kill) reach the operator in the container's termination message, written by uid 1000
    into the kubelet's file: the very first memory-capacity verdict names the loader."""
    node = scenarios.node
    with explained(scenarios, "loader-oom-fast") as ns:
        status = _memory_capacity(scenarios, "loader-oom-fast")
        pod = _failed(node, ns, "leakyfast")
        terminated = _terminated(pod)
        assert terminated == terminated | {"reason": "OOMKilled", "exitCode": 1}, pod["status"]
        (words,) = parse_last_words(terminated.get("message") or "")
        assert words.loader_workers == 2 and words.worker_kills >= 1, terminated
        assert status["bottleneck"]["lever"] == "reduce-loader-memory", status["bottleneck"]
        evidence = status["bottleneck"]["evidence"]
        assert any(
            "the OOM killer took the loader, not the training process" in e
            or e.startswith("a child of the training")
            for e in evidence
        ), evidence
        assert not any(e.startswith("the training process was OOM-killed") for e in evidence), evidence


def test_trainer_container_oom_killed_gives_memory_capacity_from_the_container_status(
    scenarios: Launched,
) -> None:
    node = scenarios.node
    with explained(scenarios, "trainer-oom") as ns:
        status = _memory_capacity(scenarios, "trainer-oom")
        (pod,) = pods_of(node, ns, "hog")
        assert _terminated(pod) == _terminated(pod) | {"reason": "OOMKilled", "exitCode": 137}, pod["status"]
        evidence = " ".join(status["bottleneck"]["evidence"])
        assert f"pod {pod['metadata']['name']}: container train was OOM-killed" in evidence, evidence
        assert "the training process was OOM-killed (reason OOMKilled, exit code 137" in evidence, evidence
        assert "judged from the kubelet's container status" in evidence, evidence


def test_two_pod_ddp_over_gloo_names_the_slow_loader_pod_a_data_straggler(scenarios: Launched) -> None:
    node = scenarios.node
    with explained(scenarios, "ddp") as ns:
        status = scenarios.seen(
            "ddp", lambda s: bool((s.get("bottleneck") or {}).get("straggler")), 180, "a straggler"
        )
        pods = {
            p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]: p
            for p in pods_of(node, ns, "ddp")
        }
        assert sorted(pods) == ["0", "1"], sorted(pods)
        assert pods["0"]["status"]["podIP"] != pods["1"]["status"]["podIP"]
        straggler = status["bottleneck"]["straggler"]
        assert straggler["pod"] == pods["1"]["metadata"]["name"], straggler
        assert straggler["rank"] == 1, straggler
        assert straggler["cause"] == "Data", straggler
        assert status["pods"] | {"matched": 2, "reporting": 2} == status["pods"], status["pods"]
        events = [e.get("reason") for e in events_of(node, ns)]
        assert "StragglerDetected" in events, events
        node.kubectl("-n", ns, "wait", "--for=condition=Complete", "job/ddp", "--timeout=180s", timeout_s=190)


def _own_cpu_wait_ratio(log: str) -> float:
    """The trainer's own run-queue wait over its run, from the line contended.py ends with."""
    match = re.search(r"waited [0-9.]+ s for a CPU in [0-9.]+ s: ratio ([0-9.]+)", log)
    assert match, f"contended.py's last line is not in its log:\n{log[-2000:]}"
    return float(match.group(1))


def _own_wait_between(log: str, start: float, end: float) -> float:
    """The trainer's run-queue wait per wall second between ``start`` and ``end`` (Unix seconds),
    interpolated from the cumulative figures contended.py logs once a second."""
    match = re.search(r"contended.py: waits (\[.*\])", log)
    assert match, f"contended.py's waits are not in its log:\n{log[-2000:]}"
    points = [(float(t), float(w)) for t, w in json.loads(match.group(1))]
    assert points and points[0][0] <= start and points[-1][0] >= end, (points[:2], points[-2:], start, end)

    def at(when: float) -> float:
        for (t0, w0), (t1, w1) in itertools.pairwise(points):
            if t0 <= when <= t1:
                return w0 + (w1 - w0) * ((when - t0) / (t1 - t0) if t1 > t0 else 0.0)
        raise AssertionError(when)

    return (at(end) - at(start)) / (end - start)


def test_a_cpu_bound_trainer_beside_a_noisy_neighbour_pod_gives_raise_cpu_request(
    scenarios: Launched,
) -> None:
    """Issue 20's busy node, on a real node: the trainer's run-queue delay reaches the sidecar
    through the probe (schedstat of its own process) and the verdict asks for CPUs of its own.

    Nothing here races the Job: the verdict is read from the status history (recorded since the
    Jobs started), and the figure it rests on is checked against the trainer's own, which it
    prints when it ends (read from its log once the Job is Complete)."""
    node = scenarios.node
    with explained(scenarios, "contended") as ns:
        status = scenarios.seen(
            "contended",
            lambda s: (s.get("bottleneck") or {}).get("lever") == "raise-cpu-request",
            180,
            "lever raise-cpu-request",
        )
        b = status["bottleneck"]
        assert (b["axis"], b["regime"]) == ("Machine", "compute-bound"), b
        assert status["metrics"]["cpuWaitRatio"] >= 0.2, status["metrics"]  # ~0.6 beside two loops
        assert any("waited for a CPU" in e for e in b["evidence"]), b["evidence"]
        assert status["pods"]["matched"] == 1, status["pods"]  # the neighbour Pod is not instrumented
        (neighbour,) = pods_of(node, ns, "noisy")
        assert not any(c["name"] == SIDECAR_CONTAINER for c in neighbour["spec"]["containers"])
        node.kubectl(
            "-n", ns, "wait", "--for=condition=Complete", "job/contended", "--timeout=180s", timeout_s=190
        )
        (trainer,) = pods_of(node, ns, "contended")
        log = node.kubectl("-n", ns, "logs", trainer["metadata"]["name"], "-c", "train").stdout
        own = _own_cpu_wait_ratio(log)
        assert own >= 0.2, own  # the contention is real: the trainer's own schedstat says so
        # The sidecar's figure (the probe's schedstat, over the profile's 10 s window) against the
        # trainer's own over the same 10 s of wall time (its cumulative wait, read once a second).
        ended = dt.datetime.fromisoformat(status["lastEvaluationTime"].replace("Z", "+00:00")).timestamp()
        same_window = _own_wait_between(log, ended - 10.0, ended)
        assert abs(status["metrics"]["cpuWaitRatio"] - same_window) <= 0.25, (
            status["metrics"]["cpuWaitRatio"],
            same_window,
            own,
        )
        node.kubectl("-n", ns, "delete", "job", "noisy", "contended", "--wait=false")


def test_apply_mode_gives_the_jobs_next_pod_the_loader_lever_and_records_what_it_measured(
    scenarios: Launched,
) -> None:
    node = scenarios.node
    with explained(scenarios, "apply") as ns:
        status = scenarios.seen(
            "apply",
            lambda s: any(a.get("outcome") not in (None, "pending") for a in s.get("actions") or ()),
            300,
            "an action judged on the Job's next Pod",
        )
        first, second = pods_of(node, ns, "apply")[:2]
        action = status["actions"][0]  # the next one may be planned in the window that judged it
        assert action["lever"] == "increase-dataloader-workers", action
        assert action["setting"]["name"] == "num_workers", action
        assert action["pod"] == second["metadata"]["name"], (action, first["metadata"]["name"])
        # The webhook gave the second Pod the setting; the first ran without it.
        annotation = "dam.mlsys.dev/action"
        assert second["metadata"]["annotations"].get(annotation, "").endswith(":applied"), second["metadata"]
        assert (
            annotation not in first["metadata"].get("annotations", {})
            or first["metadata"]["annotations"][annotation] != second["metadata"]["annotations"][annotation]
        )
        train = next(c for c in second["spec"]["containers"] if c["name"] == "train")
        overrides = {e["name"]: e.get("value") for e in train["env"]}.get("DAM_LOADER_OVERRIDES")
        assert overrides and json.loads(overrides)["num_workers"] == int(action["setting"]["after"]), (
            overrides
        )
        for side in ("before", "after"):
            assert action[side]["stepsPerSecond"] > 0, action
            assert 0 <= action[side]["dataWaitRatio"] <= 1, action
        assert action["outcome"] in ("improved", "no-change", "worse", "rolled-back"), action
        # The setting reached the loader: the probe started the worker (it refuses one over a
        # 64 MiB /dev/shm) and the sidecar counted it in the window that judged the action.
        logs = node.kubectl("-n", ns, "logs", second["metadata"]["name"], "-c", "train", check=False).stdout
        assert "overrides not applied" not in logs, logs
        assert status["metrics"].get("workerCount", 0) >= int(action["setting"]["after"]), status["metrics"]


def test_a_finished_jobs_verdict_stays_and_a_kubectl_wait_started_after_it_returns(
    scenarios: Launched,
) -> None:
    """The README's Job (examples/trainer-job.yaml) is Complete and its Pod Succeeded: no pod of the
    profile is active, and the last verdict stays, as a VPA keeps its recommendation."""
    node = scenarios.node
    with explained(scenarios, "readme") as ns:
        node.kubectl(
            "-n", ns, "wait", "--for=condition=Complete", "job/train", "--timeout=240s", timeout_s=250
        )
        kept = wait_status(
            node,
            ns,
            lambda s: condition(s, "Reporting").get("reason") == "NoActivePods",
            75,  # a 30 s window of examples/damprofile.yaml after the Pod ended
            "Reporting=False NoActivePods",
        )
        assert kept["bottleneck"]["axis"] == "Data", kept["bottleneck"]
        assert kept["pods"]["matched"] == 0, kept["pods"]
        assert "the last verdict is kept from" in condition(kept, "Reporting")["message"], kept
        node.kubectl(
            "-n",
            ns,
            "wait",
            "--for=jsonpath={.status.bottleneck.axis}=Data",
            "damp/train-profile",
            "--timeout=5s",
        )


def _unix(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _stall_started(scenarios: Launched, timeout_s: float) -> tuple[float, str]:
    """When rank 1 of stall.py's first attempt stopped, and its Pod: its marker in the Pods' shared
    directory (written by rename, whole or not at all), which outlives the deleted Pods."""
    path = scenarios.rendezvous / "stall" / "stalled"
    text = wait_for(lambda: path.read_text() if path.exists() else None, timeout_s, "stall.py's marker")
    at, pod = text.split()
    return float(at), pod


def test_a_rank_asleep_before_an_all_reduce_is_the_stalls_culprit_and_the_restarted_job_resumes(
    scenarios: Launched,
) -> None:
    """Issue 29 on a real node (workloads/stall.py): rank 1 sleeps in its own code while rank 0
    waits in the all_reduce it has not reached. Every deadline is the profile's thresholds from the
    stall's start (the marker rank 1 writes just before it sleeps), with a slack of 15 s for a
    scrape and a busy node; the statuses are read from the history (recorded since the Jobs
    started: the restart may be over when this test starts). Nothing races the job: the first
    attempt's ranks wait an hour, and the second runs to its end, which is waited for."""
    node = scenarios.node
    window = scenarios.scenarios["stall"].profile["spec"]["evaluation"]["windowSeconds"]  # type: ignore[index]
    slack = 15.0
    steps, stall_step, _ = STALL_STEPS
    sleep_line = next(
        n
        for n, line in enumerate((WORKLOADS / "stall.py").read_text().splitlines(), 1)
        if "time.sleep(3600)" in line
    )
    with explained(scenarios, "stall") as ns:
        began, culprit_pod = _stall_started(scenarios, 240)  # the Pods start, then ~12 s of steps

        def by(deadline: float) -> float:
            return max(1.0, deadline - time.time())

        stalled_by = began + STALL_AFTER_SECONDS + 2 * window + slack
        stalled = scenarios.seen(
            "stall", lambda s: (s.get("progress") or {}).get("state") == "Stalled", by(stalled_by), "Stalled"
        )
        assert _unix(stalled["lastEvaluationTime"]) <= stalled_by, (stalled["lastEvaluationTime"], began)
        progress = stalled["progress"]
        # Its last batch, to the second, on the operator's clock (moved by the scrape's age).
        assert began - 2 <= _unix(progress["since"]) <= began + 5, (progress, began)
        assert progress["stalledSeconds"] >= STALL_AFTER_SECONDS, progress
        culprit = progress["culprit"]
        assert (culprit["rank"], culprit["pod"], culprit["where"]) == (1, culprit_pod, "user-code"), culprit
        assert culprit["frames"][0] == f"stall.py:{sleep_line} hang", culprit
        # Rank 0 entered step STALL_STEP's all_reduce, one a step from the first.
        assert progress["waiting"] == {
            "ranks": 1,
            "where": "collective",
            "detail": f"all_reduce #{stall_step + 1}",
        }, progress["waiting"]
        progressing = condition(stalled, "Progressing")
        assert (progressing.get("status"), progressing.get("reason")) == ("False", "Stalled"), progressing
        assert "rank 1 in user-code" in progressing.get("message", ""), progressing

        # The restart: once the stall has lasted its threshold plus the grace, at the next window.
        restart_by = began + STALL_AFTER_SECONDS + RESTART_GRACE_SECONDS + window + slack
        restarted = scenarios.seen(
            "stall",
            lambda s: bool(((s.get("progress") or {}).get("restart") or {}).get("at")),
            by(restart_by),
            "status.progress.restart",
        )
        restart = restarted["progress"]["restart"]
        assert restart["outcome"] == "pending", restart
        assert restart["stallSince"] == progress["since"], (restart, progress)
        assert restart["stalledSeconds"] >= STALL_AFTER_SECONDS + RESTART_GRACE_SECONDS, restart
        earliest = began + STALL_AFTER_SECONDS + RESTART_GRACE_SECONDS - 1  # (status times: to the second)
        assert earliest <= _unix(restart["at"]) <= restart_by, (restart, began)
        old = restart["pods"]
        assert len(old) == 2 and culprit_pod in old, restart
        reasons = [e.get("reason") for e in events_of(node, ns)]
        assert "JobStalled" in reasons and "StalledJobRestarted" in reasons, reasons

        # The Indexed Job recreates both ranks (after its failure backoff); they take steps again.
        def replacements() -> list[dict[str, Any]] | None:
            fresh = [p for p in pods_of(node, ns, "stall") if p["metadata"]["name"] not in old]
            return fresh if len(fresh) == 2 else None

        new = wait_for(replacements, 120, "the Job's two replacement Pods", interval=1.0)
        indexes = sorted(
            p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] for p in new
        )
        assert indexes == ["0", "1"], indexes
        created = max(_unix(p["metadata"]["creationTimestamp"]) for p in new)
        resumed = scenarios.seen(
            "stall",
            lambda s: ((s.get("progress") or {}).get("restart") or {}).get("outcome") == "resumed",
            by(created + 75),  # their start (torch's import on a busy node), steps, a window
            "restart outcome resumed",
        )
        progress = resumed["progress"]
        restart = progress["restart"]
        assert progress["state"] == "Progressing", progress
        assert _unix(restart["resumedAt"]) > _unix(restart["at"]), restart
        assert restart["stallCostSeconds"] == pytest.approx(
            _unix(restart["resumedAt"]) - _unix(restart["stallSince"]), abs=0.2
        ), restart
        assert restart["stallCostSeconds"] > STALL_AFTER_SECONDS + RESTART_GRACE_SECONDS, restart
        assert condition(resumed, "Progressing").get("status") == "True", condition(resumed, "Progressing")
        assert resumed["goodput"]["badputSeconds"]["stalled"] > 0, resumed["goodput"]
        assert "JobProgressing" in [e.get("reason") for e in events_of(node, ns)]

        # The second attempt ran to its end: both ranks, every step.
        node.kubectl(
            "-n", ns, "wait", "--for=condition=Complete", "job/stall", "--timeout=120s", timeout_s=130
        )
        for pod in new:
            log = node.kubectl("-n", ns, "logs", pod["metadata"]["name"], "-c", "train").stdout
            assert f"attempt 2 done after {steps} steps" in log, log[-2000:]
        # The replacements restarted the job: the deletion to their first batch is restart badput.
        goodput = status_of(node, ns).get("goodput") or {}
        assert goodput.get("restarts", 0) >= 2, goodput
        assert (goodput.get("badputSeconds") or {}).get("restart", 0) > 0, goodput


# --- faults, on the same operator, after the verdicts above ---------------------------------------


def _faults_ready(scenarios: Launched) -> tuple[str, dict[str, Any]]:
    node = scenarios.node
    ns = scenarios.ns("faults")
    wait_status(node, ns, lambda s: (s.get("bottleneck") or {}).get("axis") == "Data", 180, "a Data verdict")
    (pod,) = [p for p in pods_of(node, ns, "faults") if p["status"].get("phase") == "Running"]
    return ns, pod


def _sidecar_status(pod: dict[str, Any]) -> dict[str, Any]:
    return next(s for s in pod["status"].get("initContainerStatuses") or () if s["name"] == SIDECAR_CONTAINER)


@pytest.mark.timeout(900)
def test_two_pods_one_deleted_mid_run_give_goodput_by_cause_and_mfu_within_the_jobs_own_truth(
    scenarios: Launched,
) -> None:
    """Issue 28's ground truth (ground_truth.py): after the verdict tests (its Jobs run beside
    theirs from the start), before the faults."""
    with ground_truth.explained(scenarios, "truth"):
        ground_truth.check_two_pods(scenarios)


@pytest.mark.timeout(900)
def test_one_pod_of_torchrun_ranks_gives_the_same_mfu_per_step_rate_as_two_pods_and_its_own_goodput(
    scenarios: Launched,
) -> None:
    with ground_truth.explained(scenarios, "truth-1pod"):
        ground_truth.check_one_pod(scenarios)


def test_killed_sidecar_container_restarts_and_the_operator_reports_the_gap_then_recovers(
    scenarios: Launched,
) -> None:
    node = scenarios.node
    with explained(scenarios, "faults"):
        ns, pod = _faults_ready(scenarios)
        name = pod["metadata"]["name"]
        container_id = _sidecar_status(pod)["containerID"].removeprefix("containerd://")
        killed_at = dt.datetime.now(dt.UTC)
        node.ctr("tasks", "kill", "--signal", "SIGKILL", container_id)
        restarted = wait_for(
            lambda: (
                (s := _sidecar_status(get(node, "-n", ns, "get", "pod", name)))["restartCount"] >= 1
                and "running" in s["state"]
                and s
            ),
            60,
            "the native sidecar to restart",
        )
        assert restarted["lastState"]["terminated"]["exitCode"] == 137, restarted
        gap = wait_status(
            node,
            ns,
            lambda s: condition(s, "Reporting").get("status") == "False",
            60,
            "the Reporting condition to report the sidecar's gap",
        )
        assert name in condition(gap, "Reporting")["message"], condition(gap, "Reporting")
        recovered = wait_status(
            node,
            ns,
            lambda s: (
                condition(s, "Reporting").get("status") == "True"
                and dt.datetime.fromisoformat(s["lastEvaluationTime"]) > killed_at
                and (s.get("bottleneck") or {}).get("axis") == "Data"
            ),
            90,
            "Reporting again, with a Data verdict",
        )
        assert recovered["pods"]["reporting"] == 1, recovered["pods"]


def test_deleted_operator_pod_comes_back_with_the_status_intact_and_no_duplicate_event(
    scenarios: Launched,
) -> None:
    node = scenarios.node
    with explained(scenarios, "faults"):
        ns, _ = _faults_ready(scenarios)
        before = status_of(node, ns)
        events_before = sorted((e["reason"], e["message"], e.get("count", 1)) for e in events_of(node, ns))
        (old,) = get(node, "-n", SYSTEM_NS, "get", "pods", "-l", OPERATOR_SELECTOR)["items"]
        node.kubectl("-n", SYSTEM_NS, "delete", "pod", old["metadata"]["name"], "--wait=false")
        deleted_at = dt.datetime.now(dt.UTC)

        def new_pod_ready() -> dict[str, Any] | None:
            for p in get(node, "-n", SYSTEM_NS, "get", "pods", "-l", OPERATOR_SELECTOR)["items"]:
                ready = all(c.get("ready") for c in p["status"].get("containerStatuses") or [{}])
                if (
                    p["metadata"]["uid"] != old["metadata"]["uid"]
                    and ready
                    and p["status"].get("phase") == "Running"
                ):
                    return p
            return None

        wait_for(new_pod_ready, 120, "the Deployment's new operator Pod to be Ready", interval=1.0)
        after = wait_status(
            node,
            ns,
            lambda s: (
                dt.datetime.fromisoformat(s["lastEvaluationTime"]) > deleted_at + dt.timedelta(seconds=1)
            ),
            90,
            "a window evaluated by the new operator",
        )
        # What must survive the restart: the verdict (axis, regime) and when it began (since), as
        # the new operator resumes it from the status. The lever may legitimately move with the
        # node's load (a busy node's raise-cpu-request, then the loader's), and with it nothing
        # else; a regime that changed in between is a new verdict, with its own Event.
        b0, b1 = before["bottleneck"], after["bottleneck"]
        assert b1["axis"] == b0["axis"] == "Data", (b0, b1)
        events_after = sorted((e["reason"], e["message"], e.get("count", 1)) for e in events_of(node, ns))
        if b1["regime"] == b0["regime"]:
            assert b1["since"] == b0["since"], (b0, b1)
            # No Event posted again by the new operator (same names, same counts).
            assert events_after == events_before, (events_before, events_after)
        else:
            assert set(events_before) <= set(events_after), (events_before, events_after)


def test_pod_created_while_the_webhook_is_down_starts_uninstrumented_and_is_reported(
    scenarios: Launched,
) -> None:
    node = scenarios.node
    with explained(scenarios, "faults") as ns:
        node.kubectl("-n", SYSTEM_NS, "scale", "deploy/dam-operator", "--replicas=0")
        try:
            wait_for(
                lambda: not get(node, "-n", SYSTEM_NS, "get", "pods", "-l", OPERATOR_SELECTOR)["items"],
                60,
                "the operator Pod to be gone",
                interval=0.5,
            )
            job = training_job("late", "train.py", ["--scenario", "starved", "--seconds", "120"])
            node.kubectl("-n", ns, "apply", "-f", "-", input=json.dumps(job))
            (late,) = wait_for(
                lambda: pods_of(node, ns, "late"), 60, "the Job's Pod (admitted: failurePolicy Ignore)"
            )
            assert not late["spec"].get("initContainers"), late["spec"]
        finally:
            node.kubectl("-n", SYSTEM_NS, "scale", "deploy/dam-operator", "--replicas=1")
        node.kubectl(
            "-n", SYSTEM_NS, "rollout", "status", "deploy/dam-operator", "--timeout=120s", timeout_s=130
        )
        name = late["metadata"]["name"]
        status = wait_status(
            node,
            ns,
            lambda s: name in ((s.get("pods") or {}).get("notInstrumented") or ()),
            90,
            "the uninstrumented Pod in status.pods.notInstrumented",
        )
        instrumented = condition(status, "Instrumented")
        assert instrumented.get("status") == "False" and name in instrumented.get("message", ""), instrumented
        assert status["pods"]["matched"] == 2 and status["pods"]["instrumented"] == 1, status["pods"]
        late_now = get(node, "-n", ns, "get", "pod", name)
        assert late_now["status"].get("phase") in ("Pending", "Running"), late_now["status"]
