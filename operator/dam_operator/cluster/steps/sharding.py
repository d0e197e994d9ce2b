"""Sharding the profiles over the operator's replicas: pure functions, no I/O.

Every replica holds a Lease (``coordination.k8s.io/v1``) in the operator's namespace as its
membership (``runtime/shards.py`` renews it and lists the others). Profiles are grouped into
``BUCKETS`` buckets by a hash of ``namespace/name``; each bucket belongs to one live member by
rendezvous (highest random weight) hashing over the live members' identities. Rendezvous
hashing moves only what it must: a member that goes away loses exactly its own buckets (each
goes to the member ranked second for it), a member that joins takes only the buckets it now
ranks first for, from whoever held them.

A bucket changes hands by a drain handshake, so that no profile is evaluated by two replicas
at once:

- a member that no longer owns a bucket stops its work there first (its in-flight evaluations
  end) and only then publishes its Lease without the bucket (``release``);
- a member takes a bucket (``acquire``) only when no other live member's Lease claims it, it
  publishes the claim before it starts, and it acts only on a fresh view of the Leases
  (listed at most ``fresh_seconds`` ago) after its own Lease has been published for
  ``join_grace_seconds`` (twice ``fresh_seconds``): by then every member that might compute
  another owner has seen it, and it has seen their claims;
- a member's liveness is judged on the observer's own clock, as client-go's leader election
  does (``tools/leaderelection``: "a client observes timestamps captured locally"; the Lease
  API: ``leaseDurationSeconds`` "is measured against the time of last observed renewTime"):
  a Lease whose ``resourceVersion`` has not changed for ``leaseDurationSeconds`` since this
  replica last saw it change is expired, its claims void. A member that cannot renew its own
  Lease for ``renew_deadline`` (under the Lease duration) stops all its work first
  (``fenced``), so an expired member is one that has stopped.

A Lease's claims travel as an annotation: the held buckets as a hex bitmap (``encode_buckets``).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

BUCKETS = 4096
"""Buckets of profiles. Fixed: every replica must split alike. 4,096 keeps three members within
7 % of a third each, 2 % typically (tests/unit/cluster/test_sharding.py), in a 1,024-character
claim; one assignment takes about 25 ms and is cached per member set."""


def bucket_of(namespace: str, name: str, buckets: int = BUCKETS) -> int:
    """The bucket of a profile: a stable hash (BLAKE2b, never Python's salted ``hash``)."""
    digest = hashlib.blake2b(f"{namespace}/{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % buckets


def _score(identity: str, bucket: int) -> int:
    digest = hashlib.blake2b(f"{identity}\0{bucket}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def owner_of(bucket: int, members: Iterable[str]) -> str | None:
    """The member ranked first for ``bucket`` (rendezvous hashing); None without members."""
    best: tuple[int, str] | None = None
    for identity in members:
        key = (_score(identity, bucket), identity)
        if best is None or key > best:
            best = key
    return None if best is None else best[1]


def assignment(members: Iterable[str], buckets: int = BUCKETS) -> dict[str, frozenset[int]]:
    """Every member's buckets (members without any map to an empty set)."""
    return dict(_assignment(tuple(sorted(set(members))), buckets))


@functools.lru_cache(maxsize=16)
def _assignment(ids: tuple[str, ...], buckets: int) -> tuple[tuple[str, frozenset[int]], ...]:
    owned: dict[str, set[int]] = {m: set() for m in ids}
    for bucket in range(buckets):
        owner = owner_of(bucket, ids)
        if owner is not None:
            owned[owner].add(bucket)
    return tuple((m, frozenset(b)) for m, b in owned.items())


def encode_buckets(held: Iterable[int], buckets: int = BUCKETS) -> str:
    """A set of buckets as a hex bitmap (bit ``b`` of the big number is bucket ``b``)."""
    value = 0
    for b in held:
        if 0 <= b < buckets:
            value |= 1 << b
    return f"{value:0{buckets // 4}x}"


def decode_buckets(text: str | None, buckets: int = BUCKETS) -> frozenset[int]:
    """What ``encode_buckets`` wrote; anything else (absent, garbage) claims nothing."""
    try:
        value = int(text or "0", 16)
    except ValueError:
        return frozenset()
    return frozenset(b for b in range(buckets) if value >> b & 1)


# ---------------------------------------------------------------- who is live


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """One member's Lease as listed: who, its version, its duration and its claims."""

    identity: str
    version: str
    duration_seconds: float
    claims: frozenset[int]


@dataclass(slots=True)
class _Seen:
    version: str
    changed_at: float
    record: LeaseRecord


@dataclass
class Observer:
    """The members' Leases as this replica saw them, with the local time each last changed."""

    seen: dict[str, _Seen] = field(default_factory=dict)
    listed_at: float | None = None
    """Local time of the last list that succeeded (None: never)."""

    def observe(self, records: Iterable[LeaseRecord], now: float) -> None:
        """A complete list of the Leases, taken at local time ``now``."""
        fresh: dict[str, _Seen] = {}
        for r in records:
            old = self.seen.get(r.identity)
            changed = old is None or old.version != r.version
            fresh[r.identity] = _Seen(r.version, now if changed or old is None else old.changed_at, r)
        self.seen = fresh
        self.listed_at = now

    def live(self, now: float, *, me: str) -> dict[str, LeaseRecord]:
        """The other members whose Lease changed less than its duration ago (local clock)."""
        return {
            i: s.record
            for i, s in self.seen.items()
            if i != me and now - s.changed_at < s.record.duration_seconds
        }

    def expired(self, now: float, *, me: str, after_seconds: float) -> dict[str, str]:
        """Leases (identity -> version) unchanged for ``after_seconds`` more than their
        duration: members long gone (SIGKILLed, scaled away) whose Lease may be deleted."""
        return {
            i: s.version
            for i, s in self.seen.items()
            if i != me and now - s.changed_at >= s.record.duration_seconds + after_seconds
        }


# ---------------------------------------------------------------- the drain handshake


@dataclass(frozen=True, slots=True)
class Plan:
    """What a member does next: stop ``release`` (then publish), publish ``acquire`` (then start)."""

    release: frozenset[int] = frozenset()
    acquire: frozenset[int] = frozenset()
    owned: frozenset[int] = frozenset()
    """The buckets this member should hold, once the others have let go."""
    waiting: frozenset[int] = frozenset()
    """Owned buckets still claimed by another live member (it drains them first)."""


def plan(
    *,
    me: str,
    held: frozenset[int],
    others: Mapping[str, LeaseRecord],
    fenced: bool,
    view_age: float | None,
    joined_for: float | None,
    fresh_seconds: float,
    join_grace_seconds: float,
    buckets: int = BUCKETS,
) -> Plan:
    """The next step of the handshake for member ``me``.

    ``others``: the live members but ``me`` (``Observer.live``); ``fenced``: ``me`` could not
    renew its Lease in time (it must hold nothing); ``view_age``: seconds since the Leases were
    last listed (None: never); ``joined_for``: seconds since ``me``'s Lease was first published
    after it held nothing live (None: not published yet).
    """
    if fenced:
        return Plan(release=held)
    owned = assignment([me, *others], buckets)[me]
    release = held - owned
    claimed = frozenset().union(*(r.claims for r in others.values())) if others else frozenset()
    waiting = (owned - held) & claimed
    ready = (
        view_age is not None
        and view_age <= fresh_seconds
        and joined_for is not None
        and joined_for >= join_grace_seconds
    )
    acquire = (owned - held - claimed) if ready else frozenset()
    return Plan(release=release, acquire=acquire, owned=owned, waiting=waiting)
