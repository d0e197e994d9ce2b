"""The regime table (diagnosis.regimes) holds each regime whole, once; the records stand first in
the imports (diagnosis.observation and diagnosis.axes import no other module of the engine)."""

from __future__ import annotations

import subprocess
import sys

from dam_operator.diagnosis import levers, model, regimes
from dam_operator.diagnosis.axes import Axis, Regime
from dam_operator.diagnosis.levers import LEVERS
from dam_operator.diagnosis.observation import Thresholds


def test_every_regime_has_one_row_with_its_axes_and_its_levers() -> None:
    assert sorted(spec.regime for spec in regimes.REGIMES) == sorted(Regime)
    for spec in regimes.REGIMES:
        assert spec.effective, spec.regime
        assert spec.dominant_term, spec.regime
        assert set(spec.working) | set(spec.wasted) <= set(LEVERS), spec.regime
        assert spec.working[: len(spec.effective)] == spec.effective


def test_every_threshold_is_read_by_a_regime_or_by_every_verdict() -> None:
    named = {t for spec in regimes.REGIMES for t in spec.thresholds} | set(regimes.VERDICT_THRESHOLDS)
    assert named == set(Thresholds.model_fields)


def test_the_rules_are_unique_and_the_last_stage_always_answers() -> None:
    names = [rule.name for rule in regimes.RULES]
    assert len(set(names)) == len(names)
    assert [rule.stage for rule in regimes.RULES] == sorted(rule.stage for rule in regimes.RULES)
    assert regimes.RULES[-1].stage is max(rule.stage for rule in regimes.RULES)


def test_the_model_speaks_the_leaf_s_regimes() -> None:
    assert model.Regime is levers.Regime is Regime
    assert model.Axis is levers.Axis is Axis
    assert model.Bottleneck.model_fields["regime"].annotation is Regime


def test_the_records_are_leaves() -> None:
    """observation and axes load without any other module of the engine, so no circle can form
    through them (lint-imports holds the whole package to that)."""
    code = (
        "import sys\n"
        "import dam_operator.diagnosis.observation, dam_operator.diagnosis.axes\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('dam_operator.diagnosis.') and "
        "m not in ('dam_operator.diagnosis.observation', 'dam_operator.diagnosis.axes'))\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
