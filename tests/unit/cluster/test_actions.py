"""The action policy (spec.actions): plan, judge, roll back, per generation, bounded, restart-proof;
and what the webhook's patch does with it (the training containers only, idempotent, nothing in
mode Recommend)."""

from __future__ import annotations

import copy
import datetime as dt
import json
from collections.abc import Mapping
from typing import Any

import jsonpatch
import pytest

from dam_operator.cluster.steps import actions as act
from dam_operator.cluster.steps.injection import (
    ANNOTATION_ACTION,
    SIDECAR_CONTAINER,
    ActionOverrides,
    InjectionSettings,
    build_injection,
    resize_patch,
)
from dam_operator.cluster.steps.registry import PodInfo
from dam_operator.cluster.steps.spec import DAMProfileSpec, parse_spec
from dam_operator.diagnosis.model import Axis, Bottleneck, Observation, Regime, Verdict, WindowMetrics
from dam_probe.overrides import ENV_LOADER_OVERRIDES, parse_overrides

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
SETTINGS = InjectionSettings(image="ghcr.io/mlsys/dam-operator:0.1.0")


def _spec(**actions: Any) -> DAMProfileSpec:
    return parse_spec(
        {
            "selector": {"matchLabels": {"app": "t"}},
            "actions": {"mode": "Apply", "warmupWindows": 0, **actions},
        }
    )


def _verdict(
    lever: str = "increase-dataloader-workers", confidence: float = 0.9, regime: Regime = Regime.INPUT_BOUND
) -> Verdict:
    axis = Axis.DATA if regime == Regime.INPUT_BOUND else Axis.MACHINE
    return Verdict(
        bottleneck=Bottleneck(axis=axis, regime=regime, lever=lever, lever_detail="x", confidence=confidence),
        metrics=WindowMetrics(),
    )


def _obs(sps: float, wait: float = 0.6, **kw: Any) -> Observation:
    kw.setdefault("worker_count", 0)
    return Observation(steps_per_second=sps, data_wait_ratio=wait, **kw)


def _pod(name: str, action: str | None = None) -> PodInfo:
    return PodInfo(
        "ns", name, {"app": "t"}, pod_ip="10.0.0.1", phase="Running", instrumented=True, action=action
    )


def _entry(i: int, name: str, after: str, outcome: str = "improved", generation: int = 1) -> dict[str, Any]:
    return {
        "id": i,
        "lever": "x",
        "setting": {"name": name, "before": "1", "after": after},
        "outcome": outcome,
        "generation": generation,
        "before": {"stepsPerSecond": 1.0},
    }


class Loop:
    """Feeds windows to the pure policy and keeps the status as the API server would (JSON)."""

    def __init__(self, spec: DAMProfileSpec, generation: int = 1) -> None:
        self.spec = spec
        self.generation = generation
        self.status: dict[str, Any] = {}
        self.t = T0
        self.events: list[str] = []

    def window(
        self,
        pods: list[PodInfo],
        per_pod: Mapping[str, Observation],
        verdict: Verdict | None = None,
    ) -> act.ActionStep:
        self.t += dt.timedelta(seconds=30)
        step = act.window_actions(
            spec=self.spec,
            status=self.status,
            generation=self.generation,
            pods=pods,
            per_pod=per_pod,
            verdict=verdict or _verdict(),
            when=self.t,
        )
        if step.actions is not None:
            self.status = json.loads(json.dumps({**self.status, "actions": step.actions}))
        self.events += [e.reason for e in step.events]
        return step

    @property
    def entries(self) -> list[dict[str, Any]]:
        return list(self.status.get("actions") or [])

    def desired(self) -> Any:
        return act.desired_for(self.spec, self.status)


# ---------------------------------------------------------------- planning


def test_recommend_mode_plans_and_applies_nothing() -> None:
    spec = parse_spec({"selector": {"matchLabels": {"app": "t"}}})
    assert spec.actions.mode == "Recommend"
    loop = Loop(spec)
    step = loop.window([_pod("a")], {"a": _obs(4.0)})
    assert step == act.ActionStep()
    assert act.desired_for(spec, {"actions": [_entry(1, "num_workers", "1")]}) is None


