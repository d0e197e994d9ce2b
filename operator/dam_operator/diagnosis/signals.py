"""The signal table: one entry per figure of a window, and what every entry drives.

Each ``Signal`` says, in one place, for one field of ``Observation``:

- ``extract`` — how its value for one pod (or one rank) is read from the two scrapes of a
  window: one of a few kinds (``Increase``, ``Rate``, ``Quotient``, ``Gauge``, ``FirstOf``),
  or ``Custom`` with a small named function for the few no kind describes;
- ``aggregate`` — how the pods of a job combine (an ``Agg``, or a named function);
- ``status`` — its key in ``status.metrics`` (camelCase, docs/architecture.md; None when the
  figure is not in the status) and ``description``, that key's description in the CRD;
- ``unit`` — what its number means (a mean of ``Unit.RATIO`` figures is kept within 0–1).

The kinds and the window's two scrapes they read (``Scrapes``) are in ``diagnosis.extractors``.
``diagnosis.window`` runs the table: ``extract`` for every pod and rank, ``combine`` for a job
of several pods. ``model.WindowMetrics`` (``status.metrics``) shows the window's observation
through ``status_values``, and deploy/render.py writes the CRD's ``status.metrics`` schema
from the entries with a status key (the key, a type from the field's Python type, the
description). The rules read the typed ``Observation`` these build, never a dict.

To add a signal: its source exports a series (the sidecar: ``dam_contract/names.py`` and its
collector), an ``Observation`` field holds it, one entry here says the rest; then run
``deploy/render.py`` (docs/CONTRIBUTING.md, "Add a signal").
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from dam_contract import names
from dam_operator.diagnosis import series
from dam_operator.diagnosis.extractors import (
    Check,
    Combine,
    Custom,
    Extractor,
    FirstOf,
    Gauge,
    Increase,
    Quotient,
    Rate,
    Scrapes,
)
from dam_operator.diagnosis.observation import Observation

BENIGN_CLOCK_REASONS: frozenset[str] = frozenset(
    {"gpu_idle", "applications_clocks_setting", "sync_boost", "display_clock_setting"}
)
"""NVML clock reasons that do not slow a busy GPU."""
UNLIMITED_MEMORY_BYTES = 2.0**60
"""A cgroup memory limit at or above this is "max": no limit."""


class Unit(StrEnum):
    """What a signal's number means (base units, docs/architecture.md)."""

    RATIO = "ratio 0-1"
    SECONDS_PER_SECOND = "seconds per second (above 1 when overlapping)"
    SECONDS = "seconds"
    COUNT = "count"
    PER_SECOND = "per second"
    CORES = "cores (CPU seconds per second)"
    BYTES = "bytes"
    BYTES_PER_SECOND = "bytes per second"
    HERTZ = "hertz"
    FLOPS = "FLOPs"
    TEXT = "text"
    FLAG = "true or false"


# --- how pods combine --------------------------------------------------------------------------


class Agg(StrEnum):
    """How the pods of a job combine a signal (``combine``)."""

    SUM = "sum"
    """Counts and rates add up (steps, cores, bytes/s)."""
    COUNT = "count"
    """A whole number that adds up (GPUs, workers)."""
    MAX = "max"
    MIN = "min"
    MEAN = "mean"
    """Every pod alike."""
    STEP_TIME_MEAN = "step-time-weighted mean"
    """Weighted by each pod's step time (else its steps, else alike): shares of the step."""
    STEPS_MEAN = "steps-weighted mean"
    """Weighted by each pod's steps: figures per step."""
    GPU_MEAN = "GPU-weighted mean"
    """Weighted by each pod's GPU count: GPU gauges."""
    COMMON = "common"
    """Kept only when every pod that knows it agrees."""
    ANY = "any"
    """True when any pod says so (None when none knows)."""
    UNION = "union"
    """Every value any pod has, sorted."""
    NONE = "none"
    """Not combined: a job of several pods has none (a single pod keeps its own)."""


Combiner = Callable[[Sequence[Observation]], Any]
"""A named function of the pods' observations, for a signal no ``Agg`` describes."""


@dataclass(frozen=True)
class Signal:
    """One figure of a window: the ``Observation`` field ``name`` and everything about it."""

    name: str
    unit: Unit
    extract: Extractor | None
    """None: not read from a pod's scrapes (the caller's, or only across ranks)."""
    aggregate: Agg | Combiner
    status: str | None = None
    """Its key in ``status.metrics`` (None: not in the status)."""
    description: str | None = None
    """The status key's description in the CRD (``kubectl explain``); required with ``status``."""

    def __post_init__(self) -> None:
        if self.status is not None and not self.description:
            raise ValueError(f"signal {self.name}: a status key needs its description")

    @property
    def metrics(self) -> tuple[str, ...]:
        """The metric names it reads."""
        return () if self.extract is None else self.extract.metrics


