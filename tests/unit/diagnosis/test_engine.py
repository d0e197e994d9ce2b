"""The decision rules of docs/method.md and docs/architecture.md, one table row per case."""

from __future__ import annotations

from typing import Any

import pytest

from dam_operator.diagnosis import levers, regimes
from dam_operator.diagnosis.engine import diagnose
from dam_operator.diagnosis.gpus import lookup
from dam_operator.diagnosis.model import Axis, Hardware, Observation, Regime, Thresholds, Verdict

BASE: dict[str, Any] = {"steps": 300.0, "window_seconds": 60.0}
A100 = "NVIDIA A100-SXM4-40GB"


def run(**fields: Any) -> Verdict:
    return diagnose(Observation(**{**BASE, **fields}))


# (id, observation fields, regime, axis, boundary, lever or None for "any effective lever")
CASES: list[tuple[str, dict[str, Any], Regime, Axis, Axis | None, str | None]] = [
    (
        "seed case 1: A100 starved at 10-40% util with a waiting loader",
        {"gpu_count": 1, "gpu_model": A100, "gpu_utilization": 0.25, "data_wait_ratio": 0.55},
        Regime.INPUT_BOUND,
        Axis.DATA,
        None,
        "increase-dataloader-workers",
    ),
    (
        "seed case 2: batch-1 latency cliff with low util",
        {
            "gpu_count": 1,
            "gpu_utilization": 0.2,
            "data_wait_ratio": 0.0,
            "batch_size": 1,
            "main_cpu_cores": 1.0,
        },
        Regime.LATENCY_BOUND,
        Axis.ALGORITHM,
        Axis.MACHINE,
        "increase-batch-size",
    ),
    (
        "seed case 3: 99% util, bandwidth unsaturated, high MFU",
        {
            "gpu_count": 1,
            "gpu_model": A100,
            "gpu_utilization": 0.99,
            "sm_active": 0.92,
            "tensor_active": 0.7,
            "dram_bandwidth_utilization": 0.35,
            "data_wait_ratio": 0.002,
            # 60% MFU on an A100: 0.6 * 312e12 / 5 steps/s
            "flops_per_step": 0.6 * 312e12 / 5.0,
        },
        Regime.COMPUTE_BOUND,
        Axis.MACHINE,
        Axis.ALGORITHM,
        "faster-accelerator",
    ),
    (
        "input-bound, CPU throttled: boundary Machine",
        {"gpu_count": 1, "gpu_utilization": 0.3, "data_wait_ratio": 0.4, "cpu_throttled_ratio": 0.35},
        Regime.INPUT_BOUND,
        Axis.DATA,
        Axis.MACHINE,
        "raise-cpu-limit",
    ),
    (
        "input-bound, loader saturates the CPU limit: boundary Machine",
        {
            "gpu_count": 1,
            "gpu_utilization": 0.3,
            "data_wait_ratio": 0.4,
            "main_cpu_cores": 1.0,
            "worker_cpu_cores": 2.9,
            "cpu_limit_cores": 4.0,
        },
        Regime.INPUT_BOUND,
        Axis.DATA,
        Axis.MACHINE,
        "raise-cpu-limit",
    ),
    (
        "input-bound, idle workers waiting on storage",
        {
            "gpu_count": 1,
            "gpu_utilization": 0.3,
            "data_wait_ratio": 0.4,
            "worker_count": 8,
            "worker_cpu_cores": 0.8,
        },
        Regime.INPUT_BOUND,
        Axis.DATA,
        None,
        "use-sequential-shards",
    ),
    (
        "memory-bound: util high, DRAM saturated",
        {
            "gpu_count": 1,
            "gpu_utilization": 0.98,
            "sm_active": 0.6,
            "dram_bandwidth_utilization": 0.85,
            "data_wait_ratio": 0.01,
        },
        Regime.MEMORY_BOUND,
        Axis.DATA,
        Axis.MACHINE,
        "fuse-operators",
    ),
    (
        "memory-bound from intensity below the ridge point (no DRAM counter)",
        {
            "gpu_count": 1,
            "gpu_model": A100,
            "gpu_utilization": 0.97,
            "data_wait_ratio": 0.0,
            "flops_per_step": 1e9,
            "bytes_per_step": 1e8,
        },
        Regime.MEMORY_BOUND,
        Axis.DATA,
        Axis.MACHINE,
        None,
    ),
    (
        "compute-bound without tensor cores: enable bf16",
        {
            "gpu_count": 1,
            "gpu_utilization": 0.99,
            "sm_active": 0.95,
            "tensor_active": 0.02,
            "dram_bandwidth_utilization": 0.3,
            "data_wait_ratio": 0.0,
        },
        Regime.COMPUTE_BOUND,
        Axis.MACHINE,
        Axis.ALGORITHM,
        "enable-bf16",
    ),
    (
        "compute-bound with low MFU: fuse with torch.compile",
        {
            "gpu_count": 1,
            "gpu_model": A100,
            "gpu_utilization": 0.99,
            "sm_active": 0.95,
            "dram_bandwidth_utilization": 0.3,
            "data_wait_ratio": 0.0,
            "flops_per_step": 0.1 * 312e12 / 5.0,
        },
        Regime.COMPUTE_BOUND,
        Axis.MACHINE,
        Axis.ALGORITHM,
        "torch-compile",
    ),
    (
        "busy GPU hides the loader wait: not input-bound",
        {
            "gpu_count": 1,
            "gpu_utilization": 0.99,
            "sm_active": 0.9,
            "dram_bandwidth_utilization": 0.3,
            "data_wait_ratio": 0.3,
        },
        Regime.COMPUTE_BOUND,
        Axis.MACHINE,
        Axis.ALGORITHM,
        None,
    ),
    (
        "util high but SMs idle: kernels too small",
        {"gpu_count": 1, "gpu_utilization": 0.99, "sm_active": 0.15, "dram_bandwidth_utilization": 0.1},
        Regime.LATENCY_BOUND,
        Axis.ALGORITHM,
        Axis.MACHINE,
        None,
    ),
    (
        "latency-bound: GPU idle, no data wait, Python thread saturated",
        {"gpu_count": 1, "gpu_utilization": 0.35, "data_wait_ratio": 0.003, "main_cpu_cores": 0.99},
        Regime.LATENCY_BOUND,
        Axis.ALGORITHM,
        Axis.MACHINE,
        "cuda-graphs",
    ),
    (
        "CPU-only input-bound from the data wait alone",
        {"gpu_count": 0, "data_wait_ratio": 0.5, "main_cpu_cores": 0.4},
        Regime.INPUT_BOUND,
        Axis.DATA,
        None,
        "increase-dataloader-workers",
    ),
    (
        "CPU-only compute on the main process",
        {"gpu_count": 0, "data_wait_ratio": 0.01, "main_cpu_cores": 1.9},
        Regime.COMPUTE_BOUND,
        Axis.MACHINE,
        Axis.ALGORITHM,
        "move-to-accelerator",
    ),
    (
        "CPU-only batch 1 with one saturated Python thread: overhead",
        {"gpu_count": 0, "data_wait_ratio": 0.01, "main_cpu_cores": 1.0, "batch_size": 1},
        Regime.LATENCY_BOUND,
        Axis.ALGORITHM,
        Axis.MACHINE,
        "increase-batch-size",
    ),
    (
        "CPU-only batch 1 with multi-threaded compute",
        {"gpu_count": 0, "data_wait_ratio": 0.01, "main_cpu_cores": 3.5, "batch_size": 1},
        Regime.COMPUTE_BOUND,
        Axis.MACHINE,
        Axis.ALGORITHM,
        "move-to-accelerator",
    ),
    (
        "CPU-only, throttled: compute-bound on the CPU quota",
        {"gpu_count": 0, "data_wait_ratio": 0.01, "main_cpu_cores": 0.6, "cpu_throttled_ratio": 0.4},
        Regime.COMPUTE_BOUND,
        Axis.MACHINE,
        None,
        "raise-cpu-limit",
    ),
    (
        "too few steps",
        {"steps": 1.0, "gpu_count": 1, "gpu_utilization": 0.2, "data_wait_ratio": 0.6},
        Regime.UNKNOWN,
        Axis.UNKNOWN,
        None,
        "collect-more-evidence",
    ),
    (
        "no signals at all",
        {},
        Regime.UNKNOWN,
        Axis.UNKNOWN,
        None,
        "collect-more-evidence",
    ),
    (
        "GPU idle but data wait unmeasured and nothing else",
        {"gpu_count": 1, "gpu_utilization": 0.3},
        Regime.UNKNOWN,
        Axis.UNKNOWN,
        None,
        "collect-more-evidence",
    ),
]


