"""From two snapshots to an observation; many pods to one; stragglers."""

from __future__ import annotations

import math

import pytest

from dam_contract import names
from dam_contract.snapshot import parse_snapshot
from dam_operator.diagnosis.model import Observation
from dam_operator.diagnosis.window import (
    aggregate,
    baseline,
    find_straggler,
    observation_from_snapshots,
    rank_observations,
)
from tests.unit.diagnosis.snapshots import Job, Rank, exposition, snapshot_pair


def window(job: Job, **kwargs: object) -> Observation:
    before, after = snapshot_pair(job)
    return observation_from_snapshots(
        parse_snapshot(before, "before.prom"),
        parse_snapshot(after, "after.prom"),
        **kwargs,  # type: ignore[arg-type]
    )


def test_counters_become_rates_over_the_window() -> None:
    obs = window(
        Job(
            seconds=50.0,
            steps=200.0,
            wait_ratio=0.3,
            main_cpu_cores=0.9,
            worker_cpu_cores=3.0,
            throttled_ratio=0.2,
            cpu_limit_cores=4.0,
        )
    )
    assert obs.window_seconds == pytest.approx(50.0)
    assert obs.steps == pytest.approx(200.0)
    assert obs.steps_per_second == pytest.approx(4.0)
    assert obs.mean_step_seconds == pytest.approx(0.25)
    assert obs.data_wait_ratio == pytest.approx(0.3)
    assert obs.main_cpu_cores == pytest.approx(0.9)
    assert obs.worker_cpu_cores == pytest.approx(3.0)
    assert obs.cpu_throttled_ratio == pytest.approx(0.2)
    assert obs.cpu_limit_cores == pytest.approx(4.0)


def test_gpu_gauges_come_from_after_and_are_averaged_across_gpus() -> None:
    obs = window(Job(wait_ratio=0.0, gpus=[{"util": 0.9, "sm": 0.8}, {"util": 0.5, "sm": 0.4}]))
    assert obs.gpu_count == 2
    assert obs.gpu_utilization == pytest.approx(0.7)
    assert obs.sm_active == pytest.approx(0.6)
    assert obs.dram_bandwidth_utilization is None


def test_gpus_of_other_tenants_are_filtered_by_uuid() -> None:
    job = Job(wait_ratio=0.0, gpus=[{"util": 0.9}, {"util": 0.1}], gpu_uuids=["GPU-a", "GPU-b"])
    obs = window(job, gpu_uuids={"GPU-a"})
    assert obs.gpu_count == 1
    assert obs.gpu_utilization == pytest.approx(0.9)


def test_workload_gauges_and_gpu_model_are_read() -> None:
    obs = window(
        Job(wait_ratio=0.1, gpus=[{"util": 0.5}], batch_size=32, flops_per_step=1e12, gpu_model="NVIDIA H200")
    )
    assert obs.batch_size == 32
    assert obs.flops_per_step == pytest.approx(1e12)
    assert obs.gpu_model == "NVIDIA H200"


def test_explicit_arguments_win_over_gauges() -> None:
    job = Job(wait_ratio=0.1, batch_size=32, gpu_model="NVIDIA H200", seconds=60.0)
    obs = window(job, batch_size=8, gpu_model="L4", elapsed_seconds=30.0)
    assert (obs.batch_size, obs.gpu_model, obs.window_seconds) == (8, "L4", 30.0)


def test_counter_reset_uses_the_after_value_like_prometheus() -> None:
    before = exposition([(names.STEPS_TOTAL, {}, 5000.0), (names.STEP_SECONDS_TOTAL, {}, 900.0)])
    after = exposition([(names.STEPS_TOTAL, {}, 40.0), (names.STEP_SECONDS_TOTAL, {}, 10.0)])
    obs = observation_from_snapshots(parse_snapshot(before), parse_snapshot(after), elapsed_seconds=10.0)
    assert obs.steps == pytest.approx(40.0)
    assert obs.mean_step_seconds == pytest.approx(0.25)


def test_elapsed_falls_back_to_step_seconds_without_timestamps() -> None:
    obs = window(Job(seconds=42.0, wait_ratio=0.2, timestamps=False))
    assert obs.window_seconds == pytest.approx(42.0)


def test_nvml_up_without_gpus_means_a_cpu_only_job() -> None:
    assert window(Job(wait_ratio=0.2, nvml_up=True)).gpu_count == 0
    assert window(Job(wait_ratio=0.2, nvml_up=True, attribution="probe")).gpu_count == 0
    assert window(Job(wait_ratio=0.2, nvml_up=False)).gpu_count is None


def test_unattributed_gpus_are_unknown_not_absent() -> None:
    assert window(Job(wait_ratio=0.2, nvml_up=True, attribution="none")).gpu_count is None


