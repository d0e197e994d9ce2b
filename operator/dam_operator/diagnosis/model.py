"""Data types of the diagnosis engine: what goes in (a window of observations,
thresholds, hardware) and what comes out (a verdict).

Field names on the wire (JSON, the resource status) are camelCase aliases of the
snake_case Python names; ``model_dump(by_alias=True)`` gives the status shape of
DESIGN.md §3. Pure data: no I/O, no Kubernetes, no NVML.
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class Axis(StrEnum):
    DATA = "Data"
    ALGORITHM = "Algorithm"
    MACHINE = "Machine"
    UNKNOWN = "Unknown"


class Regime(StrEnum):
    INPUT_BOUND = "input-bound"
    MEMORY_BOUND = "memory-bound"
    COMPUTE_BOUND = "compute-bound"
    LATENCY_BOUND = "latency-bound"
    UNKNOWN = "unknown"


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


class Observation(_Wire):
    """One evaluation window, aggregated over the pod's GPUs and processes.

    Every signal is optional: a missing signal lowers confidence, never guesses.
    Ratios are 0–1. CPU figures are in cores (CPU seconds per wall second).
    """

    window_seconds: NonNeg | None = None
    steps: NonNeg | None = None
    steps_per_second: NonNeg | None = None
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
    cpu_throttled_ratio: Ratio | None = None
    cpu_limit_cores: NonNeg | None = None
    node_cpu_utilization: Ratio | None = None

    batch_size: Annotated[int, Field(ge=0, le=10**9)] | None = None
    flops_per_step: NonNeg | None = None
    """Model FLOPs of one counted step (what one ``dam_steps_total`` increment computed)."""
    bytes_per_step: NonNeg | None = None
    """Device-memory bytes moved by one counted step, when a profiler measured it."""
    gpu_model: Annotated[str, Field(max_length=64)] | None = None


class Hardware(_Wire):
    """Peak figures of one accelerator; from the GPU table or the spec's overrides."""

    gpu_model: Annotated[str, Field(max_length=64)] | None = None
    peak_flops: Annotated[float, Field(gt=0.0), AfterValidator(_finite_or_none)] | None = None
    memory_bandwidth_bytes_per_second: (
        Annotated[float, Field(gt=0.0), AfterValidator(_finite_or_none)] | None
    ) = None


class Thresholds(_Wire):
    """Screening thresholds of DESIGN.md §1. Every one is overridable in the spec."""

    data_wait_suspect: Ratio = 0.10
    data_wait_fine: Ratio = 0.01
    gpu_util_starved: Ratio = 0.80
    gpu_util_busy: Ratio = 0.95
    sm_active_busy: Ratio = 0.80
    dram_bandwidth_saturated: Ratio = 0.70
    mfu_investigate: Ratio = 0.30
    mfu_efficient: Ratio = 0.50
    main_cpu_saturated_cores: Annotated[float, Field(gt=0.0, le=4.0)] = 0.90
    cpu_throttled_suspect: Ratio = 0.10
    tensor_active_low: Ratio = 0.20
    """Tensor pipes busier than this count as "tensor cores in use" (compute-bound lever choice)."""
    worker_cpu_saturated: Ratio = 0.90
    """Loader workers using this share of the container's CPU limit (or more) saturate it."""
    min_steps: Annotated[int, Field(ge=1, le=1_000_000)] = 3
    """Fewer steps than this in a window is too little evidence for a verdict."""


class IronLaw(_Wire):
    """Per-step estimate of the iron-law terms, seconds (None where inputs are missing)."""

    step_seconds: float | None = None
    data_seconds: float | None = None
    compute_seconds: float | None = None
    latency_seconds: float | None = None


class WindowMetrics(_Wire):
    """``status.metrics``: the window's figures."""

    data_wait_ratio: float | None = None
    gpu_utilization: float | None = None
    gpu_memory_busy: float | None = None
    sm_active: float | None = None
    sm_occupancy: float | None = None
    tensor_active: float | None = None
    dram_bandwidth_utilization: float | None = None
    cpu_throttled_ratio: float | None = None
    main_cpu_cores: float | None = None
    worker_cpu_cores: float | None = None
    steps_per_second: float | None = None
    mfu: float | None = None
    arithmetic_intensity: float | None = None
    ridge_point: float | None = None
    iron_law: IronLaw | None = None


class Bottleneck(_Wire):
    """``status.bottleneck``: the verdict, a hypothesis with its evidence."""

    axis: Axis
    boundary: Axis | None = None
    regime: Regime
    lever: str
    lever_detail: str
    confidence: Ratio
    evidence: list[str] = Field(default_factory=list)
    avoid: list[str] = Field(default_factory=list)
    since: str | None = None
    missing: list[str] = Field(default_factory=list)


class Verdict(_Wire):
    bottleneck: Bottleneck
    metrics: WindowMetrics

    def to_status(self) -> dict[str, Any]:
        """The status fields (``bottleneck``, ``metrics``) with camelCase names, Nones dropped."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")
