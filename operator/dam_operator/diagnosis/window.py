"""From two metric snapshots to one ``Observation``; per rank; from many pods to one job.

What each figure is, how it is read from the two snapshots and how pods combine it is the
signal table's (``diagnosis.signals``); this module runs it over pods and ranks. Counters
(``*_total``) are differences between the two snapshots. A counter that went down was reset
(a restarted process): like Prometheus, the AFTER value is taken as the increase. A series
absent from BEFORE is counted from zero. Gauges are read from AFTER and averaged across GPUs
(label ``gpu``); when ``gpu_uuids`` is given, samples with a ``uuid`` label outside the set
are ignored (other tenants' GPUs).

The window length is, in order: ``elapsed_seconds`` when given, the difference of
``dam_snapshot_timestamp_seconds``, the snapshots' own timestamps, and finally the
step-seconds counter's increase.

Garbage (NaN, infinities, negative values, ratios well above 1) never raises: the
signal is dropped and the engine sees it as missing.

Ranks: the probe's series carry a ``rank`` label when the process has a distributed rank,
and a pod may hold several ranks. ``rank_observations`` splits a pod's snapshots into one
observation per rank (keyed by ``RankId(pod, rank)``): the rank's own probe series, plus the
pod's shared series (container CPU and memory, and the GPUs — the rank's own GPU when the
pod has one GPU per rank). ``observation_from_snapshots`` sums the ranks of a pod and adds
the cross-rank figures (skew-corrected exposed communication, collective skew);
``job_window`` does the same across the pods of a job.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Unpack

from pydantic import ValidationError

from dam_contract import names
from dam_contract.snapshot import CompactSnapshot, Sample, Snapshot
from dam_operator.diagnosis import ranks as rank_rules
from dam_operator.diagnosis import signals
from dam_operator.diagnosis.extractors import Known, KnownArgs, Scrapes
from dam_operator.diagnosis.model import Observation, RankId
from dam_operator.diagnosis.series import attributed, counter_increase, increase, label_of
from dam_operator.diagnosis.signals import BENIGN_CLOCK_REASONS, GPU_RATIO_GAUGES, UNLIMITED_MEMORY_BYTES

__all__ = [
    "BENIGN_CLOCK_REASONS",
    "GPU_RATIO_GAUGES",
    "UNLIMITED_MEMORY_BYTES",
    "JobWindow",
    "PodWindow",
    "aggregate",
    "baseline",
    "counter_increase",
    "find_straggler",
    "furthest_steps",
    "job_window",
    "observation_from_snapshots",
    "rank_observations",
]

PROBE_SERIES: frozenset[str] = frozenset(
    {
        names.STEPS_TOTAL,
        names.STEP_SECONDS_TOTAL,
        names.DATALOADER_WAIT_SECONDS_TOTAL,
        names.PROBE_UP,
        names.BATCH_SIZE,
        names.MODEL_FLOPS_PER_STEP,
        names.COLLECTIVE_SECONDS_TOTAL,
        names.COLLECTIVE_EXPOSED_SECONDS_TOTAL,
        names.COLLECTIVES_TOTAL,
        names.COLLECTIVE_BYTES_TOTAL,
        names.GOODPUT_SECONDS_TOTAL,
        names.BADPUT_SECONDS_TOTAL,
        names.CHECKPOINTS_TOTAL,
    }
)
"""Series the in-process probe writes: one per rank process (label ``rank``)."""
POD_TOTALS: frozenset[str] = frozenset(
    {
        names.PROCESS_CPU_SECONDS_TOTAL,
        names.PROCESS_CPU_WAIT_SECONDS_TOTAL,
        names.PROCESSES,
        names.PROCESS_RESIDENT_MEMORY_BYTES,
    }
)
"""Pod-wide sums over processes: not given to one rank of a pod that holds several."""


def furthest_steps(before: Snapshot, after: Snapshot) -> float | None:
    """Steps the furthest process (rank) made between two snapshots; None without a step counter.

    What a window needs ``min_steps`` of: each rank of a job counts every step of it.
    """
    prev = before.series(names.STEPS_TOTAL)
    best: float | None = None
    for labels, value in after.series(names.STEPS_TOTAL).items():
        delta = increase(prev.get(labels), value)
        if delta is not None:
            best = delta if best is None else max(best, delta)
    return best


def baseline(snapshot: Snapshot) -> CompactSnapshot:
    """The part of a scrape the next window differences against: its counters and its time.

    A window reads its BEFORE snapshot only through ``counter_increase`` (every counter is
    named ``*_total``, the metric convention) and the snapshot's timestamp; gauges come from
    AFTER. Keeping only these holds a fraction of a real sidecar's exposition per pod
    between windows (its per-GPU gauges, info and limits go), and a ``CompactSnapshot`` holds
    them in a fifth of the memory of ``Sample`` objects.
    """
    keep = [
        sample
        for name in sorted(snapshot.names())
        if name.endswith("_total") or name in _BASELINE_GAUGES
        for sample in snapshot.samples(name)
    ]
    return CompactSnapshot(keep, snapshot.timestamp_seconds)


_BASELINE_GAUGES = frozenset({names.SNAPSHOT_TIMESTAMP_SECONDS, names.PROCESSES})
"""Gauges a baseline keeps: its time, and the process counts (the window's worker count is the
most either end saw: the last scrape of a finished job sees no workers)."""


def _build(fields: dict[str, Any]) -> Observation:
    """An Observation from the fields that validate; a field that does not is dropped."""
    data = {k: v for k, v in fields.items() if v is not None}
    for _ in range(len(data) + 1):
        try:
            return Observation(**data)
        except ValidationError as exc:
            bad = {str(err["loc"][0]) for err in exc.errors() if err.get("loc")}
            if not bad & set(data):
                break
            for key in bad:
                data.pop(key, None)
    return Observation()


def _fields(before: Snapshot, after: Snapshot, known: Known) -> dict[str, Any]:
    """Every signal of one pod's (or rank's) window (``signals.extract``)."""
    return signals.extract(Scrapes(before, after, known))


def observation_from_snapshots(before: Snapshot, after: Snapshot, **known: Unpack[KnownArgs]) -> Observation:
    """The window between two scrapes of one pod (or one ``dam run``). Explicit arguments (the
    fields of ``extractors.Known``) win.

    ``oom_killed`` is the caller's knowledge that the container was OOM-killed (Pod status
    ``lastState.terminated.reason == "OOMKilled"``; ``dam run``: the child killed by the OOM
    killer). With several ranks in the snapshots, the exposed communication and the
    collective skew are the cross-rank figures (see ``diagnosis.ranks``).
    """
    return _pod_observation(before, after, Known(**known), None)


def _pod_observation(
    before: Snapshot,
    after: Snapshot,
    known: Known,
    per_rank: Mapping[RankId, Observation] | None,
) -> Observation:
    """The pod's observation; its ranks' cross-rank figures from ``per_rank`` (split here if None)."""
    index = None
    if per_rank is not None:  # split from the same snapshots: their ranks are its keys
        rank_numbers = [r.rank for r in per_rank if r.rank is not None]
    else:
        index = _index(after, known.gpu_uuids)
        rank_numbers = index.numbers
    if not rank_numbers and per_rank is not None and len(per_rank) == 1:
        # A pod without ranks is its one process: ``_rank_observations`` read the same window.
        return next(iter(per_rank.values()))
    fields = _fields(before, after, known)
    if rank_numbers:
        fields["ranks"] = len(rank_numbers)
    if len(rank_numbers) > 1:
        if per_rank is None:
            per_rank = _rank_observations(before, after, "", known, index)
        fields.update(_cross_rank_fields(per_rank))
    return _build(fields)


# --- ranks ---------------------------------------------------------------------------


def _rank_number(raw: str | None) -> int | None:
    if raw is None or not raw.isdigit() or len(raw) > 7:
        return None
    return int(raw)


_GPU_SERIES: frozenset[str] = frozenset(
    {*GPU_RATIO_GAUGES.values(), names.GPU_MEMORY_USED_BYTES, names.GPU_SM_CLOCK_HERTZ}
)
"""The GPU series whose ``gpu`` labels name the pod's GPUs (``_rank_gpus``)."""


