"""Builds Prometheus text snapshots of a sidecar from a description of a training job.

Tests describe the job (seconds, steps, data wait, GPU gauges, CPU use) and get the
BEFORE and AFTER exposition texts that the sidecar would have served; every metric
name comes from ``dam_sidecar.names``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dam_sidecar import names

Sample = tuple[str, Mapping[str, str], float]

_TYPES = {
    names.STEPS_TOTAL: "counter",
    names.STEP_SECONDS_TOTAL: "counter",
    names.DATALOADER_WAIT_SECONDS_TOTAL: "counter",
    names.PROCESS_CPU_SECONDS_TOTAL: "counter",
    names.CONTAINER_CPU_THROTTLED_SECONDS_TOTAL: "counter",
}

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


def _counters(job: Job, at_end: bool) -> list[Sample]:
    k = 1.0 if at_end else 0.0
    base = job.start
    out: list[Sample] = []
    if job.wait_ratio is not None:
        out.append((names.DATALOADER_WAIT_SECONDS_TOTAL, {}, base * 0.1 + k * job.seconds * job.wait_ratio))
        out.append((names.STEP_SECONDS_TOTAL, {}, base + k * job.seconds))
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