# --- custom readings ----------------------------------------------------------------------------


def _communicated(s: Scrapes) -> bool:
    """A process that ran no collective in the window (a single-process job exports the counters
    at 0) has no communication figures: "exposed communication 0 %" would be noise there."""
    return bool(s.increase(names.COLLECTIVES_TOTAL)) or bool(s.increase(names.COLLECTIVE_SECONDS_TOTAL))


def _process_counts(s: Scrapes) -> dict[str, float]:
    """Processes by role seen in the window: the most at either end (``dam run`` gives AFTER the
    most any sample of the window saw). A run's last sample, taken after the command exited, sees
    no loader workers, and a window that ends there still had them."""
    counts: dict[str, float] = {}
    for role in (names.ROLE_MAIN, names.ROLE_WORKER):
        seen = series.known((series.role_count(s.before, role), series.role_count(s.after, role)))
        if seen:
            counts[role] = max(seen)
    return counts


def _processes(s: Scrapes, role: str) -> float | None:
    return s.memo(_process_counts).get(role)


def _worker_count(s: Scrapes) -> int | None:
    workers = _processes(s, names.ROLE_WORKER)
    return None if workers is None else round(workers)


def _lowest(s: Scrapes, metric: str) -> float | None:
    """The lowest valid sample of a per-rank gauge in AFTER: a setting every rank has at least."""
    values = [v for sample in s.after.samples(metric) if (v := series.valid(sample.value)) is not None]
    return min(values) if values else None


def _loader_count(metric: str) -> Custom:
    def read(s: Scrapes) -> int | None:
        value = _lowest(s, metric)
        return None if value is None or not 0 <= value <= 100_000 else round(value)

    return Custom(read, (metric,))


def _loader_switch(metric: str) -> Custom:
    def read(s: Scrapes) -> bool | None:
        value = _lowest(s, metric)
        return None if value is None else value >= 0.5

    return Custom(read, (metric,))


def _main_killed_first(pods: Sequence[Observation]) -> int | None:
    """The exit code of an OOM-killed pod: 137 (its training process killed) when any pod has it."""
    codes = [o.oom_exit_code for o in pods if o.oom_exit_code is not None]
    return 137 if 137 in codes else (codes[0] if codes else None)


def _cpu_wait(s: Scrapes, role: str) -> float | None:
    """Run-queue delay (time runnable but waiting for a CPU) per process and wall second.

    Unknown (None) when the window's start has no such series: an increase needs two samples of
    the counter (as Prometheus's ``increase`` does). A window without one (a pod's first, after a
    gap) was judged from the delay its processes counted before it, over a length taken from
    other counters: a sleeping loader's trainer on the real node read 100 % beside a 49 % data wait."""
    if not s.elapsed:
        return None
    if not any(
        series.label_of(labels, "role") == role
        for labels in s.before.series(names.PROCESS_CPU_WAIT_SECONDS_TOTAL)
    ):
        return None
    waited = s.increase(names.PROCESS_CPU_WAIT_SECONDS_TOTAL, role)
    processes = _processes(s, role)
    if processes is None:
        processes = 1.0 if role == names.ROLE_MAIN else 0.0
    if waited is None or processes < 1:
        return None
    # One thread waits at most the wall time: above it (jitter) is clamped to 1.
    return min(1.0, waited / (s.elapsed * processes))


def _main_cpu_wait(s: Scrapes) -> float | None:
    return _cpu_wait(s, names.ROLE_MAIN)


def _worker_cpu_wait(s: Scrapes) -> float | None:
    return _cpu_wait(s, names.ROLE_WORKER)


def _gpu_count(s: Scrapes) -> int | None:
    """The job's GPUs with a valid utilization gauge (else with an info series: MIG devices); 0 for
    a job NVML knows has none."""
    keys = {key for metric in GPU_RATIO_GAUGES.values() for key, _ in s.gpu_values(metric, Check.RATIO)}
    if not keys:  # a MIG device has no utilization gauge (NOT_SUPPORTED): its info series says it is there
        keys = {
            series.gpu_key(sample)
            for sample in s.after.samples(names.GPU_INFO)
            if series.attributed(sample, s.known.gpu_uuids)
        }
    if keys:
        return len(keys)
    if series.first_gauge(s.after, names.NVML_UP) == 1.0 and series.attribution_state(s.after) != "none":
        # NVML answers, the sidecar knows which GPUs are the job's, and none is: a CPU-only job.
        # With attribution "none" the job's GPUs are unknown, not absent: gpu_count stays None.
        return 0
    return None


