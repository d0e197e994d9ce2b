"""The published verdict holds against noise and follows a sustained change."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from dam_operator.diagnosis.engine import diagnose
from dam_operator.diagnosis.hysteresis import Stabilizer, rfc3339
from dam_operator.diagnosis.model import Observation, RankId, Regime, Verdict

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def verdict(**fields: Any) -> Verdict:
    return diagnose(Observation(steps=300.0, window_seconds=60.0, gpu_count=1, **fields))


STARVED = {"gpu_utilization": 0.2, "data_wait_ratio": 0.5}
COMPUTE = {"gpu_utilization": 0.99, "sm_active": 0.9, "tensor_active": 0.5, "dram_bandwidth_utilization": 0.3}
COMPUTE_WEAK = {"gpu_utilization": 0.9}  # compute-bound at low confidence
UNKNOWN = {"gpu_utilization": 0.3}


def feed(stab: Stabilizer, windows: list[dict[str, Any]]) -> list[Verdict]:
    return [stab.update(verdict(**w), T0 + timedelta(minutes=i)) for i, w in enumerate(windows)]


def test_first_verdict_is_published_with_since_now() -> None:
    out = feed(Stabilizer(), [STARVED])
    assert out[0].bottleneck.regime is Regime.INPUT_BOUND
    assert out[0].bottleneck.since == "2026-01-02T03:04:05Z"


def test_alternating_windows_do_not_flap() -> None:
    out = feed(Stabilizer(), [STARVED, COMPUTE] * 5)
    assert {v.bottleneck.regime for v in out} == {Regime.INPUT_BOUND}
    assert {v.bottleneck.since for v in out} == {rfc3339(T0)}


def test_sustained_change_switches_after_two_windows_and_moves_since() -> None:
    stab = Stabilizer(confirm_windows=2, confidence_margin=1.0)
    out = feed(stab, [STARVED, STARVED, COMPUTE, COMPUTE, COMPUTE])
    regimes = [v.bottleneck.regime for v in out]
    assert regimes == [Regime.INPUT_BOUND] * 3 + [Regime.COMPUTE_BOUND] * 2
    assert out[2].bottleneck.since == rfc3339(T0)
    assert out[3].bottleneck.since == rfc3339(T0 + timedelta(minutes=3))
    assert out[4].bottleneck.since == out[3].bottleneck.since


def test_held_verdict_says_what_is_pending_and_carries_fresh_metrics() -> None:
    stab = Stabilizer(confidence_margin=1.0)
    out = feed(stab, [STARVED, COMPUTE])
    assert out[1].bottleneck.regime is Regime.INPUT_BOUND
    assert "compute-bound seen in 1 of the 2" in out[1].bottleneck.evidence[-1]
    assert out[1].metrics.gpu_utilization == pytest.approx(0.99)
    assert stab.pending == (Regime.COMPUTE_BOUND, 1)


def test_much_more_confident_challenger_switches_at_once() -> None:
    stab = Stabilizer(confidence_margin=0.2)
    weak = stab.update(verdict(**COMPUTE_WEAK), T0)
    strong = verdict(**STARVED)
    assert strong.bottleneck.confidence >= weak.bottleneck.confidence + 0.2
    out = stab.update(strong, T0 + timedelta(minutes=1))
    assert out.bottleneck.regime is Regime.INPUT_BOUND


def test_unknown_replaces_a_known_verdict_only_after_k_windows() -> None:
    stab = Stabilizer(unknown_windows=3)
    out = feed(stab, [STARVED, UNKNOWN, UNKNOWN, UNKNOWN])
    assert [v.bottleneck.regime for v in out] == [Regime.INPUT_BOUND] * 3 + [Regime.UNKNOWN]


def test_known_verdict_replaces_unknown_at_once() -> None:
    out = feed(Stabilizer(), [UNKNOWN, STARVED])
    assert out[1].bottleneck.regime is Regime.INPUT_BOUND
    assert out[1].bottleneck.since == rfc3339(T0 + timedelta(minutes=1))


def test_restore_keeps_since_from_the_published_status() -> None:
    first = Stabilizer().update(verdict(**STARVED), T0)
    resumed = Stabilizer()
    resumed.restore(first.bottleneck)
    out = resumed.update(verdict(**STARVED), T0 + timedelta(hours=1))
    assert out.bottleneck.since == rfc3339(T0)


def test_rfc3339_converts_to_utc_and_treats_naive_as_utc() -> None:
    from datetime import timezone

    plus2 = datetime(2026, 1, 2, 5, 4, 5, tzinfo=timezone(timedelta(hours=2)))
    assert rfc3339(plus2) == "2026-01-02T03:04:05Z"
    assert rfc3339(datetime(2026, 1, 2, 3, 4, 5)) == "2026-01-02T03:04:05Z"


def test_invalid_settings_are_rejected() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Stabilizer(confirm_windows=0)


# --- the straggler ------------------------------------------------------------------------


def ranked(late: int | None, **fields: Any) -> Verdict:
    """A synchronous 3-rank job whose rank ``late`` arrives last (None: balanced), waiting for data."""
    ranks = {}
    for r in range(3):
        is_late = r == late
        ranks[RankId("p", r)] = Observation(
            steps=100.0,
            window_seconds=50.0,
            mean_step_seconds=0.5,
            data_wait_ratio=0.4 if is_late else 0.01,
            collective_seconds=2.5 if is_late else 22.5,
            collective_exposed_seconds=1.0,
            exposed_communication_ratio=0.02,
            gpu_count=0,
        )
    obs = Observation(steps=300.0, window_seconds=50.0, gpu_count=0, data_wait_ratio=0.14, **fields)
    return diagnose(obs, ranks=ranks)


def stragglers(out: list[Verdict]) -> list[int | None]:
    return [v.bottleneck.straggler.rank if v.bottleneck.straggler else None for v in out]


def test_raw_verdicts_name_the_late_rank() -> None:
    assert ranked(2).bottleneck.straggler is not None
    assert ranked(None).bottleneck.straggler is None


def test_a_straggler_that_comes_and_goes_does_not_flap() -> None:
    stab = Stabilizer()
    out = [stab.update(v, T0 + timedelta(minutes=i)) for i, v in enumerate([ranked(2), ranked(None)] * 3)]
    assert stragglers(out) == [2] * 6
    assert any(
        e.startswith("holding straggler rank 2 (pod p): none seen in 1") for e in out[1].bottleneck.evidence
    )


def test_a_new_straggler_replaces_the_old_after_two_windows() -> None:
    stab = Stabilizer()
    out = [stab.update(v, T0 + timedelta(minutes=i)) for i, v in enumerate([ranked(2), ranked(0), ranked(0)])]
    assert stragglers(out) == [2, 2, 0]
    assert stab.straggler is not None and stab.straggler.rank == 0
    # One evidence line for the published straggler, never the raw window's.
    lines = [e for e in out[1].bottleneck.evidence if e.startswith("straggler (")]
    assert len(lines) == 1 and "rank 2" in lines[0]


def test_a_straggler_goes_away_after_two_quiet_windows() -> None:
    stab = Stabilizer()
    out = [
        stab.update(v, T0 + timedelta(minutes=i))
        for i, v in enumerate([ranked(1), ranked(None), ranked(None)])
    ]
    assert stragglers(out) == [1, 1, None]
    assert not any(e.startswith("straggler (") for e in out[2].bottleneck.evidence)


def test_the_straggler_is_kept_while_the_regime_is_held() -> None:
    stab = Stabilizer()
    first = stab.update(ranked(2), T0)
    assert first.bottleneck.regime is Regime.INPUT_BOUND
    held = stab.update(verdict(**COMPUTE), T0 + timedelta(minutes=1))
    assert held.bottleneck.regime is Regime.INPUT_BOUND
    assert held.bottleneck.straggler is not None and held.bottleneck.straggler.rank == 2
    assert any(e.startswith("holding input-bound") for e in held.bottleneck.evidence)


def test_restore_resumes_the_published_straggler() -> None:
    published = Stabilizer().update(ranked(2), T0).bottleneck
    resumed = Stabilizer()
    resumed.restore(published)
    out = resumed.update(ranked(None), T0 + timedelta(minutes=1))
    assert stragglers([out]) == [2]
