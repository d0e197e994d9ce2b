"""Goodput over a job's life in the cluster: the pods' cumulative counters, kept in one ledger.

Each training process's probe counts, from the process's start, its productive step time
(``dam_goodput_seconds_total``) and its badput by cause (``dam_badput_seconds_total{cause}``:
startup, data-wait, communication, checkpoint, other); the probe's ``other`` is the elapsed time
less everything else, so a process's series add up to its elapsed time. The operator reads them
at every window from each pod's latest scrape and adds what the cluster alone sees: ``restart``,
the time a container restart (or a Failed pod's replacement) cost, and the time from the
training container's start (``state.running.startedAt``) to its process's start (an entrypoint
script, torchrun's own start: the probe starts counting at the process), as ``startup``.

The ledger counts increments, like Prometheus' ``increase()``: per pod and process (the ``rank``
label, ``""`` without one) the difference from the previous scrape; a process any of whose
series went down is a new process (its file replaced the old one's), whose values count whole. A pod
seen for the first time counts whole too: its processes' lives so far are the job's.

Units. Figures are summed over processes, then divided by the job's processes at that moment
(every tracked pod's process count), so a job of 8 ranks that trained an hour reads about
3,600 s of ``elapsedSeconds``, not 28,800; a restarted pod's incarnations add up in sequence.
Accelerator-seconds are each pod's increments times its accelerators per process: the GPUs its
sidecar attributes to the job (``dam_gpu_info``, or the per-GPU ratios). A CPU-only job (NVML
answers, no GPU is the job's) has 0 accelerators: its ``acceleratorSecondsLost`` is 0 and the
fleet's accelerator-hours count GPUs only. A pod whose GPUs are unknown (NVML down, attribution
``none``) adds no accelerator-seconds; when no pod's are known, ``acceleratorSecondsLost`` is
absent (unknown is never zero).

Restarts. The kubelet raises ``restartCount`` and keeps the old container's end in
``lastState.terminated.finishedAt`` and the new one's start in ``state.running.startedAt``
(core/v1 ContainerStatus). A restart seen at a window adds, per process of the pod, that
downtime plus the new process's startup (its start to its first batch), moved from ``startup``
to ``restart``: the time from the failure to the next first step. A new pod whose process takes
the rank (or, without ranks, the place) of a pod of the same controller (``PodInfo.owner``) that
went Failed, or vanished while its processes ran (deleted, evicted: never seen Succeeded or
Failed, its ranks up at its last scrape), is that pod's replacement: the time from the old pod's
last scrape (or its end, ``state.terminated.finishedAt``, if that came first; what it did after
its last scrape was never counted) to the new process's start counts the same way. Unless its
processes' figures to their end were said (``dam_probe.lastwords`` lines with totals, in a
termination message: the sidecar's, ``dam_sidecar.farewell``, else each probe's at a clean exit;
read from the Pod's last body even once the API deleted it, ``Registry.exited_pods_for``): then
the increments from the last scrape to those totals count as what they were (steps, a save, the
wait for a dead peer), and the restart runs from their end (issue 28's node runs: without them a
deleted rank's restart was 3.1 s, 10 %, over the job's own, the half window between its last
scrape and its end). A pod of another controller (the profile's next Job) starts a new run.

Progress lost. The dead process's work since its last checkpoint is redone by the next one, so it
was not productive after all: at each scrape the ledger keeps, per process, the productive time
at risk, ``dam_steps_since_checkpoint`` (its steps since its latest save, every step when it
saved none) times its rank's productive seconds per step (``dam_goodput_seconds_total`` over
``dam_steps_total``), at most its productive time, where the steps are counted from the job's
checkpoint (``job_steps_since_checkpoint``: of the processes that saved, in any pod; the usual
"rank 0 saves for everyone" leaves the other ranks' own figure at every step, and a restart
resumes them all from rank 0's save). A restart (or a Failed pod's replacement)
moves what the pod's last scrape before the failure held from ``productive`` to ``restart``:
it was counted productive when it happened, and the new process's redoing counts once. The work
between that scrape and the failure is not seen (at most one window's) unless the exit totals
tell it (their steps since the checkpoint then count too). A sidecar that exports
no ``dam_steps_since_checkpoint`` (from before it, or a probe that does not time saves: torch
never loaded) adds no lost progress. ``status.goodput.productiveSeconds`` drops at once; the
operator's ``productive`` counter, which must never go down, holds its increments back until
the amount is paid (``owed_productive``).

Operator restarts and moves. ``resume`` takes the totals from ``status.goodput`` and each pod's
last readings from its ``handover`` (the figures those totals were counted up to): a pod of the
handover (same uid) goes on from them, so a profile that moved to another replica, or whose
operator restarted, counts the time between the last write and its next scrape as if its owner
had not changed. A process first seen after that which is not in the handover (an older
operator's status, a pod past ``MAX_HANDOVER_PROCESSES``) and started before the status was last
written (``lastEvaluationTime``) was counted already: its scrape is a baseline, not an
increment, and what it did between that write and the operator's return is lost (the
operator's downtime, plus at most the status' tolerance of 1 %). The metric
(``accelerator_seconds``) counts only this process's increments: a Prometheus counter that
starts at 0 when the operator starts.

Pure: no I/O, no clock; the window step passes the pods and scrapes in and reads ``status()``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dam_contract import names
from dam_contract.snapshot import Snapshot
from dam_operator.cluster.steps.metric_names import ACCELERATOR_USES, USE_PRODUCTIVE, USE_RESTART, USE_STALLED
from dam_operator.cluster.steps.registry import TERMINAL_PHASES, PodInfo
from dam_operator.diagnosis.goodput import behind_saves
from dam_probe.lastwords import LastWords

PROBE_CAUSES: tuple[str, ...] = names.BADPUT_CAUSES
"""``cause`` values of ``dam_badput_seconds_total`` (the probe's; ``restart`` is the operator's)."""
PROBE_USES: tuple[str, ...] = (USE_PRODUCTIVE, *PROBE_CAUSES)
BADPUT_USES: tuple[str, ...] = tuple(u for u in ACCELERATOR_USES if u != USE_PRODUCTIVE)
STATUS_KEYS: Mapping[str, str] = {
    "startup": "startup",
    "data-wait": "dataWait",
    "communication": "communication",
    "checkpoint": "checkpoint",
    USE_RESTART: "restart",
    "other": "other",
    USE_STALLED: "stalled",
}
"""``status.goodput.badputSeconds`` keys by cause."""
STARTUP = "startup"
CHECKPOINT = names.CAUSE_CHECKPOINT
COMMUNICATION = names.CAUSE_COMMUNICATION
MAX_VACANCIES = 256
"""Failed pods' places kept for a replacement; the oldest go first beyond this."""
MAX_WAIT_SECONDS = 120.0
"""How long a pod being deleted stays in the ledger for its processes' last words (``_waiting``)."""
MAX_PROCESSES_PER_POD = 1024
"""Process series (ranks) one pod may hold in the ledger; more are ignored (bounded memory)."""
HANDOVER_VERSION = 1
MAX_HANDOVER_PROCESSES = 256
"""Processes whose last readings ``status.goodput.handover`` carries (pods by name, whole pods):
about 100 bytes each, so at most ~26 KB of the status; the others' first scrape after a move is
a baseline, as before there was a handover."""
MAX_HANDOVER_CHARS = 262_144
"""The longest handover read (the CRD's ``maxLength`` of ``status.goodput.handover``): ten times
what ``MAX_HANDOVER_PROCESSES`` writes."""


