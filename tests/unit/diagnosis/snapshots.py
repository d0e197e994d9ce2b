"""Builds Prometheus text snapshots of a sidecar from a description of a training job.

Tests describe the job (seconds, steps, data wait, GPU gauges, CPU use) and get the
BEFORE and AFTER exposition texts that the sidecar would have served; every metric
name comes from ``dam_contract.names``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dam_contract import names

Sample = tuple[str, Mapping[str, str], float]

_TYPES = {
    names.STEPS_TOTAL: "counter",
    names.STEP_SECONDS_TOTAL: "counter",
    names.DATALOADER_WAIT_SECONDS_TOTAL: "counter",
    names.PROCESS_CPU_SECONDS_TOTAL: "counter",
    names.CONTAINER_CPU_THROTTLED_SECONDS_TOTAL: "counter",
    names.COLLECTIVE_SECONDS_TOTAL: "counter",
    names.COLLECTIVE_EXPOSED_SECONDS_TOTAL: "counter",
    names.COLLECTIVES_TOTAL: "counter",
    names.COLLECTIVE_BYTES_TOTAL: "counter",
    names.GPU_NVLINK_BYTES_TOTAL: "counter",
    names.GPU_PCIE_BYTES_TOTAL: "counter",
    names.CONTAINER_OOM_KILLS_TOTAL: "counter",
    names.DATALOADER_WORKER_KILLS_TOTAL: "counter",
    names.BADPUT_SECONDS_TOTAL: "counter",
    names.CHECKPOINTS_TOTAL: "counter",
}

GPU_GAUGES = {
    "mem_used": names.GPU_MEMORY_USED_BYTES,
    "mem_total": names.GPU_MEMORY_TOTAL_BYTES,
    "clock": names.GPU_SM_CLOCK_HERTZ,
}
"""Per-GPU gauges in their own units (not ratios)."""

GAUGE_OF = {
    "util": names.GPU_UTILIZATION_RATIO,
    "mem": names.GPU_MEMORY_BUSY_RATIO,
    "sm": names.GPU_SM_ACTIVE_RATIO,
    "occupancy": names.GPU_SM_OCCUPANCY_RATIO,
    "tensor": names.GPU_TENSOR_ACTIVE_RATIO,
    "dram": names.GPU_DRAM_BANDWIDTH_UTILIZATION_RATIO,
}


def _fmt_labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return "{" + inner + "}"


def exposition(samples: Sequence[Sample]) -> str:
    lines: list[str] = []
    typed: set[str] = set()
    for name, labels, value in samples:
        if name not in typed:
            lines.append(f"# TYPE {name} {_TYPES.get(name, 'gauge')}")
            typed.add(name)
        lines.append(f"{name}{_fmt_labels(labels)} {value!r}")
    return "\n".join(lines) + "\n"


@dataclass
class Rank:
    """One rank process of the job: its probe series carry ``rank``. Ratios are of the window."""

    rank: int
    steps: float | None = None
    """Steps in the window (None: the job's ``steps``)."""
    wait_ratio: float = 0.0
    collective_ratio: float | None = None
    """Collective seconds (waiting for peers included) / step seconds."""
    exposed_ratio: float | None = None
    collectives_per_step: float | None = None
    bytes_per_collective: float | None = None
    local_rank: int | None = None
    checkpoint_ratio: float | None = None
    """Time its training thread blocked in checkpoint saves / the window's wall time (None: saves
    not timed; 0: timed, none made — the probe publishes both for every process that can save)."""
    checkpoints: float = 0.0
    """Its checkpoint saves in the window."""


@dataclass
class Job:
    """What happened in the window; None leaves a metric out of the snapshots."""

    seconds: float = 60.0
    steps: float = 120.0
    wait_ratio: float | None = None
    gpus: list[dict[str, float]] = field(default_factory=list)
    """One dict per GPU, keys of GAUGE_OF (``util``, ``sm``, ``dram``…)."""
    gpu_uuids: list[str] | None = None
    main_cpu_cores: float | None = None
    worker_cpu_cores: float | None = None
    throttled_ratio: float | None = None
    cpu_limit_cores: float | None = None
    batch_size: int | None = None
    flops_per_step: float | None = None
    gpu_model: str | None = None
    nvml_up: bool | None = None
    attribution: str | None = None
    """``dam_gpu_attribution`` state (``probe``, ``visible_devices``, ``all``, ``none``)."""
    gpu_info_label: str = "name"
    timestamps: bool = True
    start: float = 1000.0
    """Counter values in BEFORE (the job had run before the window)."""
    ranks: list[Rank] = field(default_factory=list)
    """Rank processes; when given, the probe series are per rank (label ``rank``)."""
    container_memory_bytes: float | None = None
    container_memory_limit_bytes: float | None = None
    oom_kills: float | None = None
    """OOM kills in the window."""
    loader_worker_kills: float | None = None
    """DataLoader workers the probe saw die in the window."""
    main_rss_bytes: float | None = None
    worker_rss_bytes: float | None = None
    nvlink_bytes_per_second: float | None = None
    """Per GPU, tx + rx."""


def _rank_counters(job: Job, r: Rank, k: float) -> list[Sample]:
    base = job.start
    steps = job.steps if r.steps is None else r.steps
    labels = {"rank": str(r.rank)}
    out: list[Sample] = [
        (names.STEPS_TOTAL, labels, base * 2 + k * steps),
        (names.STEP_SECONDS_TOTAL, labels, base + k * job.seconds),
        (names.DATALOADER_WAIT_SECONDS_TOTAL, labels, base * 0.1 + k * job.seconds * r.wait_ratio),
    ]
    if r.collective_ratio is not None:
        out.append(
            (names.COLLECTIVE_SECONDS_TOTAL, labels, base * 0.2 + k * job.seconds * r.collective_ratio)
        )
    if r.exposed_ratio is not None:
        out.append(
            (names.COLLECTIVE_EXPOSED_SECONDS_TOTAL, labels, base * 0.1 + k * job.seconds * r.exposed_ratio)
        )
    if r.checkpoint_ratio is not None:
        saved = {"cause": names.CAUSE_CHECKPOINT, **labels}
        out.append((names.BADPUT_SECONDS_TOTAL, saved, base * 0.01 + k * job.seconds * r.checkpoint_ratio))
        out.append((names.CHECKPOINTS_TOTAL, labels, 3.0 + k * r.checkpoints))
    if r.collectives_per_step is not None:
        n = steps * r.collectives_per_step
        out.append((names.COLLECTIVES_TOTAL, labels, base * 10 + k * n))
        if r.bytes_per_collective is not None:
            out.append((names.COLLECTIVE_BYTES_TOTAL, labels, base * 1e6 + k * n * r.bytes_per_collective))
    return out


def _counters(job: Job, at_end: bool) -> list[Sample]:
    k = 1.0 if at_end else 0.0
    base = job.start
    out: list[Sample] = []
    if job.ranks:
        for r in job.ranks:
            out.extend(_rank_counters(job, r, k))
    elif job.wait_ratio is not None:
        out.append((names.DATALOADER_WAIT_SECONDS_TOTAL, {}, base * 0.1 + k * job.seconds * job.wait_ratio))
        out.append((names.STEP_SECONDS_TOTAL, {}, base + k * job.seconds))
    if not job.ranks:
        out.append((names.STEPS_TOTAL, {}, base * 2 + k * job.steps))
    if job.main_cpu_cores is not None:
        out.append(
            (
                names.PROCESS_CPU_SECONDS_TOTAL,
                {"role": names.ROLE_MAIN},
                base + k * job.main_cpu_cores * job.seconds,
            )
        )
    if job.worker_cpu_cores is not None:
        out.append(
            (
                names.PROCESS_CPU_SECONDS_TOTAL,
                {"role": names.ROLE_WORKER},
                base + k * job.worker_cpu_cores * job.seconds,
            )
        )
    if job.throttled_ratio is not None:
        out.append(
            (
                names.CONTAINER_CPU_THROTTLED_SECONDS_TOTAL,
                {},
                base / 10 + k * job.throttled_ratio * job.seconds,
            )
        )
    if job.oom_kills is not None:
        out.append((names.CONTAINER_OOM_KILLS_TOTAL, {}, 2.0 + k * job.oom_kills))
    if job.loader_worker_kills is not None:
        out.append((names.DATALOADER_WORKER_KILLS_TOTAL, {}, k * job.loader_worker_kills))
    if job.nvlink_bytes_per_second is not None:
        for i in range(len(job.gpus)):
            for direction in ("tx", "rx"):
                labels = {"gpu": str(i), "direction": direction}
                out.append(
                    (
                        names.GPU_NVLINK_BYTES_TOTAL,
                        labels,
                        1e12 + k * job.nvlink_bytes_per_second / 2 * job.seconds,
                    )
                )
    return out


def _gauges(job: Job, at_end: bool) -> list[Sample]:
    out: list[Sample] = []
    if job.timestamps:
        out.append((names.SNAPSHOT_TIMESTAMP_SECONDS, {}, 1.7e9 + (job.seconds if at_end else 0.0)))
    if job.nvml_up is not None:
        out.append((names.NVML_UP, {}, 1.0 if job.nvml_up else 0.0))
    if job.attribution is not None:
        for state in ("probe", "visible_devices", "all", "none"):
            out.append((names.GPU_ATTRIBUTION, {"state": state}, 1.0 if state == job.attribution else 0.0))
    for key, metric in GAUGE_OF.items():
        for i, gpu in enumerate(job.gpus):
            if key in gpu:
                labels = {"gpu": str(i)}
                if job.gpu_uuids:
                    labels["uuid"] = job.gpu_uuids[i]
                # BEFORE holds different gauge values: only AFTER must count.
                out.append((metric, labels, gpu[key] if at_end else 1.0 - gpu[key]))
    for key, metric in GPU_GAUGES.items():
        for i, gpu in enumerate(job.gpus):
            if key in gpu:
                out.append((metric, {"gpu": str(i)}, gpu[key] if at_end else gpu[key] / 2))
    for i, gpu in enumerate(job.gpus):
        if "slowdown" in gpu:  # 1.0: hw_thermal_slowdown active
            for reason in ("gpu_idle", "hw_thermal_slowdown"):
                value = gpu["slowdown"] if reason == "hw_thermal_slowdown" else 0.0
                out.append((names.GPU_THROTTLE_REASON, {"gpu": str(i), "reason": reason}, value))
    for r in job.ranks:
        if r.local_rank is not None:
            labels = {"rank": str(r.rank), "local_rank": str(r.local_rank), "world_size": str(len(job.ranks))}
            out.append((names.PROCESS_RANK_INFO, labels, 1.0))
    if job.container_memory_bytes is not None:
        out.append((names.CONTAINER_MEMORY_USAGE_BYTES, {}, job.container_memory_bytes))
    if job.container_memory_limit_bytes is not None:
        out.append((names.CONTAINER_MEMORY_LIMIT_BYTES, {}, job.container_memory_limit_bytes))
    for role, rss in ((names.ROLE_MAIN, job.main_rss_bytes), (names.ROLE_WORKER, job.worker_rss_bytes)):
        if rss is not None:
            out.append((names.PROCESS_RESIDENT_MEMORY_BYTES, {"role": role}, rss))
    if job.gpu_model is not None:
        for i in range(max(1, len(job.gpus))):
            labels = {"gpu": str(i), job.gpu_info_label: job.gpu_model}
            if job.gpu_uuids:
                labels["uuid"] = job.gpu_uuids[i]
            out.append((names.GPU_INFO, labels, 1.0))
    if job.cpu_limit_cores is not None:
        out.append((names.CONTAINER_CPU_LIMIT_CORES, {}, job.cpu_limit_cores))
    if job.batch_size is not None:
        out.append((names.BATCH_SIZE, {}, float(job.batch_size)))
    if job.flops_per_step is not None:
        out.append((names.MODEL_FLOPS_PER_STEP, {}, job.flops_per_step))
    return out


def snapshot_pair(job: Job) -> tuple[str, str]:
    """(BEFORE, AFTER) exposition texts of the job's window."""
    before = exposition(_counters(job, False) + _gauges(job, False))
    after = exposition(_counters(job, True) + _gauges(job, True))
    return before, after
