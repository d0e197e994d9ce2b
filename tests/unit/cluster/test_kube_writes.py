"""The KubeClient's create-or-replace writes (the webhook's Secret and configuration) against a
scripted local API server: which requests they make, in which order, with which bodies."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import kopf
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from dam_operator.cluster.adapters.kube import ConflictError, KubeClient

SECRETS = "/api/v1/namespaces/ns/secrets"
MWC = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
Answer = tuple[int, Any]
Seen = list[tuple[str, str, Any]]


def _scripted(answers: list[Answer], call: Callable[[KubeClient], Awaitable[None]]) -> tuple[Seen, Any]:
    """Each request gets the next answer; what was asked, and what ``call`` raised (or None)."""
    seen: Seen = []

    async def handler(request: web.Request) -> web.Response:
        text = await request.text()
        seen.append((request.method, request.path, json.loads(text) if text else None))
        status, body = answers.pop(0)
        return web.json_response(body, status=status)

    async def scenario() -> Any:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handler)
        async with TestServer(app) as server:
            kube = KubeClient(lambda: kopf.ConnectionInfo(server=str(server.make_url(""))), retries=0)
            try:
                await call(kube)
            except ConflictError as exc:
                return exc
            finally:
                await kube.close()
        return None

    raised = asyncio.run(scenario())
    assert answers == [], "every scripted answer is asked for"
    return seen, raised


SECRET = {"metadata": {"name": "s"}, "data": {"k": "dg=="}}
CONFLICT: Answer = (409, {"message": "conflict"})


def _put_secret(kube: KubeClient) -> Awaitable[None]:
    return kube.put_secret("ns", "s", SECRET)


def test_a_new_secret_is_created_with_one_post() -> None:
    seen, raised = _scripted([(201, {})], _put_secret)
    assert raised is None
    assert seen == [("POST", SECRETS, SECRET)]


def test_an_existing_secret_is_replaced_on_its_resource_version() -> None:
    seen, raised = _scripted(
        [CONFLICT, (200, {"metadata": {"name": "s", "resourceVersion": "5"}}), (200, {})], _put_secret
    )
    assert raised is None
    replacement = {"metadata": {"name": "s", "resourceVersion": "5"}, "data": {"k": "dg=="}}
    assert seen == [
        ("POST", SECRETS, SECRET),
        ("GET", f"{SECRETS}/s", None),
        ("PUT", f"{SECRETS}/s", replacement),
    ]


def test_a_secret_gone_between_the_post_and_the_get_is_put_without_a_resource_version() -> None:
    seen, _ = _scripted([CONFLICT, (404, {"message": "gone"}), (200, {})], _put_secret)
    assert seen[-1] == ("PUT", f"{SECRETS}/s", SECRET)


def test_a_secret_that_keeps_changing_is_given_up_after_three_replacements() -> None:
    current = (200, {"metadata": {"resourceVersion": "1"}})
    seen, raised = _scripted([CONFLICT, *[current, CONFLICT] * 3], _put_secret)
    assert [method for method, _, _ in seen] == ["POST", "GET", "PUT", "GET", "PUT", "GET", "PUT"]
    assert isinstance(raised, ConflictError) and raised.status == 409
    assert str(raised) == "HTTP 409: secret ns/s kept changing under us"


HOOKS = [{"name": "w.dam.mlsys.dev", "clientConfig": {"caBundle": "new"}}]
CONFIGURATION = {"metadata": {"name": "w"}, "webhooks": HOOKS}


def _apply(kube: KubeClient) -> Awaitable[None]:
    return kube.apply_webhook_configuration(CONFIGURATION)


def test_a_missing_configuration_is_created() -> None:
    seen, raised = _scripted([(404, {"message": "not found"}), (201, {})], _apply)
    assert raised is None
    assert seen == [("GET", f"{MWC}/w", None), ("POST", MWC, CONFIGURATION)]


def test_an_equal_configuration_is_left_alone() -> None:
    seen, _ = _scripted([(200, {"metadata": {"resourceVersion": "3"}, "webhooks": HOOKS})], _apply)
    assert seen == [("GET", f"{MWC}/w", None)]


@pytest.mark.parametrize(("current_meta", "version"), [({"resourceVersion": "7"}, "7"), ({}, None)])
def test_a_different_configuration_is_replaced_on_its_resource_version(
    current_meta: dict[str, str], version: str | None
) -> None:
    old = (200, {"metadata": current_meta, "webhooks": []})
    seen, raised = _scripted([old, (200, {})], _apply)
    assert raised is None
    replacement = {"metadata": {"name": "w", "resourceVersion": version}, "webhooks": HOOKS}
    assert seen == [("GET", f"{MWC}/w", None), ("PUT", f"{MWC}/w", replacement)]


def test_a_configuration_that_keeps_changing_is_given_up_after_three_rounds() -> None:
    missing = (404, {"message": "not found"})
    old = (200, {"metadata": {"resourceVersion": "1"}, "webhooks": []})
    seen, raised = _scripted([missing, CONFLICT, old, CONFLICT, missing, CONFLICT], _apply)
    assert [method for method, _, _ in seen] == ["GET", "POST", "GET", "PUT", "GET", "POST"]
    assert str(raised) == "HTTP 409: MutatingWebhookConfiguration w kept changing under us"


def test_a_pod_is_deleted_only_if_it_is_still_the_uid_judged_and_gone_or_replaced_is_no_error() -> None:
    def delete(kube: KubeClient) -> Awaitable[None]:
        return kube.delete_pod("ns", "trainer-0", "uid-1")

    seen, raised = _scripted([(200, {"kind": "Pod"})], delete)
    assert raised is None
    assert seen == [
        (
            "DELETE",
            "/api/v1/namespaces/ns/pods/trainer-0",
            {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": "uid-1"}},
        )
    ]
    for status in (404, 409):  # already gone; a replacement of the same name (the precondition failed)
        _, raised = _scripted([(status, {"message": "x"})], delete)
        assert raised is None
