"""Goodput over a job's life, the checkpoint-bound rule, and FLOPs per step with their source."""

from __future__ import annotations

from typing import Any

import pytest

from dam_contract.snapshot import Snapshot, parse_snapshot
from dam_operator.diagnosis.engine import diagnose
from dam_operator.diagnosis.goodput import ProcessLife, Restarts, goodput_of, restarts_of
from dam_operator.diagnosis.model import Axis, Hardware, Observation, Regime, Thresholds
from dam_operator.diagnosis.render import render_goodput
from dam_operator.diagnosis.window import observation_from_snapshots


def _snap(text: str, t: float = 0.0) -> Snapshot:
    return parse_snapshot(text, "<test>", t or None)


def _process(rank: str, good: float, lost: tuple[float, float, float, float, float]) -> str:
    startup, wait, comm, ckpt, other = lost
    r = f',rank="{rank}"' if rank else ""
    lines = [f"dam_goodput_seconds_total{{{r[1:]}}} {good}"]
    for cause, v in (
        ("startup", startup),
        ("data-wait", wait),
        ("communication", comm),
        ("checkpoint", ckpt),
        ("other", other),
    ):
        lines.append(f'dam_badput_seconds_total{{cause="{cause}"{r}}} {v}')
    return "\n".join(lines) + "\n"


def test_goodput_is_productive_over_elapsed_with_every_cause() -> None:
    g = goodput_of(_snap(_process("", 60, (10, 15, 0, 10, 5))), accelerators=1)
    assert g is not None
    assert g.elapsed_seconds == pytest.approx(100)
    assert g.ratio == pytest.approx(0.6)
    assert g.badput_seconds.startup == 10 and g.badput_seconds.data_wait == 15
    assert g.badput_seconds.checkpoint == 10 and g.badput_seconds.other == 5
    assert g.badput_seconds.restart == 0.0
    assert g.accelerator_seconds_lost == pytest.approx(40)
    doc = g.model_dump(by_alias=True, mode="json")
    assert set(doc) == {
        "ratio",
        "elapsedSeconds",
        "productiveSeconds",
        "badputSeconds",
        "acceleratorSecondsLost",
        "measured",
        "ratioUpperBound",
        "restarts",
    }
    assert doc["restarts"] is None  # without the processes' lives (dam evaluate): not known
    assert doc["measured"] == ["startup", "dataWait", "communication", "checkpoint", "other"]
    assert doc["ratioUpperBound"] is False
    assert set(doc["badputSeconds"]) == {
        "startup",
        "dataWait",
        "communication",
        "checkpoint",
        "restart",
        "other",
    }


def test_ranks_are_averaged_and_accelerators_multiply_the_loss() -> None:
    text = _process("0", 80, (10, 5, 5, 0, 0)) + _process("1", 60, (10, 25, 5, 0, 0))
    g = goodput_of(_snap(text), accelerators=2)
    assert g is not None
    assert g.elapsed_seconds == pytest.approx(100)  # one wall clock, not two
    assert g.productive_seconds == pytest.approx(70)
    assert g.accelerator_seconds_lost == pytest.approx(60)  # 30 s lost × 2 GPUs


def test_no_goodput_without_the_probe_s_counters_and_unknown_accelerators_stay_unknown() -> None:
    assert goodput_of(_snap("dam_steps_total 10\n")) is None
    g = goodput_of(_snap(_process("", 1, (1, 0, 0, 0, 0))))
    assert g is not None and g.accelerator_seconds_lost is None
    assert "acceleratorSecondsLost" not in g.model_dump(by_alias=True, exclude_none=True)


def _window(ckpt_before: float, ckpt_after: float, saves: float, wait: float = 0.5) -> Observation:
    before = _snap(
        "dam_steps_total 0\ndam_step_seconds_total 0\ndam_dataloader_wait_seconds_total 0\n"
        'dam_badput_seconds_total{cause="checkpoint"} ' + f"{ckpt_before}\ndam_checkpoints_total 0\n",
        1000.0,
    )
    after = _snap(
        "dam_steps_total 100\ndam_step_seconds_total 20\n"
        f"dam_dataloader_wait_seconds_total {wait}\n"
        f'dam_badput_seconds_total{{cause="checkpoint"}} {ckpt_after}\ndam_checkpoints_total {saves}\n'
        'dam_model_flops_per_step{source="measured"} 1e9\n'
        'dam_process_cpu_seconds_total{role="main"} 18\n',
        1020.0,
    )
    return observation_from_snapshots(before, after)


