"""The probe's last words (issue 28 item 8): a loader killed before any scrape still tells the
operator its workers and the kill, through the container's termination message.

Real torch under the automatic instrumentation, as in test_worker_killed.py: a worker kills itself
with SIGKILL at its first sample (the fast loader OOM: before the first batch), DataLoader raises
in the main process, and the file the kubelet would read holds the probe's line. The file is made
empty beforehand, as the kubelet makes it; the probe never creates it.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from dam_probe import lastwords
from dam_probe.bootstrap import install_into
from dam_probe.lastwords import LastWords, Totals
from dam_probe.layout import probe_files, read_file

from .conftest import python_env, run_python

KILLED_AT_START = """
import os, signal, sys, time
import torch
from torch.utils.data import DataLoader, Dataset

class Samples(Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        if {kill_at_start}:
            os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer does, before any batch
        return torch.zeros(4)

loader = DataLoader(Samples(), batch_size=4, num_workers=2)
for batch in loader:
    time.sleep(0.01)
if {main_killed}:
    os.kill(os.getpid(), signal.SIGKILL)  # the main process itself: it says nothing
"""


@pytest.fixture(scope="module")
def site_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return install_into(str(tmp_path_factory.mktemp("site")))


def _run(site_dir: str, tmp_path: Path, *, kill_at_start: bool, main_killed: bool = False) -> tuple[int, str]:
    message = tmp_path / "termination-log"
    message.write_text("")  # the kubelet's empty file
    env = python_env(
        PYTHONPATH=site_dir,
        DAM_PROBE_DIR=str(tmp_path / "probes"),
        DAM_PROBE_EXIT_RECORD=str(message),
    )
    code = KILLED_AT_START.format(kill_at_start=kill_at_start, main_killed=main_killed)
    result = run_python(code, env, timeout=120)
    return result.returncode, message.read_text()


def test_a_worker_killed_before_the_first_batch_leaves_the_workers_and_the_kill_in_the_message(
    site_dir: str, tmp_path: Path
) -> None:
    code, message = _run(site_dir, tmp_path, kill_at_start=True)
    assert code == 1, message  # DataLoader's error: the main process was not the one killed
    (words,) = lastwords.parse(message)
    assert words.loader_workers == 2  # taken from the iterator at the error: no batch had come
    assert words.worker_kills >= 1 and words.kill_signal == signal.SIGKILL
    assert words.steps == 0


def test_a_clean_run_says_its_loader_and_steps_and_no_kill(site_dir: str, tmp_path: Path) -> None:
    code, message = _run(site_dir, tmp_path, kill_at_start=False)
    assert code == 0
    (words,) = lastwords.parse(message)
    assert (words.loader_workers, words.worker_kills, words.steps) == (2, 0, 16)


def test_a_clean_run_says_its_exit_totals_equal_to_its_closing_record(site_dir: str, tmp_path: Path) -> None:
    """The totals are the figures the sidecar exports from the closing publish (milliseconds):
    the operator counts, from them, what the process did after its pod's last scrape."""
    code, message = _run(site_dir, tmp_path, kill_at_start=False)
    assert code == 0
    (words,) = lastwords.parse(message)
    (path,) = probe_files(str(tmp_path / "probes"))
    record = read_file(path)
    assert record.closed and words.totals is not None
    t = words.totals
    assert record.productive_ns is not None and record.startup_ns is not None
    assert record.other_ns is not None
    assert t.productive_ms == record.productive_ns // 1_000_000 > 0  # 16 steps of 10 ms sleep
    assert t.startup_ms == record.startup_ns // 1_000_000
    assert t.other_ms == record.other_ns // 1_000_000
    assert t.data_wait_ms == record.wait_ns // 1_000_000
    assert t.communication_ms == 0  # no rank: it waited on no peer, as its sidecar says
    # The process's seconds add up to its life: its start plus them is when they were taken.
    process_start_ms = t.at_ms - (t.productive_ms + t.startup_ms + t.data_wait_ms + t.other_ms)
    assert abs(process_start_ms - record.process_start_ns // 1_000_000) <= 8
    # torch.save is timed (wrapped once torch loaded) and never called: every step since none.
    assert (t.checkpoint_ms, t.steps_since_checkpoint) == (record.checkpoint_ns, 16) == (0, 16)


def test_a_main_process_killed_by_sigkill_says_nothing(site_dir: str, tmp_path: Path) -> None:
    code, message = _run(site_dir, tmp_path, kill_at_start=False, main_killed=True)
    assert code == -signal.SIGKILL
    assert message == ""  # its exit code (137 in a container) says who was killed


def test_the_probe_never_creates_the_file_and_never_writes_into_the_users_message(tmp_path: Path) -> None:
    words = LastWords(pid=7, loader_workers=2, worker_kills=1, kill_signal=9)
    missing = tmp_path / "none"
    assert lastwords.write(str(missing), words) is False and not missing.exists()
    users = tmp_path / "users"
    users.write_text("checkpoint corrupt at step 40\n")
    assert lastwords.write(str(users), words) is False
    assert users.read_text() == "checkpoint corrupt at step 40\n"
    assert lastwords.write("", words) is False


def test_every_process_adds_its_own_line_up_to_what_the_kubelet_keeps(tmp_path: Path) -> None:
    path = tmp_path / "termination-log"
    path.write_text("")
    written = 0
    while lastwords.write(str(path), LastWords(pid=1000 + written, rank=written, steps=written)):
        written += 1
    assert written > 10
    assert os.path.getsize(path) <= lastwords.MAX_MESSAGE_BYTES
    said = lastwords.parse(path.read_text())
    assert [w.rank for w in said] == list(range(written))


def test_lines_round_trip_and_garbage_is_skipped_not_raised() -> None:
    words = LastWords(pid=12, rank=3, steps=40, loader_workers=4, worker_kills=1, kill_signal=9)
    assert lastwords.parse(words.line()) == (words,)
    assert lastwords.parse(LastWords(pid=5).line()) == (LastWords(pid=5),)  # unknown stays unknown
    ended = LastWords(
        pid=6, rank=0, steps=9, totals=Totals(1_796_322_802_040, 4_200, 90_000, 7_500, 5, 6_400)
    )
    assert lastwords.parse(ended.line()) == (ended,)
    full = Totals(1_796_322_802_040, 4_200, 90_000, 7_500, 5, 6_400, 2_670, 34)
    assert lastwords.parse(LastWords(pid=6, totals=full).line())[0].totals == full
    # Totals without one of the figures every process has are no totals.
    assert lastwords.parse("dam-probe/1 pid=6 at=1 good=2 startup=3 data=4")[0].totals is None
    message = "\n".join(
        [
            "Traceback (most recent call last):",  # the user's own text
            "dam-probe/1 pid=x workers=2",  # a field that is not a number: the whole line goes
            "dam-probe/1 workers=2",  # no pid
            "dam-probe/1 pid=9 workers=-1",
            "dam-probe/1 pid=9 workers=99999999999999999999",
            "dam-probe/2 pid=9 workers=2",  # a version this parser does not know
            "dam-probe/1 pid=9 workers=2 color=3",  # a key it does not know: the rest is read
            "\x00\xff garbage",
        ]
    )
    assert lastwords.parse(message) == (LastWords(pid=9, loader_workers=2),)
    assert lastwords.parse("") == ()
