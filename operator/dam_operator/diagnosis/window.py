"""From two metric snapshots to one ``Observation``; per rank; from many pods to one job.

Counters (``*_total``) are differences between the two snapshots. A counter that went
down was reset (a restarted process): like Prometheus, the AFTER value is taken as the
increase. A series absent from BEFORE is counted from zero. Gauges are read from
AFTER and averaged across GPUs (label ``gpu``); when ``gpu_uuids`` is given, samples
with a ``uuid`` label outside the set are ignored (other tenants' GPUs).

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

import math
import statistics
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from dam_operator.diagnosis import ranks as rank_rules
from dam_operator.diagnosis.model import Observation, RankId
from dam_sidecar import names
from dam_sidecar.promtext import CompactSnapshot, Labels, Sample, Snapshot

# Series of docs/architecture.md (metric names) for distributed jobs and memory.
COLLECTIVE_SECONDS_TOTAL = names.COLLECTIVE_SECONDS_TOTAL
COLLECTIVE_EXPOSED_SECONDS_TOTAL = names.COLLECTIVE_EXPOSED_SECONDS_TOTAL
COLLECTIVES_TOTAL = names.COLLECTIVES_TOTAL
COLLECTIVE_BYTES_TOTAL = names.COLLECTIVE_BYTES_TOTAL
GPU_NVLINK_BYTES_TOTAL = names.GPU_NVLINK_BYTES_TOTAL
GPU_PCIE_BYTES_TOTAL = names.GPU_PCIE_BYTES_TOTAL
CONTAINER_MEMORY_USAGE_BYTES = names.CONTAINER_MEMORY_USAGE_BYTES
CONTAINER_MEMORY_LIMIT_BYTES = names.CONTAINER_MEMORY_LIMIT_BYTES
CONTAINER_OOM_KILLS_TOTAL = names.CONTAINER_OOM_KILLS_TOTAL
PROCESS_RESIDENT_MEMORY_BYTES = names.PROCESS_RESIDENT_MEMORY_BYTES
PROCESS_RANK_INFO = names.PROCESS_RANK_INFO
RANK_LABEL = names.RANK_LABEL
PROBE_SERIES: frozenset[str] = frozenset(
    {
        names.STEPS_TOTAL,
        names.STEP_SECONDS_TOTAL,
        names.DATALOADER_WAIT_SECONDS_TOTAL,
        names.PROBE_UP,
        names.BATCH_SIZE,
        names.MODEL_FLOPS_PER_STEP,
        COLLECTIVE_SECONDS_TOTAL,
        COLLECTIVE_EXPOSED_SECONDS_TOTAL,
        COLLECTIVES_TOTAL,
        COLLECTIVE_BYTES_TOTAL,
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
        PROCESS_RESIDENT_MEMORY_BYTES,
    }
)
"""Pod-wide sums over processes: not given to one rank of a pod that holds several."""
BENIGN_CLOCK_REASONS: frozenset[str] = frozenset(
    {"gpu_idle", "applications_clocks_setting", "sync_boost", "display_clock_setting"}
)
"""NVML clock reasons that do not slow a busy GPU."""
UNLIMITED_MEMORY_BYTES = 2.0**60
"""A cgroup memory limit at or above this is "max": no limit."""

_RATIO_TOLERANCE = 1.05
"""Ratios up to this are clamped to 1 (sampling jitter); above it they are garbage."""

GPU_RATIO_GAUGES: Mapping[str, str] = {
    "gpu_utilization": names.GPU_UTILIZATION_RATIO,
    "gpu_memory_busy": names.GPU_MEMORY_BUSY_RATIO,
    "sm_active": names.GPU_SM_ACTIVE_RATIO,
    "sm_occupancy": names.GPU_SM_OCCUPANCY_RATIO,
    "tensor_active": names.GPU_TENSOR_ACTIVE_RATIO,
    "dram_bandwidth_utilization": names.GPU_DRAM_BANDWIDTH_UTILIZATION_RATIO,
}


def _valid(v: float | None) -> float | None:
    if v is None or not math.isfinite(v) or v < 0:
        return None
    return v


def _ratio(v: float | None) -> float | None:
    v = _valid(v)
    if v is None or v > _RATIO_TOLERANCE:
        return None
    return min(v, 1.0)


def _label(labels: Labels, key: str) -> str | None:
    for k, v in labels:
        if k == key:
            return v
    return None


def counter_increase(
    before: Snapshot, after: Snapshot, name: str, where: Callable[[Labels], bool] | None = None
) -> float | None:
    """Sum over series of the counter's increase; None when AFTER has no valid series."""
    prev = before.series(name)
    total: float | None = None
    for labels, value in after.series(name).items():
        if where is not None and not where(labels):
            continue
        a = _valid(value)
        if a is None:
            continue
        b = _valid(prev.get(labels))
        delta = a if b is None or a < b else a - b
        total = delta if total is None else total + delta
    return total


