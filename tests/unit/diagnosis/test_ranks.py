"""Distributed jobs: per-rank observations, stragglers with their cause, communication-bound."""

from __future__ import annotations

from typing import Any

import pytest

from dam_contract import names
from dam_contract.snapshot import Sample, Snapshot, parse_snapshot
from dam_operator.diagnosis.axes import Kind
from dam_operator.diagnosis.engine import diagnose
from dam_operator.diagnosis.model import Axis, Observation, RankId, Regime, Straggler, Thresholds, Verdict
from dam_operator.diagnosis.ranks import MAX_RANK_FIGURES, find_straggler, rank_figures
from dam_operator.diagnosis.render import render_text
from dam_operator.diagnosis.window import (
    JobWindow,
    PodWindow,
    job_window,
    observation_from_snapshots,
    rank_observations,
)
from tests.unit.diagnosis.snapshots import Job, Rank, snapshot_pair

# A synchronous step of 0.5 s (120 steps in 60 s) on every rank.
STEP = 0.5


def pod_window(job: Job, **kwargs: Any) -> PodWindow:
    before, after = snapshot_pair(job)
    return PodWindow(parse_snapshot(before), parse_snapshot(after), **kwargs)


def one_pod(job: Job, **kwargs: Any) -> JobWindow:
    return job_window({"trainer-0": pod_window(job, **kwargs)})


def verdict_of(window: JobWindow, thresholds: Thresholds | None = None) -> Verdict:
    return diagnose(window.job, thresholds, ranks=window.ranks)


def cpu_job(ranks: list[Rank], **kwargs: Any) -> Job:
    """A CPU-only (gloo) job: NVML answers, no GPU is the job's."""
    return Job(ranks=ranks, nvml_up=True, attribution="probe", main_cpu_cores=2.0, **kwargs)


def late_loader_ranks() -> list[Rank]:
    """Rank 2's loader is slow (40 % data wait): ranks 0 and 1 wait for it in every all-reduce."""
    return [
        Rank(0, wait_ratio=0.01, collective_ratio=0.45, exposed_ratio=0.42),
        Rank(1, wait_ratio=0.01, collective_ratio=0.46, exposed_ratio=0.43),
        Rank(2, wait_ratio=0.40, collective_ratio=0.05, exposed_ratio=0.02),
    ]


# --- splitting a snapshot into ranks --------------------------------------------------


def test_a_pod_with_several_ranks_splits_into_one_observation_per_rank() -> None:
    w = one_pod(cpu_job(late_loader_ranks()))
    assert sorted(w.ranks, key=RankId.sort_key) == [RankId("trainer-0", r) for r in range(3)]
    late = w.ranks[RankId("trainer-0", 2)]
    assert late.steps == pytest.approx(120.0)
    assert late.data_wait_ratio == pytest.approx(0.40)
    assert late.collective_seconds == pytest.approx(60.0 * 0.05)
    assert late.collective_ratio == pytest.approx(0.05)
    assert late.exposed_communication_ratio == pytest.approx(0.02)
    assert late.ranks == 1


class CountingSnapshot(Snapshot):
    """A snapshot that counts how often its samples are read, series by series."""

    def __init__(self, other: Snapshot) -> None:
        super().__init__([s for name in other.names() for s in other.samples(name)], other.timestamp_seconds)
        self.reads = 0

    def samples(self, name: str) -> list[Sample]:
        self.reads += 1
        return super().samples(name)


def test_splitting_a_pod_into_ranks_reads_each_series_of_its_snapshots_once() -> None:
    before, after = (CountingSnapshot(parse_snapshot(t)) for t in snapshot_pair(cpu_job(late_loader_ranks())))
    split = rank_observations(before, after, pod="trainer-0")
    assert sorted(r.rank or 0 for r in split) == [0, 1, 2]
    # one index by rank of each scrape (the views, rank numbers, local ranks and GPUs from it),
    # however many ranks the pod holds: each series read once
    assert (before.reads, after.reads) == (len(before.names()), len(after.names()))