@dataclass(frozen=True)
class _RankIndex:
    """One snapshot's samples sorted by rank in one walk (``_index``): what the per-rank views,
    the rank numbers, the local ranks and the pod's GPUs are read from, without walking the
    snapshot again for each of them."""

    timestamp_seconds: float | None
    numbers: list[int]
    """The ranks whose probe series are in the snapshot, sorted."""
    own: dict[int, list[Sample]]
    """Each rank's own series (any series with a valid ``rank`` label), the label taken off; also
    of a rank without probe series here (the BEFORE scrape of a rank that AFTER's probe names)."""
    unranked: list[Sample]
    """Probe series without a ``rank`` label (a process without a rank beside ranked ones)."""
    has_unranked: bool
    """Such a series other than ``dam_probe_up`` (the pod's gauge, never per rank)."""
    shared: list[Sample]
    """The pod's other series, seen by every rank, but for ``totals``."""
    totals: list[Sample]
    """Pod-wide process totals (``POD_TOTALS``): left out of a rank's view when several."""
    local_ranks: dict[int, int]
    """``rank → local_rank`` from ``dam_process_rank_info`` (where the probe knows it)."""
    gpus: list[str]
    """The ``gpu`` labels of the attributed GPU series, in GPU order."""


def _index(snapshot: Snapshot, gpu_uuids: set[str] | None) -> _RankIndex:
    found: set[int] = set()
    own: dict[int, list[Sample]] = {}
    unranked: list[Sample] = []
    shared: list[Sample] = []
    totals: list[Sample] = []
    local: dict[int, int] = {}
    gpus: set[str] = set()
    has_unranked = False
    for metric in snapshot.names():
        probe, total, gpu_series = metric in PROBE_SERIES, metric in POD_TOTALS, metric in _GPU_SERIES
        info = metric == names.PROCESS_RANK_INFO
        for s in snapshot.samples(metric):
            raw = label_of(s.labels, names.RANK_LABEL)
            if raw is not None:
                rank = _rank_number(raw)
                if rank is None:
                    continue
                if probe:
                    found.add(rank)
                if info and (lr := s.label("local_rank")).isdigit() and len(lr) <= 7:
                    local[rank] = int(lr)
                own.setdefault(rank, []).append(_without_rank(s))
            elif probe:
                unranked.append(s)
                has_unranked = has_unranked or metric != names.PROBE_UP
            else:
                (totals if total else shared).append(s)
                if gpu_series and s.label("gpu") and attributed(s, gpu_uuids):
                    gpus.add(s.label("gpu"))
    numbers = sorted(found)
    return _RankIndex(
        timestamp_seconds=snapshot.timestamp_seconds,
        numbers=numbers,
        own=own,
        unranked=unranked,
        has_unranked=has_unranked,
        shared=shared,
        totals=totals,
        local_ranks=local,
        gpus=sorted(gpus, key=_gpu_sort_key),
    )


