"""The pure sharding rules: the bucket hash, the rendezvous assignment, the Leases' liveness and
the drain handshake's plan (operator/dam_operator/cluster/steps/sharding.py)."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest

from dam_operator.cluster.steps import sharding as sh


def pod_names(seed: int, count: int = 3) -> list[str]:
    """Names as a Deployment gives its Pods (``<rs hash>-<5 random>``)."""
    r = random.Random(seed)
    alphabet = "bcdfghjklmnpqrstvwxz2456789"
    return [
        f"dam-operator-{''.join(r.choices(alphabet, k=10))}-{''.join(r.choices(alphabet, k=5))}"
        for _ in range(count)
    ]


def test_a_profiles_bucket_is_the_same_in_every_process_whatever_its_hash_seed() -> None:
    code = "from dam_operator.cluster.steps.sharding import bucket_of; print(bucket_of('team-a', 'resnet'))"
    seen = set()
    for seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        seen.add(out.stdout.strip())
    assert seen == {str(sh.bucket_of("team-a", "resnet"))}
    assert 0 <= sh.bucket_of("team-a", "resnet") < sh.BUCKETS


@pytest.mark.parametrize("seed", range(5))
def test_a_lost_member_moves_only_its_own_buckets_and_spreads_them_over_the_rest(seed: int) -> None:
    a, b, c = pod_names(seed)
    before = sh.assignment([a, b, c])
    after = sh.assignment([a, b])
    assert before[a] <= after[a] and before[b] <= after[b]  # nothing of a's or b's moved
    assert after[a] | after[b] == frozenset(range(sh.BUCKETS))
    moved_to_a = after[a] - before[a]
    assert moved_to_a <= before[c]
    # c's share is split, not dumped on one member: each gets 35..65 % of it.
    assert 0.35 < len(moved_to_a) / len(before[c]) < 0.65


@pytest.mark.parametrize("seed", range(5))
def test_a_new_member_takes_only_its_share_and_only_from_the_others(seed: int) -> None:
    a, b, c, d = pod_names(seed, 4)
    before = sh.assignment([a, b, c])
    after = sh.assignment([a, b, c, d])
    for m in (a, b, c):
        assert after[m] <= before[m]  # each old member only gave buckets away
    moved = sum(len(before[m] - after[m]) for m in (a, b, c))
    assert moved == len(after[d])
    assert abs(len(after[d]) - sh.BUCKETS / 4) < 0.1 * sh.BUCKETS / 4


def test_three_members_hold_a_third_of_the_buckets_each_within_seven_per_cent() -> None:
    worst = 0.0
    for seed in range(40):
        shares = sh.assignment(pod_names(seed))
        assert sum(len(s) for s in shares.values()) == sh.BUCKETS
        worst = max(worst, *(abs(len(s) - sh.BUCKETS / 3) / (sh.BUCKETS / 3) for s in shares.values()))
    assert worst < 0.07


def test_ten_thousand_profiles_split_over_three_members_within_eight_per_cent() -> None:
    members = ["dam-operator-0", "dam-operator-1", "dam-operator-2"]
    owners = [sh.owner_of(sh.bucket_of(f"ns-{i % 13}", f"job-{i}"), members) for i in range(10_000)]
    counts = [owners.count(m) for m in members]
    assert all(abs(c - 10_000 / 3) < 0.08 * 10_000 / 3 for c in counts), counts


def test_claims_round_trip_and_anything_else_claims_nothing() -> None:
    held = frozenset({0, 1, 17, sh.BUCKETS - 1})
    text = sh.encode_buckets(held)
    assert len(text) == sh.BUCKETS // 4
    assert sh.decode_buckets(text) == held
    assert sh.decode_buckets(sh.encode_buckets(())) == frozenset()
    assert sh.decode_buckets(None) == frozenset()
    assert sh.decode_buckets("not hex") == frozenset()


# ---------------------------------------------------------------- liveness on the local clock


def record(
    identity: str, version: str, claims: set[int] | None = None, duration: float = 10.0
) -> sh.LeaseRecord:
    return sh.LeaseRecord(identity, version, duration, frozenset(claims or ()))


def test_a_lease_is_live_while_it_keeps_changing_and_expires_a_duration_after_its_last_change() -> None:
    obs = sh.Observer()
    obs.observe([record("a", "1"), record("me", "5")], now=100.0)
    assert set(obs.live(105.0, me="me")) == {"a"}
    obs.observe([record("a", "2"), record("me", "6")], now=108.0)  # renewed
    assert set(obs.live(117.0, me="me")) == {"a"}  # 9 s after the change it saw
    obs.observe([record("a", "2"), record("me", "7")], now=118.0)  # not renewed since 108
    assert obs.live(118.0, me="me") == {}
    assert obs.expired(118.0, me="me", after_seconds=50.0) == {}
    assert obs.expired(168.0, me="me", after_seconds=50.0) == {"a": "2"}


def test_a_lease_first_seen_counts_live_for_a_whole_duration_whatever_its_age() -> None:
    """A replica that starts cannot tell a dead member's Lease from a live one at once: it gives
    it a Lease duration from the moment it saw it (client-go's rule), so it never takes over
    buckets whose owner may still run."""
    obs = sh.Observer()
    obs.observe([record("dead", "9", {3})], now=500.0)
    assert set(obs.live(509.0, me="me")) == {"dead"}
    assert obs.live(510.0, me="me") == {}


def test_a_lease_deleted_from_the_list_is_gone_at_once() -> None:
    obs = sh.Observer()
    obs.observe([record("a", "1")], now=0.0)
    obs.observe([], now=1.0)
    assert obs.live(1.0, me="me") == {}


# ---------------------------------------------------------------- the plan


def plan_for(me: str, held: set[int], others: dict[str, set[int]], **kw: object) -> sh.Plan:
    args: dict[str, object] = {
        "fenced": False,
        "view_age": 0.5,
        "joined_for": 100.0,
        "fresh_seconds": 3.0,
        "join_grace_seconds": 6.0,
        "buckets": 64,
    }
    args.update(kw)
    return sh.plan(
        me=me,
        held=frozenset(held),
        others={i: record(i, "1", c) for i, c in others.items()},
        **args,  # type: ignore[arg-type]
    )


def test_a_member_takes_its_free_buckets_and_waits_for_those_another_still_claims() -> None:
    mine = sh.assignment(["a", "b"], 64)["a"]
    claimed_by_b = set(sorted(mine)[:3])
    p = plan_for("a", set(), {"b": claimed_by_b})
    assert p.owned == mine
    assert p.waiting == frozenset(claimed_by_b)
    assert p.acquire == mine - claimed_by_b
    assert p.release == frozenset()


def test_a_member_releases_what_it_no_longer_owns_when_another_joins() -> None:
    before = sh.assignment(["a"], 64)["a"]
    p = plan_for("a", set(before), {"b": set()})
    assert p.release == before - sh.assignment(["a", "b"], 64)["a"]
    assert p.release and p.acquire == frozenset()


@pytest.mark.parametrize(
    ("why", "kw"),
    [
        ("its Lease is new: the others may not have seen it", {"joined_for": 5.9}),
        ("its Lease is not published", {"joined_for": None}),
        ("its view of the Leases is stale", {"view_age": 3.5}),
        ("it never listed the Leases", {"view_age": None}),
    ],
)
def test_a_member_takes_nothing_while_it_cannot_be_sure_of_the_others(
    why: str, kw: dict[str, object]
) -> None:
    p = plan_for("a", set(), {"b": set()}, **kw)
    assert p.acquire == frozenset(), why
    assert p.owned  # it knows what it will own


def test_a_fenced_member_releases_everything_and_takes_nothing() -> None:
    p = plan_for("a", {1, 2, 3}, {}, fenced=True)
    assert p.release == frozenset({1, 2, 3}) and p.acquire == frozenset()
