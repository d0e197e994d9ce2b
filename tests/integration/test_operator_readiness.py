"""Readiness against the real API server: Ready means the operator serves.

The operator runs as a child process (``dam operator``) with its webhook registered by URL and
``cert_mode: self-signed`` (it makes its CA, keeps it in a Secret and writes the caBundle).

- with every request to the API server dropped (``faultproxy``), ``/readyz`` answers 503 and
  names the API while liveness (``/healthz``) stays 200; once the API answers, it becomes ready;
- with the webhook's port taken, the webhook cannot serve: not ready, naming the webhook; once
  the port is free it starts (its retry) and the operator becomes ready;
- a caBundle in the webhook configuration that does not verify the served certificate (a stale
  CA, or an empty one) makes it not ready.
"""

from __future__ import annotations

import base64
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from dam_operator.cluster.adapters import certs
from tests.support.faultproxy import Fault, FaultProxy
from tests.support.kubecluster import ControlPlane
from tests.support.operator_harness import OperatorProcess, ensure_crds, operator_namespace, wait_for

MWC_PATH = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


def _readyz(op: OperatorProcess) -> tuple[int, str]:
    op.assert_alive()
    r = httpx.get(f"http://127.0.0.1:{op.metrics_port}/readyz", timeout=5)
    return r.status_code, r.text


def _healthz(op: OperatorProcess) -> int:
    return httpx.get(f"http://127.0.0.1:{op.metrics_port}/healthz", timeout=5).status_code


def _serving(op: OperatorProcess) -> bool:
    """/metrics answers (the metrics server is up, whatever readiness says)."""
    op.assert_alive()
    try:
        return httpx.get(f"http://127.0.0.1:{op.metrics_port}/metrics", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture
def dam_system(control_plane: ControlPlane) -> Iterator[str]:
    ensure_crds(control_plane)
    with operator_namespace(control_plane) as ns:
        yield ns


def test_operator_is_not_ready_while_the_api_server_is_unreachable_then_ready(
    control_plane: ControlPlane, dam_system: str, tmp_path: Path
) -> None:
    with FaultProxy(control_plane.url, control_plane.ssl_context()) as proxy:
        proxy.add(Fault("drop", count=-1))  # every request: the connection closes, no answer
        kubeconfig = proxy.kubeconfig(control_plane.kubeconfig, tmp_path / "proxy.kubeconfig")
        op = OperatorProcess(
            control_plane, tmp_path, namespace=None, operator_namespace=dam_system, kubeconfig=kubeconfig
        )
        try:
            op.start(wait=False)
            wait_for(lambda: _serving(op), 60, "the operator's metrics server")
            status, text = _readyz(op)
            assert status == 503, text
            assert "api: the API server does not answer" in text, text
            assert "webhook: the pod webhook is not serving yet" in text, text
            assert _healthz(op) == 200  # alive: liveness must not restart it for this
            proxy.clear()
            wait_for(lambda: _readyz(op)[0] == 200, 90, "the operator to become ready once the API answers")
            status, text = _readyz(op)
            assert text.splitlines()[0] == "ready", text
            assert "api: ok" in text and "pods: ok" in text and "webhook: ok" in text, text
        finally:
            op.close()


def test_operator_is_not_ready_while_its_webhook_cannot_serve_then_ready(
    control_plane: ControlPlane, dam_system: str, tmp_path: Path
) -> None:
    op = OperatorProcess(control_plane, tmp_path, namespace=None, operator_namespace=dam_system)
    blocker = socket.socket()
    blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    blocker.bind(("127.0.0.1", op.webhook_port))
    blocker.listen(1)
    try:
        op.start(wait=False)
        wait_for(lambda: _serving(op), 60, "the operator's metrics server")
        # The API answers: once the pods are listed, only the webhook keeps it unready.
        wait_for(lambda: "pods: ok" in _readyz(op)[1], 60, "the pods to be listed")
        status, text = _readyz(op)
        assert status == 503, text
        assert "api: ok" in text, text
        assert "webhook: the pod webhook is not serving yet" in text, text
        blocker.close()
        wait_for(lambda: _readyz(op)[0] == 200, 60, "the webhook's retry to serve and the operator ready")
    finally:
        blocker.close()
        op.close()


def test_operator_is_not_ready_when_the_registered_ca_bundle_does_not_verify_its_certificate(
    control_plane: ControlPlane, dam_system: str, tmp_path: Path
) -> None:
    op = OperatorProcess(control_plane, tmp_path, namespace=None, operator_namespace=dam_system)
    try:
        op.start(wait=True)
        wait_for(lambda: _readyz(op)[0] == 200, 30, "the operator to be ready")
        path = f"{MWC_PATH}/{op.webhook_configuration}"
        mwc = control_plane.api("GET", path)
        good = mwc["webhooks"][0]["clientConfig"]["caBundle"]
        stranger = base64.b64encode(certs.generate_ca("a-stranger").cert_pem).decode()
        for bundle, why in ((stranger, "does not verify against the caBundle"), ("", "has no caBundle")):
            patch = [{"op": "replace", "path": "/webhooks/0/clientConfig/caBundle", "value": bundle}]
            if not bundle:
                patch = [{"op": "remove", "path": "/webhooks/0/clientConfig/caBundle"}]
            control_plane.api("PATCH", path, body=patch, content_type="application/json-patch+json")
            wait_for(lambda w=why: w in _readyz(op)[1], 10, f"readiness to say the configuration {why}")
            assert _readyz(op)[0] == 503
        restore = [{"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": good}]
        control_plane.api("PATCH", path, body=restore, content_type="application/json-patch+json")
        wait_for(lambda: _readyz(op)[0] == 200, 10, "ready again with the right caBundle")
    finally:
        op.close()
