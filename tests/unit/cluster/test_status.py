"""Status patches, conditions and Events are built by pure functions."""

from __future__ import annotations

import datetime as dt
from typing import Any

from dam_operator.cluster.steps import status as st
from dam_operator.diagnosis.model import Axis, Bottleneck, Regime

T0 = "2026-01-01T00:00:00Z"
T1 = "2026-01-01T00:00:30Z"


def _bottleneck(axis: Axis = Axis.DATA, regime: Regime = Regime.INPUT_BOUND, conf: float = 0.8) -> Bottleneck:
    return Bottleneck(
        axis=axis,
        regime=regime,
        lever="increase-dataloader-workers",
        lever_detail="Raise num_workers.",
        confidence=conf,
    )


def _cond(conds: list[dict[str, Any]], type_: str) -> dict[str, Any]:
    return next(c for c in conds if c["type"] == type_)


def test_last_transition_time_changes_only_when_status_flips() -> None:
    first = st.merge_conditions([], [st.condition("Diagnosed", False, "AwaitingWindow", "wait", 1)], T0)
    same = st.merge_conditions(first, [st.condition("Diagnosed", False, "NoReportingPods", "none", 2)], T1)
    flipped = st.merge_conditions(same, [st.condition("Diagnosed", True, "BottleneckFound", "ok", 2)], T1)

    assert first[0]["lastTransitionTime"] == T0
    assert same[0]["lastTransitionTime"] == T0  # reason changed, status did not
    assert same[0]["reason"] == "NoReportingPods"
    assert same[0]["observedGeneration"] == 2
    assert flipped[0]["lastTransitionTime"] == T1


def test_conditions_of_unknown_types_are_dropped_as_stale() -> None:
    previous = [
        {"type": "Ready", "status": "True", "lastTransitionTime": T0},  # from an older operator
        {"type": "Diagnosed", "status": "True", "lastTransitionTime": T0},
    ]
    out = st.merge_conditions(previous, [st.condition("Diagnosed", True, "BottleneckFound", "x", 1)], T1)
    assert [c["type"] for c in out] == ["Diagnosed"]


def test_null_out_removes_keys_that_disappeared_recursively() -> None:
    previous = {"a": 1, "b": {"c": 2, "d": 3}, "gone": True}
    patch = st.null_out(previous, {"a": 5, "b": {"c": 4}})
    assert patch == {"a": 5, "b": {"c": 4, "d": None}, "gone": None}


def test_evaluation_patch_removes_stale_metrics_and_sets_times() -> None:
    previous = {"metrics": {"mfu": 0.4, "dataWaitRatio": 0.5}, "bottleneck": {"axis": "Data", "since": T0}}
    patch = st.evaluation_patch(
        previous,
        verdict_status={"bottleneck": {"axis": "Machine"}, "metrics": {"dataWaitRatio": 0.0}},
        pods=st.pods_status(2, 2, 2),
        conditions=[st.condition("Diagnosed", True, "BottleneckFound", "x", 3)],
        generation=3,
        now=T1,
    )["status"]
    assert patch["metrics"] == {"dataWaitRatio": 0.0, "mfu": None}
    assert patch["bottleneck"] == {"axis": "Machine", "since": None}
    assert patch["lastEvaluationTime"] == T1
    assert patch["observedGeneration"] == 3
    assert patch["pods"]["matched"] == 2


def test_first_write_after_restart_keeps_the_verdict() -> None:
    previous = {"bottleneck": {"axis": "Data"}, "lastEvaluationTime": T0}
    patch = st.evaluation_patch(
        previous,
        verdict_status=None,
        pods=st.pods_status(1, 1, 0),
        conditions=[],
        generation=1,
        now=T1,
        evaluated=False,
    )["status"]
    assert "bottleneck" not in patch
    assert "lastEvaluationTime" not in patch


def test_invalid_spec_patch_names_the_field_and_clears_the_verdict() -> None:
    error = "spec.sampling.intervalSeconds: must be a number between 0.1 and 3600, e.g. 1"
    patch = st.invalid_patch({"bottleneck": {"axis": "Data"}}, error, 4, T0)["status"]
    valid = _cond(patch["conditions"], st.SPEC_VALID)
    assert valid["status"] == "False"
    assert valid["reason"] == st.REASON_INVALID
    assert "spec.sampling.intervalSeconds" in valid["message"]
    assert patch["bottleneck"] is None
    assert _cond(patch["conditions"], st.DIAGNOSED)["status"] == "False"


