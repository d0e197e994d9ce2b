"""In-cluster login: the API server by KUBERNETES_SERVICE_HOST/PORT, not by cluster DNS."""

from __future__ import annotations

from pathlib import Path

import pytest

from dam_operator.cluster.adapters import kube


def _service_account(
    folder: Path, *, token: str = "tok-123", ca: bool = True, namespace: str = "dam-system"
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "token").write_text(token + "\n")
    if ca:
        (folder / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    if namespace:
        (folder / "namespace").write_text(namespace)
    return folder


def test_in_cluster_login_addresses_the_api_server_by_the_service_env_not_dns(tmp_path: Path) -> None:
    sa = _service_account(tmp_path / "sa")
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    info = kube.login_with_service_account(directory=str(sa), environ=env)
    assert info is not None
    assert info.server == "https://10.96.0.1:443"
    assert info.token == "tok-123"
    assert info.ca_path == str(sa / "ca.crt")
    assert info.default_namespace == "dam-system"


def test_an_ipv6_service_address_is_bracketed(tmp_path: Path) -> None:
    sa = _service_account(tmp_path / "sa")
    env = {"KUBERNETES_SERVICE_HOST": "fd00:10:96::1", "KUBERNETES_SERVICE_PORT": "6443"}
    info = kube.login_with_service_account(directory=str(sa), environ=env)
    assert info is not None and info.server == "https://[fd00:10:96::1]:6443"


def test_without_the_service_env_the_login_falls_back_to_the_dns_name(tmp_path: Path) -> None:
    sa = _service_account(tmp_path / "sa", ca=False, namespace="")
    info = kube.login_with_service_account(directory=str(sa), environ={})
    assert info is not None
    assert info.server == kube.FALLBACK_SERVER
    assert info.ca_path is None and info.default_namespace is None


def test_outside_a_pod_there_is_no_service_account_login(tmp_path: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert kube.login_with_service_account(directory=str(tmp_path / "missing"), environ=env) is None


def test_the_operators_login_prefers_the_service_account_by_its_address(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sa = _service_account(tmp_path / "sa", token="rotated")
    monkeypatch.setattr(kube, "SERVICE_ACCOUNT_DIR", str(sa))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "8443")
    info = kube.default_login()
    assert info.server == "https://10.0.0.1:8443"
    assert info.token == "rotated"