def furthest_steps(before: Snapshot, after: Snapshot) -> float | None:
    """Steps the furthest process (rank) made between two snapshots; None without a step counter.

    What a window needs ``min_steps`` of: each rank of a job counts every step of it.
    """
    prev = before.series(names.STEPS_TOTAL)
    best: float | None = None
    for labels, value in after.series(names.STEPS_TOTAL).items():
        a = _valid(value)
        if a is None:
            continue
        b = _valid(prev.get(labels))
        delta = a if b is None or a < b else a - b
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


def _role_count(snapshot: Snapshot, role: str) -> float | None:
    """``dam_processes{role}`` summed over its series; None when absent or garbage."""
    total: float | None = None
    for s in snapshot.samples(names.PROCESSES):
        count = _valid(s.value)
        if _label(s.labels, "role") == role and count is not None and count <= 100_000:
            total = count if total is None else total + count
    return total


def _gauge(snapshot: Snapshot, name: str) -> float | None:
    for s in snapshot.samples(name):
        v = _valid(s.value)
        if v is not None:
            return v
    return None


def _attribution_state(snapshot: Snapshot) -> str | None:
    """The ``state`` label of ``dam_gpu_attribution`` whose value is 1 (None when absent)."""
    for s in snapshot.samples(names.GPU_ATTRIBUTION):
        if s.value == 1.0:
            return s.label("state") or None
    return None


def _attributed(sample: Sample, gpu_uuids: set[str] | None) -> bool:
    if gpu_uuids is None:
        return True
    uuid = sample.label("uuid")
    return not uuid or uuid in gpu_uuids


def _gpu_key(sample: Sample) -> str:
    return sample.label("uuid") or sample.label("gpu") or ""


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


def observation_from_snapshots(
    before: Snapshot,
    after: Snapshot,
    *,
    elapsed_seconds: float | None = None,
    gpu_uuids: set[str] | None = None,
    batch_size: int | None = None,
    flops_per_step: float | None = None,
    gpu_model: str | None = None,
    oom_killed: bool | None = None,
) -> Observation:
    """The window between two scrapes of one pod (or one ``dam run``). Explicit arguments win.

    ``oom_killed`` is the caller's knowledge that the container was OOM-killed (Pod status
    ``lastState.terminated.reason == "OOMKilled"``; ``dam run``: the child killed by the OOM
    killer). With several ranks in the snapshots, the exposed communication and the
    collective skew are the cross-rank figures (see ``diagnosis.ranks``).
    """
    kwargs: dict[str, Any] = {
        "elapsed_seconds": elapsed_seconds,
        "gpu_uuids": gpu_uuids,
        "batch_size": batch_size,
        "flops_per_step": flops_per_step,
        "gpu_model": gpu_model,
        "oom_killed": oom_killed,
    }
    return _pod_observation(before, after, kwargs, None)


def _pod_observation(
    before: Snapshot,
    after: Snapshot,
    kwargs: dict[str, Any],
    per_rank: Mapping[RankId, Observation] | None,
) -> Observation:
    """The pod's observation; its ranks' cross-rank figures from ``per_rank`` (split here if None)."""
    fields = _fields(before, after, **kwargs)
    rank_numbers = _rank_numbers(after)
    if rank_numbers:
        fields["ranks"] = len(rank_numbers)
    if len(rank_numbers) > 1:
        if per_rank is None:
            per_rank = rank_observations(before, after, **kwargs)
        fields.update(_cross_rank_fields(per_rank))
    return _build(fields)