def test_input_bound_job_gets_a_pending_action_with_the_windows_before_figures() -> None:
    loop = Loop(_spec(), generation=3)
    step = loop.window([_pod("a"), _pod("b")], {"a": _obs(4.0, 0.6), "b": _obs(2.0, 0.8)})
    (entry,) = loop.entries
    assert entry["id"] == 1
    assert entry["lever"] == "increase-dataloader-workers"
    assert entry["setting"] == {"name": "num_workers", "before": "0", "after": "1"}
    assert entry["outcome"] == "pending"
    assert entry["generation"] == 3
    assert entry["before"] == {"stepsPerSecond": 3.0, "dataWaitRatio": pytest.approx(0.7)}
    assert "after" not in entry and "pod" not in entry
    assert [e.reason for e in step.events] == ["ActionPlanned"]
    assert "num_workers 0 → 1" in step.events[0].message
    desired = loop.desired()
    assert desired.label == "1:applied" and dict(desired.loader) == {"num_workers": 1} and desired.cpu is None


@pytest.mark.parametrize(
    ("verdict", "spec", "why"),
    [
        (_verdict(regime=Regime.COMPUTE_BOUND, lever="enable-bf16"), _spec(), "not input-bound"),
        (_verdict(confidence=0.55), _spec(), "below minConfidence 0.6"),
        (_verdict(confidence=0.75), _spec(minConfidence=0.8), "below a raised minConfidence"),
        (_verdict(lever="use-sequential-shards"), _spec(), "a code change, not a setting"),
        (_verdict(lever="raise-cpu-limit"), _spec(), "a CPU raise without maxCpu"),
        (
            _verdict(),
            parse_spec(
                {
                    "selector": {"matchLabels": {"app": "t"}},
                    "actions": {"mode": "Apply"},
                    "sidecar": {"inject": False},
                }
            ),
            "the webhook does not touch the pods",
        ),
    ],
)
def test_nothing_is_planned_without_an_applicable_confident_input_bound_verdict(
    verdict: Verdict, spec: DAMProfileSpec, why: str
) -> None:
    loop = Loop(spec)
    step = loop.window([_pod("a")], {"a": _obs(4.0, cpu_limit_cores=2.0)}, verdict)
    assert step.actions is None and step.events == [], why


def test_nothing_is_planned_without_measured_pods_or_with_pods_on_older_settings() -> None:
    loop = Loop(_spec())
    assert loop.window([_pod("a")], {}).actions is None
    assert loop.window([_pod("a")], {"a": Observation()}).actions is None  # no step rate
    # A pod left from an earlier action: its figures are not the baseline of the current settings.
    assert loop.window([_pod("a", "7:applied")], {"a": _obs(4.0)}).actions is None


def test_one_action_at_a_time() -> None:
    loop = Loop(_spec())
    loop.window([_pod("a")], {"a": _obs(4.0)})
    for _ in range(3):  # the old pod keeps reporting: the action waits for a pod that carries it
        assert loop.window([_pod("a")], {"a": _obs(4.0)}).actions is None
    assert len(loop.entries) == 1 and loop.entries[0]["outcome"] == "pending"


# ---------------------------------------------------------------- judging


@pytest.mark.parametrize(
    ("after", "outcome"),
    [(4.4, "improved"), (4.39, "no-change"), (4.0, "no-change"), (3.61, "no-change"), (3.6, "worse")],
)
def test_judged_on_steps_per_second_with_the_noise_margin(after: float, outcome: str) -> None:
    before = act.Figures(steps_per_second=4.0)
    assert act.judge(before, act.Figures(steps_per_second=after), 0.10) == outcome


def test_pending_until_a_carrier_reported_warmup_plus_one_full_windows() -> None:
    loop = Loop(_spec(warmupWindows=1))
    loop.window([_pod("a")], {"a": _obs(4.0)})
    created = [_pod("b", "1:applied")]
    step = loop.window(created, {})  # the pod exists, no full window yet
    entry = loop.entries[0]
    assert entry["outcome"] == "pending" and entry["pod"] == "b" and "appliedAt" in entry
    assert [e.reason for e in step.events] == ["ActionApplied"]
    loop.window(created, {"b": _obs(9.0, 0.1, worker_count=1)})  # warm-up window: not measured
    assert loop.entries[0]["outcome"] == "pending" and loop.entries[0]["measuredWindows"] == 1
    step = loop.window(created, {"b": _obs(8.0, 0.2, worker_count=1)})
    entry = loop.entries[0]
    assert entry["outcome"] == "improved" and entry["measuredWindows"] == 2
    assert entry["after"] == {"stepsPerSecond": 8.0, "dataWaitRatio": 0.2}
    assert "+100%" in entry["message"]
    assert [e.reason for e in step.events][:1] == ["ActionImproved"]


