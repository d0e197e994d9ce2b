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
The total is therefore monotonic by construction. What the probes read about
their memory cgroup (usage, limit, OOM kills) is handled the same way: OOM
kills by high-water mark per memory cgroup, usage and limit from the newest
reading of each live cgroup.

Per rank: every counter is also kept per distributed rank (``RankSample``);
processes without a rank share the key ``None``. A process is counted under
the rank of its latest record; when that changes (a process that learns its
rank from ``torch.distributed`` after it started publishing), what it had
counted stays with the old key and only what it counts afterwards goes to the
new one, so no per-rank counter ever goes down.

Goodput: the probes' productive, start-up, other and checkpoint counters (layout flag bits 7
and 8) are carried like the others; a rank whose processes never published them reads None
(unknown), not zero. Its FLOPs per step are the newest live record's, declared or measured.
"""

from __future__ import annotations

import errno
import glob
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Generic, Protocol, TypeVar

from dam_probe.layout import (
    FILE_PREFIX,
    FILE_SUFFIX,
    PLACE_NAMES,
    RANK_TOTALS,
    NotRegularFileError,
    ProbeFormatError,
    ProbeRecord,
    read_file,
    total_key,
)
from dam_sidecar.errors import ErrorLog

SAMPLER = "probe"

Key = tuple[int, int]  # (pid, start_time_ns)
MAX_CGROUPS = 256  # high-water marks kept; older ones are folded into a carried total
RESTART_SLACK_NS = 1_000_000_000
"""A process that started up to this long before its rank's ended process last published still
replaces it (the ended one's last publish may come a little after its successor's start)."""
MAX_LIVES = 1024  # ended processes' latest records kept for ``ProbeReader.lives``


RankKey = int | None  # a distributed rank, or None for processes without one


V = TypeVar("V")
D = TypeVar("D")


class _Total(Generic[V, D]):
    """A typed view of one key of ``RankSample.totals``: ``kind(value)``, ``default`` when absent."""

    __slots__ = ("default", "key", "kind")

    def __init__(self, key: str, kind: Callable[[float], V], default: D) -> None:
        self.key, self.kind, self.default = key, kind, default

    def __get__(self, sample: RankSample | None, owner: type | None = None) -> V | D:
        value = None if sample is None else sample.totals.get(self.key)
        return self.default if value is None else self.kind(value)


@dataclass(frozen=True)
class RankSample:
    """Totals of the processes of one rank (``rank`` None: processes without a rank), monotonic."""

    rank: int | None
    totals: dict[str, float] = field(default_factory=dict)
    """The rank's summed figures (``dam_probe.layout.RANK_TOTALS``) in base units, by
    ``total_key`` (``steps``, ``wait_seconds``, ``collective_bytes``, ...), monotonic; a figure
    no process of the rank published yet (its collectives or saves not timed, no goodput
    accounting: an older probe) is absent, not zero. A family declared with
    ``sample="totals.<key>"`` exports it per rank (``collectors.probe``)."""
    batch_size: int = 0  # from the newest live record of this rank
    flops_per_step: float = 0.0
    live: bool = False
    flops_per_step_source: str = ""  # "declared", "measured" or "" (unknown), with flops_per_step
    # Progress since the latest save (flag bit 8): steps the rank's live processes took since their
    # latest save (all their steps when they saved none yet); None when no live process times saves.
    steps_since_checkpoint: int | None = None
    # Unix seconds the rank's latest save ended (kept after its process ended); None: no save seen.
    last_checkpoint_seconds: float | None = None
    # Why the rank's FLOPs are not counted (layout flag bit 10: FLOPS_REASON_*, its detail), while
    # flops_per_step is unknown; kept after the process ended. None: no reason (counted, pending).
    flops_unavailable: tuple[int, str] | None = None
    # Progress (layout flag bit 11): Unix seconds of the rank's latest batch (kept after its
    # process ended; None: none seen), the collectives its live process's training thread entered
    # (None: not published), and where the watchdog found that thread once a step was overdue
    # (``RankPlace``; None while steps come).
    last_batch_seconds: float | None = None
    collective_sequence: int | None = None
    place: RankPlace | None = None
    # The settings of the DataLoader the rank's newest live record last iterated (layout flag bit
    # 12): what an override made of it, also between epochs when its workers are gone. None: not
    # published (no DataLoader iterated yet, an older probe).
    loader: LoaderSettings | None = None
    # The precision the rank's counted step ran its matmul FLOPs in (layout flag bit 13:
    # PRECISION_*), kept after the process ended; None: unknown (not counted, declared FLOPs).
    flops_precision: int | None = None
    # Restarts inside the container (``ProbeReader._restarts``): processes that took the rank after
    # one of it ended (torchrun's --max-restarts, a retry loop), and the seconds from each ended
    # process's last publish to its successor's start. Counted for ranked processes only.
    restarts: int = 0
    restart_gap_seconds: float = 0.0
    # Unix seconds of the latest publish of the rank's processes (kept after they ended): when its
    # figures were taken (the sidecar's last words, ``dam_sidecar.farewell``). None: none seen.
    published_seconds: float | None = None
    # The steps since its latest save of the rank's process that ended last (every step when it
    # saved none); None: no ended process of the rank timed its saves. Not exported (the series
    # counts live processes); its last words' figure once no process of the rank is live.
    ended_steps_since_checkpoint: int | None = None

    # The totals the sidecar itself reads, typed (a figure only exported needs none of these).
    steps = _Total("steps", int, 0)
    wait_seconds = _Total("wait_seconds", float, 0.0)
    step_seconds = _Total("step_seconds", float, 0.0)
    collectives = _Total("collectives", int, None)
    """None until a process of this rank published collective counters."""
    collective_exposed_seconds = _Total("collective_exposed_seconds", float, 0.0)
    productive_seconds = _Total("productive_seconds", float, None)
    """None until a process of this rank published its goodput accounting."""
    startup_seconds = _Total("startup_seconds", float, 0.0)
    other_seconds = _Total("other_seconds", float, 0.0)
    checkpoint_seconds = _Total("checkpoint_seconds", float, None)
    """None until a process of this rank timed its saves."""
    checkpoints = _Total("checkpoints", int, 0)


@dataclass(frozen=True)
class LoaderSettings:
    """A DataLoader's settings as the probe read them from its iterator (None: not known)."""

    num_workers: int
    prefetch_factor: int | None = None
    pin_memory: bool | None = None
    persistent_workers: bool | None = None


