"""The cluster's progress step: the pods' progress series in, status.progress, the Progressing
condition, Events, the stalled badput's start and onStall Restart's deletions out."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from dam_contract import names
from dam_contract.snapshot import Sample, Snapshot, parse_snapshot
from dam_operator.cluster.runtime.opmetrics import OperatorMetrics
from dam_operator.cluster.steps import metric_names as mn
from dam_operator.cluster.steps.progress_step import (
    EVENT_PROGRESSING,
    EVENT_RESTART_REFUSED,
    EVENT_RESTARTED,
    EVENT_SLOWED_DOWN,
    EVENT_STALLED,
    RESTART_GRANT,
    ProgressStep,
    progress_step,
    rank_places,
    slowdown_key,
    slowdown_update,
)
from dam_operator.cluster.steps.registry import PodInfo
from dam_operator.cluster.steps.spec import DAMProfileSpec, parse_spec
from dam_operator.diagnosis.levers import Axis, Regime
from dam_operator.diagnosis.model import Bottleneck, Verdict, WindowMetrics
from dam_operator.diagnosis.slowdown import SlowdownTracker
from dam_probe.layout import PLACE_COLLECTIVE, PLACE_USER_CODE
from dam_sidecar.collector import build_collector
from dam_sidecar.settings import SidecarSettings

T0 = 1_800_000_000.0  # the job's latest batch, Unix seconds
FRAMES = ("train.py:41 hang", "train.py:60 main")


def _spec(**actions: Any) -> DAMProfileSpec:
    raw: dict[str, Any] = {
        "selector": {"matchLabels": {"app": "t"}},
        "evaluation": {"windowSeconds": 10, "stallAfterSeconds": 30, "stallStepMultiple": 10},
    }
    if actions:
        raw["actions"] = actions
    return parse_spec(raw)


def _pod(name: str, phase: str = "Running") -> PodInfo:
    return PodInfo(
        "ns", name, {"app": "t"}, uid=f"uid-{name}", pod_ip="10.0.0.1", phase=phase, instrumented=True
    )


def _rank(
    rank: int,
    *,
    last: float = T0,
    steps: int = 100,
    up: float = 1.0,
    entered: int | None = None,
    place: tuple[str, str, Sequence[str]] | None = None,
) -> list[Sample]:
    labels = ((names.RANK_LABEL, str(rank)),)
    out = [
        Sample(names.STEPS_TOTAL, labels, float(steps)),
        Sample(names.STEP_SECONDS_TOTAL, labels, steps * 0.1),
        Sample(names.LAST_BATCH_TIMESTAMP_SECONDS, labels, last),
        Sample(names.RANK_UP, labels, up),
    ]
    if entered is not None:
        out.append(Sample(names.COLLECTIVE_SEQUENCE, labels, float(entered)))
    if place is not None:
        where, detail, frames = place
        place_labels = (*labels, ("where", where), ("detail", detail), ("frames", "\n".join(frames)))
        out.append(Sample(names.TRAINING_PLACE_INFO, place_labels, 1.0))
    return out


def _stalled_pair(at: float) -> dict[str, Snapshot]:
    """Pod a's rank 0 waits in all_reduce #7; pod b's rank 1 sleeps in user code, #7 never entered."""
    return {
        "a": Snapshot(_rank(0, entered=7, place=("collective", "all_reduce #7", ("train.py:44 step",))), at),
        "b": Snapshot(_rank(1, entered=6, place=("user-code", "", FRAMES)), at),
    }


def _at(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, dt.UTC)


def _step(
    answered: Mapping[str, Snapshot],
    now: float,
    *,
    status: Mapping[str, Any] | None = None,
    spec: DAMProfileSpec | None = None,
    pods: Sequence[PodInfo] = (),
    allowed: bool = False,
) -> ProgressStep:
    return progress_step(
        spec=spec or _spec(),
        status=status or {},
        answered=answered,
        pods=list(pods) or [_pod(name) for name in answered],
        generation=3,
        when=_at(now),
        restart_allowed=allowed,
    )


def _status(step: ProgressStep) -> dict[str, Any]:
    assert step.progress is not None
    return {"progress": step.progress}


