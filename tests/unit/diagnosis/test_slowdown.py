"""The slowdown detector (dam_operator.diagnosis.slowdown): windows in, status.progress.slowdown out."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dam_operator.diagnosis.slowdown import Slowdown, SlowdownSettings, SlowdownTracker, WindowFigures

KEY = "gen-1/template-aaa"
WARMUP = SlowdownSettings().warmup_windows
STEADY = 10.0
HEALTHY_SIGNALS = {"data wait": 0.05, "exposed communication": 0.10, "checkpoint": 0.02}
HEALTHY_RANKS = {"rank 0": 0.20, "rank 1": 0.21, "rank 2": 0.20, "rank 3": 0.21}


def at(i: int) -> str:
    return f"2026-01-02T03:{i // 60:02d}:{i % 60:02d}Z"


def window(
    rate: float | None,
    signals: Mapping[str, float] | None = None,
    ranks: Mapping[str, float] | None = None,
) -> WindowFigures:
    return WindowFigures(
        steps_per_second=rate,
        signals=HEALTHY_SIGNALS if signals is None else signals,
        rank_step_seconds=HEALTHY_RANKS if ranks is None else ranks,
    )


class Job:
    """A tracker fed one window at a time, with the window's time and key."""

    def __init__(self, tracker: SlowdownTracker | None = None) -> None:
        self.tracker = tracker or SlowdownTracker()
        self.i = 0
        self.key = KEY

    def feed(self, figures: WindowFigures) -> tuple[Slowdown | None, bool]:
        self.i += 1
        return self.tracker.update(figures, at(self.i), self.key)

    def run(self, windows: Iterable[WindowFigures]) -> list[tuple[Slowdown | None, bool]]:
        return [self.feed(w) for w in windows]


def steady_job(windows: int = WARMUP + 6) -> Job:
    job = Job()
    answers = job.run([window(STEADY)] * windows)
    assert all(a == (None, False) for a in answers)
    return job


def test_a_steady_job_never_slows() -> None:
    job = Job()
    answers = job.run(window(STEADY * f) for f in [0.5, 0.6] + [1.0, 0.97, 1.03, 0.95, 1.05] * 10)
    assert all(a == (None, False) for a in answers)


def test_a_40_percent_drop_is_reported_at_the_third_window_not_the_second() -> None:
    job = steady_job()
    first, second = job.feed(window(6.0)), job.feed(window(6.0))
    assert first == (None, False) and second == (None, False)
    first_slow = at(job.i - 1)
    slowdown, changed = job.feed(window(6.0))
    assert changed and slowdown is not None
    assert slowdown.since == first_slow
    assert slowdown.evidence[0] == "steps/s 10 -> 6 (60 % of the job's baseline) for 3 windows"
    assert slowdown.model_dump(by_alias=True).keys() == {"since", "ratio", "evidence"}
    later, changed = job.feed(window(6.0))
    assert later is not None and not changed and later.since == first_slow
    assert later.evidence[0].endswith("for 4 windows")


def test_ratio_is_the_current_rate_over_the_baseline() -> None:
    job = steady_job()
    answers = job.run([window(6.5), window(5.0), window(4.2)])
    slowdown = answers[-1][0]
    assert slowdown is not None and slowdown.ratio == 0.42
    slowdown, changed = job.feed(window(7.75))  # back between the lines: still slow, not a change
    assert slowdown is not None and not changed and slowdown.ratio == 0.775


def test_a_20_percent_drop_is_not_a_slowdown() -> None:
    job = steady_job()
    assert all(a == (None, False) for a in job.run([window(8.0)] * 10))


def test_a_drop_for_two_windows_then_recovery_is_not_a_slowdown() -> None:
    job = steady_job()
    answers = job.run([window(5.0), window(5.0), window(STEADY), window(5.0), window(5.0), window(STEADY)])
    assert all(a == (None, False) for a in answers)


def test_a_window_between_the_lines_breaks_a_run_of_slow_windows() -> None:
    job = steady_job()
    answers = job.run([window(5.0), window(5.0), window(7.5), window(5.0), window(5.0)])
    assert all(a == (None, False) for a in answers)
    slowdown, changed = job.feed(window(5.0))
    assert changed and slowdown is not None


def test_the_evidence_names_data_wait_when_it_rose() -> None:
    job = steady_job()
    slower = window(6.0, signals={"data wait": 0.41, "exposed communication": 0.06, "checkpoint": 0.012})
    slowdown = job.run([slower] * 3)[-1][0]
    assert slowdown is not None
    assert "data wait 5 % -> 41 % of the step" in slowdown.evidence
    assert not any("exposed communication" in e or "checkpoint" in e for e in slowdown.evidence)


