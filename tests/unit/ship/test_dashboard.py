"""The Grafana dashboard JSON: importable by hand, provisionable by the chart, written in shared metric names.

tests/integration/test_dashboard_queries.py runs every query against a real Prometheus.
"""

from __future__ import annotations

import json
import re
from itertools import combinations
from pathlib import Path
from typing import Any

from dam_contract import names
from dam_operator.cluster.steps import metric_names

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "charts" / "dam-operator" / "dashboards" / "dam.json"


def _dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def _queries(d: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in d["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in d["templating"]["list"] if v["type"] == "query"]
    return exprs


def test_dashboard_has_a_stable_uid_and_no_instance_id() -> None:
    d = _dashboard()
    assert d["uid"] == "dam-operator"
    assert d["id"] is None  # an id would clash on import into another Grafana
    assert isinstance(d["schemaVersion"], int)


def test_every_query_uses_the_datasource_variable() -> None:
    d = _dashboard()
    (ds_var,) = [v for v in d["templating"]["list"] if v["type"] == "datasource"]
    assert ds_var["query"] == "prometheus"
    expected = {"type": "prometheus", "uid": f"${{{ds_var['name']}}}"}
    for panel in d["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == expected, panel["title"]
        assert panel["targets"], panel["title"]
        assert all(t["datasource"] == expected for t in panel["targets"]), panel["title"]
    assert all(v["datasource"] == expected for v in d["templating"]["list"] if v["type"] == "query")


def test_template_variables_filter_every_sidecar_and_profile_query() -> None:
    d = _dashboard()
    assert [v["name"] for v in d["templating"]["list"]] == ["datasource", "namespace", "profile", "pod"]
    for panel in d["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            if "dam_profile_" in expr:
                assert 'namespace=~"$namespace"' in expr and 'profile=~"$profile"' in expr, expr
            elif "dam_operator_" not in expr:
                assert 'namespace=~"$namespace"' in expr and 'pod=~"$pod"' in expr, expr
            if "rate(" in expr:
                assert "[$__rate_interval]" in expr, expr


def test_queries_use_only_metric_names_from_the_shared_modules() -> None:
    known = {
        v
        for module in (names, metric_names)
        for v in vars(module).values()
        if isinstance(v, str) and v.startswith("dam_")
    }
    used = {m for expr in _queries(_dashboard()) for m in re.findall(r"\bdam_[a-z0-9_]+", expr)}
    assert used - known == set()
    for required in (
        names.DATALOADER_WAIT_SECONDS_TOTAL,
        names.STEP_SECONDS_TOTAL,
        names.GPU_UTILIZATION_RATIO,
        names.GPU_SM_ACTIVE_RATIO,
        names.GPU_TENSOR_ACTIVE_RATIO,
        names.GPU_DRAM_BANDWIDTH_UTILIZATION_RATIO,
        names.PROCESS_CPU_SECONDS_TOTAL,
        names.CONTAINER_CPU_THROTTLED_SECONDS_TOTAL,
        metric_names.PROFILE_VERDICT,
        metric_names.PROFILE_CONFIDENCE_RATIO,
        metric_names.PROFILE_IRON_LAW_SECONDS,
    ):
        assert required in used, f"no panel shows {required}"


def test_panels_have_unique_ids_descriptions_and_do_not_overlap() -> None:
    panels = _dashboard()["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    for p in panels:
        if p["type"] != "row":
            assert p.get("description"), p["title"]
        assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24, p["title"]

    def cells(p: dict[str, Any]) -> set[tuple[int, int]]:
        g = p["gridPos"]
        return {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}

    for a, b in combinations(panels, 2):
        assert not cells(a) & cells(b), f"{a['title']} overlaps {b['title']}"
