"""Hostile probe directories: the reader returns fast, reads the good files and tells the truth.

The probe directory is an ``emptyDir`` shared with the training container, so
anything the training container can create may appear there: FIFOs, sockets,
symbolic links (to ``/dev/zero`` or another file), directories with a probe
file's name, huge sparse files, truncated or garbage files. Each case keeps a
good probe file next to the bad one and checks that one sample returns within
a short bound, still sums the good file, says ``up`` only because of the good
file, counts the bad file under ``dam_sampler_errors_total`` and leaves it in
place (the clean-up never deletes what is not a regular probe file).

A sample runs in a daemon thread with a deadline, so a reader that blocks (the
FIFO did, before the fix) fails the test instead of hanging it.
"""

from __future__ import annotations

import os
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dam_probe.layout import FILE_SIZE, MAGIC, ProbeRecord, encode, probe_path
from dam_sidecar.errors import ErrorLog
from dam_sidecar.samplers.probe import ProbeReader, ProbeSample

from .conftest import write_probe

NOW_NS = 2_000 * 10**9
BOUND_SECONDS = 2.0  # one sample of a handful of files takes milliseconds; a blocked open never returns
GOOD_PID = 10
BAD_PID = 99


def sample_within(reader: ProbeReader, bound: float = BOUND_SECONDS) -> ProbeSample:
    """One ``reader.sample()`` in a daemon thread; fails (instead of hanging) when it takes longer."""
    result: list[ProbeSample] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result.append(reader.sample())
        except BaseException as exc:  # reported below
            failure.append(exc)

    t = threading.Thread(target=run, daemon=True, name="hostile-sample")
    started = time.monotonic()
    t.start()
    t.join(bound)
    if t.is_alive():
        _unblock_fifos(reader.probe_dir)  # let the stuck thread go, so it does not outlive the test
        pytest.fail(f"ProbeReader.sample() blocked for more than {bound:g} s")
    if failure:
        raise failure[0]
    assert time.monotonic() - started < bound
    return result[0]


def _unblock_fifos(directory: str) -> None:
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        if os.path.exists(path) and not os.path.islink(path) and _is_fifo(path):
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)  # a writer lets a blocked reader's open return
            os.close(fd)


def _is_fifo(path: str) -> bool:
    return stat.S_ISFIFO(os.lstat(path).st_mode)


@pytest.fixture
def probe_dir(tmp_path: Path) -> Path:
    d = tmp_path / "probe"
    d.mkdir()
    (tmp_path / "proc" / str(GOOD_PID)).mkdir(parents=True)
    write_probe(d, pid=GOOD_PID, steps=5, wait_ns=10**9, step_ns=2 * 10**9)
    return d


@pytest.fixture
def unix_socket(probe_dir: Path) -> Iterator[str]:
    path = probe_path(str(probe_dir), BAD_PID)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.bind(path)
        s.listen(1)
        yield path
    finally:
        s.close()


def make_reader(probe_dir: Path) -> tuple[ProbeReader, ErrorLog, list[str]]:
    errors = ErrorLog()
    removed: list[str] = []

    def remove(path: str) -> None:
        removed.append(path)
        os.remove(path)

    r = ProbeReader(
        str(probe_dir),
        errors,
        proc_root=str(probe_dir.parent / "proc"),
        clock_ns=lambda: NOW_NS,
        remove=remove,
    )
    return r, errors, removed


def assert_good_file_read(s: ProbeSample) -> None:
    assert s.up, "the good probe file is live: dam_probe_up must be 1"
    assert s.live_pids == (GOOD_PID,)
    assert s.steps == 5
    assert s.wait_seconds == pytest.approx(1.0)


def _fifo(path: str) -> None:
    os.mkfifo(path)


def _symlink_to_dev_zero(path: str) -> None:
    os.symlink("/dev/zero", path)


def _symlink_to_fifo(path: str) -> None:
    target = os.path.join(os.path.dirname(path), "not-a-probe-file")
    os.mkfifo(target)
    os.symlink(target, path)


def _directory(path: str) -> None:
    os.mkdir(path)
    with open(os.path.join(path, "inside"), "wb") as fh:
        fh.write(b"x" * 10)


NOT_REGULAR: dict[str, Callable[[str], None]] = {
    "fifo": _fifo,
    "symlink_to_dev_zero": _symlink_to_dev_zero,
    "symlink_to_fifo": _symlink_to_fifo,
    "directory": _directory,
}


@pytest.mark.parametrize("kind", sorted(NOT_REGULAR))
def test_a_non_regular_probe_file_is_skipped_fast_and_counted(probe_dir: Path, kind: str) -> None:
    bad = probe_path(str(probe_dir), BAD_PID)
    NOT_REGULAR[kind](bad)
    r, errors, removed = make_reader(probe_dir)
    for _ in range(3):  # every tick, not just the first
        s = sample_within(r)
        assert_good_file_read(s)
    assert errors.count("probe", "not_regular_file") == 3, errors.counts()
    assert os.path.lexists(bad) and removed == []


