"""This replica's membership among the operator's shards: its Lease, the others', the hand-over.

The rules are pure (``steps/sharding.py``: the rendezvous assignment and the drain handshake);
this is the loop that applies them every ``renew_seconds``:

1. renew this replica's Lease (``coordination.k8s.io/v1``, in the operator's namespace, labelled
   ``dam.mlsys.dev/shard-group``): ``spec.renewTime`` and, in an annotation, the buckets it holds;
2. list the group's Leases (a label selector), note which changed (``sharding.Observer``);
3. ``sharding.plan``: release the buckets it no longer owns (``Scheduler.release`` stops their
   work and waits for what is in flight, then the Lease is written without them), then claim
   the free ones it owns (the Lease is written with them, then ``Scheduler.adopt`` starts them).

A replica that could not renew its Lease for ``renew_deadline`` (two thirds of the Lease
duration) releases everything before any other replica may see the Lease expire, and starts
over as a new member once it renews again. On a clean stop it releases everything and deletes
its Lease, so that the others take over within a renew period instead of a Lease duration.
Leases unchanged for ten Lease durations (a SIGKILLed Pod of a Deployment never comes back
under its name) are deleted, on the version seen (one renewed meanwhile stays).

Every replica watches every DAMProfile and pod (the webhook, served by all, needs every
profile; docs/operator.md, "Sharding"); only the evaluation state, the scrapes, the status
writes, the Events and the per-profile metric series are split.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from dam_operator.cluster.adapters.kube import ApiError, ConflictError, NotFoundError
from dam_operator.cluster.steps import sharding as sh

log = logging.getLogger("dam_operator.cluster.shards")

GROUP_LABEL = "dam.mlsys.dev/shard-group"
BUCKETS_ANNOTATION = "dam.mlsys.dev/buckets"
GC_AFTER_DURATIONS = 10.0


class LeaseAPI(Protocol):
    """What membership needs of Kubernetes (``kube.KubeClient`` implements it)."""

    async def list_leases(self, namespace: str, label_selector: str) -> list[Mapping[str, Any]]: ...

    async def create_lease(self, namespace: str, body: Mapping[str, Any]) -> Mapping[str, Any]: ...

    async def replace_lease(
        self, namespace: str, name: str, body: Mapping[str, Any]
    ) -> Mapping[str, Any]: ...

    async def get_lease(self, namespace: str, name: str) -> Mapping[str, Any] | None: ...

    async def delete_lease(self, namespace: str, name: str, resource_version: str | None = None) -> None: ...


class Shards(Protocol):
    """What the hand-over drives (``scheduler.Scheduler`` implements it)."""

    def adopt(self, buckets: frozenset[int]) -> int: ...

    async def release(self, buckets: frozenset[int], timeout_seconds: float) -> None: ...


def micro_time(when: dt.datetime) -> str:
    """A ``MicroTime`` (RFC 3339 with microseconds, UTC), as the Lease's times are written."""
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_record(obj: Mapping[str, Any]) -> sh.LeaseRecord | None:
    """A listed Lease as the handshake reads it; None for one that is not a member's."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    identity = spec.get("holderIdentity")
    duration = spec.get("leaseDurationSeconds")
    if not isinstance(identity, str) or not identity or not isinstance(duration, int):
        return None
    claims = sh.decode_buckets((meta.get("annotations") or {}).get(BUCKETS_ANNOTATION))
    return sh.LeaseRecord(identity, str(meta.get("resourceVersion") or ""), float(duration), claims)


class ShardMember:
    """One replica's Lease and its part of the drain handshake (see the module's docstring)."""

    def __init__(
        self,
        api: LeaseAPI,
        shards: Shards,
        *,
        namespace: str,
        identity: str,
        group: str = "dam-operator",
        lease_duration_seconds: float = 15.0,
        renew_seconds: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[int, int], None] | None = None,
    ) -> None:
        """``on_change(held buckets, live members)``: after each step (the operator's metrics)."""
        self._api = api
        self._shards = shards
        self._namespace = namespace
        self.identity = identity
        self._group = group
        self._duration = lease_duration_seconds
        self._renew = renew_seconds
        self._deadline = lease_duration_seconds * 2 / 3
        self._fresh = renew_seconds * 1.5
        self._clock = clock
        self._on_change = on_change
        self.name = f"{group}-{identity}"[:253].rstrip("-.")
        self.held: frozenset[int] = frozenset()
        self.observer = sh.Observer()
        self._version: str | None = None
        self._acquired_at: str | None = None
        self._renewed_at: float | None = None
        """Local time the last successful renew was sent."""
        self._joined_at: float | None = None
        """Local time of the first renew that published this member after it held nothing live."""

    # ------------------------------------------------------------ the Lease

    def _body(self) -> dict[str, Any]:
        now = micro_time(dt.datetime.now(dt.UTC))
        self._acquired_at = self._acquired_at or now
        meta: dict[str, Any] = {
            "name": self.name,
            "namespace": self._namespace,
            "labels": {GROUP_LABEL: self._group},
            "annotations": {BUCKETS_ANNOTATION: sh.encode_buckets(self.held)},
        }
        if self._version:
            meta["resourceVersion"] = self._version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": math.ceil(self._duration),
                "acquireTime": self._acquired_at,
                "renewTime": now,
            },
        }

    async def _write(self) -> bool:
        """Writes the Lease (renew time and claims); True when the API took it."""
        sent = self._clock()
        try:
            obj = await asyncio.wait_for(self._put(), self._renew)
        except (ApiError, TimeoutError) as exc:
            log.warning("shard %s: renewing Lease %s failed: %s", self.identity, self.name, exc)
            return False
        self._version = str((obj.get("metadata") or {}).get("resourceVersion") or "") or None
        if self._joined_at is None:
            self._joined_at = sent
        self._renewed_at = sent
        return True

    async def _put(self) -> Mapping[str, Any]:
        if self._version is None:
            try:
                return await self._api.create_lease(self._namespace, self._body())
            except ConflictError:  # ours from before a restart (same identity): take it over
                current = await self._api.get_lease(self._namespace, self.name) or {}
                self._version = str((current.get("metadata") or {}).get("resourceVersion") or "")
        try:
            return await self._api.replace_lease(self._namespace, self.name, self._body())
        except ConflictError:
            current = await self._api.get_lease(self._namespace, self.name) or {}
            self._version = str((current.get("metadata") or {}).get("resourceVersion") or "")
            return await self._api.replace_lease(self._namespace, self.name, self._body())
        except NotFoundError:
            self._version = None
            return await self._api.create_lease(self._namespace, self._body())

    async def _list(self) -> None:
        try:
            items = await asyncio.wait_for(
                self._api.list_leases(self._namespace, f"{GROUP_LABEL}={self._group}"), self._renew
            )
        except (ApiError, TimeoutError) as exc:
            log.warning("shard %s: listing the shards' Leases failed: %s", self.identity, exc)
            return
        records = [r for r in (lease_record(i) for i in items) if r is not None]
        self.observer.observe(records, self._clock())

    # ------------------------------------------------------------ the loop

    async def run(self) -> None:
        """Forever (until cancelled): one step every ``renew_seconds``."""
        while True:
            started = self._clock()
            await self.step()
            await asyncio.sleep(max(0.0, self._renew - (self._clock() - started)))

    def fenced(self) -> bool:
        """This replica could not renew its Lease in time: it must hold nothing."""
        return self._renewed_at is None or self._clock() - self._renewed_at > self._deadline

    async def step(self) -> sh.Plan:
        """Renew, list, then release and claim as ``sharding.plan`` says."""
        await self._write()
        await self._list()
        now = self._clock()
        fenced = self.fenced()
        if fenced:
            self._joined_at = None  # renewed again later: a new member, with the grace
        others = self.observer.live(now, me=self.identity)
        listed = self.observer.listed_at
        p = sh.plan(
            me=self.identity,
            held=self.held,
            others=others,
            fenced=fenced,
            view_age=None if listed is None else now - listed,
            joined_for=None if self._joined_at is None else now - self._joined_at,
            fresh_seconds=self._fresh,
            join_grace_seconds=2 * self._fresh,
        )
        if p.release:
            # Fenced: at once (in-flight work is cancelled), the others may take over soon.
            await self._shards.release(p.release, timeout_seconds=0.0 if fenced else self._renew)
            self.held -= p.release
            if not fenced:
                await self._write()
            log.info("shard %s: released %d buckets", self.identity, len(p.release))
        if p.acquire and not fenced:
            before = self.held
            self.held |= p.acquire
            if await self._write():
                count = self._shards.adopt(p.acquire)
                log.info("shard %s: took %d buckets (%d profiles)", self.identity, len(p.acquire), count)
            else:
                self.held = before
        await self._collect(now)
        if self._on_change is not None:
            self._on_change(len(self.held), len(others) + (0 if fenced else 1))
        return p

    async def _collect(self, now: float) -> None:
        """Deletes Leases unchanged for ``GC_AFTER_DURATIONS`` Lease durations, on their version."""
        gone = self.observer.expired(now, me=self.identity, after_seconds=GC_AFTER_DURATIONS * self._duration)
        for identity, version in gone.items():
            name = f"{self._group}-{identity}"[:253].rstrip("-.")
            with contextlib.suppress(ApiError):
                await self._api.delete_lease(self._namespace, name, version)
                log.info("shard %s: deleted the Lease of %s, gone", self.identity, identity)

    async def leave(self) -> None:
        """A clean stop: release everything (work in flight ends first), delete the Lease."""
        if self.held:
            await self._shards.release(self.held, timeout_seconds=self._renew)
            self.held = frozenset()
        with contextlib.suppress(ApiError, TimeoutError):
            await asyncio.wait_for(self._api.delete_lease(self._namespace, self.name), self._renew)