def _fields(
    before: Snapshot,
    after: Snapshot,
    *,
    elapsed_seconds: float | None,
    gpu_uuids: set[str] | None,
    batch_size: int | None,
    flops_per_step: float | None,
    gpu_model: str | None,
    oom_killed: bool | None,
) -> dict[str, Any]:
    step_s = counter_increase(before, after, names.STEP_SECONDS_TOTAL)
    wait_s = counter_increase(before, after, names.DATALOADER_WAIT_SECONDS_TOTAL)
    steps = counter_increase(before, after, names.STEPS_TOTAL)

    elapsed = _valid(elapsed_seconds) or None
    if elapsed is None:
        t0 = _gauge(before, names.SNAPSHOT_TIMESTAMP_SECONDS)
        t1 = _gauge(after, names.SNAPSHOT_TIMESTAMP_SECONDS)
        if t0 is not None and t1 is not None and t1 > t0:
            elapsed = t1 - t0
    if elapsed is None:
        t0, t1 = _valid(before.timestamp_seconds), _valid(after.timestamp_seconds)
        if t0 is not None and t1 is not None and t1 > t0:
            elapsed = t1 - t0
    if elapsed is None and step_s:
        elapsed = step_s

    fields: dict[str, Any] = {"window_seconds": elapsed, "steps": steps}
    if steps is not None and elapsed:
        fields["steps_per_second"] = steps / elapsed
    if steps and step_s is not None:
        fields["mean_step_seconds"] = step_s / steps
    if wait_s is not None and step_s:
        fields["data_wait_ratio"] = _ratio(wait_s / step_s)

    # GPUs: gauges from AFTER, averaged over the attributed GPUs.
    gpu_keys: set[str] = set()
    for field_name, metric in GPU_RATIO_GAUGES.items():
        values = []
        for s in after.samples(metric):
            if not _attributed(s, gpu_uuids):
                continue
            v = _ratio(s.value)
            if v is not None:
                values.append(v)
                gpu_keys.add(_gpu_key(s))
        if values:
            fields[field_name] = statistics.fmean(values)
    if gpu_keys:
        fields["gpu_count"] = len(gpu_keys)
    elif _gauge(after, names.NVML_UP) == 1.0 and _attribution_state(after) != "none":
        # NVML answers, the sidecar knows which GPUs are the job's, and none is: a CPU-only job.
        # With attribution "none" the job's GPUs are unknown, not absent: gpu_count stays None.
        fields["gpu_count"] = 0

    # Host CPU.
    if elapsed:
        for field_name, role in (
            ("main_cpu_cores", names.ROLE_MAIN),
            ("worker_cpu_cores", names.ROLE_WORKER),
        ):
            cpu = counter_increase(
                before,
                after,
                names.PROCESS_CPU_SECONDS_TOTAL,
                lambda labels, r=role: _label(labels, "role") == r,  # type: ignore[misc]
            )
            if cpu is not None:
                fields[field_name] = cpu / elapsed
        throttled = counter_increase(before, after, names.CONTAINER_CPU_THROTTLED_SECONDS_TOTAL)
        if throttled is not None:
            fields["cpu_throttled_ratio"] = min(1.0, throttled / elapsed)
    limit = _gauge(after, names.CONTAINER_CPU_LIMIT_CORES)
    if limit:
        fields["cpu_limit_cores"] = limit
    # Processes seen in the window: the most at either end (``dam run`` gives AFTER the most any
    # sample of the window saw). A run's last sample, taken after the command exited, sees no
    # loader workers, and a window that ends there still had them.
    counts: dict[str, float] = {}
    for role in (names.ROLE_MAIN, names.ROLE_WORKER):
        seen = _known((_role_count(before, role), _role_count(after, role)))
        if seen:
            counts[role] = max(seen)
    if names.ROLE_WORKER in counts:
        fields["worker_count"] = round(counts[names.ROLE_WORKER])
    # Run-queue delay (time runnable but waiting for a CPU) per process and wall second.
    if elapsed:
        for field_name, role in (
            ("cpu_wait_ratio", names.ROLE_MAIN),
            ("worker_cpu_wait_ratio", names.ROLE_WORKER),
        ):
            waited = counter_increase(
                before,
                after,
                names.PROCESS_CPU_WAIT_SECONDS_TOTAL,
                lambda labels, r=role: _label(labels, "role") == r,  # type: ignore[misc]
            )
            processes = counts.get(role, 1.0 if role == names.ROLE_MAIN else 0.0)
            if waited is not None and processes >= 1:
                # One thread waits at most the wall time: above it (jitter) is clamped to 1.
                fields[field_name] = min(1.0, waited / (elapsed * processes))
    node = _gauge(after, names.NODE_CPU_UTILIZATION_RATIO)
    if node is not None:
        fields["node_cpu_utilization"] = _ratio(node)

    # Workload description.
    if batch_size is None:
        sizes = [v for s in after.samples(names.BATCH_SIZE) if (v := _valid(s.value)) is not None]
        if sizes and max(sizes) <= 1e9:
            batch_size = round(max(sizes))
    fields["batch_size"] = batch_size
    if flops_per_step is None:
        flops = [
            (v, s.label(names.SOURCE_LABEL))
            for s in after.samples(names.MODEL_FLOPS_PER_STEP)
            if (v := _valid(s.value)) is not None
        ]
        if flops:
            flops_per_step = statistics.fmean(v for v, _ in flops)
            sources = {src for _, src in flops}
            # Every process measured its own (or an older sidecar without the label: declared).
            fields["flops_per_step_source"] = (
                names.FLOPS_MEASURED if sources == {names.FLOPS_MEASURED} else names.FLOPS_DECLARED
            )
    else:
        fields["flops_per_step_source"] = names.FLOPS_DECLARED
    fields["flops_per_step"] = flops_per_step
    fields.update(_checkpoint_fields(before, after, elapsed))
    if gpu_model is None:
        for s in after.samples(names.GPU_INFO):
            model = s.label("model") or s.label("name")
            if model and _attributed(s, gpu_uuids):
                gpu_model = model[:64]
                break
    fields["gpu_model"] = gpu_model

    # Collectives (probe).
    collective_s = counter_increase(before, after, COLLECTIVE_SECONDS_TOTAL)
    exposed_s = counter_increase(before, after, COLLECTIVE_EXPOSED_SECONDS_TOTAL)
    fields["collective_seconds"] = collective_s
    fields["collective_exposed_seconds"] = exposed_s
    fields["collectives"] = counter_increase(before, after, COLLECTIVES_TOTAL)
    fields["collective_bytes"] = counter_increase(before, after, COLLECTIVE_BYTES_TOTAL)
    # A process that ran no collective in the window (a single-process job exports the counters
    # at 0) has no communication figures: "exposed communication 0 %" would be noise there.
    communicated = bool(fields["collectives"]) or bool(collective_s)
    if communicated and collective_s is not None and step_s:
        fields["collective_ratio"] = collective_s / step_s
    if communicated and exposed_s is not None and step_s:
        fields["exposed_communication_ratio"] = _ratio(exposed_s / step_s)

    # Interconnect.
    def attributed(labels: Labels) -> bool:
        uuid = _label(labels, "uuid")
        return gpu_uuids is None or not uuid or uuid in gpu_uuids

    if elapsed:
        nvlink = counter_increase(before, after, GPU_NVLINK_BYTES_TOTAL, attributed)
        if nvlink is not None:
            fields["nvlink_bytes_per_second"] = nvlink / elapsed
        pcie = counter_increase(before, after, GPU_PCIE_BYTES_TOTAL, attributed)
        if pcie is not None:
            fields["pcie_bytes_per_second"] = pcie / elapsed
    if "pcie_bytes_per_second" not in fields:
        rates = [
            v
            for metric in (names.GPU_PCIE_TX_BYTES_PER_SECOND, names.GPU_PCIE_RX_BYTES_PER_SECOND)
            for s in after.samples(metric)
            if _attributed(s, gpu_uuids) and (v := _valid(s.value)) is not None
        ]
        if rates:
            fields["pcie_bytes_per_second"] = _fsum(rates)

    # Memory.
    totals = {
        _gpu_key(s): v
        for s in after.samples(names.GPU_MEMORY_TOTAL_BYTES)
        if _attributed(s, gpu_uuids) and (v := _valid(s.value))
    }
    used_ratios = [
        r
        for s in after.samples(names.GPU_MEMORY_USED_BYTES)
        if _attributed(s, gpu_uuids)
        and (v := _valid(s.value)) is not None
        and (total := totals.get(_gpu_key(s)))
        and (r := _ratio(v / total)) is not None
    ]
    if used_ratios:
        fields["gpu_memory_used_ratio"] = max(used_ratios)
    usage = _gauge(after, CONTAINER_MEMORY_USAGE_BYTES)
    mem_limit = _gauge(after, CONTAINER_MEMORY_LIMIT_BYTES)
    if mem_limit and mem_limit < UNLIMITED_MEMORY_BYTES:
        fields["container_memory_limit_bytes"] = mem_limit
        if usage is not None:
            fields["container_memory_ratio"] = _ratio(usage / mem_limit)
    fields["oom_kills"] = counter_increase(before, after, CONTAINER_OOM_KILLS_TOTAL)
    fields["loader_worker_kills"] = counter_increase(before, after, names.DATALOADER_WORKER_KILLS_TOTAL)
    fields["oom_killed"] = oom_killed
    for field_name, role in (("main_rss_bytes", names.ROLE_MAIN), ("worker_rss_bytes", names.ROLE_WORKER)):
        rss = [
            v
            for s in after.samples(PROCESS_RESIDENT_MEMORY_BYTES)
            if s.label("role") == role and (v := _valid(s.value)) is not None
        ]
        if rss:
            fields[field_name] = _fsum(rss)

    # Clocks.
    clocks = [
        v
        for s in after.samples(names.GPU_SM_CLOCK_HERTZ)
        if _attributed(s, gpu_uuids) and (v := _valid(s.value)) is not None
    ]
    if clocks:
        fields["sm_clock_hertz"] = statistics.fmean(clocks)
    reasons = [s for s in after.samples(names.GPU_THROTTLE_REASON) if _attributed(s, gpu_uuids)]
    if reasons:
        fields["gpu_slowdown_reasons"] = tuple(
            sorted(
                {
                    s.label("reason")[:64]
                    for s in reasons
                    if s.value == 1.0 and s.label("reason") and s.label("reason") not in BENIGN_CLOCK_REASONS
                }
            )
        )
    return fields


