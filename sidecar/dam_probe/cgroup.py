"""CPU and memory figures of the training process's own cgroup, read from inside the process.

The sidecar usually cannot see the training container's cgroup (each container
has its own cgroup namespace), but the training process sees its own at
``/sys/fs/cgroup``. The probe reads it here, at publish time only (never per
batch), at most once per ``REFRESH_NS``, and publishes what it read in the probe
file (``dam_probe.layout``, flag bit 1).

- cgroup v2 (``cgroup.controllers`` at the root): ``cpu.stat`` ``throttled_usec``
  and ``cpu.max`` (``"quota period"`` or ``"max period"``).
- cgroup v1: the ``cpu,cpuacct`` (or ``cpu``) hierarchy: ``cpu.stat``
  ``throttled_time`` (ns) and ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``.

Memory (``MemoryReader``, same rules): cgroup v2 ``memory.current``,
``memory.max`` (``max`` = no limit) and the ``oom_kill`` line of
``memory.events``; cgroup v1 (the ``memory`` hierarchy) ``memory.usage_in_bytes``,
``memory.limit_in_bytes`` (a value of 2^60 or more = no limit) and the
``oom_kill`` line of ``memory.oom_control`` (kernels before 4.13 lack it: 0).

The parsers below are shared with the sidecar's samplers
(``dam_sidecar.samplers.cpu`` and ``dam_sidecar.samplers.memory``): one set of
cgroup parsers in the code base.

The directory is the process's cgroup from ``/proc/self/cgroup`` when that path
exists below the root (a host, or a container that shares the host's cgroup
namespace), else the root itself (a container with its own cgroup namespace or
a v1 bind mount, where the root *is* the container's cgroup).

Nothing here raises: any failure makes ``read`` return None (the fields stay
invalid) and the next attempt waits ``RETRY_NS``, so a process without a
readable cgroup pays a few failed ``stat`` calls a minute. Standard library only.
"""

from __future__ import annotations

import os
from typing import ClassVar, Final, TypeVar

from dam_probe import process
from dam_probe.process import Refreshing

REFRESH_NS: Final = process.REFRESH_NS  # at most one read per second (the process readers' pace)
RETRY_NS: Final = process.RETRY_NS  # after a failure ("no cgroup here"), try again a minute later
ENV_ROOT: Final = "DAM_PROBE_CGROUP_ROOT"
DEFAULT_ROOT: Final = "/sys/fs/cgroup"
PROC_SELF_CGROUP: Final = "/proc/self/cgroup"
_U64_MAX: Final = 2**64 - 1
T = TypeVar("T")

CgroupCpu = tuple[int, int, int]  # (throttled ns, limit millicores (0 = none), cgroup id)
CgroupMemory = tuple[int, int, int, int]  # (usage bytes, limit bytes (0 = none), OOM kills, cgroup id)


V1_CPU_HIERARCHIES: Final = ("cpu,cpuacct", "cpu", "cpuacct,cpu")
V1_MEMORY_HIERARCHY: Final = "memory"
V1_UNLIMITED_BYTES: Final = 2**60  # v1 reports "no limit" as a huge page-rounded number


def _read_text(path: str) -> str:
    with open(path, encoding="ascii", errors="replace") as fh:
        return fh.read(4096)


# -- parsers shared with the sidecar's CPU sampler (dam_sidecar.samplers.cpu) -------------


def is_v2(root: str) -> bool:
    """Whether ``root`` is a cgroup v2 (unified) mount."""
    return os.path.exists(os.path.join(root, "cgroup.controllers"))


def v1_cpu_root(root: str) -> str | None:
    """The cgroup v1 ``cpu`` hierarchy under ``root`` (its directory name varies), or None."""
    for name in V1_CPU_HIERARCHIES:
        path = os.path.join(root, name)
        if os.path.isdir(path):
            return path
    return None


