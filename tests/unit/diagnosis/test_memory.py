"""Memory capacity: OOM kills, a full GPU, a full container; which memory lever."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from dam_contract.snapshot import parse_snapshot
from dam_operator.diagnosis.engine import diagnose
from dam_operator.diagnosis.model import Axis, Observation, Regime, Thresholds, Verdict
from dam_operator.diagnosis.window import PodWindow, aggregate, job_window, observation_from_snapshots
from tests.unit.diagnosis.snapshots import Job, Rank, snapshot_pair

GIB = float(1 << 30)
# An input-bound window: with no memory trouble the engine says input-bound.
STARVED: dict[str, Any] = {"wait_ratio": 0.5, "gpus": [{"util": 0.2}]}


def window(job: Job, **kwargs: Any) -> Observation:
    before, after = snapshot_pair(job)
    return observation_from_snapshots(parse_snapshot(before), parse_snapshot(after), **kwargs)


def verdict(job: Job, thresholds: Thresholds | None = None, **kwargs: Any) -> Verdict:
    return diagnose(window(job, **kwargs), thresholds)


def test_memory_series_become_observation_fields() -> None:
    obs = window(
        Job(
            wait_ratio=0.1,
            gpus=[
                {"util": 0.9, "mem_used": 70 * GIB, "mem_total": 80 * GIB},
                {"util": 0.9, "mem_used": 78 * GIB, "mem_total": 80 * GIB},
            ],
            container_memory_bytes=6 * GIB,
            container_memory_limit_bytes=8 * GIB,
            oom_kills=2,
            main_rss_bytes=1.5 * GIB,
            worker_rss_bytes=4 * GIB,
            nvlink_bytes_per_second=50e9,
        ),
        oom_killed=True,
    )
    assert obs.gpu_memory_used_ratio == pytest.approx(78 / 80)  # the fullest GPU
    assert obs.container_memory_ratio == pytest.approx(0.75)
    assert obs.container_memory_limit_bytes == pytest.approx(8 * GIB)
    assert obs.oom_kills == pytest.approx(2)
    assert obs.oom_killed is True
    assert obs.main_rss_bytes == pytest.approx(1.5 * GIB)
    assert obs.worker_rss_bytes == pytest.approx(4 * GIB)
    assert obs.nvlink_bytes_per_second == pytest.approx(2 * 50e9)


def test_an_unlimited_container_has_no_memory_ratio() -> None:
    obs = window(Job(wait_ratio=0.1, container_memory_bytes=6 * GIB, container_memory_limit_bytes=2.0**63))
    assert obs.container_memory_ratio is None and obs.container_memory_limit_bytes is None


def test_oom_kills_with_loader_workers_holding_the_memory_reduce_loader_memory() -> None:
    job = Job(
        **STARVED,
        oom_kills=1,
        container_memory_bytes=7.9 * GIB,
        container_memory_limit_bytes=8 * GIB,
        main_rss_bytes=1.2 * GIB,
        worker_rss_bytes=6.5 * GIB,
    )
    b = verdict(job).bottleneck
    assert (b.regime, b.axis, b.boundary) == (Regime.MEMORY_CAPACITY, Axis.ALGORITHM, Axis.MACHINE)
    assert b.lever == "reduce-loader-memory"
    assert "raise-memory-limit" in b.lever_detail
    assert "more-loader-workers" in b.avoid
    assert any("1 OOM kill in the container's cgroup" in e for e in b.evidence)
    assert any("loader workers 6.50 GiB" in e and "main process 1.20 GiB" in e for e in b.evidence)
    # A job that is being killed is not judged input-bound; the rest is still said.
    assert any("apart from memory the window reads as input-bound" in e for e in b.evidence)
    assert b.confidence >= 0.85


def test_a_loader_worker_killed_names_the_loader_even_when_the_sample_missed_its_memory() -> None:
    # The 1 Hz sample saw the main process holding the memory (the worker grew and died between
    # samples); DataLoader's own error, counted by the probe, says for certain which process died.
    job = Job(
        **STARVED, oom_kills=1, main_rss_bytes=7 * GIB, worker_rss_bytes=0.2 * GIB, loader_worker_kills=1
    )
    assert window(job).loader_worker_kills == pytest.approx(1)
    b = verdict(job).bottleneck
    assert (b.regime, b.lever) == (Regime.MEMORY_CAPACITY, "reduce-loader-memory")
    assert any("1 DataLoader worker killed in the window" in e for e in b.evidence)
    assert b.confidence >= 0.9
    # Without the probe's count the same window blames the main process.
    no_count = verdict(Job(**STARVED, oom_kills=1, main_rss_bytes=7 * GIB, worker_rss_bytes=0.2 * GIB))
    assert no_count.bottleneck.lever == "raise-memory-limit"


def test_a_loader_worker_killed_alone_is_memory_capacity() -> None:
    b = verdict(Job(**STARVED, loader_worker_kills=2)).bottleneck
    assert (b.regime, b.lever) == (Regime.MEMORY_CAPACITY, "reduce-loader-memory")
    assert any("2 DataLoader workers killed" in e for e in b.evidence)


def test_aggregate_sums_loader_worker_kills_over_pods() -> None:
    a = window(Job(**STARVED, loader_worker_kills=1))
    b = window(Job(**STARVED, loader_worker_kills=0))
    assert aggregate({"p0": a, "p1": b}).loader_worker_kills == pytest.approx(1)


def test_the_oom_killed_flag_from_the_pod_status_alone_is_memory_capacity() -> None:
    b = verdict(Job(**STARVED), oom_killed=True).bottleneck
    assert b.regime is Regime.MEMORY_CAPACITY
    assert any("OOM-killed" in e for e in b.evidence)
    assert any("RssBytes" in m for m in b.missing)


def test_oom_kill_with_too_few_steps_is_still_memory_capacity() -> None:
    b = verdict(Job(**{**STARVED, "steps": 1.0}), oom_killed=True).bottleneck
    assert b.regime is Regime.MEMORY_CAPACITY


def test_host_oom_in_the_main_process_asks_for_more_memory() -> None:
    job = Job(**STARVED, oom_kills=1, main_rss_bytes=7 * GIB, worker_rss_bytes=0.5 * GIB)
    b = verdict(job).bottleneck
    assert b.regime is Regime.MEMORY_CAPACITY
    assert b.lever == "raise-memory-limit"


def test_full_gpu_memory_on_one_gpu_asks_for_activation_checkpointing() -> None:
    gpus = [{"util": 0.99, "sm": 0.9, "dram": 0.3, "mem_used": 79.5 * GIB, "mem_total": 80 * GIB}]
    b = verdict(Job(wait_ratio=0.0, gpus=gpus)).bottleneck
    assert (b.regime, b.lever) == (Regime.MEMORY_CAPACITY, "activation-checkpointing")
    assert any("GPU memory 99.4% used on the fullest GPU (full > 95%" in e for e in b.evidence)
    assert any("reads as compute-bound" in e for e in b.evidence)


def test_full_gpu_memory_of_data_parallel_ranks_asks_for_sharding() -> None:
    gpus = [{"util": 0.99, "sm": 0.9, "mem_used": 78 * GIB, "mem_total": 80 * GIB} for _ in range(2)]
    ranks = [Rank(r, collective_ratio=0.1, exposed_ratio=0.02) for r in range(2)]
    before, after = snapshot_pair(Job(ranks=ranks, gpus=gpus))
    w = job_window({"p": PodWindow(parse_snapshot(before), parse_snapshot(after))})
    b = diagnose(w.job, ranks=w.ranks).bottleneck
    assert (b.regime, b.lever) == (Regime.MEMORY_CAPACITY, "shard-model-states")
    assert "activation-checkpointing" in b.lever_detail


def test_gpu_memory_full_threshold_is_overridable() -> None:
    gpus = [{"util": 0.99, "sm": 0.9, "dram": 0.3, "mem_used": 74 * GIB, "mem_total": 80 * GIB}]
    job = Job(wait_ratio=0.0, gpus=gpus)
    assert verdict(job).bottleneck.regime is Regime.COMPUTE_BOUND
    assert verdict(job, Thresholds(gpu_memory_full=0.9)).bottleneck.regime is Regime.MEMORY_CAPACITY


def test_a_container_full_of_page_cache_is_only_a_warning() -> None:
    job = Job(
        **STARVED,
        container_memory_bytes=7.8 * GIB,
        container_memory_limit_bytes=8 * GIB,
        main_rss_bytes=1 * GIB,
        worker_rss_bytes=1 * GIB,
    )
    b = verdict(job).bottleneck
    assert b.regime is Regime.INPUT_BOUND
    assert any(e.startswith("container memory at 97.5% of its 8.0 GiB limit") for e in b.evidence)


def test_a_container_full_of_resident_memory_is_memory_capacity_at_low_confidence() -> None:
    job = Job(
        **STARVED,
        container_memory_bytes=7.8 * GIB,
        container_memory_limit_bytes=8 * GIB,
        main_rss_bytes=1 * GIB,
        worker_rss_bytes=6 * GIB,
    )
    b = verdict(job).bottleneck
    assert (b.regime, b.lever) == (Regime.MEMORY_CAPACITY, "reduce-loader-memory")
    assert b.confidence <= 0.5


def test_cpu_only_host_oom_without_workers_asks_for_a_smaller_micro_batch() -> None:
    job = Job(wait_ratio=0.0, nvml_up=True, oom_kills=1, main_rss_bytes=7 * GIB, main_cpu_cores=1.0)
    b = verdict(job).bottleneck
    assert (b.regime, b.lever) == (Regime.MEMORY_CAPACITY, "smaller-micro-batch")


def test_aggregate_keeps_the_kill_and_the_fullest_pod() -> None:
    a = window(Job(**STARVED, container_memory_bytes=2 * GIB, container_memory_limit_bytes=8 * GIB))
    b = window(
        Job(**STARVED, container_memory_bytes=7 * GIB, container_memory_limit_bytes=8 * GIB, oom_kills=1),
        oom_killed=True,
    )
    job = aggregate({"a": a, "b": b})
    assert job.container_memory_ratio == pytest.approx(7 / 8)
    assert job.oom_kills == pytest.approx(1) and job.oom_killed is True
    assert diagnose(job).bottleneck.regime is Regime.MEMORY_CAPACITY


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("communicationSuspect", 1.5),
        ("stragglerSkew", -0.1),
        ("gpuMemoryFull", 0.3),
        ("containerMemoryFull", 2),
    ],
)
def test_invalid_thresholds_are_rejected_naming_the_field(field: str, value: float) -> None:
    with pytest.raises(ValidationError, match=field):
        Thresholds(**{field: value})


def test_new_thresholds_have_their_defaults() -> None:
    t = Thresholds()
    assert (t.communication_suspect, t.straggler_skew, t.gpu_memory_full, t.container_memory_full) == (
        0.10,
        0.10,
        0.95,
        0.95,
    )


# The real node's DataLoader OOM (issue 28 item 8): a CPU-only trainer whose main process holds
# most of the resident memory, with loader workers beside it; the kernel killed a worker, torch
# raised "DataLoader worker (pid 30) exited unexpectedly" and the container exited with code 1.
CHILD_KILLED_JOB: dict[str, Any] = {
    "wait_ratio": 0.0,
    "nvml_up": True,
    "main_cpu_cores": 1.0,
    "main_rss_bytes": 3 * GIB,
    "worker_rss_bytes": 1 * GIB,
}


def test_exit_code_137_says_the_training_process_itself_was_oom_killed() -> None:
    b = verdict(Job(**CHILD_KILLED_JOB), oom_killed=True, oom_exit_code=137).bottleneck
    assert b.regime is Regime.MEMORY_CAPACITY
    assert b.evidence[0].startswith("the training process was OOM-killed (reason OOMKilled, exit code 137")
    assert b.lever != "reduce-loader-memory"  # the main process holds the memory and was killed


def test_exit_code_1_after_an_oom_kill_says_a_child_was_killed_and_keeps_the_loader_lever() -> None:
    b = verdict(Job(**CHILD_KILLED_JOB), oom_killed=True, oom_exit_code=1).bottleneck
    assert (b.regime, b.lever) == (Regime.MEMORY_CAPACITY, "reduce-loader-memory")
    assert b.evidence[0].startswith("a child of the training process was OOM-killed")
    assert "exited with code 1, not 137" in b.evidence[0]
    assert not any(e.startswith("the training process was OOM-killed") for e in b.evidence)
    assert any("DataLoader workers run in the container" in e for e in b.evidence)


def test_exit_code_1_with_the_probes_worker_kill_names_the_killed_loader_worker() -> None:
    job = Job(**CHILD_KILLED_JOB, loader_worker_kills=1)
    b = verdict(job, oom_killed=True, oom_exit_code=1).bottleneck
    assert (b.regime, b.lever) == (Regime.MEMORY_CAPACITY, "reduce-loader-memory")
    assert b.confidence == pytest.approx(0.95)
    assert b.evidence[0].startswith("a child of the training process was OOM-killed")
    assert any("1 DataLoader worker killed in the window" in e for e in b.evidence)


def test_an_unknown_exit_code_does_not_claim_which_process_was_killed() -> None:
    b = verdict(Job(**CHILD_KILLED_JOB), oom_killed=True).bottleneck
    assert b.regime is Regime.MEMORY_CAPACITY
    assert b.evidence[0].startswith("the training container was OOM-killed")
    assert "is not known" in b.evidence[0]


def test_a_job_keeps_exit_code_137_when_any_pod_had_its_training_process_killed() -> None:
    a = window(Job(**CHILD_KILLED_JOB), oom_killed=True, oom_exit_code=1)
    b = window(Job(**CHILD_KILLED_JOB), oom_killed=True, oom_exit_code=137)
    assert aggregate({"a": a, "b": b}).oom_exit_code == 137
    assert aggregate({"a": a}).oom_exit_code == 1