def _checkpoint_fields(before: Snapshot, after: Snapshot, elapsed: float | None) -> dict[str, Any]:
    """Checkpoint badput in the window: the most-saving process's (a synchronous job waits for it)."""
    prev = before.series(names.BADPUT_SECONDS_TOTAL)
    saves_prev = before.series(names.CHECKPOINTS_TOTAL)
    saves_after = after.series(names.CHECKPOINTS_TOTAL)
    best: tuple[float, float | None] | None = None
    for labels, value in after.series(names.BADPUT_SECONDS_TOTAL).items():
        if _label(labels, names.CAUSE_LABEL) != names.CAUSE_CHECKPOINT or (a := _valid(value)) is None:
            continue
        b = _valid(prev.get(labels))
        delta = a if b is None or a < b else a - b
        rank = tuple(kv for kv in labels if kv[0] != names.CAUSE_LABEL)
        saves = None
        if (sa := _valid(saves_after.get(rank))) is not None:
            sb = _valid(saves_prev.get(rank))
            saves = sa if sb is None or sa < sb else sa - sb
        if best is None or delta > best[0]:
            best = (delta, saves)
    if best is None:
        return {}
    out: dict[str, Any] = {"checkpoint_seconds": best[0], "checkpoints": best[1]}
    if elapsed:
        out["checkpoint_ratio"] = _ratio(best[0] / elapsed)
    return out


