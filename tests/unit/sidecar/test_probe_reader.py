"""The probe reader: sums, monotonic counters across restarts, faults counted and never raised."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from dam_probe.layout import FILE_SIZE, ProbeWriter, encode, probe_path
from dam_sidecar.errors import ErrorLog
from dam_sidecar.samplers.probe import ProbeReader, ProbeSample, RankSample

from .conftest import write_probe

NOW_NS = 2_000 * 10**9


def reader(tmp_path: Path, proc: Path | None = None, **kw: object) -> tuple[ProbeReader, ErrorLog]:
    errors = ErrorLog()
    proc = proc or tmp_path / "proc"
    proc.mkdir(exist_ok=True)
    r = ProbeReader(str(tmp_path / "probe"), errors, proc_root=str(proc), clock_ns=lambda: NOW_NS, **kw)  # type: ignore[arg-type]
    (tmp_path / "probe").mkdir(exist_ok=True)
    return r, errors


def alive(tmp_path: Path, *pids: int) -> None:
    for pid in pids:
        (tmp_path / "proc" / str(pid)).mkdir(parents=True, exist_ok=True)


def test_counters_are_summed_over_training_processes(tmp_path: Path) -> None:
    r, _ = reader(tmp_path)
    alive(tmp_path, 10, 11)
    write_probe(tmp_path / "probe", pid=10, steps=5, wait_ns=2 * 10**9, step_ns=4 * 10**9, batch_size=32)
    write_probe(tmp_path / "probe", pid=11, steps=7, wait_ns=1 * 10**9, step_ns=3 * 10**9)
    s = r.sample()
    assert s.steps == 12
    assert s.wait_seconds == pytest.approx(3.0)
    assert s.step_seconds == pytest.approx(7.0)
    assert s.up and s.live_pids == (10, 11)


def test_restarted_trainer_with_the_same_pid_does_not_make_counters_go_down(tmp_path: Path) -> None:
    r, _ = reader(tmp_path)
    alive(tmp_path, 7)
    write_probe(tmp_path / "probe", pid=7, start_time_ns=1, steps=100, wait_ns=10**9, step_ns=5 * 10**9)
    first = r.sample()
    # The container restarts: same pid 7, a new start time, counters from zero.
    write_probe(tmp_path / "probe", pid=7, start_time_ns=2, steps=3, wait_ns=10**8, step_ns=10**8)
    second = r.sample()
    assert second.steps == 103
    assert second.wait_seconds == pytest.approx(1.1)
    assert second.step_seconds >= first.step_seconds


def test_finished_process_is_folded_in_once_and_its_file_removed(tmp_path: Path) -> None:
    r, _ = reader(tmp_path)
    alive(tmp_path, 20)
    path = write_probe(tmp_path / "probe", pid=20, steps=50, step_ns=10**9, closed=True)
    assert r.sample().steps == 50
    assert not os.path.exists(path)
    assert r.sample().steps == 50  # not counted twice
    assert not r.sample().up


def test_dead_pid_with_a_stale_file_is_folded_in(tmp_path: Path) -> None:
    r, _ = reader(tmp_path, stale_seconds=30.0)
    # pid 30 is not in the proc tree and its last update is 100 s old
    path = write_probe(tmp_path / "probe", pid=30, steps=9, last_update_ns=NOW_NS - 100 * 10**9)
    s = r.sample()
    assert s.steps == 9 and not s.up
    assert not os.path.exists(path)


def test_invisible_pid_with_a_fresh_file_counts_as_live(tmp_path: Path) -> None:
    r, _ = reader(tmp_path, stale_seconds=30.0)
    write_probe(tmp_path / "probe", pid=31, steps=9, last_update_ns=NOW_NS - 10**9)
    assert r.sample().up


def test_vanished_file_keeps_its_last_totals(tmp_path: Path) -> None:
    r, _ = reader(tmp_path)
    alive(tmp_path, 40)
    path = write_probe(tmp_path / "probe", pid=40, steps=11, wait_ns=10**9)
    r.sample()
    os.remove(path)
    s = r.sample()
    assert s.steps == 11 and s.wait_seconds == pytest.approx(1.0)
    assert not s.up


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "truncated"),
        (b"DAMPROBE" + b"\0" * 20, "truncated"),
        (b"\x00garbage" * (FILE_SIZE // 8), "bad_magic"),
    ],
)
def test_unreadable_probe_file_is_counted_by_reason_and_never_raises(
    tmp_path: Path, content: bytes, reason: str
) -> None:
    r, errors = reader(tmp_path)
    (tmp_path / "probe" / "probe-99.bin").write_bytes(content)
    s = r.sample()
    assert not s.up
    assert errors.count("probe", reason) == 1


def test_wrong_layout_version_is_reported_as_such(tmp_path: Path) -> None:
    from dam_probe.layout import ProbeRecord

    r, errors = reader(tmp_path)
    rec = ProbeRecord(1, 1, 1, 1, 1, 1, 0, 0.0, False)
    image = bytearray(encode(rec))
    image[8:12] = (99).to_bytes(4, "little")
    (tmp_path / "probe" / "probe-1.bin").write_bytes(bytes(image))
    r.sample()
    assert errors.count("probe", "wrong_version") == 1


def test_corrupt_file_does_not_hide_the_good_ones(tmp_path: Path) -> None:
    r, errors = reader(tmp_path)
    alive(tmp_path, 12)
    write_probe(tmp_path / "probe", pid=12, steps=4)
    (tmp_path / "probe" / "probe-13.bin").write_bytes(b"junk")
    s = r.sample()
    assert s.steps == 4 and s.up
    assert errors.count("probe", "truncated") == 1


def test_missing_probe_directory_is_an_error_not_a_crash(tmp_path: Path) -> None:
    errors = ErrorLog()
    r = ProbeReader(str(tmp_path / "nope"), errors, proc_root=str(tmp_path))
    s = r.sample()
    assert not s.up and s.steps == 0
    assert errors.count("probe", "missing_dir") == 1


def test_read_only_directory_does_not_double_count_finished_processes(tmp_path: Path) -> None:
    attempts: list[str] = []

    def read_only(path: str) -> None:
        attempts.append(path)
        raise OSError(errno.EROFS, "Read-only file system", path)

    r, errors = reader(tmp_path, remove=read_only)
    alive(tmp_path, 52)
    first = write_probe(tmp_path / "probe", pid=50, steps=8, closed=True)
    write_probe(tmp_path / "probe", pid=52, steps=1)
    assert r.sample().steps == 9
    write_probe(tmp_path / "probe", pid=51, steps=2, closed=True)
    assert r.sample().steps == 11
    assert r.sample().steps == 11
    assert os.path.exists(first)
    assert attempts == [first]  # stops trying after the first refusal
    assert errors.count("probe", "read_only_dir") == 0  # the probe owns clean-up: never an error


def test_disk_error_on_read_is_counted_as_io(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    r, errors = reader(tmp_path)
    write_probe(tmp_path / "probe", pid=77, steps=1)

    def failing_pread(fd: int, n: int, offset: int) -> bytes:
        raise OSError(errno.EIO, os.strerror(errno.EIO))  # what a failing disk gives; root reads any mode

    monkeypatch.setattr("dam_probe.layout.os.pread", failing_pread)
    assert not r.sample().up
    assert errors.count("probe", "io") == 1


def test_device_uuids_and_batch_size_come_from_live_probes(tmp_path: Path) -> None:
    r, _ = reader(tmp_path)
    alive(tmp_path, 60, 61)
    write_probe(tmp_path / "probe", pid=60, device_uuids=("GPU-a",), batch_size=16, last_update_ns=5)
    write_probe(tmp_path / "probe", pid=61, device_uuids=("GPU-b", "GPU-a"), batch_size=64, last_update_ns=9)
    s = r.sample()
    assert set(s.device_uuids) == {"GPU-a", "GPU-b"}
    assert s.batch_size == 64


def test_reads_a_file_written_live_by_the_probe_writer(tmp_path: Path) -> None:
    r, _ = reader(tmp_path)
    alive(tmp_path, os.getpid())
    w = ProbeWriter(probe_path(str(tmp_path / "probe"), os.getpid()), os.getpid())
    try:
        w.publish(steps=3, wait_ns=5 * 10**8, step_ns=10**9, batch_size=8)
        s = r.sample()
    finally:
        w.close()
    assert s.steps == 3 and s.wait_seconds == pytest.approx(0.5) and s.batch_size == 8


def test_error_log_rate_limits_lines_but_counts_every_fault(caplog: pytest.LogCaptureFixture) -> None:
    t = [0.0]
    errors = ErrorLog(log_interval_seconds=60, clock=lambda: t[0])
    with caplog.at_level("WARNING", logger="dam_sidecar"):
        for _ in range(5):
            errors.record("probe", "truncated", "x")
        t[0] = 61.0
        errors.record("probe", "truncated", "x")
    assert errors.count("probe", "truncated") == 6
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert "4 more since the last report" in lines[1]


# --- what the probes publish about their own cgroup ----------------------------------------------


def test_probes_of_one_container_share_a_cgroup_so_its_throttling_is_not_summed(tmp_path: Path) -> None:
    r, _ = reader(tmp_path)
    alive(tmp_path, 20, 21)
    cg = {"cgroup_id": 5, "cgroup_limit_millicores": 2000}
    write_probe(tmp_path / "probe", pid=20, cgroup_throttled_ns=3 * 10**9, last_update_ns=1, **cg)
    write_probe(tmp_path / "probe", pid=21, cgroup_throttled_ns=4 * 10**9, last_update_ns=2, **cg)
    s = r.sample()
    assert s.cgroup_throttled_seconds == pytest.approx(4.0)  # the freshest reading, not 7
    assert s.cgroup_limit_cores == pytest.approx(2.0)


def test_probes_in_different_cgroups_add_up(tmp_path: Path) -> None:
    r, _ = reader(tmp_path)
    alive(tmp_path, 20, 21)
    write_probe(
        tmp_path / "probe", pid=20, cgroup_throttled_ns=10**9, cgroup_limit_millicores=1000, cgroup_id=5
    )
    write_probe(
        tmp_path / "probe", pid=21, cgroup_throttled_ns=2 * 10**9, cgroup_limit_millicores=500, cgroup_id=6
    )
    s = r.sample()
    assert s.cgroup_throttled_seconds == pytest.approx(3.0)
    assert s.cgroup_limit_cores == pytest.approx(1.5)


def test_one_unlimited_cgroup_makes_the_limit_unknown(tmp_path: Path) -> None:
    r, _ = reader(tmp_path)
    alive(tmp_path, 20, 21)
    write_probe(tmp_path / "probe", pid=20, cgroup_throttled_ns=1, cgroup_limit_millicores=1000, cgroup_id=5)
    write_probe(tmp_path / "probe", pid=21, cgroup_throttled_ns=1, cgroup_limit_millicores=0, cgroup_id=6)
    assert r.sample().cgroup_limit_cores is None


def test_old_format_probe_files_give_no_cgroup_values(tmp_path: Path) -> None:
    r, _ = reader(tmp_path)
    alive(tmp_path, 20)
    write_probe(tmp_path / "probe", pid=20, steps=3)
    s = r.sample()
    assert s.steps == 3 and s.cgroup_throttled_seconds is None and s.cgroup_limit_cores is None


def test_cgroup_throttling_stays_monotonic_when_the_container_restarts(tmp_path: Path) -> None:
    r, _ = reader(tmp_path)
    alive(tmp_path, 7)
    write_probe(tmp_path / "probe", pid=7, start_time_ns=1, cgroup_throttled_ns=5 * 10**9, cgroup_id=40)
    assert r.sample().cgroup_throttled_seconds == pytest.approx(5.0)
    # The container restarts: a new cgroup whose counter starts from zero, same pid 7.
    write_probe(tmp_path / "probe", pid=7, start_time_ns=2, cgroup_throttled_ns=10**9, cgroup_id=41)
    assert r.sample().cgroup_throttled_seconds == pytest.approx(6.0)
    write_probe(tmp_path / "probe", pid=7, start_time_ns=2, cgroup_throttled_ns=2 * 10**9, cgroup_id=41)
    assert r.sample().cgroup_throttled_seconds == pytest.approx(7.0)


def test_a_trainer_restarted_in_the_same_cgroup_continues_its_count_without_double_counting(
    tmp_path: Path,
) -> None:
    r, _ = reader(tmp_path)
    alive(tmp_path, 7, 8)
    old = write_probe(tmp_path / "probe", pid=7, cgroup_throttled_ns=5 * 10**9, cgroup_id=40)
    # A second process of the same container that last published a while ago (an older reading).
    write_probe(tmp_path / "probe", pid=8, cgroup_throttled_ns=4 * 10**9, cgroup_id=40)
    assert r.sample().cgroup_throttled_seconds == pytest.approx(5.0)
    os.remove(old)  # pid 7 exits; the remaining reading is older, not a reset
    assert r.sample().cgroup_throttled_seconds == pytest.approx(5.0)
    write_probe(tmp_path / "probe", pid=9, start_time_ns=3, cgroup_throttled_ns=6 * 10**9, cgroup_id=40)
    alive(tmp_path, 9)
    assert r.sample().cgroup_throttled_seconds == pytest.approx(6.0)


def test_cgroup_throttling_is_kept_after_every_probe_has_finished(tmp_path: Path) -> None:
    r, _ = reader(tmp_path)
    write_probe(tmp_path / "probe", pid=30, closed=True, cgroup_throttled_ns=2 * 10**9, cgroup_id=1)
    s = r.sample()
    assert not s.up
    assert s.cgroup_throttled_seconds == pytest.approx(2.0)  # the counter does not vanish
    assert s.cgroup_limit_cores is None  # a limit is only reported for live processes
    assert r.sample().cgroup_throttled_seconds == pytest.approx(2.0)


def test_loader_worker_kills_are_summed_over_processes_and_kept_after_they_end(tmp_path: Path) -> None:
    r, _ = reader(tmp_path)
    alive(tmp_path, 10, 11)
    assert r.sample().loader_worker_kills is None  # no probe published a count yet
    write_probe(tmp_path / "probe", pid=10, loader_worker_kills=0)
    assert r.sample().loader_worker_kills == 0
    write_probe(tmp_path / "probe", pid=10, loader_worker_kills=2, loader_kill_signal=9)
    write_probe(tmp_path / "probe", pid=11, loader_worker_kills=1, loader_kill_signal=9)
    assert r.sample().loader_worker_kills == 3
    # The trainer that saw two of them exits: its file is folded in, the count stays.
    write_probe(tmp_path / "probe", pid=10, loader_worker_kills=2, loader_kill_signal=9, closed=True)
    r.sample()
    assert r.sample().loader_worker_kills == 3


def _rank_of(sample: ProbeSample, rank: int | None) -> RankSample:
    return next(r for r in sample.ranks if r.rank == rank)


def test_a_process_taking_the_rank_of_one_that_ended_is_a_restart_with_the_gap_between(
    tmp_path: Path,
) -> None:
    """torchrun --max-restarts inside one container: rank 1's first process published last at
    t=100 s and ended; the process that took rank 1 started at t=104 s. One restart, 4 s down; rank
    0, never restarted, none; the next sample counts it once."""
    tmp = tmp_path
    r, _ = reader(tmp)
    alive(tmp, 10, 11, 12)
    s = 10**9
    write_probe(tmp / "probe", pid=10, rank=0, world_size=2, start_time_ns=90 * s, last_update_ns=200 * s)
    write_probe(
        tmp / "probe",
        pid=11,
        rank=1,
        world_size=2,
        start_time_ns=90 * s,
        last_update_ns=100 * s,
        closed=True,
    )
    first = r.sample()
    assert (_rank_of(first, 1).restarts, _rank_of(first, 0).restarts) == (0, 0)
    write_probe(tmp / "probe", pid=12, rank=1, world_size=2, start_time_ns=104 * s, last_update_ns=200 * s)
    for _ in range(2):
        again = r.sample()
        one = _rank_of(again, 1)
        assert (one.restarts, one.restart_gap_seconds) == (1, pytest.approx(4.0))
        assert _rank_of(again, 0).restarts == 0


def test_a_process_that_ran_beside_an_ended_one_of_its_rank_is_no_restart(tmp_path: Path) -> None:
    """Two processes publishing under one rank at once (a wrapper that imports torch and its
    child): the one that ends leaves no place for the other to take."""
    r, _ = reader(tmp_path)
    alive(tmp_path, 20, 21)
    s = 10**9
    write_probe(
        tmp_path / "probe", pid=20, rank=0, world_size=1, start_time_ns=10 * s, last_update_ns=100 * s
    )
    write_probe(
        tmp_path / "probe",
        pid=21,
        rank=0,
        world_size=1,
        start_time_ns=12 * s,
        last_update_ns=90 * s,
        closed=True,
    )
    sample = r.sample()
    assert _rank_of(sample, 0).restarts == 0


def test_processes_without_a_rank_are_never_counted_as_restarts(tmp_path: Path) -> None:
    """``prep.py && train.py``: the second is no retry of the first."""
    r, _ = reader(tmp_path)
    alive(tmp_path, 30, 31)
    s = 10**9
    write_probe(tmp_path / "probe", pid=30, start_time_ns=10 * s, last_update_ns=20 * s, closed=True)
    r.sample()
    write_probe(tmp_path / "probe", pid=31, start_time_ns=25 * s, last_update_ns=40 * s)
    assert _rank_of(r.sample(), None).restarts == 0
