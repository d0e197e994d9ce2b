"""Give the C heap's free memory back to the system, now and then.

The operator's memory has a start-up peak: kopf lists every DAMProfile and pod, a
per-object worker holds each body until it is handled, and each first scrape parses a
whole exposition. Python frees those objects, but glibc's malloc keeps the freed pages
(in its arenas and at the top of the heap) for later allocations, so the resident size
stays near the peak for the life of the process. ``malloc_trim(0)`` returns every free
page it can (glibc ≥ 2.8 also releases whole free pages inside the heap, not only its
top). It takes milliseconds and needs no lock of ours; elsewhere than glibc (musl,
macOS) there is nothing to call and ``Trimmer.available`` is False.

Nothing is loaded on import: the C library is looked up when a ``Trimmer`` is built.

Python's cyclic garbage collector is the other cost of a large, long-lived state (``Collector``).
Its full collections walk every tracked object; with the default thresholds (700, 10, 10) the
5,000-profile benchmark made 13 of them in 90 s of running jobs, 0.3 s each, and the collector
took 7.8 % of a core while jobs ran and 12.5 % at the switch (a ``gc.callbacks`` probe;
docs/performance.md). ``Collector.tune`` raises the young generation's threshold, so fewer
collections of each generation run; ``Collector.freeze`` (``gc.freeze``, Python ≥ 3.7) moves
what exists once the start-up is over (modules, the profiles and pods listed, their state) to
the permanent generation, which no collection walks. Objects freed by their reference count
(nearly all) are freed as before; only a cycle among frozen objects is never collected.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
from collections.abc import Callable
from types import ModuleType

log = logging.getLogger("dam_operator.cluster.heap")


def _glibc_malloc_trim() -> Callable[[int], int] | None:
    """``malloc_trim`` of the process's C library, or None where it has none."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    trim: Callable[[int], int] = fn  # (typeshed's ctypes types vary across mypy releases)
    return trim


class Trimmer:
    """Calls ``malloc_trim(0)`` when asked, or every ``interval_seconds`` from ``run``."""

    def __init__(self, trim: Callable[[int], int] | None) -> None:
        self._trim = trim
        self.trims = 0

    @classmethod
    def for_this_process(cls) -> Trimmer:
        """The trimmer of the process's C library (one that does nothing without glibc)."""
        return cls(_glibc_malloc_trim())

    @property
    def available(self) -> bool:
        return self._trim is not None

    def trim(self) -> bool:
        """One trim; True when memory was given back (False: none to give, or no glibc)."""
        if self._trim is None:
            return False
        self.trims += 1
        return bool(self._trim(0))

    async def run(self, interval_seconds: float) -> None:
        """Trims every ``interval_seconds`` until cancelled (returns at once without glibc)."""
        if self._trim is None:
            log.info("no glibc malloc_trim here: the heap is not trimmed")
            return
        while True:
            await asyncio.sleep(interval_seconds)
            self.trim()


class Collector:
    """Python's cyclic garbage collector, set for a process whose state lives long.

    ``gc_module`` is ``gc`` itself except in tests."""

    def __init__(self, gc_module: ModuleType = gc) -> None:
        self._gc = gc_module
        self.frozen = 0
        """Objects moved to the permanent generation by ``freeze`` (0 before)."""

    def tune(self, young_threshold: int) -> None:
        """A young collection every ``young_threshold`` allocations (Python's default: 700); the
        older generations keep their thresholds, so each runs as much less often."""
        _, middle, old = self._gc.get_threshold()
        self._gc.set_threshold(young_threshold, middle, old)

    def freeze(self) -> int:
        """Collects what is garbage now, then moves every object left to the permanent
        generation; returns how many are frozen in all."""
        self._gc.collect()
        self._gc.freeze()
        self.frozen = int(self._gc.get_freeze_count())
        return self.frozen

    async def freeze_after(self, delay_seconds: float) -> None:
        """``freeze`` once, ``delay_seconds`` from now (when the start-up listing and the first
        windows are over)."""
        await asyncio.sleep(delay_seconds)
        frozen = self.freeze()
        log.info("garbage collector: %d objects of the start-up frozen", frozen)