def test_checkpoint_saves_that_dominate_are_checkpoint_bound_with_async_checkpoint() -> None:
    obs = _window(0, 8, 4)
    assert obs.checkpoint_ratio == pytest.approx(0.4)
    assert obs.checkpoints == 4 and obs.flops_per_step_source == "measured"
    v = diagnose(obs)
    b = v.bottleneck
    assert (b.regime, b.axis, b.boundary, b.lever) == (
        Regime.CHECKPOINT_BOUND,
        Axis.MACHINE,
        Axis.DATA,
        "async-checkpoint",
    )
    assert "faster-accelerator" in b.avoid and "more-loader-workers" in b.avoid
    assert b.evidence[0].startswith("checkpoint saves blocked the training thread 40.0% of the window")
    assert "one every 25 steps" in b.evidence[1]
    assert v.metrics.checkpoint_ratio == pytest.approx(0.4)
    assert v.metrics.flops_per_step == 1e9 and v.metrics.flops_per_step_source == "measured"


def test_saving_every_few_steps_says_save_less_often() -> None:
    v = diagnose(_window(0, 8, 50))
    assert v.bottleneck.regime is Regime.CHECKPOINT_BOUND and v.bottleneck.lever == "checkpoint-less-often"


def test_saves_under_the_screen_or_behind_a_larger_data_wait_are_not_the_verdict() -> None:
    assert diagnose(_window(0, 1, 4)).bottleneck.regime is not Regime.CHECKPOINT_BOUND  # 5 %
    data = diagnose(_window(0, 3, 4, wait=12))  # 15 % saving, 60 % waiting
    assert data.bottleneck.regime is Regime.INPUT_BOUND
    assert diagnose(_window(0, 3, 4), Thresholds(checkpoint_suspect=0.2)).bottleneck.regime is not (
        Regime.CHECKPOINT_BOUND
    )


def test_a_cpu_only_job_gets_an_mfu_against_the_peak_its_user_gave() -> None:
    obs = Observation(steps=100, window_seconds=10, gpu_count=0, flops_per_step=2e9, data_wait_ratio=0.0)
    assert diagnose(obs).metrics.mfu is None
    mfu = diagnose(obs, hardware=Hardware(peak_flops=1e11)).metrics.mfu
    assert mfu == pytest.approx(2e9 * 10 / 1e11)


def test_the_breakdown_reads_at_a_glance_one_bar_and_a_line_per_cause() -> None:
    from dam_operator.diagnosis.render import GOODPUT_BAR_WIDTH, render_goodput

    g = goodput_of(_snap(_process("", 60, (10, 15, 0, 10, 5))), accelerators=1)
    assert g is not None
    text = render_goodput(g)
    lines = text.splitlines()
    assert lines[0] == "goodput:    60.0% of 100.0 s productive"
    bar = lines[1].strip()[1:-1]
    assert len(bar) == GOODPUT_BAR_WIDTH and bar.count("█") == 30 and bar.count("k") == 5
    assert "  k checkpoint        10.0 s  10.0%" in lines
    assert not any("restart" in line or "communication" in line for line in lines)  # none lost there
    assert lines[-1] == "  accelerator-seconds lost: 40.0"


def test_a_job_of_several_pods_is_checkpoint_bound_by_its_longest_saver() -> None:
    from dam_operator.diagnosis.window import aggregate

    saver, other = _window(0, 8, 4), _window(0, 1, 4)
    job = aggregate({"trainer-0": saver, "trainer-1": other})
    assert job.checkpoint_ratio == pytest.approx(0.4) and job.checkpoints == 4
    assert job.flops_per_step_source == "measured"
    assert diagnose(job).bottleneck.regime is Regime.CHECKPOINT_BOUND


def test_a_cause_one_process_could_not_measure_is_absent_and_the_ratio_an_upper_bound() -> None:
    """Rank 1's collectives were not timed (its communication series is absent): the job's
    communication is unknown, not 0 (nor rank 0's figure alone), and the ratio may be lower."""
    rank0 = _process("0", 60, (10, 15, 8, 0, 7))
    rank1 = (
        "\n".join(
            line for line in _process("1", 68, (10, 15, 0, 0, 7)).splitlines() if "communication" not in line
        )
        + "\n"
    )
    g = goodput_of(_snap(rank0 + rank1), accelerators=1)
    assert g is not None
    assert g.badput_seconds.communication is None
    assert g.ratio_upper_bound is True
    assert g.measured is not None and "communication" not in g.measured and "checkpoint" in g.measured
    doc = g.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert "communication" not in doc["badputSeconds"]
    # Elapsed is what was measured: productive plus the measured causes, per process.
    assert g.elapsed_seconds == pytest.approx((60 + 68) / 2 + 10 + 15 + 0 + 7)
    text = render_goodput(g)
    assert "an upper bound: communication not measured" in text, text


# -- restarts inside one command and the wait behind a peer's save (issue 28 items 3, 4) --------


