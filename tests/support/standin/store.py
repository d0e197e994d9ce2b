"""Object storage with O(1) lookups, per-namespace indexes, a bounded watch history and fan-out.

Stored object dicts are never mutated after they are stored (writers build a new dict), so
history events and watchers can share them without copying. Each event is serialized once,
however many watchers receive it.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Iterator
from typing import Any

from .selectors import FieldSelector, LabelSelector


class Event:
    __slots__ = ("_line", "obj", "rv", "type")

    def __init__(self, type_: str, obj: dict[str, Any], rv: int) -> None:
        self.type = type_
        self.obj = obj
        self.rv = rv
        self._line: bytes | None = None

    def line(self) -> bytes:
        if self._line is None:
            self._line = (
                json.dumps({"type": self.type, "object": self.obj}, separators=(",", ":")).encode() + b"\n"
            )
        return self._line


class Watcher:
    """One watch stream: a queue fed by the store; selectors applied at fan-out."""

    __slots__ = ("fields", "labels", "namespace", "queue")

    def __init__(self, namespace: str | None, labels: LabelSelector, fields: FieldSelector) -> None:
        self.namespace = namespace
        self.labels = labels
        self.fields = fields
        self.queue: asyncio.Queue[Event | str] = asyncio.Queue()

    def wants(self, obj: dict[str, Any]) -> bool:
        if self.labels and not self.labels.matches((obj.get("metadata") or {}).get("labels")):
            return False
        return not self.fields or self.fields.matches(obj)


class Store:
    """All objects of one resource (group, plural), whatever the served version."""

    def __init__(self, history_size: int) -> None:
        self.by_ns: dict[str, dict[str, dict[str, Any]]] = {}
        self.history: deque[Event] = deque(maxlen=history_size)
        self.compacted_rv = 0  # events at or below this resourceVersion may be gone
        self.watchers: dict[str | None, set[Watcher]] = {}
        self.count = 0

    # -- reads -------------------------------------------------------------------------------
    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        bucket = self.by_ns.get(namespace)
        return None if bucket is None else bucket.get(name)

    def iter(self, namespace: str | None) -> Iterator[dict[str, Any]]:
        if namespace is not None:
            yield from (self.by_ns.get(namespace) or {}).values()
        else:
            for bucket in self.by_ns.values():
                yield from bucket.values()

    def select(
        self,
        namespace: str | None,
        labels: LabelSelector,
        fields: FieldSelector,
    ) -> list[dict[str, Any]]:
        name = fields.exact_name()
        if name is not None:
            if namespace is not None:
                one = self.get(namespace, name)
                candidates = [one] if one is not None else []
            else:
                candidates = [b[name] for b in self.by_ns.values() if name in b]
        else:
            candidates = list(self.iter(namespace))
        if labels:
            candidates = [o for o in candidates if labels.matches((o.get("metadata") or {}).get("labels"))]
        if fields:
            candidates = [o for o in candidates if fields.matches(o)]
        return candidates

    # -- writes ------------------------------------------------------------------------------
    def put(self, namespace: str, name: str, obj: dict[str, Any], type_: str, rv: int) -> None:
        bucket = self.by_ns.setdefault(namespace, {})
        if name not in bucket:
            self.count += 1
        bucket[name] = obj
        self._emit(Event(type_, obj, rv), namespace)

    def remove(self, namespace: str, name: str, final: dict[str, Any], rv: int) -> None:
        bucket = self.by_ns.get(namespace)
        if bucket is not None and bucket.pop(name, None) is not None:
            self.count -= 1
            if not bucket:
                del self.by_ns[namespace]
        self._emit(Event("DELETED", final, rv), namespace)

    def _emit(self, event: Event, namespace: str) -> None:
        history = self.history
        if history.maxlen is not None and len(history) == history.maxlen:
            self.compacted_rv = history[0].rv
        history.append(event)
        for key in (namespace, None):
            watchers = self.watchers.get(key)
            if watchers:
                for watcher in watchers:
                    if watcher.wants(event.obj):
                        watcher.queue.put_nowait(event)

    # -- watches -----------------------------------------------------------------------------
    def since(self, rv: int) -> list[Event] | None:
        """Events after `rv`, oldest first; None when `rv` is older than the history keeps."""
        if rv < self.compacted_rv:
            return None
        newer: list[Event] = []
        for event in reversed(self.history):
            if event.rv <= rv:
                break
            newer.append(event)
        newer.reverse()
        return newer

    def subscribe(self, watcher: Watcher) -> None:
        self.watchers.setdefault(watcher.namespace, set()).add(watcher)

    def unsubscribe(self, watcher: Watcher) -> None:
        watchers = self.watchers.get(watcher.namespace)
        if watchers is not None:
            watchers.discard(watcher)
            if not watchers:
                del self.watchers[watcher.namespace]

    def all_watchers(self) -> list[Watcher]:
        return [w for ws in self.watchers.values() for w in ws]

    def compact(self, rv: int) -> None:
        """Forget the history: any watch resuming from an older resourceVersion gets 410 Gone."""
        self.history.clear()
        self.compacted_rv = rv
