"""A DataLoader worker killed (the OOM killer's SIGKILL) is counted by the probe, for certain.

Real torch under the automatic instrumentation: a worker kills itself with SIGKILL, as the
kernel's OOM killer would; DataLoader raises its own error in the main process, and the probe
file then holds the count (offset 648) and the signal (652, flag bit 6) whatever code the
training loop was in when the error came.
"""

from __future__ import annotations

import multiprocessing
import signal
import time
from pathlib import Path

import pytest

from dam_probe._core import dataloader_worker_deaths, killed_workers_of
from dam_probe.bootstrap import install_into
from dam_probe.layout import ProbeRecord, decode, encode, probe_files, read_file

from .conftest import probe_lines, python_env, run_python, small_record

TRAIN = """
import os, signal, sys, time
import torch
from torch.utils.data import DataLoader, Dataset

class Samples(Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        if i == 20:
            os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer does
        time.sleep(0.002)
        return torch.zeros(4)

CATCH = {catch}
loader = DataLoader(Samples(), batch_size=4, num_workers=2)
try:
    for batch in loader:
        time.sleep({work})  # the main thread is in the "step" when SIGCHLD arrives
except (RuntimeError, ConnectionError, EOFError) as exc:
    # DataLoader's own error, or (when the worker dies mid-send and is not reaped yet) the broken
    # pipe it re-raises: torch's race, both seen on this machine.
    print("caught:", type(exc).__name__, exc, flush=True)
    if not CATCH:
        raise
    if CATCH == "exit":
        sys.exit(1)  # a launcher's way out: SystemExit never reaches sys.excepthook
    if CATCH == "os-exit":
        os._exit(1)  # no exit handler runs: only what was published at the error is there
"""


@pytest.fixture(scope="module")
def site_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return install_into(str(tmp_path_factory.mktemp("site")))


@pytest.mark.parametrize(
    ("catch", "work", "code"),
    [
        ("True", 0.0, 0),
        ("False", 0.05, 1),
        ('"exit"', 0.05, 1),
        ('"os-exit"', 0.05, 1),
    ],
    ids=["raised-in-next", "uncaught-from-the-step", "caught-then-sys-exit", "caught-then-os-exit"],
)
def test_a_worker_killed_by_sigkill_is_counted_in_the_probe_file(
    site_dir: str, tmp_path: Path, catch: str, work: float, code: int
) -> None:
    """However the training process exits after DataLoader's error (the container's exit code 1,
    not 137: the main process was not the one killed), the probe file read afterwards has the kill."""
    probes = tmp_path / "probes"
    env = python_env(PYTHONPATH=site_dir, DAM_PROBE_DIR=str(probes))
    result = run_python(TRAIN.format(catch=catch, work=work), env, timeout=120)
    # DataLoader's two messages, the pipe, or the queue's end of file (the worker died mid-send
    # and the main process read the short message first: stop 39's clean-clone run), as the
    # timing falls; whichever, the probe must have counted the kill (below).
    said = result.stdout + result.stderr
    seen = ("killed by signal: Killed", "exited unexpectedly", "ConnectionReset", "caught: EOFError")
    assert any(m in said for m in seen), said
    assert result.returncode == code, result.stderr
    assert probe_lines(result.stderr) == []
    (path,) = probe_files(str(probes))
    rec = read_file(path)
    assert rec.closed is (catch != '"os-exit"')  # os._exit runs no exit handler
    assert rec.loader_worker_kills == 1
    assert rec.loader_kill_signal == signal.SIGKILL


def test_dataloader_messages_give_the_pids_and_signals() -> None:
    killed = "DataLoader worker (pid 4242) is killed by signal: Killed. "
    assert dataloader_worker_deaths(killed) == [(4242, signal.SIGKILL)]
    exited = "DataLoader worker (pid(s) 11, 12) exited unexpectedly"
    assert dataloader_worker_deaths(exited) == [(11, 0), (12, 0)]

    class Worker:
        def __init__(self, pid: int, exitcode: int) -> None:
            self.pid, self.exitcode = pid, exitcode

    class Iterator:
        _workers = (Worker(11, -signal.SIGKILL), Worker(12, 1))

    assert dataloader_worker_deaths(exited, Iterator()) == [(11, signal.SIGKILL), (12, 0)]
    code = "DataLoader worker (pid 7) exited unexpectedly with exit code 1. Details are lost"
    assert dataloader_worker_deaths(code) == [(7, 0)]
    assert dataloader_worker_deaths("CUDA out of memory") == []


def test_worker_kill_fields_round_trip_and_read_as_unknown_without_their_flag() -> None:
    base = small_record()
    _, back = decode(encode(base))
    assert back.loader_worker_kills is None and back.loader_kill_signal is None  # unknown, not zero
    killed = ProbeRecord(**{**base.__dict__, "loader_worker_kills": 2, "loader_kill_signal": 9})
    image = encode(killed)
    _, back = decode(image)
    assert (back.loader_worker_kills, back.loader_kill_signal) == (2, 9)
    assert int.from_bytes(image[648:652], "little") == 2
    assert int.from_bytes(image[652:656], "little") == 9
    assert int.from_bytes(image[92:96], "little") & 64


def _sleep_forever() -> None:
    time.sleep(60)


def test_a_broken_pipe_from_a_killed_worker_is_attributed_by_asking_the_workers() -> None:
    """DataLoader re-raises the pipe error itself (ConnectionResetError) when the killed worker is not
    reaped yet: the probe then asks the iterator's worker processes which one a signal ended."""
    ctx = multiprocessing.get_context("fork")
    killed, alive = ctx.Process(target=_sleep_forever), ctx.Process(target=_sleep_forever)
    killed.start()
    alive.start()
    try:
        os_kill(killed.pid, signal.SIGKILL)

        class Iterator:
            _workers = (killed, alive)

        assert killed_workers_of(Iterator(), wait_seconds=2.0) == [(killed.pid, signal.SIGKILL)]
    finally:
        alive.kill()
        alive.join()
        killed.join()


def os_kill(pid: int | None, signum: int) -> None:
    import os

    assert pid is not None
    os.kill(pid, signum)