def _zeros() -> dict[str, float]:
    return dict.fromkeys(ACCELERATOR_USES, 0.0)


def _valid(value: float) -> float | None:
    return value if math.isfinite(value) and value >= 0 else None


def parse_datetime(value: str | None) -> dt.datetime | None:
    """An RFC 3339 time (the kubelet's, the status'), UTC when it names no zone; None when absent
    or garbage."""
    if not value:
        return None
    try:
        at = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    return at.replace(tzinfo=dt.UTC) if at.tzinfo is None else at


def parse_time(value: str | None) -> float | None:
    """Unix seconds of an RFC 3339 time (``parse_datetime``); None when absent or garbage."""
    at = parse_datetime(value)
    return None if at is None else at.timestamp()


# ---------------------------------------------------------------- one scrape


@dataclass(frozen=True, slots=True)
class PodReading:
    """One pod's goodput series at one scrape."""

    at: float
    """The sidecar's sample time, Unix seconds."""
    processes: dict[str, dict[str, float]]
    """Process key (its ``rank`` label, ``""`` without) → use → cumulative seconds."""
    process_count: int
    """Training processes behind the series (ranks; without ranks, the probe's live processes)."""
    accelerators: int | None
    """The pod's GPUs as its sidecar attributes them; 0 for a CPU-only job; None: unknown."""
    at_risk: dict[str, float] = field(default_factory=dict)
    """Process key → productive seconds since its own latest checkpoint (absent: unknown)."""
    since: dict[str, float] = field(default_factory=dict)
    """Process key → steps since its own latest checkpoint (``dam_steps_since_checkpoint``)."""
    per_step: dict[str, float] = field(default_factory=dict)
    """Process key → productive seconds per step (0 before its first step)."""
    saved: frozenset[str] = frozenset()
    """Process keys that saved a checkpoint (fewer steps since their latest save than steps)."""
    measured: frozenset[str] = frozenset(PROBE_CAUSES)
    """The probe causes every process of the pod reported (an absent series: not measured)."""
    ended: frozenset[str] = frozenset()
    """Process keys whose every process had ended at this scrape (``dam_rank_up`` 0)."""
    restarts: dict[str, float] = field(default_factory=dict)
    """Process key → restarts inside the container so far (``dam_process_restarts_total``)."""
    gaps: dict[str, float] = field(default_factory=dict)
    """Process key → their down time so far (``dam_process_restart_gap_seconds_total``)."""
    world: int = 0
    """The largest ``world_size`` its live ranked processes report (``dam_process_rank_info``);
    0 when none does."""

    def with_job_checkpoint(self, job_since: float) -> PodReading:
        """This reading with each process's progress at risk counted from the job's checkpoint,
        ``job_since`` steps ago: every rank resumes from the same step."""
        at_risk = dict(self.at_risk)
        for key in self.since:
            productive = self.processes[key][USE_PRODUCTIVE]
            at_risk[key] = min(productive, job_since * self.per_step.get(key, 0.0))
        return dataclasses.replace(self, at_risk=at_risk)


def job_steps_since_checkpoint(readings: Mapping[str, PodReading]) -> float | None:
    """Steps since the checkpoint the whole job would resume from; None when no process has saved
    (each process's own figure, every step it took, then stands).

    Relies on the job being synchronous (data parallel: every rank takes the same steps). Only
    processes that saved count (a process that never saved reports every step it took): when one
    rank (rank 0) saves for all, the usual way, its latest save is the job's; when every rank saves
    its own shard (``torch.distributed.checkpoint``), a checkpoint is whole only once all of them
    wrote it, so the oldest of their latest saves (the most steps since) is the job's. A restart
    resumes every rank from that step (issue 28: a 2-rank job whose rank 0 saved 5 steps earlier lost
    all of rank 1's productive time at rank 1's restart, goodput 0.995 -> 0.505).
    """
    found = [r.since[key] for r in readings.values() for key in r.saved if key in r.since]
    return max(found) if found else None


def pod_accelerators(snapshot: Snapshot) -> int | None:
    """GPUs the sidecar reports as the job's: distinct ``uuid`` (else ``gpu``) of ``dam_gpu_info``
    or of the per-GPU utilization; 0 when NVML answers and attributes none to the job (CPU-only);
    None when NVML is down or the sidecar cannot tell which GPUs are the job's."""
    keys: set[str] = set()
    for name in (names.GPU_INFO, names.GPU_UTILIZATION_RATIO):
        for s in snapshot.samples(name):
            key = s.label("uuid") or s.label("gpu")
            if key:
                keys.add(key)
        if keys:
            return len(keys)
    nvml_up = any(s.value == 1.0 for s in snapshot.samples(names.NVML_UP))
    attribution = next(
        (s.label("state") for s in snapshot.samples(names.GPU_ATTRIBUTION) if s.value == 1.0), ""
    )
    return 0 if nvml_up and attribution != "none" else None