def _batch_size(s: Scrapes) -> int | None:
    if s.known.batch_size is not None:
        return s.known.batch_size
    sizes = [
        v for sample in s.after.samples(names.BATCH_SIZE) if (v := series.valid(sample.value)) is not None
    ]
    return round(max(sizes)) if sizes and max(sizes) <= 1e9 else None


def _flops(s: Scrapes) -> tuple[float | None, str | None]:
    """FLOPs per step and where they come from: the caller's (declared), else the probes' mean."""
    if s.known.flops_per_step is not None:
        return s.known.flops_per_step, names.FLOPS_DECLARED
    flops = [
        (v, sample.label(names.SOURCE_LABEL))
        for sample in s.after.samples(names.MODEL_FLOPS_PER_STEP)
        if (v := series.valid(sample.value)) is not None
    ]
    if not flops:
        return None, None
    # Every process measured its own (or an older sidecar without the label: declared).
    sources = {src for _, src in flops}
    source = names.FLOPS_MEASURED if sources == {names.FLOPS_MEASURED} else names.FLOPS_DECLARED
    return statistics.fmean(v for v, _ in flops), source


def _flops_per_step(s: Scrapes) -> float | None:
    return s.memo(_flops)[0]


def _flops_source(s: Scrapes) -> str | None:
    return s.memo(_flops)[1]


FLOPS_UNAVAILABLE_TEXT: Mapping[str, str] = {
    "off": "counting is turned off (DAM_PROBE_FLOPS=0)",
    "compiled": "the model runs compiled (torch.compile): the counter sees no op of a compiled region",
    "low-memory": "the container's memory limit leaves under 512 MiB free for the counter",
    "counter-error": "the FLOP counter raised ({detail}); the op ran uncounted and counting stopped",
    "higher-order-op": "a higher-order op ({detail}) ran uncounted; counting stopped",
    "no-formula": "no op of the counted step has a FLOP formula (custom kernels only)",
    "cut-short": "the loader ran out while counting, three times",
    "mode-stack": "the step left a dispatch mode of its own open across batches",
}
"""``dam_model_flops_unavailable``'s reasons as sentences ("FLOPs unavailable: <sentence>")."""


def _flops_unavailable(s: Scrapes) -> str | None:
    """Why the probe did not count the FLOPs of a step: the lowest rank's reason, as a sentence."""
    found = sorted(
        (
            sample.label(names.RANK_LABEL).zfill(12),
            sample.label(names.REASON_LABEL),
            sample.label(names.DETAIL_LABEL),
        )
        for sample in s.after.samples(names.MODEL_FLOPS_UNAVAILABLE)
        if sample.value == 1.0
        and sample.label(names.REASON_LABEL) in FLOPS_UNAVAILABLE_TEXT
        # A process that never loaded torch has no model FLOPs to count: nothing to say.
        and sample.label(names.REASON_LABEL) != "no-torch"
    )
    if not found:
        return None
    _, reason, detail = found[0]
    text = FLOPS_UNAVAILABLE_TEXT[reason].format(detail=detail[:64] or "unknown")
    return text + "; declare them (dam_probe.set_flops_per_step, spec.model.flopsPerStep) for an MFU"


def _first_known(pods: Sequence[Observation]) -> str | None:
    return next((o.flops_unavailable for o in pods if o.flops_unavailable), None)


def _checkpoint(s: Scrapes) -> tuple[float, float | None] | None:
    """Checkpoint badput and saves in the window: the most-saving process's (a synchronous job
    waits for it)."""
    prev = s.before.series(names.BADPUT_SECONDS_TOTAL)
    saves_prev = s.before.series(names.CHECKPOINTS_TOTAL)
    saves_after = s.after.series(names.CHECKPOINTS_TOTAL)
    best: tuple[float, float | None] | None = None
    for labels, value in s.after.series(names.BADPUT_SECONDS_TOTAL).items():
        if series.label_of(labels, names.CAUSE_LABEL) != names.CAUSE_CHECKPOINT:
            continue
        delta = series.increase(prev.get(labels), value)
        if delta is None:
            continue
        process = tuple(kv for kv in labels if kv[0] != names.CAUSE_LABEL)
        saves = series.increase(saves_prev.get(process), saves_after.get(process))
        if best is None or delta > best[0]:
            best = (delta, saves)
    return best


def _checkpoint_seconds(s: Scrapes) -> float | None:
    found = s.memo(_checkpoint)
    return None if found is None else found[0]