def loader_of(r: ProbeRecord) -> LoaderSettings | None:
    if r.loader_num_workers is None:
        return None
    return LoaderSettings(
        r.loader_num_workers, r.loader_prefetch_factor, r.loader_pin_memory, r.loader_persistent_workers
    )


@dataclass(frozen=True)
class RankPlace:
    """Where a rank's watchdog found its training thread after its latest batch."""

    where: str
    """``PLACE_NAMES``' value: collective, dataloader, checkpoint, backward, optimizer, user-code."""
    detail: str
    frames: tuple[str, ...]


def place_of(r: ProbeRecord) -> RankPlace | None:
    """The place a record carries, read after its latest batch; None when none (steps come, an
    older probe, an unknown code)."""
    if not r.place_read_ns or r.place not in PLACE_NAMES or r.place_read_ns < (r.last_batch_ns or 0):
        return None
    frames = tuple(line for line in (r.place_frames or "").split("\n") if line)
    return RankPlace(PLACE_NAMES[r.place], r.place_detail or "", frames)


@dataclass(frozen=True)
class RankInfo:
    """The identity a live process publishes (``dam_process_rank_info``)."""

    rank: int
    local_rank: int | None
    world_size: int | None


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
    # Per rank, ordered by rank (None last); empty until a probe file was read.
    ranks: tuple[RankSample, ...] = ()
    rank_info: tuple[RankInfo, ...] = ()  # live processes with a rank, by rank
    # From the probes' own memory cgroup reads; None until a probe published them.
    memory_usage_bytes: float | None = None  # live cgroups, summed over distinct cgroups
    memory_limit_bytes: float | None = None  # None when one of them is unlimited or unknown
    oom_kills: float | None = None  # monotonic, summed over distinct cgroups
    # DataLoader workers the probes saw die (DataLoader's own error), summed over processes; monotonic.
    loader_worker_kills: float | None = None
    # The live processes' latest records, by pid (their CPU and memory figures, PID namespace).
    records: tuple[ProbeRecord, ...] = ()