def test_instrumented_condition_lists_pods_without_sidecar() -> None:
    cond = st.instrumented_condition(3, ["b", "a"], 1)
    assert cond["status"] == "False"
    assert cond["reason"] == st.REASON_NOT_INSTRUMENTED
    assert "2 of 3" in cond["message"] and "a, b" in cond["message"]
    assert st.instrumented_condition(3, [], 1)["status"] == "True"


def test_long_lists_are_shortened_in_messages() -> None:
    names = [f"pod-{i}" for i in range(40)]
    cond = st.instrumented_condition(40, names, 1)
    assert "and 35 more" in cond["message"]
    pods = st.pods_status(40, 0, 0, names * 3)
    assert len(pods["notInstrumented"]) == st.MAX_NOT_INSTRUMENTED_LISTED


def test_diagnosed_condition_reasons() -> None:
    b = _bottleneck()
    ok = st.diagnosed_condition(bottleneck=b, matched=2, instrumented=2, reporting=2, generation=1)
    assert ok["status"] == "True" and "increase-dataloader-workers" in ok["message"]
    none = st.diagnosed_condition(bottleneck=b, matched=2, instrumented=2, reporting=0, generation=1)
    assert none["reason"] == st.REASON_NO_REPORTING and "Holding" in none["message"]
    unknown = _bottleneck(Axis.UNKNOWN, Regime.UNKNOWN, 0.0).model_copy(update={"missing": ["steps"]})
    weak = st.diagnosed_condition(bottleneck=unknown, matched=1, instrumented=1, reporting=1, generation=1)
    assert weak["reason"] == st.REASON_INSUFFICIENT and "steps" in weak["message"]
    nopods = st.diagnosed_condition(bottleneck=None, matched=0, instrumented=0, reporting=0, generation=1)
    assert nopods["reason"] == st.REASON_NO_PODS


def test_reporting_condition_says_which_sidecars_failed() -> None:
    cond = st.reporting_condition(2, 1, ["pod-b: http://127.0.0.1:9450/metrics answered HTTP 503"], 1)
    assert cond["status"] == "False" and "pod-b" in cond["message"] and "1 of 2" in cond["message"]
    assert st.reporting_condition(2, 2, [], 1)["status"] == "True"


def test_event_only_when_axis_or_regime_changes() -> None:
    b = _bottleneck()
    assert st.bottleneck_changed_event({"axis": "Data", "regime": "input-bound"}, b) is None
    first = st.bottleneck_changed_event(None, b)
    assert first is not None and first.reason == "BottleneckChanged"
    assert "Data" in first.message and "input-bound" in first.message and b.lever in first.message
    switched = st.bottleneck_changed_event(
        {"axis": "Data", "regime": "input-bound"}, _bottleneck(Axis.MACHINE, Regime.COMPUTE_BOUND)
    )
    assert switched is not None and "was Data (input-bound)" in switched.message
    unknown = _bottleneck(Axis.UNKNOWN, Regime.UNKNOWN, 0.0)
    assert st.bottleneck_changed_event(None, unknown) is None
    lost = st.bottleneck_changed_event({"axis": "Data", "regime": "input-bound"}, unknown)
    assert lost is not None and "Unknown" in lost.message


def test_event_manifest_points_at_the_profile() -> None:
    spec = st.EventSpec(reason="BottleneckChanged", message="m")
    body = st.event_manifest(namespace="ns", name="p", uid="u-1", spec=spec, now=T0, instance="op-0")
    assert body["involvedObject"] == {
        "apiVersion": "dam.mlsys.dev/v1alpha1",
        "kind": "DAMProfile",
        "name": "p",
        "namespace": "ns",
        "uid": "u-1",
    }
    assert body["metadata"]["generateName"] == "p."
    assert body["reason"] == "BottleneckChanged"


def test_times_are_rfc3339_utc() -> None:
    when = dt.datetime(2026, 1, 2, 3, 4, 5, 999, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert st.format_time(when) == "2026-01-02T01:04:05Z"
