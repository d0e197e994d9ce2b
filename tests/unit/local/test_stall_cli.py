"""`dam run --stall-after/--on-stall`: its settings, its errors, and the watch over probe files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dam_operator.diagnosis.progress import StallSettings
from dam_operator.local.run import _parse_args
from dam_operator.local.stall import StallWatch
from dam_probe.layout import ProbeRecord, encode, probe_path

S = 1_000_000_000


def test_the_defaults_report_after_five_minutes() -> None:
    args = _parse_args(["--", "python", "train.py"])
    assert (args.stall_after, args.on_stall) == (300.0, "report")


@pytest.mark.parametrize("value", ["0", "-5", "nan", "900000"])
def test_a_stall_floor_out_of_range_is_refused_naming_the_flag(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        _parse_args(["--stall-after", value, "--", "python", "train.py"])
    assert "--stall-after must be between 1 and 604800 seconds" in capsys.readouterr().err


def test_an_unknown_on_stall_action_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parse_args(["--on-stall", "restart", "--", "python", "train.py"])
    assert "invalid choice: 'restart'" in capsys.readouterr().err


def _write(directory: Path, pid: int, steps: int, last_batch_ns: int) -> str:
    record = ProbeRecord(
        pid=pid,
        start_time_ns=1,
        steps=steps,
        wait_ns=0,
        step_ns=(steps - 1) * S // 10,
        last_update_ns=last_batch_ns,
        batch_size=4,
        flops_per_step=0.0,
        closed=False,
        collectives_entered=0,
        last_batch_ns=last_batch_ns,
        place_read_ns=0,
        place=0,
        place_detail="",
        place_frames="",
    )
    path = probe_path(str(directory), pid)
    Path(path).write_bytes(encode(record))
    return path


def test_a_process_whose_file_went_keeps_its_figures_as_ended(tmp_path: Path) -> None:
    now = 1_800_000_000 * S
    watch = StallWatch(str(tmp_path), StallSettings(after_seconds=30), "exit", clock_ns=lambda: now)
    path = _write(tmp_path, os.getpid(), 50, now - 40 * S)  # this process runs: 40 s without a batch
    progress, changed = watch.sample()
    assert changed and progress.state == "Stalled" and watch.stops()
    os.unlink(path)  # the next probe to start removes a finished process's file
    progress, changed = watch.sample()
    assert changed and progress.state == "Progressing", progress  # it ended: no stall, no NotStarted
    assert not watch.stops()
