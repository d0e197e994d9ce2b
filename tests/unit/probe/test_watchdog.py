"""The stall watchdog (dam_probe._watchdog) names where a thread is from its own frames.

Real threads blocked in real places (user code, a real DataLoader with a worker blocked for good, a
probe-timed collective whose ``Work.wait`` blocks), read the way the watchdog reads them: from
``sys._current_frames()``, no signal sent. The layout round-trips the progress fields and reads an
unknown place as none.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dam_probe import _comm, _watchdog
from dam_probe._core import Probe
from dam_probe.layout import (
    PLACE_COLLECTIVE,
    PLACE_DATALOADER,
    PLACE_NONE,
    PLACE_USER_CODE,
    ProbeRecord,
    decode,
    encode,
)


def _blocked(target: Callable[[threading.Event], None]) -> Iterator[int]:
    """A thread running ``target(release)``, left to block for a moment; yields its ident."""
    release = threading.Event()
    thread = threading.Thread(target=target, args=(release,), daemon=True)
    thread.start()
    time.sleep(0.3)
    assert thread.ident is not None
    try:
        yield thread.ident
    finally:
        release.set()
        thread.join(10)


def waits_in_user_code(release: threading.Event) -> None:
    release.wait(30)  # the line the watchdog names


@pytest.fixture
def user_thread() -> Iterator[int]:
    yield from _blocked(waits_in_user_code)


def test_a_thread_in_its_own_code_is_user_code_at_its_line(user_thread: int) -> None:
    place, detail, frames = _watchdog.place_of(sys._current_frames()[user_thread])
    assert place == PLACE_USER_CODE and detail == ""
    line = waits_in_user_code.__code__.co_firstlineno + 1
    assert f"test_watchdog.py:{line} waits_in_user_code" in frames.splitlines(), frames


class _Work:
    """An asynchronous collective's work whose ``wait`` blocks until released (gloo's, while a
    peer never sends)."""

    def __init__(self, release: threading.Event) -> None:
        self.release = release

    def is_completed(self) -> bool:
        return self.release.is_set()

    def wait(self) -> bool:
        return self.release.wait(30)


def test_a_thread_waiting_in_a_timed_collective_is_named_with_the_op_and_its_number() -> None:
    probe = Probe()
    release = threading.Event()
    wait = _comm.timed_wait(_Work.wait, probe)

    def all_reduce(tensor: object) -> None:
        wait(_Work(release))  # a synchronous collective waits on its own work inside the call

    timed = _comm.timed_collective(all_reduce, 0, "tensor", probe)
    release.set()
    timed(b"x")  # all_reduce #1 returns
    release.clear()
    thread = threading.Thread(target=timed, args=(b"y",), daemon=True)
    thread.start()
    time.sleep(0.3)
    try:
        assert thread.ident is not None
        place, detail, _ = _watchdog.place_of(sys._current_frames()[thread.ident])
        # The op and its number from the outer timed call, not the Work.wait inside it.
        assert (place, detail) == (PLACE_COLLECTIVE, "all_reduce #2")
        assert probe.comm.entered == 2
    finally:
        release.set()
        thread.join(10)


def test_a_thread_waiting_for_a_blocked_loader_worker_names_the_worker_and_the_batch(tmp_path: Any) -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, Dataset

    go = tmp_path / "go"

    class Blocks(Dataset):  # type: ignore[misc]
        def __len__(self) -> int:
            return 64

        def __getitem__(self, i: int) -> Any:
            while i == 12 and not go.exists():  # batch 3's first sample: worker 1 blocks
                time.sleep(0.05)
            return torch.ones(2)

    got: list[int] = []

    def run() -> None:
        for n, _ in enumerate(DataLoader(Blocks(), batch_size=4, num_workers=2), start=1):
            got.append(n)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while len(got) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    try:
        assert got == [1, 2, 3] and thread.ident is not None, got
        place, detail, frames = _watchdog.place_of(sys._current_frames()[thread.ident])
        assert place == PLACE_DATALOADER, (place, detail, frames)
        assert re.fullmatch(r"worker 1 pid \d+ alive, batch 3", detail), detail
        assert any("test_watchdog.py:" in f and " run" in f for f in frames.splitlines()), frames
    finally:
        go.touch()
        thread.join(30)
    assert got == list(range(1, 17))


def test_the_progress_fields_round_trip_and_an_unknown_place_reads_as_none() -> None:
    record = ProbeRecord(
        pid=1,
        start_time_ns=2,
        steps=3,
        wait_ns=4,
        step_ns=5,
        last_update_ns=6,
        batch_size=0,
        flops_per_step=0.0,
        closed=False,
        collectives_entered=20,
        last_batch_ns=7,
        place_read_ns=8,
        place=PLACE_DATALOADER,
        place_detail="worker 0 pid 9 alive, batch 40",
        place_frames="a.py:1 f\nb.py:2 g",
    )
    _, back = decode(encode(record))
    assert back == record
    garbage = bytearray(encode(record))
    garbage[824:828] = (999).to_bytes(4, "little")
    assert decode(bytes(garbage))[1].place == PLACE_NONE
    older = ProbeRecord(**{**record.__dict__, **dict.fromkeys(_PROGRESS, None)})
    assert decode(encode(older))[1].collectives_entered is None  # flag bit 11 clear: unknown, not 0


_PROGRESS = ("collectives_entered", "last_batch_ns", "place_read_ns", "place", "place_detail", "place_frames")


def test_a_process_is_running_until_it_exits_even_before_its_parent_reaps_it() -> None:
    from dam_probe.process import running

    assert running(os.getpid())
    child = os.fork()
    if child == 0:  # the child exits at once; unreaped, it is a zombie
        os._exit(0)
    deadline = time.monotonic() + 10
    while running(child) and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        assert not running(child)  # a zombie is not running ...
        assert os.path.exists(f"/proc/{child}")  # ... and asking did not reap it
    finally:
        os.waitpid(child, 0)
    assert not running(child)