def test_the_rank_that_never_entered_the_collective_the_other_waits_in_is_the_culprit() -> None:
    step = _step(_stalled_pair(T0 + 40), T0 + 40)
    p = step.progress
    assert p is not None and p["state"] == "Stalled"
    assert p["culprit"] == {"pod": "b", "rank": 1, "where": "user-code", "frames": list(FRAMES)}
    assert p["waiting"] == {"ranks": 1, "where": "collective", "detail": "all_reduce #7"}
    assert p["stalledSeconds"] == pytest.approx(40.0)
    assert p["since"] == p["lastStepTime"] == "2027-01-15T08:00:00Z"
    assert step.condition is not None
    assert (step.condition["type"], step.condition["status"], step.condition["reason"]) == (
        "Progressing",
        "False",
        "Stalled",
    )
    assert "rank 1 in user-code" in step.condition["message"]
    assert [(e.reason, e.type) for e in step.events] == [(EVENT_STALLED, "Warning")]
    assert "train.py:41 hang" in step.events[0].message
    assert step.stalled_since == pytest.approx(T0)
    assert step.state == "Stalled" and step.stalled_seconds == pytest.approx(40.0)


def test_below_the_threshold_the_job_progresses_and_the_condition_is_true() -> None:
    step = _step(_stalled_pair(T0 + 20), T0 + 20)
    assert step.progress is not None and step.progress["state"] == "Progressing"
    assert "culprit" not in step.progress
    assert step.condition is not None and step.condition["status"] == "True"
    assert step.stalled_since is None and step.events == []


def test_a_job_of_long_steps_waits_its_step_multiple_before_it_is_stalled() -> None:
    """Steps of 6 s (60 s over 10 finished steps), 10 of them: 60 s, not the 30 s floor."""
    labels = ((names.RANK_LABEL, "0"),)

    def scrape(now: float) -> dict[str, Snapshot]:
        samples = [
            Sample(names.STEPS_TOTAL, labels, 11.0),
            Sample(names.STEP_SECONDS_TOTAL, labels, 60.0),
            Sample(names.LAST_BATCH_TIMESTAMP_SECONDS, labels, T0),
            Sample(names.RANK_UP, labels, 1.0),
        ]
        return {"a": Snapshot(samples, now)}

    assert _step(scrape(T0 + 45), T0 + 45).state == "Progressing"
    assert _step(scrape(T0 + 65), T0 + 65).state == "Stalled"


def test_before_a_rank_finished_a_step_the_job_has_not_started_and_the_condition_is_unknown() -> None:
    step = _step({"a": Snapshot(_rank(0, steps=1), T0 + 600)}, T0 + 600)
    assert step.progress is not None and step.progress["state"] == "NotStarted"
    assert step.condition is not None and (step.condition["status"], step.condition["reason"]) == (
        "Unknown",
        "NotStarted",
    )
    assert step.events == []


def test_a_node_clock_off_by_minutes_neither_hides_nor_makes_a_stall() -> None:
    """Batch times are the node's clock: each pod's are moved by its sidecar's sample time."""
    ahead = 300.0  # the node's clock runs 5 minutes ahead of the operator's
    fresh = {"a": Snapshot(_rank(0, last=T0 + ahead - 2), T0 + ahead)}
    assert _step(fresh, T0).state == "Progressing"
    behind = {"a": Snapshot(_rank(0, last=T0 - ahead - 40), T0 - ahead)}
    step = _step(behind, T0)
    assert step.state == "Stalled" and step.stalled_seconds == pytest.approx(40.0)


def test_the_state_and_its_since_carry_over_in_the_status_and_a_recovery_is_an_event() -> None:
    first = _step(_stalled_pair(T0 + 40), T0 + 40)
    second = _step(_stalled_pair(T0 + 50), T0 + 50, status=_status(first))
    assert second.events == []
    assert first.progress is not None and second.progress is not None
    assert second.progress["since"] == first.progress["since"]
    resumed = {
        "a": Snapshot(_rank(0, last=T0 + 55, steps=120), T0 + 60),
        "b": Snapshot(_rank(1, last=T0 + 55, steps=120), T0 + 60),
    }
    third = _step(resumed, T0 + 60, status=_status(second))
    assert third.state == "Progressing"
    assert [e.reason for e in third.events] == [EVENT_PROGRESSING]
    assert third.progress is not None and "culprit" not in third.progress