def read_pod(snapshot: Snapshot) -> PodReading | None:
    """The pod's goodput and badput series by process; None without a time or a goodput series
    (a sidecar or probe from before goodput)."""
    if snapshot.timestamp_seconds is None:
        return None
    processes: dict[str, dict[str, float]] = {}
    for s in snapshot.samples(names.GOODPUT_SECONDS_TOTAL):
        value = _valid(s.value)
        key = s.label(names.RANK_LABEL)
        if value is None or (key not in processes and len(processes) >= MAX_PROCESSES_PER_POD):
            continue
        figures = processes.setdefault(key, dict.fromkeys(PROBE_USES, 0.0))
        figures[USE_PRODUCTIVE] += value
    reported: dict[str, set[str]] = {}
    for s in snapshot.samples(names.BADPUT_SECONDS_TOTAL):
        value = _valid(s.value)
        cause = s.label(names.CAUSE_LABEL)
        found = processes.get(s.label(names.RANK_LABEL))
        if value is not None and found is not None and cause in PROBE_CAUSES:
            found[cause] += value
            reported.setdefault(cause, set()).add(s.label(names.RANK_LABEL))
    if not processes:
        return None
    measured = frozenset(c for c in PROBE_CAUSES if reported.get(c, set()) >= processes.keys())
    count = len(processes)
    if set(processes) == {""}:
        live = [v for s in snapshot.samples(names.PROBE_PROCESSES) if (v := _valid(s.value)) is not None]
        count = max(1, min(MAX_PROCESSES_PER_POD, round(sum(live)))) if live else 1
    at_risk, since, per_step, saved = _at_risk(snapshot, processes)
    ended = frozenset(s.label(names.RANK_LABEL) for s in snapshot.samples(names.RANK_UP) if s.value == 0.0)
    return PodReading(
        snapshot.timestamp_seconds,
        processes,
        count,
        pod_accelerators(snapshot),
        at_risk,
        since,
        per_step,
        saved,
        measured,
        ended & processes.keys(),
        _per_process(snapshot, names.PROCESS_RESTARTS_TOTAL, processes),
        _per_process(snapshot, names.PROCESS_RESTART_GAP_SECONDS_TOTAL, processes),
        _world_size(snapshot),
    )


def _world_size(snapshot: Snapshot) -> int:
    sizes = [s.label("world_size") for s in snapshot.samples(names.PROCESS_RANK_INFO)]
    return max((int(v) for v in sizes if v.isdigit()), default=0)


def _per_process(snapshot: Snapshot, name: str, processes: Mapping[str, object]) -> dict[str, float]:
    return {
        key: v
        for s in snapshot.samples(name)
        if (key := s.label(names.RANK_LABEL)) in processes and (v := _valid(s.value)) is not None
    }


def _at_risk(
    snapshot: Snapshot, processes: Mapping[str, Mapping[str, float]]
) -> tuple[dict[str, float], dict[str, float], dict[str, float], frozenset[str]]:
    """``_risk`` of a scrape's ``dam_steps_total`` and ``dam_steps_since_checkpoint``."""
    steps = {
        s.label(names.RANK_LABEL): v for s in snapshot.samples(names.STEPS_TOTAL) if (v := _valid(s.value))
    }
    since = {
        key: v
        for s in snapshot.samples(names.STEPS_SINCE_CHECKPOINT)
        if (v := _valid(s.value)) is not None and (key := s.label(names.RANK_LABEL)) in processes
    }
    return _risk(processes, steps, since)


def _risk(
    processes: Mapping[str, Mapping[str, float]], steps: Mapping[str, float], since: Mapping[str, float]
) -> tuple[dict[str, float], dict[str, float], dict[str, float], frozenset[str]]:
    """Per process with ``since`` (its steps since its latest checkpoint), the productive seconds
    since that save (those steps times its rank's productive seconds per step, at most its
    productive time), its steps since that save, its productive seconds per step; and the
    processes that saved at all (fewer steps since their save than ``steps``)."""
    out: dict[str, float] = {}
    per_step: dict[str, float] = {}
    saved: set[str] = set()
    for key, n in since.items():
        total = steps.get(key)
        productive = processes[key][USE_PRODUCTIVE]
        per_step[key] = productive / total if total else 0.0
        if total and n < total:
            saved.add(key)
        out[key] = min(productive, n * per_step[key])
    return out, dict(since), per_step, frozenset(saved)


def exit_reading(words: Sequence[LastWords]) -> PodReading | None:
    """A pod's goodput reading from its training processes' exit totals (``PodInfo.exit_words``),
    as a scrape would read them (``read_pod``): per process key (its rank, ``""`` without), the
    sum of its processes' figures; taken at the latest of them. None without totals."""
    processes: dict[str, dict[str, float]] = {}
    steps: dict[str, float] = {}
    since: dict[str, float] = {}
    unknown: set[str] = set()
    at = 0.0
    lines = 0
    for w in words:
        t = w.totals
        if t is None:
            continue
        lines += 1
        key = "" if w.rank is None else str(w.rank)
        figures = processes.setdefault(key, dict.fromkeys(PROBE_USES, 0.0))
        for use, ms in (
            (USE_PRODUCTIVE, t.productive_ms),
            (STARTUP, t.startup_ms),
            (names.CAUSE_DATA_WAIT, t.data_wait_ms),
            (names.CAUSE_OTHER, t.other_ms),
            (COMMUNICATION, t.communication_ms),
            (CHECKPOINT, t.checkpoint_ms),
        ):
            if ms is None:
                unknown.add(use)
            else:
                figures[use] += ms / 1000.0
        steps[key] = steps.get(key, 0.0) + w.steps
        if t.steps_since_checkpoint is not None:
            since[key] = since.get(key, 0.0) + t.steps_since_checkpoint
        at = max(at, t.at_ms / 1000.0)
    if not processes:
        return None
    at_risk, since, per_step, saved = _risk(processes, steps, since)
    count = lines if set(processes) == {""} else len(processes)
    return PodReading(
        at,
        processes,
        min(count, MAX_PROCESSES_PER_POD),
        None,
        at_risk,
        since,
        per_step,
        saved,
        frozenset(c for c in PROBE_CAUSES if c not in unknown),
    )


