"""docs/method.md names every threshold, regime and lever the engine uses."""

from __future__ import annotations

from pathlib import Path

from dam_operator.diagnosis import levers
from dam_operator.diagnosis.model import Regime, Thresholds

METHOD = (Path(__file__).resolve().parents[3] / "docs" / "method.md").read_text(encoding="utf-8")


def test_every_threshold_is_in_the_table_with_its_default() -> None:
    defaults = Thresholds()
    rows = [line for line in METHOD.splitlines() if line.startswith("|")]
    for name, info in Thresholds.model_fields.items():
        alias = info.alias or name
        row = next((r for r in rows if f"`{alias}`" in r), None)
        assert row is not None, f"{alias} is not in the thresholds table"
        cells = [c.strip() for c in row.strip("|").split("|")]
        default = cells[cells.index(f"`{alias}`") + 1]
        assert float(default) == getattr(defaults, name), (alias, row)


def test_every_regime_and_its_levers_are_in_the_regime_table() -> None:
    for regime in Regime:
        row = next((line for line in METHOD.splitlines() if line.startswith(f"| `{regime.value}` |")), None)
        assert row is not None, regime
        for lever in (*levers.EFFECTIVE[regime], *levers.AVOID[regime]):
            assert f"`{lever}`" in row, (regime, lever)