# --- ranks ---------------------------------------------------------------------------


def _rank_of(labels: Labels) -> int | None:
    raw = _label(labels, RANK_LABEL)
    if raw is None or not raw.isdigit() or len(raw) > 7:
        return None
    return int(raw)


def _rank_numbers(snapshot: Snapshot) -> list[int]:
    """The ranks whose probe series are in the snapshot, sorted."""
    found: set[int] = set()
    for metric in PROBE_SERIES:
        for s in snapshot.samples(metric):
            rank = _rank_of(s.labels)
            if rank is not None:
                found.add(rank)
    return sorted(found)


def _has_unranked_probe_series(snapshot: Snapshot) -> bool:
    # dam_probe_up is the pod's gauge, never per rank: it does not make an unranked process.
    return any(
        _label(s.labels, RANK_LABEL) is None
        for metric in PROBE_SERIES - {names.PROBE_UP}
        for s in snapshot.samples(metric)
    )


def _without_rank(sample: Sample) -> Sample:
    return Sample(sample.name, tuple(kv for kv in sample.labels if kv[0] != RANK_LABEL), sample.value)


def _gpu_sort_key(label: str) -> tuple[int, str]:
    return (int(label), "") if label.isdigit() else (1 << 30, label)


def _local_ranks(after: Snapshot) -> dict[int, int]:
    """``rank → local_rank`` from ``dam_process_rank_info`` (where the probe knows it)."""
    out: dict[int, int] = {}
    for s in after.samples(PROCESS_RANK_INFO):
        rank, local = _rank_of(s.labels), s.label("local_rank")
        if rank is not None and local.isdigit() and len(local) <= 7:
            out[rank] = int(local)
    return out