class ProbeSource(Protocol):
    def sample(self) -> ProbeSample: ...


def _seconds(ns: int | None) -> float | None:
    return None if ns is None else ns / 1e9


def _since_save(rec: ProbeRecord) -> int | None:
    """The process's own steps since its latest save (every step when it saved none); None when
    it does not time its saves."""
    if rec.last_checkpoint_ns is None or rec.last_checkpoint_steps is None:
        return None
    done = rec.last_checkpoint_steps if rec.last_checkpoint_ns > 0 else 0
    return max(0, rec.steps - done)


_SUMMED: Final = tuple(name for name, _ in RANK_TOTALS)
_CORE: Final = frozenset(_SUMMED[:3])  # steps, wait and step time: in every record (version 1)
_KEYS: Final = tuple(
    (name, total_key(name, unit), 1e-9 if unit == "ns" else 1.0) for name, unit in RANK_TOTALS
)


class _Totals:
    """The summed figures (``RANK_TOTALS``) of one process or rank, raw (ns, counts)."""

    __slots__ = ("values",)

    def __init__(self, values: dict[str, int] | None = None) -> None:
        self.values = dict.fromkeys(_SUMMED, 0) if values is None else values

    @classmethod
    def of(cls, r: ProbeRecord) -> _Totals:
        return cls({name: getattr(r, name) or 0 for name in _SUMMED})

    def add(self, other: _Totals, sign: int = 1) -> None:
        mine, theirs = self.values, other.values
        for name in _SUMMED:
            mine[name] += sign * theirs[name]

    def minus(self, other: _Totals) -> _Totals:
        out = _Totals(dict(self.values))
        out.add(other, -1)
        return out

    def went_back(self, prev: _Totals) -> bool:
        return any(self.values[n] < prev.values[n] for n in _SUMMED)

    def in_base_units(self, known: set[str]) -> dict[str, float]:
        """``RankSample.totals``: the ``known`` figures by ``total_key``, in base units."""
        return {key: self.values[name] * scale for name, key, scale in _KEYS if name in known}


def _published_totals(r: ProbeRecord) -> set[str]:
    """The summed figures a record carries (not None: its flag bit set)."""
    return {name for name in _SUMMED if getattr(r, name) is not None}


@dataclass
class HighWater:
    """Per key (a cgroup, a process) the highest value any record published: processes publish at
    different moments, so a lower value is an older reading, not a reset. Past ``MAX_CGROUPS`` keys
    the oldest is folded into a carried total, so ``total()`` never goes down."""

    marks: dict[int | Key, int] = field(default_factory=dict)
    carried: int = 0

    def mark(self, key: int | Key, value: int | None) -> None:
        if value is None:
            return
        if value > self.marks.get(key, -1):
            self.marks[key] = value
        while len(self.marks) > MAX_CGROUPS:
            self.carried += self.marks.pop(next(iter(self.marks)))

    def total(self) -> int | None:
        """The carried total plus every mark; None until a value was marked."""
        if not self.marks and not self.carried:
            return None
        return self.carried + sum(self.marks.values())


