"""Replicas' membership and hand-over (runtime/shards.py) on a simulated clock: several
``ShardMember``s share an in-memory Lease store that keeps the API server's rules
(resourceVersion preconditions, 409 on a stale write); members are killed, added, cut off from
the API and stopped cleanly, and after every step no bucket is held by two running members."""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Mapping
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from dam_operator.cluster.adapters.kube import ApiError, ConflictError, NotFoundError
from dam_operator.cluster.runtime.opmetrics import OperatorMetrics
from dam_operator.cluster.runtime.scheduler import Scheduler
from dam_operator.cluster.runtime.shards import BUCKETS_ANNOTATION, GROUP_LABEL, ShardMember
from dam_operator.cluster.steps import sharding as sh
from dam_operator.cluster.steps.registry import ProfileEntry, Registry
from dam_operator.cluster.steps.spec import DAMProfileSpec, EvaluationSpec, parse_spec

DURATION = 4.0
RENEW = 1.0


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class LeaseStore:
    """Leases in memory, with the API server's optimistic concurrency."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.rv = 0
        self.down: set[str] = set()
        """Holders whose calls fail (a member cut off from the API server)."""

    def _bump(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        return copy.deepcopy(obj)

    def api(self, who: str) -> LeaseAPIFor:
        return LeaseAPIFor(self, who)


class LeaseAPIFor:
    def __init__(self, store: LeaseStore, who: str) -> None:
        self.store, self.who = store, who

    def _check(self) -> None:
        if self.who in self.store.down:
            raise ApiError(0, "connection refused")

    async def list_leases(self, namespace: str, label_selector: str) -> list[Mapping[str, Any]]:
        self._check()
        key, value = label_selector.split("=")
        return [
            copy.deepcopy(o) for o in self.store.objects.values() if o["metadata"]["labels"].get(key) == value
        ]

    async def create_lease(self, namespace: str, body: Mapping[str, Any]) -> Mapping[str, Any]:
        self._check()
        name = body["metadata"]["name"]
        if name in self.store.objects:
            raise ConflictError(409, "exists")
        obj = copy.deepcopy(dict(body))
        self.store.objects[name] = obj
        return self.store._bump(obj)

    async def replace_lease(self, namespace: str, name: str, body: Mapping[str, Any]) -> Mapping[str, Any]:
        self._check()
        current = self.store.objects.get(name)
        if current is None:
            raise NotFoundError(404, "gone")
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise ConflictError(409, "stale")
        obj = copy.deepcopy(dict(body))
        self.store.objects[name] = obj
        return self.store._bump(obj)

    async def get_lease(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        self._check()
        return copy.deepcopy(self.store.objects.get(name))

    async def delete_lease(self, namespace: str, name: str, resource_version: str | None = None) -> None:
        self._check()
        current = self.store.objects.get(name)
        if current is not None and resource_version in (None, current["metadata"]["resourceVersion"]):
            del self.store.objects[name]


class Work:
    """A member's evaluations: which buckets it runs (``Scheduler`` in the operator)."""

    def __init__(self) -> None:
        self.held: set[int] = set()
        self.adopted: list[frozenset[int]] = []

    def adopt(self, buckets: frozenset[int]) -> int:
        assert not (self.held & buckets), "adopted a bucket it already runs"
        self.held |= buckets
        self.adopted.append(buckets)
        return len(buckets)

    async def release(self, buckets: frozenset[int], timeout_seconds: float) -> None:
        self.held -= buckets


class Sim:
    def __init__(self) -> None:
        self.clock = Clock()
        self.store = LeaseStore()
        self.members: dict[str, tuple[ShardMember, Work]] = {}
        self.running: set[str] = set()
        self.paused_until: dict[str, float] = {}
        """Members that run but do not step until then (a long pause: CPU starved, a slow drain)."""

    def add(self, identity: str) -> None:
        work = Work()
        member = ShardMember(
            self.store.api(identity),
            work,
            namespace="dam-system",
            identity=identity,
            group="dam",
            lease_duration_seconds=DURATION,
            renew_seconds=RENEW,
            clock=self.clock,
        )
        self.members[identity] = (member, work)
        self.running.add(identity)

    def kill(self, identity: str) -> None:
        """SIGKILL: no more steps, nothing released, the Lease left as it was."""
        self.running.discard(identity)

    def held(self, identity: str) -> set[int]:
        return self.members[identity][1].held

    def check_exclusive(self) -> None:
        seen: dict[int, str] = {}
        for identity in self.running:
            for b in self.held(identity):
                assert b not in seen, f"bucket {b} run by {seen[b]} and {identity} at t={self.clock.t}"
                seen[b] = identity

    def covered(self) -> bool:
        return set().union(*(self.held(i) for i in self.running)) == set(range(sh.BUCKETS))

    async def run(self, seconds: float, until: Any = None) -> float:
        """Steps every running member once per renew period (staggered), checking after each.
        Returns the simulated time it took until ``until()`` held (or ``seconds``)."""
        start = self.clock.t
        order = sorted(self.running)
        while self.clock.t - start < seconds:
            for identity in order:
                self.clock.t += RENEW / max(1, len(order))
                if identity in self.running and self.paused_until.get(identity, 0.0) <= self.clock.t:
                    await self.members[identity][0].step()
                    self.check_exclusive()
                    if until is not None and until():
                        return self.clock.t - start
            order = sorted(self.running)
        return self.clock.t - start


