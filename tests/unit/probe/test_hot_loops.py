"""The probe's two hot-path loops are the same lines on purpose (a shared helper call would add
~60 ns a batch): ``dam_probe._loop`` (explicit ``instrument``) and ``_autohook.timed_next`` (the
automatic DataLoader hook). This test keeps them twins: for the same iteration, on the same
deterministic clock, both leave identical counters."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import dam_probe
from dam_probe import _autohook
from dam_probe._core import Probe


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        self.now += 7  # the timer call itself
        return self.now


WAITS = [500, 20_000, 0, 3_000_000, 42]  # ns each next() blocks: a fetch, a slow batch, ...
WORK = [1_000, 250_000, 9, 4, 600_000]  # ns of "training" between batches


def _run(kind: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Any]:
    clock = Clock()
    monkeypatch.setattr(dam_probe, "perf_counter_ns", clock)
    monkeypatch.setattr(_autohook, "perf_counter_ns", clock)
    monkeypatch.setenv("DAM_PROBE_DIR", str(tmp_path / kind))
    p = Probe()

    class Source:
        def __init__(self) -> None:
            self.i = 0

        def __iter__(self) -> Source:
            return self

        def __next__(self) -> int:
            if self.i == len(WAITS):
                raise StopIteration
            clock.now += WAITS[self.i]
            self.i += 1
            return self.i

    if kind == "loop":
        items: Iterator[int] = dam_probe._loop(Source(), p)
    else:
        nxt = _autohook.timed_next(Source.__next__, p)
        source = Source()
        items = iter(lambda: nxt(source), object())  # never the sentinel: StopIteration ends it
    seen = []
    try:
        for i, item in enumerate(items):
            seen.append(item)
            clock.now += WORK[i]
    except StopIteration:
        pass
    state = {
        "seen": seen,
        "steps": p.step.steps,
        "wait_ns": p.step.wait_ns,
        "last_ns": p.step.last_ns,
        "step_ns": p.step.step_ns,
        "closed_step_ns": p.step.closed_step_ns,
        "stream_start_ns": p.step.stream_start_ns,
    }
    p.close()
    return state


def test_explicit_and_automatic_loops_record_identical_counters(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    loop = _run("loop", monkeypatch, tmp_path)
    hook = _run("hook", monkeypatch, tmp_path)
    assert loop == hook
    assert loop["steps"] == len(WAITS) and loop["seen"] == [1, 2, 3, 4, 5]
    assert loop["wait_ns"] >= sum(WAITS)  # the waits, plus the timer calls inside the window