def test_pod_observation_sums_the_ranks_and_is_skew_corrected() -> None:
    w = one_pod(cpu_job(late_loader_ranks()))
    pod = w.pods["trainer-0"]
    assert pod.ranks == 3
    assert pod.steps == pytest.approx(360.0)
    assert pod.collective_seconds == pytest.approx(60.0 * (0.45 + 0.46 + 0.05))
    # The least-waiting rank's exposed communication, not the mean (which is ~29 %).
    assert pod.exposed_communication_ratio == pytest.approx(0.02)
    assert pod.collective_skew == pytest.approx((0.46 - 0.05) / 1.0 * 60 / 120 / STEP)


def test_a_snapshot_without_rank_labels_is_one_process() -> None:
    before, after = snapshot_pair(Job(wait_ratio=0.2))
    found = rank_observations(parse_snapshot(before), parse_snapshot(after), pod="p")
    assert list(found) == [RankId("p", None)]
    obs = observation_from_snapshots(parse_snapshot(before), parse_snapshot(after))
    assert obs.ranks is None and obs.collective_skew is None


def test_an_unranked_process_beside_ranked_ones_is_its_own_entry_and_counted_once() -> None:
    text_before, text_after = snapshot_pair(
        cpu_job([Rank(0, collective_ratio=0.3), Rank(1, collective_ratio=0.3)])
    )
    extra = f"{names.STEPS_TOTAL} 10\n"
    before = parse_snapshot(text_before + extra)
    after = parse_snapshot(text_after + f"{names.STEPS_TOTAL} 70\n")
    found = rank_observations(before, after, pod="p", elapsed_seconds=60.0)
    assert set(found) == {RankId("p", 0), RankId("p", 1), RankId("p", None)}
    assert found[RankId("p", None)].steps == pytest.approx(60.0)
    assert found[RankId("p", 0)].steps == pytest.approx(120.0)
    pod = observation_from_snapshots(before, after, elapsed_seconds=60.0)
    assert pod.steps == pytest.approx(300.0) and pod.ranks == 2


def test_each_rank_gets_its_own_gpu_when_the_pod_has_one_per_rank() -> None:
    job = Job(
        ranks=[Rank(0, collective_ratio=0.3), Rank(1, collective_ratio=0.3)],
        gpus=[{"util": 0.9, "clock": 1.98e9}, {"util": 0.5, "clock": 1.2e9}],
    )
    w = one_pod(job)
    assert w.ranks[RankId("trainer-0", 0)].gpu_utilization == pytest.approx(0.9)
    assert w.ranks[RankId("trainer-0", 1)].gpu_utilization == pytest.approx(0.5)
    assert w.ranks[RankId("trainer-0", 1)].sm_clock_hertz == pytest.approx(1.2e9)
    assert w.pods["trainer-0"].gpu_utilization == pytest.approx(0.7)


def test_local_ranks_pick_the_gpu_when_the_probe_publishes_them() -> None:
    job = Job(
        ranks=[Rank(4, collective_ratio=0.3, local_rank=1), Rank(5, collective_ratio=0.3, local_rank=0)],
        gpus=[{"util": 0.9}, {"util": 0.5}],
    )
    w = one_pod(job)
    assert w.ranks[RankId("trainer-0", 4)].gpu_utilization == pytest.approx(0.5)
    assert w.ranks[RankId("trainer-0", 5)].gpu_utilization == pytest.approx(0.9)


def test_pod_wide_process_totals_are_not_given_to_one_of_several_ranks() -> None:
    w = one_pod(cpu_job(late_loader_ranks(), worker_cpu_cores=3.0))
    assert w.pods["trainer-0"].main_cpu_cores == pytest.approx(2.0)
    assert all(o.main_cpu_cores is None for o in w.ranks.values())


# --- stragglers in synchronous jobs -------------------------------------------------------