@pytest.mark.parametrize("label", ["model", "name"])
def test_gpu_model_is_read_from_either_info_label(label: str) -> None:
    obs = window(Job(wait_ratio=0.2, gpus=[{"util": 0.5}], gpu_model="NVIDIA L4", gpu_info_label=label))
    assert obs.gpu_model == "NVIDIA L4"


@pytest.mark.parametrize("bad", [math.nan, -3.0, math.inf, 7.0])
def test_garbage_gauge_values_are_dropped_not_raised(bad: float) -> None:
    text = exposition([(names.GPU_UTILIZATION_RATIO, {"gpu": "0"}, bad), (names.BATCH_SIZE, {}, bad)])
    obs = observation_from_snapshots(parse_snapshot(""), parse_snapshot(text))
    assert obs.gpu_utilization is None
    assert obs.batch_size is None or obs.batch_size == 7


def test_garbage_counters_are_dropped_not_raised() -> None:
    before = exposition([(names.STEPS_TOTAL, {}, 10.0), (names.DATALOADER_WAIT_SECONDS_TOTAL, {}, 1.0)])
    after = exposition(
        [
            (names.STEPS_TOTAL, {}, math.nan),
            (names.DATALOADER_WAIT_SECONDS_TOTAL, {}, 50.0),
            (names.STEP_SECONDS_TOTAL, {}, 10.0),
        ]
    )
    obs = observation_from_snapshots(parse_snapshot(before), parse_snapshot(after), elapsed_seconds=10.0)
    assert obs.steps is None
    assert obs.data_wait_ratio is None  # 49 s of wait in 10 s of steps is garbage


def test_empty_snapshots_give_an_empty_observation() -> None:
    assert observation_from_snapshots(parse_snapshot(""), parse_snapshot("")) == Observation()


def test_aggregate_sums_rates_and_weights_ratios() -> None:
    a = Observation(
        steps=100,
        mean_step_seconds=0.5,
        steps_per_second=2,
        data_wait_ratio=0.5,
        gpu_count=1,
        gpu_utilization=0.2,
        main_cpu_cores=1.0,
        batch_size=32,
        gpu_model="H100 SXM",
    )
    b = Observation(
        steps=300,
        mean_step_seconds=0.5,
        steps_per_second=6,
        data_wait_ratio=0.1,
        gpu_count=3,
        gpu_utilization=0.6,
        main_cpu_cores=2.0,
        batch_size=32,
        gpu_model="H100 SXM",
    )
    agg = aggregate({"a": a, "b": b})
    assert agg.steps == pytest.approx(400)
    assert agg.steps_per_second == pytest.approx(8)
    assert agg.main_cpu_cores == pytest.approx(3.0)
    assert agg.gpu_count == 4
    # by step time: 50 s at 50 %, 150 s at 10 %
    assert agg.data_wait_ratio == pytest.approx((50 * 0.5 + 150 * 0.1) / 200)
    # by GPU count: 1 GPU at 20 %, 3 at 60 %
    assert agg.gpu_utilization == pytest.approx((0.2 + 3 * 0.6) / 4)
    assert agg.batch_size == 32 and agg.gpu_model == "H100 SXM"


def test_aggregate_drops_disagreeing_batch_size_and_model() -> None:
    agg = aggregate(
        {"a": Observation(batch_size=8, gpu_model="L4"), "b": Observation(batch_size=16, gpu_model="T4")}
    )
    assert agg.batch_size is None and agg.gpu_model is None


def test_slow_pod_is_the_straggler() -> None:
    pods = {f"p{i}": Observation(steps_per_second=4.0, data_wait_ratio=0.02) for i in range(3)}
    pods["p3"] = Observation(steps_per_second=1.0, data_wait_ratio=0.02)
    found = find_straggler(pods)
    assert found is not None
    assert found[0] == "p3"
    assert "1.00 steps/s" in found[1] and "4.00" in found[1]


def test_pod_that_waits_for_data_is_the_straggler() -> None:
    pods = {f"p{i}": Observation(steps_per_second=4.0, data_wait_ratio=0.02) for i in range(3)}
    pods["p1"] = Observation(steps_per_second=4.0, data_wait_ratio=0.45)
    found = find_straggler(pods)
    assert found is not None and found[0] == "p1"
    assert "45.0%" in found[1]


def test_even_pods_have_no_straggler() -> None:
    pods = {f"p{i}": Observation(steps_per_second=4.0 + 0.1 * i, data_wait_ratio=0.02) for i in range(4)}
    assert find_straggler(pods) is None
    assert find_straggler({"only": Observation(steps_per_second=1.0)}) is None


