"""The evaluator (one window of one profile) and the single scheduler loop.

The evaluator runs against real fake-sidecar HTTP servers on loopback addresses
and an in-memory status API that applies merge patches like the API server; the
jobs' clocks are simulated so that 30-second windows take no real time.
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import itertools
import time
from collections.abc import Mapping
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from dam_operator.cluster.adapters.kube import ApiError, NotFoundError
from dam_operator.cluster.adapters.sources import ScrapeSource
from dam_operator.cluster.runtime.opmetrics import OperatorMetrics
from dam_operator.cluster.runtime.scheduler import MAX_PENDING_EVENTS, Evaluator, Scheduler
from dam_operator.cluster.steps import metric_names as n
from dam_operator.cluster.steps import status as st
from dam_operator.cluster.steps.registry import PodInfo, ProfileEntry, Registry
from dam_operator.cluster.steps.spec import DAMProfileSpec, EvaluationSpec, parse_spec
from tests.support.fake_sidecar import COMPUTE, FakeJob, FakeSidecars, pod_ip
from tests.support.merge_patch import merge


class FakeAPI:
    """Status subresource + Events in memory; can fail on demand."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.patches = 0
        self.fail_with: Exception | None = None
        self.fail_events: Exception | None = None
        self.refused_events = 0

    async def patch_profile_status(
        self, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> Mapping[str, Any]:
        if self.fail_with is not None:
            raise self.fail_with
        obj = self.objects.setdefault((namespace, name), {"status": {}})
        self.patches += 1
        merge(obj, patch)
        return {"status": dict(obj.get("status") or {})}

    async def create_event(self, namespace: str, body: Mapping[str, Any]) -> None:
        if self.fail_events is not None:
            self.refused_events += 1
            raise self.fail_events
        self.events.append(dict(body))

    def status(self, name: str = "p") -> dict[str, Any]:
        """A copy of the stored status (later patches do not change it)."""
        return copy.deepcopy(self.objects[("ns", name)]["status"])


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t

    def now(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.t, dt.UTC)


SPEC = {
    "selector": {"matchLabels": {"app": "trainer"}},
    "evaluation": {"windowSeconds": 30, "hysteresisWindows": 2},
}


class World:
    """Registry + sidecars + evaluator, with a simulated clock."""

    def __init__(self, pods: int = 2, spec: Mapping[str, Any] = SPEC) -> None:
        self.clock = Clock()
        self.api = FakeAPI()
        self.registry = Registry()
        self.prom = CollectorRegistry()
        self.metrics = OperatorMetrics(self.prom)
        self.sidecars = FakeSidecars()
        self.spec_raw = dict(spec)
        self.pod_count = pods
        self.jobs: dict[str, FakeJob] = {}

    async def __aenter__(self) -> World:
        port = await self.sidecars.start("0.0.0.0", 0)
        spec = dict(self.spec_raw)
        spec["sidecar"] = {"port": port}
        self.entry = self.registry.upsert_profile("ns", "p", uid="uid-1", generation=1, spec=parse_spec(spec))
        for i in range(self.pod_count):
            ip = pod_ip(i)
            self.jobs[f"pod-{i}"] = self.sidecars.add(ip, FakeJob(clock=self.clock))
            self.registry.upsert_pod(
                PodInfo("ns", f"pod-{i}", {"app": "trainer"}, pod_ip=ip, phase="Running", instrumented=True)
            )
        self.session = aiohttp.ClientSession()
        self.evaluator = self.make_evaluator()
        return self

    def make_evaluator(self) -> Evaluator:
        return Evaluator(
            self.registry,
            self.api,
            lambda _spec: ScrapeSource(self.session, timeout_seconds=0.5),
            self.metrics,
            now=self.clock.now,
        )

    async def __aexit__(self, *exc: object) -> None:
        await self.session.close()
        await self.sidecars.stop()

    async def window(self, seconds: float = 30.0) -> dict[str, Any]:
        self.clock.t += seconds
        entry = self.registry.profile("ns", "p")
        assert entry is not None
        await self.evaluator.evaluate(entry)
        return self.api.status()


def _cond(status: Mapping[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == type_)


def test_starved_pods_are_diagnosed_input_bound_with_one_event() -> None:
    async def scenario() -> None:
        async with World() as w:
            assert await w.evaluator.initialize(w.entry)
            init = w.api.status()
            assert _cond(init, st.DIAGNOSED)["reason"] == st.REASON_PENDING
            assert init["pods"] == {"matched": 2, "instrumented": 2, "reporting": 2}
            first = await w.window()
            assert first["bottleneck"]["axis"] == "Data"
            assert first["bottleneck"]["regime"] == "input-bound"
            assert first["metrics"]["dataWaitRatio"] == pytest.approx(0.7, abs=0.01)
            assert _cond(first, st.DIAGNOSED)["status"] == "True"
            assert first["observedGeneration"] == 1
            became_true = _cond(first, st.DIAGNOSED)["lastTransitionTime"]
            second = await w.window()
            assert _cond(second, st.DIAGNOSED)["lastTransitionTime"] == became_true
            assert second == first  # nothing but lastEvaluationTime would change: no write
            assert [e["reason"] for e in w.api.events] == ["BottleneckChanged"]
            assert "input-bound" in w.api.events[0]["message"]
            labels = {
                "namespace": "ns",
                "profile": "p",
                "axis": "Data",
                "regime": "input-bound",
                "lever": first["bottleneck"]["lever"],
            }
            assert w.prom.get_sample_value(n.PROFILE_VERDICT, labels) == 1.0

    asyncio.run(scenario())


def test_switch_to_compute_bound_passes_hysteresis_then_emits_an_event() -> None:
    async def scenario() -> None:
        async with World() as w:
            await w.evaluator.initialize(w.entry)
            await w.window()
            for job in w.jobs.values():
                job.switch(COMPUTE)
            seen = []
            for _ in range(3):
                seen.append((await w.window())["bottleneck"]["axis"])
            assert seen[-1] == "Machine"
            assert "Data" not in seen[seen.index("Machine") :]
            reasons = [e["message"] for e in w.api.events]
            assert len(reasons) == 2 and "was Data (input-bound)" in reasons[1]
            old = {"namespace": "ns", "profile": "p", "axis": "Data", "regime": "input-bound"}
            assert w.prom.get_sample_value(n.PROFILE_VERDICT, old) is None

    asyncio.run(scenario())


@pytest.mark.parametrize("fault", ["down", "slow", "garbage"])
def test_a_failing_sidecar_makes_its_pod_not_reporting_without_failing_the_evaluation(fault: str) -> None:
    async def scenario() -> None:
        async with World() as w:
            await w.evaluator.initialize(w.entry)
            w.jobs["pod-1"].fault = fault  # type: ignore[assignment]
            w.jobs["pod-1"].slow_seconds = 2.0
            status = await w.window()
            assert status["pods"]["reporting"] == 1
            reporting = _cond(status, st.REPORTING)
            assert reporting["status"] == "False" and "pod-1" in reporting["message"]
            assert status["bottleneck"]["axis"] == "Data"  # pod-0 still tells
            errors = sum(
                s.value
                for fam in w.prom.collect()
                for s in fam.samples
                if s.name == n.OPERATOR_EVALUATION_ERRORS_TOTAL
            )
            assert errors == 1

    asyncio.run(scenario())


def test_all_sidecars_down_holds_the_verdict_then_says_unknown() -> None:
    async def scenario() -> None:
        async with World(pods=1) as w:
            await w.evaluator.initialize(w.entry)
            await w.window()
            w.jobs["pod-0"].fault = "down"
            held = await w.window()
            assert held["bottleneck"]["axis"] == "Data"
            assert _cond(held, st.DIAGNOSED)["reason"] == st.REASON_NO_REPORTING
            assert "metrics" not in held or not held["metrics"].get("dataWaitRatio")
            for _ in range(3):
                last = await w.window()
            assert last["bottleneck"]["axis"] == "Unknown"

    asyncio.run(scenario())


def test_pods_without_sidecar_are_reported_not_instrumented() -> None:
    async def scenario() -> None:
        async with World(pods=1) as w:
            w.registry.upsert_pod(
                PodInfo("ns", "early", {"app": "trainer"}, pod_ip="127.9.9.9", phase="Running")
            )
            await w.evaluator.initialize(w.entry)
            status = w.api.status()
            cond = _cond(status, st.INSTRUMENTED)
            assert cond["status"] == "False" and cond["reason"] == st.REASON_NOT_INSTRUMENTED
            assert "early" in cond["message"]
            assert status["pods"]["notInstrumented"] == ["early"]
            assert status["pods"]["instrumented"] == 1

    asyncio.run(scenario())


def test_invalid_spec_gets_a_condition_and_no_schedule() -> None:
    async def scenario() -> None:
        async with World() as w:
            bad = w.registry.upsert_profile(
                "ns",
                "p",
                uid="uid-1",
                generation=2,
                spec=None,
                error="spec.sampling.intervalSeconds: must be ...",
            )
            assert not await w.evaluator.initialize(bad)
            status = w.api.status()
            assert _cond(status, st.SPEC_VALID)["reason"] == st.REASON_INVALID
            assert "intervalSeconds" in _cond(status, st.SPEC_VALID)["message"]
            assert "bottleneck" not in status
            assert [e["reason"] for e in w.api.events] == [st.REASON_INVALID]
            assert w.api.events[0]["type"] == "Warning"

    asyncio.run(scenario())


def test_restart_resumes_the_verdict_without_a_duplicate_event_and_replaces_stale_conditions() -> None:
    async def scenario() -> None:
        async with World() as w:
            await w.evaluator.initialize(w.entry)
            await w.window()
            assert len(w.api.events) == 1
            # An operator restart: a fresh registry entry seeded from the object's status,
            # plus a stale condition type left by some older version.
            stored = w.api.objects[("ns", "p")]["status"]
            stored["conditions"].append({"type": "Ready", "status": "True", "lastTransitionTime": "x"})
            status = w.api.status()
            w.registry.remove_profile("ns", "p")
            w.entry = w.registry.upsert_profile(
                "ns", "p", uid="uid-1", generation=1, spec=w.entry.spec, status=dict(status)
            )
            w.evaluator = w.make_evaluator()
            await w.evaluator.initialize(w.entry)
            after_init = w.api.status()
            assert "Ready" not in {c["type"] for c in after_init["conditions"]}
            assert _cond(after_init, st.DIAGNOSED)["status"] == "True"  # verdict kept until re-evaluated
            resumed = await w.window()
            assert resumed["bottleneck"]["axis"] == "Data"
            assert len(w.api.events) == 1

    asyncio.run(scenario())


def test_an_event_the_api_refused_is_posted_at_the_next_window_in_order_with_its_own_time() -> None:
    async def scenario() -> None:
        async with World() as w:
            await w.evaluator.initialize(w.entry)
            await w.window()
            assert len(w.api.events) == 1
            for job in w.jobs.values():
                job.switch(COMPUTE)
            w.api.fail_events = aiohttp.ClientConnectionError("connect call failed")
            for _ in range(3):
                if (await w.window())["bottleneck"]["axis"] == "Machine":
                    break
            changed_at = w.clock.now()  # the window that published Machine
            assert w.api.refused_events >= 1 and len(w.api.events) == 1
            refused = w.api.refused_events
            await w.window()  # the API still refuses: the Event waits, tried once
            assert w.api.refused_events == refused + 1
            w.api.fail_events = None
            await w.window()
            assert [e["reason"] for e in w.api.events] == ["BottleneckChanged"] * 2
            assert "was Data (input-bound)" in w.api.events[1]["message"]
            assert w.api.events[1]["firstTimestamp"] == st.format_time(changed_at)
            await w.window()
            assert len(w.api.events) == 2, "posted once"
            assert w.prom.get_sample_value(
                n.OPERATOR_EVALUATION_ERRORS_TOTAL, {"reason": "event-failed"}
            ) == float(refused + 1)

    asyncio.run(scenario())


def test_a_verdict_whose_status_write_failed_is_told_by_the_window_that_writes_it() -> None:
    """A status write that raises (a 503, a lost answer) leaves the verdict unpublished: the
    window that gets it written emits its Event, instead of taking it as already told."""

    async def scenario() -> None:
        async with World() as w:
            await w.evaluator.initialize(w.entry)
            await w.window()
            assert [e["reason"] for e in w.api.events] == ["BottleneckChanged"]
            for job in w.jobs.values():
                job.switch(COMPUTE)
            w.api.fail_with = ApiError(503, "unavailable")
            for _ in range(3):  # past the hysteresis: the Machine verdict is formed, not written
                with pytest.raises(ApiError):
                    await w.window()
            assert w.api.status()["bottleneck"]["axis"] == "Data"
            assert len(w.api.events) == 1
            w.api.fail_with = None
            written = await w.window()
            assert written["bottleneck"]["axis"] == "Machine"
            assert [e["reason"] for e in w.api.events] == ["BottleneckChanged"] * 2
            assert "was Data (input-bound)" in w.api.events[1]["message"]
            await w.window()
            assert len(w.api.events) == 2, "told once"

    asyncio.run(scenario())


def test_events_the_api_refuses_are_kept_up_to_a_bound_oldest_dropped_first() -> None:
    async def scenario() -> None:
        async with World() as w:
            w.api.fail_events = aiohttp.ClientConnectionError("connect call failed")
            for generation in range(2, 2 + MAX_PENDING_EVENTS + 3):  # one InvalidSpec Event each
                bad = w.registry.upsert_profile(
                    "ns", "p", uid="uid-1", generation=generation, spec=None, error=f"edit {generation}"
                )
                bad.status = w.api.status() if ("ns", "p") in w.api.objects else {}
                assert not await w.evaluator.initialize(bad)
            w.api.fail_events = None
            entry = w.registry.profile("ns", "p")
            assert entry is not None
            await w.evaluator.evaluate(entry)  # an invalid profile's window posts what waits
            messages = [e["message"] for e in w.api.events]
            assert len(messages) == MAX_PENDING_EVENTS
            assert "edit 5" in messages[0] and f"edit {MAX_PENDING_EVENTS + 4}" in messages[-1]

    asyncio.run(scenario())


def test_a_deleted_profile_takes_its_unposted_events_with_it() -> None:
    async def scenario() -> None:
        async with World() as w:
            w.api.fail_events = aiohttp.ClientConnectionError("connect call failed")
            bad = w.registry.upsert_profile("ns", "p", uid="uid-1", generation=2, spec=None, error="bad")
            assert not await w.evaluator.initialize(bad)
            w.evaluator.forget(bad)
            w.api.fail_events = None
            again = w.registry.upsert_profile("ns", "p", uid="uid-2", generation=1, spec=w.entry.spec)
            assert await w.evaluator.initialize(again)
            assert w.api.events == []

    asyncio.run(scenario())


# ---------------------------------------------------------------- the loop


class FakeEvaluator:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, int]] = []
        self.running = 0
        self.max_running = 0
        self.fail: dict[str, Exception] = {}
        self.forgotten: list[str] = []

    async def initialize(self, entry: ProfileEntry) -> bool:
        self.calls.append(("init", entry.name, entry.revision))
        return entry.spec is not None

    async def evaluate_window(self, entry: ProfileEntry) -> list[tuple[st.EventSpec, str]]:
        await self.evaluate(entry)
        return []

    async def post_events(self, entry: ProfileEntry, events: list[tuple[st.EventSpec, str]]) -> None:
        raise AssertionError("no Events here")

    async def evaluate(self, entry: ProfileEntry) -> None:
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            self.calls.append(("evaluate", entry.name, entry.revision))
            await asyncio.sleep(0.02)
            if entry.name in self.fail:
                raise self.fail.pop(entry.name)
        finally:
            self.running -= 1

    def forget(self, entry: ProfileEntry) -> None:
        self.forgotten.append(entry.name)


