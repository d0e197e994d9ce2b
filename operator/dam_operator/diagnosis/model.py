"""Data types of the diagnosis engine: what goes in (a window of observations,
thresholds, hardware) and what comes out (a verdict). The verdict's ``Axis`` and ``Regime``
are the lever catalogue's (``diagnosis.levers``: each regime with its axes and its levers).

Field names on the wire (JSON, the resource status) are camelCase aliases of the
snake_case Python names; ``model_dump(by_alias=True)`` gives the status shape of
docs/architecture.md (the DAMProfile resource). Pure data: no I/O, no Kubernetes, no NVML.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal, NamedTuple, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)
from pydantic.alias_generators import to_camel

from dam_operator.diagnosis import signals
from dam_operator.diagnosis.evidence import Evidence, note
from dam_operator.diagnosis.levers import Axis, Regime


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
    """Peak figures of one accelerator; from the GPU table or the spec's overrides."""

    gpu_model: Annotated[str, Field(max_length=64)] | None = None
    peak_flops: Annotated[float, Field(gt=0.0), AfterValidator(_finite_or_none)] | None = None
    memory_bandwidth_bytes_per_second: (
        Annotated[float, Field(gt=0.0), AfterValidator(_finite_or_none)] | None
    ) = None


class Thresholds(_Wire):
    """Screening thresholds of docs/method.md. Every one is overridable in the spec."""

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
    cpu_wait_suspect: Ratio = 0.20
    """The training process runnable but waiting for a CPU (run-queue delay) at least this share of
    the wall time: a busy node holds it back (the step would be 1 / (1 - share) times shorter)."""
    tensor_active_low: Ratio = 0.20
    """Tensor pipes busier than this count as "tensor cores in use" (compute-bound lever choice)."""
    worker_cpu_saturated: Ratio = 0.90
    """Loader workers using this share of the container's CPU limit (or more) saturate it."""
    min_steps: Annotated[int, Field(ge=1, le=1_000_000)] = 3
    """Fewer steps than this in a window is too little evidence for a verdict."""
    communication_suspect: Ratio = 0.10
    """Skew-corrected exposed communication above this share of the step → suspect communication."""
    straggler_skew: Ratio = 0.10
    """(max − min collective seconds per step) above this share of the step → a straggler."""
    gpu_memory_full: Annotated[float, Field(gt=0.5, le=1.0)] = 0.95
    """Device memory used above this share of total → memory capacity is the limit."""
    container_memory_full: Annotated[float, Field(gt=0.5, le=1.0)] = 0.95
    """Container memory at/above this share of its limit → a weaker memory-capacity screen."""
    checkpoint_suspect: Ratio = 0.10
    """The training thread blocked in checkpoint saves above this share of the wall time →
    checkpoint-bound (when no larger loss, data wait or exposed communication, explains more)."""


class IronLaw(_Wire):
    """Per-step estimate of the iron-law terms, seconds (None where inputs are missing)."""

    step_seconds: float | None = None
    data_seconds: float | None = None
    compute_seconds: float | None = None
    latency_seconds: float | None = None


class RankFigures(_Wire):
    """One rank's figures in ``status.metrics.ranks`` (and ``dam run --json`` ``ranks``)."""

    rank: int | None = None
    pod: str | None = None
    steps_per_second: float | None = None
    data_wait_ratio: float | None = None
    collective_ratio: float | None = None
    exposed_ratio: float | None = None


_FLAT = ConfigDict(**_Wire.model_config, ser_json_inf_nan="constants")
"""The config of a model that holds ``WindowMetrics`` at the top of a dump: the flat dict its
serializer returns is serialized again by inference, which follows the top model's config, and
there an infinite figure stays infinite, as a declared float field keeps it in
``model_dump(mode="json")``."""