# ---------------------------------------------------------------- the ledger


@dataclass(slots=True)
class _Process:
    last: dict[str, float]
    seen_at: float
    restarting: bool = False
    """A restarted process before its first batch: its startup is the restart's."""
    at_risk: float = 0.0
    """Productive seconds since its latest checkpoint at the last scrape that told (what a
    failure now would make the next process redo)."""
    inside: float = 0.0
    """Restarts inside the container the sidecar had counted (``PodReading.restarts``), and
    their down time (``gap``), at the last scrape."""
    gap: float = 0.0
    absorb: float = 0.0
    """Restarts the kubelet's record counted already, which the sidecar counts as well once the
    new container's process publishes: not counted again."""


@dataclass(frozen=True, slots=True)
class _Scrape:
    """What one pod's scrape tells every process of it (``GoodputLedger._read``)."""

    reading: PodReading
    owner: str | None
    first_sight: bool
    restarted: int
    """Container restarts the kubelet recorded since the last scrape."""
    downtime: float
    started: float | None
    running_since: float | None


@dataclass(slots=True)
class _Pod:
    uid: str
    restarts: int
    owner: str | None = None
    processes: dict[str, _Process] = field(default_factory=dict)
    count: int = 1
    share: float | None = None
    """Accelerators per process (None: unknown)."""
    seen_at: float = 0.0
    ended: bool = False
    """Every process of the pod had ended at its last scrape (a vanished pod that ended is no failure)."""
    waiting_since: float | None = None
    """Being deleted, its processes' last words not in yet, since then (``_waiting``)."""
    said: bool = False
    """Its last reading is its processes' exit totals (``_farewell``): ``seen_at`` is
    when they ended, and the time after it is the restart's, not an unseen tail."""


@dataclass(frozen=True, slots=True)
class _Vacancy:
    """A Failed pod's process, waiting for the pod that takes its place."""

    key: str
    failed_at: float
    lost: float = 0.0
    """The failed process's productive seconds since its last checkpoint (redone by the next)."""
    owner: str | None = None
    """Its pod's controller (``PodInfo.owner``): only a pod of the same one takes the place."""


def _summed(
    deltas: Mapping[str, Mapping[str, float]], share_of: Mapping[str, float | None]
) -> tuple[dict[str, float], dict[str, float]]:
    """Process-seconds and accelerator-seconds by use of a window's increments (keyed
    ``pod\x00process``; ``share_of``: each pod's accelerators per process, None: unknown)."""
    process_seconds, accel = _zeros(), _zeros()
    for process, delta in deltas.items():
        share = share_of[process.split("\x00", 1)[0]]
        for use, value in delta.items():
            process_seconds[use] += value
            if share is not None:
                accel[use] += value * share
    return process_seconds, accel


def _downtime(start: float | None, failed_at: float | None) -> float:
    if start is None or failed_at is None:
        return 0.0
    return max(0.0, start - failed_at)


def _ledger_copy(ledger: GoodputLedger) -> GoodputLedger:
    """``GoodputLedger.copy``: every container new, down to each process's readings; what they
    hold is scalars and frozen records (``_Vacancy``, tuples). A few times cheaper than
    ``copy.deepcopy``, once per window (tests/unit/cluster/test_state_copies.py)."""
    return dataclasses.replace(
        ledger,
        seconds=dict(ledger.seconds),
        accelerator_seconds=dict(ledger.accelerator_seconds),
        pods={name: _copied(pod) for name, pod in ledger.pods.items()},
        vacancies=list(ledger.vacancies),
        deleted=dict(ledger.deleted),
        unmeasured=set(ledger.unmeasured),
    )