def _checkpoints(s: Scrapes) -> float | None:
    found = s.memo(_checkpoint)
    return None if found is None else found[1]


def _checkpoint_ratio(s: Scrapes) -> float | None:
    found = s.memo(_checkpoint)
    return None if found is None or not s.elapsed else series.ratio(found[0] / s.elapsed)


def _gpu_model(s: Scrapes) -> str | None:
    if s.known.gpu_model is not None:
        return s.known.gpu_model
    for sample in s.after.samples(names.GPU_INFO):
        model = sample.label("model") or sample.label("name")
        if model and series.attributed(sample, s.known.gpu_uuids):
            return model[:64]
    return None


def _matmul_precision(s: Scrapes) -> str | None:
    """The precision the pod's processes counted their matmul FLOPs in: the most processes' (a
    tie: unknown)."""
    seen = Counter(
        p
        for sample in s.after.samples(names.MODEL_FLOPS_PRECISION)
        if sample.value == 1.0 and (p := sample.label(names.PRECISION_LABEL)) in names.PRECISIONS
    ).most_common(2)
    if not seen or (len(seen) == 2 and seen[0][1] == seen[1][1]):
        return None
    return seen[0][0]


def _gpu_memory_used(s: Scrapes) -> float | None:
    """Device memory used / total of the fullest of the job's GPUs."""
    totals = {
        series.gpu_key(sample): v
        for sample in s.after.samples(names.GPU_MEMORY_TOTAL_BYTES)
        if series.attributed(sample, s.known.gpu_uuids) and (v := series.valid(sample.value))
    }
    used = [
        r
        for sample in s.after.samples(names.GPU_MEMORY_USED_BYTES)
        if series.attributed(sample, s.known.gpu_uuids)
        and (v := series.valid(sample.value)) is not None
        and (total := totals.get(series.gpu_key(sample)))
        and (r := series.ratio(v / total)) is not None
    ]
    return max(used) if used else None


def _memory_limit(s: Scrapes) -> float | None:
    limit = series.first_gauge(s.after, names.CONTAINER_MEMORY_LIMIT_BYTES)
    return limit if limit and limit < UNLIMITED_MEMORY_BYTES else None


def _container_memory(s: Scrapes) -> float | None:
    limit = _memory_limit(s)
    usage = series.first_gauge(s.after, names.CONTAINER_MEMORY_USAGE_BYTES)
    return None if limit is None or usage is None else series.ratio(usage / limit)


def _slowdown_reasons(s: Scrapes) -> tuple[str, ...] | None:
    """The active NVML clock reasons of the job's GPUs that slow a busy GPU (thermal, power…)."""
    reasons = [
        sample
        for sample in s.after.samples(names.GPU_THROTTLE_REASON)
        if series.attributed(sample, s.known.gpu_uuids)
    ]
    if not reasons:
        return None
    return tuple(
        sorted(
            {
                r.label("reason")[:64]
                for r in reasons
                if r.value == 1.0 and r.label("reason") and r.label("reason") not in BENIGN_CLOCK_REASONS
            }
        )
    )


# --- custom combinations -----------------------------------------------------------------------


def _synchronous(pods: Sequence[Observation]) -> bool:
    """Pods of one distributed job (without the ranks' own figures): the ranks advance together."""
    return all(o.ranks for o in pods)


def _job_rate(pods: Sequence[Observation]) -> float | None:
    """Independent pods add up; the pods of one distributed job run at the median pod's rate."""
    rates = series.known(o.steps_per_second for o in pods)
    if _synchronous(pods):
        return statistics.median(rates) if rates else None
    return series.fsum(rates) if rates else None


def _job_steps(pods: Sequence[Observation]) -> float | None:
    if not _synchronous(pods):
        return None
    steps = series.known(o.job_steps if o.job_steps is not None else o.steps for o in pods)
    return statistics.median(steps) if steps else None


def _rank_total(pods: Sequence[Observation]) -> int | None:
    """Ranks of the job: a pod without ranks counts as one, when any pod has ranks."""
    counts = [o.ranks for o in pods]
    if all(r is None for r in counts):
        return None
    return sum(1 if r is None else r for r in counts)


def _fullest(pods: Sequence[Observation]) -> Observation | None:
    """The pod whose container memory is fullest (its ratio and its limit go together)."""
    return max(
        (o for o in pods if o.container_memory_ratio is not None),
        key=lambda o: o.container_memory_ratio or 0.0,
        default=None,
    )


def _fullest_ratio(pods: Sequence[Observation]) -> float | None:
    fullest = _fullest(pods)
    return None if fullest is None else fullest.container_memory_ratio