def v1_memory_root(root: str) -> str | None:
    """The cgroup v1 ``memory`` hierarchy under ``root``, or None."""
    path = os.path.join(root, V1_MEMORY_HIERARCHY)
    return path if os.path.isdir(path) else None


def cgroup_directory(
    proc_cgroup_text: str, base: str, v2: bool, controller: str = "cpu", marker: str = "cpu.stat"
) -> str | None:
    """The process's cgroup directory under ``base``, from its ``/proc/<pid>/cgroup`` text.

    ``base`` is the v2 root or the v1 hierarchy of ``controller`` (``cpu`` or
    ``memory``). None when the path lies outside ``base`` (another container's
    cgroup namespace: ``0::/../…``) or has no ``marker`` file (``cpu.stat``,
    ``memory.current``, ``memory.usage_in_bytes``).
    """
    for line in proc_cgroup_text.splitlines():
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if (v2 and hid == "0" and controllers == "") or (not v2 and controller in controllers.split(",")):
            candidate = os.path.normpath(os.path.join(base, path.lstrip("/")))
            inside = candidate == base or candidate.startswith(base.rstrip("/") + "/")
            if inside and os.path.exists(os.path.join(candidate, marker)):
                return candidate
            return None
    return None


def memory_files(v2: bool) -> tuple[str, str, str]:
    """The (usage, limit, events) file names of a memory cgroup."""
    if v2:
        return "memory.current", "memory.max", "memory.events"
    return "memory.usage_in_bytes", "memory.limit_in_bytes", "memory.oom_control"


def memory_bytes(text: str) -> int:
    """``memory.current`` / ``memory.usage_in_bytes``: one integer; raises ValueError."""
    value = int(text.strip())
    if value < 0:
        raise ValueError(f"negative memory figure {value}")
    return value


def memory_limit_bytes(text: str) -> int | None:
    """``memory.max`` (``max``) or ``memory.limit_in_bytes`` (≥ 2^60): None when unlimited."""
    raw = text.strip()
    if raw == "max":
        return None
    value = memory_bytes(raw)
    return None if value >= V1_UNLIMITED_BYTES else value


def oom_kills(events_text: str) -> int:
    """The ``oom_kill`` count of ``memory.events`` (v2) or ``memory.oom_control`` (v1); 0 when absent.

    Kernels before 4.13 have no ``oom_kill`` line in v1's ``memory.oom_control``.
    """
    for line in events_text.splitlines():
        name, _, value = line.strip().partition(" ")
        if name == "oom_kill":
            return int(value)
    return 0


def throttled_ns(cpu_stat_text: str, v2: bool) -> int:
    """Cumulative throttled time from ``cpu.stat``; raises KeyError or ValueError."""
    key = "throttled_usec" if v2 else "throttled_time"
    for line in cpu_stat_text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value) * 1000 if v2 else int(value)
    raise KeyError(key)


def limit_cores_v2(cpu_max_text: str) -> float | None:
    """The limit in cores from ``cpu.max`` (``"quota period"``); None for ``max`` (no limit)."""
    quota, _, period = cpu_max_text.strip().partition(" ")
    if quota == "max":
        return None
    return limit_cores_v1(int(quota), int(period or "100000"))


def limit_cores_v1(quota_us: int, period_us: int) -> float | None:
    """The limit in cores from ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``; None for no limit."""
    if quota_us <= 0 or period_us <= 0:
        return None
    return quota_us / period_us


def _millicores(cores: float | None) -> int:
    return 0 if cores is None else max(1, round(cores * 1000))