def test_a_rank_whose_process_died_while_its_pod_runs_is_the_culprit_exited() -> None:
    answered = {
        "a": Snapshot(_rank(0, entered=7, place=("collective", "all_reduce #7", ())), T0 + 40),
        "b": Snapshot(_rank(1, up=0.0), T0 + 40),
    }
    p = _step(answered, T0 + 40).progress
    assert p is not None and p["state"] == "Stalled"
    assert p["culprit"]["where"] == "exited" and p["culprit"]["pod"] == "b" and p["culprit"]["rank"] == 1


def test_no_pod_answered_leaves_the_progress_and_its_condition_as_they_were() -> None:
    step = _step({}, T0)
    assert step.progress is None and step.condition is None and step.events == []


def test_a_sidecar_without_progress_series_gives_no_ranks() -> None:
    old = Snapshot([Sample(names.STEPS_TOTAL, (), 40.0)], T0)
    assert rank_places("a", old, T0) == []


# --- onStall: Restart ------------------------------------------------------------------------------


def test_restart_deletes_the_running_pods_once_past_threshold_and_grace_and_records_the_outcome() -> None:
    spec = _spec(onStall="Restart", restartGraceSeconds=20)
    pods = [_pod("a"), _pod("b"), _pod("done", phase="Succeeded")]
    early = _step(_stalled_pair(T0 + 45), T0 + 45, spec=spec, pods=pods, allowed=True)
    assert early.state == "Stalled" and early.delete_pods == []  # 45 s < 30 s + 20 s
    due = _step(_stalled_pair(T0 + 55), T0 + 55, spec=spec, pods=pods, allowed=True, status=_status(early))
    assert due.delete_pods == ["a", "b"]
    assert due.progress is not None
    restart = due.progress["restart"]
    assert (restart["outcome"], restart["pods"], restart["stallSince"]) == (
        "pending",
        ["a", "b"],
        due.progress["since"],
    )
    assert [e.reason for e in due.events] == [EVENT_RESTARTED]
    # The same stall is not acted on twice, while the old pods terminate.
    again = _step(_stalled_pair(T0 + 65), T0 + 65, spec=spec, pods=pods, allowed=True, status=_status(due))
    assert again.delete_pods == [] and again.events == []
    # The new pods take steps: resumed, and the stall's cost is its start to the first step after.
    new = {
        "c": Snapshot(_rank(0, last=T0 + 90, steps=30), T0 + 92),
        "d": Snapshot(_rank(1, last=T0 + 90, steps=30), T0 + 92),
    }
    after = _step(new, T0 + 92, spec=spec, allowed=True, status=_status(again))
    assert after.progress is not None
    restart = after.progress["restart"]
    assert restart["outcome"] == "resumed"
    assert restart["stallCostSeconds"] == pytest.approx(90.0)
    assert after.delete_pods == []


def test_restart_without_the_grant_is_refused_once_and_names_the_chart_value() -> None:
    spec = _spec(onStall="Restart", restartGraceSeconds=0)
    step = _step(_stalled_pair(T0 + 40), T0 + 40, spec=spec)
    assert step.delete_pods == []
    assert step.progress is not None and step.progress["restart"]["outcome"] == "refused"
    assert RESTART_GRANT in step.progress["restart"]["message"]
    assert [e.reason for e in step.events] == [EVENT_STALLED, EVENT_RESTART_REFUSED]
    again = _step(_stalled_pair(T0 + 50), T0 + 50, spec=spec, status=_status(step))
    assert again.events == [] and again.delete_pods == []


def test_with_on_stall_none_a_stall_deletes_nothing() -> None:
    step = _step(_stalled_pair(T0 + 900), T0 + 900, allowed=True)
    assert step.state == "Stalled" and step.delete_pods == []
    assert step.progress is not None and "restart" not in step.progress


# --- from probe files through the real sidecar -----------------------------------------------------