def _fullest_limit(pods: Sequence[Observation]) -> float | None:
    fullest = _fullest(pods)
    return None if fullest is None else fullest.container_memory_limit_bytes


# --- the table ---------------------------------------------------------------------------------


def _gpu_ratio(name: str, metric: str, status: str, description: str) -> Signal:
    """A GPU gauge 0–1: the mean over the job's GPUs of a pod, GPU-weighted across pods."""
    gauge = Gauge((metric,), Combine.MEAN, Check.RATIO, gpus=True)
    return Signal(name, Unit.RATIO, gauge, Agg.GPU_MEAN, status, description)


S, U, A, n = Signal, Unit, Agg, names
# S(Observation field, unit, how one pod's value is read, how pods combine,
#   status.metrics key, its description in the CRD)
SIGNALS: tuple[Signal, ...] = (
    # --- the training loop (probe) ---
    S("window_seconds", U.SECONDS, Custom(lambda s: s.elapsed, (n.SNAPSHOT_TIMESTAMP_SECONDS,)), A.MAX),
    S("steps", U.COUNT, Increase(n.STEPS_TOTAL), A.SUM),
    # status stepsPerSecond is the engine's rate (engine.derive), from this one.
    S("steps_per_second", U.PER_SECOND, Rate(n.STEPS_TOTAL), _job_rate),
    S("job_steps", U.COUNT, None, _job_steps),
    S(
        "data_wait_ratio",
        U.RATIO,
        Quotient(n.DATALOADER_WAIT_SECONDS_TOTAL, n.STEP_SECONDS_TOTAL, ratio=True),
        A.STEP_TIME_MEAN,
        "dataWaitRatio",
        "Time blocked on the DataLoader / step time.",
    ),
    S("mean_step_seconds", U.SECONDS, Quotient(n.STEP_SECONDS_TOTAL, n.STEPS_TOTAL), A.STEPS_MEAN),
    S("batch_size", U.COUNT, Custom(_batch_size, (n.BATCH_SIZE,)), A.COMMON),
    S(
        "flops_per_step",
        U.FLOPS,
        Custom(_flops_per_step, (n.MODEL_FLOPS_PER_STEP,)),
        A.STEPS_MEAN,
        "flopsPerStep",
        "FLOPs of one training step (measured once by the probe, or declared).",
    ),
    S(
        "flops_per_step_source",
        U.TEXT,
        Custom(_flops_source),
        A.COMMON,
        "flopsPerStepSource",
        "Where flopsPerStep comes from.",
    ),
    S(
        "flops_unavailable",
        U.TEXT,
        Custom(_flops_unavailable, (n.MODEL_FLOPS_UNAVAILABLE,)),
        _first_known,
        "flopsUnavailable",
        "Why the probe did not count a step's FLOPs (the lowest rank's; 'FLOPs unavailable: <this>'):"
        " flopsPerStep is then unknown, or the mean of the ranks that counted.",
    ),
    # A job of several pods waits for its slowest saver: the pod that saved the longest.
    S("checkpoint_seconds", U.SECONDS, Custom(_checkpoint_seconds, (n.BADPUT_SECONDS_TOTAL,)), A.MAX),
    S(
        "checkpoint_ratio",
        U.RATIO,
        Custom(_checkpoint_ratio),
        A.MAX,
        "checkpointRatio",
        "Time the training thread blocked in checkpoint saves / wall time of the window"
        " (the most-saving process).",
    ),
    S("checkpoints", U.COUNT, Custom(_checkpoints, (n.CHECKPOINTS_TOTAL,)), A.MAX),
    S("bytes_per_step", U.BYTES, None, A.STEPS_MEAN),
    # --- accelerators (NVML, GPM) ---
    S("gpu_count", U.COUNT, Custom(_gpu_count, (n.NVML_UP, n.GPU_ATTRIBUTION, n.GPU_INFO)), A.COUNT),
    _gpu_ratio(
        "gpu_utilization",
        n.GPU_UTILIZATION_RATIO,
        "gpuUtilization",
        "NVML utilization.gpu (time any kernel ran), averaged over the pods' GPUs.",
    ),
    _gpu_ratio(
        "gpu_memory_busy",
        n.GPU_MEMORY_BUSY_RATIO,
        "gpuMemoryBusy",
        "NVML utilization.memory (time device memory was read or written).",
    ),
    _gpu_ratio("sm_active", n.GPU_SM_ACTIVE_RATIO, "smActive", "SM active ratio (GPM, Hopper and newer)."),
    _gpu_ratio(
        "sm_occupancy", n.GPU_SM_OCCUPANCY_RATIO, "smOccupancy", "SM occupancy (GPM, Hopper and newer)."
    ),
    _gpu_ratio(
        "tensor_active",
        n.GPU_TENSOR_ACTIVE_RATIO,
        "tensorActive",
        "Tensor-pipe active ratio (GPM, Hopper and newer).",
    ),
    _gpu_ratio(
        "dram_bandwidth_utilization",
        n.GPU_DRAM_BANDWIDTH_UTILIZATION_RATIO,
        "dramBandwidthUtilization",
        "DRAM bandwidth / theoretical maximum (GPM, Hopper and newer).",
    ),
    S("gpu_model", U.TEXT, Custom(_gpu_model, (n.GPU_INFO,)), A.COMMON),
    S(
        "matmul_precision",
        U.TEXT,
        Custom(_matmul_precision, (n.MODEL_FLOPS_PRECISION,)),
        A.COMMON,
        "matmulPrecision",
        "The precision most of the counted step's matmul FLOPs ran in (the probe's FLOP counter;"
        " fp32 on CUDA with TF32 allowed is tf32): MFU divides by that precision's peak (peakBasis).",
    ),
    S(
        "gpu_slice_ratio",
        U.RATIO,
        Gauge((n.GPU_SLICE_RATIO,), Combine.MEAN, gpus=True),
        A.GPU_MEAN,
        "gpuSliceRatio",
        "The job's GPUs' share of their physical GPU (1 whole; 3/7 for a MIG 3g slice of a 7-slice"
        " GPU): the peak is scaled by it.",
    ),
    S(
        "sm_clock_hertz",
        U.HERTZ,
        Gauge((n.GPU_SM_CLOCK_HERTZ,), Combine.MEAN, gpus=True),
        A.GPU_MEAN,
    ),
    S("gpu_slowdown_reasons", U.TEXT, Custom(_slowdown_reasons, (n.GPU_THROTTLE_REASON,)), A.UNION),
    S(
        "nvlink_bytes_per_second",
        U.BYTES_PER_SECOND,
        Rate(n.GPU_NVLINK_BYTES_TOTAL, gpus=True),
        A.SUM,
        "nvlinkBytesPerSecond",
        "NVLink traffic of the job's GPUs, bytes per second.",
    ),
    S(
        "pcie_bytes_per_second",
        U.BYTES_PER_SECOND,
        FirstOf(
            (
                Rate(n.GPU_PCIE_BYTES_TOTAL, gpus=True),
                Gauge(
                    (n.GPU_PCIE_TX_BYTES_PER_SECOND, n.GPU_PCIE_RX_BYTES_PER_SECOND), Combine.SUM, gpus=True
                ),
            )
        ),
        A.SUM,
        "pcieBytesPerSecond",
        "PCIe traffic of the job's GPUs, bytes per second.",
    ),
    # --- host CPU (/proc, cgroup) ---
    S(
        "main_cpu_cores",
        U.CORES,
        Rate(n.PROCESS_CPU_SECONDS_TOTAL, n.ROLE_MAIN),
        A.SUM,
        "mainCpuCores",
        "CPU of the main training process, cores.",
    ),
    S(
        "worker_cpu_cores",
        U.CORES,
        Rate(n.PROCESS_CPU_SECONDS_TOTAL, n.ROLE_WORKER),
        A.SUM,
        "workerCpuCores",
        "CPU of the DataLoader workers together, cores.",
    ),
    S(
        "worker_count",
        U.COUNT,
        Custom(_worker_count, (n.PROCESSES,)),
        A.COUNT,
        "workerCount",
        "DataLoader workers seen in the window (the most at any sample, not at its end).",
    ),
    # The settings of the DataLoader the probes read (what Apply checks took effect): the lowest.
    S("loader_num_workers", U.COUNT, _loader_count(n.DATALOADER_NUM_WORKERS), A.MIN),
    S("loader_prefetch_factor", U.COUNT, _loader_count(n.DATALOADER_PREFETCH_FACTOR), A.MIN),
    S("loader_pin_memory", U.FLAG, _loader_switch(n.DATALOADER_PIN_MEMORY), A.MIN),
    S("loader_persistent_workers", U.FLAG, _loader_switch(n.DATALOADER_PERSISTENT_WORKERS), A.MIN),
    S(
        "cpu_wait_ratio",
        U.RATIO,
        Custom(_main_cpu_wait, (n.PROCESS_CPU_WAIT_SECONDS_TOTAL, n.PROCESSES)),
        A.MAX,  # the most contended pod's: a synchronous job runs at its slowest pod's pace
        "cpuWaitRatio",
        "Run-queue delay of the main training process (runnable, waiting for a CPU) / wall time.",
    ),
    S(
        "worker_cpu_wait_ratio",
        U.RATIO,
        Custom(_worker_cpu_wait, (n.PROCESS_CPU_WAIT_SECONDS_TOTAL, n.PROCESSES)),
        A.MAX,
        "workerCpuWaitRatio",
        "Run-queue delay of the DataLoader workers / (wall time x workers).",
    ),
    S(
        "cpu_throttled_ratio",
        U.RATIO,
        Rate(n.CONTAINER_CPU_THROTTLED_SECONDS_TOTAL, at_most_one=True),
        A.MEAN,
        "cpuThrottledRatio",
        "CFS throttled time of the training container / window.",
    ),
    S(
        "cpu_limit_cores",
        U.CORES,
        Gauge((n.CONTAINER_CPU_LIMIT_CORES,), check=Check.NONZERO),
        A.SUM,
    ),
    S(
        "node_cpu_utilization",
        U.RATIO,
        Gauge((n.NODE_CPU_UTILIZATION_RATIO,), check=Check.RATIO),
        A.MEAN,
    ),
    # --- distributed jobs: collectives (probe, per rank) ---
    S("ranks", U.COUNT, None, _rank_total),
    S("collective_seconds", U.SECONDS, Increase(n.COLLECTIVE_SECONDS_TOTAL), A.SUM),
    S("collective_exposed_seconds", U.SECONDS, Increase(n.COLLECTIVE_EXPOSED_SECONDS_TOTAL), A.SUM),
    S("collectives", U.COUNT, Increase(n.COLLECTIVES_TOTAL), A.SUM),
    S("collective_bytes", U.BYTES, Increase(n.COLLECTIVE_BYTES_TOTAL), A.SUM),
    S(
        "collective_ratio",
        U.SECONDS_PER_SECOND,
        Quotient(n.COLLECTIVE_SECONDS_TOTAL, n.STEP_SECONDS_TOTAL, when=_communicated),
        A.STEP_TIME_MEAN,
        "collectiveRatio",
        "Time in collectives (including waits for peers) / step time.",
    ),
    # Both cross-rank figures are replaced by the ranks' own when the window has them
    # (diagnosis.ranks.cross_rank: skew-corrected, the least-waiting rank).
    S(
        "exposed_communication_ratio",
        U.RATIO,
        Quotient(n.COLLECTIVE_EXPOSED_SECONDS_TOTAL, n.STEP_SECONDS_TOTAL, ratio=True, when=_communicated),
        A.MIN,
        "exposedCommunicationRatio",
        "Communication the backward pass did not hide / step time, skew-corrected (least-waiting rank),"
        " without its wait for a saving rank's checkpoint.",
    ),
    S(
        "collective_skew",
        U.SECONDS_PER_SECOND,
        None,
        A.MAX,
        "collectiveSkew",
        "(max - min collective seconds per step across ranks) / step time.",
    ),
    # --- memory (NVML, cgroup, /proc) ---
    S(
        "gpu_memory_used_ratio",
        U.RATIO,
        Custom(_gpu_memory_used, (n.GPU_MEMORY_USED_BYTES, n.GPU_MEMORY_TOTAL_BYTES)),
        A.MAX,
        "gpuMemoryUsedRatio",
        "Device memory used / total, the fullest GPU.",
    ),
    S(
        "container_memory_ratio",
        U.RATIO,
        Custom(_container_memory, (n.CONTAINER_MEMORY_USAGE_BYTES, n.CONTAINER_MEMORY_LIMIT_BYTES)),
        _fullest_ratio,
        "containerMemoryRatio",
        "Training container memory usage / its limit, the fullest pod.",
    ),
    S("container_memory_limit_bytes", U.BYTES, Custom(_memory_limit), _fullest_limit),
    S(
        "oom_kills",
        U.COUNT,
        Increase(n.CONTAINER_OOM_KILLS_TOTAL),
        A.SUM,
        "oomKills",
        "OOM kills in the training containers during the window.",
    ),
    S("loader_worker_kills", U.COUNT, Increase(n.DATALOADER_WORKER_KILLS_TOTAL), A.SUM),
    S("oom_killed", U.FLAG, Custom(lambda s: s.known.oom_killed), A.ANY),
    S("oom_exit_code", U.COUNT, Custom(lambda s: s.known.oom_exit_code), _main_killed_first),
    S("starting", U.FLAG, Custom(lambda s: s.known.starting), A.ANY),
    S(
        "main_rss_bytes",
        U.BYTES,
        Gauge((n.PROCESS_RESIDENT_MEMORY_BYTES,), Combine.SUM, role=n.ROLE_MAIN),
        A.SUM,
    ),
    S(
        "worker_rss_bytes",
        U.BYTES,
        Gauge((n.PROCESS_RESIDENT_MEMORY_BYTES,), Combine.SUM, role=n.ROLE_WORKER),
        A.SUM,
    ),
)
"""Every field of ``Observation``, once (tests/unit/diagnosis/test_signals.py checks it)."""
del S, U, A, n