class _CachedReader(Refreshing[T]):
    """Reads one controller's fields of this process's cgroup; ``read(now_ns)`` caches between
    refreshes: at most one read per ``REFRESH_NS``, a failure is retried after ``RETRY_NS`` (and
    the directory resolved again), nothing raises. Subclasses name the controller and implement
    ``_read_now``."""

    __slots__ = ("_directory", "_v2", "proc_self_cgroup", "root")

    controller: ClassVar[str]
    marker: ClassVar[str]  # a file that exists in every cgroup directory of the controller (v1)
    KEPT_AFTER_FORK: ClassVar[frozenset[str]] = frozenset({"proc_self_cgroup", "root"})  # settings

    def __init__(self, root: str | None = None, proc_self_cgroup: str = PROC_SELF_CGROUP) -> None:
        self.root = root  # None: $DAM_PROBE_CGROUP_ROOT, else /sys/fs/cgroup (looked up on first read)
        self.proc_self_cgroup = proc_self_cgroup
        self._directory: str | None = None
        self._v2 = False
        self._next_ns = 0
        self.cached = None

    def reset(self) -> None:
        """Forget the directory and the cached value (after a fork: read again on the next publish)."""
        self._directory = None
        self._v2 = False  # found again with the directory
        self._next_ns = 0
        self.cached = None

    def _failed(self) -> None:
        self._directory = None  # resolve again at the next attempt

    # -- internals ---------------------------------------------------------------

    def _v1_root(self, root: str) -> str | None:
        raise NotImplementedError

    def _resolve(self) -> str:
        root = self.root
        if root is None:
            root = os.environ.get(ENV_ROOT, "").strip() or DEFAULT_ROOT
        root = os.path.normpath(root)
        self._v2 = is_v2(root)
        base = root if self._v2 else self._v1_root(root)
        if base is None:
            raise FileNotFoundError(f"no cgroup v2 root and no v1 {self.controller} hierarchy under {root}")
        try:
            text = _read_text(self.proc_self_cgroup)
        except OSError:
            text = ""
        return cgroup_directory(text, base, self._v2, self.controller, self._marker()) or base

    def _marker(self) -> str:
        return self.marker

    def _directory_now(self) -> str:
        directory = self._directory
        if directory is None:
            directory = self._directory = self._resolve()
        return directory


class CgroupReader(_CachedReader[CgroupCpu]):
    """The CPU fields: ``(throttled_ns, limit_millicores, cgroup_id)``."""

    __slots__ = ()
    controller = "cpu"
    marker = "cpu.stat"

    def _v1_root(self, root: str) -> str | None:
        return v1_cpu_root(root)

    def _read_now(self) -> CgroupCpu:
        directory = self._directory_now()
        throttled = throttled_ns(_read_text(os.path.join(directory, "cpu.stat")), self._v2)
        if self._v2:
            cores = limit_cores_v2(_read_text(os.path.join(directory, "cpu.max")))
        else:
            quota = int(_read_text(os.path.join(directory, "cpu.cfs_quota_us")).strip())
            period = int(_read_text(os.path.join(directory, "cpu.cfs_period_us")).strip())
            cores = limit_cores_v1(quota, period)
        limit = _millicores(cores)
        cgroup_id = os.stat(directory).st_ino
        if not (0 <= throttled <= _U64_MAX and 0 <= limit <= _U64_MAX and 0 <= cgroup_id <= _U64_MAX):
            raise ValueError("cgroup value out of range")
        return throttled, limit, cgroup_id


class MemoryReader(_CachedReader[CgroupMemory]):
    """The memory fields: ``(usage, limit (0 = none), oom_kills, cgroup_id)``."""

    __slots__ = ()
    controller = "memory"
    marker = ""

    def _v1_root(self, root: str) -> str | None:
        return v1_memory_root(root)

    def _marker(self) -> str:
        return memory_files(self._v2)[0]

    def _read_now(self) -> CgroupMemory:
        directory = self._directory_now()
        usage_file, limit_file, events_file = memory_files(self._v2)
        usage = memory_bytes(_read_text(os.path.join(directory, usage_file)))
        limit = memory_limit_bytes(_read_text(os.path.join(directory, limit_file)))
        kills = oom_kills(_read_text(os.path.join(directory, events_file)))
        cgroup_id = os.stat(directory).st_ino
        values = (usage, limit or 0, kills, cgroup_id)
        if not all(0 <= v <= _U64_MAX for v in values):
            raise ValueError("cgroup value out of range")
        return values
