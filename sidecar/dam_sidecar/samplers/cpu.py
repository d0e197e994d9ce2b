"""Host sampler: the training processes' CPU time and resident memory, the container's CFS
throttling and cgroup memory, node CPU utilization.

Everything comes from files under ``proc_root`` and ``cgroup_root``, so tests
use small fixture trees. Counters are monotonic: the CPU time of a process that
exited (a DataLoader worker, a restarted trainer) is folded into a carried total.
Resident memory (``/proc/<pid>/statm``) is a gauge per role: the training
processes (``main``) and their descendants, the DataLoader workers (``worker``).
The container's memory (usage, limit, OOM kills) comes from the training
process's memory cgroup, resolved like its CPU cgroup (``dam_probe.cgroup``).

A training process in another PID namespace (a Pod that keeps ``shareProcessNamespace:
false``) is not in this ``/proc``; worse, its pid may name another process here (the
sidecar's own pid 1). Its probe publishes its PID namespace and the same figures, read from
inside (``dam_probe.process``, flag bit 4 of the probe file): ``PublishedCpu`` turns those
into the same monotonic counters, and the collector never reads ``/proc/<pid>`` for a pid of
another namespace (``in_other_namespace``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Protocol

from dam_probe import cgroup, schedstat
from dam_probe.layout import ProbeRecord
from dam_probe.process import descendants, pid_namespace
from dam_sidecar.errors import ErrorLog
from dam_sidecar.samplers.monotonic import Monotonic

SAMPLER = "cpu"

ProcKey = tuple[int, int]  # (pid, start time in clock ticks since boot)


@dataclass(frozen=True)
class CpuSample:
    main_cpu_seconds: float | None = None
    worker_cpu_seconds: float | None = None
    main_processes: int = 0
    worker_processes: int = 0
    throttled_seconds: float | None = None
    limit_cores: float | None = None
    node_utilization_ratio: float | None = None
    main_rss_bytes: float | None = None
    worker_rss_bytes: float | None = None
    # The training container's memory cgroup, when visible here (None otherwise).
    memory_usage_bytes: float | None = None
    memory_limit_bytes: float | None = None  # None: unlimited (or unknown)
    oom_kills: float | None = None  # monotonic
    # Run-queue delay (runnable, waiting for a CPU) of each process's main thread, monotonic;
    # None when no schedstat was readable.
    main_wait_seconds: float | None = None
    worker_wait_seconds: float | None = None


class CpuSource(Protocol):
    def sample(self, pids: Iterable[int]) -> CpuSample: ...


@dataclass(frozen=True)
class ProcStat:
    pid: int
    ppid: int
    cpu_ticks: int
    start_ticks: int


def parse_stat(text: str) -> ProcStat:
    """Parse ``/proc/<pid>/stat``; the command name may hold spaces and parentheses."""
    head, sep, tail = text.rpartition(")")
    if not sep:
        raise ValueError("no ')' after the command name")
    pid = int(head.split("(", 1)[0])
    fields = tail.split()
    # fields[0] is field 3 (state): utime is field 14, stime 15, starttime 22.
    return ProcStat(
        pid=pid,
        ppid=int(fields[1]),
        cpu_ticks=int(fields[11]) + int(fields[12]),
        start_ticks=int(fields[19]),
    )


class _MonotonicSum:
    """Sum over a changing set of cumulative per-key counters that never goes down.

    ``update``'s ``fresh`` says whether a key seen for the first time began counting since the
    previous update; one that did not (``fresh`` False) counts from the value it was first seen
    with: what it had counted before that fell at an unknown time, perhaps long before the window
    that would otherwise receive it all at once."""

    def __init__(self) -> None:
        self.carried = 0.0
        self.last: dict[ProcKey, float] = {}
        self.base: dict[ProcKey, float] = {}

    def update(self, current: dict[ProcKey, float], fresh: Callable[[ProcKey], bool] | None = None) -> float:
        for key, value in self.last.items():
            if key not in current or current[key] < value:  # gone (or, to be safe, went back)
                self.carried += value - self.base.pop(key, 0.0)
        for key, value in current.items():
            if key not in self.last and fresh is not None and not fresh(key):
                self.base[key] = value
        self.last = dict(current)
        return self.carried + sum(value - self.base.get(key, 0.0) for key, value in current.items())


@dataclass
class CpuSampler:
    errors: ErrorLog
    proc_root: str = "/proc"
    cgroup_root: str = "/sys/fs/cgroup"
    clock_ticks_per_second: int = 0
    _main: _MonotonicSum = field(default_factory=_MonotonicSum)
    _worker: _MonotonicSum = field(default_factory=_MonotonicSum)
    _main_wait: _MonotonicSum = field(default_factory=_MonotonicSum)
    _worker_wait: _MonotonicSum = field(default_factory=_MonotonicSum)
    _throttled: Monotonic = field(default_factory=Monotonic)
    _node_prev: tuple[int, int] | None = None
    _cgroup_dir: str | None = None
    _cgroup_for: int | None = None
    _memory_dir: str | None = None
    _memory_for: int | None = None
    _oom: Monotonic = field(default_factory=Monotonic)
    page_size: int = 0

    def __post_init__(self) -> None:
        if self.clock_ticks_per_second <= 0:
            self.clock_ticks_per_second = int(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100
        if self.page_size <= 0:
            self.page_size = int(os.sysconf("SC_PAGE_SIZE")) if hasattr(os, "sysconf") else 4096

    # --- /proc --------------------------------------------------------------
    def _read(self, *parts: str) -> str:
        with open(os.path.join(*parts), encoding="ascii", errors="replace") as fh:
            return fh.read()

    def _stat(self, pid: int) -> ProcStat | None:
        try:
            return parse_stat(self._read(self.proc_root, str(pid), "stat"))
        except (FileNotFoundError, ProcessLookupError):
            return None  # the process exited
        except (OSError, ValueError, IndexError) as exc:
            self.errors.record(SAMPLER, "proc_parse", f"{self.proc_root}/{pid}/stat: {exc}")
            return None

    def _children(self, pid: int) -> list[int] | None:
        """Children from /proc/<pid>/task/*/children; None when the kernel does not offer the file."""
        task_dir = os.path.join(self.proc_root, str(pid), "task")
        try:
            tids = os.listdir(task_dir)
        except OSError:
            return None
        out: list[int] = []
        found = False
        for tid in tids:
            try:
                text = self._read(task_dir, tid, "children")
            except FileNotFoundError:
                continue
            except OSError:
                continue
            found = True
            out.extend(int(c) for c in text.split() if c.isdigit())
        return out if found else None

    def _ppid_map(self) -> dict[int, list[int]]:
        children: dict[int, list[int]] = {}
        try:
            entries = os.listdir(self.proc_root)
        except OSError:
            return children
        for name in entries:
            if name.isdigit():
                st = self._stat(int(name))
                if st is not None:
                    children.setdefault(st.ppid, []).append(st.pid)
        return children

    def _descendants(self, roots: list[int]) -> list[int]:
        return descendants(roots, self._children, self._ppid_map)

    def _run_delay(self, keys: Iterable[ProcKey]) -> dict[ProcKey, float]:
        """Run-queue delay of each process's main thread, seconds: ``/proc/<pid>/schedstat`` field 2.

        The kernel's ``sched_info.run_delay`` (ns a runnable task waited on a run queue; present
        with ``CONFIG_SCHED_INFO``). ``/proc/<pid>/schedstat`` is the thread-group leader's: the
        training loop's thread, a loader worker's only busy thread (``dam_probe.schedstat``).
        """
        out: dict[ProcKey, float] = {}
        for key in keys:
            try:
                out[key] = schedstat.run_delay_ns(self._read(self.proc_root, str(key[0]), "schedstat")) / 1e9
            except (FileNotFoundError, ProcessLookupError):
                continue  # the process exited, or the kernel keeps no schedstat
            except (OSError, ValueError) as exc:
                self.errors.record(SAMPLER, "proc_parse", f"{self.proc_root}/{key[0]}/schedstat: {exc}")
        return out

    def _cpu(self, pids: Iterable[int]) -> dict[ProcKey, float]:
        out: dict[ProcKey, float] = {}
        for pid in pids:
            st = self._stat(pid)
            if st is not None:
                out[(st.pid, st.start_ticks)] = st.cpu_ticks / self.clock_ticks_per_second
        return out

    # --- cgroup ---------------------------------------------------------------
    def _resolve_cgroup(self, pid: int) -> str | None:
        """The training process's cgroup directory, when it is visible under ``cgroup_root``.

        In a container with its own cgroup namespace, a process of the same
        container reads ``0::/`` (``cgroup_root`` itself); a process of another
        container reads ``0::/../…``, which is not visible: then this sampler
        reports no throttling rather than a wrong one (the collector falls back
        to what the probe reads from inside the training container).
        """
        if pid == self._cgroup_for:
            return self._cgroup_dir
        try:
            text = self._read(self.proc_root, str(pid), "cgroup")
        except OSError:
            return None  # the process is gone; try again next tick
        v2 = cgroup.is_v2(self.cgroup_root)
        base = self.cgroup_root if v2 else (cgroup.v1_cpu_root(self.cgroup_root) or self.cgroup_root)
        chosen = cgroup.cgroup_directory(text, base, v2)
        if chosen is None:
            self.errors.record(
                SAMPLER,
                "cgroup_unresolved",
                f"the cgroup of pid {pid} is not visible under {self.cgroup_root}; "
                "CPU throttling comes from the probe if it publishes it",
            )
        self._cgroup_dir, self._cgroup_for = chosen, pid
        return chosen

    def _cgroup(self, pid: int | None) -> tuple[float | None, float | None]:
        if pid is None:
            return None, None
        directory = self._resolve_cgroup(pid)
        if directory is None:
            return None, None
        v2 = cgroup.is_v2(self.cgroup_root)
        throttled: float | None = None
        limit: float | None = None
        try:
            throttled = cgroup.throttled_ns(self._read(directory, "cpu.stat"), v2) / 1e9
        except FileNotFoundError:
            self.errors.record(SAMPLER, "no_cgroup", f"no cpu.stat under {directory}")
            self._cgroup_for = None  # resolve again next tick
        except (OSError, KeyError, ValueError) as exc:
            self.errors.record(SAMPLER, "cgroup_parse", f"{directory}/cpu.stat: {exc!r}")
        try:
            if v2:
                limit = cgroup.limit_cores_v2(self._read(directory, "cpu.max"))
            else:
                limit = cgroup.limit_cores_v1(
                    int(self._read(directory, "cpu.cfs_quota_us").strip()),
                    int(self._read(directory, "cpu.cfs_period_us").strip()),
                )
        except FileNotFoundError:
            pass  # no limit file: no limit series
        except (OSError, ValueError) as exc:
            self.errors.record(SAMPLER, "cgroup_parse", f"{directory}: CPU limit unreadable: {exc!r}")
        return (self._throttled.update(throttled) if throttled is not None else None), limit

    # --- memory -----------------------------------------------------------------
    def _rss(self, pids: Iterable[int]) -> float | None:
        """Resident memory summed over ``pids`` (``statm`` field 2, in pages); None when none is readable."""
        total, seen = 0, False
        for pid in pids:
            try:
                total += int(self._read(self.proc_root, str(pid), "statm").split()[1]) * self.page_size
                seen = True
            except (FileNotFoundError, ProcessLookupError):
                continue  # the process exited
            except (OSError, ValueError, IndexError) as exc:
                self.errors.record(SAMPLER, "proc_parse", f"{self.proc_root}/{pid}/statm: {exc}")
        return float(total) if seen else None

    def _resolve_memory(self, pid: int) -> str | None:
        """The training process's memory cgroup directory, when visible (see ``_resolve_cgroup``)."""
        if pid == self._memory_for:
            return self._memory_dir
        try:
            text = self._read(self.proc_root, str(pid), "cgroup")
        except OSError:
            return None
        v2 = cgroup.is_v2(self.cgroup_root)
        base = self.cgroup_root if v2 else (cgroup.v1_memory_root(self.cgroup_root) or self.cgroup_root)
        chosen = cgroup.cgroup_directory(text, base, v2, "memory", cgroup.memory_files(v2)[0])
        if chosen is None:
            self.errors.record(
                SAMPLER,
                "memory_cgroup_unresolved",
                f"the memory cgroup of pid {pid} is not visible under {self.cgroup_root}; "
                "container memory comes from the probe if it publishes it",
            )
        self._memory_dir, self._memory_for = chosen, pid
        return chosen

    def _memory(self, pid: int | None) -> tuple[float | None, float | None, float | None]:
        """(usage, limit, OOM kills) of the training container's memory cgroup; Nones when not visible."""
        if pid is None:
            return None, None, None
        directory = self._resolve_memory(pid)
        if directory is None:
            return None, None, None
        usage_file, limit_file, events_file = cgroup.memory_files(cgroup.is_v2(self.cgroup_root))
        try:
            usage = cgroup.memory_bytes(self._read(directory, usage_file))
            limit = cgroup.memory_limit_bytes(self._read(directory, limit_file))
            kills = cgroup.oom_kills(self._read(directory, events_file))
        except FileNotFoundError as exc:
            self.errors.record(SAMPLER, "no_memory_cgroup", f"{directory}: {exc.filename} missing")
            self._memory_for = None  # resolve again next tick
            return None, None, None
        except (OSError, ValueError) as exc:
            self.errors.record(SAMPLER, "memory_cgroup_parse", f"{directory}: {exc!r}")
            return None, None, None
        return float(usage), (float(limit) if limit is not None else None), self._oom.update(float(kills))

    # --- /proc/stat -----------------------------------------------------------
    def _node(self) -> float | None:
        try:
            first = self._read(self.proc_root, "stat").splitlines()[0].split()
            if first[0] != "cpu":
                raise ValueError("first line is not the aggregate 'cpu' line")
            values = [int(v) for v in first[1:]]
        except (OSError, ValueError, IndexError) as exc:
            self.errors.record(SAMPLER, "proc_parse", f"{self.proc_root}/stat: {exc}")
            return None
        # user nice system idle iowait irq softirq steal (guest time is already inside user).
        busy_plus_idle = sum(values[:8])
        idle = values[3] + (values[4] if len(values) > 4 else 0)
        prev, self._node_prev = self._node_prev, (busy_plus_idle, idle)
        if prev is None:
            return None
        d_total, d_idle = busy_plus_idle - prev[0], idle - prev[1]
        if d_total <= 0:
            return None
        return min(1.0, max(0.0, 1.0 - d_idle / d_total))

    # --- the sample -----------------------------------------------------------
    def sample(self, pids: Iterable[int]) -> CpuSample:
        mains = sorted(set(pids))
        main_cpu = self._cpu(mains)
        live_mains = sorted({k[0] for k in main_cpu})
        workers = [p for p in self._descendants(live_mains) if p not in set(mains)]
        worker_cpu = self._cpu(workers)
        main_total = self._main.update(main_cpu)
        worker_total = self._worker.update(worker_cpu)
        seen_any = bool(self._main.last or self._main.carried)
        throttled, limit = self._cgroup(live_mains[0] if live_mains else None)
        usage, memory_limit, kills = self._memory(live_mains[0] if live_mains else None)
        live_workers = sorted({k[0] for k in worker_cpu})
        main_delay, worker_delay = self._run_delay(main_cpu), self._run_delay(worker_cpu)
        main_wait = self._main_wait.update(main_delay)
        worker_wait = self._worker_wait.update(worker_delay)
        waits_known = bool(self._main_wait.last or self._main_wait.carried)
        return CpuSample(
            main_wait_seconds=main_wait if waits_known else None,
            worker_wait_seconds=worker_wait if waits_known else None,
            main_cpu_seconds=main_total if seen_any else None,
            worker_cpu_seconds=worker_total if seen_any else None,
            main_processes=len(main_cpu),
            worker_processes=len(worker_cpu),
            throttled_seconds=throttled,
            limit_cores=limit,
            node_utilization_ratio=self._node(),
            main_rss_bytes=self._rss(live_mains) if live_mains else None,
            worker_rss_bytes=(self._rss(live_workers) or 0.0) if live_mains else None,
            memory_usage_bytes=usage,
            memory_limit_bytes=memory_limit,
            oom_kills=kills,
        )


# --- figures the probes publish (training processes in another PID namespace) ---------------


def in_other_namespace(record: ProbeRecord, own_namespace: int) -> bool:
    """Whether ``record``'s pid belongs to another PID namespace than this sidecar's.

    Unknown on either side (an older probe, a ``/proc`` without ``ns/pid``) counts as the same
    namespace: the sidecar reads ``/proc/<pid>`` as it always did.
    """
    return bool(own_namespace and record.pid_namespace and record.pid_namespace != own_namespace)


@dataclass
class PublishedCpu:
    """CPU time and resident memory of the training processes as their probes publish them.

    Counters stay monotonic as in ``CpuSampler``: a process that ended (its record gone) keeps
    what it counted, keyed by (pid, probe start time).
    """

    own_namespace: int = field(default_factory=lambda: pid_namespace("/proc"))
    _main: _MonotonicSum = field(default_factory=_MonotonicSum)
    _worker: _MonotonicSum = field(default_factory=_MonotonicSum)
    _main_wait: _MonotonicSum = field(default_factory=_MonotonicSum)
    _worker_wait: _MonotonicSum = field(default_factory=_MonotonicSum)
    _previous_ns: int | None = None

    def foreign(self, records: Iterable[ProbeRecord]) -> list[ProbeRecord]:
        """The records of processes this sidecar cannot see in its ``/proc``."""
        return [r for r in records if in_other_namespace(r, self.own_namespace)]

    def sample(self, records: Iterable[ProbeRecord], now_ns: int | None = None) -> CpuSample | None:
        """The figures of ``records`` that publish them; None before any ever did.

        A process's first record can come long after it started (its probe publishes at its first
        batch: after ``import torch``, 20 s and more on a busy node) with all it counted so far:
        a process that started before the previous sample (``now_ns``, Unix ns) counts from its
        first record, so that no window is given CPU time or run-queue delay from before it (a
        busy node's trainer read 100 % CPU wait, its own schedstat 51 %). At the first sample
        everything counts from zero, as before: the sidecar starts with the Pod, before its
        trainer; one restarted beside a running trainer gives its first window that trainer's
        past (the operator reads a counter that appears as counting from zero)."""
        now = time.time_ns() if now_ns is None else now_ns
        since, self._previous_ns = self._previous_ns, now

        def fresh(key: ProcKey) -> bool:
            # The probe's process start, Unix ns (ProbeRecord.start_time_ns), against the sidecar's clock.
            return since is None or key[1] >= since

        known = [r for r in records if r.process_cpu_ns is not None]
        main = self._main.update(
            {(r.pid, r.start_time_ns): (r.process_cpu_ns or 0) / 1e9 for r in known}, fresh
        )
        worker = self._worker.update(
            {(r.pid, r.start_time_ns): (r.worker_cpu_ns or 0) / 1e9 for r in known}, fresh
        )
        timed = [r for r in records if r.run_queue_ns is not None]  # run-queue delay (flag bit 5)
        main_wait = self._main_wait.update(
            {(r.pid, r.start_time_ns): (r.run_queue_ns or 0) / 1e9 for r in timed}, fresh
        )
        worker_wait = self._worker_wait.update(
            {(r.pid, r.start_time_ns): (r.worker_run_queue_ns or 0) / 1e9 for r in timed}, fresh
        )
        waits_known = bool(timed) or bool(self._main_wait.carried)
        if not known and not self._main.carried:
            return None
        return CpuSample(
            main_wait_seconds=main_wait if waits_known else None,
            worker_wait_seconds=worker_wait if waits_known else None,
            main_cpu_seconds=main,
            worker_cpu_seconds=worker,
            main_processes=len(known),
            worker_processes=sum(r.workers or 0 for r in known),
            main_rss_bytes=float(sum(r.process_rss_bytes or 0 for r in known)),
            worker_rss_bytes=float(sum(r.worker_rss_bytes or 0 for r in known)),
        )


def _add(a: float | None, b: float | None) -> float | None:
    return None if a is None and b is None else (a or 0.0) + (b or 0.0)


def with_published(own: CpuSample, published: CpuSample | None) -> CpuSample:
    """``own`` (what this sidecar read in its ``/proc`` and cgroup) plus the processes it cannot
    see, as their probes publish them (other processes: the figures add up)."""
    if published is None:
        return own
    return replace(
        own,
        main_cpu_seconds=_add(own.main_cpu_seconds, published.main_cpu_seconds),
        worker_cpu_seconds=_add(own.worker_cpu_seconds, published.worker_cpu_seconds),
        main_wait_seconds=_add(own.main_wait_seconds, published.main_wait_seconds),
        worker_wait_seconds=_add(own.worker_wait_seconds, published.worker_wait_seconds),
        main_processes=own.main_processes + published.main_processes,
        worker_processes=own.worker_processes + published.worker_processes,
        main_rss_bytes=_add(own.main_rss_bytes, published.main_rss_bytes),
        worker_rss_bytes=_add(own.worker_rss_bytes, published.worker_rss_bytes),
    )


def with_probe_workers(own: CpuSample, published: CpuSample | None) -> CpuSample:
    """``own`` (the sidecar's ``/proc`` read of trainers it can see), with their probes' worker
    figures (``PublishedCpu.sample`` over the same processes' records) where those count more.

    The sidecar finds a trainer's workers under ``/proc/<pid>/task/*/children`` (else by parent
    pid); the probe counts its own descendants from inside the trainer at publish time. More
    workers published than found means the sidecar missed some: the probe's worker count and
    resident memory are taken. Worker CPU is the larger of the two, both monotonic, so the
    exported counter never goes down whichever wins (the probe's also holds the workers that
    ended between two samples, through the trainer's ``cutime``/``cstime``).
    """
    if published is None or own.main_cpu_seconds is None:
        return own
    more = published.worker_processes > own.worker_processes
    return replace(
        own,
        worker_cpu_seconds=max(own.worker_cpu_seconds or 0.0, published.worker_cpu_seconds or 0.0),
        worker_processes=published.worker_processes if more else own.worker_processes,
        worker_rss_bytes=published.worker_rss_bytes if more else own.worker_rss_bytes,
    )