@pytest.mark.parametrize(
    ("fields", "regime", "axis", "boundary", "lever"),
    [pytest.param(f, r, a, b, lv, id=i) for i, f, r, a, b, lv in CASES],
)
def test_decision_table_gives_the_regime_axis_boundary_and_lever(
    fields: dict[str, Any], regime: Regime, axis: Axis, boundary: Axis | None, lever: str | None
) -> None:
    b = run(**fields).bottleneck
    assert (b.regime, b.axis, b.boundary) == (regime, axis, boundary), b.evidence
    if lever is not None:
        assert b.lever == lever
    else:
        assert b.lever in regimes.SPECS[regime].working
    assert b.lever not in b.avoid
    assert b.lever in levers.LEVERS
    assert b.lever_detail.startswith(levers.sentence(b.lever))
    assert all(a in levers.LEVERS for a in b.avoid)


def test_unknown_verdict_names_what_is_missing_and_has_no_confidence() -> None:
    b = run(gpu_count=1, gpu_utilization=0.3).bottleneck
    assert b.regime is Regime.UNKNOWN
    assert b.confidence == 0.0
    assert any("dataWaitRatio" in m for m in b.missing)


def test_too_few_steps_is_named_in_missing() -> None:
    b = run(steps=2.0, gpu_count=1, gpu_utilization=0.2, data_wait_ratio=0.6).bottleneck
    assert b.regime is Regime.UNKNOWN
    assert any(m.startswith("steps") for m in b.missing)