def test_late_rank_with_a_slow_loader_is_the_straggler_with_cause_data() -> None:
    v = verdict_of(one_pod(cpu_job(late_loader_ranks())))
    s = v.bottleneck.straggler
    assert s is not None
    assert (s.pod, s.rank, s.cause) == ("trainer-0", 2, Axis.DATA)
    assert "rank 2 (pod trainer-0) arrives last at the collectives" in s.evidence[0]
    assert "25.0 ms per step" in s.evidence[0] and "230.0 ms" in s.evidence[0]
    assert any("data wait is 40.0%" in e for e in s.evidence)
    assert any(e.startswith("straggler (Data)") for e in v.bottleneck.evidence)
    # The peers' waiting is not communication: the least-waiting rank's exposed share is 2 %.
    assert v.bottleneck.regime is not Regime.COMMUNICATION_BOUND


def test_a_synchronous_job_waits_for_its_straggler_loader_not_for_the_ranks_mean() -> None:
    """Rank 2 waits 25 % of its step for data; the mean over 3 ranks (9 %) is under the screen."""
    ranks = [
        Rank(0, wait_ratio=0.01, collective_ratio=0.30, exposed_ratio=0.26),
        Rank(1, wait_ratio=0.01, collective_ratio=0.30, exposed_ratio=0.26),
        Rank(2, wait_ratio=0.25, collective_ratio=0.05, exposed_ratio=0.02),
    ]
    w = one_pod(cpu_job(ranks))
    assert w.job.data_wait_ratio is not None and w.job.data_wait_ratio < Thresholds().data_wait_suspect
    b = verdict_of(w).bottleneck
    assert b.regime is Regime.INPUT_BOUND
    assert "data wait 25.0% of step time (screen > 10%)" in b.evidence
    assert any("that of rank 2 (pod trainer-0), the straggler" in e and "9.0%" in e for e in b.evidence)


def test_late_rank_makes_peers_wait_without_making_the_job_communication_bound() -> None:
    """Rank 1 computes slower (a thermally throttled GPU): rank 0 waits in every collective."""
    ranks = [
        Rank(0, collective_ratio=0.50, exposed_ratio=0.47),
        Rank(1, collective_ratio=0.08, exposed_ratio=0.04),
    ]
    gpus = [
        {"util": 0.98, "sm": 0.9, "dram": 0.3, "clock": 1.98e9, "slowdown": 0.0},
        {"util": 0.99, "sm": 0.9, "dram": 0.3, "clock": 1.1e9, "slowdown": 1.0},
    ]
    w = one_pod(Job(ranks=ranks, gpus=gpus))
    v = verdict_of(w)
    assert v.bottleneck.regime is not Regime.COMMUNICATION_BOUND
    s = v.bottleneck.straggler
    assert s is not None and (s.rank, s.cause) == (1, Axis.MACHINE)
    assert any("hw_thermal_slowdown" in e for e in s.evidence)
    assert v.metrics.exposed_communication_ratio == pytest.approx(0.04)
    # The ranks' mean exposed share would have crossed the screen.
    job = w.job
    assert job.collective_exposed_seconds is not None and job.steps and job.mean_step_seconds
    mean_exposed = job.collective_exposed_seconds / (job.steps * job.mean_step_seconds)
    assert mean_exposed == pytest.approx(0.255)


def test_straggler_pod_is_found_across_pods_with_a_slowed_clock() -> None:
    def pod(collective: float, clock: float) -> PodWindow:
        job = Job(
            ranks=[Rank(0, collective_ratio=collective, exposed_ratio=collective * 0.9)],
            gpus=[{"util": 0.97, "sm": 0.9, "dram": 0.2, "clock": clock}],
        )
        return pod_window(job)

    w = job_window({"a": pod(0.40, 1.98e9), "b": pod(0.41, 1.98e9), "c": pod(0.05, 1.4e9)})
    # Each pod runs rank 0 of its own process; the keys keep them apart.
    assert set(w.ranks) == {RankId("a", 0), RankId("b", 0), RankId("c", 0)}
    v = verdict_of(w)
    s = v.bottleneck.straggler
    assert s is not None and s.pod == "c" and s.cause is Axis.MACHINE
    assert any("SM clock is 1400 MHz vs a median of 1980 MHz" in e for e in s.evidence)
    assert v.metrics.exposed_communication_ratio == pytest.approx(0.045)
    assert v.bottleneck.regime is not Regime.COMMUNICATION_BOUND


