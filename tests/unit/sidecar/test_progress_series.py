"""Per-rank progress series: each rank's latest batch, collectives entered, liveness and, while its
step is overdue, where its watchdog found the training thread (what the operator lines up)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from dam_contract import names as n
from dam_contract.snapshot import Snapshot, labels_of, parse
from dam_probe.layout import PLACE_COLLECTIVE, PLACE_USER_CODE
from dam_sidecar.collector import SidecarCollector, build_collector
from dam_sidecar.settings import SidecarSettings

from .conftest import remove_proc, write_probe

T = 1_800_000_000 * 10**9  # Unix ns
FRAMES = "train.py:41 hang\ntrain.py:60 main"
NOT_READ = {"collectives_entered": 0, "place_read_ns": 0, "place": 0, "place_detail": "", "place_frames": ""}
"""The progress fields of a record whose step is not overdue (they go together in the layout)."""


def _collector(tmp_path: Path, *pids: int) -> SidecarCollector:
    (tmp_path / "probe").mkdir(exist_ok=True)
    for pid in pids:
        (tmp_path / "proc" / str(pid)).mkdir(parents=True, exist_ok=True)
    settings = SidecarSettings(probe_dir=str(tmp_path / "probe"), proc_root=str(tmp_path / "proc"))
    return build_collector(settings, use_nvml=False)


def _snap(c: SidecarCollector) -> Snapshot:
    c.sample_now()
    return c.snapshot()


def _stalled_pair(probe: Path) -> None:
    """Rank 0 waits in all_reduce #7 (entered 7); rank 1 sleeps in user code (entered 6)."""
    common = {"world_size": 2, "steps": 50, "step_ns": 10 * 10**9, "last_batch_ns": T}
    write_probe(
        probe,
        pid=10,
        rank=0,
        collectives_entered=7,
        place_read_ns=T + 6 * 10**9,
        place=PLACE_COLLECTIVE,
        place_detail="all_reduce #7",
        place_frames="train.py:44 step",
        **common,
    )
    write_probe(
        probe,
        pid=11,
        rank=1,
        collectives_entered=6,
        place_read_ns=T + 6 * 10**9,
        place=PLACE_USER_CODE,
        place_detail="",
        place_frames=FRAMES,
        **common,
    )


def test_each_rank_exports_its_latest_batch_sequence_liveness_and_place(tmp_path: Path) -> None:
    c = _collector(tmp_path, 10, 11)
    _stalled_pair(tmp_path / "probe")
    snap = _snap(c)
    r0, r1 = labels_of({"rank": "0"}), labels_of({"rank": "1"})
    assert snap.series(n.LAST_BATCH_TIMESTAMP_SECONDS) == {
        r0: pytest.approx(T / 1e9),
        r1: pytest.approx(T / 1e9),
    }
    assert snap.series(n.COLLECTIVE_SEQUENCE) == {r0: 7.0, r1: 6.0}
    assert snap.series(n.RANK_UP) == {r0: 1.0, r1: 1.0}
    places = {
        s.label("rank"): (s.label("where"), s.label("detail"), s.label("frames"))
        for s in snap.samples(n.TRAINING_PLACE_INFO)
    }
    assert places == {
        "0": ("collective", "all_reduce #7", "train.py:44 step"),
        "1": ("user-code", "", FRAMES),  # the frames' newline survives the text format
    }


def test_the_exposition_with_places_is_valid_prometheus_text(tmp_path: Path) -> None:
    c = _collector(tmp_path, 10, 11)
    _stalled_pair(tmp_path / "probe")
    c.sample_now()
    text = c.text()
    assert {s.name for s in parse(text.decode())} >= {n.TRAINING_PLACE_INFO, n.RANK_UP}
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed")
    result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, check=False)
    assert result.returncode == 0, result.stderr.decode()


def test_a_place_read_before_the_latest_batch_is_not_exported(tmp_path: Path) -> None:
    """The watchdog read the place of a step that has ended since: steps come again."""
    c = _collector(tmp_path, 10)
    write_probe(
        tmp_path / "probe",
        pid=10,
        rank=0,
        steps=9,
        last_batch_ns=T + 10**9,
        collectives_entered=0,
        place_read_ns=T,
        place=PLACE_USER_CODE,
        place_detail="",
        place_frames=FRAMES,
    )
    snap = _snap(c)
    assert n.TRAINING_PLACE_INFO not in snap.names()
    assert snap.series(n.RANK_UP) == {labels_of({"rank": "0"}): 1.0}


def test_a_rank_whose_process_ended_reads_down_and_keeps_its_latest_batch(tmp_path: Path) -> None:
    c = _collector(tmp_path, 10, 11)
    _stalled_pair(tmp_path / "probe")
    _snap(c)
    remove_proc(tmp_path / "proc", 11)
    write_probe(
        tmp_path / "probe", pid=11, rank=1, world_size=2, steps=50, last_batch_ns=T, closed=True, **NOT_READ
    )
    snap = _snap(c)
    r1 = labels_of({"rank": "1"})
    assert snap.series(n.RANK_UP)[r1] == 0.0
    assert snap.series(n.LAST_BATCH_TIMESTAMP_SECONDS)[r1] == pytest.approx(T / 1e9)
    assert r1 not in snap.series(n.COLLECTIVE_SEQUENCE)
    assert {s.label("rank") for s in snap.samples(n.TRAINING_PLACE_INFO)} == {"0"}


def test_before_the_first_batch_there_are_no_progress_series(tmp_path: Path) -> None:
    c = _collector(tmp_path, 10)
    write_probe(
        tmp_path / "probe", pid=10, rank=0, steps=0, last_batch_ns=0, **{**NOT_READ, "collectives_entered": 2}
    )
    snap = _snap(c)
    assert not {n.LAST_BATCH_TIMESTAMP_SECONDS, n.RANK_UP, n.COLLECTIVE_SEQUENCE} & snap.names()


GOODPUT = {
    "process_start_ns": 1,
    "startup_ns": 10**9,
    "productive_ns": 5 * 10**9,
    "other_ns": 10**9,
    "flops_state": 0,
}


def test_a_cause_the_probe_cannot_measure_has_no_badput_series(tmp_path: Path) -> None:
    """A ranked process whose collectives are not timed (DAM_PROBE_COLLECTIVES=0) and whose saves
    are not timed: no communication or checkpoint series (unknown, not 0). A process without a rank
    waited on no peer: its communication is 0, measured."""
    c = _collector(tmp_path, 10, 11)
    write_probe(tmp_path / "probe", pid=10, rank=0, world_size=2, steps=9, **GOODPUT)
    write_probe(tmp_path / "probe", pid=11, steps=9, **GOODPUT)
    snap = _snap(c)
    causes = {(s.label("rank"), s.label("cause")) for s in snap.samples(n.BADPUT_SECONDS_TOTAL)}
    assert ("0", "communication") not in causes and ("0", "checkpoint") not in causes
    assert {("0", "startup"), ("0", "data-wait"), ("0", "other")} <= causes
    assert ("", "communication") in causes and ("", "checkpoint") not in causes