@dataclass(slots=True)
class GoodputLedger:
    """A profile's goodput so far; ``update`` it every window, read ``status()``. ``seconds``:
    the job's seconds by use (see the module's units); ``accelerator_seconds``: accelerator-
    seconds by use counted by this ledger (what the operator's counter exports)."""

    seconds: dict[str, float] = field(default_factory=_zeros)
    accelerator_seconds: dict[str, float] = field(default_factory=_zeros)
    lost_before: float = 0.0
    """``acceleratorSecondsLost`` resumed from the status (counted by an earlier operator)."""
    accelerators_known: bool = False
    accelerators: float | None = None
    restarts: int = 0
    resumed_at: float | None = None
    resume_pending: bool = False
    """Resumed without a ``lastEvaluationTime``: the first update's time stands in for it."""
    pods: dict[str, _Pod] = field(default_factory=dict)
    vacancies: list[_Vacancy] = field(default_factory=list)
    owed_productive: float = 0.0
    """Accelerator-seconds of lost progress still to take from the ``productive`` counter (which
    never goes down: its next increments pay it first)."""
    stall_since: float | None = None
    """Unix seconds the stall being counted began (None: the job progresses)."""
    updated_at: float | None = None
    """The previous update's time (Unix seconds)."""
    deleted: dict[str, tuple[str, float]] = field(default_factory=dict)
    """Pods the operator deleted (``onStall: Restart``) and not yet gone: name -> (uid, Unix time)."""
    unmeasured: set[str] = field(default_factory=set)
    """Probe causes some process could not measure (its series absent) at some scrape: absent from
    ``status.goodput`` for the rest of the job's life, whose ratio is then an upper bound."""

    # ------------------------------------------------------------ resume

    @classmethod
    def resume(cls, status: Mapping[str, Any]) -> GoodputLedger:
        """A ledger that continues the totals of ``status.goodput`` (none there: from zero)."""
        return _resumed(cls(), status)

    # ------------------------------------------------------------ update

    def update(
        self,
        *,
        pods: Sequence[PodInfo],
        answered: Mapping[str, Snapshot],
        finished: Sequence[PodInfo] = (),
        stalled_since: float | None = None,
        now: float | None = None,
        exited: Sequence[PodInfo] = (),
    ) -> None:
        """One window: the active ``pods``, the scrapes that ``answered``, and the profile's
        ``finished`` pods (a Failed one leaves its place to a replacement).

        ``exited``: pods no longer active whose processes left their exit totals
        (``Registry.exited_pods_for``): the time from their last scrape to their end counts as
        what it was (steps, a save, the wait for a dead peer), and a replacement's restart from
        that end (the module docstring's Restarts).

        ``stalled_since``: the job is Stalled (``progress_step``), since that Unix time. The
        processes' ``other`` time of the window is then ``stalled``: a stalled process takes no
        step, so the time it waits (in a collective, a loader, a save, the user's code) is its
        probe's ``other``. At a stall's first window the ``other`` counted since its start (the
        threshold's wait, in earlier windows) moves too, in ``status.goodput`` (the operator's
        counters never go down: theirs starts at the detection). ``now``: this update's time."""
        active = {p.name: p for p in pods}
        failed = {p.name: p for p in finished if p.phase == "Failed"}
        readings = {name: r for name, snap in sorted(answered.items()) if (r := read_pod(snap)) is not None}
        readings, said, said_share = _last_seconds(self, exited, active, readings)
        live_before = sum(p.count for p in self.pods.values())
        waiting = _waiting(self, exited, active, readings, now)
        self._retire(active, failed, frozenset(p.name for p in finished), waiting)
        if self.resume_pending and readings:
            self.resumed_at = min(r.at for r in readings.values())
            self.resume_pending = False
        deltas: dict[str, dict[str, float]] = {}
        share_of: dict[str, float | None] = {}
        for name, reading in readings.items():
            pod = active.get(name)
            if pod is None:
                continue
            self.unmeasured |= set(PROBE_CAUSES) - reading.measured
            increments, share_of[name] = self._read(pod, reading)
            deltas |= {f"{name}\x00{key}": delta for key, delta in increments.items()}
        if not {CHECKPOINT, COMMUNICATION} & self.unmeasured:
            behind_saves(deltas)  # a rank's wait behind a peer's save is the save's
            behind_saves(said)
        process_seconds, accel = _summed(deltas, share_of)
        said_seconds, said_accel = _summed(said, said_share)
        # The job's processes now: the pods' that report, and at least its world size (a pod that
        # reports its first figures, whole, before its peers do is still one of the world's).
        world = max((r.world for r in readings.values()), default=0)
        live = max(sum(p.count for p in self.pods.values()), min(world, MAX_PROCESSES_PER_POD * 64))
        _stall(self, stalled_since, now, process_seconds, accel)
        if stalled_since is not None:
            _as_stalled(said_seconds, said_accel)  # the ended processes' last seconds too
        for use in ACCELERATOR_USES:
            if live > 0:
                self.seconds[use] += process_seconds[use] / live
            if live_before > 0:
                self.seconds[use] += said_seconds[use] / live_before
            accel[use] += said_accel[use]
        # Lost progress leaves productive (counted when it happened) for restart.
        self.seconds[USE_PRODUCTIVE] = max(0.0, self.seconds[USE_PRODUCTIVE])
        # The productive counter never goes down: lost progress is taken from its increments.
        productive = accel[USE_PRODUCTIVE] - self.owed_productive
        self.owed_productive = max(0.0, -productive)
        accel[USE_PRODUCTIVE] = max(0.0, productive)
        for use in ACCELERATOR_USES:
            self.accelerator_seconds[use] += accel[use]
        shares = [(p.share, p.count) for p in self.pods.values() if p.share is not None]
        if shares:
            self.accelerators_known = True
            self.accelerators = math.fsum(s * c for s, c in shares)
        elif self.pods:
            self.accelerators = None

    def _retire(
        self,
        active: Mapping[str, PodInfo],
        failed: Mapping[str, PodInfo],
        finished: frozenset[str],
        waiting: frozenset[str] = frozenset(),
    ) -> None:
        """Pods no longer active leave the ledger (but those ``waiting`` for their last words);
        one that Failed, or vanished while its processes ran (``finished`` names the pods that
        ended, Succeeded or Failed), leaves its places to a replacement."""
        for name in list(self.pods):
            pod = self.pods[name]
            info = active.get(name)
            if (info is not None and info.uid == pod.uid) or name in waiting:
                continue
            del self.pods[name]
            gone = failed.get(name)
            deleted = self.deleted.pop(name, None)
            if gone is not None and gone.uid == pod.uid:
                record = gone.restart
                finished_at = parse_time(record.terminated_at if record else None)
                # From its last scrape when that came before its end: what it did after that
                # scrape was never counted, and it ended in a failure.
                if pod.said:  # its processes' own end: counted to it, the restart from it
                    at = pod.seen_at
                else:
                    at = pod.seen_at if finished_at is None else min(finished_at, pod.seen_at or finished_at)
            elif deleted is not None and deleted[0] == pod.uid:
                # Deleted by the operator (onStall: Restart): its replacement restarts it (from its
                # processes' end when they said it: they ran on after the deletion, counted).
                at = max(deleted[1], pod.seen_at) if pod.said else deleted[1]
            elif name not in finished and not pod.ended and pod.seen_at:
                # Gone while its processes ran, neither Succeeded nor Failed: deleted (by a user,
                # a controller, an eviction) or its node lost. A pod that takes its rank replaces
                # it, as for a Failed pod, from its last scrape (what came after was never seen).
                at = pod.seen_at
            else:
                continue
            self.vacancies.extend(
                _Vacancy(key, at, pod.processes[key].at_risk, pod.owner) for key in sorted(pod.processes)
            )
        del self.vacancies[:-MAX_VACANCIES]
        for name in [n for n in self.deleted if n not in self.pods]:
            del self.deleted[name]

    def pods_deleted(self, pods: Sequence[PodInfo], names: Sequence[str], at: float) -> None:
        """The operator deletes ``names`` at ``at`` (``onStall: Restart``): when they are gone, the
        Pods that take their ranks are their replacements, as for a Failed pod (the module
        docstring's Restarts): the time from the deletion to the new processes' first batch, and
        the progress since the job's checkpoint, are ``restart``."""
        uids = {p.name: p.uid for p in pods}
        for name in names:
            if name in uids and name in self.pods:
                self.deleted[name] = (uids[name], at)

    def _take_vacancy(self, key: str, owner: str | None) -> _Vacancy | None:
        for i, vacancy in enumerate(self.vacancies):
            if vacancy.key == key and vacancy.owner == owner:
                return self.vacancies.pop(i)
        return None

    def _read(self, info: PodInfo, reading: PodReading) -> tuple[dict[str, dict[str, float]], float | None]:
        """Increments of one pod's processes (process key → process-seconds by use) and its
        accelerators per process."""
        record = info.restart
        restarts = record.count if record is not None else 0
        pod = self.pods.get(info.name)
        first_sight = pod is None
        if pod is None:
            pod = self.pods[info.name] = _Pod(uid=info.uid, restarts=restarts, owner=info.owner)
        restarted = max(0, restarts - pod.restarts)
        self.restarts += restarted
        started = parse_time(record.started_at if record else None)
        downtime = (
            _downtime(started, parse_time(record.finished_at if record else None)) if restarted else 0.0
        )
        share = pod.share if reading.accelerators is None else reading.accelerators / reading.process_count
        scrape = _Scrape(
            reading,
            info.owner,
            first_sight,
            restarted,
            downtime,
            started,
            parse_time(record.running_since if record else None),
        )
        vacancies, out, inside = len(self.vacancies), {}, 0
        for key, values in reading.processes.items():
            out[key], restarted_inside = self._process(pod, scrape, key, values)
            inside = max(inside, restarted_inside)
        # A replacement pod restarts once, and so does torchrun restarting all its ranks at once.
        self.restarts += inside + (1 if len(self.vacancies) < vacancies else 0)
        pod.restarts = restarts
        pod.count = reading.process_count
        pod.share = share
        pod.seen_at = reading.at
        pod.ended = bool(reading.ended) and reading.ended >= reading.processes.keys()
        return out, share

    def _process(
        self, pod: _Pod, scrape: _Scrape, key: str, values: dict[str, float]
    ) -> tuple[dict[str, float], int]:
        """One process's increments since the pod's last scrape, restarts and lost progress in;
        and the restarts inside the container it counts."""
        reading = scrape.reading
        began = reading.at - math.fsum(values.values())  # the process's start: its seconds add up
        start = began if scrape.started is None else scrape.started
        prev = pod.processes.get(key)
        restart = 0.0
        lost = 0.0  # productive seconds the dead process did since its last checkpoint
        restarting = prev is not None and prev.restarting
        inside, gap = reading.restarts.get(key, 0.0), reading.gaps.get(key, 0.0)
        absorb = prev.absorb if prev is not None else 0.0
        counted = 0
        if prev is not None:
            if any(v < prev.last[u] for u, v in values.items()):
                delta = dict(values)  # a new process's file replaced the old one's
            else:
                delta = {u: v - prev.last[u] for u, v in values.items()}
            new = max(0.0, inside - prev.inside)
            absorbed = min(new, absorb)
            absorb -= absorbed
            if new > absorbed and not scrape.restarted:
                # Restarted inside the container (torchrun --max-restarts): the down time the
                # sidecar measured (unless the kubelet's record counted some of them), and the
                # progress since the job's checkpoint.
                restarting, lost = True, prev.at_risk
                restart = max(0.0, gap - prev.gap) if absorbed == 0 else 0.0
                counted = round(new - absorbed)
        elif scrape.first_sight and self.resumed_at is not None and start < self.resumed_at:
            # Counted by the operator before its restart (to within the status' tolerance).
            delta = dict.fromkeys(values, 0.0)
        else:
            delta = dict(values)
            vacancy = self._take_vacancy(key, scrape.owner) if scrape.first_sight else None
            if vacancy is not None:
                restarting = True
                restart = _downtime(start, vacancy.failed_at)  # to the process's start
                lost = vacancy.lost
            else:  # the container's start to the process's: the job's startup too
                delta[STARTUP] = delta.get(STARTUP, 0.0) + _downtime(began, scrape.running_since)
                counted, restart = round(inside), gap  # inside the container before its first scrape
        if scrape.restarted:
            # The container's down time, and its start to the new process's start; the sidecar
            # counts the same restart once the new process publishes (absorbed then).
            restarting, restart = True, scrape.downtime + _downtime(began, scrape.started)
            lost = prev.at_risk if prev is not None else 0.0
            absorb += max(0.0, scrape.restarted - max(0.0, inside - (prev.inside if prev else 0.0)))
        if restarting:
            # The new process's start to its first batch belongs to the restart; its startup
            # counter stops growing at the first batch, and so does this.
            grew = delta.get(STARTUP, 0.0)
            restart += grew
            delta[STARTUP] = 0.0
            restarting = grew > 0 or delta.get(USE_PRODUCTIVE, 0.0) <= 0
        delta[USE_RESTART] = restart + lost
        delta[USE_PRODUCTIVE] = delta.get(USE_PRODUCTIVE, 0.0) - lost  # may go below 0: see update
        if prev is not None or len(pod.processes) < MAX_PROCESSES_PER_POD:
            # A scrape that does not tell (the process ended and was folded, an older sidecar) keeps
            # the last figure, but not across a restart: the new process has redone nothing yet.
            kept = prev.at_risk if prev is not None and not scrape.restarted else 0.0
            at_risk = reading.at_risk.get(key, kept)
            pod.processes[key] = _Process(dict(values), reading.at, restarting, at_risk, inside, gap, absorb)
        return delta, counted

    # ------------------------------------------------------------ read

    def measured_uses(self) -> tuple[str, ...]:
        """The uses of the accelerator-seconds counter the job measures (the others: no series)."""
        return tuple(u for u in ACCELERATOR_USES if u not in self.unmeasured)

    @property
    def elapsed_seconds(self) -> float:
        return math.fsum(self.seconds.values())

    def lost_accelerator_seconds(self) -> float | None:
        if not self.accelerators_known:
            return None
        return self.lost_before + math.fsum(self.accelerator_seconds[u] for u in BADPUT_USES)

    def status(self) -> dict[str, Any] | None:
        """``status.goodput``; None while no process has reported goodput."""
        return _status_of(self)

    copy = _ledger_copy  # a copy to update while this one stays as it was (window_step)