def _rank_gpus(after: Snapshot, rank_numbers: list[int], gpu_uuids: set[str] | None) -> dict[int, str]:
    """Each rank's GPU (its ``gpu`` label), when the pod's ranks can be matched to its GPUs.

    Local rank i drives the pod's i-th attributed GPU (torchrun and the Kubeflow launchers set
    ``LOCAL_RANK`` so); without local ranks, ranks are matched to GPUs in order when the pod has
    exactly one GPU per rank. Otherwise every rank sees the pod's GPU averages.
    """
    found: set[str] = set()
    for metric in (*GPU_RATIO_GAUGES.values(), names.GPU_MEMORY_USED_BYTES, names.GPU_SM_CLOCK_HERTZ):
        for s in after.samples(metric):
            if _attributed(s, gpu_uuids) and s.label("gpu") and _label(s.labels, RANK_LABEL) is None:
                found.add(s.label("gpu"))
    gpus = sorted(found, key=_gpu_sort_key)
    if len(rank_numbers) < 2 or len(gpus) < 2:
        return {}
    local = _local_ranks(after)
    if all(r in local and local[r] < len(gpus) for r in rank_numbers):
        picked = [local[r] for r in rank_numbers]
        if len(set(picked)) == len(picked):
            return {r: gpus[local[r]] for r in rank_numbers}
    if len(gpus) != len(rank_numbers):
        return {}
    return dict(zip(rank_numbers, gpus, strict=True))


def _rank_views(
    snapshot: Snapshot, numbers: list[int], *, several: bool, gpus: Mapping[int, str]
) -> dict[int | None, Snapshot]:
    """The samples each rank sees: its own probe series and the pod's shared series.

    One pass over the snapshot. Key None holds the probe series without a ``rank`` label
    (a process without a rank beside ranked ones). Pod-wide process totals are left out
    when the pod holds several processes; a rank with its own GPU sees only that GPU.
    """
    own: dict[int, list[Sample]] = {r: [] for r in numbers}
    unranked: list[Sample] = []
    shared: list[Sample] = []
    for metric in snapshot.names():
        probe = metric in PROBE_SERIES
        skip_totals = several and metric in POD_TOTALS
        for s in snapshot.samples(metric):
            if _label(s.labels, RANK_LABEL) is not None:
                rank = _rank_of(s.labels)
                if rank is not None and rank in own:
                    own[rank].append(_without_rank(s))
            elif probe:
                unranked.append(s)
            elif not skip_totals:
                shared.append(s)
    views: dict[int | None, Snapshot] = {}
    for rank in numbers:
        gpu = gpus.get(rank)
        seen = shared if gpu is None else [s for s in shared if not s.label("gpu") or s.label("gpu") == gpu]
        views[rank] = Snapshot(own[rank] + seen, snapshot.timestamp_seconds)
    views[None] = Snapshot(unranked + shared, snapshot.timestamp_seconds)
    return views


