"""The heap trimmer: glibc's malloc_trim when the process has it, nothing otherwise."""

from __future__ import annotations

import asyncio
import os

import pytest

from dam_operator.cluster.runtime.heap import Trimmer


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
