"""The metric catalog covers every name in names.py, and docs/metrics.md is generated from it."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from dam_contract import names
from dam_sidecar.catalog import BY_NAME, CATALOG

ROOT = Path(__file__).resolve().parents[3]


def load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_metrics_doc", ROOT / "tools" / "gen_metrics_doc.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_metric_name_has_a_catalog_entry_with_help() -> None:
    declared = {
        v for k, v in vars(names).items() if k.isupper() and isinstance(v, str) and v.startswith("dam_")
    }
    assert declared == set(BY_NAME)
    assert all(m.help.strip() for m in CATALOG)


def test_counters_end_in_total_and_ratios_are_gauges() -> None:
    for m in CATALOG:
        assert (m.kind == "counter") == m.name.endswith("_total"), m.name
        if m.name.endswith("_ratio"):
            assert m.kind == "gauge"


def test_docs_metrics_md_is_up_to_date() -> None:
    tool = load_tool()
    current = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    assert current == tool.render_markdown(), "docs/metrics.md is stale: run tools/gen_metrics_doc.py"


def test_every_operator_metric_name_is_in_the_generated_reference() -> None:
    from dam_operator.cluster.steps import metric_names

    text = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    declared = {
        v
        for k, v in vars(metric_names).items()
        if k.isupper() and isinstance(v, str) and v.startswith("dam_")
    }
    assert declared, "metric_names declares the operator's metrics"
    for name in declared:
        assert f"`{name}`" in text, f"{name} is missing from docs/metrics.md"
