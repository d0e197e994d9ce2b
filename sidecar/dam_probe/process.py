"""CPU time and resident memory of this process and its children, read from inside the process.

What the sidecar reads from ``/proc/<pid>`` when it shares the training process's PID
namespace (``shareProcessNamespace: true``). A Pod whose owner keeps
``shareProcessNamespace: false`` gives the sidecar no view of the trainer's processes, so
the probe reads them itself, at publish time only (never per batch), at most once per
``REFRESH_NS``, and publishes them in the probe file (``dam_probe.layout``, flag bit 4):

- main CPU: ``utime + stime`` of ``/proc/self/stat`` (fields 14, 15: every thread);
- worker CPU: ``cutime + cstime`` of ``/proc/self/stat`` (fields 16, 17: the children it
  waited for, DataLoader workers that ended, with their own waited-for children) plus
  ``utime + stime + cutime + cstime`` of every live descendant (from
  ``/proc/<pid>/task/<tid>/children``, or a scan of ``/proc`` by parent pid where the
  kernel lacks that file). The Linux kernel adds a child's times to its parent's
  ``cutime``/``cstime`` when the parent reaps it, so a worker that ends moves from the
  second term to the first and the sum keeps going up; what a race between the two reads
  could lose is covered by publishing the highest value seen (never lower);
- resident memory: ``statm`` field 2 (pages) of the process and of its live descendants;
- worker count: the live descendants (zombies excluded);
- the inode of ``/proc/self/ns/pid``: the reader compares it with its own to know whether a
  pid in the file means the same process in its ``/proc``.

Nothing here raises: any failure makes ``read`` return None (the fields stay invalid) and
the next attempt waits ``RETRY_NS``. Standard library only.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar, Final, Generic, TypeVar

REFRESH_NS: Final = 1_000_000_000  # at most one read per second
RETRY_NS: Final = 60_000_000_000
T = TypeVar("T")
MAX_DESCENDANTS: Final = 1024  # bounds the cost of one read in a process that forks without end
MAX_THREADS_SCANNED: Final = 4096

ProcessFigures = tuple[int, int, int, int, int, int]
"""(main CPU ns, worker CPU ns, main RSS bytes, worker RSS bytes, workers, PID namespace inode or 0)"""


def read_small(path: str) -> str:
    """The first 4 KiB of a small procfs file (``stat``, ``statm``, ``schedstat``, ``children``)."""
    # os.open/os.read: a third of the cost of open() for these small procfs files.
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 4096).decode("ascii", "replace")
    finally:
        os.close(fd)


def stat_fields(text: str) -> list[str]:
    """``/proc/<pid>/stat`` split after the command name (which may hold spaces and parentheses):
    element 0 is field 3 (state), so field N is element N - 3."""
    _, sep, tail = text.rpartition(")")
    if not sep:
        raise ValueError("no ')' after the command name")
    return tail.split()


def running(pid: int, proc_root: str = "/proc") -> bool:
    """Whether ``pid`` runs: its ``stat`` readable and its state neither zombie nor dead. Reads
    only (no ``waitpid``: a parent's child is not reaped by asking)."""
    try:
        return stat_fields(read_small(os.path.join(proc_root, str(pid), "stat")))[0] not in ("Z", "X")
    except (OSError, ValueError, IndexError):
        return False


def pid_namespace(proc_root: str = "/proc") -> int:
    """The inode of this process's PID namespace (``/proc/self/ns/pid``); 0 when unknown."""
    try:
        return int(os.stat(os.path.join(proc_root, "self", "ns", "pid")).st_ino) & 0xFFFFFFFF
    except OSError:
        return 0


def descendants(
    roots: Sequence[int],
    children: Callable[[int], list[int] | None],
    by_parent: Callable[[], Mapping[int, list[int]]],
    limit: float = math.inf,
) -> list[int]:
    """Every descendant of ``roots`` (not the roots), at most ``limit``: ``children(pid)`` lists a
    process's children (None where the kernel has no ``children`` file: then ``by_parent()``, a
    scan of ``/proc`` by parent pid, made once and only then, answers)."""
    parents: Mapping[int, list[int]] | None = None
    seen = set(roots)
    out: list[int] = []
    stack = list(roots)
    while stack and len(out) < limit:
        pid = stack.pop()
        kids = children(pid)
        if kids is None:
            if parents is None:
                parents = by_parent()
            kids = parents.get(pid, [])
        for kid in kids:
            if kid not in seen and len(out) < limit:
                seen.add(kid)
                out.append(kid)
                stack.append(kid)
    return out


class Refreshing(Generic[T]):
    """``read(now_ns)``: ``_read_now()`` at most once per ``REFRESH_NS``, a failure retried after
    ``RETRY_NS``, never raises (the probe's /proc and schedstat readers and ``dam_probe.cgroup``'s,
    which also forgets the cgroup directory on failure: ``_failed``)."""

    __slots__ = ("_next_ns", "cached")

    cached: T | None
    _next_ns: int

    def read(self, now_ns: int) -> T | None:
        """The figures, re-read at most once per ``REFRESH_NS``; None when unreadable."""
        if now_ns < self._next_ns:
            return self.cached
        try:
            self.cached = self._read_now()
            self._next_ns = now_ns + REFRESH_NS
        except Exception:
            self.cached = None
            self._failed()
            self._next_ns = now_ns + RETRY_NS
        return self.cached

    def _read_now(self) -> T:
        raise NotImplementedError

    def _failed(self) -> None:
        """What else a failed read forgets (nothing here)."""


class ProcessReader(Refreshing[ProcessFigures]):
    """Reads this process's CPU and memory figures and its descendants'; see the module docstring."""

    __slots__ = ("_best", "_page", "_tick_ns", "pid", "proc_root")
    KEPT_AFTER_FORK: ClassVar[frozenset[str]] = frozenset({"_page", "_tick_ns", "pid", "proc_root"})

    def __init__(self, proc_root: str = "/proc", pid: int | None = None) -> None:
        self.proc_root = proc_root
        self.pid = pid  # None: os.getpid() at each read (a forked child reads its own)
        self.cached: ProcessFigures | None = None
        self._next_ns = 0
        self._best = (0, 0)  # highest (main, worker) CPU ns published: never lower
        ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._tick_ns = 1_000_000_000 // max(1, int(ticks))
        self._page = int(os.sysconf("SC_PAGE_SIZE")) if hasattr(os, "sysconf") else 4096

    def reset(self) -> None:
        """A forked child starts over (its own figures, read on its first publish)."""
        self.cached = None
        self._next_ns = 0
        self._best = (0, 0)

    def _proc(self, *parts: str) -> str:
        return os.path.join(self.proc_root, *parts)

    def _read_now(self) -> ProcessFigures:
        me = os.getpid() if self.pid is None else self.pid
        own = stat_fields(read_small(self._proc(str(me), "stat")))
        main_ticks = int(own[11]) + int(own[12])
        reaped_ticks = int(own[13]) + int(own[14])
        main_rss = self._rss(me) or 0
        worker_ticks, worker_rss, workers = 0, 0, 0
        for pid in self._descendants(me):
            try:
                fields = stat_fields(read_small(self._proc(str(pid), "stat")))
            except (OSError, ValueError):
                continue  # ended meanwhile
            if fields[0] == "Z":
                worker_ticks += int(fields[11]) + int(fields[12])  # not reaped yet: not in cutime
                continue
            worker_ticks += sum(int(fields[i]) for i in (11, 12, 13, 14))
            worker_rss += self._rss(pid) or 0
            workers += 1
        main_ns = max(main_ticks * self._tick_ns, self._best[0])
        worker_ns = max((reaped_ticks + worker_ticks) * self._tick_ns, self._best[1])
        self._best = (main_ns, worker_ns)
        return main_ns, worker_ns, main_rss, worker_rss, workers, pid_namespace(self.proc_root)

    def _rss(self, pid: int) -> int | None:
        try:
            return int(read_small(self._proc(str(pid), "statm")).split()[1]) * self._page
        except (OSError, ValueError, IndexError):
            return None

    def _children(self, pid: int) -> list[int] | None:
        """Children of every thread of ``pid``; None when the kernel offers no ``children`` file."""
        task_dir = self._proc(str(pid), "task")
        try:
            tids = os.listdir(task_dir)[:MAX_THREADS_SCANNED]
        except OSError:
            return []  # ended meanwhile
        out: list[int] = []
        found = False
        for tid in tids:
            try:
                text = read_small(os.path.join(task_dir, tid, "children"))
            except OSError:
                continue
            found = True
            out.extend(int(c) for c in text.split() if c.isdigit())
        return out if found or not tids else None

    def _by_parent(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for name in os.listdir(self.proc_root):
            if name.isdigit():
                try:
                    ppid = int(stat_fields(read_small(self._proc(name, "stat")))[1])
                except (OSError, ValueError, IndexError):
                    continue
                out.setdefault(ppid, []).append(int(name))
        return out

    def _descendants(self, root: int) -> list[int]:
        return descendants([root], self._children, self._by_parent, MAX_DESCENDANTS)
