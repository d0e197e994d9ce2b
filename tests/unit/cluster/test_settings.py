"""Operator settings: DAM_ environment, command-line overrides, clear errors."""

from __future__ import annotations

import logging

import kopf
import pytest
from pydantic import ValidationError

from dam_operator.cluster.runtime.main import injection_settings, kopf_settings, main, settings_from_args
from dam_operator.cluster.settings import OperatorSettings


def test_environment_configures_the_operator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DAM_NAMESPACE", "team-a")
    monkeypatch.setenv("DAM_EVALUATION_CONCURRENCY", "8")
    monkeypatch.setenv("DAM_EXCLUDED_NAMESPACES", "kube-system, monitoring")
    monkeypatch.setenv("DAM_WEBHOOK_ENABLED", "false")
    s = OperatorSettings()
    assert s.namespace == "team-a" and not s.clusterwide
    assert s.evaluation_concurrency == 8
    assert s.excluded_namespaces == ["kube-system", "monitoring"]
    assert s.webhook_enabled is False


def test_empty_namespace_means_cluster_wide(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DAM_NAMESPACE", " ")
    assert OperatorSettings().clusterwide


def test_flags_override_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DAM_NAMESPACE", "team-a")
    monkeypatch.setenv("DAM_METRICS_PORT", "9000")
    s = settings_from_args(["-A", "--metrics-port", "0", "--no-webhook", "--liveness", ""])
    assert s.clusterwide and s.metrics_port == 0 and not s.webhook_enabled
    assert s.liveness_endpoint is None
    assert settings_from_args(["-n", "x", "--peering"]).standalone is False


@pytest.mark.parametrize(
    ("env", "value"),
    [
        ("DAM_EVALUATION_CONCURRENCY", "0"),
        ("DAM_SCRAPE_TIMEOUT_SECONDS", "-1"),
        ("DAM_WEBHOOK_TIMEOUT_SECONDS", "30"),
        ("DAM_CERT_MODE", "magic"),
    ],
)
def test_bad_values_are_rejected(monkeypatch: pytest.MonkeyPatch, env: str, value: str) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(ValidationError):
        OperatorSettings()


def test_main_reports_a_bad_setting_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DAM_SCRAPE_TIMEOUT_SECONDS", "-1")
    assert main([]) == 2
    err = capsys.readouterr().err
    assert "scrape_timeout_seconds" in err and "DAM_SCRAPE_TIMEOUT_SECONDS" in err
    assert "Traceback" not in err


def test_kopf_and_injection_settings_follow_the_operator_settings() -> None:
    k = kopf_settings(OperatorSettings(standalone=True, api_timeout_seconds=10))
    assert k.peering.standalone is True
    assert k.posting.level == logging.WARNING  # no "handler succeeded" Event per profile
    assert k.networking.request_timeout == 30.0
    assert k.watching.chunk_size == 500  # the start-up listing in pages
    assert 0 < k.queueing.idle_timeout < 1.0  # kopf's idle per-object workers go soon
    assert kopf_settings(OperatorSettings(list_chunk_size=0)).watching.chunk_size is None
    k = kopf_settings(OperatorSettings(standalone=False, api_timeout_seconds=100))
    assert k.peering.standalone is False
    assert k.networking.request_timeout == 100.0
    inj = injection_settings(OperatorSettings(default_sidecar_image="r/dam:1", operator_namespace="ops"))
    assert inj.image == "r/dam:1"
    assert "ops" in inj.never_inject_namespaces()


def test_settings_tables_in_the_docs_are_generated_from_the_settings_classes() -> None:
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    check = subprocess.run(
        [sys.executable, str(root / "tools" / "gen_settings_doc.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stderr


def test_kopf_builds_no_diff_base_and_stores_none_in_the_object() -> None:
    """kopf's default diff base deep-copies every event's body (status and managedFields too)
    for handlers the operator does not use; ours costs nothing and writes nothing."""
    storage = kopf_settings(OperatorSettings()).persistence.diffbase_storage
    body = kopf.Body(
        {
            "metadata": {"name": "p", "namespace": "ns", "labels": {"a": "b"}, "managedFields": [{}] * 50},
            "spec": {"selector": {"matchLabels": {"app": "x"}}},
            "status": {"bottleneck": {"axis": "Data"}},
        }
    )
    assert storage.build(body=body) == {}
    assert storage.fetch(body=body) is None
    patch = kopf.Patch()
    storage.store(body=body, patch=patch, essence=kopf.BodyEssence({"spec": {}}))
    assert not patch  # no diff-base annotation is ever patched into a profile
