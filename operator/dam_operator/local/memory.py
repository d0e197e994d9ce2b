"""``dam run``'s view of its command's memory cgroup: the reading that survives the command.

The sidecar's samplers find the training container's memory cgroup through the
training process (``/proc/<pid>/cgroup``). That is right in a pod, but in local
mode the most important reading comes *after* the command exited: a DataLoader
worker that the kernel OOM-kills makes the training process raise and exit
within milliseconds, usually between two samples, so the only snapshot that
shows the kill is the one taken after the exit — when there is no training
process left to find the cgroup by.

``dam run``'s command inherits ``dam run``'s own memory cgroup, so ``dam run``
reads that one itself (``OwnMemoryCgroup``) and, for as long as the command
still shares it, puts the reading in every snapshot in place of the samplers'
(``MemoryCgroupSource``, ``with_container_memory``): one source for the whole
run, so the OOM-kill counter's increases stay exact.

The parsers are the probe's (``dam_probe.cgroup``): one set of cgroup parsers in
the code base. Nothing here raises on a missing or unreadable cgroup: the
reading is None and the samplers' figures are kept.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

from dam_contract import names
from dam_contract.snapshot import Sample, Snapshot
from dam_operator.local.child import SnapshotSource
from dam_probe import cgroup

CONTAINER_MEMORY_SERIES: frozenset[str] = frozenset(
    {
        names.CONTAINER_MEMORY_USAGE_BYTES,
        names.CONTAINER_MEMORY_LIMIT_BYTES,
        names.CONTAINER_OOM_KILLS_TOTAL,
    }
)
"""The series a reading of the memory cgroup replaces in a snapshot."""


@dataclass(frozen=True)
class MemoryReading:
    """One reading of a memory cgroup."""

    usage_bytes: float
    limit_bytes: float | None
    """None: no limit."""
    oom_kills: float
    """The kernel's cumulative count of processes it OOM-killed in the cgroup."""


def memory_cgroup_directory(proc_cgroup_text: str, root: str) -> str | None:
    """The memory cgroup directory of a ``/proc/<pid>/cgroup`` text under ``root`` (v2 or v1).

    None when the cgroup is not visible under ``root`` (another cgroup namespace) or has no
    memory files (cgroup v2 without the memory controller enabled for it).
    """
    v2 = cgroup.is_v2(root)
    base = root if v2 else cgroup.v1_memory_root(root)
    if base is None:
        return None
    return cgroup.cgroup_directory(proc_cgroup_text, base, v2, "memory", cgroup.memory_files(v2)[0])


PF_EXITING = 0x4
"""``/proc/<pid>/stat`` flags: the process is exiting (``include/linux/sched.h``)."""


def live(stat_fields_after_comm: list[str]) -> bool:
    """Whether a ``/proc/<pid>/stat`` (its fields after the command name) is a process not exiting."""
    try:
        state, flags = stat_fields_after_comm[0], int(stat_fields_after_comm[6])
    except (IndexError, ValueError):
        return False
    return state not in ("Z", "X", "x") and not flags & PF_EXITING


def read_memory_cgroup(directory: str, v2: bool) -> MemoryReading:
    """Usage, limit and OOM kills of one memory cgroup; raises OSError or ValueError."""
    usage_file, limit_file, events_file = cgroup.memory_files(v2)

    def text(name: str) -> str:
        with open(os.path.join(directory, name), encoding="ascii", errors="replace") as fh:
            return fh.read(65536)

    limit = cgroup.memory_limit_bytes(text(limit_file))
    return MemoryReading(
        usage_bytes=float(cgroup.memory_bytes(text(usage_file))),
        limit_bytes=None if limit is None else float(limit),
        oom_kills=float(cgroup.oom_kills(text(events_file))),
    )


