"""The lever catalogue (diagnosis.levers) holds the regimes whole and stands first in the imports."""

from __future__ import annotations

import subprocess
import sys

from dam_operator.diagnosis import levers, model
from dam_operator.diagnosis.levers import AVOID, AXES, EFFECTIVE, LEVERS, Regime


def test_every_regime_has_its_axes_and_its_levers_in_the_catalogue() -> None:
    for table in (AXES, EFFECTIVE, AVOID):
        assert list(table) == list(Regime)
    for regime in Regime:
        assert EFFECTIVE[regime], regime
        assert set(EFFECTIVE[regime]) | set(AVOID[regime]) <= set(LEVERS), regime


def test_the_model_speaks_the_catalogue_s_regimes() -> None:
    assert model.Regime is levers.Regime
    assert model.Axis is levers.Axis
    assert model.Bottleneck.model_fields["regime"].annotation is Regime


def test_the_catalogue_imports_no_data_model() -> None:
    """levers (and climb, whose table it builds) load without diagnosis.model: the model imports
    them, so no cycle can form."""
    code = (
        "import sys\n"
        "import dam_operator.diagnosis.levers\n"
        "loaded = [m for m in ('dam_operator.diagnosis.model', 'dam_operator.diagnosis.signals') "
        "if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
