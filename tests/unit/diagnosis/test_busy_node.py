"""A busy node: the training process is runnable but waits for a CPU (run-queue delay).

Axis Machine, lever ``raise-cpu-request``, the wait ratio in the evidence; never ``unknown``.
"""

from __future__ import annotations

from typing import Any

from dam_contract import names
from dam_contract.snapshot import Sample, Snapshot
from dam_operator.diagnosis.engine import diagnose
from dam_operator.diagnosis.model import Axis, Observation, RankId, Regime, Thresholds
from dam_operator.diagnosis.ranks import find_straggler
from dam_operator.diagnosis.window import aggregate, baseline, observation_from_snapshots

# The run: a single-thread CPU job that gets 0.79 cores while other processes take the CPU.
CPU_JOB: dict[str, Any] = {
    "gpu_count": 0,
    "steps": 40,
    "window_seconds": 10.0,
    "mean_step_seconds": 0.25,
    "data_wait_ratio": 0.002,
    "main_cpu_cores": 0.79,
    "worker_count": 0,
}


def test_a_cpu_job_that_waits_for_a_cpu_is_machine_raise_cpu_request() -> None:
    b = diagnose(Observation(**CPU_JOB, cpu_wait_ratio=0.21)).bottleneck
    assert (b.axis, b.regime, b.lever) == (Axis.MACHINE, Regime.COMPUTE_BOUND, "raise-cpu-request")
    assert b.confidence >= 0.6
    assert any("waited for a CPU 21.0% of the window" in e for e in b.evidence), b.evidence
    assert "Guaranteed QoS" in b.lever_detail and "static CPU manager" in b.lever_detail


def test_without_the_run_queue_delay_the_same_job_stays_unknown() -> None:
    assert diagnose(Observation(**CPU_JOB)).bottleneck.regime is Regime.UNKNOWN


def test_a_small_run_queue_delay_does_not_blame_the_node() -> None:
    """5 % waiting (under the 20 % screen) leaves the verdict as without it, word for word, and the
    figure in the status; just over the screen the same job is the node's."""
    without = diagnose(Observation(**CPU_JOB)).bottleneck
    small = diagnose(Observation(**CPU_JOB, cpu_wait_ratio=0.05))
    b = small.bottleneck
    assert (b.axis, b.regime, b.lever, b.confidence) == (without.axis, without.regime, without.lever, 0.0)
    assert b.evidence == without.evidence
    assert not any("waited for a CPU" in e for e in b.evidence), b.evidence
    assert small.to_status()["metrics"]["cpuWaitRatio"] == 0.05
    over = diagnose(Observation(**CPU_JOB, cpu_wait_ratio=Thresholds().cpu_wait_suspect + 0.01)).bottleneck
    assert (over.axis, over.lever) == (Axis.MACHINE, "raise-cpu-request")


def test_the_threshold_is_overridable() -> None:
    obs = Observation(**CPU_JOB, cpu_wait_ratio=0.12)
    assert diagnose(obs).bottleneck.lever != "raise-cpu-request"
    assert diagnose(obs, Thresholds(cpu_wait_suspect=0.1)).bottleneck.lever == "raise-cpu-request"


def test_a_throttled_container_is_the_quota_not_the_node() -> None:
    # CFS throttling also keeps runnable tasks waiting: there the CPU limit is the cause.
    b = diagnose(Observation(**CPU_JOB, cpu_wait_ratio=0.5, cpu_throttled_ratio=0.4)).bottleneck
    assert b.lever == "raise-cpu-limit"


def test_a_gpu_job_whose_host_thread_waits_for_a_cpu_is_machine() -> None:
    obs = Observation(
        gpu_count=1,
        gpu_utilization=0.4,
        steps=100,
        window_seconds=10.0,
        data_wait_ratio=0.01,
        main_cpu_cores=0.5,
        cpu_wait_ratio=0.45,
    )
    b = diagnose(obs).bottleneck
    assert (b.axis, b.lever) == (Axis.MACHINE, "raise-cpu-request")