def test_an_improved_setting_is_kept_and_the_climb_goes_on_from_it() -> None:
    loop = Loop(_spec())
    loop.window([_pod("a")], {"a": _obs(4.0)})
    step = loop.window([_pod("b", "1:applied")], {"b": _obs(6.0, worker_count=1)})
    assert [e.reason for e in step.events] == ["ActionApplied", "ActionImproved", "ActionPlanned"]
    first, second = loop.entries
    assert first["outcome"] == "improved"
    assert second["setting"] == {"name": "num_workers", "before": "1", "after": "2"}
    assert second["before"]["stepsPerSecond"] == 6.0  # the carrier's window is the next baseline
    desired = loop.desired()
    assert desired.label == "2:applied" and dict(desired.loader) == {"num_workers": 2}


def test_a_loader_setting_the_carrier_does_not_run_is_no_change_not_improved() -> None:
    """The probe refused the override (workers over a 64 MiB /dev/shm): the carrier still runs no
    worker, so a faster window is noise, not the setting's gain; the setting is blocked."""
    loop = Loop(_spec())
    loop.window([_pod("a")], {"a": _obs(4.0)})
    step = loop.window([_pod("b", "1:applied")], {"b": _obs(6.0, worker_count=0, loader_num_workers=0)})
    (entry,) = loop.entries
    assert entry["outcome"] == "no-change", entry
    assert "did not take effect: its pods run num_workers 0, not 1" in entry["message"]
    assert [e.reason for e in step.events] == ["ActionApplied", "ActionNoChange"]
    desired = loop.desired()
    assert desired.label == "1:withheld" and dict(desired.loader) == {}  # not kept: new pods go without it
    loop.window([_pod("c")], {"c": _obs(4.0)})
    assert len(loop.entries) == 1  # num_workers is not tried again in this generation


def test_a_worse_change_is_rolled_back_on_the_next_pod_and_not_tried_again_this_generation() -> None:
    loop = Loop(_spec(), generation=4)
    loop.window([_pod("a")], {"a": _obs(4.0)})
    loop.window([_pod("b", "1:applied")], {"b": _obs(6.0, worker_count=1)})  # 0 → 1 improved; 1 → 2 planned
    step = loop.window([_pod("c", "2:applied")], {"c": _obs(3.0, worker_count=2)})
    assert loop.entries[1]["outcome"] == "worse"
    worse_event = next(e for e in step.events if e.reason == "ActionWorse")
    assert worse_event.type == "Warning" and "-50%" in worse_event.message
    desired = loop.desired()  # the next pod gets the last kept setting, and says it goes without 2
    assert desired.label == "2:withheld" and dict(desired.loader) == {"num_workers": 1}
    # Nothing new while the worse change still runs.
    assert loop.window([_pod("c", "2:applied")], {"c": _obs(3.0, worker_count=2)}).actions is None
    step = loop.window([_pod("d", "2:withheld")], {"d": _obs(6.1, worker_count=1)})
    assert loop.entries[1]["outcome"] == "rolled-back" and "rolledBackAt" in loop.entries[1]
    assert [e.reason for e in step.events] == ["ActionRolledBack", "ActionPlanned"]
    # num_workers is blocked for generation 4: the climb moves on to prefetch_factor.
    assert loop.entries[2]["setting"] == {"name": "prefetch_factor", "before": "2", "after": "4"}
    assert loop.entries[2]["lever"] == "raise-prefetch-factor"
    assert dict(loop.desired().loader) == {"num_workers": 1, "prefetch_factor": 4}


