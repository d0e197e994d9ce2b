"""CPU throttling and limit of the training process's own cgroup, read from inside the process.

The sidecar usually cannot see the training container's cgroup (each container
has its own cgroup namespace), but the training process sees its own at
``/sys/fs/cgroup``. The probe reads it here, at publish time only (never per
batch), at most once per ``REFRESH_NS``, and publishes what it read in the probe
file (``dam_probe.layout``, flag bit 1).

- cgroup v2 (``cgroup.controllers`` at the root): ``cpu.stat`` ``throttled_usec``
  and ``cpu.max`` (``"quota period"`` or ``"max period"``).
- cgroup v1: the ``cpu,cpuacct`` (or ``cpu``) hierarchy: ``cpu.stat``
  ``throttled_time`` (ns) and ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``.

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
from typing import Final

ENV_ROOT: Final = "DAM_PROBE_CGROUP_ROOT"
DEFAULT_ROOT: Final = "/sys/fs/cgroup"
PROC_SELF_CGROUP: Final = "/proc/self/cgroup"
REFRESH_NS: Final = 1_000_000_000  # at most one read per second
RETRY_NS: Final = 60_000_000_000  # after a failure ("no cgroup here"), try again a minute later
_U64_MAX: Final = 2**64 - 1

CgroupCpu = tuple[int, int, int]  # (throttled ns, limit millicores (0 = none), cgroup id)


def _read_text(path: str) -> str:
    with open(path, encoding="ascii", errors="replace") as fh:
        return fh.read(4096)


def _stat_field(text: str, key: str) -> int:
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    raise KeyError(key)


def _millicores(quota: int, period: int) -> int:
    if quota <= 0 or period <= 0:
        return 0
    return max(1, round(quota * 1000 / period))


def _inside(candidate: str, base: str) -> bool:
    return candidate == base or candidate.startswith(base.rstrip("/") + "/")


class CgroupReader:
    """Reads the CPU fields of this process's cgroup; ``read(now_ns)`` caches between refreshes."""

    __slots__ = ("_directory", "_next_ns", "_v2", "_value", "proc_self_cgroup", "root")

    def __init__(self, root: str | None = None, proc_self_cgroup: str = PROC_SELF_CGROUP) -> None:
        self.root = root  # None: $DAM_PROBE_CGROUP_ROOT, else /sys/fs/cgroup (looked up on first read)
        self.proc_self_cgroup = proc_self_cgroup
        self._directory: str | None = None
        self._v2 = False
        self._next_ns = 0
        self._value: CgroupCpu | None = None

    def reset(self) -> None:
        """Forget the directory and the cached value (after a fork: read again on the next publish)."""
        self._directory = None
        self._next_ns = 0
        self._value = None

    def read(self, now_ns: int) -> CgroupCpu | None:
        """The latest ``(throttled_ns, limit_millicores, cgroup_id)``, or None when unknown; never raises."""
        if now_ns < self._next_ns:
            return self._value
        try:
            self._value = self._read_now()
            self._next_ns = now_ns + REFRESH_NS
        except Exception:
            self._value = None
            self._directory = None  # resolve again at the next attempt
            self._next_ns = now_ns + RETRY_NS
        return self._value

    # -- internals ---------------------------------------------------------------

    def _resolve(self) -> str:
        root = self.root
        if root is None:
            root = os.environ.get(ENV_ROOT, "").strip() or DEFAULT_ROOT
        root = os.path.normpath(root)
        self._v2 = os.path.exists(os.path.join(root, "cgroup.controllers"))
        if self._v2:
            base = root
        else:
            for name in ("cpu,cpuacct", "cpu", "cpuacct,cpu"):
                if os.path.isdir(os.path.join(root, name)):
                    base = os.path.join(root, name)
                    break
            else:
                raise FileNotFoundError(f"no cgroup v2 root and no v1 cpu hierarchy under {root}")
        directory = base
        try:
            lines = _read_text(self.proc_self_cgroup).splitlines()
        except OSError:
            lines = []
        for line in lines:
            hid, _, rest = line.partition(":")
            controllers, _, path = rest.partition(":")
            if (self._v2 and hid == "0" and controllers == "") or (
                not self._v2 and "cpu" in controllers.split(",")
            ):
                candidate = os.path.normpath(os.path.join(base, path.lstrip("/")))
                if _inside(candidate, base) and os.path.exists(os.path.join(candidate, "cpu.stat")):
                    directory = candidate
                break
        return directory

    def _read_now(self) -> CgroupCpu:
        directory = self._directory
        if directory is None:
            directory = self._directory = self._resolve()
        stat = _read_text(os.path.join(directory, "cpu.stat"))
        if self._v2:
            throttled = _stat_field(stat, "throttled_usec") * 1000
            quota_text, _, period_text = _read_text(os.path.join(directory, "cpu.max")).strip().partition(" ")
            period = int(period_text or "100000")
            limit = 0 if quota_text == "max" else _millicores(int(quota_text), period)
        else:
            throttled = _stat_field(stat, "throttled_time")
            quota = int(_read_text(os.path.join(directory, "cpu.cfs_quota_us")).strip())
            period = int(_read_text(os.path.join(directory, "cpu.cfs_period_us")).strip())
            limit = _millicores(quota, period)
        cgroup_id = os.stat(directory).st_ino
        if not (0 <= throttled <= _U64_MAX and 0 <= limit <= _U64_MAX and 0 <= cgroup_id <= _U64_MAX):
            raise ValueError("cgroup value out of range")
        return throttled, limit, cgroup_id