def test_the_evidence_does_not_name_data_wait_when_it_did_not_rise() -> None:
    job = steady_job()
    same_shares = window(6.0, ranks={label: s / 0.6 for label, s in HEALTHY_RANKS.items()})
    slowdown = job.run([same_shares] * 3)[-1][0]
    assert slowdown is not None
    assert not any("data wait" in e for e in slowdown.evidence)


@pytest.mark.parametrize(("data_wait", "named"), [(0.13, False), (0.16, True)])
def test_a_signal_is_named_only_when_its_share_rose_ten_points(data_wait: float, named: bool) -> None:
    job = steady_job()
    slowdown = job.run([window(6.5, signals={**HEALTHY_SIGNALS, "data wait": data_wait})] * 3)[-1][0]
    assert slowdown is not None
    assert any(e.startswith("data wait 5 % -> ") for e in slowdown.evidence) == named


def test_a_signal_that_took_the_added_time_is_named_although_it_did_not_double() -> None:
    job = Job()
    job.run([window(STEADY, signals={"data wait": 0.30})] * (WARMUP + 5))
    slowdown = job.run([window(6.5, signals={"data wait": 0.55})] * 3)[-1][0]
    assert slowdown is not None
    assert "data wait 30 % -> 55 % of the step" in slowdown.evidence


def test_the_rank_sentence_names_the_rank_whose_step_time_doubled() -> None:
    job = steady_job()
    ranks = {"rank 0": 0.24, "rank 1": 0.25, "rank 2": 0.23, "rank 3": 0.44}
    slowdown = job.run([window(6.0, ranks=ranks)] * 3)[-1][0]
    assert slowdown is not None
    assert "rank 3's step time 0.21 s -> 0.44 s (2.1x)" in slowdown.evidence
    assert not any(e.startswith(("rank 0", "rank 1", "rank 2")) for e in slowdown.evidence)


def test_no_rank_is_named_when_none_grew_half_again() -> None:
    job = steady_job()
    ranks = {"rank 0": 0.26, "rank 1": 0.25, "rank 2": 0.24, "rank 3": 0.28}
    slowdown = job.run([window(6.0, ranks=ranks)] * 3)[-1][0]
    assert slowdown is not None and not any("rank" in e for e in slowdown.evidence)


def test_ranks_that_all_grew_alike_are_named_together() -> None:
    job = steady_job()
    ranks = {label: s * 2 for label, s in HEALTHY_RANKS.items()}
    slowdown = job.run([window(5.0, ranks=ranks)] * 3)[-1][0]
    assert slowdown is not None
    assert "all 4 ranks' step time 0.205 s -> 0.41 s (2.0x)" in slowdown.evidence


def test_recovery_ends_the_slowdown() -> None:
    job = steady_job()
    assert job.run([window(5.0)] * 3)[-1][1]
    assert job.feed(window(9.0)) == (None, True)
    assert job.feed(window(9.0)) == (None, False)
    slow = job.run([window(5.0)] * 3)
    assert [changed for _, changed in slow] == [False, False, True]


def test_a_key_change_resets_the_baseline_and_ends_the_slowdown() -> None:
    job = steady_job()
    assert job.run([window(5.0)] * 3)[-1][1]
    job.key = "gen-2/template-bbb"
    assert job.feed(window(5.0)) == (None, True)
    answers = job.run([window(5.0)] * 20)
    assert all(a == (None, False) for a in answers)  # the slower rate is the new normal
    slowdown = job.run([window(3.0)] * 3)[-1][0]
    assert slowdown is not None and slowdown.ratio == 0.6


def test_a_key_change_without_a_slowdown_is_no_change_but_resets() -> None:
    job = steady_job()
    job.key = "gen-1/template-ccc"
    answers = job.run([window(6.0)] * 10)  # after the reset, 6 steps/s is the job's normal
    assert all(a == (None, False) for a in answers)


def test_windows_without_steps_neither_count_nor_end_nor_enter_the_baseline() -> None:
    job = steady_job()
    answers = job.run([window(5.0), window(None), window(0.0), window(5.0), window(None)])
    assert all(a == (None, False) for a in answers)
    slowdown, changed = job.feed(window(5.0))
    assert changed and slowdown is not None
    assert slowdown.evidence[0].endswith("for 3 windows")
    stalled, changed = job.feed(window(0.0))
    assert stalled == slowdown and not changed
    stalled, changed = job.feed(window(None))
    assert stalled == slowdown and not changed