def test_a_new_generation_may_try_a_blocked_setting_again() -> None:
    loop = Loop(_spec(), generation=1)
    loop.window([_pod("a")], {"a": _obs(4.0)})
    loop.window([_pod("b", "1:applied")], {"b": _obs(4.1)})  # 0 → 1: no change
    assert loop.entries[0]["outcome"] == "no-change"
    assert loop.desired().label == "1:withheld" and dict(loop.desired().loader) == {}
    current = [_pod("c", "1:withheld")]
    assert loop.window(current, {"c": _obs(4.0)}).actions is None  # blocked; no workers: no prefetch
    loop.generation = 2
    loop.window(current, {"c": _obs(4.0)})
    assert loop.entries[-1]["setting"]["name"] == "num_workers" and loop.entries[-1]["generation"] == 2


# ---------------------------------------------------------------- bounds


@pytest.mark.parametrize(
    ("obs", "spec", "expected"),
    [
        (_obs(4.0, worker_count=2, cpu_limit_cores=3.0), _spec(), ("num_workers", "2", "3")),
        # 8 workers over 2 ranks: 4 per loader, at the cap of 8 cores / 2 ranks: prefetch is next
        (_obs(4.0, worker_count=8, ranks=2, cpu_limit_cores=8.0), _spec(), ("prefetch_factor", "2", "4")),
        (_obs(4.0, worker_count=4), _spec(maxWorkers=6), ("num_workers", "4", "6")),
        (_obs(4.0, worker_count=4, cpu_limit_cores=4.0), _spec(), ("prefetch_factor", "2", "4")),
        (_obs(4.0, worker_count=4, cpu_limit_cores=4.0), _spec(maxPrefetchFactor=2), None),
    ],
)
def test_the_climb_is_bounded_by_the_cpu_limit_per_rank_and_the_spec(
    obs: Observation, spec: DAMProfileSpec, expected: tuple[str, str, str] | None
) -> None:
    step = act.next_setting("increase-dataloader-workers", spec.actions, [], 1, [obs])
    assert (step[1:] if step else None) == expected


@pytest.mark.parametrize(
    ("limit", "max_cpu", "expected"),
    [(2.0, "3", ("2", "3")), (2.0, "16", ("2", "4")), (1.5, "2500m", ("1500m", "2500m")), (3.0, "3", None)],
)
def test_a_cpu_raise_doubles_the_limit_within_max_cpu(
    limit: float, max_cpu: str, expected: tuple[str, str] | None
) -> None:
    spec = _spec(maxCpu=max_cpu)
    step = act.next_setting("raise-cpu-limit", spec.actions, [], 1, [_obs(4.0, cpu_limit_cores=limit)])
    assert (step[2:] if step else None) == expected


def test_a_cpu_raise_is_measured_only_on_pods_whose_limit_reached_it() -> None:
    loop = Loop(_spec(maxCpu="4"))
    loop.window([_pod("a")], {"a": _obs(4.0, cpu_limit_cores=2.0)}, _verdict(lever="raise-cpu-limit"))
    assert loop.entries[0]["setting"] == {"name": "cpu", "before": "2", "after": "4"}
    assert loop.desired().cpu == "4"
    carrier = [_pod("b", "1:applied")]
    loop.window(carrier, {"b": _obs(9.0, cpu_limit_cores=2.0)})  # not resized yet (kubelet deferred it)
    assert loop.entries[0]["outcome"] == "pending"
    loop.window(carrier, {"b": _obs(9.0, cpu_limit_cores=4.0)})
    assert loop.entries[0]["outcome"] == "improved"
    loop.spec = _spec(maxCpu="3")  # a lower cap applies to the kept raise too
    assert loop.desired().cpu == "3"
    loop.spec = _spec()
    assert loop.desired().cpu is None


def test_history_is_bounded_but_keeps_every_entry_that_decides_something() -> None:
    raw = [_entry(1, "pin_memory", "true")]
    raw.append(_entry(2, "cpu", "2", "no-change", generation=2))
    raw += [_entry(i, "num_workers", str(i)) for i in range(3, 20)]
    raw.append(_entry(20, "prefetch_factor", "4", "worse", generation=2))
    entries = act.parse_entries({"actions": raw})
    kept = act.trim(entries, generation=2)
    ids = [e.id for e in kept]
    assert len(ids) == act.MAX_HISTORY
    assert {1, 2, 19, 20} <= set(ids)  # pin_memory kept, cpu blocked this generation, newest, unrolled-back
    assert ids == sorted(ids)
    spec = _spec(maxCpu="64")
    assert act.desired_for(spec, {"actions": raw}) == act.desired_for(
        spec, {"actions": [e.wire() for e in kept]}
    )
    assert len(act.trim(entries[:5], generation=2)) == 5


