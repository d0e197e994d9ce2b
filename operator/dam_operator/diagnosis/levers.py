"""The levers of docs/architecture.md (regimes, axes, levers) as kebab-case identifiers with a
human sentence (``LEVERS``). Which levers work for a regime and which would be wasted is the
regime's row in ``regimes.REGIMES`` (docs/CONTRIBUTING.md, "Add a regime or a screen").

``APPLY`` (at the end) is the Apply lever table: the levers a program can pull itself — ``dam
tune`` and the operator's Apply mode both read it (``climb`` says what an entry holds). Adding
one is one entry there, its identifier and sentence here (docs/CONTRIBUTING.md, "Add an Apply lever").

The regimes and axes themselves (``Regime``, ``Axis``) are the leaf ``diagnosis.axes``.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Final

from dam_operator.diagnosis import climb
from dam_operator.diagnosis.axes import Axis, Regime
from dam_operator.diagnosis.climb import ApplyLever, Channel, Kind
from dam_probe.overrides import TORCH_PREFETCH_DEFAULT

# Axis and Regime (the leaf ``axes``) are named here too, for the code that reads them with the catalogue.
__all__ = [
    "APPLY",
    "APPLY_SETTINGS",
    "CPU",
    "ENABLE_PIN_MEMORY",
    "INCREASE_DATALOADER_WORKERS",
    "INPUT_BOUND",
    "LEVERS",
    "NUM_WORKERS",
    "PIN_MEMORY",
    "PREFETCH_FACTOR",
    "RAISE_CPU_LIMIT",
    "RAISE_PREFETCH_FACTOR",
    "Axis",
    "Regime",
    "applicable",
    "chain",
    "sentence",
]

# Lever identifiers that code names (the Apply levers; the engine's verdicts name them too).
INCREASE_DATALOADER_WORKERS: Final = "increase-dataloader-workers"
RAISE_PREFETCH_FACTOR: Final = "raise-prefetch-factor"
ENABLE_PIN_MEMORY: Final = "enable-pin-memory"
RAISE_CPU_LIMIT: Final = "raise-cpu-limit"

# Settings an Apply lever changes: the DataLoader's argument names (the probe's overrides know
# the same), and the training container's CPU limit.
NUM_WORKERS: Final = "num_workers"
PREFETCH_FACTOR: Final = "prefetch_factor"
PIN_MEMORY: Final = "pin_memory"
CPU: Final = "cpu"

LEVERS: Final = MappingProxyType(
    {
        # --- Data: the input path -------------------------------------------------
        INCREASE_DATALOADER_WORKERS: (
            "Raise DataLoader num_workers so batches are decoded in parallel ahead of the training loop."
        ),
        ENABLE_PIN_MEMORY: (
            "Set pin_memory=True on the DataLoader (and non_blocking=True on .to(device)) "
            "so host-to-device copies run asynchronously."
        ),
        RAISE_PREFETCH_FACTOR: (
            "Raise the DataLoader prefetch_factor so each worker keeps more batches ready."
        ),
        "use-sequential-shards": (
            "Store the data as pre-decoded sequential shards (WebDataset, TFRecord, tensors) "
            "instead of per-sample JPEG decode and random file reads."
        ),
        RAISE_CPU_LIMIT: (
            "Raise the container's CPU limit (or request): the job is throttled or saturates its CPU quota."
        ),
        "raise-cpu-request": (
            "Give the job CPUs of its own: request whole CPUs with the limit equal to the request "
            "(Guaranteed QoS), so that the kubelet's static CPU manager policy pins the container to "
            "exclusive cores; the node's other processes take the CPUs it is ready to use."
        ),
        "more-loader-workers": "Add DataLoader workers.",
        # --- Data/Machine boundary: device memory ----------------------------------
        "fuse-operators": (
            "Fuse element-wise operators (fused optimizers, fused attention, custom kernels) "
            "so intermediates stay on chip."
        ),
        "torch-compile": "Wrap the model in torch.compile to fuse kernels and cut memory round-trips.",
        "lower-precision": (
            "Move data in lower precision (bf16/fp16 activations, fp8 or int8 where accuracy allows) "
            "to halve the bytes per step."
        ),
        "increase-batch-size": (
            "Use a larger batch (within memory and convergence budget) to reuse weights "
            "and amortise per-step overhead."
        ),
        "structured-pruning": "Prune whole channels/heads so the model moves and computes less.",
        "more-memory-bandwidth": "Move to an accelerator with more memory bandwidth.",
        "more-flops": "Move to an accelerator with more FLOP/s but no more memory bandwidth.",
        # --- Machine/Algorithm: compute ---------------------------------------------
        "enable-bf16": (
            "Train in bf16 autocast (or enable TF32) so matrix multiplies run on the tensor cores."
        ),
        "better-kernels": "Use tuned kernels (cuDNN/cuBLAS heuristics, FlashAttention, vendor libraries).",
        "faster-accelerator": "Move to a faster accelerator (more FLOP/s per device).",
        "data-parallelism": "Scale out with data parallelism (DDP/FSDP) across more accelerators.",
        "move-to-accelerator": (
            "Run the training on a GPU (or give the job more CPU cores): the CPU does all the arithmetic."
        ),
        # --- Algorithm/Machine: fixed latency --------------------------------------
        "cuda-graphs": (
            "Capture the step in CUDA graphs (torch.compile mode='reduce-overhead') "
            "to remove per-kernel launch overhead."
        ),
        "reduce-python-ops": (
            "Do fewer Python-level operations per step: vectorise loops, batch small tensor ops, "
            "avoid per-step logging of tensors."
        ),
        "remove-host-syncs": (
            "Remove per-step host synchronisations (.item(), .cpu(), blocking copies, printing tensors) "
            "so the host can queue work ahead of the GPU."
        ),
        "async-orchestration": "Overlap host work with device work (asynchronous copies, CUDA streams).",
        "change-model-architecture": "Change the model architecture.",
        # --- Machine/Algorithm: communication between ranks -------------------------
        "overlap-gradient-communication": (
            "Overlap gradient communication with the backward pass: tune DDP bucket_cap_mb, set "
            "gradient_as_bucket_view=True, and skip the all-reduce on gradient-accumulation steps "
            "(model.no_sync())."
        ),
        "accumulate-gradients": (
            "Accumulate gradients over several micro-batches (no_sync() between them) so ranks "
            "synchronise fewer times per sample."
        ),
        "faster-interconnect": (
            "Give the ranks a faster interconnect (NVLink/NVSwitch, InfiniBand/RoCE) or a topology-aware "
            "placement that keeps a job's ranks on one node or one switch."
        ),
        # --- Algorithm/Machine: memory capacity ---------------------------------------
        "activation-checkpointing": (
            "Recompute activations in the backward pass (torch.utils.checkpoint) instead of keeping them: "
            "less peak memory for some extra compute."
        ),
        "shard-model-states": (
            "Shard parameters, gradients and optimizer state across the ranks (FSDP, ZeRO) instead of "
            "replicating them on every GPU."
        ),
        "smaller-micro-batch": (
            "Use a smaller micro-batch and accumulate gradients to keep the effective batch size."
        ),
        "reduce-loader-memory": (
            "Cut the DataLoader's host memory: fewer workers, a smaller prefetch_factor, "
            "no per-worker copies of large Python objects (use numpy arrays or shared memory)."
        ),
        "raise-memory-limit": "Raise the container's memory limit (or request) to fit the job's peak.",
        # --- Machine/Data (I/O): checkpoint saves -----------------------------------------
        "async-checkpoint": (
            "Save checkpoints asynchronously (torch.distributed.checkpoint.async_save): the training "
            "thread only stages the state and goes on while a background thread writes it."
        ),
        "checkpoint-less-often": (
            "Save checkpoints less often (every few hundred steps or minutes, sized to the restart cost "
            "you accept), or save smaller state."
        ),
        # --- no verdict -------------------------------------------------------------
        "collect-more-evidence": "Collect more evidence before pulling any lever.",
    }
)


def sentence(lever: str) -> str:
    """The human sentence of a lever identifier (the identifier itself if unknown)."""
    return LEVERS.get(lever, lever)


# --- the Apply lever table ----------------------------------------------------------------------

INPUT_BOUND: Final = frozenset({Regime.INPUT_BOUND})
"""The regimes whose verdict may pull the input-pipeline levers."""

APPLY: Final = MappingProxyType(
    {
        INCREASE_DATALOADER_WORKERS: ApplyLever(
            INCREASE_DATALOADER_WORKERS,
            setting=NUM_WORKERS,
            channel=Channel.LOADER,
            kind=Kind.COUNT,
            ladder=climb.powers_of_two,
            bound=climb.workers_bound,
            default=0,
            observe=climb.loader_workers,
            estimate=climb.worker_processes_per_rank,
            # One worker only overlaps loading with the step; two parallelise it.
            not_final=((0, 1),),
            then=RAISE_PREFETCH_FACTOR,
            regimes=INPUT_BOUND,
        ),
        RAISE_PREFETCH_FACTOR: ApplyLever(
            RAISE_PREFETCH_FACTOR,
            setting=PREFETCH_FACTOR,
            channel=Channel.LOADER,
            kind=Kind.COUNT,
            ladder=climb.doubling,
            bound=climb.prefetch_bound,
            default=TORCH_PREFETCH_DEFAULT,
            observe=climb.loader_prefetch,
            needs=lambda facts: bool(facts.values.get(NUM_WORKERS)),
            needs_text="num_workers > 0",
            regimes=INPUT_BOUND,
        ),
        ENABLE_PIN_MEMORY: ApplyLever(
            ENABLE_PIN_MEMORY,
            setting=PIN_MEMORY,
            channel=Channel.LOADER,
            kind=Kind.SWITCH,
            ladder=climb.switch_on,
            bound=climb.no_bound,
            default=False,
            observe=climb.loader_pin_memory,
            needs=climb.has_gpu,
            needs_text="a GPU",
            regimes=INPUT_BOUND,
        ),
        RAISE_CPU_LIMIT: ApplyLever(
            RAISE_CPU_LIMIT,
            setting=CPU,
            channel=Channel.POD_CPU,
            kind=Kind.MILLICORES,
            ladder=climb.double_cpu,
            bound=climb.cpu_raise_bound,
            observe=climb.cpu_limit_millicores,
            regimes=INPUT_BOUND,
        ),
    }
)
"""The levers ``dam tune`` and the operator's Apply mode can pull themselves, by identifier."""

APPLY_SETTINGS: Final = MappingProxyType({lever.setting: lever for lever in APPLY.values()})
"""Each Apply setting's lever (one lever per setting)."""


def applicable(lever: str, regime: Regime, channels: frozenset[Channel]) -> ApplyLever | None:
    """The Apply lever a verdict names, when a caller that applies ``channels`` can pull it for
    a job in ``regime``; None otherwise (not a setting, another regime, or not reachable here)."""
    entry = APPLY.get(lever)
    if entry is None or regime not in entry.regimes or entry.channel not in channels:
        return None
    return entry


def chain(lever: str, channels: frozenset[Channel]) -> list[ApplyLever]:
    """The Apply levers a verdict's lever climbs, in order: its own, then each ``then`` (those
    a caller that applies ``channels`` can pull)."""
    seen: list[ApplyLever] = []
    entry = APPLY.get(lever)
    while entry is not None and entry not in seen:
        seen.append(entry)
        entry = APPLY.get(entry.then) if entry.then is not None else None
    return [e for e in seen if e.channel in channels]
