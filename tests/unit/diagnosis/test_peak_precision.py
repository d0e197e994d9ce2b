"""The peak MFU divides by: the GPU table's dense figure for the precision the job's matmuls ran
in (the probe's FLOP counter), times the device's share of its GPU (a MIG slice), and
``status.metrics`` says which (``peakFlops``, ``peakBasis``). The expected peaks are the vendor
datasheets' figures, typed here, not read from the table."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dam_contract.snapshot import Snapshot, parse_snapshot
from dam_operator.diagnosis.engine import diagnose
from dam_operator.diagnosis.gpus import resolve
from dam_operator.diagnosis.model import Hardware, Observation
from dam_operator.diagnosis.render import render_text
from dam_operator.diagnosis.window import PodWindow, job_window
from dam_probe.layout import FLOPS_MEASURED, PRECISION_TF32, ProbeRecord, encode, probe_path
from dam_sidecar.attribution import Attributor
from dam_sidecar.collector import SidecarCollector, standard_collectors
from dam_sidecar.errors import ErrorLog
from dam_sidecar.fake_nvml import MIG_HANDLE_BASE, FakeGpu, FakeNvml
from dam_sidecar.samplers.cpu import CpuSampler
from dam_sidecar.samplers.nvml import NvmlSampler
from dam_sidecar.samplers.probe import ProbeReader

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"
# A 125M-parameter model on 2048 tokens a step: 6 x N x tokens FLOPs (forward 2, backward 4).
FLOPS = 6 * 125e6 * 2048
RATE = 2.0  # steps per second
WINDOW_S = 10.0


@pytest.mark.parametrize(
    ("precision", "datasheet"),
    [
        ("fp32", 67e12),  # H100 SXM FP32 (CUDA cores)
        ("tf32", 494e12),  # TF32 Tensor Core 989* (sparse) / 2
        ("bf16", 989e12),  # BF16 Tensor Core 1979* / 2
        ("fp16", 989e12),  # FP16 Tensor Core 1979* / 2
        ("fp8", 1979e12),  # FP8 Tensor Core 3958* / 2
    ],
)
def test_the_peak_is_the_datasheet_figure_of_the_job_s_precision(precision: str, datasheet: float) -> None:
    peak = resolve(H100, precision=precision)
    assert peak.hardware is not None and peak.hardware.peak_flops == pytest.approx(datasheet, rel=0.002)
    assert peak.basis == f"H100 SXM {precision}" + ("" if precision == "fp32" else " dense")


def test_an_unknown_precision_assumes_bf16_and_says_so() -> None:
    peak = resolve(H100)
    assert peak.hardware is not None and peak.hardware.peak_flops == pytest.approx(989e12)
    assert peak.basis == "H100 SXM bf16 dense (precision unknown, assumed bf16)"


def test_a_precision_the_gpu_has_no_figure_for_falls_back_and_says_so() -> None:
    fp8 = resolve(A100, precision="fp8")  # Ampere has no FP8 tensor cores
    assert fp8.hardware is not None and fp8.hardware.peak_flops == pytest.approx(312e12)
    assert fp8.basis == "A100 80GB bf16 dense (no fp8 figure for this GPU, assumed bf16)"
    tf32 = resolve("Tesla V100-SXM2-16GB", precision="tf32")  # Volta: TF32 allowed runs as fp32
    assert tf32.hardware is not None and tf32.hardware.peak_flops == pytest.approx(15.7e12)
    assert tf32.basis == "V100 SXM2 fp32 (no tf32 on this GPU)"


def test_a_3g_mig_slice_of_a_7_slice_gpu_is_three_sevenths_of_the_peak() -> None:
    peak = resolve(A100, precision="tf32", slice_ratio=3 / 7)
    assert peak.hardware is not None
    assert peak.hardware.peak_flops == pytest.approx(156e12 * 3 / 7)  # A100 TF32 312* / 2
    assert peak.hardware.memory_bandwidth_bytes_per_second == pytest.approx(2039e9 * 3 / 7)
    assert peak.basis == "A100 80GB tf32 dense x 3/7 (MIG slice)"


def test_a_declared_peak_wins_unscaled_and_says_declared() -> None:
    peak = resolve(A100, Hardware(peak_flops=1e14), precision="tf32", slice_ratio=3 / 7)
    assert peak.hardware is not None and peak.hardware.peak_flops == 1e14
    assert peak.basis == "declared"


def _obs(**extra: object) -> Observation:
    return Observation.model_validate(
        {
            "window_seconds": WINDOW_S,
            "steps": RATE * WINDOW_S,
            "steps_per_second": RATE,
            "flops_per_step": FLOPS,
            "gpu_count": 1,
            "gpu_utilization": 0.97,
            "data_wait_ratio": 0.0,
            **extra,
        }
    )


def test_mfu_divides_by_the_peak_of_the_precision_and_the_slice_and_the_status_says_which() -> None:
    obs = _obs(gpu_model=A100, matmul_precision="tf32", gpu_slice_ratio=3 / 7)
    verdict = diagnose(obs)
    assert verdict.metrics.mfu == pytest.approx(FLOPS * RATE / (156e12 * 3 / 7))
    metrics = verdict.to_status()["metrics"]
    assert metrics["peakFlops"] == pytest.approx(156e12 * 3 / 7)
    assert metrics["peakBasis"] == "A100 80GB tf32 dense x 3/7 (MIG slice)"
    assert metrics["matmulPrecision"] == "tf32" and metrics["gpuSliceRatio"] == pytest.approx(3 / 7)
    assert "of 66.86 TFLOP/s per accelerator (A100 80GB tf32 dense x 3/7 (MIG slice))" in render_text(verdict)


def test_the_same_job_in_bf16_on_the_whole_gpu_divides_by_the_bf16_peak() -> None:
    verdict = diagnose(_obs(gpu_model=A100, matmul_precision="bf16", gpu_slice_ratio=1.0))
    assert verdict.metrics.mfu == pytest.approx(FLOPS * RATE / 312e12)
    assert verdict.to_status()["metrics"]["peakBasis"] == "A100 80GB bf16 dense"


def test_an_unknown_precision_is_in_the_status_as_assumed() -> None:
    metrics = diagnose(_obs(gpu_model=H100)).to_status()["metrics"]
    assert metrics["peakBasis"] == "H100 SXM bf16 dense (precision unknown, assumed bf16)"
    assert metrics.get("matmulPrecision") is None


def test_a_declared_peak_is_in_the_status_as_declared() -> None:
    verdict = diagnose(_obs(gpu_model=H100, matmul_precision="fp8"), hardware=Hardware(peak_flops=5e14))
    assert verdict.metrics.mfu == pytest.approx(FLOPS * RATE / 5e14)
    assert verdict.to_status()["metrics"]["peakBasis"] == "declared"


# --- end to end: a probe file and a simulated MIG GPU through the real sidecar -------------------


@pytest.fixture
def pid() -> Iterator[int]:
    """A real live process whose pid the probe file carries (the reader checks /proc/PID)."""
    proc = subprocess.Popen(["sleep", "120"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def _record(pid: int, uuid: str, steps: int) -> ProbeRecord:
    return ProbeRecord(
        pid=pid,
        start_time_ns=1_000,
        steps=steps,
        wait_ns=0,
        step_ns=round(steps / RATE * 1e9),
        last_update_ns=time.time_ns(),
        batch_size=8,
        flops_per_step=0.0,
        closed=False,
        device_uuids=(uuid,),
        process_start_ns=1,
        startup_ns=10**9,
        productive_ns=round(steps / RATE * 1e9),
        other_ns=0,
        flops_state=FLOPS_MEASURED,
        measured_flops_per_step=FLOPS,
        flops_measured_ns=10**7,
        flops_measured_steps=1,
        matmul_precision=PRECISION_TF32,
    )


def test_a_tf32_job_on_a_3g_mig_slice_through_the_sidecar(tmp_path: Path, pid: int) -> None:
    errors = ErrorLog()
    fake = FakeNvml([FakeGpu(uuid="GPU-a100", name=A100, mig=True, mig_slices=(3, 4))])
    mine = fake.nvmlDeviceGetUUID(MIG_HANDLE_BASE)  # the first MIG device: 3 of 7 slices
    collector = SidecarCollector(
        standard_collectors(
            probe=ProbeReader(str(tmp_path), errors),
            nvml=NvmlSampler(errors, load=lambda: fake),
            cpu=CpuSampler(errors),
            errors=errors,
            attributor=Attributor("visible_devices", None),
        ),
        errors=errors,
    )

    def scrape(steps: int) -> Snapshot:
        with open(probe_path(str(tmp_path), pid), "wb") as fh:
            fh.write(encode(_record(pid, mine, steps)))
        collector.sample_now()
        return parse_snapshot(collector.text().decode())

    try:
        before, after = scrape(100), scrape(100 + round(RATE * WINDOW_S))
    finally:
        collector.close()
    job = job_window({"pod-0": PodWindow(before, after, elapsed_seconds=WINDOW_S)}).job
    assert job.matmul_precision == "tf32" and job.gpu_slice_ratio == pytest.approx(3 / 7)
    verdict = diagnose(job)
    assert verdict.metrics.mfu == pytest.approx(FLOPS * RATE / (156e12 * 3 / 7), rel=0.01)
    assert verdict.metrics.peak_basis == "A100 80GB tf32 dense x 3/7 (MIG slice)"
