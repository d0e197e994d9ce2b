"""Probe reader: sums the probe files of the training processes into monotonic counters.

It also gathers what the probes publish about their own cgroup (CFS throttled
time and CPU limit), for when the sidecar cannot read the training container's
cgroup itself. Several training processes of one container share one cgroup
and publish the same kernel counter, so those values are never summed per
process: they are keyed by the cgroup id the probe publishes. Per cgroup the
reader keeps the highest throttled value any process ever published (a
high-water mark: processes publish at different moments, so a lower value is
an older reading, not a reset), and the total is the sum of the high-water
marks over every cgroup seen. A restarted container gets a new cgroup (new id,
counter from zero) and so adds to the total instead of lowering it; a trainer
restarted inside the same container keeps its cgroup and continues its mark.
The total is therefore monotonic by construction.
"""

from __future__ import annotations

import errno
import glob
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from dam_probe.layout import FILE_PREFIX, FILE_SUFFIX, ProbeFormatError, ProbeRecord, read_file
from dam_sidecar.errors import ErrorLog

SAMPLER = "probe"

Key = tuple[int, int]  # (pid, start_time_ns)
MAX_CGROUPS = 256  # high-water marks kept; older ones are folded into a carried total


@dataclass(frozen=True)
class ProbeSample:
    """Totals over every training process seen since the sidecar started (monotonic)."""

    steps: int = 0
    wait_seconds: float = 0.0
    step_seconds: float = 0.0
    up: bool = False
    live_pids: tuple[int, ...] = ()
    device_uuids: tuple[str, ...] = ()
    batch_size: int = 0
    flops_per_step: float = 0.0
    files: int = 0
    # From the probes' own cgroup reads; None until a probe published them.
    cgroup_throttled_seconds: float | None = None  # monotonic, summed over distinct cgroups
    cgroup_limit_cores: float | None = None  # live cgroups only; None when unlimited or unknown


class ProbeSource(Protocol):
    def sample(self) -> ProbeSample: ...


@dataclass
class _Totals:
    steps: int = 0
    wait_ns: int = 0
    step_ns: int = 0

    def add(self, r: ProbeRecord) -> None:
        self.steps += r.steps
        self.wait_ns += r.wait_ns
        self.step_ns += r.step_ns


def classify(error: ProbeFormatError) -> str:
    """A bounded ``reason`` label for a probe file that cannot be read."""
    text = str(error)
    if "truncated" in text:
        return "truncated"
    if "unsupported layout version" in text:
        return "wrong_version"
    if "bad magic" in text:
        return "bad_magic"
    if "writer busy" in text:
        return "busy"
    return "corrupt"


