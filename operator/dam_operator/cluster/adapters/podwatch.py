"""The pod index's feed: one list-then-watch of pods (the informer pattern), no kopf.

Why not a kopf ``on.event`` handler: kopf keeps a record of its own for every object it
has seen (``ResourceMemory``: a memo, a throttler, daemon and indexing state), starts a
worker per object, and wraps every event in its handler machinery. The operator needs
nine fields of a pod (``registry.PodInfo``); at 10,000 pods kopf's share of the memory and
of the CPU per pod event was the largest single cost left (docs/performance.md).

What it relies on (the API's list/watch contract, the one client-go's reflector follows):

- A paged list (``limit`` + ``continue``) is one consistent snapshot; its last page's
  ``metadata.resourceVersion`` is the version to watch from. A ``continue`` token the server
  no longer has answers 410: the list starts again.
- ``watch=1&resourceVersion=RV&allowWatchBookmarks=true`` sends every change after RV, one
  JSON object a line (``ADDED``/``MODIFIED``/``DELETED``, ``BOOKMARK`` carrying only a newer
  resourceVersion, ``ERROR`` carrying a Status). The server ends a watch after
  ``timeoutSeconds``; the next starts from the last version seen.
- 410 Gone (as the answer, or as an ``ERROR`` event with code 410): the version is too old;
  list again. After a relist, pods in the index that the list does not have were deleted
  while nobody watched: they are removed.
- Any other failure (a refused or dropped connection, 5xx, 429, a silent stream): watch again
  from the last version after a backoff (doubling, capped), so an API-server restart costs
  no relist when etcd still has the version.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Protocol

from dam_operator.cluster.adapters.kube import ApiError, GoneError, pods_path
from dam_operator.cluster.steps.injection import is_instrumented
from dam_operator.cluster.steps.registry import PodInfo, Registry

log = logging.getLogger("dam_operator.cluster.podwatch")

MIN_WATCH_SECONDS = 1.0
"""A watch that ends sooner than this without an error counts as a failure (backoff)."""


class PodListAPI(Protocol):
    """What the watcher needs of Kubernetes (``kube.KubeClient`` implements it)."""

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str = ...,
        params: Mapping[str, str] | None = None,
    ) -> Any: ...

    def watch(
        self, path: str, params: Mapping[str, str], *, read_timeout_seconds: float
    ) -> AsyncIterator[Mapping[str, Any]]: ...


def pod_info(body: Mapping[str, Any]) -> PodInfo:
    return PodInfo.from_body(body, is_instrumented(body))


class PodWatcher:
    """Keeps ``registry``'s pods equal to the API's (one namespace, or all).

    ``synced`` is set once the first list is in the index: evaluations that start before it
    would count no pods.
    """

    def __init__(
        self,
        api: PodListAPI,
        registry: Registry,
        *,
        namespace: str | None,
        page_size: int = 500,
        watch_timeout_seconds: int = 300,
        backoff_seconds: float = 1.0,
        max_backoff_seconds: float = 30.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api
        self._registry = registry
        self._path = pods_path(namespace)
        self._page_size = page_size
        self._watch_timeout = watch_timeout_seconds
        self._backoff = backoff_seconds
        self._max_backoff = max_backoff_seconds
        self._sleep = sleep
        self._clock = clock
        self.synced = asyncio.Event()
        self.lists = 0
        """Full lists done (the first, then one after each 410)."""
        self.version: str | None = None
        """The last resourceVersion seen (None: list first)."""

    async def run(self) -> None:
        """Forever (until cancelled)."""
        failures = 0
        while True:
            try:
                if self.version is None:
                    self.version = await self.relist()
                    self.synced.set()
                started = self._clock()
                await self.watch()
                if self._clock() - started >= MIN_WATCH_SECONDS:
                    failures = 0
                    continue
                # Ended at once without an error (a proxy closing streams): back off as for one.
                failures += 1
                await self._sleep(self._delay(failures))
            except GoneError:
                log.info("pods: resourceVersion %s is gone; listing again", self.version)
                self.version = None
            except ApiError as exc:
                failures += 1
                delay = self._delay(failures)
                log.warning("pods: %s; watching again in %.1f s", exc, delay)
                await self._sleep(delay)

    def _delay(self, failures: int) -> float:
        """Doubling from ``backoff_seconds``, capped, with jitter (half to all of it)."""
        delay = min(self._max_backoff, self._backoff * 2.0 ** (failures - 1))
        return delay * (0.5 + random.random() / 2)

    async def relist(self) -> str:
        """Lists every pod in pages, replaces the index's pods; returns the list's version."""
        while True:
            try:
                seen, version = await self._list()
            except GoneError:
                log.info("pods: the list's continue token expired; listing again")
                continue
            break
        for key in [k for k in self._registry.pod_keys() if k not in seen]:
            self._registry.remove_pod(*key)
        self.lists += 1
        log.info("pods: %d listed at resourceVersion %s", len(seen), version)
        return version

    async def _list(self) -> tuple[set[tuple[str, str]], str]:
        seen: set[tuple[str, str]] = set()
        params: dict[str, str] = {"limit": str(self._page_size)} if self._page_size else {}
        while True:
            page = await self._api.request("GET", self._path, params=params)
            if not isinstance(page, Mapping):
                raise ApiError(0, f"GET {self._path}: not a list")
            for item in page.get("items") or ():
                if isinstance(item, Mapping):
                    pod = pod_info(item)
                    self._registry.upsert_pod(pod)
                    seen.add(pod.key)
            meta = page.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                return seen, str(meta.get("resourceVersion") or "")
            params = {**params, "continue": str(token)}

    async def watch(self) -> None:
        """One watch from ``self.version`` until the server ends it or fails; every event
        moves ``self.version``, so a watch that fails half-way resumes after its last event."""
        params = {
            "resourceVersion": self.version or "",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(self._watch_timeout),
        }
        stream = self._api.watch(self._path, params, read_timeout_seconds=self._watch_timeout + 30.0)
        async for event in stream:
            kind = event.get("type")
            obj = event.get("object")
            if not isinstance(obj, Mapping):
                continue
            if kind == "ERROR":
                code = int(obj.get("code") or 0)
                message = str(obj.get("message") or "watch error")
                raise (GoneError if code == 410 else ApiError)(code, message)
            meta = obj.get("metadata") or {}
            if kind == "DELETED":
                self._registry.depart_pod(pod_info(obj))  # its last body: its exit totals in
            elif kind in ("ADDED", "MODIFIED"):
                self._registry.upsert_pod(pod_info(obj))
            self.version = str(meta.get("resourceVersion") or self.version)