def _life(rank: int | None, start: float, end: float, **kw: Any) -> ProcessLife:
    figures: dict[str, Any] = {
        "startup_seconds": 2.0,
        "productive_seconds": 10.0,
        "steps": 100,
        "steps_since_checkpoint": None,
        "saved": False,
    }
    figures.update(kw)
    return ProcessLife(rank, start, end, **figures)


def test_a_restart_inside_the_command_costs_downtime_startup_and_progress_since_the_job_s_save() -> None:
    lives = [
        # attempt 0: rank 0 saved 20 steps before the failure, rank 1 never saves (every step since)
        _life(0, 0.0, 30.0, steps_since_checkpoint=20, saved=True),
        _life(1, 0.0, 29.8, steps_since_checkpoint=100, saved=False),
        # attempt 1: both restarted by torchrun, 1.5 s after the last of them ended
        _life(0, 31.5, 60.0, startup_seconds=3.0, steps_since_checkpoint=0, saved=True),
        _life(1, 31.5, 60.0, startup_seconds=3.5, steps_since_checkpoint=80, saved=False),
    ]
    r = restarts_of(lives)
    assert r.count == 1
    assert r.startup_seconds == pytest.approx(6.5)
    # each dead process redid 20 of its 100 steps at 0.1 productive s a step: 2 s each
    assert r.lost_seconds == pytest.approx(4.0)
    assert r.restart_seconds == pytest.approx((1.5 + 3.0 + 2.0) + (1.7 + 3.5 + 2.0))


def test_without_any_save_a_restart_redoes_every_step_and_side_by_side_processes_are_no_restart() -> None:
    r = restarts_of([_life(3, 0.0, 10.0, steps_since_checkpoint=100), _life(3, 12.0, 20.0)])
    assert (r.count, r.lost_seconds) == (1, pytest.approx(10.0))
    assert r.restart_seconds == pytest.approx(2.0 + 2.0 + 10.0)
    side_by_side = restarts_of([_life(0, 0.0, 10.0), _life(0, 1.0, 10.0), _life(1, 0.0, 5.0)])
    assert side_by_side == Restarts()


def test_one_unranked_program_after_another_is_no_restart() -> None:
    # `dam run -- sh -c "python prep.py && python train.py"`: cannot be told from a retry
    r = restarts_of([_life(None, 0.0, 10.0, steps_since_checkpoint=100), _life(None, 12.0, 20.0)])
    assert r == Restarts()


def test_goodput_moves_a_restart_from_startup_and_productive_to_restart() -> None:
    text = _process("0", 20, (5, 1, 1, 1, 0)) + _process("1", 20, (5, 1, 1, 1, 0))
    lives = [
        _life(
            0,
            0.0,
            10.0,
            startup_seconds=2.0,
            productive_seconds=12.0,
            steps=60,
            steps_since_checkpoint=10,
            saved=True,
        ),
        _life(
            1, 0.0, 10.0, startup_seconds=2.0, productive_seconds=12.0, steps=60, steps_since_checkpoint=60
        ),
        _life(0, 11.0, 20.0, startup_seconds=3.0, productive_seconds=8.0, steps=40),
        _life(1, 11.0, 20.0, startup_seconds=3.0, productive_seconds=8.0, steps=40),
    ]
    plain = goodput_of(_snap(text))
    g = goodput_of(_snap(text), lives=lives)
    none = goodput_of(_snap(text), lives=[])
    assert plain is not None and g is not None and none is not None
    assert none.restarts == 0 and none.badput_seconds == plain.badput_seconds
    assert (plain.restarts, g.restarts) == (None, 1)  # without the lives: not known
    assert g.badput_seconds.startup == pytest.approx(2.0)
    assert g.productive_seconds == pytest.approx(18.0)  # 10 steps of 0.2 s redone
    assert g.badput_seconds.restart == pytest.approx(1.0 + 3.0 + 2.0)
    assert g.elapsed_seconds == pytest.approx(plain.elapsed_seconds + 1.0)  # the downtime


def test_a_rank_s_wait_behind_a_peer_s_save_is_checkpoint_not_communication() -> None:
    # rank 0 saved for 6 s; rank 1 waited 6.5 s in collectives, 6 of them behind the save
    text = _process("0", 50, (5, 1, 0.5, 6, 0)) + _process("1", 50, (5, 1, 6.5, 0, 0))
    g = goodput_of(_snap(text))
    assert g is not None
    assert g.badput_seconds.checkpoint == pytest.approx(6.0)
    assert g.badput_seconds.communication == pytest.approx(0.5)
    # at most a rank's communication moves; the elapsed time stays
    short = goodput_of(_snap(_process("0", 50, (5, 1, 0, 6, 0)) + _process("1", 50, (5, 1, 2, 0, 0))))
    assert short is not None and short.badput_seconds.checkpoint == pytest.approx((6 + 2) / 2)
    assert short.badput_seconds.communication == 0.0
    assert short.elapsed_seconds == pytest.approx((62 + 58) / 2)