def _without_rank(sample: Sample) -> Sample:
    return Sample(sample.name, tuple(kv for kv in sample.labels if kv[0] != names.RANK_LABEL), sample.value)


def _gpu_sort_key(label: str) -> tuple[int, str]:
    return (int(label), "") if label.isdigit() else (1 << 30, label)


def _rank_gpus(after: _RankIndex) -> dict[int, str]:
    """Each rank's GPU (its ``gpu`` label), when the pod's ranks can be matched to its GPUs.

    Local rank i drives the pod's i-th attributed GPU (torchrun and the Kubeflow launchers set
    ``LOCAL_RANK`` so); without local ranks, ranks are matched to GPUs in order when the pod has
    exactly one GPU per rank. Otherwise every rank sees the pod's GPU averages.
    """
    numbers, gpus, local = after.numbers, after.gpus, after.local_ranks
    if len(numbers) < 2 or len(gpus) < 2:
        return {}
    if all(r in local and local[r] < len(gpus) for r in numbers):
        picked = [local[r] for r in numbers]
        if len(set(picked)) == len(picked):
            return {r: gpus[local[r]] for r in numbers}
    if len(gpus) != len(numbers):
        return {}
    return dict(zip(numbers, gpus, strict=True))


def _rank_views(
    index: _RankIndex, numbers: list[int], *, several: bool, gpus: Mapping[int, str]
) -> dict[int | None, Snapshot]:
    """The samples each rank sees: its own probe series and the pod's shared series.

    Key None holds the probe series without a ``rank`` label (a process without a rank beside
    ranked ones). Pod-wide process totals are left out when the pod holds several processes;
    a rank with its own GPU sees only that GPU.
    """
    shared = index.shared if several else [*index.shared, *index.totals]
    views: dict[int | None, Snapshot] = {}
    for rank in numbers:
        gpu = gpus.get(rank)
        seen = shared if gpu is None else [s for s in shared if not s.label("gpu") or s.label("gpu") == gpu]
        views[rank] = Snapshot(index.own.get(rank, []) + seen, index.timestamp_seconds)
    views[None] = Snapshot(index.unranked + shared, index.timestamp_seconds)
    return views