# ---------------------------------------------------------------- restart


SCENARIO: list[tuple[list[PodInfo], dict[str, Observation], Verdict]] = [
    ([_pod("a")], {"a": _obs(4.0)}, _verdict()),  # plan 1: num_workers 0 → 1
    ([_pod("a"), _pod("b", "1:applied")], {"a": _obs(4.0)}, _verdict()),  # applied
    ([_pod("b", "1:applied")], {"b": _obs(7.0, worker_count=1)}, _verdict()),  # warm-up
    ([_pod("b", "1:applied")], {"b": _obs(7.0, worker_count=1)}, _verdict()),  # improved; plan 2: 1 → 2
    ([_pod("c", "2:applied")], {"c": _obs(3.0, worker_count=2)}, _verdict()),  # applied, warm-up
    ([_pod("c", "2:applied")], {"c": _obs(3.0, worker_count=2)}, _verdict()),  # worse
    ([_pod("d", "2:withheld")], {"d": _obs(7.0, worker_count=1)}, _verdict()),  # rolled back; plan 3
    ([_pod("e", "3:applied")], {"e": _obs(7.1, worker_count=1)}, _verdict(confidence=0.95)),  # warm-up
    ([_pod("e", "3:applied")], {"e": _obs(7.1, worker_count=1)}, _verdict(confidence=0.95)),  # no change
]


def test_a_restarted_operator_makes_the_same_decisions_from_the_status_alone() -> None:
    """Each window from a fresh call with only the stored status (what a restarted operator
    reads) equals the uninterrupted run, window by window, Events included."""
    steady = Loop(_spec(warmupWindows=1))
    statuses, events = [], []
    for pods, per_pod, verdict in SCENARIO:
        statuses.append(copy.deepcopy(steady.status))
        step = steady.window(pods, per_pod, verdict)
        events.append([(e.reason, e.message) for e in step.events])
    for i, (pods, per_pod, verdict) in enumerate(SCENARIO):
        restarted = Loop(_spec(warmupWindows=1))
        restarted.status = json.loads(json.dumps(statuses[i]))
        restarted.t = T0 + dt.timedelta(seconds=30 * i)
        step = restarted.window(pods, per_pod, verdict)
        assert [(e.reason, e.message) for e in step.events] == events[i], i
        assert restarted.status == (statuses[i + 1] if i + 1 < len(statuses) else steady.status), i
    assert [e["outcome"] for e in steady.entries] == ["improved", "rolled-back", "no-change"]


# ---------------------------------------------------------------- in place


def test_in_place_mode_asks_to_resize_the_measured_pods_once_and_records_a_refusal() -> None:
    loop = Loop(_spec(mode="InPlace", maxCpu="4"))
    pods = [_pod("a"), _pod("b")]
    per_pod = {"a": _obs(4.0, cpu_limit_cores=2.0), "b": _obs(4.0, cpu_limit_cores=2.0)}
    step = loop.window(pods, per_pod, _verdict(lever="raise-cpu-limit"))
    assert step.resizes == [act.ResizeRequest("a", 1, "4"), act.ResizeRequest("b", 1, "4")]
    assert "resized now" in step.events[0].message
    actions, events = act.record_resizes(
        loop.entries, 1, ["a"], {"b": "HTTP 403: forbidden"}, "2026-01-01T00:00:00Z"
    )
    (entry,) = actions
    assert entry["inPlace"] == {
        "state": "Partial",
        "pods": ["a"],
        "podCount": 1,
        "message": "b: HTTP 403: forbidden",
    }
    assert entry["pod"] == "a" and entry["outcome"] == "pending"
    assert [(e.reason, e.type) for e in events] == [
        ("ActionApplied", "Normal"),
        ("ActionResizeRefused", "Warning"),
    ]
    loop.status["actions"] = actions
    assert loop.window(pods, per_pod, _verdict(lever="raise-cpu-limit")).resizes == []  # never retried
    # A resized pod (no new annotation) is measured as a carrier once its limit shows the raise.
    pods = [_pod("a")]
    loop.window(pods, {"a": _obs(8.0, cpu_limit_cores=4.0)}, _verdict(lever="raise-cpu-limit"))
    assert loop.entries[0]["outcome"] == "improved"
    refused, _ = act.record_resizes(actions, 1, [], {"a": "HTTP 404: not found"}, "2026-01-01T00:00:00Z")
    assert refused[0]["inPlace"]["state"] == "Refused"


