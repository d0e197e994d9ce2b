"""Running a command under the probe and sampling it: the machinery of ``dam run`` and ``dam tune``.

- ``probe_workspace`` installs the automatic instrumentation into a temporary directory;
  ``child_environment`` puts it first on the command's ``PYTHONPATH``. ``torchrun`` and
  ``multiprocessing`` children inherit the environment, so every rank and every DataLoader
  worker of the command is instrumented (each rank writes its own probe file).
- ``CollectorSource`` samples the sidecar's samplers in this process (no HTTP, no thread).
- ``sample_while_running`` samples every interval until the command exits (or the caller
  says stop), relaying the command's output in between when asked.
- ``stop_process_group`` ends a command started in its own session: SIGTERM to the whole
  group (torchrun, its ranks, their loader workers), then SIGKILL after a grace period.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from dam_contract.snapshot import Snapshot
from dam_operator.diagnosis.goodput import ProcessLife
from dam_probe.bootstrap import install_into
from dam_probe.layout import ProbeRecord
from dam_probe.overrides import ENV_LOADER_OVERRIDES


class SnapshotSource(Protocol):
    """Takes one fresh sample of every counter and returns it as a snapshot."""

    def snapshot(self) -> Snapshot: ...

    def close(self) -> None: ...


class CollectorSource:
    """The sidecar's samplers, sampled on demand in this process (no HTTP, no thread)."""

    def __init__(self, probe_dir: str, interval_seconds: float) -> None:
        from dam_sidecar.collector import build_collector
        from dam_sidecar.errors import ErrorLog
        from dam_sidecar.samplers.probe import ProbeReader
        from dam_sidecar.settings import SidecarSettings

        settings = SidecarSettings(probe_dir=probe_dir, interval_seconds=interval_seconds, port=0)
        errors = ErrorLog(settings.error_log_interval_seconds)
        self._probe = ProbeReader(
            probe_dir,
            errors,
            proc_root=settings.proc_root,
            stale_seconds=settings.probe_stale_seconds,
            keep_lives=True,
        )
        self._collector = build_collector(settings, errors=errors, probe=self._probe)

    def lives(self) -> list[ProcessLife]:
        """Every training process the probe files showed, ended or live (``ProcessLife``)."""
        return [life for r in self._probe.lives() if (life := life_of(r)) is not None]

    def snapshot(self) -> Snapshot:
        self._collector.sample_now()
        return self._collector.snapshot()

    def close(self) -> None:
        self._collector.close()


SourceFactory = Callable[[str, float], SnapshotSource]


def life_of(r: ProbeRecord) -> ProcessLife | None:
    """A process's life from its latest record; None before its goodput accounting (no first batch:
    a DataLoader worker, a launcher)."""
    if r.process_start_ns is None or r.productive_ns is None or not r.process_start_ns:
        return None
    since: int | None = None
    saved = False
    if r.last_checkpoint_ns is not None and r.last_checkpoint_steps is not None:
        saved = r.last_checkpoint_ns > 0
        since = max(0, r.steps - (r.last_checkpoint_steps if saved else 0))
    return ProcessLife(
        rank=None if r.rank is None or r.rank < 0 else r.rank,
        start_seconds=r.process_start_ns / 1e9,
        end_seconds=r.last_update_ns / 1e9,
        startup_seconds=(r.startup_ns or 0) / 1e9,
        productive_seconds=r.productive_ns / 1e9,
        steps=r.steps,
        steps_since_checkpoint=since,
        saved=saved,
    )


def lives_of(source: SnapshotSource) -> list[ProcessLife]:
    """The processes' lives a source kept (``CollectorSource``); none for another source."""
    lives = getattr(source, "lives", None)
    return list(lives()) if callable(lives) else []


def command_after_dashes(parser: argparse.ArgumentParser, rest: list[str], prog: str) -> list[str]:
    """The command a ``dam run``/``dam tune`` line ends with (``-- CMD ARGS...``); a parser error
    (exit 2, with the usage) when there is none."""
    cmd = list(rest)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        parser.error(f"no command given: use `{prog} [options] -- CMD ...`")
    return cmd


