"""docs/method.md names every threshold, regime and lever the engine uses; its regime table and
docs/architecture.md's are generated from the lever catalogue, its thresholds table from the
thresholds' fields (tools/gen_regime_doc.py)."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest

from dam_operator.diagnosis import regimes
from dam_operator.diagnosis.model import Regime, Thresholds

ROOT = Path(__file__).resolve().parents[3]
METHOD = (ROOT / "docs" / "method.md").read_text(encoding="utf-8")


@pytest.fixture
def tool(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT / "tools"))
    return importlib.import_module("gen_regime_doc")


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
        spec = regimes.SPECS[regime]
        for lever in (*spec.working, *spec.wasted):
            assert f"`{lever}`" in row, (regime, lever)


def test_the_regime_tables_are_generated_from_the_regime_table(tool: ModuleType) -> None:
    assert set(tool.PAGES) == {ROOT / "docs" / "method.md", ROOT / "docs" / "architecture.md"}
    for page, text in tool.pages().items():
        assert page.read_text(encoding="utf-8") == text, f"{page} is stale: run tools/gen_regime_doc.py"


def test_the_check_finds_a_stale_table_and_a_rewrite_mends_it(
    tool: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = tmp_path / "method.md"
    page.write_text(METHOD.replace("`more-flops`", "`more-flop`"), encoding="utf-8")
    monkeypatch.setattr(tool, "PAGES", {page: tool.PAGES[ROOT / "docs" / "method.md"]})
    assert tool.main(["--check"]) == 1
    assert tool.main([]) == 0
    assert page.read_text(encoding="utf-8") == METHOD
    assert tool.main(["--check"]) == 0


def test_a_threshold_without_its_screen_stops_the_thresholds_table(
    tool: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dam_operator.diagnosis import observation

    real = observation.screens
    monkeypatch.setattr(observation, "screens", lambda f: () if f == "min_steps" else real(f))
    with pytest.raises(SystemExit, match=r"Thresholds\.min_steps"):
        tool.thresholds_table(observation)


def test_a_threshold_screening_two_signals_has_a_row_for_each() -> None:
    block = METHOD.split("<!-- thresholds:begin -->", 1)[1].split("<!-- thresholds:end -->", 1)[0]
    rows = [line for line in block.splitlines() if "| `cpuWaitSuspect` |" in line]
    assert [r.split("|")[1].strip() for r in rows] == ["`cpuWaitRatio`", "`workerCpuWaitRatio`"]