def test_in_place_resize_of_1000_pods_names_64_counts_them_all_and_judges_every_pod_resized() -> None:
    """The CRD allows 64 names (a longer list fails the whole status write): the record names the
    first 64 and counts the rest, and every pod resized is still a carrier when the action is
    judged. Here the 64 named pods did not speed up and the 936 others doubled their rate: judged
    on the named pods alone, the raise would read as no change."""
    loop = Loop(_spec(mode="InPlace", maxCpu="4"))
    names = [f"train-{i:04d}" for i in range(1000)]
    pods = [_pod(n) for n in names]
    step = loop.window(
        pods, {n: _obs(4.0, cpu_limit_cores=2.0) for n in names}, _verdict(lever="raise-cpu-limit")
    )
    assert len(step.resizes) == 1000
    actions, _ = act.record_resizes(loop.entries, 1, names, {}, "2026-01-01T00:00:00Z")
    (entry,) = actions
    assert entry["inPlace"]["pods"] == names[: act.MAX_IN_PLACE_PODS_LISTED]
    assert entry["inPlace"]["podCount"] == 1000 and entry["inPlace"]["state"] == "Resized"
    assert len(json.dumps(actions)) < 8 * 1024
    loop.status["actions"] = actions
    listed = set(names[: act.MAX_IN_PLACE_PODS_LISTED])
    after = {n: _obs(4.0 if n in listed else 8.0, cpu_limit_cores=4.0) for n in names}
    loop.window(pods, after, _verdict(lever="raise-cpu-limit"))
    (judged,) = loop.entries
    assert judged["outcome"] == "improved"
    assert judged["after"]["stepsPerSecond"] == pytest.approx((64 * 4.0 + 936 * 8.0) / 1000)


def test_apply_mode_never_resizes_in_place() -> None:
    loop = Loop(_spec(maxCpu="4"))
    step = loop.window([_pod("a")], {"a": _obs(4.0, cpu_limit_cores=2.0)}, _verdict(lever="raise-cpu-limit"))
    assert step.resizes == [] and loop.entries[0]["setting"]["name"] == "cpu"


# ---------------------------------------------------------------- the webhook's patch


def _training_pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "train-", "labels": {"app": "t"}},
        "spec": {
            "containers": [
                {
                    "name": "loader-helper",
                    "image": "busybox",
                    "env": [
                        {"name": "PYTHONPATH", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}
                    ],
                    "resources": {"limits": {"cpu": "1"}, "requests": {"cpu": "1"}},
                },
                {
                    "name": "train",
                    "image": "pytorch:2",
                    "resources": {
                        "limits": {"cpu": "2", "memory": "4Gi"},
                        "requests": {"cpu": "2", "memory": "4Gi"},
                    },
                },
            ]
        },
    }