def default_source(probe_dir: str, interval_seconds: float) -> SnapshotSource:
    return CollectorSource(probe_dir, interval_seconds)


@dataclass(frozen=True)
class Workspace:
    inject_dir: str
    """Holds ``dam_probe`` and its ``sitecustomize.py``: goes first on the command's PYTHONPATH."""
    probe_dir: str
    """Where the command's processes write their probe files (``$DAM_PROBE_DIR``)."""


@contextlib.contextmanager
def probe_workspace(prefix: str = "dam-run-") -> Iterator[Workspace]:
    """A temporary directory with the instrumentation installed and an empty probe directory."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        inject_dir = install_into(os.path.join(tmp, "inject"))
        probe_dir = os.path.join(tmp, "probe")
        os.makedirs(probe_dir, exist_ok=True)
        yield Workspace(inject_dir, probe_dir)


def fresh_probe_dir(workspace: Workspace, name: str) -> Workspace:
    """A new, empty probe directory in the same workspace (one per ``dam tune`` trial)."""
    probe_dir = os.path.join(os.path.dirname(workspace.probe_dir), name)
    os.makedirs(probe_dir, exist_ok=False)
    return Workspace(workspace.inject_dir, probe_dir)


def child_environment(
    base: Mapping[str, str],
    inject_dir: str,
    probe_dir: str,
    loader_env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The command's environment: the probe first on ``PYTHONPATH``, an existing value kept.

    ``loader_env`` (``dam tune``) replaces any DataLoader overrides of ``base`` with its own
    (an empty mapping: none at all); None keeps what ``base`` has.
    """
    env = dict(base)
    existing = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = inject_dir + (os.pathsep + existing if existing else "")
    env["DAM_PROBE_DIR"] = probe_dir
    env.pop("DAM_PROBE_DISABLE", None)
    if loader_env is not None:
        env.pop(ENV_LOADER_OVERRIDES, None)
        env.update(loader_env)
    return env


def shell_exit_status(returncode: int) -> int:
    """A command killed by a signal exits 128 + N, as a shell reports it."""
    return 128 - returncode if returncode < 0 else returncode


def stop_process_group(child: subprocess.Popen[bytes], grace_seconds: float = 5.0) -> int:
    """Ends a command started with ``start_new_session=True`` and all its processes.

    SIGTERM to the process group (the command, its ranks, their DataLoader workers), then
    SIGKILL to the group when the command has not exited within ``grace_seconds``. The
    group is killed once more at the end: a worker that ignored SIGTERM must not outlive
    the measurement. Returns the command's return code.
    """
    pgid = child.pid
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    try:
        code = child.wait(timeout=grace_seconds)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        code = child.wait()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    return code


Pump = Callable[[float], None]
"""Waits up to the given seconds while relaying the command's output (``OutputRelay.pump``)."""


def sample_while_running(
    child: subprocess.Popen[bytes],
    source: SnapshotSource,
    interval_seconds: float,
    on_sample: Callable[[float, Snapshot], bool],
    *,
    pump: Pump | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> bool:
    """Samples ``source`` now and every interval until the command exits, then once more.

    ``on_sample(seconds since start, snapshot)`` returns True to stop sampling early (the
    command is left running: the caller stops it). Returns True when the command exited.
    """
    start = clock()
    if on_sample(0.0, source.snapshot()):
        return False
    next_sample = start + interval_seconds
    while True:
        remaining = next_sample - clock()
        if remaining > 0:
            if pump is not None:
                pump(min(remaining, 0.05))  # the exit is noticed within 50 ms
                if child.poll() is not None:
                    break
                continue
            try:
                child.wait(timeout=remaining)
                break
            except subprocess.TimeoutExpired:
                pass
        if child.poll() is not None:
            break
        now = clock()
        # A slow sample (a busy machine) does not make the next ones come in a burst.
        next_sample = max(next_sample + interval_seconds, now + interval_seconds / 2)
        if on_sample(now - start, source.snapshot()):
            return False
    on_sample(clock() - start, source.snapshot())
    return True
