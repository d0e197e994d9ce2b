"""Run-queue delay of this process and its DataLoader workers, read from inside the process.

The kernel counts, per task, the time it was runnable but waited on a run queue for a CPU:
field 2 of ``/proc/<pid>/schedstat`` (``sched_info.run_delay``, ns; the file exists with
``CONFIG_SCHED_INFO``, which ``CONFIG_SCHEDSTATS`` and ``CONFIG_TASK_DELAY_ACCT`` select —
every mainstream distribution kernel). ``/proc/<pid>/schedstat`` is the task of that pid:
for a process, its main thread (the thread-group leader) — the training loop's thread, and
a loader worker's only busy thread. A busy node (noisy neighbours, a Burstable pod beside
others) shows here and nowhere else: the process uses less CPU than it could, without being
throttled and without waiting for data.

When the sidecar cannot see the training process (another PID namespace) it cannot read the
file, so the probe reads it at publish time (never per batch), at most once per
``REFRESH_NS``, and publishes it (``dam_probe.layout``, flag bit 5):

- main: field 2 of ``/proc/self/schedstat``;
- workers: the sum over its live children (``/proc/self/task/<tid>/children``: DataLoader
  workers are the training process's children) of field 2 of their ``schedstat``, plus
  what the children that ended had counted when last read (a counter that never goes down).

Nothing here raises: any failure makes ``read`` return None (the fields stay invalid) and
the next attempt waits ``RETRY_NS``. Standard library only.
"""

from __future__ import annotations

import os
from typing import ClassVar, Final

from dam_probe.process import Refreshing, read_small

MAX_CHILDREN: Final = 1024
MAX_THREADS_SCANNED: Final = 4096


def run_delay_ns(text: str) -> int:
    """Field 2 of a ``schedstat`` line (``exec_runtime run_delay timeslices``), ns."""
    fields = text.split()
    if len(fields) < 2:
        raise ValueError(f"schedstat has {len(fields)} fields, expected 3")
    return int(fields[1])


class RunQueueReader(Refreshing[tuple[int, int]]):
    """``(main ns, workers ns)`` of this process; see the module docstring."""

    __slots__ = ("_carried", "_last", "proc_root")
    KEPT_AFTER_FORK: ClassVar[frozenset[str]] = frozenset({"proc_root"})  # a setting

    def __init__(self, proc_root: str = "/proc") -> None:
        self.proc_root = proc_root
        self.cached: tuple[int, int] | None = None
        self._next_ns = 0
        self._last: dict[int, int] = {}  # live child pid -> its delay when last read
        self._carried = 0  # what children that ended had counted

    def reset(self) -> None:
        """A forked child starts over (its own figures, read on its first publish)."""
        self.cached = None
        self._next_ns = 0
        self._last = {}
        self._carried = 0

    def _read_now(self) -> tuple[int, int]:
        me = str(os.getpid())
        main = run_delay_ns(read_small(os.path.join(self.proc_root, me, "schedstat")))
        current: dict[int, int] = {}
        for pid in self._children(me)[:MAX_CHILDREN]:
            try:
                current[pid] = run_delay_ns(read_small(os.path.join(self.proc_root, str(pid), "schedstat")))
            except (OSError, ValueError):
                continue  # ended meanwhile
        for pid, value in self._last.items():
            if pid not in current:
                self._carried += value  # ended: keep what it had counted
            elif current[pid] < value:
                self._carried += value  # a new process under a reused pid
        self._last = current
        return main, self._carried + sum(current.values())

    def _children(self, me: str) -> list[int]:
        task_dir = os.path.join(self.proc_root, me, "task")
        out: list[int] = []
        for tid in os.listdir(task_dir)[:MAX_THREADS_SCANNED]:
            try:
                text = read_small(os.path.join(task_dir, tid, "children"))
            except OSError:
                continue  # the thread ended, or the kernel offers no children file
            out.extend(int(c) for c in text.split() if c.isdigit())
        return out
