"""`dam tune`'s pure parts: noise, the keep rule, the hill climb, the CPU bound, the measurement window.

The ladders and the one climb ``dam tune`` shares with the operator's Apply mode are tested in
tests/unit/diagnosis/test_apply_levers.py."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from collections.abc import Callable

import pytest

from dam_contract import names
from dam_contract.snapshot import Sample, Snapshot
from dam_operator.diagnosis.model import Axis, Bottleneck, Regime, Verdict, WindowMetrics
from dam_operator.local.tune import (
    MIN_GAIN,
    NUM_WORKERS,
    MeasureError,
    Measurement,
    Settings,
    cpu_bound,
    interval_rates,
    judge,
    measurement_from,
    paste_lines,
    standard_error,
    tune,
    window_points,
)
from dam_probe.overrides import parse_overrides


def test_interval_rates_are_steps_per_second_of_each_interval() -> None:
    assert interval_rates([(0.0, 0.0), (0.5, 10.0), (1.0, 30.0)]) == [20.0, 40.0]
    assert interval_rates([(0.0, 0.0)]) == []


def test_standard_error_is_the_sample_deviation_over_root_n() -> None:
    rates = [10.0, 12.0, 14.0, 16.0]
    assert standard_error(rates) == pytest.approx(math.sqrt(20 / 3) / 2)
    assert standard_error([10.0]) is None


def test_a_gain_beyond_twice_the_standard_error_of_the_difference_is_kept() -> None:
    kept, why = judge(60.0, 1.0, 30.0, 1.0)
    assert kept
    assert "+100.0%" in why and "beyond the noise" in why


def test_a_gain_within_the_noise_is_not_kept() -> None:
    # 2 × √(3² + 4²) = 10 steps/s of noise; a gain of 8 is within it.
    kept, why = judge(108.0, 3.0, 100.0, 4.0)
    assert not kept
    assert "within the noise (±10.00 steps/s)" in why


def test_a_gain_beyond_the_noise_but_below_the_minimum_is_not_kept() -> None:
    kept, why = judge(100.0 * (1 + MIN_GAIN / 2), 0.01, 100.0, 0.01)
    assert not kept
    assert "less than the 5% worth a change" in why


def test_a_loss_is_never_kept_and_a_clear_one_is_called_slower() -> None:
    kept, why = judge(20.0, 0.1, 30.0, 0.1)
    assert not kept
    assert "slower" in why
    assert "within the noise" in judge(29.9, 1.0, 30.0, 1.0)[1]


@pytest.mark.parametrize(
    ("affinity", "limit", "expected"),
    [(8, None, 8), (8, 2.0, 2), (8, 1.5, 2), (2, 4.0, 2), (None, None, 1), (None, 3.0, 3), (4, 0.2, 1)],
)
def test_cpu_bound_is_the_smaller_of_affinity_and_the_cgroup_limit(
    affinity: int | None, limit: float | None, expected: int
) -> None:
    assert cpu_bound(affinity, limit) == expected


def test_paste_lines_give_the_code_and_a_variable_the_probe_accepts() -> None:
    lines = paste_lines({"num_workers": 2, "prefetch_factor": 4})
    assert "    DataLoader(dataset, ..., num_workers=2, prefetch_factor=4)" in lines
    env_line = next(line for line in lines if "export DAM_LOADER_OVERRIDES=" in line)
    value = env_line.split("=", 1)[1].strip("'")
    parsed = parse_overrides(value)
    assert (parsed.num_workers, parsed.prefetch_factor) == (2, 4)


# --- measurements from snapshots ------------------------------------------------------------


def snap(steps: float, wait_s: float, step_s: float, workers: int = 0) -> Snapshot:
    return Snapshot(
        [
            Sample(names.STEPS_TOTAL, (), steps),
            Sample(names.DATALOADER_WAIT_SECONDS_TOTAL, (), wait_s),
            Sample(names.STEP_SECONDS_TOTAL, (), step_s),
            Sample(names.PROCESSES, (("role", names.ROLE_WORKER),), workers),
        ]
    )


def run_points(
    rate: float, wait: float, seconds: float, start_at: float = 1.0, dt: float = 0.5
) -> list[tuple[float, Snapshot]]:
    points = []
    t = 0.0
    while t <= seconds + 1e-9:
        trained = max(0.0, t - start_at)
        points.append((t, snap(rate * trained, wait * trained, trained)))
        t += dt
    return points


def test_the_window_starts_after_the_warmup_that_follows_the_first_step() -> None:
    points = run_points(20.0, 0.9, 10.0, start_at=1.0)
    window, note = window_points(points, warmup_seconds=2.0)
    assert note is None
    assert window[0][0] >= 1.5 + 2.0  # first snapshot showing a step is at 1.5 s
    m = measurement_from({}, window, run_seconds=10.0)
    assert m.steps_per_second == pytest.approx(20.0)
    assert m.data_wait_ratio == pytest.approx(0.9)
    assert m.regime is Regime.INPUT_BOUND
    assert m.worker_count == 0


def test_two_synchronous_ranks_are_measured_at_the_jobs_rate_not_their_sum() -> None:
    def ranks(t: float) -> Snapshot:
        return Snapshot(
            [Sample(names.STEPS_TOTAL, ((names.RANK_LABEL, r),), 10.0 * t) for r in ("0", "1")]
            + [Sample(names.STEP_SECONDS_TOTAL, ((names.RANK_LABEL, r),), t) for r in ("0", "1")]
        )

    m = measurement_from({}, [(float(t), ranks(float(t))) for t in range(1, 7)], run_seconds=6.0)
    assert m.steps_per_second == pytest.approx(10.0)
    assert m.doc()["stepsPerSecond"] == pytest.approx(10.0)


def test_a_run_that_ends_during_the_warmup_is_measured_from_its_first_step_and_says_so() -> None:
    points = run_points(20.0, 0.9, 3.0, start_at=1.0)
    window, note = window_points(points, warmup_seconds=5.0)
    assert note is not None and "warm-up" in note
    assert window[0][0] < 1.5


# --- the climb, with a fake runner ----------------------------------------------------------


def verdict(regime: Regime, lever: str = "increase-dataloader-workers") -> Verdict:
    axis = Axis.DATA if regime is Regime.INPUT_BOUND else Axis.MACHINE
    return Verdict(
        bottleneck=Bottleneck(
            axis=axis,
            regime=regime,
            lever=lever,
            lever_detail="detail",
            confidence=0.8,
            evidence=["evidence one"],
        ),
        metrics=WindowMetrics(),
    )


class FakeRunner:
    """Steps/s as a function of the settings; a fixed run time against a budget."""

    def __init__(
        self,
        rate: Callable[[Settings], float],
        *,
        regime: Callable[[Settings], Regime] = lambda _s: Regime.INPUT_BOUND,
        lever: str = "increase-dataloader-workers",
        budget: float = 1000.0,
        run_seconds: float = 10.0,
        workers_seen: Callable[[Settings], int] | None = None,
    ) -> None:
        self.args = argparse.Namespace(budget=budget, warmup=1.0, window=4.0)
        self.rate, self.regime, self.lever = rate, regime, lever
        self.spent = 0.0
        self.run_seconds = run_seconds
        self.workers_seen = workers_seen or (lambda s: s.get(NUM_WORKERS, 0))
        self.runs: list[Settings] = []

    def say(self, text: str) -> None:
        pass

    def measure(self, settings: Settings, baseline: Settings) -> Measurement:
        self.runs.append(dict(settings))
        self.spent += self.run_seconds
        return Measurement(
            settings=dict(settings),
            steps_per_second=self.rate(settings),
            data_wait_ratio=0.9,
            standard_error=0.5,
            intervals=8,
            window_seconds=4.0,
            verdict=verdict(self.regime(settings), self.lever),
            worker_count=self.workers_seen(settings),
            run_seconds=self.run_seconds,
        )

    def remaining(self) -> float:
        return float(self.args.budget) - self.spent

    def probe_messages(self) -> list[str]:
        return ["dam-probe: DataLoader at train.py:9: overrides not applied: IterableDataset"]


def sleeping_loader(settings: Settings) -> float:
    """A loader that sleeps: one worker overlaps nothing useful, each further worker adds speed."""
    w = settings.get(NUM_WORKERS, 0)
    return 25.0 * max(1, w)


def test_a_starved_loader_climbs_past_one_worker_to_the_cpu_bound_then_tries_prefetch() -> None:
    runner = FakeRunner(sleeping_loader)
    result = tune(runner, bound=2)
    assert [t.measurement.settings for t in result.trials] == [
        {"num_workers": 1},
        {"num_workers": 2},
        {"num_workers": 2, "prefetch_factor": 4},
    ]
    assert [t.kept for t in result.trials] == [False, True, False]
    assert result.applied == {"num_workers": 2}
    assert result.best is not None and result.best.steps_per_second == 50.0
    assert "num_workers at the CPU bound (2 CPUs" in result.reason
    assert "prefetch_factor 4 gained nothing" in result.reason
    assert "standard error" in result.reason, "the reason says how noise is judged"


def test_the_climb_stops_at_the_first_step_that_gains_nothing() -> None:
    runner = FakeRunner(lambda s: {0: 10.0, 1: 20.0, 2: 30.0, 4: 30.2}.get(s.get(NUM_WORKERS, 0), 0.0))
    result = tune(runner, bound=16)
    workers = [t.measurement.settings.get(NUM_WORKERS) for t in result.trials]
    assert workers[:4] == [1, 2, 4, 2], "4 gained nothing: prefetch next, from the best (2 workers)"
    assert result.trials[3].measurement.settings == {"num_workers": 2, "prefetch_factor": 4}
    assert result.applied == {"num_workers": 2}


def test_a_job_that_is_not_input_bound_is_never_changed_and_the_reason_says_why() -> None:
    runner = FakeRunner(lambda _s: 10.0, regime=lambda _s: Regime.COMPUTE_BOUND)
    result = tune(runner, bound=8)
    assert runner.runs == [{}], "only the baseline ran"
    assert result.trials == [] and result.applied == {}
    assert "compute-bound" in result.reason and "not input-bound" in result.reason


def test_an_input_bound_job_whose_lever_is_not_a_loader_setting_is_not_changed() -> None:
    result = tune(FakeRunner(lambda _s: 10.0, lever="raise-cpu-limit"), bound=8)
    assert result.trials == [] and result.applied == {}
    assert "raise-cpu-limit" in result.reason


def test_the_budget_stops_the_climb_before_a_run_that_would_not_fit() -> None:
    runner = FakeRunner(sleeping_loader, budget=25.0, run_seconds=10.0)
    result = tune(runner, bound=8)
    assert len(runner.runs) == 2, "baseline + one trial fit in 25 s of 10 s runs"
    assert "budget (25 s) is spent" in result.reason


def test_a_job_no_longer_input_bound_stops_the_climb() -> None:
    runner = FakeRunner(
        sleeping_loader,
        regime=lambda s: Regime.COMPUTE_BOUND if s.get(NUM_WORKERS, 0) >= 2 else Regime.INPUT_BOUND,
    )
    result = tune(runner, bound=8)
    assert [t.measurement.settings.get(NUM_WORKERS) for t in result.trials] == [1, 2]
    assert "no longer input-bound" in result.reason


def test_an_override_the_probe_refused_stops_with_the_probes_message() -> None:
    result = tune(FakeRunner(sleeping_loader, workers_seen=lambda _s: 0), bound=8)
    assert result.applied == {}
    assert "could not set num_workers=1" in result.reason and "IterableDataset" in result.reason


def test_a_baseline_that_cannot_be_measured_is_reported() -> None:
    class Failing(FakeRunner):
        def measure(self, settings: Settings, baseline: Settings) -> Measurement:
            raise MeasureError("the command failed (exit 1)")

    result = tune(Failing(sleeping_loader), bound=8)
    assert result.baseline is None and "no baseline: the command failed" in result.reason
    assert result.doc()["baseline"] is None


def test_json_has_exactly_the_documented_shape() -> None:
    doc = tune(FakeRunner(sleeping_loader), bound=2).doc()
    assert set(doc) == {"baseline", "trials", "best", "applied", "reason"}
    assert set(doc["baseline"]) == {"settings", "stepsPerSecond", "dataWaitRatio"}
    assert set(doc["best"]) == {"settings", "stepsPerSecond", "dataWaitRatio"}
    assert all(set(t) == {"settings", "stepsPerSecond", "dataWaitRatio", "kept"} for t in doc["trials"])
    assert doc["applied"] == {"num_workers": 2}
    json.dumps(doc)  # serialisable


def test_a_switch_lever_is_tried_once_with_the_workers_it_needs_and_its_end_reads_as_such() -> None:
    # enable-pin-memory climbs its own setting (the table's chain), only with a GPU and never twice.
    runner = FakeRunner(lambda s: 30.0 if s.get("pin_memory") else 20.0, lever="enable-pin-memory")
    result = tune(runner, bound=4)
    assert result.trials == [] and "pin_memory not tried: it needs a GPU" in result.reason
    gpu_runner = GpuRunner(lambda s: 30.0 if s.get("pin_memory") else 20.0, lever="enable-pin-memory")
    result = tune(gpu_runner, bound=4)
    assert [t.measurement.settings for t in result.trials] == [{"num_workers": 0, "pin_memory": True}]
    assert result.applied == {"pin_memory": True}
    assert "pin_memory at True, the end of its ladder" in result.reason


class GpuRunner(FakeRunner):
    def measure(self, settings: Settings, baseline: Settings) -> Measurement:
        return dataclasses.replace(super().measure(settings, baseline), gpu_count=1)