def test_three_members_split_the_buckets_by_the_assignment_and_never_share_one() -> None:
    async def scenario() -> None:
        sim = Sim()
        for name in ("op-a", "op-b", "op-c"):
            sim.add(name)
        took = await sim.run(20.0, until=sim.covered)
        assert took < 6 * RENEW  # the join grace (three renew periods) and a step
        want = sh.assignment(["op-a", "op-b", "op-c"])
        for name in ("op-a", "op-b", "op-c"):
            assert sim.held(name) == set(want[name])
            lease = sim.store.objects[f"dam-{name}"]
            assert lease["metadata"]["labels"] == {GROUP_LABEL: "dam"}
            assert sh.decode_buckets(lease["metadata"]["annotations"][BUCKETS_ANNOTATION]) == want[name]

    asyncio.run(scenario())


def test_a_killed_member_s_share_and_only_it_moves_within_a_lease_duration_and_two_renewals() -> None:
    async def scenario() -> None:
        sim = Sim()
        for name in ("op-a", "op-b", "op-c"):
            sim.add(name)
        await sim.run(20.0, until=sim.covered)
        before = {n: set(sim.held(n)) for n in ("op-a", "op-b")}
        sim.kill("op-c")
        took = await sim.run(30.0, until=sim.covered)
        assert took <= DURATION + 2 * RENEW
        for n in ("op-a", "op-b"):
            assert before[n] <= sim.held(n)  # kept everything it had
        assert sim.held("op-a") | sim.held("op-b") == set(range(sh.BUCKETS))
        await sim.run(DURATION * 11)
        assert "dam-op-c" not in sim.store.objects  # the dead member's Lease is collected

    asyncio.run(scenario())


def test_an_added_member_takes_only_its_share_after_the_others_drained_it() -> None:
    async def scenario() -> None:
        sim = Sim()
        for name in ("op-a", "op-b", "op-c"):
            sim.add(name)
        await sim.run(20.0, until=sim.covered)
        before = {n: set(sim.held(n)) for n in ("op-a", "op-b", "op-c")}
        sim.add("op-d")
        want = sh.assignment(["op-a", "op-b", "op-c", "op-d"])
        took = await sim.run(30.0, until=lambda: sim.held("op-d") == set(want["op-d"]))
        assert took < 8 * RENEW
        for n in ("op-a", "op-b", "op-c"):
            assert sim.held(n) == set(want[n]) and sim.held(n) <= before[n]
        assert sim.members["op-d"][1].adopted  # adopted only buckets others had released

    asyncio.run(scenario())


def test_a_member_cut_off_from_the_api_stops_before_the_others_take_its_share() -> None:
    """Its renewals fail: it releases everything two thirds into its Lease, the others see the Lease
    expire a Lease duration after its last renewal, and the check after every step finds no
    bucket run twice. Back on the API, it rejoins and gets its share back."""

    async def scenario() -> None:
        sim = Sim()
        for name in ("op-a", "op-b", "op-c"):
            sim.add(name)
        await sim.run(20.0, until=sim.covered)
        sim.store.down.add("op-c")
        took = await sim.run(30.0, until=lambda: not sim.held("op-c") and sim.covered())
        assert took <= DURATION + 2 * RENEW
        sim.store.down.clear()
        want = sh.assignment(["op-a", "op-b", "op-c"])
        await sim.run(30.0, until=lambda: sim.held("op-c") == set(want["op-c"]))
        assert sim.covered()

    asyncio.run(scenario())


def test_a_clean_stop_hands_over_within_two_renew_periods() -> None:
    async def scenario() -> None:
        sim = Sim()
        for name in ("op-a", "op-b", "op-c"):
            sim.add(name)
        await sim.run(20.0, until=sim.covered)
        member, _ = sim.members["op-c"]
        await member.leave()
        sim.running.discard("op-c")
        assert "dam-op-c" not in sim.store.objects
        took = await sim.run(30.0, until=sim.covered)
        assert took <= 2 * RENEW

    asyncio.run(scenario())