class OwnMemoryCgroup:
    """This process's memory cgroup (which the command it starts inherits), read on demand.

    ``root`` defaults to ``$DAM_PROBE_CGROUP_ROOT``, else ``/sys/fs/cgroup``, as for the probe.
    """

    def __init__(self, root: str | None = None, proc_root: str = "/proc") -> None:
        if root is None:
            root = os.environ.get(cgroup.ENV_ROOT, "").strip() or cgroup.DEFAULT_ROOT
        self.root = os.path.normpath(root)
        self.proc_root = proc_root
        self.v2 = cgroup.is_v2(self.root)
        self.directory = self.directory_of("self")

    def directory_of(self, pid: int | str) -> str | None:
        """The memory cgroup directory of a live process (``"self"``: this one); None when not visible.

        None too for a process that is exiting or has exited: the kernel moves it to the root
        cgroup as it exits (cgroup v1), before it becomes a zombie.
        """
        try:
            with open(os.path.join(self.proc_root, str(pid), "cgroup"), encoding="ascii") as fh:
                text = fh.read()
            # Read after the cgroup file: a process not exiting now was not exiting then.
            with open(os.path.join(self.proc_root, str(pid), "stat"), encoding="ascii") as fh:
                fields = fh.read().rpartition(")")[2].split()
        except (OSError, UnicodeDecodeError):
            return None
        if not live(fields):
            return None
        return memory_cgroup_directory(text, self.root)

    def read(self) -> MemoryReading | None:
        """The cgroup's figures now; None when there is no readable memory cgroup."""
        if self.directory is None:
            return None
        try:
            return read_memory_cgroup(self.directory, self.v2)
        except (OSError, ValueError):
            return None


def with_container_memory(snap: Snapshot, reading: MemoryReading) -> Snapshot:
    """``snap`` with its container memory series (usage, limit, OOM kills) taken from ``reading``.

    An unlimited cgroup has no limit series, as from the sidecar.
    """
    samples = [s for name in sorted(snap.names() - CONTAINER_MEMORY_SERIES) for s in snap.samples(name)]
    samples.append(Sample(names.CONTAINER_MEMORY_USAGE_BYTES, (), reading.usage_bytes))
    if reading.limit_bytes is not None:
        samples.append(Sample(names.CONTAINER_MEMORY_LIMIT_BYTES, (), reading.limit_bytes))
    samples.append(Sample(names.CONTAINER_OOM_KILLS_TOTAL, (), reading.oom_kills))
    return Snapshot(samples, snap.timestamp_seconds)


def oom_killed(returncode: int | None, kills_before: float | None, kills_after: float | None) -> bool | None:
    """True when the command itself was OOM-killed: it died of SIGKILL and the cgroup counted a kill.

    None (not known) otherwise: a SIGKILL without a counted OOM kill was sent by someone; a
    counted kill of another process (a DataLoader worker) is the OOM-kill counter's evidence.
    """
    if returncode is None or returncode != -signal.SIGKILL:
        return None
    if kills_before is None or kills_after is None or kills_after <= kills_before:
        return None
    return True


class MemoryCgroupSource:
    """Wraps a snapshot source: the container memory series come from ``dam run``'s own cgroup.

    Only while the command shares that cgroup (it inherits it; a command that moves itself
    elsewhere — ``systemd-run --scope`` — keeps the samplers' figures from then on). The
    snapshot taken after the command exited then still has the cgroup's figures, its
    OOM kills included.
    """

    def __init__(self, inner: SnapshotSource, own: OwnMemoryCgroup, child_pid: int) -> None:
        self.inner = inner
        self.own = own
        self.child_pid = child_pid
        self.shared = own.directory is not None
        self.first: MemoryReading | None = None
        self.last: MemoryReading | None = None

    def _still_shared(self) -> bool:
        if self.shared:
            theirs = self.own.directory_of(self.child_pid)
            # Unreadable (the command has exited): the last answer stands.
            if theirs is not None and theirs != self.own.directory:
                self.shared = False
        return self.shared

    def snapshot(self) -> Snapshot:
        snap = self.inner.snapshot()
        if not self._still_shared():
            return snap
        reading = self.own.read()
        if reading is None:
            return snap
        if self.first is None:
            self.first = reading
        self.last = reading
        return with_container_memory(snap, reading)

    def close(self) -> None:
        self.inner.close()

    def oom_killed(self, returncode: int | None) -> bool | None:
        """Whether the command was OOM-killed (see ``oom_killed``), from this run's readings."""
        if self.first is None or self.last is None:
            return None
        return oom_killed(returncode, self.first.oom_kills, self.last.oom_kills)
