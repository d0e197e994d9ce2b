"""The pure window step: the first write and every later window agree on the pods; hardware
overrides are resolved against the GPU table; the InvalidSpec Event goes out once per generation."""

from __future__ import annotations

import dataclasses
import datetime as dt
import pickle
from typing import Any

from dam_contract.snapshot import Snapshot, parse_snapshot
from dam_operator.cluster.adapters.sources import REASON_UNREACHABLE
from dam_operator.cluster.steps import status as st
from dam_operator.cluster.steps.registry import PodInfo, sidecar_restart
from dam_operator.cluster.steps.source_error import SourceError
from dam_operator.cluster.steps.spec import parse_spec
from dam_operator.cluster.steps.window_step import (
    ProfileState,
    WindowInputs,
    WindowSettings,
    decide_window,
    initial_step,
    invalid_step,
    window_step,
)
from dam_operator.diagnosis.hysteresis import Stabilizer
from tests.unit.diagnosis.snapshots import Job, Rank, snapshot_pair

WHEN = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)
SELECTOR = {"matchLabels": {"app": "t"}}


def _inputs(spec: Any, pods: Any, results: Any, **fields: Any) -> WindowInputs:
    """One window's inputs: the profile's first generation, no status yet, at WHEN, the webhook
    on and 600 s of baseline, unless ``fields`` say otherwise."""
    defaults: dict[str, Any] = {"status": {}, "generation": 1, "when": WHEN}
    settings = WindowSettings(webhook_enabled=True, max_baseline_seconds=600.0)
    return WindowInputs(spec=spec, pods=pods, results=results, settings=settings, **(defaults | fields))


def _pod(name: str, instrumented: bool) -> PodInfo:
    return PodInfo("ns", name, {"app": "t"}, pod_ip="10.0.0.1", phase="Running", instrumented=instrumented)


def _pair(job: Job) -> tuple[Snapshot, Snapshot]:
    before, after = snapshot_pair(job)
    return (
        parse_snapshot(before, timestamp_seconds=1000.0),
        parse_snapshot(after, timestamp_seconds=1000.0 + job.seconds),
    )


def _window(spec: dict[str, Any], pods: list[PodInfo], before: dict[str, Any], after: dict[str, Any]) -> Any:
    return decide_window(
        _inputs(parse_spec(spec), pods, after),
        ProfileState(stabilizer=Stabilizer(confirm_windows=1), baselines=before),
    )


def test_window_step_returns_the_next_state_and_leaves_the_one_it_was_given_as_it_was() -> None:
    """The profile's state is a value: the window reads it, returns the next one (the verdict
    now stabilized, the new baselines) and the same patch ``decide_window`` writes; the state it
    was given (stabilizer, ledger, tracker, baselines) pickles to the same bytes as before."""
    before, after = _pair(Job(seconds=30.0, steps=60.0, wait_ratio=0.5))
    spec = parse_spec({"selector": SELECTOR, "evaluation": {"windowSeconds": 30}})
    state = ProfileState(stabilizer=Stabilizer(confirm_windows=1), baselines={"a": before})
    inputs = _inputs(spec, [_pod("a", True)], {"a": after})
    frozen = pickle.dumps(state)
    nxt, result = window_step(state, inputs)
    assert pickle.dumps(state) == frozen
    assert state.stabilizer.current is None
    assert nxt.stabilizer.current is not None
    assert nxt.stabilizer.current.axis == "Data", nxt.stabilizer.current
    assert nxt.published == result.published == st.verdict_key(nxt.stabilizer.current)
    assert nxt.baselines == result.baselines
    assert nxt.baselines["a"] is not before
    again = decide_window(inputs, pickle.loads(frozen))  # the same window, the state mutated
    assert result.patch == again.patch


