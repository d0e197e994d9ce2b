"""MFU is per accelerator whatever the layout of Pods, ranks and GPUs (DESIGN.md §3).

Every job here does the same work per GPU: each rank steps 2 times a second and counts 1 TFLOP a
step on its own GPU (peak 100 TFLOP/s), so every layout's MFU is 1e12 x 2 / 1e14 = 0.02. The
scrapes are the real sidecar's: probe files as dam_probe writes them, read by the sidecar's probe
reader beside its NVML sampler (simulated GPUs), rendered as Prometheus text and parsed back.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dam_contract.snapshot import Snapshot, parse_snapshot
from dam_operator.diagnosis.engine import diagnose
from dam_operator.diagnosis.model import Hardware, Verdict
from dam_operator.diagnosis.window import PodWindow, job_window
from dam_probe.layout import (
    FLOPS_DECLARED,
    FLOPS_MEASURED,
    FLOPS_REASON_COUNTER_ERROR,
    FLOPS_UNAVAILABLE,
    ProbeRecord,
    encode,
    probe_path,
)
from dam_sidecar.attribution import Attributor
from dam_sidecar.collector import SidecarCollector, standard_collectors
from dam_sidecar.errors import ErrorLog
from dam_sidecar.fake_nvml import FakeGpu, FakeNvml
from dam_sidecar.samplers.cpu import CpuSampler
from dam_sidecar.samplers.nvml import NoNvml, NvmlSampler
from dam_sidecar.samplers.probe import ProbeReader

PEAK = 1e14
FLOPS = 1e12  # one rank's step on one GPU
RATE = 2.0  # steps per second of every rank
WINDOW_S = 10.0
EXPECTED = FLOPS * RATE / PEAK  # 0.02: the analytic MFU of every layout


@dataclass(frozen=True)
class Process:
    """One training process of a Pod: its rank (None: no distributed rank), its GPUs, its FLOPs
    per step, declared by the job or counted by the probe."""

    rank: int | None
    gpus: tuple[int, ...]
    flops: float = FLOPS
    declared: bool = False
    failed: str = ""
    """Not counted: the probe's counter raised in this op (FLOPS_REASON_COUNTER_ERROR)."""


@pytest.fixture
def pids() -> Iterator[list[int]]:
    """Real live processes whose pids the probe files carry (the reader checks /proc/PID)."""
    procs = [subprocess.Popen(["sleep", "120"]) for _ in range(8)]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _record(pid: int, p: Process, steps: int, world: int | None) -> ProbeRecord:
    if p.failed:
        return ProbeRecord(
            pid=pid,
            start_time_ns=1_000 + pid,
            steps=steps,
            wait_ns=0,
            step_ns=round(steps / RATE * 1e9),
            last_update_ns=time.time_ns(),
            batch_size=32,
            flops_per_step=0.0,
            closed=False,
            rank=p.rank,
            process_start_ns=1,
            startup_ns=10**9,
            productive_ns=round(steps / RATE * 1e9),
            other_ns=0,
            flops_state=FLOPS_UNAVAILABLE,
            flops_reason=FLOPS_REASON_COUNTER_ERROR,
            flops_detail=p.failed,
        )
    counted = (p.flops, 10**7, 1)  # what the probe's FlopCounterMode step published
    measured = dict(
        zip(("measured_flops_per_step", "flops_measured_ns", "flops_measured_steps"), counted, strict=True)
    )
    return ProbeRecord(
        pid=pid,
        start_time_ns=1_000 + pid,
        steps=steps,
        wait_ns=0,
        step_ns=round(steps / RATE * 1e9),
        last_update_ns=time.time_ns(),
        batch_size=32,
        flops_per_step=p.flops if p.declared else 0.0,
        closed=False,
        device_uuids=tuple(f"GPU-{g}" for g in p.gpus),
        rank=p.rank,
        local_rank=None if p.rank is None else p.gpus[0] if p.gpus else 0,
        world_size=world,
        process_start_ns=1,
        startup_ns=10**9,
        productive_ns=round(steps / RATE * 1e9),
        other_ns=0,
        flops_state=FLOPS_DECLARED if p.declared else FLOPS_MEASURED,
        **({} if p.declared else measured),  # type: ignore[arg-type]
    )


def _pod_window(tmp: Path, pids: list[int], procs: list[Process], world: int | None) -> PodWindow:
    """Two scrapes of one Pod's sidecar, WINDOW_S apart: every process stepped RATE a second."""
    tmp.mkdir(parents=True)
    errors = ErrorLog()
    gpus = sorted({g for p in procs for g in p.gpus})
    fake = FakeNvml([FakeGpu(uuid=f"GPU-{g}", utilization=90) for g in gpus]) if gpus else None
    collector = SidecarCollector(
        standard_collectors(
            probe=ProbeReader(str(tmp), errors),
            nvml=NoNvml() if fake is None else NvmlSampler(errors, load=lambda: fake),
            cpu=CpuSampler(errors),
            errors=errors,
            attributor=Attributor("visible_devices", None),
        ),
        errors=errors,
    )

    def scrape(steps: int) -> Snapshot:
        for pid, p in zip(pids, procs, strict=False):
            with open(probe_path(str(tmp), pid), "wb") as fh:
                fh.write(encode(_record(pid, p, steps, world)))
        collector.sample_now()
        return parse_snapshot(collector.text().decode())

    try:
        before, after = scrape(100), scrape(100 + round(RATE * WINDOW_S))
    finally:
        collector.close()
    return PodWindow(before, after, elapsed_seconds=WINDOW_S)


