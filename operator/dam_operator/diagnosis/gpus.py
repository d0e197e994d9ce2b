"""Peak figures of common NVIDIA accelerators, by precision, and the lookup that tolerates NVML names.

``peaks`` holds, for each precision a job's matmuls can run in (``PRECISIONS``), the *dense* (no
structured sparsity) figure of the vendor's datasheet: tensor cores for tf32, bf16, fp16, fp8 (and
fp64 where the part has fp64 tensor cores), the CUDA cores for fp32. Datasheets print the tensor
figures with sparsity (marked ``*``); the dense figure is half of it. ``peak_flops`` is the default
when the precision is unknown: bf16, or fp16 on parts without bf16 (V100, T4).
``memory_bandwidth`` is the device-memory (HBM/GDDR) bandwidth of the datasheet. The ridge point
of docs/method.md is ``peak_flops / memory_bandwidth`` FLOP per byte.

``resolve`` picks the peak MFU divides by: the table's figure for the precision the probe saw
(``Observation.matmul_precision``) times the device's share of its GPU (``gpu_slice_ratio``, a MIG
slice), and says which (``basis``). The spec's ``hardware`` overrides always win: the table is a
default, not a truth (clocks and power caps change the figures).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from dam_operator.diagnosis.model import Hardware

_T = 1e12
_GBS = 1e9
PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8", "fp64")
"""The precisions of ``Observation.matmul_precision`` (dam_contract.names.PRECISIONS)."""


def _tflops(**figures: float) -> dict[str, float]:
    return {precision: value * _T for precision, value in figures.items()}


@dataclass(frozen=True)
class GpuSpec:
    name: str
    pattern: str
    """Regular expression over the normalised name (upper case, ``-``/``_`` as spaces)."""
    peak_flops: float
    memory_bandwidth_bytes_per_second: float
    precision: str = "bf16"
    """The precision of ``peak_flops``: the default when the job's is unknown."""
    peaks: Mapping[str, float] = field(default_factory=dict)
    """Dense FLOP/s by precision (``PRECISIONS``); ``precision`` is always there."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "peaks", {**self.peaks, self.precision: self.peak_flops})

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
# Figures: NVIDIA's datasheets, dense (half the sparse "*" figure) — B200: DGX/HGX B200 (per GPU:
# FP8 4.5 PF, BF16/FP16 2.25 PF, TF32 1.1 PF, FP32 75 TF, FP64 37 TF); H100/H200/GH200: H100
# Tensor Core GPU datasheet and H200 datasheet (SXM: FP8 1979, BF16/FP16 989, TF32 494, FP32 67,
# FP64 tensor 67; PCIe: 1513, 756, 378, 51, 51; NVL: 1670, 835, 417, 60, 60); A100: A100
# datasheet (BF16/FP16 312, TF32 156, FP32 19.5, FP64 tensor 19.5; no FP8); A40 (149.7, 74.8,
# 37.4), A30 (165, 82, 10.3, FP64 tensor 10.3), A10 (125, 62.5, 31.2); L40S (FP8 733, BF16 362,
# TF32 183, FP32 91.6), L40 (362, 181, 90.5, 90.5), L4 (242, 121, 60, 30.3); T4 (FP16 65, FP32
# 8.1); V100 (tensor FP16 125 SXM2 / 112 PCIe / 130 V100S; FP32 15.7 / 14 / 16.4).
GPU_TABLE: tuple[GpuSpec, ...] = (
    GpuSpec(
        "B200",
        r"\bB200\b",
        2250 * _T,
        8000 * _GBS,
        peaks=_tflops(fp16=2250, tf32=1100, fp32=75, fp8=4500, fp64=37),
    ),
    GpuSpec(
        "GH200",
        r"\bGH200\b",
        989 * _T,
        4000 * _GBS,
        peaks=_tflops(fp16=989, tf32=494, fp32=67, fp8=1979, fp64=67),
    ),
    GpuSpec(
        "H200 NVL",
        r"\bH200\b.*\bNVL\b",
        835 * _T,
        4800 * _GBS,
        peaks=_tflops(fp16=835, tf32=417, fp32=60, fp8=1670, fp64=60),
    ),
    GpuSpec(
        "H200",
        r"\bH200\b",
        989 * _T,
        4800 * _GBS,
        peaks=_tflops(fp16=989, tf32=494, fp32=67, fp8=1979, fp64=67),
    ),
    GpuSpec(
        "H100 NVL",
        r"\bH100\b.*\bNVL\b",
        835 * _T,
        3900 * _GBS,
        peaks=_tflops(fp16=835, tf32=417, fp32=60, fp8=1670, fp64=60),
    ),
    GpuSpec(
        "H100 PCIe",
        r"\bH100\b.*\bPCIE\b",
        756 * _T,
        2000 * _GBS,
        peaks=_tflops(fp16=756, tf32=378, fp32=51, fp8=1513, fp64=51),
    ),
    GpuSpec(
        "H100 SXM",
        r"\bH100\b",
        989 * _T,
        3350 * _GBS,
        peaks=_tflops(fp16=989, tf32=494, fp32=67, fp8=1979, fp64=67),
    ),
    GpuSpec(
        "A100 80GB PCIe",
        r"\bA100\b(?=.*\b80\s?GB\b)(?=.*\bPCIE\b)",
        312 * _T,
        1935 * _GBS,
        peaks=_tflops(fp16=312, tf32=156, fp32=19.5, fp64=19.5),
    ),
    GpuSpec(
        "A100 80GB",
        r"\bA100\b.*\b80\s?GB\b",
        312 * _T,
        2039 * _GBS,
        peaks=_tflops(fp16=312, tf32=156, fp32=19.5, fp64=19.5),
    ),
    GpuSpec(
        "A100 40GB",
        r"\bA100\b",
        312 * _T,
        1555 * _GBS,
        peaks=_tflops(fp16=312, tf32=156, fp32=19.5, fp64=19.5),
    ),
    GpuSpec("A40", r"\bA40\b", 150 * _T, 696 * _GBS, peaks=_tflops(fp16=150, tf32=74.8, fp32=37.4)),
    GpuSpec("A30", r"\bA30\b", 165 * _T, 933 * _GBS, peaks=_tflops(fp16=165, tf32=82, fp32=10.3, fp64=10.3)),
    GpuSpec("A10", r"\bA10\b", 125 * _T, 600 * _GBS, peaks=_tflops(fp16=125, tf32=62.5, fp32=31.2)),
    GpuSpec("L40S", r"\bL40S\b", 362 * _T, 864 * _GBS, peaks=_tflops(fp16=362, tf32=183, fp32=91.6, fp8=733)),
    GpuSpec("L40", r"\bL40\b", 181 * _T, 864 * _GBS, peaks=_tflops(fp16=181, tf32=90.5, fp32=90.5, fp8=362)),
    GpuSpec("L4", r"\bL4\b", 121 * _T, 300 * _GBS, peaks=_tflops(fp16=121, tf32=60, fp32=30.3, fp8=242)),
    GpuSpec("T4", r"\bT4\b", 65 * _T, 320 * _GBS, precision="fp16", peaks=_tflops(fp32=8.1)),
    GpuSpec("V100S", r"\bV100S\b", 130 * _T, 1134 * _GBS, precision="fp16", peaks=_tflops(fp32=16.4)),
    GpuSpec(
        "V100 PCIe", r"\bV100\b.*\bPCIE\b", 112 * _T, 900 * _GBS, precision="fp16", peaks=_tflops(fp32=14)
    ),
    GpuSpec("V100 SXM2", r"\bV100\b", 125 * _T, 900 * _GBS, precision="fp16", peaks=_tflops(fp32=15.7)),
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


@dataclass(frozen=True)
class Peak:
    """The hardware to judge against and what its peak is (``status.metrics.peakBasis``)."""

    hardware: Hardware | None
    basis: str | None
    """``"H100 SXM bf16 dense"``, ``"A100 80GB tf32 dense x 3/7 (MIG slice)"``,
    ``"H100 SXM bf16 dense (precision unknown, assumed bf16)"``, ``"declared"``; None: no peak."""


def _share(slice_ratio: float | None) -> float:
    """The device's share of its GPU: a MIG slice's ratio, else the whole GPU."""
    return slice_ratio if slice_ratio is not None and 0 < slice_ratio < 1 else 1.0


def _table_peak(spec: GpuSpec, precision: str | None, slice_ratio: float | None) -> tuple[float, str]:
    """The table's peak for the job's precision, times the slice; and its basis in words."""
    if precision is None:
        used, note = spec.precision, f" (precision unknown, assumed {spec.precision})"
    elif precision in spec.peaks:
        used, note = precision, ""
    elif precision == "tf32" and "fp32" in spec.peaks:
        used, note = "fp32", " (no tf32 on this GPU)"  # fp32 matmuls with TF32 allowed, pre-Ampere
    else:
        used, note = spec.precision, f" (no {precision} figure for this GPU, assumed {spec.precision})"
    basis = f"{spec.name} {used}" + ("" if used == "fp32" else " dense")
    share = _share(slice_ratio)
    if share < 1:
        basis += f" x {Fraction(share).limit_denominator(8)} (MIG slice)"
    return spec.peaks[used] * share, basis + note


def resolve(
    gpu_model: str | None,
    overrides: Hardware | None = None,
    *,
    precision: str | None = None,
    slice_ratio: float | None = None,
) -> Peak:
    """The hardware to judge against: the table's entry for the model at the job's matmul
    ``precision``, times the device's share of its GPU (``slice_ratio``, a MIG slice: the
    bandwidth too), with the spec's overrides on top (a declared peak is the device's own: not
    scaled; its basis is ``declared``).

    The override's ``gpu_model`` (when set) names the model to look up instead of the detected one;
    its ``peak_flops`` and ``memory_bandwidth_bytes_per_second`` replace the table's figures.
    """
    model = (overrides.gpu_model if overrides and overrides.gpu_model else None) or gpu_model
    spec = lookup_spec(model) if model else None
    peak, basis = _table_peak(spec, precision, slice_ratio) if spec else (None, None)
    bw = spec.memory_bandwidth_bytes_per_second * _share(slice_ratio) if spec else None
    if overrides is not None and overrides.peak_flops is not None:
        peak, basis = overrides.peak_flops, "declared"
    if overrides is not None and overrides.memory_bandwidth_bytes_per_second is not None:
        bw = overrides.memory_bandwidth_bytes_per_second
    name = spec.name if spec else (model[:64] if model else None)
    if spec is None and overrides is None:
        return Peak(None, None)  # a model the table lacks, nothing declared: no figures
    if name is None and peak is None and bw is None:
        return Peak(None, None)
    return Peak(Hardware(gpu_model=name, peak_flops=peak, memory_bandwidth_bytes_per_second=bw), basis)


def resolve_hardware(gpu_model: str | None, overrides: Hardware | None = None) -> Hardware | None:
    """``resolve``'s hardware at the default precision, for the whole GPU."""
    return resolve(gpu_model, overrides).hardware


def ridge_point(hardware: Hardware | None) -> float | None:
    """FLOP per byte above which a kernel is compute-bound on this hardware."""
    if hardware is None or hardware.peak_flops is None or hardware.memory_bandwidth_bytes_per_second is None:
        return None
    return hardware.peak_flops / hardware.memory_bandwidth_bytes_per_second