def _copied(pod: _Pod) -> _Pod:
    processes = {key: dataclasses.replace(p, last=dict(p.last)) for key, p in pod.processes.items()}
    return dataclasses.replace(pod, processes=processes)


def _last_seconds(
    ledger: GoodputLedger,
    exited: Sequence[PodInfo],
    active: Mapping[str, PodInfo],
    readings: dict[str, PodReading],
) -> tuple[dict[str, PodReading], dict[str, dict[str, float]], dict[str, float | None]]:
    """The window's ``readings`` with the job's checkpoint in, and the increments of the processes
    that ended since their pod's last scrape (``_farewell``, keyed ``pod\x00process``) with their
    pods' accelerators per process. The ended processes' progress at risk counts from the job's
    checkpoint at their end, of those of them that saved (not from the live scrapes', of now)."""
    finals = {
        info.name: (info, r)
        for info in exited
        if info.name not in active and (r := exit_reading(info.exit_words)) is not None
    }
    job_since = job_steps_since_checkpoint(readings)
    if job_since is not None:
        readings = {name: r.with_job_checkpoint(job_since) for name, r in readings.items()}
    # The job's checkpoint at the processes' end, of the ended processes that saved: a live
    # process's figure is of now (a replacement's own saves), not of their end.
    at_end = job_steps_since_checkpoint({n: r for n, (_, r) in finals.items()})
    if at_end is not None:
        finals = {name: (info, r.with_job_checkpoint(at_end)) for name, (info, r) in finals.items()}
    said: dict[str, dict[str, float]] = {}
    share: dict[str, float | None] = {}
    for name, (info, reading) in sorted(finals.items()):
        increments = _farewell(ledger, info, reading, checkpointed=at_end is not None)
        said |= {f"{name}\x00{key}": delta for key, delta in increments.items()}
        share[name] = ledger.pods[name].share if increments else None
    return readings, said, share


