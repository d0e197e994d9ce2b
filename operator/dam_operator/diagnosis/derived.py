"""Figures computed from an observation and the hardware, shared by the rules and the metrics:
the step time, the job's rate, whether the job has GPU counters, MFU, arithmetic intensity and the
iron law's terms. Pure."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dam_operator.diagnosis.gpus import ridge_point
from dam_operator.diagnosis.model import Hardware, IronLaw, Observation


@dataclass(frozen=True)
class Derived:
    """Figures computed from an observation and the hardware, shared by the rules and the metrics."""

    step_seconds: float | None
    steps_per_second: float | None
    gpu_signals: bool
    cpu_only: bool
    """No GPU counters at all (``gpu_count`` 0, or unknown and no GPU gauge present)."""
    cpu_only_declared: bool
    """``gpu_count`` is explicitly 0."""
    mfu: float | None
    arithmetic_intensity: float | None
    ridge_point: float | None
    iron_law: IronLaw | None


def positive(x: float | None) -> float | None:
    return x if x is not None and x > 0 and math.isfinite(x) else None


def model_flops_per_second(obs: Observation, steps_per_second: float | None) -> float | None:
    """The job's model FLOP/s: FLOPs of a step of each process at the rate it steps.

    ``flops_per_step`` is one process's step (the mean over the processes that counted or
    declared one); ``steps_per_second`` is the job's rate: for the ranks of one distributed job
    (``job_steps`` known) the rate every rank steps at, so the job does ``ranks`` processes' work
    per step; otherwise the processes' rates added up, each step one process's work. Layout-free:
    8 Pods of one rank and 1 Pod of 8 ranks doing the same work give the same figure."""
    if obs.flops_per_step is None or steps_per_second is None:
        return None
    per_rank_rate = obs.steps_per_second is not None and obs.job_steps is not None
    processes = max(1, obs.ranks or 1) if per_rank_rate else 1
    return obs.flops_per_step * steps_per_second * processes


def accelerator_count(obs: Observation) -> int:
    """What MFU divides the job's FLOP/s by (``mfu`` is per accelerator, DESIGN.md §3): the job's
    GPUs; a job without a known GPU (CPU-only, against a declared peak) counts each rank as one
    accelerator, so its MFU is per process, like one GPU per rank."""
    if obs.gpu_count:
        return obs.gpu_count
    return max(1, obs.ranks or 1)


def derive(obs: Observation, hardware: Hardware | None) -> Derived:
    sps = obs.steps_per_second
    if sps is None and obs.steps is not None and positive(obs.window_seconds):
        sps = obs.steps / obs.window_seconds  # type: ignore[operator]
    step = positive(obs.mean_step_seconds)
    job_steps = obs.job_steps if obs.job_steps is not None else obs.steps
    if step is None and positive(job_steps) and positive(obs.window_seconds):
        step = obs.window_seconds / job_steps  # type: ignore[operator]
    if step is None and positive(sps):
        step = 1.0 / sps  # type: ignore[operator]

    gpu_signals = any(
        v is not None
        for v in (
            obs.gpu_utilization,
            obs.sm_active,
            obs.sm_occupancy,
            obs.tensor_active,
            obs.dram_bandwidth_utilization,
            obs.gpu_memory_busy,
        )
    )
    cpu_only_declared = obs.gpu_count == 0 and not gpu_signals
    cpu_only = not gpu_signals and (obs.gpu_count is None or obs.gpu_count == 0)

    peak = hardware.peak_flops if hardware else None
    bw = hardware.memory_bandwidth_bytes_per_second if hardware else None
    achieved = model_flops_per_second(obs, sps)
    accelerators = accelerator_count(obs)
    mfu = None
    # A CPU-only job has a peak only when the user gave one (``--peak-flops``, spec.hardware): the
    # GPU table has no entry without a GPU model. Its MFU is then against that peak.
    if achieved is not None and peak and (not cpu_only or obs.gpu_model is None):
        mfu = achieved / (peak * accelerators)

    intensity = None
    if positive(obs.flops_per_step) and positive(obs.bytes_per_step):
        intensity = obs.flops_per_step / obs.bytes_per_step  # type: ignore[operator]
    elif (
        positive(obs.flops_per_step)
        and positive(sps)
        and bw
        and positive(obs.dram_bandwidth_utilization)
        and not cpu_only
    ):
        achieved_flops = (achieved or 0.0) / accelerators
        achieved_bytes = obs.dram_bandwidth_utilization * bw  # type: ignore[operator]
        intensity = achieved_flops / achieved_bytes

    iron = None
    if step is not None:
        data_s = step * obs.data_wait_ratio if obs.data_wait_ratio is not None else None
        compute_s: float | None = None
        if obs.gpu_utilization is not None:
            compute_s = step * obs.gpu_utilization
        elif mfu is not None:
            compute_s = step * min(1.0, mfu)  # lower bound: the work at peak efficiency
        latency_s = None
        if data_s is not None and compute_s is not None:
            latency_s = max(0.0, step - data_s - compute_s)
        iron = IronLaw(
            step_seconds=step, data_seconds=data_s, compute_seconds=compute_s, latency_seconds=latency_s
        )

    return Derived(
        step_seconds=step,
        steps_per_second=sps,
        gpu_signals=gpu_signals,
        cpu_only=cpu_only,
        cpu_only_declared=cpu_only_declared,
        mfu=mfu,
        arithmetic_intensity=intensity,
        ridge_point=ridge_point(hardware),
        iron_law=iron,
    )