@dataclass
class ProbeReader:
    """Reads ``probe-*.bin`` in ``probe_dir`` each tick.

    Exported counters never go down: the last totals of a process that ended
    (its file was closed, removed, or replaced by a new process with the same
    pid, or its pid is gone and the file went stale) are folded into a carried
    total, and the file of a finished process is deleted once folded in.
    """

    probe_dir: str
    errors: ErrorLog
    proc_root: str = "/proc"
    stale_seconds: float = 60.0
    clock_ns: Callable[[], int] = time.time_ns
    remove: Callable[[str], None] = os.remove
    cleanup: bool = True
    _carried: _Totals = field(default_factory=_Totals)
    _last: dict[Key, ProbeRecord] = field(default_factory=dict)
    _folded: set[Key] = field(default_factory=set)
    _cgroup_marks: dict[int, int] = field(default_factory=dict)  # cgroup id -> highest throttled ns
    _cgroup_carried_ns: int = 0

    def _mark_cgroup(self, r: ProbeRecord) -> None:
        if r.cgroup_throttled_ns is None:
            return
        key = r.cgroup_id or 0
        if r.cgroup_throttled_ns > self._cgroup_marks.get(key, -1):
            self._cgroup_marks[key] = r.cgroup_throttled_ns
        while len(self._cgroup_marks) > MAX_CGROUPS:
            oldest = next(iter(self._cgroup_marks))
            self._cgroup_carried_ns += self._cgroup_marks.pop(oldest)

    def _cgroup_totals(self, live: dict[Key, ProbeRecord]) -> tuple[float | None, float | None]:
        throttled = (
            (self._cgroup_carried_ns + sum(self._cgroup_marks.values())) / 1e9
            if self._cgroup_marks or self._cgroup_carried_ns
            else None
        )
        newest: dict[int, ProbeRecord] = {}
        for r in live.values():
            if r.cgroup_throttled_ns is None:
                continue
            key = r.cgroup_id or 0
            if key not in newest or r.last_update_ns > newest[key].last_update_ns:
                newest[key] = r
        limits = [r.cgroup_limit_cores for r in newest.values()]
        # One unlimited cgroup makes the whole unlimited; otherwise distinct cgroups add up.
        limit = sum(v for v in limits if v is not None) if limits and None not in limits else None
        return throttled, limit

    def _pid_alive(self, pid: int) -> bool:
        return os.path.exists(os.path.join(self.proc_root, str(pid)))

    def _finished(self, r: ProbeRecord, now_ns: int) -> bool:
        if r.closed:
            return True
        if self._pid_alive(r.pid):
            return False
        return (now_ns - r.last_update_ns) / 1e9 > self.stale_seconds

    def _fold(self, key: Key) -> None:
        last = self._last.pop(key, None)
        if last is not None:
            self._carried.add(last)

    def sample(self) -> ProbeSample:
        now_ns = self.clock_ns()
        if not os.path.isdir(self.probe_dir):
            self.errors.record(SAMPLER, "missing_dir", f"probe directory {self.probe_dir} does not exist")
            paths: list[str] = []
        else:
            paths = sorted(
                glob.glob(os.path.join(glob.escape(self.probe_dir), f"{FILE_PREFIX}*{FILE_SUFFIX}"))
            )
        current: dict[Key, ProbeRecord] = {}
        for path in paths:
            try:
                rec = read_file(path)
            except FileNotFoundError:
                continue  # removed between the listing and the read: the process ended
            except ProbeFormatError as exc:
                self.errors.record(SAMPLER, classify(exc), f"{path}: {exc}")
                continue
            except OSError as exc:
                self.errors.record(SAMPLER, "io", f"{path}: {exc.strerror or exc}")
                continue
            key = (rec.pid, rec.start_time_ns)
            if key in self._folded:
                continue
            self._mark_cgroup(rec)
            prev = self._last.get(key)
            if prev is not None and (
                rec.steps < prev.steps or rec.wait_ns < prev.wait_ns or rec.step_ns < prev.step_ns
            ):
                # Same process, counters went back: treat it as a reset, keep what it had.
                self.errors.record(SAMPLER, "counter_reset", f"{path}: counters decreased, carrying over")
                self._fold(key)
            if self._finished(rec, now_ns):
                self._last[key] = rec
                self._fold(key)
                self._folded.add(key)
                self._remove(path)
                continue
            current[key] = rec
        # Processes whose file vanished (or was replaced under the same pid) ended: keep their totals.
        for key in [k for k in self._last if k not in current]:
            self._fold(key)
        self._last.update(current)
        self._prune_folded(paths)

        steps = self._carried.steps + sum(r.steps for r in current.values())
        wait_ns = self._carried.wait_ns + sum(r.wait_ns for r in current.values())
        step_ns = self._carried.step_ns + sum(r.step_ns for r in current.values())
        newest = max(current.values(), key=lambda r: r.last_update_ns, default=None)
        uuids: list[str] = []
        for r in sorted(current.values(), key=lambda r: r.pid):
            for u in r.device_uuids:
                if u and u not in uuids:
                    uuids.append(u)
        cgroup_throttled, cgroup_limit = self._cgroup_totals(current)
        return ProbeSample(
            steps=steps,
            wait_seconds=wait_ns / 1e9,
            step_seconds=step_ns / 1e9,
            up=bool(current),
            live_pids=tuple(sorted({r.pid for r in current.values()})),
            device_uuids=tuple(uuids),
            batch_size=newest.batch_size if newest else 0,
            flops_per_step=newest.flops_per_step if newest else 0.0,
            files=len(paths),
            cgroup_throttled_seconds=cgroup_throttled,
            cgroup_limit_cores=cgroup_limit,
        )

    def _remove(self, path: str) -> None:
        """Delete a finished process's file; on a read-only directory stop trying (one error)."""
        if not self.cleanup:
            return
        try:
            self.remove(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
                self.cleanup = False
                self.errors.record(
                    SAMPLER,
                    "read_only_dir",
                    f"cannot remove finished probe files in {self.probe_dir} ({exc.strerror or exc}); "
                    "they are kept and ignored from now on",
                )
            else:
                self.errors.record(SAMPLER, "cleanup", f"cannot remove {path}: {exc.strerror or exc}")

    def _prune_folded(self, paths: list[str]) -> None:
        """Forget folded keys whose file is gone, so the set stays as small as the directory."""
        if not self._folded:
            return
        present: set[int] = set()
        for p in paths:
            name = os.path.basename(p)[len(FILE_PREFIX) : -len(FILE_SUFFIX)]
            if name.isdigit():
                present.add(int(name))
        self._folded = {k for k in self._folded if k[0] in present}