def _waiting(
    ledger: GoodputLedger,
    exited: Sequence[PodInfo],
    active: Mapping[str, PodInfo],
    readings: Mapping[str, PodReading],
    now: float | None,
) -> frozenset[str]:
    """Pods being deleted whose processes' last words have not come yet (the kubelet stops the
    training container, then the sidecar, which writes them: a second or two, or a SIGTERM
    handler's grace period): kept in the ledger, not retired, until their words come, their pod
    ends or goes without them, a pod that would take one of their places reports for the first
    time (it must find the place vacated), or MAX_WAIT_SECONDS passed."""
    newcomers = {
        (key, info.owner)
        for name, r in readings.items()
        if name not in ledger.pods and (info := active.get(name)) is not None
        for key in r.processes
    }
    out = set()
    for info in exited:
        pod = ledger.pods.get(info.name)
        if pod is None or pod.uid != info.uid or pod.said:
            continue
        if not info.deleting or info.phase in TERMINAL_PHASES or info.exit_words:
            continue
        pod.waiting_since = pod.waiting_since if pod.waiting_since is not None else now
        waited = 0.0 if now is None or pod.waiting_since is None else now - pod.waiting_since
        if waited <= MAX_WAIT_SECONDS and not any((key, pod.owner) in newcomers for key in pod.processes):
            out.add(info.name)
    return frozenset(out)


def _farewell(
    ledger: GoodputLedger, info: PodInfo, reading: PodReading, *, checkpointed: bool
) -> dict[str, dict[str, float]]:
    """The increments of a pod's processes from its last scrape to their exit totals (a reading
    from their last words, ``exit_reading``); empty, and the pod left as it was, when they do
    not continue that scrape: another pod (uid), other processes (a rank the scrape had not,
    or one without a rank beside ranked ones), a restart inside the container, a figure
    lower than the scrape's (a process the totals miss), or no time after it.

    The progress at risk at their end: from the job's checkpoint then (``checkpointed``: one of
    the ended processes saved); else the last scrape's and the productive time since, no save
    seen in between."""
    pod = ledger.pods.get(info.name)
    if pod is None or pod.uid != info.uid or pod.said or reading.at <= pod.seen_at:
        return {}
    if reading.processes.keys() != pod.processes.keys():
        return {}
    for key, values in reading.processes.items():
        prev = pod.processes[key]
        if prev.inside or any(v < prev.last.get(u, 0.0) for u, v in values.items()):
            return {}
    before = {key: p.at_risk for key, p in pod.processes.items()}
    scrape = _Scrape(reading, info.owner, False, 0, 0.0, None, None)
    out = {key: ledger._process(pod, scrape, key, values)[0] for key, values in reading.processes.items()}
    if not checkpointed:
        for key, delta in out.items():
            ended = pod.processes[key]
            ended.at_risk = min(ended.last[USE_PRODUCTIVE], before[key] + max(0.0, delta[USE_PRODUCTIVE]))
    ledger.unmeasured |= set(PROBE_CAUSES) - reading.measured
    pod.seen_at, pod.said = reading.at, True
    return out


def _number(value: Any) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return max(0.0, float(value)) if ok else 0.0


def _resumed(ledger: GoodputLedger, status: Mapping[str, Any]) -> GoodputLedger:
    """``ledger`` continuing the totals of ``status.goodput`` (``GoodputLedger.resume``)."""
    raw = status.get("goodput")
    if not isinstance(raw, Mapping):
        return ledger
    ledger.seconds[USE_PRODUCTIVE] = _number(raw.get("productiveSeconds"))
    found = raw.get("badputSeconds")
    badput: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    for cause, key in STATUS_KEYS.items():
        ledger.seconds[cause] = _number(badput.get(key))
    lost = raw.get("acceleratorSecondsLost")
    if lost is not None:
        ledger.lost_before = _number(lost)
        ledger.accelerators_known = True
    ledger.restarts = int(_number(raw.get("restarts")))
    measured = raw.get("measured")
    if isinstance(measured, list):
        ledger.unmeasured = {c for c in PROBE_CAUSES if STATUS_KEYS[c] not in measured}
    ledger.resumed_at = parse_time(status.get("lastEvaluationTime"))
    ledger.resume_pending = ledger.resumed_at is None
    ledger.pods = taken_over(raw.get("handover"))
    return ledger