def rank_observations(
    before: Snapshot,
    after: Snapshot,
    *,
    pod: str = "",
    **known: Unpack[KnownArgs],
) -> dict[RankId, Observation]:
    """One observation per rank process of a pod's (or ``dam run``'s) snapshots.

    Keys are ``RankId(pod, rank)``; a snapshot whose probe series carry no ``rank`` gives one
    entry with rank None (the whole pod). Each rank gets its own probe series and the pod's
    shared ones: container CPU throttling and memory, node CPU, and the GPUs — its own GPU
    when the pod has exactly one GPU per rank, else the pod's averages. Pod-wide process
    totals (CPU seconds, RSS, worker count) are left out of a rank's view when the pod holds
    several ranks.
    """
    return _rank_observations(before, after, pod, Known(**known))


def _rank_observations(
    before: Snapshot, after: Snapshot, pod: str, known: Known, index: _RankIndex | None = None
) -> dict[RankId, Observation]:
    if index is None:  # each snapshot is walked once for every rank's view
        index = _index(after, known.gpu_uuids)
    numbers = index.numbers
    if not numbers:
        return {RankId(pod, None): _build(_fields(before, after, known))}
    unranked = index.has_unranked
    several = len(numbers) > 1 or unranked
    gpus = _rank_gpus(index)
    views_before = _rank_views(_index(before, known.gpu_uuids), numbers, several=several, gpus=gpus)
    views_after = _rank_views(index, numbers, several=several, gpus=gpus)
    out: dict[RankId, Observation] = {}
    for rank in numbers:
        fields = _fields(views_before[rank], views_after[rank], known)
        fields["ranks"] = 1
        out[RankId(pod, rank)] = _build(fields)
    if unranked:
        rest = _build(_fields(views_before[None], views_after[None], known))
        # Beside ranked processes, series without a rank that made no step in the window are
        # no rank of the job (e.g. totals carried over from a process that published before it
        # knew its rank, or a launcher): counting them would add an empty rank to the job.
        if rest.steps:
            out[RankId(pod, None)] = rest
    return out


def _cross_rank_fields(per_rank: Mapping[RankId, Observation]) -> dict[str, Any]:
    cr = rank_rules.cross_rank(per_rank)
    out: dict[str, Any] = {}
    rate = rank_rules.job_rate(per_rank)
    if rate is not None:
        out["steps_per_second"], out["job_steps"] = rate
    if cr.exposed_ratio is not None:
        out["exposed_communication_ratio"] = cr.exposed_ratio
    if cr.skew is not None:
        out["collective_skew"] = cr.skew
    return out


# --- many pods ----------------------------------------------------------------------