def test_first_write_and_later_windows_count_pods_the_same_way() -> None:
    job = Job(seconds=30.0, steps=60.0, wait_ratio=0.5)
    before, after = _pair(job)
    pods = [_pod("injected", True), _pod("by-hand", False), _pod("plain", False)]
    failure = SourceError(REASON_UNREACHABLE, "connection refused")
    first = {"injected": before, "by-hand": before, "plain": failure}
    later = {"injected": after, "by-hand": after, "plain": failure}
    spec = {"selector": SELECTOR, "evaluation": {"windowSeconds": 30}}
    init = initial_step(
        spec=parse_spec(spec),
        status={},
        generation=1,
        pods=pods,
        results=first,
        now="t",
        webhook_enabled=True,
    )
    step = _window(spec, pods, init.baselines, later)
    assert init.counts == step.counts
    assert step.counts is not None
    assert (step.counts.matched, step.counts.instrumented, step.counts.reporting) == (3, 2, 2)
    assert step.counts.uninstrumented == ["plain"]
    # A pod with no sidecar that does not answer is expected silence, not a failed scrape.
    assert init.error_reasons == step.error_reasons == []
    for result in (init, step):
        conds = {c["type"]: c for c in result.patch["status"]["conditions"]}
        assert conds[st.REPORTING]["status"] == "True", conds[st.REPORTING]


def test_an_instrumented_pod_that_fails_is_a_problem_in_both_steps() -> None:
    before, after = _pair(Job(seconds=30.0, steps=60.0, wait_ratio=0.5))
    pods = [_pod("a", True), _pod("b", True)]
    failure = SourceError(REASON_UNREACHABLE, "connection refused")
    spec = {"selector": SELECTOR}
    init = initial_step(
        spec=parse_spec(spec),
        status={},
        generation=1,
        pods=pods,
        results={"a": before, "b": failure},
        now="t",
        webhook_enabled=True,
    )
    step = _window(spec, pods, init.baselines, {"a": after, "b": failure})
    assert init.error_reasons == step.error_reasons == [REASON_UNREACHABLE]
    assert init.counts == step.counts


def test_spec_naming_only_a_gpu_model_gets_mfu_and_ridge_point_from_the_table() -> None:
    job = Job(
        seconds=30.0,
        steps=300.0,
        wait_ratio=0.01,
        gpus=[{"util": 0.99, "sm": 0.9, "tensor": 0.6, "dram": 0.3}],
    )
    before, after = _pair(job)
    spec = {
        "selector": SELECTOR,
        "hardware": {"gpuModel": "NVIDIA H100 80GB HBM3"},
        "model": {"flopsPerStep": 2e13},
    }
    step = _window(spec, [_pod("a", True)], {"a": before}, {"a": after})
    metrics = step.patch["status"]["metrics"]
    assert metrics["ridgePoint"] > 100, metrics
    assert 0 < metrics["mfu"] <= 1, metrics
    # Only peakFlops given: the table still supplies the bandwidth of the detected model.
    spec["hardware"] = {"gpuModel": "NVIDIA H100 80GB HBM3", "peakFlops": 5e14}
    mfu_half_peak = _window(spec, [_pod("a", True)], {"a": before}, {"a": after}).patch["status"]["metrics"]
    assert mfu_half_peak["ridgePoint"] < metrics["ridgePoint"]
    assert abs(mfu_half_peak["mfu"] - 2 * metrics["mfu"]) < 0.02


def test_invalid_spec_event_once_per_generation() -> None:
    first = invalid_step({}, "spec.x: bad", generation=3, now="t")
    assert [e.reason for e in first.events] == [st.REASON_INVALID]
    written = first.patch["status"]
    again = invalid_step(written, "spec.x: bad", generation=3, now="t2")  # restart, resume, metadata edit
    assert again.events == []
    assert again.patch["status"]["conditions"][0]["status"] == "False"
    newer = invalid_step(written, "spec.y: bad", generation=4, now="t3")
    assert [e.reason for e in newer.events] == [st.REASON_INVALID]


