"""The mutating webhook over real HTTP: AdmissionReview in and out, never blocking a pod."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import jsonpatch
import pytest
from aiohttp.test_utils import TestClient, TestServer

from dam_operator.cluster.adapters.certs import issue, write_pem_files
from dam_operator.cluster.runtime.webhook import (
    MUTATE_PATH,
    ProfileRef,
    WebhookLimits,
    make_webhook_app,
    serve_webhook,
    webhook_configuration,
    webhook_configuration_for_url,
)
from dam_operator.cluster.steps.injection import ANNOTATION_PROFILE, SIDECAR_CONTAINER, InjectionSettings
from dam_operator.cluster.steps.spec import parse_spec
from tests.support.procs import free_port

SETTINGS = InjectionSettings(image="ghcr.io/mlsys/dam-operator:0.1.0", operator_namespace="dam-system")
PROFILES = {
    "ml": [
        ProfileRef("ml", "train-profile", parse_spec({"selector": {"matchLabels": {"app": "trainer"}}})),
        ProfileRef(
            "ml",
            "manual",
            parse_spec({"selector": {"matchLabels": {"app": "manual"}}, "sidecar": {"inject": False}}),
        ),
    ]
}


def _profiles_for(namespace: str) -> list[ProfileRef]:
    return PROFILES.get(namespace, [])


def _pod(labels: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "train-", "namespace": "ml", "labels": labels},
        "spec": {"containers": [{"name": "train", "image": "pytorch:2"}], **spec},
    }


def _review(pod: dict[str, Any], namespace: str = "ml", operation: str = "CREATE") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": operation,
            "object": pod,
        },
    }


Call = Callable[[Any], Awaitable[tuple[int, dict[str, Any]]]]


def _with_client(body: Callable[[Call, list[str]], Awaitable[None]]) -> None:
    counted: list[str] = []

    async def run() -> None:
        app = make_webhook_app(_profiles_for, SETTINGS, metrics=counted.append)
        async with TestClient(TestServer(app)) as client:

            async def call(payload: Any) -> tuple[int, dict[str, Any]]:
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                resp = await client.post(MUTATE_PATH, data=data, headers={"Content-Type": "application/json"})
                return resp.status, await resp.json()

            await body(call, counted)

    asyncio.run(run())


def _patch(response: dict[str, Any]) -> list[dict[str, Any]]:
    assert response["patchType"] == "JSONPatch"
    ops: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return ops


def test_matching_pod_gets_a_patch_that_applies() -> None:
    pod = _pod({"app": "trainer"})

    async def body(call: Call, counted: list[str]) -> None:
        status, review = await call(_review(pod))
        assert status == 200
        assert review["apiVersion"] == "admission.k8s.io/v1" and review["kind"] == "AdmissionReview"
        response = review["response"]
        assert response["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
        assert response["allowed"] is True
        patched = jsonpatch.apply_patch(pod, _patch(response))
        assert SIDECAR_CONTAINER in [c["name"] for c in patched["spec"]["initContainers"]]
        assert patched["metadata"]["annotations"][ANNOTATION_PROFILE] == "train-profile"
        # The API server reinvokes with the patched pod: nothing more to do.
        _, again = await call(_review(patched))
        assert "patch" not in again["response"] and again["response"]["allowed"] is True
        assert counted == ["injected", "skipped"]

    _with_client(body)


@pytest.mark.parametrize(
    ("review", "result"),
    [
        (_review(_pod({"app": "web"})), "no-profile"),
        (_review(_pod({"app": "trainer"}), namespace="other"), "no-profile"),
        (_review(_pod({"app": "trainer"}), namespace="kube-system"), "skipped"),
        (_review(_pod({"app": "trainer"}), operation="UPDATE"), "skipped"),
        (_review(_pod({"app": "manual"})), "skipped"),  # profile with sidecar.inject false
    ],
)
def test_pods_not_to_instrument_are_allowed_unchanged(review: dict[str, Any], result: str) -> None:
    async def body(call: Call, counted: list[str]) -> None:
        status, answer = await call(review)
        assert status == 200
        assert answer["response"]["allowed"] is True
        assert "patch" not in answer["response"]
        assert counted == [result]

    _with_client(body)


@pytest.mark.parametrize(
    "payload",
    [
        b"not json at all",
        b"[]",
        {"kind": "AdmissionReview"},
        {"request": {"uid": "u1", "kind": {"kind": "Pod"}, "operation": "CREATE", "object": "x"}},
    ],
)
def test_garbage_is_allowed_with_a_warning_and_counted_as_an_error(payload: Any) -> None:
    async def body(call: Call, counted: list[str]) -> None:
        status, answer = await call(payload)
        assert status == 200
        assert answer["response"]["allowed"] is True
        assert "patch" not in answer["response"]
        assert any("not injected" in w for w in answer["response"]["warnings"])
        assert counted == ["error"]

    _with_client(body)


def test_failing_profile_lookup_never_blocks_the_pod() -> None:
    def broken(namespace: str) -> list[ProfileRef]:
        raise RuntimeError("index not ready")

    async def run() -> None:
        app = make_webhook_app(broken, SETTINGS)
        async with TestClient(TestServer(app)) as client:
            resp = await client.post(MUTATE_PATH, json=_review(_pod({"app": "trainer"})))
            answer = await resp.json()
            assert resp.status == 200
            assert answer["response"]["allowed"] is True
            assert answer["response"]["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"

    asyncio.run(run())


def test_port_conflict_is_admitted_with_a_warning_naming_the_fix() -> None:
    pod = _pod({"app": "trainer"})
    pod["spec"]["containers"][0]["ports"] = [{"containerPort": 9450}]

    async def body(call: Call, counted: list[str]) -> None:
        _, answer = await call(_review(pod))
        # Nothing changes but a note saying why, which the profile's status reads back.
        assert _patch(answer["response"]) == [
            {
                "op": "add",
                "path": "/metadata/annotations",
                "value": {"dam.mlsys.dev/injection-notes": "not-injected:port-taken"},
            }
        ]
        assert any("spec.sidecar.port" in w for w in answer["response"]["warnings"])

    _with_client(body)


def test_pod_matching_two_profiles_is_instrumented_once_with_a_warning() -> None:
    spec = parse_spec({"selector": {"matchLabels": {"app": "trainer"}}})
    profiles = [ProfileRef("ml", "zeta", spec), ProfileRef("ml", "alpha", spec)]

    async def run() -> None:
        app = make_webhook_app(lambda ns: profiles, SETTINGS)
        async with TestClient(TestServer(app)) as client:
            resp = await client.post(MUTATE_PATH, json=_review(_pod({"app": "trainer"})))
            answer = (await resp.json())["response"]
            patched = jsonpatch.apply_patch(_pod({"app": "trainer"}), _patch(answer))
            assert patched["metadata"]["annotations"][ANNOTATION_PROFILE] == "alpha"
            assert any("alpha, zeta" in w for w in answer["warnings"])

    asyncio.run(run())


def test_webhook_serves_tls_with_a_certificate_the_ca_vouches_for(tmp_path: Path) -> None:
    certs = issue(["localhost"], ip_addresses=["127.0.0.1"])
    certfile, keyfile = write_pem_files(certs, tmp_path)
    port = free_port()

    async def run() -> None:
        server = await serve_webhook(
            make_webhook_app(_profiles_for, SETTINGS), "127.0.0.1", port, str(certfile), str(keyfile)
        )
        try:
            trust = ssl.create_default_context(cadata=certs.ca.cert_pem.decode())
            async with aiohttp.ClientSession() as session:
                async with session.get(f"https://127.0.0.1:{port}/healthz", ssl=trust) as resp:
                    assert resp.status == 200 and await resp.text() == "ok"
                async with session.post(
                    f"https://127.0.0.1:{port}{MUTATE_PATH}",
                    json=_review(_pod({"app": "trainer"})),
                    ssl=trust,
                ) as resp:
                    assert "patch" in (await resp.json())["response"]
                with pytest.raises(aiohttp.ClientConnectorCertificateError):
                    await session.get(f"https://127.0.0.1:{port}/healthz", ssl=ssl.create_default_context())
            server.reload_certificate()
        finally:
            await server.close()

    asyncio.run(run())


def test_connections_that_never_start_their_tls_handshake_count_toward_the_connection_cap(
    tmp_path: Path,
) -> None:
    """Each accepted connection costs an SSL protocol and its buffers before any byte arrives: the
    cap counts it from the accept, so bare TCP clients cannot pile up past it, and a closed one
    frees its place at once."""
    certs = issue(["localhost"], ip_addresses=["127.0.0.1"])
    certfile, keyfile = write_pem_files(certs, tmp_path)
    port = free_port()
    limits = WebhookLimits(max_connections=4, request_timeout_seconds=30.0)

    async def closed_soon(reader: asyncio.StreamReader) -> bool:
        try:
            return await asyncio.wait_for(reader.read(), 1.0) == b""
        except TimeoutError:
            return False

    async def run() -> None:
        app = make_webhook_app(_profiles_for, SETTINGS, limits=limits)
        server = await serve_webhook(app, "127.0.0.1", port, str(certfile), str(keyfile))
        try:
            held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(limits.max_connections)]
            extra_reader, extra_writer = await asyncio.open_connection("127.0.0.1", port)
            assert await closed_soon(extra_reader), "a connection past the cap was held in its handshake"
            extra_writer.close()
            assert not await closed_soon(held[0][0]), "a connection within the cap was closed"
            for _, writer in held:
                writer.close()
                await writer.wait_closed()
            await asyncio.sleep(0.2)
            trust = ssl.create_default_context(cadata=certs.ca.cert_pem.decode())
            # A new connection for each request: finished ones must give their places back too.
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
                for _ in range(limits.max_connections + 2):  # their places are free again
                    async with session.get(f"https://127.0.0.1:{port}/healthz", ssl=trust) as resp:
                        assert resp.status == 200
        finally:
            await server.close()

    asyncio.run(run())


def test_webhook_configuration_never_blocks_and_skips_system_namespaces() -> None:
    config = webhook_configuration("dam-operator", "dam-webhook", "dam-system", ca_bundle=b"PEM")
    assert config["kind"] == "MutatingWebhookConfiguration"
    (hook,) = config["webhooks"]
    assert hook["failurePolicy"] == "Ignore"
    assert hook["sideEffects"] == "None"
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["timeoutSeconds"] <= 5
    assert hook["reinvocationPolicy"] == "IfNeeded"
    assert hook["clientConfig"]["service"] == {
        "name": "dam-webhook",
        "namespace": "dam-system",
        "path": MUTATE_PATH,
        "port": 443,
    }
    assert base64.b64decode(hook["clientConfig"]["caBundle"]) == b"PEM"
    (ns_rule,) = hook["namespaceSelector"]["matchExpressions"]
    assert ns_rule["key"] == "kubernetes.io/metadata.name" and ns_rule["operator"] == "NotIn"
    assert {"kube-system", "dam-system"} <= set(ns_rule["values"])
    (obj_rule,) = hook["objectSelector"]["matchExpressions"]
    assert obj_rule == {"key": "dam.mlsys.dev/inject", "operator": "NotIn", "values": ["false"]}
    assert hook["rules"][0]["resources"] == ["pods"] and hook["rules"][0]["operations"] == ["CREATE"]
    with pytest.raises(ValueError, match="timeout"):
        webhook_configuration("d", "s", "n", timeout_seconds=30)


def test_url_configuration_points_at_the_url() -> None:
    config = webhook_configuration_for_url(
        "dam-test", "https://127.0.0.1:8443/mutate-pods", exclude_namespaces=["x"]
    )
    hook = config["webhooks"][0]
    assert hook["clientConfig"] == {"url": "https://127.0.0.1:8443/mutate-pods"}
    assert "x" in hook["namespaceSelector"]["matchExpressions"][0]["values"]
    with pytest.raises(ValueError, match="https"):
        webhook_configuration_for_url("dam-test", "http://127.0.0.1:8443/")
