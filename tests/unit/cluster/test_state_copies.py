"""A profile's state is copied once a window (``window_step``): by hand, not ``copy.deepcopy``
(a third of a window's time). The copies must share no container the window changes in place."""

from __future__ import annotations

import dataclasses
import pickle
from collections import deque
from collections.abc import Iterator
from enum import Enum
from typing import Any

from pydantic import BaseModel

from dam_operator.cluster.steps.goodput import GoodputLedger
from dam_operator.diagnosis.hysteresis import Stabilizer
from dam_operator.diagnosis.slowdown import SlowdownSettings, SlowdownTracker

from .test_goodput import T0, _pod, _snap

MUTABLE = (dict, list, set, deque, bytearray)


def _containers(obj: Any, path: str = "") -> Iterator[tuple[str, int]]:
    """Every mutable container reachable from ``obj`` through its fields, slots, items: what a
    copy must not share. Frozen records and pydantic models are values (replaced, never changed)."""
    if isinstance(obj, MUTABLE):
        yield path, id(obj)
        items = obj.items() if isinstance(obj, dict) else enumerate(obj)
        for key, value in items:
            yield from _containers(value, f"{path}[{key!r}]")
        return
    if isinstance(obj, BaseModel | Enum | str | int | float | bool | tuple | frozenset) or obj is None:
        return
    if dataclasses.is_dataclass(obj) and type(obj).__dataclass_params__.frozen:  # type: ignore[attr-defined]
        return
    if dataclasses.is_dataclass(obj):
        names = [f.name for f in dataclasses.fields(obj)]
    else:  # a plain class: its __dict__ or its __slots__
        slots = [name for cls in type(obj).__mro__ for name in getattr(cls, "__slots__", ())]
        names = [*getattr(obj, "__dict__", {}), *slots]
    for name in names:
        yield from _containers(getattr(obj, name), f"{path}.{name}")


def _rich_ledger() -> GoodputLedger:
    ledger = GoodputLedger()
    pods = [_pod("a"), _pod("b"), _pod("c")]
    ledger.update(
        pods=pods, answered={p.name: _snap(T0, {"0": {"productive": 5, "startup": 1}}) for p in pods}
    )
    ledger.pods_deleted(pods, ["c"], T0 + 5)
    ledger.update(
        pods=pods[:2],
        finished=[_pod("gone", phase="Failed")],
        answered={"a": _snap(T0 + 10, {"0": {"productive": 9, "startup": 1, "communication": None}})},
    )
    return ledger


def test_a_copied_ledger_tracker_and_stabilizer_share_no_container_with_the_original() -> None:
    slowdown = SlowdownTracker(SlowdownSettings())
    slowdown.rates.extend([1.0, 2.0])
    ledger = _rich_ledger()
    assert ledger.pods and ledger.unmeasured  # the walk reaches pods, processes, their readings
    for original in (ledger, slowdown, Stabilizer(confirm_windows=2)):
        mine = dict(_containers(original))
        theirs = dict(_containers(original.copy()))
        assert mine.keys() == theirs.keys()
        shared = [path for path, ident in mine.items() if theirs[path] == ident]
        assert not shared, f"{type(original).__name__} shares {shared}"


def test_updating_a_copied_ledger_leaves_the_original_as_it_was() -> None:
    ledger = _rich_ledger()
    before = pickle.dumps(ledger)
    moved = ledger.copy()
    moved.update(
        pods=[_pod("a"), _pod("d")],
        answered={
            "a": _snap(T0 + 40, {"0": {"productive": 30, "startup": 1}}),
            "d": _snap(T0 + 40, {"1": {"productive": 3, "startup": 2}}),
        },
    )
    assert moved.status() != ledger.status()
    assert pickle.dumps(ledger) == before
