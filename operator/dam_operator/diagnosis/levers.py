"""The lever catalogue of docs/architecture.md (regimes, axes, levers): kebab-case identifiers
with a human sentence, and for each regime the levers that work and the ones that would be wasted.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Final

from dam_operator.diagnosis.model import Regime

LEVERS: Final = MappingProxyType(
    {
        # --- Data: the input path -------------------------------------------------
        "increase-dataloader-workers": (
            "Raise DataLoader num_workers so batches are decoded in parallel ahead of the training loop."
        ),
        "enable-pin-memory": (
            "Set pin_memory=True on the DataLoader (and non_blocking=True on .to(device)) "
            "so host-to-device copies run asynchronously."
        ),
        "raise-prefetch-factor": (
            "Raise the DataLoader prefetch_factor so each worker keeps more batches ready."
        ),
        "use-sequential-shards": (
            "Store the data as pre-decoded sequential shards (WebDataset, TFRecord, tensors) "
            "instead of per-sample JPEG decode and random file reads."
        ),
        "raise-cpu-limit": (
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
        # --- no verdict -------------------------------------------------------------
        "collect-more-evidence": "Collect more evidence before pulling any lever.",
    }
)

EFFECTIVE: Final = MappingProxyType(
    {
        Regime.INPUT_BOUND: (
            "increase-dataloader-workers",
            "enable-pin-memory",
            "raise-prefetch-factor",
            "use-sequential-shards",
            "raise-cpu-limit",
            "raise-cpu-request",
        ),
        Regime.MEMORY_BOUND: (
            "fuse-operators",
            "torch-compile",
            "lower-precision",
            "increase-batch-size",
            "structured-pruning",
        ),
        Regime.COMPUTE_BOUND: (
            "enable-bf16",
            "better-kernels",
            "faster-accelerator",
            "data-parallelism",
            "fuse-operators",
            "torch-compile",
        ),
        Regime.LATENCY_BOUND: (
            "cuda-graphs",
            "fuse-operators",
            "torch-compile",
            "reduce-python-ops",
            "increase-batch-size",
            "remove-host-syncs",
            "async-orchestration",
        ),
        Regime.COMMUNICATION_BOUND: (
            "overlap-gradient-communication",
            "accumulate-gradients",
            "faster-interconnect",
        ),
        Regime.MEMORY_CAPACITY: (
            "activation-checkpointing",
            "shard-model-states",
            "smaller-micro-batch",
            "reduce-loader-memory",
            "raise-memory-limit",
        ),
        Regime.UNKNOWN: ("collect-more-evidence",),
    }
)

AVOID: Final = MappingProxyType(
    {
        Regime.INPUT_BOUND: ("faster-accelerator", "change-model-architecture"),
        Regime.MEMORY_BOUND: ("more-flops",),
        Regime.COMPUTE_BOUND: ("more-memory-bandwidth", "more-loader-workers"),
        Regime.LATENCY_BOUND: ("faster-accelerator", "more-memory-bandwidth"),
        Regime.COMMUNICATION_BOUND: ("more-loader-workers", "faster-accelerator"),
        Regime.MEMORY_CAPACITY: ("faster-accelerator", "more-loader-workers"),
        Regime.UNKNOWN: (),
    }
)


def sentence(lever: str) -> str:
    """The human sentence of a lever identifier (the identifier itself if unknown)."""
    return LEVERS.get(lever, lever)


def avoid(regime: Regime) -> list[str]:
    return list(AVOID[regime])


def detail(lever: str, regime: Regime, *, also: tuple[str, ...] | None = None) -> str:
    """The lever's sentence plus the other effective levers of the regime, for ``leverDetail``."""
    others = [x for x in (also if also is not None else EFFECTIVE[regime]) if x != lever]
    text = sentence(lever)
    if others:
        text += " Also effective: " + ", ".join(others) + "."
    return text
