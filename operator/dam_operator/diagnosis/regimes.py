"""The regimes of docs/architecture.md, one ``RegimeSpec`` each, in one list (``REGIMES``).

A regime's row says everything about it: its axis and usual boundary, what the docs' regime
tables say of it (the dominant term, a note after the boundary or the levers), the levers that
work (the first is the one its rules name most) and the ones that would be wasted, the rules that
reach it (each with its ``rules.base.Stage``) and the thresholds they read. The engine reads its
axes and levers from here, the referee walks ``RULES`` (every row's rules, in stage order; within
a stage in the order of this list), deploy/render.py writes the CRD's regime enum from ``Regime``
and tools/gen_regime_doc.py the regime tables of docs/method.md and docs/architecture.md from
these rows. Adding a regime: docs/CONTRIBUTING.md, "Add a regime or a screen".
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from dam_operator.diagnosis import levers
from dam_operator.diagnosis.axes import Axis, Regime
from dam_operator.diagnosis.rules import checkpoint, communication, data, evidence_screen, gpu, host, memory
from dam_operator.diagnosis.rules.base import Rule, Stage


@dataclass(frozen=True)
class RegimeSpec:
    """One regime: what a verdict of it says, and the rules that reach it."""

    regime: Regime
    axis: Axis
    boundary: Axis | None
    dominant_term: str
    """The term of the step time that dominates (docs/method.md, the iron law)."""
    effective: tuple[str, ...]
    """The levers that work, as the docs list them (``working`` adds the Apply levers whose
    ``regimes`` name this one, so that an Apply lever is one entry of ``levers.APPLY``)."""
    wasted: tuple[str, ...]
    """The levers that would be wasted (``avoid``)."""
    rules: tuple[Rule, ...] = ()
    """The rules that answer with this regime (a rule that may answer with several stands in the
    row of the one it names most, ``also_reaches`` says which others)."""
    thresholds: tuple[str, ...] = ()
    """The ``Thresholds`` fields its rules read."""
    boundary_note: str = ""
    """Said in brackets after the boundary."""
    lever_note: str = ""
    """Said in brackets after the levers that work (e.g. levers a rule names in one case only)."""

    @property
    def working(self) -> tuple[str, ...]:
        """The levers that work (``leverDetail``'s "also effective" unless a finding names its
        own): ``effective``, then the Apply levers of this regime it does not list."""
        pulled = [a.id for a in levers.APPLY.values() if self.regime in a.regimes]
        return (*self.effective, *(x for x in pulled if x not in self.effective))


REGIMES: Final[tuple[RegimeSpec, ...]] = (
    RegimeSpec(
        Regime.MEMORY_CAPACITY,
        Axis.ALGORITHM,
        Axis.MACHINE,
        "peak memory vs capacity",
        (
            "activation-checkpointing",
            "shard-model-states",
            "smaller-micro-batch",
            "reduce-loader-memory",
            "raise-memory-limit",
        ),
        ("faster-accelerator", "more-loader-workers"),
        rules=(Rule("memory-capacity", memory.memory_capacity, Stage.MEMORY, aside="apart from memory"),),
        thresholds=("gpu_memory_full", "container_memory_full"),
    ),
    RegimeSpec(
        Regime.UNKNOWN,
        Axis.UNKNOWN,
        None,
        "—",
        ("collect-more-evidence",),
        (),
        rules=(
            Rule("no-training-step", evidence_screen.no_step, Stage.NO_STEP),
            Rule("too-few-steps", evidence_screen.too_few_steps, Stage.FEW_STEPS),
            Rule("gpu-unmeasured", gpu.gpu_unmeasured, Stage.LAST),
        ),
        thresholds=("min_steps",),
        lever_note="names what is missing",
    ),
    # Communication, data and checkpoint weigh their losses in one stage (Stage.LOSS). They are
    # asked in this order, which is the order of the suspects they name, and an equal loss goes
    # to the one asked last: the saves over the data wait over the exposed communication.
    RegimeSpec(
        Regime.COMMUNICATION_BOUND,
        Axis.MACHINE,
        Axis.ALGORITHM,
        "exposed collective time, skew-corrected",
        ("overlap-gradient-communication", "accumulate-gradients", "faster-interconnect"),
        ("more-loader-workers", "faster-accelerator"),
        rules=(Rule("communication-bound", communication.communication_bound, Stage.LOSS),),
        thresholds=("communication_suspect", "data_wait_suspect"),
    ),
    RegimeSpec(
        Regime.INPUT_BOUND,
        Axis.DATA,
        None,
        "D_vol/BW of the input path",
        (
            levers.INCREASE_DATALOADER_WORKERS,
            levers.ENABLE_PIN_MEMORY,
            levers.RAISE_PREFETCH_FACTOR,
            "use-sequential-shards",
            levers.RAISE_CPU_LIMIT,
            "raise-cpu-request",
        ),
        ("faster-accelerator", "change-model-architecture"),
        rules=(Rule("input-bound", data.input_bound, Stage.LOSS),),
        thresholds=(
            "data_wait_suspect",
            "gpu_util_starved",
            "cpu_throttled_suspect",
            "worker_cpu_saturated",
            "cpu_wait_suspect",
        ),
        boundary_note="Machine when host CPU is the cause",
    ),
    RegimeSpec(
        Regime.CHECKPOINT_BOUND,
        Axis.MACHINE,
        Axis.DATA,
        "time the training thread blocks in checkpoint saves",
        ("async-checkpoint", "checkpoint-less-often"),
        ("faster-accelerator", "more-loader-workers"),
        rules=(Rule("checkpoint-bound", checkpoint.checkpoint_bound, Stage.LOSS),),
        thresholds=("checkpoint_suspect",),
        boundary_note="I/O",
    ),
    RegimeSpec(
        Regime.MEMORY_BOUND,
        Axis.DATA,
        Axis.MACHINE,
        "D_vol/BW of device memory",
        ("fuse-operators", "torch-compile", "lower-precision", "increase-batch-size", "structured-pruning"),
        ("more-flops",),
        rules=(Rule("memory-bound", gpu.memory_bound, Stage.GPU_FED),),
        thresholds=("gpu_util_starved", "gpu_util_busy", "dram_bandwidth_saturated"),
    ),
    RegimeSpec(
        Regime.LATENCY_BOUND,
        Axis.ALGORITHM,
        Axis.MACHINE,
        "L_lat",
        (
            "cuda-graphs",
            "fuse-operators",
            "torch-compile",
            "reduce-python-ops",
            "increase-batch-size",
            "remove-host-syncs",
            "async-orchestration",
        ),
        ("faster-accelerator", "more-memory-bandwidth"),
        rules=(
            Rule("small-kernels", gpu.small_kernels, Stage.GPU_FED),
            Rule("gpu-starved", gpu.gpu_starved, Stage.GPU_STARVED),
        ),
        thresholds=("gpu_util_starved", "sm_active_busy", "main_cpu_saturated_cores", "data_wait_fine"),
    ),
    RegimeSpec(
        Regime.COMPUTE_BOUND,
        Axis.MACHINE,
        Axis.ALGORITHM,
        "O/(R_peak·η)",
        (
            "enable-bf16",
            "better-kernels",
            "faster-accelerator",
            "data-parallelism",
            "fuse-operators",
            "torch-compile",
        ),
        ("more-memory-bandwidth", "more-loader-workers"),
        rules=(
            Rule("compute-bound", gpu.compute_bound, Stage.GPU_FED),
            Rule("busy-node", host.busy_node, Stage.BUSY_NODE),
            # Also latency-bound (one saturated Python thread at batch size 1) or unknown.
            Rule("cpu-only", host.cpu_only, Stage.CPU_ONLY),
        ),
        thresholds=(
            "gpu_util_busy",
            "sm_active_busy",
            "tensor_active_low",
            "mfu_investigate",
            "mfu_efficient",
            "cpu_wait_suspect",
            "main_cpu_saturated_cores",
            "cpu_throttled_suspect",
        ),
        lever_note="CPU-only: `move-to-accelerator`; a busy node: `raise-cpu-request`",
    ),
)
"""Every regime once; the order is the order in which rules of one stage are asked."""

VERDICT_THRESHOLDS: Final = ("straggler_skew", "mfu_efficient", "mfu_investigate", "data_wait_fine")
"""Thresholds every verdict reads, whatever its regime (the straggler, the MFU line)."""

SPECS: Final = MappingProxyType({spec.regime: spec for spec in REGIMES})
"""Each regime's row."""

RULES: Final[tuple[Rule, ...]] = tuple(
    sorted((rule for spec in REGIMES for rule in spec.rules), key=lambda rule: rule.stage)
)
"""The rules the referee walks (``rules.decide``), in stage order."""


def avoid(regime: Regime) -> list[str]:
    return list(SPECS[regime].wasted)


def detail(lever: str, regime: Regime, *, also: tuple[str, ...] | None = None) -> str:
    """The lever's sentence plus the other effective levers of the regime, for ``leverDetail``."""
    others = [x for x in (also if also is not None else SPECS[regime].working) if x != lever]
    text = levers.sentence(lever)
    if others:
        text += " Also effective: " + ", ".join(others) + "."
    return text
