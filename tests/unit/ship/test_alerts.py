"""The alert rules in alerts/: valid for promtool, unit-tested, and written in the shared metric names."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from dam_contract import names
from dam_operator.cluster.steps import metric_names

ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "alerts" / "dam-alerts.yaml"
RULE_TESTS = sorted((ROOT / "alerts" / "tests").glob("*.yaml"))
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian package `prometheus`; `make system-deps`)"
)

EXPECTED_ALERTS = {
    "DAMInputBound",
    "DAMProbeDown",
    "DAMSidecarNoGPUAttribution",
    "DAMOperatorEvaluationErrors",
    "DAMLowGoodput",
    "DAMJobStalled",
}


def _promtool(*args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def _known_metric_names() -> set[str]:
    known = set()
    for module in (names, metric_names):
        known |= {v for v in vars(module).values() if isinstance(v, str) and v.startswith("dam_")}
    return known


@needs_promtool
def test_rule_file_passes_promtool_check() -> None:
    result = _promtool("check", "rules", RULES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in result.stdout


@needs_promtool
@pytest.mark.parametrize("test_file", RULE_TESTS, ids=lambda p: p.name)
def test_rule_unit_tests_pass(test_file: Path) -> None:
    result = _promtool("test", "rules", test_file)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
@pytest.mark.parametrize(
    ("original", "mutated"),
    [
        (
            "avg by (namespace, pod) (dam_gpu_utilization_ratio) < 0.80",
            "avg by (namespace, pod) (dam_gpu_utilization_ratio) < 0.99",
        ),
        (") > 0.10\n", ") > 0.01\n"),
        (
            "max by (namespace, pod) (dam_probe_up) == 0\n        for: 10m",
            "max by (namespace, pod) (dam_probe_up) == 0\n        for: 1m",
        ),
        ("max by (namespace, pod) (dam_probe_up) == 1\n", "max by (namespace, pod) (dam_probe_up) >= 0\n"),
        (") < 0.50\n", ") < 0.30\n"),
        ('{use="productive"}[30m]', '{use!="restart"}[30m]'),
        (
            "(dam_profile_stalled_seconds) > 0\n        for: 1m",
            "(dam_profile_stalled_seconds) >= 0\n        for: 1m",
        ),
        (
            "(dam_profile_stalled_seconds) > 0\n        for: 1m",
            "(dam_profile_stalled_seconds) > 0\n        for: 0s",
        ),
        (
            "max by (namespace, profile) (dam_profile_stalled_seconds)",
            "dam_profile_stalled_seconds",
        ),
    ],
    ids=[
        "gpu-busy-threshold",
        "wait-threshold",
        "probe-down-delay",
        "attribution-needs-live-probe",
        "goodput-threshold",
        "goodput-numerator",
        "stall-progressing-job-quiet",
        "stall-blip-quiet",
        "stall-one-alert-per-profile",
    ],
)
def test_rule_unit_tests_catch_a_changed_threshold(tmp_path: Path, original: str, mutated: str) -> None:
    text = RULES.read_text()
    assert original in text, f"mutation anchor {original!r} not found in {RULES}"
    (tmp_path / "tests").mkdir()
    (tmp_path / "dam-alerts.yaml").write_text(text.replace(original, mutated, 1))
    for test_file in RULE_TESTS:
        shutil.copy(test_file, tmp_path / "tests" / test_file.name)
    results = [_promtool("test", "rules", tmp_path / "tests" / t.name, cwd=tmp_path) for t in RULE_TESTS]
    assert any(r.returncode != 0 for r in results), "the rule unit tests did not notice a changed rule"


def test_every_expected_alert_is_defined_once() -> None:
    alerts = [rule["alert"] for rule in _rules() if "alert" in rule]
    assert sorted(alerts) == sorted(EXPECTED_ALERTS)


@pytest.mark.parametrize("rule", _rules(), ids=lambda r: r.get("alert", r.get("record")))
def test_alert_has_summary_description_runbook_and_severity(rule: dict[str, Any]) -> None:
    annotations = rule.get("annotations", {})
    for key in ("summary", "description", "runbook", "runbook_url"):
        assert annotations.get(key, "").strip(), f"{rule['alert']}: annotation {key!r} missing"
    assert rule["labels"]["severity"] in {"info", "warning", "critical"}
    assert "docs/troubleshooting.md#" in annotations["runbook_url"]


def test_alerts_query_only_metrics_from_the_shared_name_modules() -> None:
    used = {m for rule in _rules() for m in re.findall(r"\bdam_[a-z0-9_]+", rule["expr"])}
    assert used, "no dam_ metric found in the rules"
    unknown = used - _known_metric_names()
    assert not unknown, f"metric names unknown to dam_contract.names / cluster.metric_names: {unknown}"


def test_runbook_anchors_exist_in_the_troubleshooting_guide() -> None:
    guide = (ROOT / "docs" / "troubleshooting.md").read_text()
    headings = {
        re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in guide.splitlines()
        if line.startswith("#")
    }
    for rule in _rules():
        anchor = rule["annotations"]["runbook_url"].rsplit("#", 1)[1]
        assert anchor in headings, f"{rule['alert']}: docs/troubleshooting.md has no heading for #{anchor}"