BY_NAME: Mapping[str, Signal] = {s.name: s for s in SIGNALS}

GPU_RATIO_GAUGES: Mapping[str, str] = {
    s.name: s.extract.metrics[0]
    for s in SIGNALS
    if isinstance(s.extract, Gauge) and s.extract.gpus and s.extract.check is Check.RATIO
}
"""Observation field → the per-GPU ratio gauge it is the mean of."""

STATUS_SIGNALS: Mapping[str, Signal] = {s.status: s for s in SIGNALS if s.status is not None}
"""The signals ``status.metrics`` shows, by status key, in table order (the figures the engine
derives from them are ``WindowMetrics``' own fields)."""


# --- running the table -------------------------------------------------------------------------


_READERS: tuple[tuple[str, Callable[[Scrapes], Any]], ...] = tuple(
    (sig.name, sig.extract.read) for sig in SIGNALS if sig.extract is not None
)


def extract(s: Scrapes) -> dict[str, Any]:
    """Every signal's value for one pod (or rank); None where it has none."""
    return {name: read(s) for name, read in _READERS}


@dataclass(frozen=True)
class _Weights:
    """Each pod's weight in a mean, per kind of mean."""

    by: Mapping[Agg, Sequence[float]]

    @staticmethod
    def of(pods: Sequence[Observation]) -> _Weights:
        def step_time(o: Observation) -> float:
            if o.steps is not None and o.mean_step_seconds is not None:
                return o.steps * o.mean_step_seconds
            return 0.0

        use_step_time = all(step_time(o) > 0 for o in pods)
        use_steps = all(o.steps for o in pods)
        return _Weights(
            {
                Agg.MEAN: [1.0] * len(pods),
                Agg.STEP_TIME_MEAN: [
                    step_time(o) if use_step_time else (float(o.steps or 0) if use_steps else 1.0)
                    for o in pods
                ],
                Agg.STEPS_MEAN: [float(o.steps) if o.steps else 1.0 for o in pods],
                Agg.GPU_MEAN: [float(o.gpu_count) if o.gpu_count else 1.0 for o in pods],
            }
        )