def test_loader_worker_count_comes_from_the_process_gauge() -> None:
    before = parse_snapshot(f"{names.STEPS_TOTAL} 0\n")
    after = parse_snapshot(
        f'{names.STEPS_TOTAL} 100\n{names.PROCESSES}{{role="main"}} 1\n{names.PROCESSES}{{role="worker"}} 6\n'
    )
    obs = observation_from_snapshots(before, after, elapsed_seconds=10.0)
    assert obs.worker_count == 6


def test_garbage_worker_count_is_dropped() -> None:
    before = parse_snapshot(f"{names.STEPS_TOTAL} 0\n")
    after = parse_snapshot(f"{names.STEPS_TOTAL} 100\n" + f'{names.PROCESSES}{{role="worker"}} NaN\n')
    assert observation_from_snapshots(before, after, elapsed_seconds=10.0).worker_count is None


def test_a_process_without_collectives_has_no_communication_figures() -> None:
    """A single-process job exports the collective counters at 0: no "exposed 0 %" evidence."""
    from dam_contract import names
    from dam_contract.snapshot import parse_snapshot
    from dam_operator.diagnosis.window import observation_from_snapshots

    def snap(steps: float, step_s: float) -> str:
        return (
            f"{names.STEPS_TOTAL} {steps}\n{names.STEP_SECONDS_TOTAL} {step_s}\n"
            f"{names.DATALOADER_WAIT_SECONDS_TOTAL} 0.1\n"
            f"{names.COLLECTIVE_SECONDS_TOTAL} 0\n{names.COLLECTIVE_EXPOSED_SECONDS_TOTAL} 0\n"
            f"{names.COLLECTIVES_TOTAL} 0\n"
        )

    obs = observation_from_snapshots(
        parse_snapshot(snap(10, 1.0)), parse_snapshot(snap(110, 11.0)), elapsed_seconds=10.0
    )
    assert obs.steps == 100
    assert obs.collective_ratio is None and obs.exposed_communication_ratio is None


RICH_JOBS = {
    "one process, GPUs, CPU, memory": Job(
        wait_ratio=0.3,
        gpus=[{"util": 0.5, "sm": 0.4, "dram": 0.2, "mem_used": 1e9, "mem_total": 8e10}] * 2,
        gpu_uuids=["GPU-a", "GPU-b"],
        main_cpu_cores=1.5,
        worker_cpu_cores=3.0,
        throttled_ratio=0.2,
        cpu_limit_cores=4.0,
        batch_size=32,
        nvml_up=True,
        attribution="probe",
        container_memory_bytes=3e9,
        container_memory_limit_bytes=4e9,
        oom_kills=1,
        nvlink_bytes_per_second=1e9,
    ),
    "ranks with collectives": Job(
        ranks=[
            Rank(0, wait_ratio=0.01, collective_ratio=0.45, exposed_ratio=0.42, collectives_per_step=4),
            Rank(1, wait_ratio=0.40, collective_ratio=0.05, exposed_ratio=0.02, collectives_per_step=4),
        ],
        nvml_up=True,
        attribution="probe",
        main_cpu_cores=2.0,
    ),
}


@pytest.mark.parametrize("job", RICH_JOBS.values(), ids=RICH_JOBS.keys())
def test_the_kept_baseline_gives_the_same_window_as_the_whole_scrape(job: Job) -> None:
    before_text, after_text = snapshot_pair(job)
    before, after = parse_snapshot(before_text), parse_snapshot(after_text)
    kept = baseline(before)
    assert len(kept) < len(before), "gauges are not kept"
    assert kept.timestamp_seconds == before.timestamp_seconds
    for uuids in (None, set(job.gpu_uuids or [])):
        whole = rank_observations(before, after, pod="p", gpu_uuids=uuids)
        assert rank_observations(kept, after, pod="p", gpu_uuids=uuids) == whole
        assert observation_from_snapshots(kept, after, gpu_uuids=uuids) == observation_from_snapshots(
            before, after, gpu_uuids=uuids
        )


def test_kept_baselines_read_like_the_scrape_and_pods_of_one_job_share_their_layout() -> None:
    job = RICH_JOBS[next(iter(RICH_JOBS))]
    first, second = (parse_snapshot(text) for text in snapshot_pair(job))
    a, b = baseline(first), baseline(second)
    counters = {name for name in first.names() if name.endswith("_total")}
    assert counters and counters <= a.names()
    for name in counters:
        assert a.series(name) == first.series(name)
        assert a.samples(name) == first.samples(name)
    assert a.series("no_such_total") == {} and a.samples("no_such_total") == []
    assert a._layout is b._layout  # two scrapes of one exposition layout: one shared tuple
