"""The probe owns clean-up of finished probe files (the sidecar's mount is read-only)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from dam_probe._core import Probe
from dam_probe.cleanup import remove_finished
from dam_probe.layout import ProbeRecord, encode, probe_path

NOW = 10_000 * 10**9


def _file(folder: Path, pid: int, *, closed: bool, age_seconds: float, now_ns: int = NOW) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    rec = ProbeRecord(
        pid=pid,
        start_time_ns=1,
        steps=5,
        wait_ns=1,
        step_ns=2,
        last_update_ns=now_ns - int(age_seconds * 1e9),
        batch_size=0,
        flops_per_step=0.0,
        closed=closed,
    )
    path = probe_path(str(folder), pid)
    Path(path).write_bytes(encode(rec))
    return path


def test_files_of_finished_processes_go_once_the_sidecar_had_time_to_read_them(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "30").mkdir(parents=True)  # pid 30 is alive; 10, 20, 40 are gone
    d = tmp_path / "probes"
    old_closed = _file(d, 10, closed=True, age_seconds=600)
    fresh_closed = _file(d, 20, closed=True, age_seconds=5)  # the sidecar may not have read it yet
    live_idle = _file(d, 30, closed=False, age_seconds=600)  # alive, just not iterating
    dead = _file(d, 40, closed=False, age_seconds=600)  # OOM-killed: never closed
    own = _file(d, 50, closed=True, age_seconds=600)
    removed = remove_finished(str(d), 50, now_ns=NOW, proc_root=str(proc))
    assert sorted(removed) == sorted([old_closed, dead])
    assert all(os.path.exists(p) for p in (fresh_closed, live_idle, own))


def test_a_new_probe_removes_what_earlier_processes_left(tmp_path: Path, monkeypatch: object) -> None:
    import pytest

    assert isinstance(monkeypatch, pytest.MonkeyPatch)
    d = tmp_path / "probes"
    # A killed process's file, an hour old (its pid is gone).
    left = _file(d, 999_999_999, closed=False, age_seconds=3600, now_ns=time.time_ns())
    monkeypatch.setenv("DAM_PROBE_DIR", str(d))
    monkeypatch.delenv("DAM_PROBE_DISABLE", raising=False)
    probe = Probe()
    try:
        probe.publish(1)
        assert not os.path.exists(left)
        assert os.path.exists(probe.path)
    finally:
        probe.close()
