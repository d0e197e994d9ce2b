"""Webhook certificates: a chain the API server can verify, the right names, timely renewal."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import ipaddress
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cryptography import x509

from dam_operator.cluster.adapters.certs import (
    CertManager,
    bundle_from_secret,
    ca_bundle_patch,
    generate_ca,
    issue,
    needs_rotation,
    secret_body,
    service_dns_names,
    verify_chain,
    write_pem_files,
)

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
NAMES = service_dns_names("dam-webhook", "dam-system")


def test_serving_certificate_chains_to_its_ca_and_not_to_another() -> None:
    certs = issue(NAMES, now=NOW)
    assert verify_chain(certs.serving.cert_pem, certs.ca.cert_pem)
    assert not verify_chain(certs.serving.cert_pem, generate_ca(now=NOW).cert_pem)
    assert not verify_chain(b"not a certificate", certs.ca.cert_pem)


def test_serving_certificate_names_the_service_and_test_addresses() -> None:
    certs = issue(NAMES, ip_addresses=["127.0.0.1"], now=NOW)
    cert = x509.load_pem_x509_certificate(certs.serving.cert_pem)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "dam-webhook.dam-system.svc" in san.get_values_for_type(x509.DNSName)
    assert "dam-webhook.dam-system.svc.cluster.local" in san.get_values_for_type(x509.DNSName)
    assert ipaddress.ip_address("127.0.0.1") in san.get_values_for_type(x509.IPAddress)
    ca = x509.load_pem_x509_certificate(certs.ca.cert_pem)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False


def test_rotation_is_due_near_expiry_and_not_before() -> None:
    pem = issue(NAMES, now=NOW).serving.cert_pem
    assert not needs_rotation(pem, NOW + dt.timedelta(days=300), dt.timedelta(days=30))
    assert needs_rotation(pem, NOW + dt.timedelta(days=340), dt.timedelta(days=30))
    assert needs_rotation(pem, NOW - dt.timedelta(days=1))  # not valid yet
    assert needs_rotation(None, NOW)
    assert needs_rotation(b"garbage", NOW)
    assert needs_rotation(pem, NOW, dns_names=["other.svc"])  # the Service was renamed
    assert not needs_rotation(pem, NOW, dns_names=NAMES)


def test_secret_round_trips_the_certificates() -> None:
    certs = issue(NAMES, now=NOW)
    body = secret_body("dam-webhook-tls", "dam-system", certs)
    assert body["type"] == "kubernetes.io/tls"
    assert base64.b64decode(body["data"]["tls.crt"]) == certs.serving.cert_pem
    assert bundle_from_secret(body) == certs
    assert bundle_from_secret(None) is None
    assert bundle_from_secret({"data": {"tls.crt": "!!"}}) is None


def test_ca_bundle_patch_sets_each_stale_webhook_guarded_by_its_name() -> None:
    ca = generate_ca(now=NOW).cert_pem
    encoded = base64.b64encode(ca).decode()
    config = {
        "webhooks": [
            {"name": "a.dam.mlsys.dev", "clientConfig": {}},
            {"name": "b", "clientConfig": {"caBundle": encoded}},
        ]
    }
    ops = ca_bundle_patch(config, ca)
    assert ops == [
        {"op": "test", "path": "/webhooks/0/name", "value": "a.dam.mlsys.dev"},
        {"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": encoded},
    ]


def test_pem_files_are_private(tmp_path: Path) -> None:
    cert, key = write_pem_files(issue(NAMES, now=NOW), tmp_path)
    assert key.stat().st_mode & 0o077 == 0
    assert cert.read_bytes().startswith(b"-----BEGIN CERTIFICATE-----")


class MemoryStore:
    def __init__(self) -> None:
        self.secrets: dict[tuple[str, str], Mapping[str, Any]] = {}
        self.ca_patches: list[bytes] = []

    async def get_secret(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.secrets.get((namespace, name))

    async def put_secret(self, namespace: str, name: str, body: Mapping[str, Any]) -> None:
        self.secrets[(namespace, name)] = body

    async def patch_webhook_ca(self, configuration_name: str, ca_bundle_pem: bytes) -> None:
        self.ca_patches.append(ca_bundle_pem)


def _manager(store: MemoryStore) -> CertManager:
    return CertManager(
        store,
        namespace="dam-system",
        secret_name="dam-webhook-tls",
        service_name="dam-webhook",
        webhook_configuration_name="dam-operator",
    )


def test_manager_issues_once_then_reuses_and_renews_keeping_the_ca() -> None:
    store = MemoryStore()
    manager = _manager(store)
    first, issued = asyncio.run(manager.ensure(NOW))
    assert issued and store.ca_patches == [first.ca.cert_pem]
    again, issued = asyncio.run(manager.ensure(NOW + dt.timedelta(days=10)))
    assert not issued and again == first
    renewed, issued = asyncio.run(manager.ensure(NOW + dt.timedelta(days=350)))
    assert issued
    assert renewed.serving != first.serving
    assert renewed.ca == first.ca  # caBundle unchanged: no window of untrusted certificates
    assert verify_chain(renewed.serving.cert_pem, first.ca.cert_pem)


def test_manager_replaces_a_broken_secret() -> None:
    store = MemoryStore()
    store.secrets[("dam-system", "dam-webhook-tls")] = {"data": {"tls.crt": "eA=="}}
    certs, issued = asyncio.run(_manager(store).ensure(NOW))
    assert issued and verify_chain(certs.serving.cert_pem, certs.ca.cert_pem)