def _fast_spec(window: float) -> DAMProfileSpec:
    spec = parse_spec({"selector": {"matchLabels": {"app": "t"}}})
    return spec.model_copy(update={"evaluation": EvaluationSpec.model_construct(window_seconds=window)})


async def _run_for(scheduler: Scheduler, seconds: float) -> None:
    task = asyncio.create_task(scheduler.run())
    await asyncio.sleep(seconds)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def _run_profiles(
    evaluator: Any,
    count: int,
    window: float,
    seconds: float,
    prom: CollectorRegistry | None = None,
    **kw: Any,
) -> None:
    """``count`` profiles of ``window`` s windows on one scheduler for ``seconds``."""

    async def scenario() -> None:
        reg = Registry()
        sched = Scheduler(reg, evaluator, OperatorMetrics(prom or CollectorRegistry()), **kw)
        reg.subscribe(sched.on_change)
        for i in range(count):
            reg.upsert_profile("ns", f"p{i}", uid=str(i), generation=1, spec=_fast_spec(window))
        await _run_for(sched, seconds)

    asyncio.run(scenario())


def test_one_loop_evaluates_every_profile_each_window_within_the_concurrency_bound() -> None:
    fake = FakeEvaluator()
    _run_profiles(fake, 20, 0.2, 1.1, concurrency=4)
    per_profile = [sum(1 for c in fake.calls if c[0] == "evaluate" and c[1] == f"p{i}") for i in range(20)]
    assert min(per_profile) >= 3  # ~5 windows of 0.2 s in 1.1 s, minus the init
    assert max(per_profile) <= 6
    assert fake.max_running <= 4