def test_evidence_quotes_the_numbers_and_thresholds() -> None:
    b = run(gpu_count=1, gpu_utilization=0.25, data_wait_ratio=0.62).bottleneck
    assert "data wait 62.0% of step time (screen > 10%)" in b.evidence
    assert any("GPU utilization 25.0%" in e for e in b.evidence)


def test_cpu_only_input_bound_is_less_confident_than_with_idle_gpu_corroborating() -> None:
    with_gpu = run(gpu_count=1, gpu_utilization=0.2, data_wait_ratio=0.5).bottleneck
    cpu_only = run(gpu_count=0, data_wait_ratio=0.5).bottleneck
    assert cpu_only.regime is with_gpu.regime is Regime.INPUT_BOUND
    assert cpu_only.confidence < with_gpu.confidence


def test_missing_corroborating_signals_lower_confidence() -> None:
    full = run(
        gpu_count=1,
        gpu_utilization=0.99,
        sm_active=0.9,
        tensor_active=0.6,
        dram_bandwidth_utilization=0.3,
        data_wait_ratio=0.0,
    ).bottleneck
    bare = run(gpu_count=1, gpu_utilization=0.99, data_wait_ratio=0.0).bottleneck
    assert full.regime is bare.regime is Regime.COMPUTE_BOUND
    assert bare.confidence < full.confidence
    assert any("smActive" in m for m in bare.missing)
    assert not full.missing


def test_threshold_override_changes_the_verdict() -> None:
    obs = Observation(**BASE, gpu_count=1, gpu_utilization=0.5, data_wait_ratio=0.15, main_cpu_cores=0.95)
    assert diagnose(obs).bottleneck.regime is Regime.INPUT_BOUND
    relaxed = Thresholds(data_wait_suspect=0.2)
    assert diagnose(obs, relaxed).bottleneck.regime is Regime.LATENCY_BOUND


def test_threshold_override_of_busy_line_changes_memory_verdict() -> None:
    obs = Observation(
        **BASE, gpu_count=1, gpu_utilization=0.97, sm_active=0.9, dram_bandwidth_utilization=0.75
    )
    assert diagnose(obs).bottleneck.regime is Regime.MEMORY_BOUND
    assert diagnose(obs, Thresholds(dram_bandwidth_saturated=0.9)).bottleneck.regime is Regime.COMPUTE_BOUND


def test_mfu_uses_peak_flops_per_gpu() -> None:
    hw = Hardware(peak_flops=100e12, memory_bandwidth_bytes_per_second=1e12)
    obs = Observation(**BASE, gpu_count=4, gpu_utilization=0.99, flops_per_step=40e12, steps_per_second=5.0)
    m = diagnose(obs, hardware=hw).metrics
    assert m.mfu == pytest.approx(40e12 * 5.0 / (4 * 100e12))
    assert m.ridge_point == pytest.approx(100.0)


def test_iron_law_splits_step_time_into_data_compute_and_latency() -> None:
    iron = run(gpu_count=1, gpu_utilization=0.3, data_wait_ratio=0.5, mean_step_seconds=0.2).metrics.iron_law
    assert iron is not None
    assert iron.step_seconds == pytest.approx(0.2)
    assert iron.data_seconds == pytest.approx(0.1)
    assert iron.compute_seconds == pytest.approx(0.06)
    assert iron.latency_seconds == pytest.approx(0.04)


