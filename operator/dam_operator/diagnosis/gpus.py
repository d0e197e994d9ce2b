"""Peak figures of common NVIDIA accelerators, and the lookup that tolerates NVML names.

``peak_flops`` is the *dense* (no structured sparsity) tensor-core figure for
bf16, or fp16 on parts without bf16 (V100, T4). ``memory_bandwidth`` is the
device-memory (HBM/GDDR) bandwidth of the datasheet. The ridge point of
docs/method.md is ``peak_flops / memory_bandwidth`` FLOP per byte.

The spec's ``hardware`` overrides always win (``resolve_hardware``): the table is
a default, not a truth — clocks, power caps and MIG slices change the figures.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dam_operator.diagnosis.model import Hardware

_T = 1e12
_GBS = 1e9


@dataclass(frozen=True)
class GpuSpec:
    name: str
    pattern: str
    """Regular expression over the normalised name (upper case, ``-``/``_`` as spaces)."""
    peak_flops: float
    memory_bandwidth_bytes_per_second: float
    precision: str = "bf16"

    @property
    def ridge_point(self) -> float:
        return self.peak_flops / self.memory_bandwidth_bytes_per_second

    def hardware(self) -> Hardware:
        return Hardware(
            gpu_model=self.name,
            peak_flops=self.peak_flops,
            memory_bandwidth_bytes_per_second=self.memory_bandwidth_bytes_per_second,
        )


# Order matters: the first pattern that matches wins, so specific names come first.
GPU_TABLE: tuple[GpuSpec, ...] = (
    GpuSpec("B200", r"\bB200\b", 2250 * _T, 8000 * _GBS),
    GpuSpec("GH200", r"\bGH200\b", 989 * _T, 4000 * _GBS),
    GpuSpec("H200 NVL", r"\bH200\b.*\bNVL\b", 835 * _T, 4800 * _GBS),
    GpuSpec("H200", r"\bH200\b", 989 * _T, 4800 * _GBS),
    GpuSpec("H100 NVL", r"\bH100\b.*\bNVL\b", 835 * _T, 3900 * _GBS),
    GpuSpec("H100 PCIe", r"\bH100\b.*\bPCIE\b", 756 * _T, 2000 * _GBS),
    GpuSpec("H100 SXM", r"\bH100\b", 989 * _T, 3350 * _GBS),
    GpuSpec("A100 80GB PCIe", r"\bA100\b(?=.*\b80\s?GB\b)(?=.*\bPCIE\b)", 312 * _T, 1935 * _GBS),
    GpuSpec("A100 80GB", r"\bA100\b.*\b80\s?GB\b", 312 * _T, 2039 * _GBS),
    GpuSpec("A100 40GB", r"\bA100\b", 312 * _T, 1555 * _GBS),
    GpuSpec("A40", r"\bA40\b", 150 * _T, 696 * _GBS),
    GpuSpec("A30", r"\bA30\b", 165 * _T, 933 * _GBS),
    GpuSpec("A10", r"\bA10\b", 125 * _T, 600 * _GBS),
    GpuSpec("L40S", r"\bL40S\b", 362 * _T, 864 * _GBS),
    GpuSpec("L40", r"\bL40\b", 181 * _T, 864 * _GBS),
    GpuSpec("L4", r"\bL4\b", 121 * _T, 300 * _GBS),
    GpuSpec("T4", r"\bT4\b", 65 * _T, 320 * _GBS, precision="fp16"),
    GpuSpec("V100S", r"\bV100S\b", 130 * _T, 1134 * _GBS, precision="fp16"),
    GpuSpec("V100 PCIe", r"\bV100\b.*\bPCIE\b", 112 * _T, 900 * _GBS, precision="fp16"),
    GpuSpec("V100 SXM2", r"\bV100\b", 125 * _T, 900 * _GBS, precision="fp16"),
)

_PREFIXES = re.compile(r"^(NVIDIA|TESLA|GEFORCE|QUADRO)\s+")


def normalise(name: str) -> str:
    """``"NVIDIA A100-SXM4-40GB"`` → ``"A100 SXM4 40GB"``."""
    text = re.sub(r"[-_/,()]+", " ", name.upper())
    text = re.sub(r"\s+", " ", text).strip()
    while True:
        stripped = _PREFIXES.sub("", text)
        if stripped == text:
            return text
        text = stripped


def lookup_spec(name: str) -> GpuSpec | None:
    text = normalise(name)
    if not text:
        return None
    for spec in GPU_TABLE:
        if re.search(spec.pattern, text):
            return spec
    return None


def lookup(name: str | None) -> Hardware | None:
    """Peak figures for an NVML or human GPU name; None for a model the table lacks."""
    if not name:
        return None
    spec = lookup_spec(name)
    return spec.hardware() if spec else None


def resolve_hardware(gpu_model: str | None, overrides: Hardware | None = None) -> Hardware | None:
    """The hardware to judge against: the table's entry for the model, with the spec's overrides on top.

    The override's ``gpu_model`` (when set) names the model to look up instead of the detected one;
    its ``peak_flops`` and ``memory_bandwidth_bytes_per_second`` replace the table's figures.
    """
    model = (overrides.gpu_model if overrides and overrides.gpu_model else None) or gpu_model
    base = lookup(model)
    if overrides is None:
        return base
    peak = overrides.peak_flops if overrides.peak_flops is not None else (base.peak_flops if base else None)
    bw = (
        overrides.memory_bandwidth_bytes_per_second
        if overrides.memory_bandwidth_bytes_per_second is not None
        else (base.memory_bandwidth_bytes_per_second if base else None)
    )
    name = base.gpu_model if base else (model[:64] if model else None)
    if name is None and peak is None and bw is None:
        return None
    return Hardware(gpu_model=name, peak_flops=peak, memory_bandwidth_bytes_per_second=bw)


def ridge_point(hardware: Hardware | None) -> float | None:
    """FLOP per byte above which a kernel is compute-bound on this hardware."""
    if hardware is None or hardware.peak_flops is None or hardware.memory_bandwidth_bytes_per_second is None:
        return None
    return hardware.peak_flops / hardware.memory_bandwidth_bytes_per_second