def classify(error: ProbeFormatError) -> str:
    """A bounded ``reason`` label for a probe file that cannot be read."""
    if isinstance(error, NotRegularFileError):
        return "not_regular_file"
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
class RestartCounter:
    """Restarts inside the container, per rank: a live ranked process that started after a process
    of its rank ended took its place (torchrun restarting its workers, a retry loop), with the time
    from the ended one's last publish to its start. Counted once a process; a process without a
    rank is never one (``prep.py && train.py`` is no retry). Monotonic."""

    _ended_ns: dict[int, int] = field(default_factory=dict)  # rank -> its latest ended last publish
    _counted: set[Key] = field(default_factory=set)  # live processes counted as a restart
    _restarts: dict[int, int] = field(default_factory=dict)
    _gap_ns: dict[int, int] = field(default_factory=dict)

    def ended(self, key: Key, rank: RankKey, last: ProbeRecord | None) -> None:
        self._counted.discard(key)
        if last is not None and rank is not None and last.last_update_ns > self._ended_ns.get(rank, 0):
            self._ended_ns[rank] = last.last_update_ns

    def count(self, live: dict[Key, tuple[RankKey, ProbeRecord]]) -> None:
        for key, (rank, rec) in live.items():
            ended = self._ended_ns.get(rank) if rank is not None else None
            if ended is None or rank is None or key in self._counted:
                continue
            start = rec.process_start_ns or rec.start_time_ns
            if start + RESTART_SLACK_NS < ended:
                continue  # it ran beside the ended one: no replacement
            self._counted.add(key)
            self._restarts[rank] = self._restarts.get(rank, 0) + 1
            self._gap_ns[rank] = self._gap_ns.get(rank, 0) + max(0, start - ended)

    def of(self, rank: RankKey) -> int:
        return self._restarts.get(rank, 0) if rank is not None else 0

    def gap_seconds(self, rank: RankKey) -> float:
        return self._gap_ns.get(rank, 0) / 1e9 if rank is not None else 0.0


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
    keep_lives: bool = False  # keep ended processes' latest records for ``lives`` (``dam run``)
    _carried: dict[RankKey, _Totals] = field(default_factory=dict)  # what ended processes counted
    _last: dict[Key, ProbeRecord] = field(default_factory=dict)
    _rank_of: dict[Key, RankKey] = field(default_factory=dict)  # the rank a live process counts under
    _base: dict[Key, _Totals] = field(default_factory=dict)  # its totals when it took that rank
    # The summed figures any process of each rank ever published (the rest are unknown, not 0).
    _known: dict[RankKey, set[str]] = field(default_factory=dict)
    # The latest FLOPs per step (and source) each rank published: kept after its process ended
    # (a model's FLOPs do not change when it stops; ``dam run``'s last sample comes after the exit).
    _flops_of: dict[RankKey, tuple[float, str]] = field(default_factory=dict)
    _flops_reason_of: dict[RankKey, tuple[int, str]] = field(default_factory=dict)  # why not, likewise
    _precision_of: dict[RankKey, int] = field(default_factory=dict)  # its matmul precision, likewise
    _last_save_of: dict[RankKey, int] = field(default_factory=dict)  # Unix ns of the rank's latest save
    _last_batch_of: dict[RankKey, int] = field(default_factory=dict)  # Unix ns of the rank's latest batch
    _published_of: dict[RankKey, int] = field(default_factory=dict)  # Unix ns of its latest publish
    _ended_since: dict[RankKey, int] = field(default_factory=dict)  # its last ended process's, likewise
    _folded: set[Key] = field(default_factory=set)
    _throttled: HighWater = field(default_factory=HighWater)  # cgroup id -> highest throttled ns
    _ooms: HighWater = field(default_factory=HighWater)  # memory cgroup id -> highest OOM kills
    # Process -> loader workers it saw die (each process's count only grows: a pid is counted once).
    _kills: HighWater = field(default_factory=HighWater)
    _restarts: RestartCounter = field(default_factory=RestartCounter)
    # The latest record of every process that ended (at most MAX_LIVES, the oldest dropped):
    # ``lives()`` (``dam run``'s restart accounting).
    _ended: list[ProbeRecord] = field(default_factory=list)

    def lives(self) -> list[ProbeRecord]:
        """The latest record of every training process seen, ended (with ``keep_lives``) or live,
        by start time."""
        return sorted([*self._ended, *self._last.values()], key=lambda r: (r.start_time_ns, r.pid))

    def _mark(self, key: Key, r: ProbeRecord) -> None:
        self._throttled.mark(r.cgroup_id or 0, r.cgroup_throttled_ns)
        self._ooms.mark(r.memory_cgroup_id or 0, r.oom_kills)
        self._kills.mark(key, r.loader_worker_kills)

    def _cgroup_totals(self, live: dict[Key, ProbeRecord]) -> tuple[float | None, float | None]:
        marked = self._throttled.total()
        throttled = marked / 1e9 if marked is not None else None
        newest = _newest_per_cgroup(live, _cpu_cgroup)
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

    def _memory_totals(self, live: dict[Key, ProbeRecord]) -> tuple[float | None, float | None, float | None]:
        marked = self._ooms.total()
        kills = float(marked) if marked is not None else None
        newest = _newest_per_cgroup(live, _memory_cgroup)
        if not newest:
            return None, None, kills
        usage = float(sum(r.memory_usage_bytes or 0 for r in newest.values()))
        limits = [r.memory_limit_bytes for r in newest.values()]
        limit = float(sum(v for v in limits if v)) if all(limits) else None  # 0: unlimited
        return usage, limit, kills

    def _fold(self, key: Key) -> None:
        """A process ended (or reset): what it counted since it took its rank stays with that rank."""
        last = self._last.pop(key, None)
        rank = self._rank_of.pop(key, None)
        base = self._base.pop(key, None) or _Totals()
        self._restarts.ended(key, rank, last)
        if last is not None:
            self._carried.setdefault(rank, _Totals()).add(_Totals.of(last).minus(base))
            self._published_of[rank] = max(self._published_of.get(rank, 0), last.last_update_ns)
            if (since := _since_save(last)) is not None:
                self._ended_since[rank] = since
            if self.keep_lives:
                self._ended.append(last)
                del self._ended[:-MAX_LIVES]

    def _adopt(self, key: Key, rec: ProbeRecord) -> None:
        """Counts a live process under the rank of its latest record (see the module docstring)."""
        self._known.setdefault(rec.rank, set()).update(_published_totals(rec))
        if key not in self._rank_of:
            self._rank_of[key] = rec.rank
            self._base[key] = _Totals()
            return
        old = self._rank_of[key]
        if old == rec.rank:
            return
        prev = self._last.get(key)
        moved = _Totals.of(prev) if prev is not None else _Totals()
        self._carried.setdefault(old, _Totals()).add(moved.minus(self._base[key]))
        self._rank_of[key] = rec.rank
        self._base[key] = moved

    def sample(self) -> ProbeSample:
        now_ns = self.clock_ns()
        paths = self._paths()
        current: dict[Key, ProbeRecord] = {}
        for path in paths:
            rec = self._read(path)
            if rec is not None:
                self._take(path, rec, now_ns, current)
        # Processes whose file vanished (or was replaced under the same pid) ended: keep their totals.
        for key in [k for k in self._last if k not in current]:
            self._fold(key)
        self._prune_folded(paths)
        self._restarts.count({k: (self._rank_of.get(k, r.rank), r) for k, r in current.items()})
        return self._summary(current, len(paths))

    def _paths(self) -> list[str]:
        if not os.path.isdir(self.probe_dir):
            self.errors.record(SAMPLER, "missing_dir", f"probe directory {self.probe_dir} does not exist")
            return []
        return sorted(glob.glob(os.path.join(glob.escape(self.probe_dir), f"{FILE_PREFIX}*{FILE_SUFFIX}")))

    def _read(self, path: str) -> ProbeRecord | None:
        try:
            return read_file(path)
        except FileNotFoundError:
            return None  # removed between the listing and the read: the process ended
        except ProbeFormatError as exc:
            self.errors.record(SAMPLER, classify(exc), f"{path}: {exc}")
        except OSError as exc:
            self.errors.record(SAMPLER, "io", f"{path}: {exc.strerror or exc}")
        return None

    def _take(self, path: str, rec: ProbeRecord, now_ns: int, current: dict[Key, ProbeRecord]) -> None:
        """One process's record: marked, adopted under its rank, folded in if it finished."""
        key = (rec.pid, rec.start_time_ns)
        if key in self._folded:
            return
        self._mark(key, rec)
        prev = self._last.get(key)
        if prev is not None and _Totals.of(rec).went_back(_Totals.of(prev)):
            # Same process, counters went back: treat it as a reset, keep what it had.
            self.errors.record(SAMPLER, "counter_reset", f"{path}: counters decreased, carrying over")
            self._fold(key)
        self._adopt(key, rec)
        self._last[key] = rec
        if self._finished(rec, now_ns):
            self._fold(key)
            self._folded.add(key)
            self._remove(path)
            return
        current[key] = rec

    def _summary(self, current: dict[Key, ProbeRecord], files: int) -> ProbeSample:
        ranks = self._rank_samples(current)
        newest = max(current.values(), key=lambda r: r.last_update_ns, default=None)
        cgroup_throttled, cgroup_limit = self._cgroup_totals(current)
        memory_usage, memory_limit, oom_kills = self._memory_totals(current)
        kills = self._kills.total()
        return ProbeSample(
            steps=sum(r.steps for r in ranks),
            wait_seconds=sum(r.wait_seconds for r in ranks),
            step_seconds=sum(r.step_seconds for r in ranks),
            up=bool(current),
            live_pids=tuple(sorted({r.pid for r in current.values()})),
            device_uuids=_device_uuids(current),
            batch_size=newest.batch_size if newest else 0,
            flops_per_step=newest.effective_flops_per_step[0] if newest else 0.0,
            files=files,
            cgroup_throttled_seconds=cgroup_throttled,
            cgroup_limit_cores=cgroup_limit,
            ranks=ranks,
            rank_info=_rank_info(current),
            memory_usage_bytes=memory_usage,
            memory_limit_bytes=memory_limit,
            oom_kills=oom_kills,
            loader_worker_kills=float(kills) if kills is not None else None,
            records=tuple(sorted(current.values(), key=lambda r: (r.pid, r.start_time_ns))),
        )

    def _rank_samples(self, current: dict[Key, ProbeRecord]) -> tuple[RankSample, ...]:
        totals: dict[RankKey, _Totals] = {}
        for rank, carried in self._carried.items():
            totals.setdefault(rank, _Totals()).add(carried)
        newest: dict[RankKey, ProbeRecord] = {}
        since_save: dict[RankKey, int] = {}
        for key, rec in current.items():
            rank = self._rank_of.get(key, rec.rank)
            totals.setdefault(rank, _Totals()).add(_Totals.of(rec).minus(self._base.get(key) or _Totals()))
            if rank not in newest or rec.last_update_ns > newest[rank].last_update_ns:
                newest[rank] = rec
            self._published_of[rank] = max(self._published_of.get(rank, 0), rec.last_update_ns)
            if (since := _since_save(rec)) is not None:
                since_save[rank] = since_save.get(rank, 0) + since
            if (rec.last_checkpoint_ns or 0) > self._last_save_of.get(rank, 0):
                self._last_save_of[rank] = rec.last_checkpoint_ns or 0
            if (rec.last_batch_ns or 0) > self._last_batch_of.get(rank, 0):
                self._last_batch_of[rank] = rec.last_batch_ns or 0
        out = []
        for rank in sorted(totals, key=lambda k: (k is None, k or 0)):
            t, n = totals[rank], newest.get(rank)
            if n is not None and n.effective_flops_per_step[0] > 0:
                self._flops_of[rank] = n.effective_flops_per_step
            if n is not None and n.flops_reason and n.flops_detail is not None:
                self._flops_reason_of[rank] = (n.flops_reason, n.flops_detail)
            if n is not None and n.matmul_precision:
                self._precision_of[rank] = n.matmul_precision
            flops, source = self._flops_of.get(rank, (0.0, ""))
            out.append(
                RankSample(
                    rank=rank,
                    totals=t.in_base_units(self._known.get(rank, set()) | _CORE),
                    batch_size=n.batch_size if n else 0,
                    flops_per_step=flops,
                    live=n is not None,
                    flops_per_step_source=source,
                    steps_since_checkpoint=since_save.get(rank),
                    last_checkpoint_seconds=_seconds(self._last_save_of.get(rank)),
                    flops_unavailable=None if flops > 0 else self._flops_reason_of.get(rank),
                    last_batch_seconds=_seconds(self._last_batch_of.get(rank)),
                    collective_sequence=n.collectives_entered if n is not None else None,
                    place=place_of(n) if n is not None else None,
                    loader=loader_of(n) if n is not None else None,
                    flops_precision=self._precision_of.get(rank),
                    restarts=self._restarts.of(rank),
                    restart_gap_seconds=self._restarts.gap_seconds(rank),
                    published_seconds=_seconds(self._published_of.get(rank)),
                    ended_steps_since_checkpoint=self._ended_since.get(rank),
                )
            )
        return tuple(out)

    def _remove(self, path: str) -> None:
        """Delete a finished process's file; on a read-only directory stop trying, silently.

        Only a regular file is removed: if the name now holds something else (a
        directory, a link, a FIFO put there after the read), it is left alone.
        """
        if not self.cleanup:
            return
        try:
            if not stat.S_ISREG(os.lstat(path).st_mode):
                self.errors.record(
                    SAMPLER, "not_regular_file", f"{path}: no longer a regular file; not removed"
                )
                return
            self.remove(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
                # The injected sidecar mounts the probe volume read-only: the probe owns clean-up
                # (dam_probe.cleanup). Not an error: finished files are folded in and ignored.
                self.cleanup = False
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


def _newest_per_cgroup(
    live: dict[Key, ProbeRecord], cgroup_of: Callable[[ProbeRecord], int | None]
) -> dict[int, ProbeRecord]:
    """The latest record of each cgroup (``cgroup_of``: its id, 0 when unknown; None: the record
    does not carry that cgroup's fields)."""
    newest: dict[int, ProbeRecord] = {}
    for r in live.values():
        key = cgroup_of(r)
        if key is not None and (key not in newest or r.last_update_ns > newest[key].last_update_ns):
            newest[key] = r
    return newest


def _cpu_cgroup(r: ProbeRecord) -> int | None:
    return None if r.cgroup_throttled_ns is None else r.cgroup_id or 0


def _memory_cgroup(r: ProbeRecord) -> int | None:
    return None if r.memory_usage_bytes is None else r.memory_cgroup_id or 0


def _device_uuids(current: dict[Key, ProbeRecord]) -> tuple[str, ...]:
    """The GPUs the live processes publish, each once, in pid order."""
    uuids: list[str] = []
    for r in sorted(current.values(), key=lambda r: r.pid):
        for u in r.device_uuids:
            if u and u not in uuids:
                uuids.append(u)
    return tuple(uuids)


def _rank_info(current: dict[Key, ProbeRecord]) -> tuple[RankInfo, ...]:
    """The identity of each rank (its newest live record's), by rank."""
    info = {
        r.rank: RankInfo(r.rank, r.local_rank, r.world_size)
        for r in sorted(current.values(), key=lambda r: r.last_update_ns)
        if r.rank is not None
    }
    return tuple(info[k] for k in sorted(info))