def test_straggler_on_a_throttled_host_has_cause_machine_host() -> None:
    def pod(collective: float, throttled: float) -> PodWindow:
        return pod_window(
            cpu_job([Rank(0, wait_ratio=0.01, collective_ratio=collective)], throttled_ratio=throttled)
        )

    w = job_window({"a": pod(0.4, 0.0), "b": pod(0.05, 0.35)})
    s = verdict_of(w).bottleneck.straggler
    assert s is not None and (s.pod, s.cause) == ("b", Axis.MACHINE)
    assert any("CPU-throttled 35.0%" in e and "host CPU" in e for e in s.evidence)


def test_a_stragglers_lines_are_records_with_their_kind_and_numbers() -> None:
    def pod(collective: float, throttled: float) -> PodWindow:
        return pod_window(
            cpu_job([Rank(0, wait_ratio=0.01, collective_ratio=collective)], throttled_ratio=throttled)
        )

    s = verdict_of(job_window({"a": pod(0.4, 0.0), "b": pod(0.05, 0.35)})).bottleneck.straggler
    assert s is not None
    records = s.records()
    assert [r.kind for r in records] == [Kind.COLLECTIVE_SKEW, Kind.CPU_THROTTLED]
    assert [r.sentence for r in records] == s.evidence
    assert records[0].numbers["collective_skew"] > Thresholds().straggler_skew
    assert records[1].numbers["cpu_throttled_ratio"] == pytest.approx(0.35, abs=0.01)
    # Read back from its status it is the same straggler; its lines are then notes (no numbers).
    back = Straggler.model_validate(s.model_dump(by_alias=True))
    assert back == s and [r.kind for r in back.records()] == [Kind.NOTE, Kind.NOTE]


def test_late_rank_waiting_for_data_is_cause_data_even_when_peers_do_not_measure_it() -> None:
    def obs(collective: float, wait: float | None) -> Observation:
        return Observation(
            steps=100.0, mean_step_seconds=0.5, collective_seconds=collective, data_wait_ratio=wait
        )

    ranks = {RankId("", 0): obs(20.0, None), RankId("", 1): obs(2.0, 0.35)}
    s = find_straggler(ranks)
    assert s is not None and (s.pod, s.rank, s.cause) == (None, 1, Axis.DATA)
    assert "its peers' is not measured" in s.evidence[-1]


def test_straggler_without_a_telling_signal_has_cause_unknown_naming_what_is_missing() -> None:
    job = Job(ranks=[Rank(0, collective_ratio=0.4), Rank(1, collective_ratio=0.05)])
    s = verdict_of(one_pod(job)).bottleneck.straggler
    assert s is not None and s.rank == 1 and s.cause is Axis.UNKNOWN
    assert "not measured" in s.evidence[-1] and "GPU" in s.evidence[-1]


def test_skew_below_the_threshold_names_no_straggler() -> None:
    ranks = [Rank(r, collective_ratio=0.20 + 0.01 * r, exposed_ratio=0.02) for r in range(4)]
    v = verdict_of(one_pod(cpu_job(ranks)))
    assert v.bottleneck.straggler is None
    assert v.metrics.collective_skew == pytest.approx(0.03 * 60 / 120 / STEP)
    # A stricter threshold does name one.
    strict = verdict_of(one_pod(cpu_job(ranks)), Thresholds(straggler_skew=0.02))
    assert strict.bottleneck.straggler is not None and strict.bottleneck.straggler.rank == 0