def test_places_published_by_the_probe_reach_the_judge_through_the_sidecars_text(tmp_path: Path) -> None:
    """Probe records -> the sidecar's /metrics text -> parsed as the operator parses a scrape: the
    culprit's frames and the waiting rank's collective come through whole."""
    from tests.unit.sidecar.conftest import write_probe

    probe = tmp_path / "probe"
    probe.mkdir()
    for pid in (10, 11):
        (tmp_path / "proc" / str(pid)).mkdir(parents=True)
    ns = int(T0 * 1e9)
    common = {
        "world_size": 2,
        "steps": 50,
        "step_ns": 5 * 10**9,
        "last_batch_ns": ns,
        "place_read_ns": ns + 10**10,
    }
    write_probe(
        probe,
        pid=10,
        rank=0,
        collectives_entered=7,
        place=PLACE_COLLECTIVE,
        place_detail="all_reduce #7",
        place_frames="train.py:44 step",
        **common,
    )
    write_probe(
        probe,
        pid=11,
        rank=1,
        collectives_entered=6,
        place=PLACE_USER_CODE,
        place_detail="",
        place_frames="\n".join(FRAMES),
        **common,
    )
    collector = build_collector(
        SidecarSettings(probe_dir=str(probe), proc_root=str(tmp_path / "proc")), use_nvml=False
    )
    collector.sample_now()
    scraped = parse_snapshot(collector.text().decode(), timestamp_seconds=T0 + 40)
    p = _step({"pod-x": scraped}, T0 + 40).progress
    assert p is not None and p["state"] == "Stalled"
    assert p["culprit"] == {"pod": "pod-x", "rank": 1, "where": "user-code", "frames": list(FRAMES)}
    assert p["waiting"]["detail"] == "all_reduce #7"


# --- the operator's metrics -------------------------------------------------------------------------


def _series(registry: CollectorRegistry, name: str) -> dict[tuple[str, ...], float]:
    out = {}
    for family in registry.collect():
        for s in family.samples:
            if s.name == name:
                out[tuple(s.labels.values())] = s.value
    return out


def test_the_operator_exports_stalled_seconds_and_the_progress_state_set() -> None:
    registry = CollectorRegistry()
    metrics = OperatorMetrics(registry)
    metrics.observe_progress("ns", "p", "Stalled", 42.0)
    assert _series(registry, mn.PROFILE_STALLED_SECONDS) == {("ns", "p"): 42.0}
    assert _series(registry, mn.PROFILE_PROGRESS_STATE) == {
        ("ns", "p", "NotStarted"): 0.0,
        ("ns", "p", "Progressing"): 0.0,
        ("ns", "p", "Stalled"): 1.0,
    }
    metrics.clear_verdict("ns", "p", T0)  # no verdict this window: progress stays
    metrics.observe_progress("ns", "p", None, 0.0)  # not judged: kept
    assert _series(registry, mn.PROFILE_STALLED_SECONDS) == {("ns", "p"): 42.0}
    metrics.observe_progress("ns", "p", "Progressing", 0.0)
    assert _series(registry, mn.PROFILE_STALLED_SECONDS) == {("ns", "p"): 0.0}
    metrics.forget_profile("ns", "p")
    assert _series(registry, mn.PROFILE_PROGRESS_STATE) == {}


# --- slowdowns ---------------------------------------------------------------------------------------


def _window(rate: float, wait: float) -> Verdict:
    return Verdict(
        bottleneck=Bottleneck(
            axis=Axis.DATA, regime=Regime.INPUT_BOUND, lever="x", lever_detail="x", confidence=0.7
        ),
        metrics=WindowMetrics(data_wait_ratio=wait, steps_per_second=rate),
    )


def test_a_slowdown_goes_into_status_progress_with_the_signal_that_changed_and_one_event() -> None:
    tracker = SlowdownTracker()
    key = slowdown_key(3, [_pod("a")])
    events: list[str] = []
    wire: dict[str, Any] = {}
    for i, (rate, wait) in enumerate([(10.0, 0.05)] * 8 + [(5.0, 0.52)] * 3):
        wire = {"state": "Progressing"}
        events += [e.reason for e in slowdown_update(tracker, wire, _window(rate, wait), key, f"t{i}")]
    assert events == [EVENT_SLOWED_DOWN]
    slowdown = wire["slowdown"]
    assert slowdown["ratio"] == pytest.approx(0.5)
    assert slowdown["since"] == "t8"
    assert any("data wait 5 % -> 52 %" in line for line in slowdown["evidence"]), slowdown["evidence"]
    # A window without a verdict keeps it; the rate back at its baseline ends it, with an Event.
    kept: dict[str, Any] = {}
    assert slowdown_update(tracker, kept, None, key, "t11") == []
    assert kept["slowdown"] == slowdown
    back: dict[str, Any] = {}
    assert [e.reason for e in slowdown_update(tracker, back, _window(10.0, 0.05), key, "t12")] == [
        EVENT_PROGRESSING
    ]
    assert "slowdown" not in back