def rank_observations(
    before: Snapshot,
    after: Snapshot,
    *,
    pod: str = "",
    elapsed_seconds: float | None = None,
    gpu_uuids: set[str] | None = None,
    batch_size: int | None = None,
    flops_per_step: float | None = None,
    gpu_model: str | None = None,
    oom_killed: bool | None = None,
) -> dict[RankId, Observation]:
    """One observation per rank process of a pod's (or ``dam run``'s) snapshots.

    Keys are ``RankId(pod, rank)``; a snapshot whose probe series carry no ``rank`` gives one
    entry with rank None (the whole pod). Each rank gets its own probe series and the pod's
    shared ones: container CPU throttling and memory, node CPU, and the GPUs — its own GPU
    when the pod has exactly one GPU per rank, else the pod's averages. Pod-wide process
    totals (CPU seconds, RSS, worker count) are left out of a rank's view when the pod holds
    several ranks.
    """
    numbers = _rank_numbers(after)
    kwargs: dict[str, Any] = {
        "elapsed_seconds": elapsed_seconds,
        "gpu_uuids": gpu_uuids,
        "batch_size": batch_size,
        "flops_per_step": flops_per_step,
        "gpu_model": gpu_model,
        "oom_killed": oom_killed,
    }
    if not numbers:
        return {RankId(pod, None): _build(_fields(before, after, **kwargs))}
    unranked = _has_unranked_probe_series(after)
    several = len(numbers) > 1 or unranked
    gpus = _rank_gpus(after, numbers, gpu_uuids)
    views_before = _rank_views(before, numbers, several=several, gpus=gpus)
    views_after = _rank_views(after, numbers, several=several, gpus=gpus)
    out: dict[RankId, Observation] = {}
    for rank in numbers:
        fields = _fields(views_before[rank], views_after[rank], **kwargs)
        fields["ranks"] = 1
        out[RankId(pod, rank)] = _build(fields)
    if unranked:
        rest = _build(_fields(views_before[None], views_after[None], **kwargs))
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


def _known(values: Iterable[float | int | None]) -> list[float]:
    return [float(v) for v in values if v is not None]


def _fsum(values: Iterable[float]) -> float | None:
    """``math.fsum``, None when the sum overflows (garbage in: the signal is dropped)."""
    try:
        total = math.fsum(values)
    except OverflowError:
        return None
    return total if math.isfinite(total) else None


def _median(values: Iterable[float | int | None]) -> float | None:
    known = _known(values)
    return statistics.median(known) if known else None


def _sum(values: Iterable[float | int | None]) -> float | None:
    known = _known(values)
    return _fsum(known) if known else None


def _weighted(pairs: Iterable[tuple[float | None, float]]) -> float | None:
    known = [(v, w) for v, w in pairs if v is not None and w > 0]
    total = _fsum(w for _, w in known)
    if not known or total is None or total <= 0:
        return None
    weighted = _fsum(v * w for v, w in known)
    return None if weighted is None else weighted / total


def _common(values: Iterable[Any]) -> Any:
    known = {v for v in values if v is not None}
    return known.pop() if len(known) == 1 else None