def test_a_busy_gpu_is_judged_by_the_gpu_rules_even_on_a_busy_node() -> None:
    obs = Observation(gpu_count=1, gpu_utilization=0.99, sm_active=0.9, steps=100, cpu_wait_ratio=0.3)
    b = diagnose(obs).bottleneck
    assert b.regime is Regime.COMPUTE_BOUND and b.lever != "raise-cpu-request"
    assert any("waited for a CPU" in e for e in b.evidence), "the wait is still reported"


def test_loader_workers_starved_by_a_busy_node_give_raise_cpu_request_at_the_machine_boundary() -> None:
    obs = Observation(
        gpu_count=0,
        steps=40,
        data_wait_ratio=0.6,
        worker_count=4,
        worker_cpu_cores=1.6,
        worker_cpu_wait_ratio=0.5,
    )
    b = diagnose(obs).bottleneck
    assert (b.axis, b.boundary, b.regime, b.lever) == (
        Axis.DATA,
        Axis.MACHINE,
        Regime.INPUT_BOUND,
        "raise-cpu-request",
    )
    assert any("4 loader workers waited for a CPU 50.0%" in e for e in b.evidence), b.evidence


def test_the_wait_ratio_is_in_the_status_metrics() -> None:
    m = diagnose(Observation(**CPU_JOB, cpu_wait_ratio=0.21, worker_cpu_wait_ratio=0.1)).to_status()
    assert m["metrics"]["cpuWaitRatio"] == 0.21
    assert m["metrics"]["workerCpuWaitRatio"] == 0.1


# --- from the sidecar's counters ----------------------------------------------------------


def _snap(t: float, main_wait: float, worker_wait: float, workers: float, mains: float = 1.0) -> Snapshot:
    return Snapshot(
        [
            Sample(names.SNAPSHOT_TIMESTAMP_SECONDS, (), t),
            Sample(names.PROCESS_CPU_WAIT_SECONDS_TOTAL, (("role", "main"),), main_wait),
            Sample(names.PROCESS_CPU_WAIT_SECONDS_TOTAL, (("role", "worker"),), worker_wait),
            Sample(names.PROCESSES, (("role", "main"),), mains),
            Sample(names.PROCESSES, (("role", "worker"),), workers),
        ]
    )


def test_the_window_reads_the_wait_per_process_and_wall_second() -> None:
    obs = observation_from_snapshots(_snap(100.0, 5.0, 1.0, 2), _snap(110.0, 8.0, 9.0, 2))
    assert obs.cpu_wait_ratio is not None and abs(obs.cpu_wait_ratio - 0.3) < 1e-9
    assert obs.worker_cpu_wait_ratio is not None and abs(obs.worker_cpu_wait_ratio - 0.4) < 1e-9


def test_several_main_processes_share_the_wall_time() -> None:
    obs = observation_from_snapshots(_snap(100.0, 0.0, 0.0, 0, mains=2), _snap(110.0, 8.0, 0.0, 0, mains=2))
    assert obs.cpu_wait_ratio is not None and abs(obs.cpu_wait_ratio - 0.4) < 1e-9


def test_a_baseline_keeps_what_the_window_needs() -> None:
    kept = baseline(_snap(100.0, 5.0, 1.0, 2))
    obs = observation_from_snapshots(kept, _snap(110.0, 8.0, 9.0, 0))
    assert obs.cpu_wait_ratio is not None and abs(obs.cpu_wait_ratio - 0.3) < 1e-9
    assert obs.worker_count == 2, "the workers the window saw at its start"


def test_the_most_contended_pod_is_the_jobs_figure() -> None:
    job = aggregate({"a": Observation(cpu_wait_ratio=0.05), "b": Observation(cpu_wait_ratio=0.4)})
    assert job.cpu_wait_ratio == 0.4


def test_a_rank_on_a_busy_node_is_a_machine_straggler() -> None:
    ranks = {
        RankId(f"p{i}", None): Observation(
            steps_per_second=2.0 if i else 1.0, data_wait_ratio=0.0, cpu_wait_ratio=0.5 if i == 0 else 0.01
        )
        for i in range(3)
    }
    found = find_straggler(ranks)
    assert found is not None and found.pod == "p0" and found.cause is Axis.MACHINE
    assert any("waited for a CPU 50.0%" in e for e in found.evidence)


