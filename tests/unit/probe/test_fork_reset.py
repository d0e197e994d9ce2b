"""A forked child (a DataLoader worker) starts from zero: every counter of every group is reset.

The check is generic: every field reachable from a ``Probe`` (its own slots and, recursively, those
of its counter groups and readers) is set to a marker, the after-fork handler runs, and each field
must then equal a fresh probe's, unless its class names it in ``KEPT_AFTER_FORK``. A field added
later and forgotten by its group's ``reset()`` fails here, whatever its name.
"""

from __future__ import annotations

import threading
from typing import Any

from dam_probe._core import Probe
from dam_probe._counters import StepCounters

LOCK = type(threading.Lock())


class Dirty:
    """What the parent left in a field; never equal to anything a reset writes."""

    def __repr__(self) -> str:
        return "<left over from the parent>"


DIRTY = Dirty()


def _slots(obj: object) -> list[str]:
    names: list[str] = []
    for cls in type(obj).__mro__:
        names.extend(n for n in getattr(cls, "__slots__", ()) if n not in ("__dict__", "__weakref__"))
    return names


def _is_group(value: object) -> bool:
    """A counter group or reader of the probe: a slotted object of ``dam_probe``."""
    ours = any(cls.__module__.startswith("dam_probe") for cls in type(value).__mro__)
    return ours and bool(_slots(value))


def _kept(obj: object) -> frozenset[str]:
    return getattr(type(obj), "KEPT_AFTER_FORK", frozenset())


def dirty(obj: object) -> None:
    """Every field not kept across a fork gets the marker; groups are dirtied in place, not replaced."""
    for name in _slots(obj):
        if name in _kept(obj):
            continue
        value = getattr(obj, name, None)
        if _is_group(value) and name != "writer":
            dirty(value)
        else:
            setattr(obj, name, DIRTY)


def differences(after: object, fresh: object, path: str = "probe") -> list[str]:
    out: list[str] = []
    for name in _slots(fresh):
        if name in _kept(fresh):
            continue
        where = f"{path}.{name}"
        got: Any = getattr(after, name, DIRTY)
        want: Any = getattr(fresh, name)
        if _is_group(want):
            out += differences(got, want, where)
        elif isinstance(want, LOCK):
            if not isinstance(got, LOCK) or got.locked():
                out.append(f"{where}: {got!r} after the fork, a free lock fresh")
        elif got is DIRTY or got != want:
            out.append(f"{where}: {got!r} after the fork, {want!r} fresh")
    return out


def test_a_forked_child_resets_every_field_of_every_counter_group() -> None:
    p = Probe()
    groups = p.counter_groups()
    dirty(p)
    p.after_fork_in_child()
    assert differences(p, Probe()) == []
    # Reset in place: the hot loops hold the step counters (and the collective wrappers the
    # collective counters) in local aliases, so a group is never replaced.
    assert all(a is b for a, b in zip(p.counter_groups(), groups, strict=True))


def test_every_group_of_the_probe_is_reset_after_a_fork() -> None:
    p = Probe()
    groups = {id(g) for g in p.counter_groups()}
    held = [name for name in _slots(p) if _is_group(getattr(p, name))]
    assert held and all(id(getattr(p, name)) in groups for name in held), held


def test_the_check_catches_a_counter_that_its_reset_forgets() -> None:
    class Leaky(StepCounters):
        __slots__ = ("forgotten",)

        def __init__(self) -> None:
            super().__init__()
            self.forgotten = 0  # set once, never in reset(): the silent bug this guards against

    p = Probe()
    p.step = Leaky()
    dirty(p)
    p.after_fork_in_child()
    fresh = Probe()
    fresh.step = Leaky()
    assert differences(p, fresh) == [
        "probe.step.forgotten: <left over from the parent> after the fork, 0 fresh"
    ]


def test_a_disabled_probe_stays_disabled_in_its_child() -> None:
    p = Probe()
    p.disable("test")
    p.after_fork_in_child()
    assert p.disabled and p.step.next_publish_ns >= 1 << 62