# --- communication-bound -------------------------------------------------------------------


def test_balanced_ranks_with_high_exposed_communication_are_communication_bound() -> None:
    ranks = [
        Rank(r, wait_ratio=0.005, collective_ratio=0.40, exposed_ratio=0.30, collectives_per_step=12)
        for r in range(3)
    ]
    v = verdict_of(one_pod(cpu_job(ranks)))
    b = v.bottleneck
    assert (b.regime, b.axis, b.boundary) == (Regime.COMMUNICATION_BOUND, Axis.MACHINE, Axis.ALGORITHM)
    assert b.lever == "overlap-gradient-communication"
    assert {"more-loader-workers", "faster-accelerator"} <= set(b.avoid)
    assert b.straggler is None
    assert any("exposed communication 30.0% of the step time (least-waiting rank" in e for e in b.evidence)
    assert any("12.0 collectives per step" in e for e in b.evidence)
    assert b.confidence >= 0.8


def test_well_overlapped_but_heavy_communication_asks_for_fewer_syncs() -> None:
    ranks = [Rank(r, collective_ratio=0.80, exposed_ratio=0.25) for r in range(2)]
    b = verdict_of(one_pod(cpu_job(ranks))).bottleneck
    assert b.regime is Regime.COMMUNICATION_BOUND
    assert b.lever == "accumulate-gradients"


def test_one_rank_alone_cannot_be_skew_corrected_and_says_so() -> None:
    obs = Observation(
        steps=300.0, window_seconds=60.0, gpu_count=0, data_wait_ratio=0.0, exposed_communication_ratio=0.3
    )
    b = diagnose(obs).bottleneck
    assert b.regime is Regime.COMMUNICATION_BOUND
    assert any("collectiveSeconds" in m for m in b.missing)


def test_communication_suspect_threshold_is_overridable() -> None:
    ranks = [Rank(r, collective_ratio=0.4, exposed_ratio=0.25) for r in range(2)]
    w = one_pod(cpu_job(ranks))
    assert verdict_of(w).bottleneck.regime is Regime.COMMUNICATION_BOUND
    relaxed = verdict_of(w, Thresholds(communication_suspect=0.3)).bottleneck
    assert relaxed.regime is not Regime.COMMUNICATION_BOUND


def test_compute_heavy_balanced_ranks_are_neither_straggling_nor_communication_bound() -> None:
    ranks = [Rank(r, wait_ratio=0.002, collective_ratio=0.06, exposed_ratio=0.01) for r in range(2)]
    gpus = [{"util": 0.99, "sm": 0.93, "tensor": 0.6, "dram": 0.3, "clock": 1.98e9} for _ in range(2)]
    v = verdict_of(one_pod(Job(ranks=ranks, gpus=gpus)))
    assert v.bottleneck.regime is Regime.COMPUTE_BOUND
    assert v.bottleneck.straggler is None
    assert any(e.startswith("exposed communication 1.0%") for e in v.bottleneck.evidence)


def test_data_and_communication_both_high_the_larger_share_wins() -> None:
    base = {"steps": 300.0, "window_seconds": 60.0, "gpu_count": 0, "collective_skew": 0.01}
    data = diagnose(Observation(**base, data_wait_ratio=0.4, exposed_communication_ratio=0.2))
    comm = diagnose(Observation(**base, data_wait_ratio=0.15, exposed_communication_ratio=0.35))
    assert data.bottleneck.regime is Regime.INPUT_BOUND
    assert comm.bottleneck.regime is Regime.COMMUNICATION_BOUND


# --- independent pods keep the step-rate test ---------------------------------------------------


def test_independent_slow_pod_is_named_by_its_step_rate() -> None:
    pods = {RankId(f"p{i}", None): Observation(steps_per_second=4.0, data_wait_ratio=0.02) for i in range(3)}
    pods[RankId("p3", None)] = Observation(
        steps_per_second=1.0, data_wait_ratio=0.02, cpu_throttled_ratio=0.5
    )
    s = find_straggler(pods)
    assert s is not None and (s.pod, s.rank, s.cause) == ("p3", None, Axis.MACHINE)
    assert "1.00 steps/s vs a median of 4.00" in s.evidence[0]