def test_a_socket_in_the_probe_directory_is_skipped_fast_and_counted(
    probe_dir: Path, unix_socket: str
) -> None:
    r, errors, removed = make_reader(probe_dir)
    s = sample_within(r)
    assert_good_file_read(s)
    assert errors.count("probe", "not_regular_file") == 1, errors.counts()
    assert os.path.lexists(unix_socket) and removed == []


def test_only_a_fifo_leaves_the_probe_down(probe_dir: Path) -> None:
    os.remove(probe_path(str(probe_dir), GOOD_PID))
    os.mkfifo(probe_path(str(probe_dir), BAD_PID))
    r, errors, _ = make_reader(probe_dir)
    s = sample_within(r)
    assert not s.up and s.live_pids == () and s.steps == 0
    assert errors.count("probe", "not_regular_file") == 1


def test_a_symlink_to_a_closed_probe_file_is_neither_read_nor_removed(
    probe_dir: Path, tmp_path: Path
) -> None:
    # A finished (closed) probe image elsewhere, linked in under a probe file's name: following the link
    # would fold it in and then delete the link's target's name in the probe directory.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = write_probe(elsewhere, pid=BAD_PID, steps=1000, closed=True)
    link = probe_path(str(probe_dir), BAD_PID)
    os.symlink(target, link)
    r, errors, removed = make_reader(probe_dir)
    s = sample_within(r)
    assert_good_file_read(s)
    assert errors.count("probe", "not_regular_file") == 1
    assert removed == [] and os.path.islink(link) and os.path.exists(target)


def test_a_huge_sparse_file_is_read_only_up_to_the_layout_size(probe_dir: Path) -> None:
    bad = probe_path(str(probe_dir), BAD_PID)
    with open(bad, "wb") as fh:
        fh.truncate(64 * 2**30)  # 64 GiB of holes: reading it whole would take the node's memory
    r, errors, removed = make_reader(probe_dir)
    s = sample_within(r)
    assert_good_file_read(s)
    assert errors.count("probe", "bad_magic") == 1, errors.counts()
    assert removed == []


def test_a_huge_file_with_a_valid_image_in_front_still_reads(probe_dir: Path) -> None:
    os.remove(probe_path(str(probe_dir), GOOD_PID))
    record = ProbeRecord(
        pid=GOOD_PID,
        start_time_ns=1,
        steps=5,
        wait_ns=10**9,
        step_ns=0,
        last_update_ns=10**19 - 1,
        batch_size=0,
        flops_per_step=0.0,
        closed=False,
    )
    image = encode(record)
    path = probe_path(str(probe_dir), GOOD_PID)
    with open(path, "wb") as fh:
        fh.write(image)
        fh.truncate(16 * 2**30)
    r, errors, _ = make_reader(probe_dir)
    s = sample_within(r)
    assert_good_file_read(s)
    assert errors.counts() == {}


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "truncated"),
        (MAGIC + b"\x00" * 20, "truncated"),
        (b"\xff" * FILE_SIZE, "bad_magic"),
        (os.urandom(FILE_SIZE), "bad_magic"),
    ],
    ids=["empty", "header_only", "wrong_magic", "random_bytes"],
)
def test_truncated_and_garbage_files_are_skipped_and_counted(
    probe_dir: Path, content: bytes, reason: str
) -> None:
    bad = probe_path(str(probe_dir), BAD_PID)
    with open(bad, "wb") as fh:
        fh.write(content)
    r, errors, removed = make_reader(probe_dir)
    s = sample_within(r)
    assert_good_file_read(s)
    assert errors.count("probe", reason) == 1, errors.counts()
    assert removed == [] and os.path.exists(bad)


def test_a_skipped_file_logs_once_per_period_but_counts_every_tick(
    probe_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    os.mkfifo(probe_path(str(probe_dir), BAD_PID))
    r, errors, _ = make_reader(probe_dir)
    with caplog.at_level("WARNING", logger="dam_sidecar"):
        for _ in range(5):
            sample_within(r)
    lines = [rec.getMessage() for rec in caplog.records if "not_regular_file" in rec.getMessage()]
    assert len(lines) == 1 and "FIFO" in lines[0] and f"probe-{BAD_PID}.bin" in lines[0], lines
    assert errors.count("probe", "not_regular_file") == 5


def test_a_file_swapped_for_a_directory_before_clean_up_is_not_removed(probe_dir: Path) -> None:
    # The reader folds in a closed file, then removes it. If the name no longer holds a regular file
    # by then (replaced between the read and the clean-up), nothing is removed.
    closed = write_probe(probe_dir, pid=BAD_PID, steps=3, closed=True)
    r, _, removed = make_reader(probe_dir)
    original_finished = r._finished

    def finished_then_swap(rec: ProbeRecord, now_ns: int) -> bool:
        done = original_finished(rec, now_ns)
        if done:
            os.remove(closed)
            os.mkdir(closed)
        return done

    r._finished = finished_then_swap  # type: ignore[method-assign, assignment]
    s = sample_within(r)
    assert s.steps == 8  # the closed file's 3 folded in, the good file's 5 live
    assert removed == [] and os.path.isdir(closed)