def test_a_refused_spec_lists_its_uninstrumented_pods_and_says_why_once_per_generation() -> None:
    refused = "spec.sidecar.image: 'evil:1' is not an image the cluster admin allows (sidecar.allowedImages)"
    pods = [dataclasses.replace(_pod("a", False), notes=("not-injected:sidecar-not-allowed",))]
    spec = parse_spec({"selector": SELECTOR, "sidecar": {"image": "evil:1"}})
    first = initial_step(
        spec=spec,
        status={},
        generation=2,
        pods=pods,
        results={},
        now="t",
        webhook_enabled=True,
        refused=refused,
    )
    valid = _condition(first, st.SPEC_VALID)
    assert (valid["status"], valid["reason"]) == ("False", st.REASON_REFUSED)
    assert refused in valid["message"] and "no pod is instrumented" in valid["message"]
    assert [e.reason for e in first.events] == [st.REASON_REFUSED]
    assert first.events[0].type == "Warning" and "sidecar.allowedImages" in first.events[0].message
    assert first.patch["status"]["pods"]["notInstrumented"] == ["a"]
    instrumented = _condition(first, st.INSTRUMENTED)
    assert (
        instrumented["status"] == "False"
        and "a: were admitted without the sidecar" in instrumented["message"]
    )
    written = first.patch["status"]
    again = initial_step(
        spec=spec,
        status=written,
        generation=2,
        pods=pods,
        results={},
        now="t2",
        webhook_enabled=True,
        refused=refused,
    )
    assert again.events == []  # a restart or resume does not say it twice
    newer = initial_step(
        spec=spec,
        status=written,
        generation=3,
        pods=pods,
        results={},
        now="t3",
        webhook_enabled=True,
        refused=refused,
    )
    assert [e.reason for e in newer.events] == [st.REASON_REFUSED]
    window = decide_window(
        _inputs(spec, pods, {}, status=written, generation=2, refused=refused),
        ProfileState(stabilizer=Stabilizer(confirm_windows=1), baselines={}),
    )
    assert _condition(window, st.SPEC_VALID)["reason"] == st.REASON_REFUSED
    fine = initial_step(
        spec=spec, status=written, generation=2, pods=pods, results={}, now="t", webhook_enabled=True
    )
    assert _condition(fine, st.SPEC_VALID)["status"] == "True" and fine.events == []


def _rank_pod_pair(rank: int, wait: float, collective: float) -> tuple[Snapshot, Snapshot]:
    job = Job(
        seconds=30.0,
        steps=60.0,
        main_cpu_cores=1.0,
        ranks=[Rank(rank, wait_ratio=wait, collective_ratio=collective, exposed_ratio=collective * 0.9)],
    )
    return _pair(job)


def test_a_job_of_three_pods_names_its_straggler_pod_and_posts_one_event() -> None:
    pods = [_pod(f"trainer-{i}", True) for i in range(3)]
    figures = {"trainer-0": (0, 0.01, 0.40), "trainer-1": (1, 0.40, 0.04), "trainer-2": (2, 0.01, 0.40)}
    pairs = {name: _rank_pod_pair(*f) for name, f in figures.items()}
    spec = {"selector": SELECTOR}
    first = _window(spec, pods, {n: p[0] for n, p in pairs.items()}, {n: p[1] for n, p in pairs.items()})
    straggler = first.patch["status"]["bottleneck"]["straggler"]
    assert (straggler["pod"], straggler["rank"], straggler["cause"]) == ("trainer-1", 1, "Data")
    assert first.patch["status"]["metrics"]["rankCount"] == 3
    assert [e.reason for e in first.events if e.reason == st.REASON_STRAGGLER] == [st.REASON_STRAGGLER]
    assert "trainer-1" in next(e.message for e in first.events if e.reason == st.REASON_STRAGGLER)
    # The same straggler in the next window: no second Event.
    again = decide_window(
        _inputs(parse_spec(spec), pods, {n: p[1] for n, p in pairs.items()}, status=first.patch["status"]),
        ProfileState(
            stabilizer=Stabilizer(confirm_windows=1),
            baselines={n: p[0] for n, p in pairs.items()},
            published=first.published,
        ),
    )
    assert [e for e in again.events if e.reason == st.REASON_STRAGGLER] == []