def _env(container: Mapping[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def _apply(pod: dict[str, Any], desired: Any, spec: DAMProfileSpec | None = None) -> dict[str, Any]:
    patch = build_injection(pod, "p", spec or _spec(), SETTINGS, desired).patch
    patched: dict[str, Any] = jsonpatch.apply_patch(pod, patch)
    return patched


def test_the_overrides_and_the_cpu_raise_land_on_the_training_container_only() -> None:
    pod = _training_pod()
    pod["metadata"]["annotations"] = {"kubectl.kubernetes.io/default-container": "train"}
    desired = ActionOverrides(label="3:applied", loader={"num_workers": 4, "prefetch_factor": 4}, cpu="3500m")
    patched = _apply(pod, desired)
    helper, train = patched["spec"]["containers"]
    assert ENV_LOADER_OVERRIDES not in _env(helper)  # its PYTHONPATH comes from a ConfigMap: no probe there
    assert helper["resources"] == {"limits": {"cpu": "1"}, "requests": {"cpu": "1"}}
    overrides = parse_overrides(_env(train)[ENV_LOADER_OVERRIDES])
    assert (overrides.num_workers, overrides.prefetch_factor) == (4, 4)
    assert train["resources"] == {
        "limits": {"cpu": "3500m", "memory": "4Gi"},
        "requests": {"cpu": "3500m", "memory": "4Gi"},  # Guaranteed stays Guaranteed
    }
    assert patched["metadata"]["annotations"][ANNOTATION_ACTION] == "3:applied"
    sidecar = next(c for c in patched["spec"]["initContainers"] if c["name"] == SIDECAR_CONTAINER)
    assert ENV_LOADER_OVERRIDES not in _env(sidecar)
    # Idempotent: the patched pod needs nothing more.
    assert build_injection(patched, "p", _spec(), SETTINGS, desired).patch == []


def test_a_cpu_raise_never_lowers_a_limit_nor_adds_one_and_a_users_own_overrides_win() -> None:
    pod = _training_pod()
    pod["metadata"]["annotations"] = {"kubectl.kubernetes.io/default-container": "train"}
    train = pod["spec"]["containers"][1]
    train["resources"] = {"limits": {"cpu": "8"}, "requests": {"cpu": "1"}}
    train["env"] = [{"name": ENV_LOADER_OVERRIDES, "value": '{"version":1,"num_workers":2}'}]
    patched = _apply(pod, ActionOverrides(label="1:applied", loader={"num_workers": 4}, cpu="4"))
    assert patched["spec"]["containers"][1]["resources"] == {"limits": {"cpu": "8"}, "requests": {"cpu": "1"}}
    assert _env(patched["spec"]["containers"][1])[ENV_LOADER_OVERRIDES] == '{"version":1,"num_workers":2}'
    assert resize_patch(pod, "4") is None
    del train["resources"]  # no limit: not limited, nothing to raise
    patched = _apply(pod, ActionOverrides(label="1:applied", cpu="4"))
    assert "resources" not in patched["spec"]["containers"][1]
    assert resize_patch(pod, "4") is None


def test_without_a_default_container_the_first_container_is_the_training_container() -> None:
    pod = _training_pod()  # the first container cannot load the probe: no CPU change anywhere
    patched = _apply(pod, ActionOverrides(label="1:applied", cpu="4"))
    assert [c["resources"]["limits"]["cpu"] for c in patched["spec"]["containers"]] == ["1", "2"]
    assert resize_patch(pod, "4") == {
        "spec": {
            "containers": [
                {"name": "loader-helper", "resources": {"limits": {"cpu": "4"}, "requests": {"cpu": "4"}}}
            ]
        }
    }


def test_resize_patch_targets_the_default_container_and_keeps_the_qos_class() -> None:
    pod = _training_pod()
    pod["metadata"]["annotations"] = {"kubectl.kubernetes.io/default-container": "train"}
    assert resize_patch(pod, "4") == {
        "spec": {
            "containers": [{"name": "train", "resources": {"limits": {"cpu": "4"}, "requests": {"cpu": "4"}}}]
        }
    }
    pod["spec"]["containers"][1]["resources"]["requests"]["cpu"] = "1"
    assert resize_patch(pod, "4") == {
        "spec": {"containers": [{"name": "train", "resources": {"limits": {"cpu": "4"}}}]}
    }


def test_no_action_settings_in_mode_recommend_or_before_any_action() -> None:
    pod = _training_pod()
    spec = parse_spec({"selector": {"matchLabels": {"app": "t"}}})
    status = {"actions": [_entry(1, "num_workers", "2")]}
    plain = build_injection(pod, "p", spec, SETTINGS).patch
    assert build_injection(pod, "p", spec, SETTINGS, act.desired_for(spec, status)).patch == plain
    assert act.desired_for(_spec(), {}) is None
    patched = _apply(pod, act.desired_for(_spec(), status))
    assert patched["metadata"]["annotations"][ANNOTATION_ACTION] == "1:applied"
    assert parse_overrides(_env(patched["spec"]["containers"][1])[ENV_LOADER_OVERRIDES]).num_workers == 2


def test_a_status_edited_out_of_range_never_breaks_injection() -> None:
    status = {"actions": [_entry(1, "num_workers", "9999"), {"id": "bad"}]}
    desired = act.desired_for(_spec(), status)
    assert desired is not None and desired.label == "1:applied" and dict(desired.loader) == {}
    _apply(_training_pod(), desired)


def test_a_window_without_a_step_judges_no_action() -> None:
    """A pod still starting, or whose training ended inside the window, measured 0 steps/s: judging
    the action on it read "worse" on the real node."""
    from dam_operator.cluster.steps.actions import figures
    from dam_operator.diagnosis.model import Observation

    assert figures([Observation(steps_per_second=0.0, data_wait_ratio=0.0)]) is None
    idle, training = Observation(steps_per_second=0.0), Observation(steps_per_second=2.0, data_wait_ratio=0.1)
    both = figures([idle, training])
    assert both is not None and (both.steps_per_second, both.data_wait_ratio) == (2.0, 0.1)


# ---------------------------------------------------------------- every setting is checked as taken


def _prefetch_loop(carrier_prefetch: int | None) -> Loop:
    """prefetch_factor 2 → 4 planned on a pod with 4 workers, then a carrier 50 % faster whose
    loaders the probe reads with ``carrier_prefetch`` (None: not reported)."""
    loop = Loop(_spec())
    base = {"worker_count": 4, "cpu_limit_cores": 4.0, "loader_num_workers": 4, "loader_prefetch_factor": 2}
    verdict = _verdict("raise-prefetch-factor")
    loop.window([_pod("a")], {"a": _obs(4.0, **base)}, verdict)
    (planned,) = loop.entries
    assert planned["setting"] == {"name": "prefetch_factor", "before": "2", "after": "4"}
    carrier = {**base, "loader_prefetch_factor": carrier_prefetch}
    loop.window([_pod("b", "1:applied")], {"b": _obs(6.0, **carrier)}, verdict)
    return loop


def test_a_prefetch_factor_the_carriers_loaders_do_not_have_did_not_take_effect() -> None:
    (entry,) = _prefetch_loop(2).entries
    assert entry["outcome"] == "no-change", entry
    assert "did not take effect: its pods run prefetch_factor 2, not 4" in entry["message"]


@pytest.mark.parametrize("seen", [4, None], ids=["taken", "not-reported"])
def test_a_prefetch_factor_taken_or_not_reported_is_judged_on_steps(seen: int | None) -> None:
    first = _prefetch_loop(seen).entries[0]
    assert first["outcome"] == "improved", first
    assert "did not take effect" not in first["message"]


def _pin_loop(carrier_pins: bool | None) -> Loop:
    loop = Loop(_spec())
    verdict = _verdict("enable-pin-memory")
    loop.window([_pod("a")], {"a": _obs(4.0, gpu_count=1, loader_pin_memory=False)}, verdict)
    (planned,) = loop.entries
    assert planned["setting"] == {"name": "pin_memory", "before": "false", "after": "true"}
    loop.window(
        [_pod("b", "1:applied")], {"b": _obs(6.0, gpu_count=1, loader_pin_memory=carrier_pins)}, verdict
    )
    return loop


def test_pin_memory_the_carriers_loaders_do_not_pin_did_not_take_effect() -> None:
    (entry,) = _pin_loop(False).entries
    assert entry["outcome"] == "no-change", entry
    assert "did not take effect: its pods run pin_memory false, not true" in entry["message"]


@pytest.mark.parametrize("pins", [True, None], ids=["taken", "not-reported"])
def test_pin_memory_taken_or_not_reported_is_judged_on_steps(pins: bool | None) -> None:
    first = _pin_loop(pins).entries[0]
    assert first["outcome"] == "improved", first


def test_workers_torn_down_between_epochs_still_read_as_taken() -> None:
    """Non-persistent workers are gone between epochs: the window's worker processes read 0, while the
    loader's num_workers (what the probe reads from it) is the value the change gives."""
    loop = Loop(_spec())
    loop.window([_pod("a")], {"a": _obs(4.0, loader_num_workers=0)})
    between_epochs = {"worker_count": 0, "loader_num_workers": 1, "loader_persistent_workers": False}
    loop.window([_pod("b", "1:applied")], {"b": _obs(6.0, **between_epochs)})
    first = loop.entries[0]
    assert first["setting"]["name"] == "num_workers" and first["outcome"] == "improved", first
    assert "did not take effect" not in first["message"]