def test_evaluations_that_wait_for_a_busy_worker_show_in_the_delay_histogram() -> None:
    """One worker, windows of 20 ms of work, ten profiles due at once: the tenth waits ~0.18 s."""

    prom = CollectorRegistry()
    _run_profiles(FakeEvaluator(), 10, 0.1, 0.32, prom, concurrency=1)  # ten inits, then ten windows at once
    count = prom.get_sample_value(n.OPERATOR_EVALUATION_DELAY_SECONDS + "_count")
    total = prom.get_sample_value(n.OPERATOR_EVALUATION_DELAY_SECONDS + "_sum")
    late = prom.get_sample_value(n.OPERATOR_EVALUATION_DELAY_SECONDS + "_bucket", {"le": "0.1"})
    assert count is not None and count >= 20
    assert total is not None and total >= 0.5  # 0 + 20 + 40 + ... + 180 ms in the first round alone
    assert late is not None and late < count  # some waited longer than 0.1 s


class SlowEventsEvaluator(FakeEvaluator):
    """Windows are instant and have one Event each; posting an Event takes 50 ms."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[float, str, str]] = []
        self.posting = 0
        self.max_posting = 0

    async def evaluate_window(self, entry: ProfileEntry) -> list[tuple[st.EventSpec, str]]:
        self.log.append((time.monotonic(), "window", entry.name))
        return [(st.EventSpec("BottleneckChanged", entry.name), "t")]

    async def post_events(self, entry: ProfileEntry, events: list[tuple[st.EventSpec, str]]) -> None:
        self.posting += 1
        self.max_posting = max(self.max_posting, self.posting)
        try:
            await asyncio.sleep(0.05)
            self.log.append((time.monotonic(), "posted", entry.name))
        finally:
            self.posting -= 1


def test_events_are_posted_off_the_workers_a_few_at_a_time_and_in_order_per_profile() -> None:
    fake = SlowEventsEvaluator()
    _run_profiles(fake, 6, 0.1, 0.6, concurrency=1, event_concurrency=1)
    windows = [t for t, what, _ in fake.log if what == "window"]
    posted = [t for t, what, _ in fake.log if what == "posted"]
    # Six windows on ONE worker did not wait for six Events posted one at a time (0.3 s).
    assert windows[5] - windows[0] < 0.05
    assert posted and posted[0] > windows[5]
    assert fake.max_posting == 1
    for name in {who for _, _, who in fake.log}:  # a profile's next window waits for its Events
        mine = [what for _, what, who in fake.log if who == name]
        assert all(a != b for a, b in itertools.pairwise(mine)), mine


class FailingEventsEvaluator(SlowEventsEvaluator):
    async def post_events(self, entry: ProfileEntry, events: list[tuple[st.EventSpec, str]]) -> None:
        raise RuntimeError("a bug while posting")


def test_a_failure_while_posting_events_is_counted_and_the_profile_keeps_its_windows() -> None:
    fake = FailingEventsEvaluator()
    prom = CollectorRegistry()
    _run_profiles(fake, 1, 0.1, 0.45, prom, concurrency=1)
    windows = [t for t, what, _ in fake.log if what == "window"]
    assert len(windows) >= 3  # ~4 windows of 0.1 s after the init; none stopped by the failure
    errors = prom.get_sample_value(n.OPERATOR_EVALUATION_ERRORS_TOTAL, {"reason": "event-failed"})
    assert errors == len(windows)


def test_deleted_and_replaced_profiles_drop_their_old_work() -> None:
    async def scenario() -> FakeEvaluator:
        reg = Registry()
        fake = FakeEvaluator()
        sched = Scheduler(reg, fake, OperatorMetrics(CollectorRegistry()), concurrency=2)  # type: ignore[arg-type]
        reg.subscribe(sched.on_change)
        reg.upsert_profile("ns", "gone", uid="1", generation=1, spec=_fast_spec(0.1))
        reg.upsert_profile("ns", "bad", uid="2", generation=1, spec=None, error="broken")
        changed = reg.upsert_profile("ns", "changed", uid="3", generation=1, spec=_fast_spec(0.1))
        task = asyncio.create_task(sched.run())
        await asyncio.sleep(0.25)
        reg.remove_profile("ns", "gone")
        newer = reg.upsert_profile("ns", "changed", uid="3", generation=2, spec=_fast_spec(0.1))
        calls_at_delete = len(fake.calls)
        await asyncio.sleep(0.4)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        later = fake.calls[calls_at_delete:]
        assert not [c for c in later if c[1] == "gone"]
        assert not [
            c for c in later if c[1] == "changed" and c[2] == changed.revision and c[0] == "evaluate"
        ][1:]
        assert [c for c in later if c[1] == "changed" and c[2] == newer.revision]
        return fake

    fake = asyncio.run(scenario())
    assert [c for c in fake.calls if c[1] == "bad"] == [("init", "bad", 2)]
    assert fake.forgotten == ["gone"]


def test_api_errors_are_retried_and_not_found_unregisters() -> None:
    async def scenario() -> tuple[FakeEvaluator, Registry, CollectorRegistry]:
        reg = Registry()
        fake = FakeEvaluator()
        prom = CollectorRegistry()
        sched = Scheduler(reg, fake, OperatorMetrics(prom), concurrency=2, retry_seconds=0.05)  # type: ignore[arg-type]
        reg.subscribe(sched.on_change)
        fake.fail["flaky"] = ApiError(503, "unavailable")
        fake.fail["vanished"] = NotFoundError(404, "not found")
        reg.upsert_profile("ns", "flaky", uid="1", generation=1, spec=_fast_spec(0.1))
        reg.upsert_profile("ns", "vanished", uid="2", generation=1, spec=_fast_spec(0.1))
        await _run_for(sched, 0.6)
        return fake, reg, prom

    fake, reg, prom = asyncio.run(scenario())
    flaky = [c for c in fake.calls if c[1] == "flaky" and c[0] == "evaluate"]
    assert len(flaky) >= 3  # failed once, retried, then kept its schedule
    assert reg.profile("ns", "vanished") is None
    assert prom.get_sample_value(n.OPERATOR_EVALUATION_ERRORS_TOTAL, {"reason": "api-5xx"}) == 1.0


def test_restarted_operator_does_not_post_a_second_invalid_spec_event_for_the_same_generation() -> None:
    async def scenario() -> None:
        async with World() as w:
            error = "spec.thresholds.dataWaitFine: must be below dataWaitSuspect"
            bad = w.registry.upsert_profile("ns", "p", uid="uid-1", generation=2, spec=None, error=error)
            assert not await w.evaluator.initialize(bad)
            assert len(w.api.events) == 1
            # A restart: a new evaluator and registry entry, the status read back from the object.
            resumed = Registry().upsert_profile("ns", "p", uid="uid-1", generation=2, spec=None, error=error)
            resumed.status = w.api.status()
            assert not await w.make_evaluator().initialize(resumed)
            assert len(w.api.events) == 1
            # The user edits the spec, still invalid: a new generation gets its Event.
            edited = w.registry.upsert_profile("ns", "p", uid="uid-1", generation=3, spec=None, error=error)
            edited.status = w.api.status()
            assert not await w.evaluator.initialize(edited)
            assert len(w.api.events) == 2

    asyncio.run(scenario())