def test_an_oom_kill_in_the_pod_status_during_the_window_is_memory_capacity() -> None:
    before, after = _pair(Job(seconds=30.0, steps=60.0, wait_ratio=0.02, main_cpu_cores=1.0))
    spec = {"selector": SELECTOR}
    killed = PodInfo(
        "ns",
        "a",
        {"app": "t"},
        pod_ip="10.0.0.1",
        phase="Running",
        instrumented=True,
        last_oom_kill="2026-11-30T11:59:50Z",
    )
    step = _window(spec, [killed], {"a": before}, {"a": after})
    assert step.patch["status"]["bottleneck"]["regime"] == "memory-capacity"
    # A kill an hour ago (still in lastState) does not hold the verdict.
    old = PodInfo(
        "ns",
        "a",
        {"app": "t"},
        pod_ip="10.0.0.1",
        phase="Running",
        instrumented=True,
        last_oom_kill="2026-11-30T11:00:00Z",
    )
    assert _window(spec, [old], {"a": before}, {"a": after}).patch["status"]["bottleneck"]["regime"] != (
        "memory-capacity"
    )


def test_last_oom_kill_is_read_from_current_and_last_container_states() -> None:
    from dam_operator.cluster.steps.registry import last_oom_kill

    status = {
        "containerStatuses": [
            {
                "name": "a",
                "lastState": {"terminated": {"reason": "OOMKilled", "finishedAt": "2026-11-30T10:00:00Z"}},
            },
            {
                "name": "b",
                "state": {"terminated": {"reason": "OOMKilled", "finishedAt": "2026-11-30T11:00:00Z"}},
            },
            {
                "name": "c",
                "lastState": {"terminated": {"reason": "Error", "finishedAt": "2026-11-30T12:00:00Z"}},
            },
        ]
    }
    assert last_oom_kill(status) == "2026-11-30T11:00:00Z"
    assert last_oom_kill({"containerStatuses": [{"name": "a", "state": {"running": {}}}]}) is None


def test_a_sidecar_restarted_within_the_window_is_a_reported_gap_and_an_older_one_is_not() -> None:
    job = Job(seconds=30.0, steps=60.0, wait_ratio=0.5)
    before, after = _pair(job)
    restarted = {
        "initContainerStatuses": [
            {
                "name": "dam-sidecar",
                "restartCount": 1,
                "state": {"running": {"startedAt": "2026-11-30T11:59:51Z"}},
                "lastState": {"terminated": {"exitCode": 137, "finishedAt": "2026-11-30T11:59:50Z"}},
            }
        ]
    }
    assert sidecar_restart(restarted) == "2026-11-30T11:59:50Z"
    assert sidecar_restart({"initContainerStatuses": [{"name": "dam-sidecar", "lastState": {}}]}) is None
    spec = {"selector": SELECTOR, "evaluation": {"windowSeconds": 30}}
    pod = dataclasses.replace(_pod("p", True), sidecar_restarted_at=sidecar_restart(restarted))
    gap = _condition(_window(spec, [pod], {"p": before}, {"p": after}), st.REPORTING)
    assert gap["status"] == "False" and gap["reason"] == st.REASON_SIDECAR_RESTARTED, gap
    assert gap["message"].startswith(
        "0 of 1 instrumented pods reported the whole window; 1 answered with a gap, their sidecar "
        "restarted: p: its sidecar was restarted at"
    ), gap["message"]
    old = dataclasses.replace(pod, sidecar_restarted_at="2026-11-30T11:58:00Z")  # before this window
    assert _condition(_window(spec, [old], {"p": before}, {"p": after}), st.REPORTING)["status"] == "True"