def test_independent_pod_waiting_for_data_has_cause_data() -> None:
    pods = {RankId(f"p{i}", None): Observation(steps_per_second=4.0, data_wait_ratio=0.02) for i in range(3)}
    pods[RankId("p1", None)] = Observation(steps_per_second=4.0, data_wait_ratio=0.45)
    s = find_straggler(pods)
    assert s is not None and (s.pod, s.cause) == ("p1", Axis.DATA)


# --- per-rank figures ------------------------------------------------------------------------


def test_rank_figures_are_bounded_and_list_the_latest_rank_first() -> None:
    ranks = [Rank(r, collective_ratio=0.4, exposed_ratio=0.1) for r in range(12)]
    ranks[7] = Rank(7, wait_ratio=0.3, collective_ratio=0.05, exposed_ratio=0.01)
    w = one_pod(cpu_job(ranks))
    v = verdict_of(w)
    figures = v.metrics.ranks
    assert figures is not None and len(figures) == MAX_RANK_FIGURES
    assert v.metrics.rank_count == 12
    assert (figures[0].rank, figures[0].pod) == (7, "trainer-0")
    assert figures[0].data_wait_ratio == pytest.approx(0.3)
    assert figures[0].collective_ratio == pytest.approx(0.05)
    assert figures[0].exposed_ratio == pytest.approx(0.01)
    assert figures[0].steps_per_second == pytest.approx(2.0)
    status = v.to_status()
    assert set(status["metrics"]["ranks"][0]) == {
        "rank",
        "pod",
        "stepsPerSecond",
        "dataWaitRatio",
        "collectiveRatio",
        "exposedRatio",
    }
    assert status["bottleneck"]["straggler"]["rank"] == 7
    assert len(rank_figures(w.ranks, limit=3)) == 3


def test_single_process_verdict_has_no_ranks_and_no_straggler() -> None:
    before, after = snapshot_pair(Job(wait_ratio=0.5, gpus=[{"util": 0.2}]))
    w = job_window({"p": PodWindow(parse_snapshot(before), parse_snapshot(after))})
    v = verdict_of(w)
    plain = diagnose(observation_from_snapshots(parse_snapshot(before), parse_snapshot(after)))
    assert v == plain
    assert "ranks" not in v.to_status()["metrics"]
    assert "straggler" not in v.to_status()["bottleneck"]


def test_text_verdict_shows_the_straggler_and_the_ranks() -> None:
    text = render_text(verdict_of(one_pod(cpu_job(late_loader_ranks()))))
    assert "straggler:  rank 2 (pod trainer-0) · cause Data" in text
    assert "ranks:" in text and "trainer-0" in text


def test_an_unranked_series_with_no_step_in_the_window_is_no_rank_of_the_job() -> None:
    """Totals without a rank that did not move (a launcher, a process that published before it
    knew its rank) must not add an empty rank beside the real ones."""
    text_before, text_after = snapshot_pair(
        cpu_job([Rank(0, collective_ratio=0.3), Rank(1, collective_ratio=0.3)])
    )
    idle = f"{names.STEPS_TOTAL} 10\n"
    found = rank_observations(
        parse_snapshot(text_before + idle), parse_snapshot(text_after + idle), pod="p", elapsed_seconds=60.0
    )
    assert set(found) == {RankId("p", 0), RankId("p", 1)}