# ------------------------------------------------------------ handover
# What the status totals alone cannot give the next owner of a profile (another replica after a
# move, this one after a restart): each pod's last readings, which those totals counted up to.
# With them its next scrape is an increment, as if the owner had not changed; without them (an
# older operator's status, past MAX_HANDOVER_PROCESSES) that scrape is a baseline and the time
# from the last write to it is lost (``resumed_at``). One JSON string, versioned; anything in it
# that does not parse is ignored, pod by pod (a tenant can write the status subresource only with
# the operator's rights, but an edited or truncated one must never fail a window).


def _handover_of(ledger: GoodputLedger) -> str | None:
    """``status.goodput.handover``: the pods' readings (``_Pod``), whole pods by name, at most
    ``MAX_HANDOVER_PROCESSES`` processes; None when the ledger holds no pod."""
    pods: dict[str, list[Any]] = {}
    carried = 0
    for name in sorted(ledger.pods):
        pod = ledger.pods[name]
        carried += len(pod.processes)
        if carried > MAX_HANDOVER_PROCESSES:
            break
        processes = {
            key: [{u: round(v, 3) for u, v in p.last.items()}, round(p.seen_at, 3), p.restarting]
            + [round(x, 3) for x in (p.at_risk, p.inside, p.gap, p.absorb)]
            for key, p in sorted(pod.processes.items())
        }
        share = None if pod.share is None else round(pod.share, 6)
        seen_at = round(pod.seen_at, 3)
        pods[name] = [pod.uid, pod.restarts, pod.owner, pod.count, share, seen_at, pod.ended, processes]
    if not pods:
        return None
    return json.dumps({"v": HANDOVER_VERSION, "pods": pods}, separators=(",", ":"), sort_keys=True)


def taken_over(raw: Any) -> dict[str, _Pod]:
    """The pods of a ``status.goodput.handover`` (``_handover_of``); {} when there is none or it
    is not this version's; a pod that does not parse is left out whole (its next scrape is then a
    baseline, as without a handover)."""
    if not isinstance(raw, str) or len(raw) > MAX_HANDOVER_CHARS:
        return {}
    try:
        doc = json.loads(raw)
    except ValueError:
        return {}
    if not isinstance(doc, dict) or doc.get("v") != HANDOVER_VERSION or not isinstance(doc.get("pods"), dict):
        return {}
    out: dict[str, _Pod] = {}
    for name, row in doc["pods"].items():
        pod = _pod_of(row)
        if pod is not None and isinstance(name, str):
            out[name] = pod
    return out


def _pod_of(row: Any) -> _Pod | None:
    try:
        uid, restarts, owner, count, share, seen_at, ended, processes = row
        pod = _Pod(
            uid=str(uid),
            restarts=int(restarts),
            owner=None if owner is None else str(owner),
            count=int(count),
            share=None if share is None else _number(share),
            seen_at=_number(seen_at),
            ended=bool(ended),
        )
        for key, (last, at, restarting, at_risk, inside, gap, absorb) in dict(processes).items():
            if not isinstance(last, dict) or len(pod.processes) >= MAX_PROCESSES_PER_POD:
                return None  # the whole pod or none of it: a process left out would count twice
            pod.processes[str(key)] = _Process(
                last={str(u): _number(v) for u, v in last.items()},
                seen_at=_number(at),
                restarting=bool(restarting),
                at_risk=_number(at_risk),
                inside=_number(inside),
                gap=_number(gap),
                absorb=_number(absorb),
            )
    except (TypeError, ValueError):
        return None
    return pod


def goodput_ratio(ledger: GoodputLedger) -> float | None:
    """``status.goodput.ratio`` without the rest of the status (the operator's gauge reads it
    every window); None while no process has reported goodput."""
    elapsed = ledger.elapsed_seconds
    return round(min(1.0, ledger.seconds[USE_PRODUCTIVE] / elapsed), 4) if elapsed > 0 else None


def _status_of(ledger: GoodputLedger) -> dict[str, Any] | None:
    """``GoodputLedger.status``."""
    elapsed = ledger.elapsed_seconds
    ratio = goodput_ratio(ledger)
    if ratio is None:
        return None
    out: dict[str, Any] = {
        "ratio": ratio,
        "elapsedSeconds": round(elapsed, 1),
        "productiveSeconds": round(ledger.seconds[USE_PRODUCTIVE], 1),
        "badputSeconds": {
            key: round(ledger.seconds[cause], 1)
            for cause, key in STATUS_KEYS.items()
            if cause not in ledger.unmeasured
        },
        "measured": [key for cause, key in STATUS_KEYS.items() if cause not in ledger.unmeasured],
        "restarts": ledger.restarts,
    }
    if ledger.unmeasured:
        out["ratioUpperBound"] = True
    lost = ledger.lost_accelerator_seconds()
    if lost is not None:
        out["acceleratorSecondsLost"] = round(lost, 1)
    if ledger.accelerators is not None:
        out["accelerators"] = round(ledger.accelerators, 3)
    handover = _handover_of(ledger)
    if handover is not None:
        out["handover"] = handover
    return out


def _stall(
    ledger: GoodputLedger,
    since: float | None,
    now: float | None,
    process_seconds: dict[str, float],
    accel: dict[str, float],
) -> None:
    """A stalled window's ``other`` is ``stalled`` (``update``)."""
    if since is None:
        ledger.stall_since, ledger.updated_at = None, now
        return
    if since != ledger.stall_since and ledger.updated_at is not None:
        earlier = min(ledger.seconds["other"], max(0.0, ledger.updated_at - since))
        ledger.seconds["other"] -= earlier
        ledger.seconds[USE_STALLED] += earlier
    ledger.stall_since, ledger.updated_at = since, now
    _as_stalled(process_seconds, accel)


def _as_stalled(*uses: dict[str, float]) -> None:
    """A stalled process's ``other`` time is ``stalled``: in place."""
    for figures in uses:
        figures[USE_STALLED] += figures["other"]
        figures["other"] = 0.0
