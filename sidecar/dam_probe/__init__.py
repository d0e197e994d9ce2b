"""dam_probe: the in-process training probe (standard library only).

``instrument(iterable)`` wraps a DataLoader (or any iterable) and publishes
cumulative counters to ``$DAM_PROBE_DIR/probe-<pid>.bin`` (see ``layout``):
batches consumed, time blocked in ``next()`` and time covered by steps.
``set_flops_per_step(flops)`` declares the model FLOPs of one step (for MFU).

Without ``DAM_PROBE_DIR`` (or with ``DAM_PROBE_DISABLE=1``) ``instrument``
returns its argument unchanged. The probe never raises into the training
loop; an internal error disables it and prints one line on stderr.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from time import perf_counter_ns
from typing import Generic, TypeVar, overload

from dam_probe._core import PROBE, Probe

__all__ = ["Instrumented", "instrument", "set_flops_per_step"]

T = TypeVar("T")


def _loop(it: Iterator[T], p: Probe) -> Iterator[T]:
    """Yields the items of ``it``, timing each ``next()`` into ``p``'s counters.

    When an inner instrumentation (the automatic DataLoader hook, or another
    ``instrument``) already counted the batch, this loop leaves it alone: the
    innermost measurement wins and no batch is counted twice. The body matches
    ``_autohook.timed_next`` on purpose (hot path: no helper call per batch), and reads the
    step counters through the local ``s`` (one attribute lookup per field, as in ``timed_next``).
    """
    nxt = it.__next__
    clock = perf_counter_ns
    s = p.step
    while True:
        s0 = s.steps
        t0 = clock()
        try:
            item = nxt()
        except StopIteration:
            p.stop(t0)
            return
        t1 = clock()
        if s.steps == s0:
            s.steps = s0 + 1
            s.wait_ns += t1 - t0
            s.last_ns = t1
            if t1 >= s.next_publish_ns:
                p.slow_path(t0, t1, item, it)
        yield item


class Instrumented(Generic[T]):
    """An iterable whose iterations are measured; other attributes and ``len`` pass through."""

    __slots__ = ("_dam_iterable",)

    def __init__(self, iterable: Iterable[T]) -> None:
        self._dam_iterable = iterable

    def __iter__(self) -> Iterator[T]:
        return _loop(iter(self._dam_iterable), PROBE)

    def __len__(self) -> int:
        return len(self._dam_iterable)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> object:
        if name == "_dam_iterable":
            raise AttributeError(name)
        return getattr(self._dam_iterable, name)

    def __repr__(self) -> str:
        return f"dam_probe.instrument({self._dam_iterable!r})"


@overload
def instrument(iterable: Iterator[T]) -> Iterator[T]: ...


@overload
def instrument(iterable: Iterable[T]) -> Iterable[T]: ...


def instrument(iterable: Iterable[T]) -> Iterable[T]:
    """Measures the iterations of ``iterable`` (typically a DataLoader).

    Per batch it adds the time blocked in ``next()`` to the wait counter and
    the time since the previous batch was delivered to the step counter. An
    iterator gives back an iterator; any other iterable gives back an
    ``Instrumented`` wrapper that re-measures each ``for`` loop over it and
    passes ``len()`` and attribute access (``.dataset``, ``.sampler``) through.
    When the probe is inactive, ``iterable`` itself is returned.
    """
    if not PROBE.active():
        return iterable
    if isinstance(iterable, Iterator):
        return _loop(iterable, PROBE)
    return Instrumented(iterable)


def set_flops_per_step(flops: float) -> None:
    """Declares the model FLOPs of one training step (published for MFU; 0 = unknown).

    Raises ``ValueError`` for a negative, infinite or NaN value.
    """
    PROBE.set_flops_per_step(flops)