@pytest.mark.parametrize("members", [1, 2, 5])
def test_members_that_start_together_never_share_a_bucket(members: int) -> None:
    async def scenario() -> None:
        sim = Sim()
        for i in range(members):
            sim.add(f"op-{i}")
        await sim.run(20.0, until=sim.covered)
        assert sim.covered()

    asyncio.run(scenario())


def test_a_member_that_pauses_while_another_joins_keeps_its_buckets_until_it_released_them() -> None:
    """op-a stops stepping for three renew periods just as op-d joins: op-d's grace ends while
    op-a still runs op-d's buckets, and op-d waits for op-a's Lease to drop them (the claims)."""

    async def scenario() -> None:
        sim = Sim()
        for name in ("op-a", "op-b", "op-c"):
            sim.add(name)
        await sim.run(20.0, until=sim.covered)
        sim.paused_until["op-a"] = sim.clock.t + 3.5 * RENEW
        sim.add("op-d")
        want = sh.assignment(["op-a", "op-b", "op-c", "op-d"])
        await sim.run(30.0, until=lambda: sim.held("op-d") == set(want["op-d"]))
        assert len(sim.members["op-d"][1].adopted) >= 2  # op-a's part came later, once released

    asyncio.run(scenario())


# ---------------------------------------------------------------- the scheduler's side


class Evaluations:
    """Records each job; an evaluation takes 30 ms (one can be in flight at a release)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, float]] = []
        self.forgotten: list[str] = []
        self.in_flight: set[str] = set()

    async def adopt(self, entry: ProfileEntry) -> bool:
        self.calls.append(("adopt", entry.name, time.monotonic()))
        return True

    async def initialize(self, entry: ProfileEntry) -> bool:
        self.calls.append(("init", entry.name, time.monotonic()))
        return True

    async def evaluate_window(self, entry: ProfileEntry) -> list[Any]:
        self.in_flight.add(entry.name)
        try:
            await asyncio.sleep(0.03)
            self.calls.append(("evaluate", entry.name, time.monotonic()))
        finally:
            self.in_flight.discard(entry.name)
        return []

    def forget(self, entry: ProfileEntry) -> None:
        self.forgotten.append(entry.name)


def _spec(window: float) -> DAMProfileSpec:
    spec = parse_spec({"selector": {"matchLabels": {"app": "t"}}})
    return spec.model_copy(update={"evaluation": EvaluationSpec.model_construct(window_seconds=window)})


def test_a_sharded_scheduler_runs_only_adopted_buckets_and_a_release_waits_for_work_in_flight() -> None:
    async def scenario() -> None:
        reg = Registry()
        ev = Evaluations()
        sched = Scheduler(reg, ev, OperatorMetrics(CollectorRegistry()), concurrency=8)  # type: ignore[arg-type]
        sched.shard()
        reg.subscribe(sched.on_change)
        names = [f"p{i}" for i in range(12)]
        for i, name in enumerate(names):
            reg.upsert_profile("ns", name, uid=str(i), generation=1, spec=_spec(0.1))
        task = asyncio.create_task(sched.run())
        await asyncio.sleep(0.15)
        assert ev.calls == []  # holds no bucket yet: nothing runs, not even the first write
        mine = frozenset(sh.bucket_of("ns", n) for n in names[:6])
        ours = {n for n in names if sh.bucket_of("ns", n) in mine}
        assert sched.adopt(mine) == len(ours)
        await asyncio.sleep(0.35)
        assert {c[1] for c in ev.calls} == ours
        assert {c[1] for c in ev.calls if c[0] == "adopt"} == ours

        # Release while evaluations are in flight: it returns once they ended, and nothing of
        # those profiles runs after it.
        while not ev.in_flight:
            await asyncio.sleep(0.005)
        await sched.release(mine, timeout_seconds=1.0)
        assert not ev.in_flight
        released_at = time.monotonic()
        assert set(ev.forgotten) == ours
        await asyncio.sleep(0.3)
        assert not [c for c in ev.calls if c[2] > released_at]

        # Taken back: one chain of windows per profile again, none doubled by work queued before.
        again = time.monotonic()
        sched.adopt(mine)
        await asyncio.sleep(0.55)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for name in ours:
            windows = [c for c in ev.calls if c[1] == name and c[0] == "evaluate" and c[2] > again]
            assert 3 <= len(windows) <= 6, (name, len(windows))  # ~4 windows of 0.1 s in 0.55 s

    asyncio.run(scenario())