def test_a_main_process_loader_on_a_busy_node_still_asks_for_workers_first() -> None:
    # No workers: the batches load in the main process, which also waits for a CPU. More workers load
    # in parallel (and hide the node's delays); the wait is said beside the lever, not instead of it.
    obs = Observation(data_wait_ratio=0.7, steps=200, main_cpu_cores=0.2, worker_count=0, cpu_wait_ratio=0.37)
    b = diagnose(obs).bottleneck
    assert (b.regime, b.lever) == (Regime.INPUT_BOUND, "increase-dataloader-workers")
    assert any("batches are loaded in the main process" in e for e in b.evidence)
    assert any("waited for a CPU" in e and "raise-cpu-request if it stays busy" in e for e in b.evidence), (
        b.evidence
    )


def test_a_cpu_job_just_under_the_saturated_line_is_compute_bound_at_lower_confidence() -> None:
    mostly = diagnose(Observation(**{**CPU_JOB, "main_cpu_cores": 0.85})).bottleneck
    assert (mostly.regime, mostly.lever) == (Regime.COMPUTE_BOUND, "move-to-accelerator")
    saturated = diagnose(Observation(**{**CPU_JOB, "main_cpu_cores": 0.95})).bottleneck
    assert mostly.confidence < saturated.confidence


def test_a_main_process_loader_waiting_less_for_data_than_for_a_cpu_is_told_to_raise_cpu_request() -> None:
    # dam run's figures for a job pinned to one CPU beside four busy loops: the run-queue delay is
    # the larger loss, and more workers would compete for the same cores.
    obs = Observation(
        data_wait_ratio=0.128, steps=128, main_cpu_cores=0.08, worker_count=0, cpu_wait_ratio=0.321
    )
    b = diagnose(obs).bottleneck
    assert (b.axis, b.lever) == (Axis.MACHINE, "raise-cpu-request"), b
    assert any("data wait 12.8%" in e and "less than the wait for a CPU" in e for e in b.evidence), b.evidence
    # A data wait larger than the delay stays a loader question: more workers first.
    larger = diagnose(obs.model_copy(update={"data_wait_ratio": 0.4})).bottleneck
    assert (larger.axis, larger.lever) == (Axis.DATA, "increase-dataloader-workers"), larger


def test_an_implausible_cpu_wait_beside_a_sleeping_loader_does_not_overturn_the_loader_verdict() -> None:
    # Seen on the real node: 100 % CPU wait beside a 49 % data wait (a loader that sleeps is not
    # runnable while it waits): the pair adds up to more than the window; the loader verdict stays.
    obs = Observation(data_wait_ratio=0.49, steps=44, main_cpu_cores=0.11, worker_count=0, cpu_wait_ratio=1.0)
    b = diagnose(obs).bottleneck
    assert (b.axis, b.lever) == (Axis.DATA, "increase-dataloader-workers"), b
    # Close figures that fit in the window stay a loader question too (the margin).
    close = diagnose(obs.model_copy(update={"data_wait_ratio": 0.3, "cpu_wait_ratio": 0.4})).bottleneck
    assert (close.axis, close.lever) == (Axis.DATA, "increase-dataloader-workers"), close


def test_a_window_whose_start_lacks_the_wait_counter_reads_no_cpu_wait() -> None:
    # A pod's first window: its processes' delay so far lies before the window; an increase needs
    # the counter at both ends (as Prometheus's increase does).
    start = Snapshot([Sample(names.SNAPSHOT_TIMESTAMP_SECONDS, (), 100.0)])
    obs = observation_from_snapshots(start, _snap(110.0, 25.0, 0.0, 0))
    assert obs.cpu_wait_ratio is None and obs.worker_cpu_wait_ratio is None
    both_ends = observation_from_snapshots(_snap(100.0, 20.0, 0.0, 0), _snap(110.0, 25.0, 0.0, 0))
    assert both_ends.cpu_wait_ratio == 0.5
