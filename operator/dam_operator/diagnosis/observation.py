"""The central record of the diagnosis engine and what reads it: one window's ``Observation``,
the screening ``Thresholds``, the accelerator's peak figures (``Hardware``), a process's key
(``RankId``) and the unit types their fields use (``Ratio``, ``NonNeg``, ``RankNumber``).

A leaf: it imports no other module of the engine, so that every module (the signal table, the
evidence, the rules, the Apply levers, the verdict's model) can name these types at run time.
Field names on the wire (JSON, the resource status) are camelCase aliases of the snake_case
Python names. Pure data: no I/O, no Kubernetes, no NVML.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Literal, NamedTuple

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class _Wire(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


def _finite_or_none(v: float | None) -> float | None:
    if v is None:
        return None
    if math.isnan(v) or math.isinf(v):
        raise ValueError("must be a finite number")
    return v


Ratio = Annotated[float, Field(ge=0.0, le=1.0)]
NonNeg = Annotated[float, Field(ge=0.0), AfterValidator(_finite_or_none)]
RankNumber = Annotated[int, Field(ge=0, le=10_000_000)]


class RankId(NamedTuple):
    """A stable key for one process of a job: its pod (``""`` in local mode) and its rank.

    ``rank`` is None for a process without a distributed rank (a single-process job, or
    an old probe that does not publish one).
    """

    pod: str
    rank: int | None

    def sort_key(self) -> tuple[str, int]:
        return (self.pod, -1 if self.rank is None else self.rank)

    def describe(self) -> str:
        """``rank 3 (pod p-1)``, ``rank 3``, ``pod p-1``."""
        if self.rank is None:
            return f"pod {self.pod}" if self.pod else "the process"
        return f"rank {self.rank}" + (f" (pod {self.pod})" if self.pod else "")


class Observation(_Wire):
    """One evaluation window, aggregated over the pod's GPUs and processes.

    Every signal is optional: a missing signal lowers confidence, never guesses.
    Ratios are 0–1. CPU figures are in cores (CPU seconds per wall second).
    """

    window_seconds: NonNeg | None = None
    steps: NonNeg | None = None
    """Steps counted in the window, every process together (each rank of a job counts every step)."""
    steps_per_second: NonNeg | None = None
    """The job's rate. Several ranks of one distributed job: the median rank's rate (synchronous
    ranks advance together, so summing them would count each step once per rank); otherwise
    ``steps`` / window (independent processes add up)."""
    job_steps: NonNeg | None = None
    """Steps the job advanced in the window: the median rank's steps for several ranks of one job
    (None otherwise: ``steps`` is the job's)."""
    data_wait_ratio: Ratio | None = None
    mean_step_seconds: NonNeg | None = None

    gpu_count: Annotated[int, Field(ge=0, le=4096)] | None = None
    gpu_utilization: Ratio | None = None
    gpu_memory_busy: Ratio | None = None
    sm_active: Ratio | None = None
    sm_occupancy: Ratio | None = None
    tensor_active: Ratio | None = None
    dram_bandwidth_utilization: Ratio | None = None

    main_cpu_cores: NonNeg | None = None
    worker_cpu_cores: NonNeg | None = None
    worker_count: Annotated[int, Field(ge=0, le=100_000)] | None = None
    """DataLoader workers seen in the window (the most any sample of it saw, not the count at its
    end: a run's last sample, taken after the command exited, sees none)."""
    loader_num_workers: Annotated[int, Field(ge=0, le=100_000)] | None = None
    """``num_workers`` of the DataLoader the training processes iterated last, as the probe read it
    from its iterator (after any override): the setting, also between epochs when non-persistent
    workers are gone (``worker_count`` then reads 0). The fewest over the ranks and pods."""
    loader_prefetch_factor: Annotated[int, Field(ge=0, le=100_000)] | None = None
    """Its ``prefetch_factor`` (None also without workers: torch's None); the lowest."""
    loader_pin_memory: bool | None = None
    """Whether it pins its batches (``pin_memory`` set and an accelerator to pin for); False when
    any rank does not."""
    loader_persistent_workers: bool | None = None
    """Whether it keeps its workers across epochs; False when any rank does not."""
    cpu_wait_ratio: Ratio | None = None
    """Run-queue delay of the main training process (its main thread: time runnable but waiting
    for a CPU, ``/proc/<pid>/schedstat`` field 2) / wall time of the window."""
    worker_cpu_wait_ratio: Ratio | None = None
    """The same for the DataLoader workers, per worker: their run-queue delay / (wall time × workers)."""
    cpu_throttled_ratio: Ratio | None = None
    cpu_limit_cores: NonNeg | None = None
    node_cpu_utilization: Ratio | None = None

    batch_size: Annotated[int, Field(ge=0, le=10**9)] | None = None
    flops_per_step: NonNeg | None = None
    """Model FLOPs of one counted step (what one ``dam_steps_total`` increment computed)."""
    flops_per_step_source: Literal["measured", "declared"] | None = None
    """Where ``flops_per_step`` comes from: counted once by the probe, or declared (job, spec, flag)."""
    flops_unavailable: Annotated[str, Field(max_length=256)] | None = None
    """Why the probe did not count the FLOPs of a step (``dam_model_flops_unavailable``), while
    ``flops_per_step`` is unknown: "FLOPs unavailable: <this>"."""
    checkpoint_seconds: NonNeg | None = None
    """Time the training thread blocked in checkpoint saves in the window (the most-saving process)."""
    checkpoint_ratio: Ratio | None = None
    """``checkpoint_seconds`` / the window's wall time (None when the saves are not timed)."""
    checkpoints: NonNeg | None = None
    """Checkpoint saves in the window (the most-saving process)."""
    bytes_per_step: NonNeg | None = None
    """Device-memory bytes moved by one counted step, when a profiler measured it."""
    gpu_model: Annotated[str, Field(max_length=64)] | None = None
    matmul_precision: Literal["fp32", "tf32", "fp16", "bf16", "fp8", "fp64"] | None = None
    """The precision most of the counted step's matmul FLOPs ran in (``dam_model_flops_precision``):
    the peak MFU divides by is that precision's (``gpus.resolve``)."""
    gpu_slice_ratio: Ratio | None = None
    """The job's GPUs' share of their physical GPU (``dam_gpu_slice_ratio``): 1 whole, a MIG
    slice's GPU-instance slices over the GPU's most; the peak is scaled by it."""

    # --- distributed jobs: collectives (probe, per rank; summed for a pod or a job) -------
    ranks: Annotated[int, Field(ge=0, le=10_000_000)] | None = None
    """Distributed ranks in this observation (None: the processes publish no rank)."""
    collective_seconds: NonNeg | None = None
    """Time in collectives in the window, launch to completion, including waiting for peers."""
    collective_exposed_seconds: NonNeg | None = None
    """Communication the backward pass did not hide, in the window."""
    collectives: NonNeg | None = None
    """Collectives completed in the window."""
    collective_bytes: NonNeg | None = None
    """Bytes reduced or gathered in the window."""
    collective_ratio: NonNeg | None = None
    """Collective seconds / step seconds (summed over ranks; above 1 when buckets overlap)."""
    exposed_communication_ratio: Ratio | None = None
    """Exposed communication / step time. For several ranks: the least-waiting rank's figure
    (skew-corrected: a rank that waits in a collective for a late peer is not communicating)."""
    collective_skew: NonNeg | None = None
    """(max − min collective seconds per step across ranks) / step time; None for one rank."""
    nvlink_bytes_per_second: NonNeg | None = None
    pcie_bytes_per_second: NonNeg | None = None

    # --- memory capacity ---------------------------------------------------------------------
    gpu_memory_used_ratio: Ratio | None = None
    """Device memory used / total, the fullest of the job's GPUs."""
    container_memory_ratio: Ratio | None = None
    """The training container's cgroup memory usage / its limit (page cache included)."""
    container_memory_limit_bytes: NonNeg | None = None
    oom_kills: NonNeg | None = None
    """OOM kills in the container's cgroup during the window."""
    loader_worker_kills: NonNeg | None = None
    """DataLoader workers that died in the window, counted for certain by the probe from DataLoader's
    own error ("worker (pid N) is killed by signal"): the loader was the OOM killer's victim."""
    oom_killed: bool | None = None
    """Supplied by the caller: the container was OOM-killed (Pod ``lastState.terminated.reason``
    ``OOMKilled``, or ``dam run``'s child killed by the kernel's OOM killer)."""
    oom_exit_code: Annotated[int, Field(ge=0, le=255)] | None = None
    """Supplied by the caller with ``oom_killed``: the exit code of the OOM-killed container. 137
    (128 + SIGKILL): the OOM killer took the training process itself; another (e.g. 1): it took
    a child, such as a DataLoader worker, and the training process then exited on its own
    (torch's "DataLoader worker (pid N) exited unexpectedly"). None: not known."""
    starting: bool | None = None
    """Supplied by the caller: the job may still be starting (a Pod within its first minutes, a live
    ``dam run`` window); False when it is past its start-up or has ended (``dam run``'s final
    verdict). Says how a window without a step or a sign of the training process reads."""
    main_rss_bytes: NonNeg | None = None
    worker_rss_bytes: NonNeg | None = None
    """Resident memory of the training process (main) and of its DataLoader workers."""

    # --- GPU clocks (straggler causes) -----------------------------------------------------
    sm_clock_hertz: NonNeg | None = None
    gpu_slowdown_reasons: tuple[Annotated[str, Field(max_length=64)], ...] | None = None
    """Active NVML clock slowdown reasons (thermal, power, hardware) on the job's GPUs."""


class Hardware(_Wire):
    """Peak figures of one accelerator; from the GPU table or the spec's overrides.

    The one declaration of ``spec.hardware``: ``cluster.steps.spec.HardwareSpec`` and the CRD's
    ``spec.hardware`` schema are written from these fields (types, bounds, descriptions) by
    ``deploy/render.py``; the spec tightens some bounds (``spec.HARDWARE_LIMITS``)."""

    gpu_model: Annotated[str, Field(max_length=64)] | None = Field(
        None, description='GPU model name as NVML reports it, e.g. "NVIDIA H100 80GB HBM3".'
    )
    peak_flops: Annotated[float, Field(gt=0.0), AfterValidator(_finite_or_none)] | None = Field(
        None,
        description="Peak dense FLOP/s of one accelerator at the training precision, e.g. 9.89e14 for "
        "H100 SXM bf16. Used for MFU and the ridge point.",
    )
    memory_bandwidth_bytes_per_second: (
        Annotated[float, Field(gt=0.0), AfterValidator(_finite_or_none)] | None
    ) = Field(
        None,
        description="Peak device-memory bandwidth of one accelerator, bytes per second, e.g. 3.35e12 "
        "for H100 SXM. Used for the ridge point.",
    )


@dataclass(frozen=True)
class Screen:
    """What a threshold screens, as docs/method.md's thresholds table says it (the table is written
    from these by tools/gen_regime_doc.py): the signal (its ``status.metrics`` key in backticks;
    "" under the row above), where it comes from, and what crossing the threshold means. Carried
    in the field's annotation (pydantic keeps it as metadata and validates nothing with it); a
    threshold that screens two signals carries two."""

    signal: str
    source: str
    meaning: str
    default: str = ""
    """For a screen with no threshold (``SCREENS_WITHOUT_THRESHOLD``): what its default column says."""


SCREENS_WITHOUT_THRESHOLD: tuple[Screen, ...] = (
    Screen("`oomKills`", "cgroup `memory.events` `oom_kill` in the window", "memory capacity", "> 0"),
)
"""Rows of the thresholds table that no threshold can move (after the thresholds' rows)."""


def screens(field: str) -> tuple[Screen, ...]:
    """The ``Screen`` rows a ``Thresholds`` field carries (none: a field the table must not miss)."""
    return tuple(m for m in Thresholds.model_fields[field].metadata if isinstance(m, Screen))


class Thresholds(_Wire):
    """Screening thresholds of docs/method.md. Every one is overridable in the spec.

    The one declaration of the thresholds: ``cluster.steps.spec.ThresholdsSpec`` (every field
    optional, same bounds) and the CRD's ``spec.thresholds`` schema (the description, with
    "(default X)" from the default here) are written from these fields by ``deploy/render.py``
    (``--check`` fails when they are stale), and its rows of docs/method.md's thresholds table from
    the ``Screen`` its annotation carries (tools/gen_regime_doc.py). A new threshold is its field
    here and nothing else."""

    data_wait_suspect: Annotated[
        Ratio, Screen("`dataWaitRatio`", "probe: loader wait / step seconds", "above → suspect Data")
    ] = Field(
        0.10,
        description="Data wait ratio (time blocked on the DataLoader / step time) above which Data is "
        "suspected.",
    )
    data_wait_fine: Annotated[Ratio, Screen("", "", "below → Data is fine")] = Field(
        0.01, description="Data wait ratio below which the input pipeline is ruled out."
    )
    gpu_util_starved: Annotated[
        Ratio, Screen("`gpuUtilization`", "NVML utilization.gpu", "below → the GPU is starved")
    ] = Field(0.80, description="GPU utilization below which the accelerator counts as starved.")
    gpu_util_busy: Annotated[Ratio, Screen("", "", "above → busy")] = Field(
        0.95, description="GPU utilization above which the accelerator counts as busy."
    )
    sm_active_busy: Annotated[
        Ratio, Screen("`smActive`", "GPM (Hopper+)", "SMs busy (not just a kernel resident)")
    ] = Field(
        0.80,
        description="SM active ratio above which the SMs count as busy, for the compute-bound test.",
    )
    dram_bandwidth_saturated: Annotated[
        Ratio, Screen("`dramBandwidthUtilization`", "GPM (Hopper+)", "at/above → memory bandwidth saturated")
    ] = Field(
        0.70,
        description="DRAM bandwidth utilization above which device memory counts as saturated "
        "(memory-bound).",
    )
    mfu_investigate: Annotated[
        Ratio, Screen("`mfu`", "FLOPs / peak", "below → low hardware efficiency η")
    ] = Field(0.30, description="Model FLOPs utilization below which efficiency is worth investigating.")
    mfu_efficient: Annotated[Ratio, Screen("", "", "above → efficient")] = Field(
        0.50, description="Model FLOPs utilization above which the job counts as efficient."
    )
    main_cpu_saturated_cores: Annotated[
        float,
        Field(gt=0.0, le=4.0),
        Screen("`mainCpuCores`", "/proc, role=main", "at/above → the Python thread saturates a core"),
    ] = Field(
        0.90,
        description="CPU of the main training thread, in cores, at or above which it counts as saturated "
        "(launch/Python overhead, latency-bound).",
    )
    cpu_throttled_suspect: Annotated[
        Ratio,
        Screen(
            "`cpuThrottledRatio`",
            "cgroup CFS throttled time / window",
            "above → the CPU quota throttles the job",
        ),
    ] = Field(
        0.10,
        description="CFS throttled ratio of the training container above which the CPU limit is suspected.",
    )
    # A busy node: the step would be 1 / (1 - share) times shorter without the run-queue delay.
    cpu_wait_suspect: Annotated[
        Ratio,
        Screen(
            "`cpuWaitRatio`",
            "run-queue delay of the main process (`/proc/<pid>/schedstat` field 2, its main thread) / window",
            "at/above → a busy node holds the job back (`raise-cpu-request`)",
        ),
        Screen(
            "`workerCpuWaitRatio`",
            "the loader workers' run-queue delay / (window × workers)",
            "at/above in an input-bound job → the node starves the loader",
        ),
    ] = Field(
        0.20,
        description="Run-queue delay of the main training process / wall time at or above which a busy "
        "node holds the job back.",
    )
    # Tensor cores in use or not chooses the compute-bound lever.
    tensor_active_low: Annotated[
        Ratio, Screen("`tensorActive`", "GPM (Hopper+)", "below → matrix math misses the tensor cores")
    ] = Field(0.20, description="Tensor-pipe active ratio above which tensor cores count as in use.")
    worker_cpu_saturated: Annotated[
        Ratio,
        Screen(
            "`workerCpuCores` + `mainCpuCores` vs the container CPU limit",
            "/proc, cgroup",
            "share at/above → CPU limit saturated",
        ),
    ] = Field(
        0.90,
        description="Share of the container's CPU limit used by DataLoader workers at or above which "
        "they saturate it.",
    )
    min_steps: Annotated[
        int, Field(ge=1, le=1_000_000), Screen("steps in the window", "probe", "fewer → `unknown`")
    ] = Field(3, description="Fewest training steps in a window that still support a verdict.")
    communication_suspect: Annotated[
        Ratio,
        Screen(
            "`exposedCommunicationRatio`",
            "probe: exposed collective seconds / step seconds, the least-waiting rank's "
            "(its wait for a saving rank's checkpoint out, 2b)",
            "above → suspect communication",
        ),
    ] = Field(
        0.10,
        description="Skew-corrected exposed communication (the least-waiting rank's) above this share of "
        "the step suspects communication-bound.",
    )
    straggler_skew: Annotated[
        Ratio,
        Screen(
            "`collectiveSkew`",
            "probe: (max − min collective seconds per step across ranks) / step time",
            "above → one rank holds the job back (a straggler)",
        ),
    ] = Field(
        0.10,
        description="Spread of collective wait per step across ranks (max - min) above this share of the "
        "step names a straggler.",
    )
    gpu_memory_full: Annotated[
        float,
        Field(gt=0.5, le=1.0),
        Screen(
            "`gpuMemoryUsedRatio`", "NVML memory used / total, the fullest GPU", "above → memory capacity"
        ),
    ] = Field(
        0.95,
        description="Device memory used above this share of total means memory capacity is the limit.",
    )
    container_memory_full: Annotated[
        float,
        Field(gt=0.5, le=1.0),
        Screen(
            "`containerMemoryRatio`",
            "cgroup `memory.current` / `memory.max`",
            "at/above → memory capacity when resident memory corroborates, else a warning",
        ),
    ] = Field(
        0.95,
        description="Container memory at this share of its limit or above is a weaker memory-capacity "
        "screen.",
    )
    # Checkpoint-bound when no larger loss (data wait, exposed communication) explains more.
    checkpoint_suspect: Annotated[
        Ratio,
        Screen(
            "`checkpointRatio`",
            "time the training thread blocked in checkpoint saves (`torch.save`, "
            "`torch.distributed.checkpoint.save`, the blocking part of `async_save`) / window, "
            "the most-saving process",
            "above, and larger than the data wait and the exposed communication → checkpoint-bound",
        ),
    ] = Field(
        0.10,
        description="Time the training thread blocked in checkpoint saves / wall time above which the "
        "job is checkpoint-bound.",
    )
