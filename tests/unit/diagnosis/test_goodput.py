"""Goodput over a job's life, the checkpoint-bound rule, and FLOPs per step with their source."""

from __future__ import annotations

import pytest

from dam_contract.snapshot import Snapshot, parse_snapshot
from dam_operator.diagnosis.engine import diagnose
from dam_operator.diagnosis.goodput import goodput_of
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
    }
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