@pytest.mark.parametrize(
    ("exposed", "wait", "regime"),
    [
        (0.105, 0.0, None),  # issue 28: just over the screen, compute ~90 %: a suspect
        (0.19, 0.0, None),  # under two screens, the rest (81 %) over four times it: a suspect
        (0.21, 0.0, Regime.COMMUNICATION_BOUND),  # two screens and more: the verdict
        (0.16, 0.25, Regime.INPUT_BOUND),  # both screens: the larger share, the data wait
        (0.3, 0.2, Regime.COMMUNICATION_BOUND),  # both, communication larger
    ],
)
def test_communication_is_the_verdict_only_where_its_term_dominates_and_otherwise_a_named_suspect(
    exposed: float, wait: float, regime: Regime | None
) -> None:
    """The regime by the dominant term (DESIGN.md §1): a crossed screen makes a suspect; the
    verdict is the term that dominates the step, the suspect named in its evidence."""
    ranks = [
        Rank(r, collective_ratio=exposed + 0.05, exposed_ratio=exposed, wait_ratio=wait) for r in range(2)
    ]
    b = verdict_of(one_pod(cpu_job(ranks))).bottleneck
    if regime is None:
        assert b.regime not in (Regime.COMMUNICATION_BOUND, Regime.INPUT_BOUND), b
        assert any("a suspect, not the bottleneck" in e for e in b.evidence), b.evidence
    else:
        assert b.regime is regime, b


@pytest.mark.parametrize(
    ("wait", "exposed", "regime"),
    [
        (0.105, 0.02, Regime.COMPUTE_BOUND),  # just over the screen beside ~87 % compute: a suspect
        (0.19, 0.02, Regime.COMPUTE_BOUND),  # under two screens, the rest (79 %) over four times it
        (0.17, 0.08, Regime.COMPUTE_BOUND),  # with communication under its screen, the rest 75 %
        (0.21, 0.02, Regime.INPUT_BOUND),  # two screens and more: the verdict
        (0.19, 0.09, Regime.INPUT_BOUND),  # the rest (72 %) under four times the wait (76 %)
        (0.45, 0.02, Regime.INPUT_BOUND),  # the data wait dominates the step
    ],
)
def test_data_wait_is_the_verdict_only_where_its_term_dominates_and_otherwise_a_named_suspect(
    wait: float, exposed: float, regime: Regime
) -> None:
    """Two gloo ranks on the CPU (each rank's loader waits ``wait`` of its step): a data wait just
    over its screen beside a dominant compute is a suspect; the CPU's compute is the verdict."""
    ranks = [
        Rank(r, collective_ratio=exposed + 0.05, exposed_ratio=exposed, wait_ratio=wait) for r in range(2)
    ]
    b = verdict_of(one_pod(cpu_job(ranks))).bottleneck
    assert b.regime is regime, b
    suspect = [e for e in b.evidence if e.startswith("data wait") and "a suspect, not the bottleneck" in e]
    assert bool(suspect) is (regime is Regime.COMPUTE_BOUND), b.evidence


@pytest.mark.parametrize(
    ("util", "wait", "regime", "suspect"),
    [
        (0.95, 0.12, Regime.COMPUTE_BOUND, True),  # a fed GPU: the wait is hidden, and named
        (0.95, 0.30, Regime.COMPUTE_BOUND, False),  # hidden by the queue, too large to be a suspect
        (0.50, 0.15, Regime.INPUT_BOUND, False),  # the GPU busy 50 %: under four times the wait
        (0.40, 0.35, Regime.INPUT_BOUND, False),
    ],
)
def test_on_a_gpu_the_data_wait_is_weighed_against_the_gpu_s_busy_time(
    util: float, wait: float, regime: Regime, suspect: bool
) -> None:
    gpus = [{"util": util, "sm": util * 0.95, "tensor": 0.5, "dram": 0.3, "clock": 1.98e9} for _ in range(2)]
    ranks = [Rank(r, collective_ratio=0.04, exposed_ratio=0.02, wait_ratio=wait) for r in range(2)]
    b = verdict_of(one_pod(Job(ranks=ranks, gpus=gpus))).bottleneck
    assert b.regime is regime, b
    assert any(e.startswith("data wait") and "a suspect" in e for e in b.evidence) is suspect, b.evidence
