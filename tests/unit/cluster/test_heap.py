"""The heap trimmer: glibc's malloc_trim when the process has it, nothing otherwise."""

from __future__ import annotations

import asyncio
import gc
import os
import types
import weakref

import pytest

from dam_operator.cluster.runtime.heap import Collector, Trimmer


def test_without_glibc_nothing_is_trimmed_and_the_loop_returns_at_once() -> None:
    t = Trimmer(None)
    assert not t.available
    assert t.trim() is False
    asyncio.run(asyncio.wait_for(t.run(0.01), timeout=1))


def test_the_loop_trims_every_interval_until_cancelled() -> None:
    calls: list[int] = []

    def fake_trim(pad: int) -> int:
        calls.append(pad)
        return 1

    async def scenario() -> None:
        t = Trimmer(fake_trim)
        task = asyncio.create_task(t.run(0.01))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert t.trims == len(calls) >= 3

    asyncio.run(scenario())
    assert set(calls) == {0}, "malloc_trim(0): keep no padding"


def _rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_the_real_malloc_trim_gives_back_memory_freed_inside_the_heap() -> None:
    t = Trimmer.for_this_process()
    assert t.available, "glibc's malloc_trim (Linux, glibc: the image and CI)"
    # 96 MiB in 4 KiB blocks (malloc'ed by CPython: above its small-object size, below the mmap
    # threshold), one in 64 kept alive: the heap cannot shrink from its top, and free() alone
    # keeps the pages in between.
    blocks = [bytearray(4096) for _ in range(24_576)]
    kept = blocks[::64]
    del blocks
    before = _rss_bytes()
    assert t.trim() is True
    released = before - _rss_bytes()
    assert released > 48 * 1024 * 1024, f"released {released / 2**20:.1f} MiB"
    assert len(kept) == 384


# ------------------------------------------------------------------ the garbage collector


def test_tune_sets_the_young_threshold_and_keeps_the_older_generations() -> None:
    before = gc.get_threshold()
    try:
        Collector().tune(12_345)
        assert gc.get_threshold() == (12_345, before[1], before[2])
    finally:
        gc.set_threshold(*before)


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_freeze_moves_what_lives_out_of_collections_and_later_cycles_are_still_collected() -> None:
    ref_to_garbage = weakref.ref(_garbage_cycle())
    try:
        frozen = Collector().freeze()
        assert ref_to_garbage() is None, "what is garbage at the freeze is collected first"
        assert frozen > 1000 and gc.get_freeze_count() > 1000, "the modules and tests live on, frozen"
        assert gc.collect() >= 0
        later = weakref.ref(_garbage_cycle())
        gc.collect()
        assert later() is None, "a cycle made after the freeze is collected as before"
    finally:
        gc.unfreeze()


def _garbage_cycle() -> _Cycle:
    return _Cycle()


def test_freeze_after_waits_then_freezes_once() -> None:
    class FakeGc(types.ModuleType):
        def __init__(self) -> None:
            super().__init__("fake_gc")
            self.calls: list[str] = []

        def collect(self) -> int:
            self.calls.append("collect")
            return 0

        def freeze(self) -> None:
            self.calls.append("freeze")

        def get_freeze_count(self) -> int:
            return 42

    fake = FakeGc()
    collector = Collector(fake)

    async def scenario() -> None:
        task = asyncio.create_task(collector.freeze_after(0.05))
        await asyncio.sleep(0.01)
        assert fake.calls == [], "nothing before the delay"
        await asyncio.wait_for(task, timeout=2)

    asyncio.run(scenario())
    assert fake.calls == ["collect", "freeze"] and collector.frozen == 42
