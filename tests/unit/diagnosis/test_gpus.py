"""The GPU table and its tolerance of NVML names."""

from __future__ import annotations

import pytest

from dam_operator.diagnosis.gpus import GPU_TABLE, lookup, resolve_hardware, ridge_point
from dam_operator.diagnosis.model import Hardware


@pytest.mark.parametrize(
    ("nvml_name", "model"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA B200", "B200"),
        ("NVIDIA A100-SXM4-40GB", "A100 40GB"),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB"),
        ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe"),
        ("NVIDIA A100-PCIE-40GB", "A100 40GB"),
        ("Tesla V100-SXM2-16GB", "V100 SXM2"),
        ("Tesla V100-PCIE-32GB", "V100 PCIe"),
        ("Tesla T4", "T4"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40S", "L40S"),
        ("h100-sxm", "H100 SXM"),
        ("a100_80gb", "A100 80GB"),
    ],
)
def test_nvml_and_human_names_find_the_right_model(nvml_name: str, model: str) -> None:
    hw = lookup(nvml_name)
    assert hw is not None and hw.gpu_model == model


@pytest.mark.parametrize("name", ["NVIDIA A10G", "NVIDIA GeForce RTX 4090", "", "L400", None])
def test_unknown_models_are_not_guessed(name: str | None) -> None:
    assert lookup(name) is None


def test_ridge_points_match_the_design_figures() -> None:
    assert ridge_point(lookup("H100 SXM")) == pytest.approx(295, rel=0.01)
    assert ridge_point(lookup("H200")) == pytest.approx(206, rel=0.01)


def test_every_table_entry_finds_itself_by_name() -> None:
    for spec in GPU_TABLE:
        hw = lookup(spec.name)
        assert hw is not None and hw.gpu_model == spec.name


def test_spec_overrides_win_over_the_table() -> None:
    hw = resolve_hardware("NVIDIA H100 80GB HBM3", Hardware(peak_flops=500e12))
    assert hw is not None
    assert hw.peak_flops == 500e12
    assert hw.memory_bandwidth_bytes_per_second == pytest.approx(3.35e12)
    assert hw.gpu_model == "H100 SXM"


def test_override_model_replaces_the_detected_model() -> None:
    hw = resolve_hardware("NVIDIA H100 80GB HBM3", Hardware(gpu_model="A100 80GB"))
    assert hw is not None and hw.gpu_model == "A100 80GB"


def test_unknown_model_with_overrides_keeps_the_overrides() -> None:
    hw = resolve_hardware("Mystery X1", Hardware(peak_flops=1e15, memory_bandwidth_bytes_per_second=1e12))
    assert hw is not None and ridge_point(hw) == pytest.approx(1000.0)
    assert resolve_hardware("Mystery X1") is None