class WindowMetrics(_Wire):
    """``status.metrics``: the window's figures.

    Two kinds, and none written twice: the signals' own figures come from the signal table
    (``signals.STATUS_SIGNALS``: each entry with a status key), held in ``shown``, an
    ``Observation`` with those fields set and the others None; the figures the engine derives
    (the rate, MFU, the roofline, the iron law, the ranks) are the fields declared here. A new
    signal with a status key needs no field here: its table entry is enough (deploy/render.py
    writes the CRD's ``status.metrics`` schema from the same entries).

    ``WindowMetrics(data_wait_ratio=0.4, mfu=0.3)`` takes a shown signal by its field name or
    its status key (``engine`` passes ``signals.status_values(obs)``). The wire form
    (``model_dump(by_alias=True)``) is flat: the shown signals in table order, then the derived.
    Typed code reads a shown signal as ``metrics.shown.data_wait_ratio``; ``metrics.data_wait_ratio``
    works too at run time (not for the type checker).
    """

    model_config = _FLAT

    shown: Observation = Field(default_factory=Observation, exclude=True)
    """The signals the status shows (not on the wire as such: each is, under its status key)."""
    steps_per_second: float | None = None
    """The job's rate (the median rank's for a distributed job; each rank's under ``ranks``)."""
    mfu: float | None = None
    peak_flops: float | None = None
    """The peak FLOP/s of one accelerator MFU divided by (``peak_basis`` says which)."""
    peak_basis: str | None = None
    """Which peak: the GPU table's figure for the job's matmul precision and MIG slice
    (``"H100 SXM bf16 dense"``, ``"... (precision unknown, assumed bf16)"``), or ``"declared"``."""
    arithmetic_intensity: float | None = None
    ridge_point: float | None = None
    iron_law: IronLaw | None = None
    rank_count: int | None = None
    """Ranks in the window (``ranks`` lists at most the worst few)."""
    ranks: list[RankFigures] | None = None
    """The worst few ranks (latest at the collectives first); only for jobs with several ranks."""

    @model_validator(mode="before")
    @classmethod
    def _shown_signals(cls, data: Any) -> Any:
        """The shown signals among the arguments (by field name or status key) go into ``shown``."""
        if not isinstance(data, Mapping):
            return data
        taken = {k: v for k, v in data.items() if k in _SHOWN}
        if not taken:
            return data
        if "shown" in data:
            raise ValueError("a shown signal goes either into shown or beside it, not both")
        rest = {k: v for k, v in data.items() if k not in _SHOWN}
        return {**rest, "shown": Observation(**taken)}

    @model_serializer(mode="wrap")
    def _flat(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        derived: dict[str, Any] = handler(self)
        shown = signals.status_values(self.shown, by_alias=info.by_alias)
        if info.exclude_none:
            shown = {k: v for k, v in shown.items() if v is not None}
        return {**shown, **derived}

    @classmethod
    def status_keys(cls) -> tuple[str, ...]:
        """Every key ``status.metrics`` can hold: the shown signals' (table order), then the derived."""
        derived = [f.alias or n for n, f in cls.model_fields.items() if not f.exclude]
        return (*signals.STATUS_SIGNALS, *derived)

    if not TYPE_CHECKING:

        def __getattr__(self, name: str) -> Any:
            if name in _SHOWN_NAMES:  # metrics.data_wait_ratio: the shown signal
                return getattr(self.shown, name)
            return super().__getattr__(name)


_SHOWN_NAMES = frozenset(sig.name for sig in signals.STATUS_SIGNALS.values())
_SHOWN = _SHOWN_NAMES | frozenset(signals.STATUS_SIGNALS)
"""A shown signal's field names and status keys (``WindowMetrics`` takes either)."""


class _Recorded(_Wire):
    """A wire model whose ``evidence`` sentences are rendered from ``Evidence`` records it keeps
    (not on the wire): ``Bottleneck`` and ``Straggler``. No fields of its own (each subclass
    declares ``evidence`` where its wire order has it)."""

    if TYPE_CHECKING:
        evidence: list[str]

    _records: tuple[Evidence, ...] = PrivateAttr(default=())

    @classmethod
    def of(cls, records: Sequence[Evidence], **fields: Any) -> Self:
        """One whose ``evidence`` is rendered from ``records``, which it keeps (not on the wire)."""
        made = cls(evidence=[r.sentence for r in records], **fields)
        made._records = tuple(records)
        return made

    def with_records(self, records: Sequence[Evidence]) -> Self:
        """This one with ``evidence`` rendered from ``records``, which it keeps (not on the wire)."""
        copy = self.model_copy(update={"evidence": [r.sentence for r in records]})
        copy._records = tuple(records)
        return copy

    def records(self) -> list[Evidence]:
        """The record behind each evidence sentence: the engine's, where it made the sentence (the
        records survive ``model_copy``); a ``NOTE`` with no numbers for any other (read from a status)."""
        known = {r.sentence: r for r in self._records}
        return [known.get(s) or note(s) for s in self.evidence]

    def __eq__(self, other: object) -> bool:
        """Equal when the wire fields are: one read back from its status equals the verdict's."""
        if not isinstance(other, type(self)):
            return NotImplemented
        return self.__dict__ == other.__dict__

    __hash__ = None  # type: ignore[assignment]  # lists inside: never hashable


class Straggler(_Recorded):
    """``status.bottleneck.straggler``: the rank that holds a job back, and why."""

    pod: str | None = None
    """The pod in the cluster (None in local mode)."""
    rank: int | None = None
    """Its distributed rank (None for a pod without ranks: independent pods)."""
    cause: Axis
    evidence: list[str] = Field(default_factory=list)


class Bottleneck(_Recorded):
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
    straggler: Straggler | None = None


class Verdict(_Wire):
    model_config = _FLAT

    bottleneck: Bottleneck
    metrics: WindowMetrics

    def to_status(self) -> dict[str, Any]:
        """The status fields (``bottleneck``, ``metrics``) with camelCase names, Nones dropped."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")