def aggregate(
    per_pod: Mapping[str, Observation], *, ranks: Mapping[RankId, Observation] | None = None
) -> Observation:
    """One observation for a job from its pods' observations.

    Counts and rates (steps, steps/s, CPU cores, CPU limits, GPUs, collective time and bytes,
    interconnect bytes/s, OOM kills, RSS) are summed; the data wait and collective ratios are
    weighted by each pod's step time; GPU ratios by its GPU count; the throttled ratio and
    the window are the mean and the longest; memory ratios are the fullest pod's. Batch size
    and GPU model are kept only when every pod agrees.

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

    def step_weight(o: Observation) -> float:
        if o.steps is not None and o.mean_step_seconds is not None:
            return o.steps * o.mean_step_seconds
        return 0.0

    use_step_time = all(step_weight(o) > 0 for o in pods)
    use_steps = all(o.steps for o in pods)
    wait_weights = [
        step_weight(o) if use_step_time else (float(o.steps or 0) if use_steps else 1.0) for o in pods
    ]
    gpu_weights = [float(o.gpu_count) if o.gpu_count else 1.0 for o in pods]
    steps_weights = [float(o.steps) if o.steps else 1.0 for o in pods]

    fields: dict[str, Any] = {
        "window_seconds": max(_known(o.window_seconds for o in pods), default=None),
        "steps": _sum(o.steps for o in pods),
        "steps_per_second": _sum(o.steps_per_second for o in pods),
        "data_wait_ratio": _weighted((o.data_wait_ratio, w) for o, w in zip(pods, wait_weights, strict=True)),
        "mean_step_seconds": _weighted(
            (o.mean_step_seconds, w) for o, w in zip(pods, steps_weights, strict=True)
        ),
        "main_cpu_cores": _sum(o.main_cpu_cores for o in pods),
        "worker_cpu_cores": _sum(o.worker_cpu_cores for o in pods),
        "cpu_limit_cores": _sum(o.cpu_limit_cores for o in pods),
        "cpu_throttled_ratio": _weighted((o.cpu_throttled_ratio, 1.0) for o in pods),
        "node_cpu_utilization": _weighted((o.node_cpu_utilization, 1.0) for o in pods),
        "batch_size": _common(o.batch_size for o in pods),
        "flops_per_step": _weighted((o.flops_per_step, w) for o, w in zip(pods, steps_weights, strict=True)),
        "bytes_per_step": _weighted((o.bytes_per_step, w) for o, w in zip(pods, steps_weights, strict=True)),
        "gpu_model": _common(o.gpu_model for o in pods),
    }
    if all(o.ranks for o in pods):
        # Pods of one distributed job (without the ranks' own figures): the ranks advance together.
        rates = _known(o.steps_per_second for o in pods)
        fields["steps_per_second"] = statistics.median(rates) if rates else None
        fields["job_steps"] = _median(o.job_steps if o.job_steps is not None else o.steps for o in pods)
    counts = _known(o.gpu_count for o in pods)
    fields["gpu_count"] = round(math.fsum(counts)) if counts else None
    workers = _known(o.worker_count for o in pods)
    fields["worker_count"] = round(math.fsum(workers)) if workers else None
    for name in GPU_RATIO_GAUGES:
        fields[name] = _weighted((getattr(o, name), w) for o, w in zip(pods, gpu_weights, strict=True))
    for name in ("data_wait_ratio", "cpu_throttled_ratio", "node_cpu_utilization", *GPU_RATIO_GAUGES):
        if fields[name] is not None:
            fields[name] = min(1.0, max(0.0, fields[name]))

    wait_pairs = list(zip(pods, wait_weights, strict=True))
    for name in (
        "collective_seconds",
        "collective_exposed_seconds",
        "collectives",
        "collective_bytes",
        "nvlink_bytes_per_second",
        "pcie_bytes_per_second",
        "oom_kills",
        "loader_worker_kills",
        "main_rss_bytes",
        "worker_rss_bytes",
    ):
        fields[name] = _sum(getattr(o, name) for o in pods)
    fields["collective_ratio"] = _weighted((o.collective_ratio, w) for o, w in wait_pairs)
    rank_counts = [o.ranks for o in pods]
    if any(r is not None for r in rank_counts):
        fields["ranks"] = sum(1 if r is None else r for r in rank_counts)
    fields["exposed_communication_ratio"] = min(
        _known(o.exposed_communication_ratio for o in pods), default=None
    )
    fields["collective_skew"] = max(_known(o.collective_skew for o in pods), default=None)
    if ranks is not None:
        fields.update(_cross_rank_fields(ranks))
    fields["gpu_memory_used_ratio"] = max(_known(o.gpu_memory_used_ratio for o in pods), default=None)
    # The most contended pod's run-queue delay: a synchronous job runs at its slowest pod's pace.
    fields["cpu_wait_ratio"] = max(_known(o.cpu_wait_ratio for o in pods), default=None)
    fields["worker_cpu_wait_ratio"] = max(_known(o.worker_cpu_wait_ratio for o in pods), default=None)
    fullest = max(
        (o for o in pods if o.container_memory_ratio is not None),
        key=lambda o: o.container_memory_ratio or 0.0,
        default=None,
    )
    if fullest is not None:
        fields["container_memory_ratio"] = fullest.container_memory_ratio
        fields["container_memory_limit_bytes"] = fullest.container_memory_limit_bytes
    killed = [o.oom_killed for o in pods if o.oom_killed is not None]
    fields["oom_killed"] = any(killed) if killed else None
    fields["sm_clock_hertz"] = _weighted(
        (o.sm_clock_hertz, w) for o, w in zip(pods, gpu_weights, strict=True)
    )
    slow = [o.gpu_slowdown_reasons for o in pods if o.gpu_slowdown_reasons is not None]
    fields["gpu_slowdown_reasons"] = tuple(sorted({r for rs in slow for r in rs})) if slow else None
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
        kwargs: dict[str, Any] = {
            "elapsed_seconds": w.elapsed_seconds,
            "gpu_uuids": w.gpu_uuids,
            "batch_size": batch_size,
            "flops_per_step": flops_per_step,
            "gpu_model": gpu_model,
            "oom_killed": w.oom_killed,
        }
        pod_ranks = rank_observations(w.before, w.after, pod=name, **kwargs)
        per_pod[name] = _pod_observation(w.before, w.after, kwargs, pod_ranks)
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
