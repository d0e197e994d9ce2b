"""The per-process probe: cumulative counters, throttled publishing, fork and exit handling.

Hot path (once per batch): two clock reads, three counter updates and one
integer compare against the next publish deadline (the step time is derived
from the first and latest delivery of each uninterrupted run of batches). Everything else (opening
the file, the CUDA device query, the batch size, the cgroup reads (at most once
a second, ``dam_probe.cgroup``), the process's CPU time and memory and its workers' (at most
once a second, ``dam_probe.process``), the rank identity, the mmap write) happens at
publish time, at most every ``interval_ns``.

The counters live in small groups (``dam_probe._counters``: ``step``, ``comm``, ``kills``,
``devices``, and ``goodput``), each with its own ``reset()``; a forked child resets them all.

Collectives (``dam_probe._comm``) add to the ``comm`` counters under
``comm.lock`` (their completions arrive on the communication threads) and
publish on their own deadline, ``comm.next_ns``, from the thread that launched
them. Publishing itself is serialised by a lock, so a batch and a collective
never write the file at the same time.

Goodput (``dam_probe._goodput``): start-up, checkpoint saves, productive and other time, and
the one-time FLOP count of a step, on the slow path and in the save wrappers only.

The probe never raises into the training loop: an exception at publish time
disables it for the rest of the process and prints one line on stderr.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Final, Protocol

from dam_probe import lastwords
from dam_probe._counters import CommCounters, Devices, LoaderSettings, StepCounters, WorkerKills
from dam_probe._goodput import Accounting
from dam_probe._watchdog import Watchdog
from dam_probe.cgroup import CgroupReader, MemoryReader
from dam_probe.cleanup import remove_finished
from dam_probe.layout import ProbeWriter, probe_path
from dam_probe.process import ProcessReader
from dam_probe.schedstat import RunQueueReader

ENV_DIR: Final = "DAM_PROBE_DIR"
ENV_DISABLE: Final = "DAM_PROBE_DISABLE"
PUBLISH_INTERVAL_NS: Final = 100_000_000  # 100 ms: at most ten mmap writes per second
NEVER: Final = 1 << 62  # a publish deadline that is never reached (disabled probe)
WAIT_SECONDS: Final = 1.0  # the most a publish that must not be skipped waits for another thread's

_TRUE = frozenset({"1", "true", "yes", "on"})


def disabled_by_env(environ: Mapping[str, str] | None = None) -> bool:
    """True when ``DAM_PROBE_DISABLE`` asks to turn the probe off (1/true/yes/on)."""
    env = os.environ if environ is None else environ
    return env.get(ENV_DISABLE, "").strip().lower() in _TRUE


def probe_dir(environ: Mapping[str, str] | None = None) -> str:
    """The directory to publish into, or "" when the probe should stay inactive."""
    env = os.environ if environ is None else environ
    if disabled_by_env(env):
        return ""
    return env.get(ENV_DIR, "").strip()


def batch_size_of(batch: object) -> int:
    """Length of the first dimension of the first tensor-like in ``batch`` (0 = unknown).

    Looks at most three levels into tuples, lists and dicts; reads only
    ``.shape``, so it never imports or calls into torch or numpy.
    """
    x = batch
    for _ in range(3):
        shape = getattr(x, "shape", None)
        if shape is not None:
            try:
                return int(shape[0]) if len(shape) > 0 else 0
            except (TypeError, ValueError, IndexError):
                return 0
        if isinstance(x, (list, tuple)):
            if not x:
                return 0
            x = x[0]
        elif isinstance(x, dict):
            x = next(iter(x.values()), None)
        else:
            return 0
    return 0


SEEN_MARK: Final = "_dam_probe_counted"
# PyTorch's messages (torch 2.x): the SIGCHLD handler's (torch/csrc/DataLoader.cpp) and the
# iterator's own check (torch/utils/data/dataloader.py, ``_try_get_data``).
_KILLED = re.compile(r"DataLoader worker \(pid (\d+)\) is killed by signal: ([^.]+)\.")
_EXITED_CODE = re.compile(r"DataLoader worker \(pid (\d+)\) exited unexpectedly with exit code (-?\d+)")
_EXITED = re.compile(r"DataLoader worker \(pid\(s\) ([\d, ]+)\) exited unexpectedly")


def _signal_numbers() -> dict[str, int]:
    """``strsignal`` text (what the SIGCHLD handler prints: "Killed") and names → signal numbers."""
    out: dict[str, int] = {}
    for sig in signal.Signals:
        out[sig.name] = int(sig)
        with contextlib.suppress(ValueError):
            text = signal.strsignal(sig)
            if text:
                out.setdefault(text, int(sig))
    return out


def _worker_exit_signal(iterator: object, pid: int) -> int:
    """The signal that ended worker ``pid`` of a multi-process iterator (its ``exitcode`` is
    ``-signal`` for a killed process, ``multiprocessing.Process``); 0 when not known."""
    for worker in getattr(iterator, "_workers", None) or ():
        if getattr(worker, "pid", None) == pid:
            code = getattr(worker, "exitcode", None)
            return -code if isinstance(code, int) and code < 0 else 0
    return 0


def killed_workers_of(iterator: object, wait_seconds: float = 0.2) -> list[tuple[int, int]]:
    """``(pid, signal)`` of the iterator's workers that a signal ended; on the error path only.

    ``multiprocessing.Process.join(timeout)`` reaps a worker that is dying but not yet reaped,
    so its ``exitcode`` (``-signal``) is known; live workers cost at most ``wait_seconds`` in all.
    """
    found: list[tuple[int, int]] = []
    deadline = time.monotonic() + wait_seconds
    for worker in getattr(iterator, "_workers", None) or ():
        try:
            if getattr(worker, "exitcode", None) is None:
                worker.join(max(0.0, deadline - time.monotonic()))
            code, pid = getattr(worker, "exitcode", None), getattr(worker, "pid", None)
        except Exception:
            continue
        if isinstance(code, int) and code < 0 and isinstance(pid, int):
            found.append((pid, -code))
    return sorted(found)


def dataloader_worker_deaths(message: str, iterator: object = None) -> list[tuple[int, int]]:
    """``(pid, signal)`` of each DataLoader worker an error message says died (signal 0: not known)."""
    found: dict[int, int] = {}
    numbers: dict[str, int] | None = None
    for m in _KILLED.finditer(message):
        numbers = numbers or _signal_numbers()
        found[int(m.group(1))] = numbers.get(m.group(2).strip(), 0)
    for m in _EXITED_CODE.finditer(message):
        code = int(m.group(2))
        found.setdefault(int(m.group(1)), -code if code < 0 else 0)
    for m in _EXITED.finditer(message):
        for part in m.group(1).split(","):
            if part.strip().isdigit():
                pid = int(part.strip())
                found[pid] = found.get(pid) or _worker_exit_signal(iterator, pid)
    return sorted(found.items())


class Resettable(Protocol):
    """A group of counters (``dam_probe._counters``): ``reset()`` zeroes it in place."""

    def reset(self) -> None: ...


RankIdentity = tuple[int | None, int | None, int | None]  # (rank, local rank, world size)
_I32_MAX: Final = 2**31 - 1


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name, "").strip()
    if not raw.isdigit() or not raw.isascii():
        return None
    value = int(raw)
    return value if value <= _I32_MAX else None


def rank_identity(environ: Mapping[str, str] | None = None) -> RankIdentity:
    """``(rank, local rank, world size)`` of this process; None for what is unknown.

    ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` (torchrun, PyTorchJob and most
    launchers set them); once a default process group exists,
    ``torch.distributed``'s rank and world size win. Never imports torch (it
    looks at ``sys.modules``); never raises.
    """
    env = os.environ if environ is None else environ
    rank, local_rank, world = _env_int(env, "RANK"), _env_int(env, "LOCAL_RANK"), _env_int(env, "WORLD_SIZE")
    dist: Any = sys.modules.get("torch.distributed")
    if dist is not None:
        try:
            if dist.is_available() and dist.is_initialized():
                got_rank, got_world = int(dist.get_rank()), int(dist.get_world_size())
                if 0 <= got_rank <= _I32_MAX and 0 < got_world <= _I32_MAX:
                    rank, world = got_rank, got_world
        except Exception:
            pass
    return rank, local_rank, world


class Probe:
    """Counters of one process, in groups (``dam_probe._counters``), and the writer that publishes them.

    The step counters (``step``) are updated by the instrumentation in
    ``dam_probe.instrument`` and ``dam_probe._autohook`` directly (no method
    call on the hot path); ``publish`` runs when ``step.next_publish_ns`` is reached.
    """

    __slots__ = (
        "_at_exit_registered",
        "_fork_registered",
        "cgroup",
        "comm",
        "comm_on",
        "comm_sweep",
        "devices",
        "directory",
        "disabled",
        "flops_per_step",
        "goodput",
        "identity",
        "interval_ns",
        "kills",
        "last_words_said",
        "loader",
        "memory",
        "path",
        "process",
        "publish_lock",
        "reported",
        "run_queue",
        "step",
        "watchdog",
        "writer",
    )
    KEPT_AFTER_FORK: ClassVar[frozenset[str]] = frozenset(
        {
            # Settings and installed instrumentation (the wrappers stay in the child), not counts.
            "_at_exit_registered",
            "_fork_registered",
            "comm_on",
            "comm_sweep",
            "directory",
            "disabled",
            "flops_per_step",
            "interval_ns",
        }
    )

    def __init__(self, interval_ns: int = PUBLISH_INTERVAL_NS) -> None:
        self.interval_ns = interval_ns
        self.step = StepCounters()  # the hot loops hold it: reset in place, never replaced
        self.flops_per_step = 0.0  # declared by the job (set_flops_per_step)
        self.devices = Devices()
        self.cgroup = CgroupReader()  # this process's own cgroup: CPU throttling and limit
        self.memory = MemoryReader()  # ... and its memory usage, limit and OOM kills
        # Its CPU time and RSS and its workers', for a sidecar in another PID namespace (a Pod that keeps
        # shareProcessNamespace: false): /proc/self and its children, at most once a second.
        self.process = ProcessReader()
        # Run-queue delay (runnable, waiting for a CPU) of its main thread and its workers': a busy
        # node, for a sidecar that cannot read their /proc/<pid>/schedstat; at most once a second.
        self.run_queue = RunQueueReader()
        self.kills = WorkerKills()  # DataLoader workers that died (``worker_failed``)
        self.loader = LoaderSettings()  # the settings of the latest DataLoader iterated (slow path)
        # Goodput and badput by cause, checkpoint saves, the measured FLOPs (dam_probe._goodput):
        # updated on the slow path and in the save wrappers only, never per batch.
        self.goodput = Accounting()
        # Collectives (dam_probe._comm): cumulative, updated under comm.lock.
        self.comm = CommCounters()
        self.comm_on = False  # the collective instrumentation is installed (flag bit 3 of the file)
        self.comm_sweep: Callable[[int], None] | None = None  # ends finished async collectives (_comm)
        # Where the training thread is once a step is overdue (dam_probe._watchdog): its own thread.
        self.watchdog = Watchdog()
        self.identity: RankIdentity = (None, None, None)  # as last published (rank_identity)
        self.publish_lock = threading.Lock()
        self.directory = ""
        self.path = ""
        self.writer: ProbeWriter | None = None
        self.disabled = False
        self.reported = False
        self.last_words_said = False  # one line a process (``say_last_words``)
        self._at_exit_registered = False
        self._fork_registered = False

    def counter_groups(self) -> tuple[Resettable, ...]:
        """Every group of counters; a forked child resets each (``after_fork_in_child``)."""
        return (
            self.step,
            self.comm,
            self.kills,
            self.loader,
            self.devices,
            self.goodput,
            self.cgroup,
            self.memory,
            self.process,
            self.run_queue,
            self.watchdog,
        )

    # -- state -----------------------------------------------------------------

    def active(self) -> bool:
        """Whether instrumentation should record (the env names a directory, no error so far)."""
        return not self.disabled and bool(probe_dir())

    def disable(self, reason: str) -> None:
        """Stops publishing for the rest of the process; prints one line on stderr once."""
        self.disabled = True
        self.step.next_publish_ns = NEVER
        writer, self.writer = self.writer, None
        if writer is not None:
            with contextlib.suppress(Exception):
                writer.close()
        if not self.reported:
            self.reported = True
            try:
                line = " ".join(str(reason).split()) or "unknown error"
                sys.stderr.write(f"dam-probe: disabled: {line}\n")
                sys.stderr.flush()
            except Exception:
                pass

    def set_flops_per_step(self, flops: float) -> None:
        value = float(flops)
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"flops_per_step must be a finite number >= 0, got {flops!r}")
        self.flops_per_step = value

    def stop(self, t_ns: int) -> None:
        """A loader ran out at ``t_ns``: the last step ends there; the next batch starts a new stream."""
        s = self.step
        if s.in_stream:
            self.goodput.stream_closed(t_ns)
            s.closed_step_ns += t_ns - s.stream_start_ns
            s.in_stream = False
            if not self.disabled:
                s.next_publish_ns = 0  # the next batch takes the slow path and opens a stream

    def slow_path(self, t0_ns: int, t1_ns: int, batch: object, source: object = None) -> None:
        """Runs when a batch reaches ``next_publish_ns``: opens a stream if none, then publishes.
        ``source``: the iterator the batch came from (its DataLoader settings are published)."""
        if source is not None:
            self.loader.record(source)
        s = self.step
        if not s.in_stream:
            s.in_stream = True
            s.stream_start_ns = t0_ns  # the first batch's step is its own wait
        self.goodput.before_publish(self, t0_ns)
        self.watchdog.at_batch(self)
        self.publish(t1_ns, batch)
        self.goodput.after_publish(self)

    def worker_failed(self, exc: BaseException, iterator: object = None) -> None:
        """Counts the DataLoader workers that ``exc`` (DataLoader's own error) says died; never raises.

        Called where the probe sees the exception: ``next()`` on a DataLoader iterator, and the
        uncaught-exception hook (PyTorch's SIGCHLD handler raises it wherever the main thread
        is). Publishes at once: a process killed right after still leaves the count behind.
        """
        try:
            if getattr(exc, SEEN_MARK, False):
                return
            found = dataloader_worker_deaths(str(exc), iterator)
            if not found and isinstance(exc, (ConnectionError, EOFError)):
                # A worker killed while it sent a batch can surface as the broken pipe itself
                # (DataLoader re-raises it when the dead worker is not reaped yet): ask the workers.
                found = killed_workers_of(iterator)
            if not found:
                return
            with contextlib.suppress(AttributeError, TypeError):
                setattr(exc, SEEN_MARK, True)
            for pid, signum in found:
                self.kills.add(pid, signum)
            if iterator is not None:
                # A worker killed before the first batch: the loader's settings were never taken.
                self.loader.record(iterator)
            if self.active():
                # Waits for a publish in flight on another thread (the watchdog's): the process may
                # exit right after (os._exit, the OOM killer), and a skipped publish loses the count.
                self.publish(time.perf_counter_ns(), wait=True)
        except Exception:
            pass

    # -- publishing ------------------------------------------------------------

    def _open(self) -> ProbeWriter:
        directory = probe_dir()
        if not directory:
            raise RuntimeError(f"{ENV_DIR} is not set")
        path = probe_path(directory, os.getpid())
        try:
            os.makedirs(directory, exist_ok=True)
            writer = ProbeWriter(path, os.getpid())
        except OSError as exc:
            raise RuntimeError(f"cannot create {path}: {exc.strerror or exc}") from exc
        self.directory = directory
        self.path = path
        self.writer = writer
        # The probe owns clean-up (the sidecar's mount is read-only): finished processes' files go.
        with contextlib.suppress(Exception):
            remove_finished(directory, os.getpid())
        if not self._at_exit_registered:
            atexit.register(self.close)
            self._at_exit_registered = True
        if not self._fork_registered:
            os.register_at_fork(after_in_child=self.after_fork_in_child)
            self._fork_registered = True
        return writer

    def publish(self, now_ns: int, batch: object = None, closed: bool = False, *, wait: bool = False) -> None:
        """Writes the counters to the file (opening it first if needed); never raises. ``wait``:
        for another thread's publish to end (``WAIT_SECONDS`` at most) rather than skip this one."""
        if self.disabled:
            self.step.next_publish_ns = NEVER
            return
        if self._write(now_ns, batch, closed, wait=wait):
            self.step.next_publish_ns = now_ns + self.interval_ns
            self.comm.next_ns = now_ns + self.interval_ns

    def publish_comm(self, now_ns: int) -> None:
        """Publishes from the collective path (its own deadline; the batch path's is left alone)."""
        self.comm.next_ns = now_ns + self.interval_ns
        if not self.disabled:
            self._write(now_ns, None, False)

    def publish_watch(self, now_ns: int) -> bool:
        """Publishes from the watchdog's thread (``dam_probe._watchdog``): never into torch (no
        device query, no sweep of asynchronous collectives), never blocking; False when skipped."""
        return not self.disabled and self._write(now_ns, None, False, watch=True)

    def _write(
        self, now_ns: int, batch: object, closed: bool, watch: bool = False, wait: bool = False
    ) -> bool:
        """One publish under ``publish_lock``; False when skipped (another thread is publishing)."""
        if not self.publish_lock.acquire(timeout=-1 if closed else WAIT_SECONDS if wait else 0):
            return False
        try:
            writer = self.writer
            if writer is None:
                if closed or watch:
                    return False
                writer = self._open()
            _publish_to(self, writer, now_ns, batch, closed=closed, watch=watch)
            return True
        except Exception as exc:
            self.disable(f"{type(exc).__name__}: {exc}" if not isinstance(exc, RuntimeError) else str(exc))
            return False
        finally:
            self.publish_lock.release()

    def close(self) -> None:
        """Final publish with the closed flag, and the last words (``dam_probe.lastwords``) when
        the webhook asked for them (registered with ``atexit``)."""
        if self.disabled:
            return
        if self.writer is None:
            say_last_words(self)
            return
        self.publish(time.perf_counter_ns(), closed=True)
        say_last_words(self)  # after: its totals are the closing publish's figures
        writer, self.writer = self.writer, None
        self.step.next_publish_ns = 0
        if writer is not None:
            with contextlib.suppress(Exception):
                writer.close()

    def after_fork_in_child(self) -> None:
        """A forked child (a DataLoader worker) starts from zero and never touches the parent's file.

        Every group of counters resets itself in place; what is kept is ``KEPT_AFTER_FORK``.
        """
        writer, self.writer = self.writer, None
        if writer is not None:
            with contextlib.suppress(Exception):
                writer.close()  # unmaps the child's view only; the parent's file is untouched
        for group in self.counter_groups():
            group.reset()
        # Locks held by another thread at fork time would stay held in the child forever.
        self.publish_lock = threading.Lock()
        self.path = ""
        self.reported = False
        self.last_words_said = False
        self.identity = (None, None, None)  # the child's own, at its first publish
        if self.disabled:
            self.step.next_publish_ns = NEVER


def say_last_words(p: Probe) -> bool:
    """One line in the container's termination message (``dam_probe.lastwords``): the loader's
    workers and their kills, which the operator reads from the Pod's status when no scrape saw them
    (a loader killed a second after start), and its exit totals (the latest publish's goodput
    figures: the operator counts what came after its pod's last scrape). Only a process that
    iterated a DataLoader, stepped, or saw a worker die says anything, once; never raises."""
    try:
        path = lastwords.exit_record_path()
        loader = p.loader.figures
        kills, signum = p.kills.figures()
        if not path or p.last_words_said or (loader is None and not kills and not p.step.steps):
            return False
        words = lastwords.LastWords(
            pid=os.getpid(),
            rank=p.identity[0],
            steps=p.step.steps,
            loader_workers=None if loader is None else loader[0],
            worker_kills=kills,
            kill_signal=signum,
            totals=p.goodput.totals(p.step.steps, p.comm_on or p.identity[0] is None),
        )
        p.last_words_said = lastwords.write(path, words)
        return p.last_words_said
    except Exception:
        return False


def _publish_to(
    p: Probe, writer: ProbeWriter, now_ns: int, batch: object, *, closed: bool, watch: bool = False
) -> None:
    """Reads what the publish path reads (batch size, devices, cgroup, rank) and writes a record;
    ``watch``: from the watchdog's thread, nothing that calls into torch."""
    s = p.step
    if batch is not None:
        size = batch_size_of(batch)
        if size > 0:
            s.batch_size = size
    if not closed and not watch:
        p.devices.refresh(now_ns)
    # Never raises; a process without a readable cgroup publishes the fields as invalid.
    cgroup = p.cgroup.read(now_ns)
    throttled_ns, limit_millicores, cgroup_id = cgroup if cgroup is not None else (None, None, None)
    if not watch:  # torch.distributed's answer; the watchdog's thread reuses the latest
        p.identity = rank_identity()
    rank, local_rank, world_size = p.identity
    if p.comm_sweep is not None and not watch:
        p.comm_sweep(now_ns)
    collectives = p.comm.figures() if p.comm_on else None
    step_ns, wait_ns = s.step_ns, s.wait_ns
    goodput, checkpoints, measured_flops = p.goodput.figures(
        p, wait_ns, step_ns, 0 if collectives is None else collectives[2]
    )
    writer.publish(
        s.steps,
        wait_ns,
        step_ns,
        batch_size=s.batch_size,
        flops_per_step=p.flops_per_step,
        device_uuids=p.devices.uuids,
        closed=closed,
        cgroup_throttled_ns=throttled_ns,
        cgroup_limit_millicores=limit_millicores,
        cgroup_id=cgroup_id,
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        collectives=collectives,
        memory=p.memory.read(now_ns),
        process=p.process.read(now_ns),
        loader_kills=p.kills.figures(),
        run_queue=p.run_queue.read(now_ns),
        goodput=goodput,
        checkpoints=checkpoints,
        measured_flops=measured_flops,
        flops_reason=p.goodput.flops.reason_figures(),
        progress=p.watchdog.figures(p),
        loader_settings=p.loader.figures,
        matmul_precision=p.goodput.flops.precision,
    )


PROBE: Final = Probe()
