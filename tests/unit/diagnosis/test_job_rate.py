"""``stepsPerSecond`` is the job's rate: the ranks of a distributed job advance together, so their
counters are not summed (each rank counts every step); per-rank rates stay under ``ranks``."""

from __future__ import annotations

from dam_contract.snapshot import parse_snapshot
from dam_operator.diagnosis.engine import diagnose
from dam_operator.diagnosis.model import Observation
from dam_operator.diagnosis.window import PodWindow, aggregate, job_window, observation_from_snapshots
from tests.unit.diagnosis.snapshots import Job, Rank, snapshot_pair


def _pod(job: Job) -> PodWindow:
    before, after = snapshot_pair(job)
    return PodWindow(parse_snapshot(before), parse_snapshot(after))


def _ranks(*numbers: int, steps: float = 120.0) -> list[Rank]:
    return [Rank(r, steps=steps, collective_ratio=0.1, exposed_ratio=0.01) for r in numbers]


def test_two_ranks_in_one_pod_report_one_rank_rate_not_the_sum() -> None:
    w = job_window({"p": _pod(Job(seconds=60.0, ranks=_ranks(0, 1), nvml_up=True, attribution="probe"))})
    v = diagnose(w.job, ranks=w.ranks)
    assert v.metrics.steps_per_second is not None and abs(v.metrics.steps_per_second - 2.0) < 1e-9
    assert v.metrics.ranks is not None
    assert [r.steps_per_second for r in v.metrics.ranks] == [2.0, 2.0]
    assert any(e.startswith("2.00 steps/s (120 steps in 60 s), each rank") for e in v.bottleneck.evidence)


def test_one_pod_observation_alone_gives_the_job_rate_too() -> None:
    before, after = snapshot_pair(Job(seconds=60.0, ranks=_ranks(0, 1, 2, 3)))
    obs = observation_from_snapshots(parse_snapshot(before), parse_snapshot(after))
    assert obs.steps == 480.0, "the counters summed: every process's steps"
    assert obs.steps_per_second == 2.0 and obs.job_steps == 120.0


def test_ranks_in_several_pods_give_the_median_ranks_rate() -> None:
    pods = {
        f"p{i}": _pod(Job(seconds=60.0, ranks=_ranks(2 * i, 2 * i + 1, steps=120.0 + i))) for i in range(3)
    }
    w = job_window(pods)
    assert w.job.steps_per_second is not None and abs(w.job.steps_per_second - 121.0 / 60.0) < 1e-9


def test_independent_processes_without_ranks_add_up() -> None:
    job = aggregate(
        {"a": Observation(steps_per_second=2.0, steps=20), "b": Observation(steps_per_second=3.0)}
    )
    assert job.steps_per_second == 5.0


def test_a_ranked_job_with_too_few_steps_per_rank_is_not_diagnosed() -> None:
    w = job_window({"p": _pod(Job(seconds=60.0, ranks=_ranks(0, 1, 2, 3, steps=2.0)))})
    b = diagnose(w.job, ranks=w.ranks).bottleneck
    assert b.evidence[0] == "only 2 steps per rank in the window (need at least 3)"
