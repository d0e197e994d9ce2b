"""Checkpoint-bound across ranks: "rank 0 saves, the others wait at a barrier".

The ranks' figures come as the real sidecar publishes them (tests/unit/diagnosis/snapshots.py):
per rank, the checkpoint badput (``dam_badput_seconds_total{cause="checkpoint"}``, 0 for a rank
that can save but did not), the saves, the collective and exposed collective seconds; the window,
the pods and the ranks are read back by ``window.job_window`` as in a run.
"""

from __future__ import annotations

import pytest

from dam_operator.diagnosis.axes import Kind
from dam_operator.diagnosis.model import Axis, Observation, Regime
from tests.unit.diagnosis.snapshots import Job, Rank
from tests.unit.diagnosis.test_ranks import cpu_job, one_pod, verdict_of

WINDOW = 60.0  # seconds, 120 steps of 0.5 s (snapshots.Job's defaults)


def saver_and_waiters(saves: float, comm: float, waiters: int = 1, checkpoints: float = 6.0) -> Job:
    """Rank 0 blocks ``saves`` of the window in checkpoint saves; every rank spends ``comm`` of its
    step in exposed communication of its own, and the others also wait for rank 0 in the barrier
    while it saves (their exposed share: ``comm + saves``)."""
    ranks = [
        Rank(
            0,
            collective_ratio=comm + 0.01,
            exposed_ratio=comm,
            checkpoint_ratio=saves,
            checkpoints=checkpoints,
        )
    ]
    ranks += [
        Rank(r, collective_ratio=comm + saves + 0.01, exposed_ratio=comm + saves, checkpoint_ratio=0.0)
        for r in range(1, waiters + 1)
    ]
    return cpu_job(ranks)


def test_rank_0_saving_while_rank_1_waits_at_a_barrier_is_checkpoint_bound_not_communication() -> None:
    w = one_pod(saver_and_waiters(saves=0.30, comm=0.03))
    # Rank 1's own figures read as heavy communication: a third of its step in a collective.
    assert w.ranks[next(k for k in w.ranks if k.rank == 1)].exposed_communication_ratio == pytest.approx(0.33)
    b = verdict_of(w).bottleneck
    assert (b.regime, b.axis, b.boundary) == (Regime.CHECKPOINT_BOUND, Axis.MACHINE, Axis.DATA)
    assert b.lever == "async-checkpoint"  # one save every 20 steps: not too often, make it async
    assert (
        "rank 1 (pod trainer-0) waits 19.8 s in collectives while rank 0 (pod trainer-0) saves 18.0 s: "
        "18.0 s of that wait" in " ".join(b.evidence)
    )
    records = [r for r in b.records() if r.kind is Kind.CHECKPOINT and "in collectives while" in r.sentence]
    assert records and records[0].numbers["waited_seconds"] == pytest.approx(0.30 * WINDOW)
    # Rank 0 arrives last at the barrier because it saves: the straggler's cause is its saves.
    s = b.straggler
    assert s is not None and (s.rank, s.cause) == (0, Axis.MACHINE)
    assert any("its checkpoint saves block it 150.0 ms per step of the 150.0 ms gap" in e for e in s.evidence)


def test_several_waiting_ranks_are_counted_once_each_in_the_median() -> None:
    b = verdict_of(one_pod(saver_and_waiters(saves=0.25, comm=0.02, waiters=3))).bottleneck
    assert b.regime is Regime.CHECKPOINT_BOUND
    line = next(e for e in b.evidence if "in collectives while" in e)
    assert line.startswith("the 3 other ranks wait (median) 16.2 s in collectives while rank 0")


@pytest.mark.parametrize(
    ("saves", "comm", "regime"),
    [
        (0.30, 0.03, Regime.CHECKPOINT_BOUND),  # far on the checkpoint side
        (0.12, 0.11, Regime.CHECKPOINT_BOUND),  # the communication a suspect beside 77 % compute
        (0.20, 0.19, Regime.CHECKPOINT_BOUND),  # near: both verdicts, the saves 1 point larger
        (0.15, 0.19, Regime.COMMUNICATION_BOUND),  # near, the other side: the communication larger
        (0.11, 0.25, Regime.COMMUNICATION_BOUND),  # far on the communication side
    ],
)
def test_rank_0_saving_is_checkpoint_or_communication_bound_by_the_larger_loss_not_by_the_waiters(
    saves: float, comm: float, regime: Regime
) -> None:
    """The waiters' exposed share (``comm + saves``) would always beat the saves: what is compared
    with the saves is the communication the saver itself spends (skew-corrected), and the wait
    for the saves is the checkpoint's."""
    b = verdict_of(one_pod(saver_and_waiters(saves, comm))).bottleneck
    assert b.regime is regime, b
    if (saves, comm) == (0.12, 0.11):
        assert any(
            e.startswith("exposed communication 11.0% of the step crossed its screen") for e in b.evidence
        )


def test_a_least_waiting_rank_that_waits_for_the_saver_counts_that_wait_as_the_checkpoint_s() -> None:
    """Rank 1 computes slower (rank 0 waits 25 % of its step for it), rank 0 saves 20 % of the
    window (rank 1 waits for it): rank 1 waits least, and most of its exposed 25 % is the save.
    Taken out, its own communication is 5 %: the saves are the larger loss."""
    ranks = [
        Rank(0, collective_ratio=0.32, exposed_ratio=0.30, checkpoint_ratio=0.20, checkpoints=6),
        Rank(1, collective_ratio=0.27, exposed_ratio=0.25, checkpoint_ratio=0.0),
    ]
    v = verdict_of(one_pod(cpu_job(ranks)))
    assert v.bottleneck.regime is Regime.CHECKPOINT_BOUND, v.bottleneck
    assert v.metrics.exposed_communication_ratio == pytest.approx(0.05)
    assert any(
        "rank 1 (pod trainer-0) waits 15.0 s in collectives while rank 0 (pod trainer-0) saves 12.0 s: 12.0 s"
        in e
        for e in v.bottleneck.evidence
    )


def test_ranks_that_all_save_their_own_shard_wait_for_no_saver() -> None:
    ranks = [
        Rank(r, collective_ratio=0.05, exposed_ratio=0.04, checkpoint_ratio=0.25, checkpoints=6)
        for r in range(2)
    ]
    b = verdict_of(one_pod(cpu_job(ranks))).bottleneck
    assert b.regime is Regime.CHECKPOINT_BOUND
    assert not any("in collectives while" in e for e in b.evidence)
    assert b.straggler is None


def test_saves_outside_the_steps_are_weighed_against_the_data_wait_on_the_same_wall_time() -> None:
    """The loop covers half the window (30 s of steps); a data wait of 30 % of the step is 9 s, the
    saves 20 % of the window 12 s: the saves are the larger loss, though 30 % > 20 %."""
    obs = Observation(
        window_seconds=60.0,
        steps=120.0,
        mean_step_seconds=0.25,
        gpu_count=0,
        main_cpu_cores=1.0,
        data_wait_ratio=0.30,
        checkpoint_seconds=12.0,
        checkpoint_ratio=0.20,
        checkpoints=2.0,
    )
    from dam_operator.diagnosis.engine import diagnose

    assert diagnose(obs).bottleneck.regime is Regime.CHECKPOINT_BOUND
    covered = obs.model_copy(update={"mean_step_seconds": 0.5})  # the loop runs the whole window
    assert diagnose(covered).bottleneck.regime is Regime.INPUT_BOUND