def test_a_new_pod_template_starts_the_baseline_again() -> None:
    """A slower rate after a change of template is the job's new normal, not a slowdown."""
    tracker = SlowdownTracker()
    old = slowdown_key(3, [_pod("a")])
    new_pod = PodInfo("ns", "b", {"app": "t", "controller-revision-hash": "v2"}, uid="u2", phase="Running")
    new = slowdown_key(3, [new_pod])
    assert old != new
    events: list[str] = []
    for i in range(8):
        events += [e.reason for e in slowdown_update(tracker, {}, _window(10.0, 0.05), old, f"a{i}")]
    for i in range(10):
        events += [e.reason for e in slowdown_update(tracker, {}, _window(5.0, 0.05), new, f"b{i}")]
    assert events == []


def test_restart_deletes_only_the_instrumented_pods_whose_sidecars_were_judged() -> None:
    """RBAC cannot narrow pods/delete to a job: a Pod the selector matches that carries no sidecar,
    is being deleted already, or did not answer the window is never a target."""
    spec = _spec(onStall="Restart", restartGraceSeconds=0)
    plain = PodInfo("ns", "notebook", {"app": "t"}, uid="u-n", phase="Running", instrumented=False)
    going = PodInfo("ns", "old", {"app": "t"}, uid="u-o", phase="Running", instrumented=True, deleting=True)
    silent = _pod("silent")
    step = _step(
        _stalled_pair(T0 + 40),
        T0 + 40,
        spec=spec,
        pods=[_pod("a"), _pod("b"), plain, going, silent],
        allowed=True,
    )
    assert step.delete_pods == ["a", "b"]


def test_the_scheduler_deletes_each_listed_pod_by_its_uid_and_goes_on_after_a_refusal() -> None:
    import asyncio

    from dam_operator.cluster.adapters.kube import ApiError
    from dam_operator.cluster.runtime.scheduler import delete_stalled_pods
    from dam_operator.cluster.steps.registry import ProfileEntry

    calls: list[tuple[str, str, str]] = []

    class Api:
        async def delete_pod(self, namespace: str, name: str, uid: str) -> None:
            calls.append((namespace, name, uid))
            if name == "a":
                raise ApiError(403, "forbidden")

    registry = CollectorRegistry()
    entry = ProfileEntry(namespace="ns", name="p", uid="u", generation=1, spec=None)
    asyncio.run(
        delete_stalled_pods(
            Api(), OperatorMetrics(registry), entry, [_pod("a"), _pod("b")], ["a", "b", "gone"]
        )
    )
    assert calls == [("ns", "a", "uid-a"), ("ns", "b", "uid-b")]  # "gone" is no longer the profile's


def test_restart_waits_its_grace_past_the_stall_threshold_of_a_job_of_long_steps() -> None:
    """Steps of 6 s: the threshold is 10 x 6 = 60 s, not the 30 s floor, and the grace runs from it."""
    labels = ((names.RANK_LABEL, "0"),)
    spec = _spec(onStall="Restart", restartGraceSeconds=20)

    def scrape(now: float) -> dict[str, Snapshot]:
        samples = [
            Sample(names.STEPS_TOTAL, labels, 11.0),
            Sample(names.STEP_SECONDS_TOTAL, labels, 60.0),
            Sample(names.LAST_BATCH_TIMESTAMP_SECONDS, labels, T0),
            Sample(names.RANK_UP, labels, 1.0),
        ]
        return {"a": Snapshot(samples, now)}

    found = _step(scrape(T0 + 65), T0 + 65, spec=spec, allowed=True)
    assert found.state == "Stalled" and found.delete_pods == []  # 65 s < 60 s + 20 s
    due = _step(scrape(T0 + 81), T0 + 81, spec=spec, allowed=True, status=_status(found))
    assert due.delete_pods == ["a"]
