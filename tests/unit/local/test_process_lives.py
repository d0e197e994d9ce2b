"""``dam run`` keeps every training process's life (the probe reader's ``lives``) for the restarts
inside its command: ended processes stay, with the figures their last record published."""

from __future__ import annotations

from pathlib import Path

import pytest

from dam_operator.local.child import life_of
from dam_probe.layout import ProbeRecord
from dam_sidecar.errors import ErrorLog
from dam_sidecar.samplers.probe import ProbeReader
from tests.unit.sidecar.conftest import write_probe

S = 10**9
PLAIN: dict[str, object] = {"batch_size": 0, "flops_per_step": 0.0, "closed": False}


def _goodput(start_s: float, *, steps: int, since: int | None, saved: bool, rank: int) -> dict[str, object]:
    fields: dict[str, object] = {
        "rank": rank,
        "steps": steps,
        "process_start_ns": int(start_s * S),
        "startup_ns": 2 * S,
        "productive_ns": 10 * S,
        "other_ns": 0,
        "flops_state": 0,
    }
    if since is not None:
        done = steps - since if saved else 0
        fields |= {
            "checkpoint_ns": S,
            "checkpoint_step_ns": S,
            "checkpoints": 1 if saved else 0,
            "last_checkpoint_ns": 5 * S if saved else 0,
            "last_checkpoint_steps": done,
        }
    return fields


def test_an_ended_process_stays_among_the_lives_with_its_last_figures(tmp_path: Path) -> None:
    probe, proc = tmp_path / "probe", tmp_path / "proc"
    probe.mkdir()
    proc.mkdir()
    (proc / "11").mkdir()  # pid 10 is gone: its closed file is folded in and removed
    reader = ProbeReader(str(probe), ErrorLog(), proc_root=str(proc), keep_lives=True)
    write_probe(probe, pid=10, start_time_ns=1, last_update_ns=30 * S, closed=True,
                **_goodput(1.0, steps=118, since=18, saved=True, rank=0))  # fmt: skip
    reader.sample()
    write_probe(probe, pid=11, start_time_ns=2, last_update_ns=60 * S,
                **_goodput(31.0, steps=100, since=0, saved=True, rank=0))  # fmt: skip
    reader.sample()
    lives = [life_of(r) for r in reader.lives()]
    assert [(x.rank, x.start_seconds, x.end_seconds) for x in lives if x] == [(0, 1.0, 30.0), (0, 31.0, 60.0)]
    first = lives[0]
    assert first is not None and (first.steps_since_checkpoint, first.saved) == (18, True)
    assert first.productive_seconds == pytest.approx(10.0) and first.startup_seconds == pytest.approx(2.0)


def test_a_process_without_goodput_or_saves_timed_is_no_life_or_one_with_saves_unknown() -> None:
    bare = ProbeRecord(pid=1, start_time_ns=1, steps=0, wait_ns=0, step_ns=0, last_update_ns=1, **PLAIN)  # type: ignore[arg-type]
    assert life_of(bare) is None  # a launcher, a loader worker: no first batch
    fields = _goodput(1.0, steps=50, since=None, saved=False, rank=1)
    timed = ProbeRecord(pid=2, start_time_ns=1, wait_ns=0, step_ns=0, last_update_ns=9 * S, **fields, **PLAIN)  # type: ignore[arg-type]
    life = life_of(timed)
    assert life is not None and life.steps_since_checkpoint is None and not life.saved
    never = _goodput(1.0, steps=50, since=50, saved=False, rank=1)
    life = life_of(
        ProbeRecord(pid=3, start_time_ns=1, wait_ns=0, step_ns=0, last_update_ns=9 * S, **never, **PLAIN)
    )  # type: ignore[arg-type]
    assert life is not None and (life.steps_since_checkpoint, life.saved) == (50, False)


def test_the_sidecar_s_reader_keeps_no_ended_process(tmp_path: Path) -> None:
    probe, proc = tmp_path / "probe", tmp_path / "proc"
    probe.mkdir()
    proc.mkdir()
    reader = ProbeReader(str(probe), ErrorLog(), proc_root=str(proc))  # keep_lives off: bounded memory
    write_probe(probe, pid=10, closed=True, **_goodput(1.0, steps=5, since=None, saved=False, rank=0))
    assert reader.sample().steps == 5  # folded in, counted
    assert reader.lives() == []