def _verdict(tmp_path: Path, pids: list[int], pods: list[list[Process]], **known: float) -> Verdict:
    world = sum(1 for pod in pods for p in pod if p.rank is not None) or None
    windows, used = {}, 0
    for i, procs in enumerate(pods):
        windows[f"pod-{i}"] = _pod_window(tmp_path / f"pod-{i}", pids[used:], procs, world)
        used += len(procs)
    jw = job_window(windows, **known)  # type: ignore[arg-type]
    return diagnose(jw.job, hardware=Hardware(peak_flops=PEAK), ranks=jw.ranks)


def _mfu(tmp_path: Path, pids: list[int], pods: list[list[Process]], **known: float) -> float | None:
    return _verdict(tmp_path, pids, pods, **known).metrics.mfu


def test_one_pod_of_one_rank_on_one_gpu_is_the_analytic_mfu(tmp_path: Path, pids: list[int]) -> None:
    assert _mfu(tmp_path, pids, [[Process(None, (0,))]]) == pytest.approx(EXPECTED)


def test_eight_pods_of_one_gpu_give_the_mfu_of_one_pod_of_eight_ranks(
    tmp_path: Path, pids: list[int]
) -> None:
    one_pod = _mfu(tmp_path / "one", pids, [[Process(r, (r,)) for r in range(8)]])
    eight_pods = _mfu(tmp_path / "eight", pids, [[Process(r, (0,))] for r in range(8)])
    assert one_pod == pytest.approx(EXPECTED)
    assert eight_pods == pytest.approx(EXPECTED)


def test_two_pods_of_four_ranks_give_the_same_mfu(tmp_path: Path, pids: list[int]) -> None:
    pods = [[Process(4 * i + r, (r,)) for r in range(4)] for i in range(2)]
    assert _mfu(tmp_path, pids, pods) == pytest.approx(EXPECTED)


def test_independent_pods_without_ranks_add_their_work_and_their_gpus(
    tmp_path: Path, pids: list[int]
) -> None:
    assert _mfu(tmp_path, pids, [[Process(None, (0,))] for _ in range(4)]) == pytest.approx(EXPECTED)


def test_one_process_driving_two_gpus_is_divided_by_both(tmp_path: Path, pids: list[int]) -> None:
    """Its step is both GPUs' work (the counter sees every op of the process)."""
    assert _mfu(tmp_path, pids, [[Process(None, (0, 1), flops=2 * FLOPS)]]) == pytest.approx(EXPECTED)


def test_pipeline_stages_of_unequal_work_give_the_job_s_work_per_gpu(tmp_path: Path, pids: list[int]) -> None:
    """Two ranks, one per Pod, 1.5 and 0.5 TFLOP a step: the job does 2 TFLOP a step on 2 GPUs."""
    pods = [[Process(0, (0,), flops=1.5 * FLOPS)], [Process(1, (0,), flops=0.5 * FLOPS)]]
    assert _mfu(tmp_path, pids, pods) == pytest.approx(EXPECTED)


def test_declared_flops_per_step_are_each_process_s_and_give_the_same_mfu(
    tmp_path: Path, pids: list[int]
) -> None:
    by_probe = _mfu(tmp_path / "probe", pids, [[Process(r, (0,), declared=True)] for r in range(4)])
    by_spec = _mfu(tmp_path / "spec", pids, [[Process(r, (r,)) for r in range(4)]], flops_per_step=FLOPS)
    assert by_probe == pytest.approx(EXPECTED)
    assert by_spec == pytest.approx(EXPECTED)


def test_a_cpu_only_job_of_two_ranks_is_per_rank_against_the_declared_peak(
    tmp_path: Path, pids: list[int]
) -> None:
    one_pod = _mfu(tmp_path / "one", pids, [[Process(0, ()), Process(1, ())]])
    two_pods = _mfu(tmp_path / "two", pids, [[Process(0, ())], [Process(1, ())]])
    assert one_pod == pytest.approx(EXPECTED)
    assert two_pods == pytest.approx(EXPECTED)


def test_a_job_whose_counter_failed_says_why_in_the_status_and_the_evidence(
    tmp_path: Path, pids: list[int]
) -> None:
    failed = "dam_test.scaled.default: ValueError"
    verdict = _verdict(tmp_path, pids, [[Process(r, (r,), failed=failed) for r in range(2)]])
    status = verdict.to_status()
    assert verdict.metrics.mfu is None and "flopsPerStep" not in status["metrics"]
    expected = f"the FLOP counter raised ({failed}); the op ran uncounted and counting stopped"
    assert status["metrics"]["flopsUnavailable"].startswith(expected), status["metrics"]
    assert any(e.startswith(f"FLOPs unavailable: {expected}") for e in status["bottleneck"]["evidence"])