def test_status_pods_reporting_agrees_with_the_reporting_condition_after_a_sidecar_restart() -> None:
    # Two pods, one whose sidecar the kubelet restarted 10 s before the window's end: both answered,
    # but one did not report the whole window. status.pods.reporting and the operator's
    # dam_profile_pods{state="reporting"} (from the step's counts) say 1, the condition False;
    # the verdict still comes from both pods' probe counters, which kept counting.
    job = Job(seconds=30.0, steps=60.0, wait_ratio=0.5)
    before, after = _pair(job)
    spec = {"selector": SELECTOR, "evaluation": {"windowSeconds": 30}}
    gapped = dataclasses.replace(_pod("a", True), sidecar_restarted_at="2026-11-30T11:59:50Z")
    result = _window(spec, [gapped, _pod("b", True)], {"a": before, "b": before}, {"a": after, "b": after})
    pods = result.patch["status"]["pods"]
    reporting = _condition(result, st.REPORTING)
    assert reporting["status"] == "False" and reporting["reason"] == st.REASON_SIDECAR_RESTARTED, reporting
    assert (pods["instrumented"], pods["reporting"]) == (2, 1), pods
    assert result.counts is not None and result.counts.reporting == 1
    assert reporting["message"].startswith("1 of 2 instrumented pods reported the whole window"), reporting
    assert _condition(result, st.DIAGNOSED)["status"] == "True", _condition(result, st.DIAGNOSED)
    after_gap = _window(
        spec, [_pod("a", True), _pod("b", True)], {"a": before, "b": before}, {"a": after, "b": after}
    )
    assert after_gap.patch["status"]["pods"]["reporting"] == 2
    assert _condition(after_gap, st.REPORTING)["status"] == "True"


def _condition(result: Any, kind: str) -> dict[str, Any]:
    return next(c for c in result.patch["status"]["conditions"] if c["type"] == kind)