def aggregate(
    per_pod: Mapping[str, Observation], *, ranks: Mapping[RankId, Observation] | None = None
) -> Observation:
    """One observation for a job from its pods' observations (each signal's ``aggregate``).

    Counts and rates (steps, steps/s, CPU cores, CPU limits, GPUs, collective time and bytes,
    interconnect bytes/s, OOM kills, RSS) are summed; the data wait and collective ratios are
    weighted by each pod's step time; GPU ratios by its GPU count; the throttled ratio and
    the window are the mean and the longest; memory ratios are the fullest pod's. Batch size
    and GPU model are kept only when every pod agrees. The pods of one distributed job
    (each with ranks) run at the median pod's rate.

    ``ranks`` (every rank of the job, e.g. from ``rank_observations``) gives the cross-rank
    figures across pods: the least-waiting rank's exposed communication and the collective
    skew. Without it they are the pods' own (the smallest exposed ratio, the largest skew).
    """
    pods = list(per_pod.values())
    if not pods:
        return Observation()
    if len(pods) == 1:
        if ranks is None:
            return pods[0]
        return _build({**pods[0].model_dump(), **_cross_rank_fields(ranks)})
    fields = signals.combine(pods)
    if ranks is not None:
        fields.update(_cross_rank_fields(ranks))
    return _build(fields)


# --- a job: many pods, many ranks -------------------------------------------------------


@dataclass(frozen=True)
class PodWindow:
    """One pod's two scrapes and what the caller knows about it."""

    before: Snapshot
    after: Snapshot
    elapsed_seconds: float | None = None
    gpu_uuids: set[str] | None = None
    oom_killed: bool | None = None
    """The pod's training container was OOM-killed (Pod status ``lastState.terminated.reason``)."""
    starting: bool | None = None
    """The pod may still be starting (``Observation.starting``: its first minutes, a live run)."""
    oom_exit_code: int | None = None
    """The OOM-killed container's exit code (``Observation.oom_exit_code``)."""


@dataclass(frozen=True)
class JobWindow:
    """A job's window: the job-level observation, and the pods and ranks it was built from."""

    job: Observation
    pods: dict[str, Observation] = field(default_factory=dict)
    ranks: dict[RankId, Observation] = field(default_factory=dict)


def job_window(
    pods: Mapping[str, PodWindow],
    *,
    batch_size: int | None = None,
    flops_per_step: float | None = None,
    gpu_model: str | None = None,
) -> JobWindow:
    """The window of a job whose pods (and their ranks) are given: per pod, per rank, and the job.

    Pass ``result.job`` and ``result.ranks`` to ``diagnose(..., ranks=result.ranks)``.
    """
    per_pod: dict[str, Observation] = {}
    per_rank: dict[RankId, Observation] = {}
    for name in sorted(pods):
        w = pods[name]
        known = Known(
            w.elapsed_seconds,
            w.gpu_uuids,
            batch_size,
            flops_per_step,
            gpu_model,
            w.oom_killed,
            w.starting,
            w.oom_exit_code,
        )
        pod_ranks = _rank_observations(w.before, w.after, name, known)
        per_pod[name] = _pod_observation(w.before, w.after, known, pod_ranks)
        per_rank.update(pod_ranks)
    job = aggregate(per_pod, ranks=per_rank) if per_pod else Observation()
    return JobWindow(job=job, pods=per_pod, ranks=per_rank)


STRAGGLER_RATE_RATIO = rank_rules.STRAGGLER_RATE_RATIO
STRAGGLER_WAIT_GAP = rank_rules.STRAGGLER_WAIT_GAP


def find_straggler(per_pod: Mapping[str, Observation]) -> tuple[str, str] | None:
    """The pod that holds the others back, with a sentence saying why; None when no pod stands out.

    Kept for old callers: the step-rate and data-wait test over independent pods. New callers
    use ``diagnose(..., ranks=...)`` (``bottleneck.straggler``) or ``ranks.find_straggler``,
    which also find the straggler of a synchronous job.
    """
    found = rank_rules.find_straggler({RankId(pod, None): o for pod, o in per_pod.items()})
    if found is None or found.pod is None:
        return None
    return found.pod, found.evidence[0]