def test_stall_windows_do_not_count_as_warm_up_or_baseline() -> None:
    job = Job()
    answers = job.run([window(None), window(0.0)] * 5 + [window(STEADY)] * (WARMUP + 3))
    assert all(a == (None, False) for a in answers)
    slowdown = job.run([window(5.0)] * 3)[-1][0]
    assert slowdown is not None and slowdown.ratio == 0.5


def test_warm_up_windows_do_not_become_the_baseline() -> None:
    job = Job()
    warm_up = [window(1.0 + i) for i in range(WARMUP)]
    job.run([*warm_up, window(5.0), window(STEADY), window(STEADY)])  # one slow window past the warm-up
    slowdown = job.run([window(6.0)] * 3)[-1][0]
    assert slowdown is not None and slowdown.ratio == 0.6
    assert slowdown.evidence[0].startswith("steps/s 10 -> 6 ")


def test_one_odd_fast_window_does_not_raise_the_baseline() -> None:
    job = steady_job()
    job.run([window(30.0), window(STEADY), window(STEADY)])
    assert all(a == (None, False) for a in job.run([window(9.0)] * 5))


def test_nothing_is_judged_before_the_baseline_forms() -> None:
    job = Job()
    answers = job.run([window(STEADY)] * (WARMUP + 2) + [window(1.0)] * 2)
    assert all(a == (None, False) for a in answers)


def test_the_baseline_follows_a_faster_job() -> None:
    job = steady_job()
    job.run([window(14.0)] * 5)
    slowdown = job.run([window(9.0)] * 3)[-1][0]  # 90 % of the old rate, 64 % of the new
    assert slowdown is not None and slowdown.ratio == 0.643


def test_the_baseline_does_not_sink_with_a_slow_creep() -> None:
    job = steady_job(WARMUP + 20)
    rate, answers = STEADY, []
    for _ in range(12):
        rate *= 0.96  # each window within the noise of the one before
        answers.append(job.feed(window(rate)))
    reported = [s for s, _ in answers if s is not None]
    assert reported, "a creep to 61 % of the steady rate is a slowdown"
    assert reported[0].evidence[0].startswith("steps/s 10 -> ")


def test_memory_is_bounded() -> None:
    tracker = SlowdownTracker()
    job = Job(tracker)
    job.run([window(STEADY)] * 500)
    s = tracker.settings
    assert len(tracker.rates) == s.memory_windows and len(tracker.recent) == s.baseline_windows


def test_settings_refuse_nonsense() -> None:
    with pytest.raises(ValueError, match="drop_fraction"):
        SlowdownSettings(drop_fraction=1.2)
    with pytest.raises(ValueError, match="min_baseline_windows"):
        SlowdownSettings(min_baseline_windows=6, baseline_windows=5)


def test_the_thresholds_follow_the_settings() -> None:
    job = Job(SlowdownTracker(SlowdownSettings(drop_fraction=0.5, windows=2)))
    job.run([window(STEADY)] * (WARMUP + 3))
    assert job.run([window(6.0)] * 4) == [(None, False)] * 4  # 60 %: not slow at a 50 % drop
    assert [changed for _, changed in job.run([window(4.0)] * 2)] == [False, True]
    assert job.feed(window(7.0))[1] is False  # 70 %: below the recovery line at 75 %
    assert job.feed(window(7.6)) == (None, True)


@settings(max_examples=60, deadline=None)
@given(
    base=st.floats(min_value=0.01, max_value=1e4),
    noise=st.lists(st.floats(min_value=0.9, max_value=1.1), min_size=1, max_size=60),
    stalls=st.lists(st.booleans(), min_size=60, max_size=60),
)
def test_a_constant_rate_with_noise_within_ten_percent_never_reports(
    base: float, noise: list[float], stalls: list[bool]
) -> None:
    job = Job()
    for f, stall in zip(noise, stalls, strict=False):
        assert job.feed(window(None if stall else base * f)) == (None, False)


@settings(max_examples=60, deadline=None)
@given(rates=st.lists(st.one_of(st.none(), st.floats(min_value=0.0, max_value=100.0)), max_size=60))
def test_any_series_keeps_the_contract(rates: list[float | None]) -> None:
    job = Job()
    before: Slowdown | None = None
    for rate in rates:
        slowdown, changed = job.feed(window(rate))
        assert changed == ((before is None) != (slowdown is None))
        if slowdown is not None:
            assert 0.0 <= slowdown.ratio < SlowdownSettings().healthy_at
            assert slowdown.evidence and slowdown.evidence[0].startswith("steps/s ")
        before = slowdown