def _merged(status: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """RFC 7386 over a copy (what the API server does with the step's patch)."""
    out = dict(status)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out


def test_a_finished_jobs_verdict_is_kept_once_no_pod_of_the_profile_is_active() -> None:
    """The Job completed and its Pods are gone: the last verdict, its figures and goodput stay (as a
    VPA keeps its recommendation), the conditions say no training pod runs; windows past the
    stabilizer's unknown hold-off change nothing, post no Event; a new pod resumes from it."""
    before, after = _pair(Job(seconds=30.0, steps=60.0, wait_ratio=0.5))
    spec = parse_spec({"selector": SELECTOR, "evaluation": {"windowSeconds": 30}})
    stabilizer = Stabilizer(confirm_windows=1)

    def step(
        pods: list[PodInfo], results: dict[str, Any], status: dict[str, Any], published: Any, n: int
    ) -> Any:
        return decide_window(
            _inputs(spec, pods, results, status=status, when=WHEN + dt.timedelta(seconds=30 * n)),
            ProfileState(stabilizer=stabilizer, baselines={"a": before} if pods else {}, published=published),
        )

    first = step([_pod("a", True)], {"a": after}, {}, None, 0)
    status = _merged({}, first.patch["status"])
    assert status["bottleneck"]["axis"] == "Data", status["bottleneck"]
    verdict = {k: status[k] for k in ("bottleneck", "metrics", "lastEvaluationTime")}
    published = first.published
    for n in range(1, 6):  # past unknown_windows (3): an unkept verdict would be Unknown by now
        later = step([], {}, status, published, n)
        status = _merged(status, later.patch["status"])
        published = later.published
        assert later.events == [], [e.reason for e in later.events]
        assert {k: status[k] for k in verdict} == verdict, status
        assert status["pods"]["matched"] == 0
    reporting = next(c for c in status["conditions"] if c["type"] == st.REPORTING)
    assert (reporting["status"], reporting["reason"]) == ("False", st.REASON_NO_ACTIVE_PODS), reporting
    assert reporting["message"] == (
        f"the last verdict is kept from {verdict['lastEvaluationTime']}; no training pod is running"
    )
    diagnosed = next(c for c in status["conditions"] if c["type"] == st.DIAGNOSED)
    assert diagnosed["status"] == "True", diagnosed
    # The Job's next Pod: evaluated again from the kept verdict, no BottleneckChanged Event.
    again = step([_pod("b", True)], {"b": after}, status, published, 6)
    assert again.patch["status"]["bottleneck"]["axis"] == "Data"
    assert [e.reason for e in again.events] == []
    # With no verdict to keep (no pod ever reported), no pods is still said as before.
    empty = _window({"selector": SELECTOR}, [], {}, {})
    assert empty.patch["status"]["bottleneck"]["axis"] == "Unknown"
    assert _condition(empty, st.DIAGNOSED)["reason"] == st.REASON_NO_PODS


def test_a_pod_oom_killed_before_a_window_counts_its_workers_once() -> None:
    """Its window is its baseline and its last memory mark; both hold ``dam_processes`` (the
    baseline keeps the process counts): two workers are two, not four (seen on the node)."""
    from dam_contract import names
    from dam_operator.cluster.steps.window_step import memory_mark
    from dam_operator.diagnosis.window import baseline

    def scrape(t: float) -> Snapshot:
        text = "\n".join(
            [
                f"{names.STEPS_TOTAL} {t}",
                f'{names.PROCESSES}{{role="main"}} 1',
                f'{names.PROCESSES}{{role="worker"}} 2',
                f'{names.PROCESS_RESIDENT_MEMORY_BYTES}{{role="main"}} {0.6 * 2**30}',
                f'{names.PROCESS_RESIDENT_MEMORY_BYTES}{{role="worker"}} {1.3 * 2**30}',
                f"{names.CONTAINER_MEMORY_USAGE_BYTES} {1.9 * 2**30}",
                f"{names.CONTAINER_MEMORY_LIMIT_BYTES} {2 * 2**30}",
                "",
            ]
        )
        return parse_snapshot(text, timestamp_seconds=t)

    killed = PodInfo(
        "ns", "leaky", {"app": "t"}, phase="Failed", instrumented=True, last_oom_kill="2026-11-30T11:59:55Z"
    )
    step = decide_window(
        _inputs(parse_spec({"selector": SELECTOR}), [], {}, ended=[killed]),
        ProfileState(
            stabilizer=Stabilizer(confirm_windows=1),
            baselines={"leaky": baseline(scrape(1000.0))},
            marks={"leaky": memory_mark(scrape(1004.0))},
        ),
    )
    b = step.patch["status"]["bottleneck"]
    assert (b["regime"], b["lever"]) == ("memory-capacity", "reduce-loader-memory"), b
    assert step.patch["status"]["metrics"]["workerCount"] == 2, step.patch["status"]["metrics"]
    assert any(line.startswith("resident memory: 2 loader workers 1.30 GiB") for line in b["evidence"]), b


def test_the_scrape_at_the_kill_does_not_replace_the_memory_mark_that_names_the_workers() -> None:
    """On the node the sidecar answered once more as the kernel killed the trainer: no live
    training process, so no resident memory by role and no workers. The mark that says who held
    the memory is the last one taken while they lived (it was replaced: smaller-micro-batch,
    workerCount 0, "missing: mainRssBytes and workerRssBytes")."""
    from dam_contract import names

    def scrape(t: float, *, alive: bool) -> Snapshot:
        lines = [f"{names.STEPS_TOTAL} {t}", f"{names.CONTAINER_MEMORY_LIMIT_BYTES} {2 * 2**30}"]
        if alive:
            lines += [
                f'{names.PROCESSES}{{role="main"}} 1',
                f'{names.PROCESSES}{{role="worker"}} 2',
                f'{names.PROCESS_RESIDENT_MEMORY_BYTES}{{role="main"}} {0.6 * 2**30}',
                f'{names.PROCESS_RESIDENT_MEMORY_BYTES}{{role="worker"}} {1.3 * 2**30}',
                f"{names.CONTAINER_MEMORY_USAGE_BYTES} {1.9 * 2**30}",
            ]
        else:
            lines += [f'{names.PROCESSES}{{role="main"}} 0', f'{names.PROCESSES}{{role="worker"}} 0']
        return parse_snapshot("\n".join([*lines, ""]), timestamp_seconds=t)

    spec = parse_spec({"selector": SELECTOR, "evaluation": {"windowSeconds": 10}})
    stabilizer = Stabilizer(confirm_windows=1)
    running = PodInfo("ns", "leaky", {"app": "t"}, pod_ip="10.0.0.1", phase="Running", instrumented=True)

    def step(pods: list[PodInfo], results: dict[str, Any], prev: Any, ended: Any = ()) -> Any:
        return decide_window(
            _inputs(spec, pods, results, ended=ended),
            ProfileState(
                stabilizer=stabilizer,
                baselines=prev.baselines if prev else {},
                marks=prev.marks if prev else {},
            ),
        )

    lived = step([running], {"leaky": scrape(1000.0, alive=True)}, None)
    dying = step([running], {"leaky": scrape(1010.0, alive=False)}, lived)
    assert dying.marks["leaky"].timestamp_seconds == 1000.0  # the mark taken while they lived
    killed = dataclasses.replace(running, phase="Failed", last_oom_kill="2026-11-30T11:59:55Z")
    ended = step([], {}, dying, ended=[killed])
    b = ended.patch["status"]["bottleneck"]
    assert (b["regime"], b["lever"]) == ("memory-capacity", "reduce-loader-memory"), b
    assert ended.patch["status"]["metrics"]["workerCount"] == 2, ended.patch["status"]["metrics"]


def test_a_window_without_a_step_reads_starting_for_a_young_pod_and_custom_loop_past_start_up(
    tmp_path: Any,
) -> None:
    # A real sidecar's scrape of a pod whose trainer has not written its probe file yet (it does
    # so from its first batch on): an empty probe directory.
    from dam_sidecar.collector import build_collector
    from dam_sidecar.settings import SidecarSettings

    c = build_collector(SidecarSettings(probe_dir=str(tmp_path)), use_nvml=False)
    try:
        c.sample_now()
        snap = c.snapshot()
    finally:
        c.close()
    samples = [s for name in sorted(snap.names()) for s in snap.samples(name)]
    before, after = Snapshot(samples, 1000.0), Snapshot(samples, 1030.0)
    spec = {"selector": SELECTOR, "evaluation": {"windowSeconds": 30}}
    body = {"metadata": {"namespace": "ns", "name": "p", "labels": {"app": "t"}}}
    young = PodInfo.from_body(
        {**body, "status": {"phase": "Running", "podIP": "10.0.0.1", "startTime": "2026-11-30T11:59:00Z"}},
        True,
    )
    assert young.started_at == "2026-11-30T11:59:00Z"  # WHEN - 60 s
    old = dataclasses.replace(young, started_at="2026-11-30T11:50:00Z")  # WHEN - 10 min

    def evidence(pod: PodInfo) -> str:
        result = _window(spec, [pod], {"p": before}, {"p": after})
        b = result.patch["status"]["bottleneck"]
        assert b["regime"] == "unknown", b
        return " ".join(b["evidence"]) + " | " + " ".join(b["missing"])

    starting = evidence(young)
    assert "the job has not reached its first step yet (it is starting" in starting, starting
    assert "DataLoader" not in starting and "dam_probe.instrument" not in starting, starting
    past = evidence(old)
    assert "no DataLoader was iterated (a custom training loop" in past, past
    assert "dam_probe.instrument(batches)" in past, past