def _weighted(pairs: Sequence[tuple[float | None, float]]) -> float | None:
    known = [(v, w) for v, w in pairs if v is not None and w > 0]
    total = series.fsum(w for _, w in known)
    if not known or total is None or total <= 0:
        return None
    weighted = series.fsum(v * w for v, w in known)
    return None if weighted is None else weighted / total


def _combine_one(sig: Signal, pods: Sequence[Observation], weights: _Weights) -> Any:
    if not isinstance(sig.aggregate, Agg):
        return sig.aggregate(pods)
    agg = sig.aggregate
    values = [getattr(o, sig.name) for o in pods]
    if agg in weights.by:
        mean = _weighted(list(zip(values, weights.by[agg], strict=True)))
        if mean is not None and sig.unit is Unit.RATIO:
            mean = min(1.0, max(0.0, mean))
        return mean
    present = [v for v in values if v is not None]
    if agg is Agg.COMMON:
        distinct = set(present)
        return distinct.pop() if len(distinct) == 1 else None
    if agg is Agg.ANY:
        return any(present) if present else None
    if agg is Agg.UNION:
        return tuple(sorted({r for rs in present for r in rs})) if present else None
    if agg is Agg.NONE or not present:
        return None
    if agg is Agg.MAX:
        return max(present)
    if agg is Agg.MIN:
        return min(present)
    total = series.fsum(float(v) for v in present)
    return None if total is None else (round(total) if agg is Agg.COUNT else total)


def combine(pods: Sequence[Observation]) -> dict[str, Any]:
    """Every signal's value for a job of several pods (``Signal.aggregate``)."""
    weights = _Weights.of(pods)
    return {sig.name: _combine_one(sig, pods, weights) for sig in SIGNALS}


def status_values(obs: Observation, *, by_alias: bool = True) -> dict[str, Any]:
    """The signals' part of ``status.metrics``, by status key (by field name without
    ``by_alias``), in table order; None where unknown."""
    out = {(key if by_alias else sig.name): getattr(obs, sig.name) for key, sig in STATUS_SIGNALS.items()}
    if obs.flops_per_step is None:  # a source without its figure says nothing
        out["flopsPerStepSource" if by_alias else "flops_per_step_source"] = None
    return out