def test_hardware_comes_from_gpu_model_when_not_given() -> None:
    m = run(gpu_count=1, gpu_model="NVIDIA H100 80GB HBM3", gpu_utilization=0.5, data_wait_ratio=0.5).metrics
    hw = lookup("H100 SXM")
    assert hw is not None and hw.peak_flops and hw.memory_bandwidth_bytes_per_second
    assert m.ridge_point == pytest.approx(hw.peak_flops / hw.memory_bandwidth_bytes_per_second)


def test_batch_size_one_is_flagged_in_evidence() -> None:
    b = run(gpu_count=1, gpu_utilization=0.99, sm_active=0.9, batch_size=1, data_wait_ratio=0.0).bottleneck
    assert any(e.startswith("batch size 1") for e in b.evidence)


def test_status_shape_uses_camel_case_wire_names() -> None:
    status = run(gpu_count=1, gpu_utilization=0.25, data_wait_ratio=0.62).to_status()
    assert set(status) == {"bottleneck", "metrics"}
    assert {"axis", "regime", "lever", "leverDetail", "confidence", "evidence", "avoid"} <= set(
        status["bottleneck"]
    )
    assert status["metrics"]["dataWaitRatio"] == pytest.approx(0.62)


def _cpu_only_low_wait(**extra: Any) -> Observation:
    return Observation(
        steps=200,
        steps_per_second=10.0,
        data_wait_ratio=0.02,
        mean_step_seconds=0.1,
        gpu_count=0,
        main_cpu_cores=0.5,
        worker_cpu_cores=0.0,
        **extra,
    )


def test_cpu_only_job_on_a_saturated_node_is_compute_bound_on_the_host_cpu() -> None:
    verdict = diagnose(_cpu_only_low_wait(node_cpu_utilization=0.97))
    assert verdict.bottleneck.regime is Regime.COMPUTE_BOUND
    assert verdict.bottleneck.axis is Axis.MACHINE
    assert any("node CPU 97% busy" in e for e in verdict.bottleneck.evidence)


def test_a_busy_node_is_not_the_cause_when_the_process_hardly_waits_for_a_cpu() -> None:
    """Issue 20 (acceptance): a job that sleeps in its loop on a node others keep busy flapped
    between Unknown and compute-bound/move-to-accelerator with the node's load; the measured
    run-queue delay says the node does not hold it back."""
    verdict = diagnose(_cpu_only_low_wait(node_cpu_utilization=0.97, cpu_wait_ratio=0.01))
    assert verdict.bottleneck.regime is Regime.UNKNOWN
    assert verdict.bottleneck.lever == "collect-more-evidence"
    assert not any("competes for cores" in e for e in verdict.bottleneck.evidence)
    assert any("waited for a CPU only 1.0%" in e for e in verdict.bottleneck.evidence)


def test_cpu_only_job_with_idle_node_and_unsaturated_process_stays_unknown() -> None:
    verdict = diagnose(_cpu_only_low_wait(node_cpu_utilization=0.40))
    assert verdict.bottleneck.regime is Regime.UNKNOWN


def test_latency_evidence_does_not_claim_an_idle_python_thread_when_cpu_is_unmeasured() -> None:
    verdict = diagnose(
        Observation(steps=600, steps_per_second=10.0, data_wait_ratio=0.01, gpu_count=1, gpu_utilization=0.3)
    )
    assert verdict.bottleneck.regime is Regime.LATENCY_BOUND
    assert not any("Python thread is busy" in e for e in verdict.bottleneck.evidence)
    assert any("not measured" in e for e in verdict.bottleneck.evidence)


def test_the_sample_size_is_the_only_thing_the_evidence_identity_leaves_out() -> None:
    def identities(v: Verdict) -> list[tuple[str, str]]:
        return [r.identity for r in v.bottleneck.records()]

    short_v = run(data_wait_ratio=0.6, steps=300.0, window_seconds=60.0)
    long_v = run(data_wait_ratio=0.6, steps=330.0, window_seconds=66.0)
    short, long = short_v.bottleneck.evidence, long_v.bottleneck.evidence
    assert "5.00 steps/s (300 steps in 60 s)" in short
    assert short != long
    assert identities(short_v) == identities(long_v)
    assert "5.00 steps/s" in [steady for _, steady in identities(short_v)]
    faster = run(data_wait_ratio=0.6, steps=360.0, window_seconds=60.0)
    assert identities(faster) != identities(short_v)
