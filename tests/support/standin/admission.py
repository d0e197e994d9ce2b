"""Calling admission webhooks the way the API server does (AdmissionReview v1 over HTTPS)."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import uuid
from typing import Any

import aiohttp

from .cluster import Cluster
from .errors import ApiError
from .patching import json_patch
from .registry import ResourceType
from .selectors import LabelSelector

MUTATING = ("admissionregistration.k8s.io", "mutatingwebhookconfigurations")
VALIDATING = ("admissionregistration.k8s.io", "validatingwebhookconfigurations")


def _rule_matches(rule: dict[str, Any], rt: ResourceType, operation: str) -> bool:
    def has(values: list[str] | None, value: str) -> bool:
        return bool(values) and ("*" in (values or []) or value in (values or []))

    if not has(rule.get("operations"), operation) and not has(rule.get("operations"), "*"):
        return False
    if not has(rule.get("apiGroups"), rt.group) or not has(rule.get("apiVersions"), rt.version):
        return False
    resources = rule.get("resources") or []
    if not ("*" in resources or "*/*" in resources or rt.plural in resources):
        return False
    scope = str(rule.get("scope", "*"))
    return scope == "*" or (scope == "Namespaced") == rt.namespaced


class Admission:
    """Finds the webhooks whose rules and selectors match and calls them."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.session: aiohttp.ClientSession | None = None
        self.service_endpoints: dict[tuple[str, str], tuple[str, int]] = {}
        self.calls = 0
        self._contexts: dict[str, ssl.SSLContext] = {}

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None
            await asyncio.sleep(0.1)  # let TLS connections finish closing (aiohttp's graceful shutdown)

    def _matching(
        self, key: tuple[str, str], rt: ResourceType, operation: str, obj: dict[str, Any]
    ) -> list[dict[str, Any]]:
        store = self.cluster.stores.get(key)
        if store is None or store.count == 0:
            return []
        meta = obj.get("metadata") or {}
        found = []
        for config in sorted(store.iter(None), key=lambda c: c["metadata"]["name"]):
            for hook in config.get("webhooks") or []:
                if not any(_rule_matches(rule, rt, operation) for rule in hook.get("rules") or []):
                    continue
                if not LabelSelector.from_object(hook.get("objectSelector")).matches(meta.get("labels")):
                    continue
                if rt.namespaced or rt.storage == ("", "namespaces"):
                    ns_name = meta.get("namespace") if rt.namespaced else meta.get("name")
                    ns_labels = self.cluster.namespace_labels(ns_name or "") or (
                        meta.get("labels") if not rt.namespaced else {}
                    )
                    if not LabelSelector.from_object(hook.get("namespaceSelector")).matches(ns_labels):
                        continue
                found.append(hook)
        return found

    def _ssl(self, ca_bundle: str | None) -> ssl.SSLContext:
        key = ca_bundle or ""
        context = self._contexts.get(key)
        if context is None:
            context = ssl.create_default_context()
            if ca_bundle:
                context.load_verify_locations(cadata=base64.b64decode(ca_bundle).decode())
            self._contexts[key] = context
        return context

    def _target(self, client: dict[str, Any]) -> tuple[str, str | None]:
        """The URL to post to and the TLS server name to verify."""
        if client.get("url"):
            return client["url"], None
        service = client.get("service") or {}
        name, namespace = service.get("name", ""), service.get("namespace", "")
        port = int(service.get("port", 443))
        path = service.get("path", "/")
        host = f"{name}.{namespace}.svc"
        endpoint = self.service_endpoints.get((namespace, name))
        if endpoint is None:
            return f"https://{host}:{port}{path}", None
        return f"https://{endpoint[0]}:{endpoint[1]}{path}", host

    async def _call(self, hook: dict[str, Any], review: dict[str, Any]) -> dict[str, Any]:
        if self.session is None:
            self.session = aiohttp.ClientSession()
        client = hook.get("clientConfig") or {}
        url, server_name = self._target(client)
        timeout = aiohttp.ClientTimeout(total=float(hook.get("timeoutSeconds", 10)))
        self.calls += 1
        async with self.session.post(
            url,
            json=review,
            ssl=self._ssl(client.get("caBundle")),
            server_hostname=server_name,
            timeout=timeout,
        ) as response:
            if response.status != 200:
                raise RuntimeError(f"received invalid webhook response: HTTP {response.status}")
            body = await response.json(content_type=None)
        answer = body.get("response") if isinstance(body, dict) else None
        if not isinstance(answer, dict):
            raise RuntimeError("received invalid webhook response: no response")
        if answer.get("uid") != review["request"]["uid"]:
            raise RuntimeError(
                f"expected response.uid={review['request']['uid']!r}, got {answer.get('uid')!r}"
            )
        return answer

    def _review(
        self, rt: ResourceType, operation: str, obj: dict[str, Any], old: dict[str, Any] | None, dry_run: bool
    ) -> dict[str, Any]:
        meta = obj.get("metadata") or {}
        kind = {"group": rt.group, "version": rt.version, "kind": rt.kind}
        resource = {"group": rt.group, "version": rt.version, "resource": rt.plural}
        options_kind = "CreateOptions" if operation == "CREATE" else "UpdateOptions"
        request = {
            "uid": str(uuid.uuid4()),
            "kind": kind,
            "resource": resource,
            "requestKind": kind,
            "requestResource": resource,
            "name": meta.get("name", ""),
            "operation": operation,
            "userInfo": {"username": "system:admin", "groups": ["system:masters", "system:authenticated"]},
            "object": obj,
            "oldObject": old,
            "dryRun": dry_run,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": options_kind},
        }
        if rt.namespaced:
            request["namespace"] = meta.get("namespace", "")
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}

    async def _run(
        self,
        key: tuple[str, str],
        rt: ResourceType,
        operation: str,
        obj: dict[str, Any],
        old: dict[str, Any] | None,
        *,
        dry_run: bool,
    ) -> dict[str, Any]:
        for hook in self._matching(key, rt, operation, obj):
            name = hook.get("name", "")
            review = self._review(rt, operation, obj, old, dry_run)
            try:
                answer = await self._call(hook, review)
            except (TimeoutError, aiohttp.ClientError, OSError, RuntimeError, ValueError) as e:
                if hook.get("failurePolicy", "Fail") == "Ignore":
                    continue
                why = "context deadline exceeded" if isinstance(e, asyncio.TimeoutError) else str(e)
                raise ApiError(
                    500,
                    "InternalError",
                    f'Internal error occurred: failed calling webhook "{name}": '
                    f"failed to call webhook: {why}",
                ) from None
            if not answer.get("allowed"):
                status = answer.get("status") or {}
                message = status.get("message") or ""
                raise ApiError(
                    int(status.get("code") or 403),
                    status.get("reason") or "Forbidden",
                    f'admission webhook "{name}" denied the request: {message}'.rstrip(": "),
                )
            if key == MUTATING and answer.get("patch"):
                if answer.get("patchType", "JSONPatch") != "JSONPatch":
                    raise ApiError(
                        500, "InternalError", f'webhook "{name}" returned an unsupported patchType'
                    )
                try:
                    operations = json.loads(base64.b64decode(answer["patch"]))
                    obj = json_patch(obj, operations)
                except (ValueError, ApiError) as e:
                    raise ApiError(
                        500,
                        "InternalError",
                        f'Internal error occurred: webhook "{name}" returned an invalid patch: {e}',
                    ) from None
        return obj

    async def mutate(
        self, rt: ResourceType, operation: str, obj: dict[str, Any], old: dict[str, Any] | None, dry_run: bool
    ) -> dict[str, Any]:
        return await self._run(MUTATING, rt, operation, obj, old, dry_run=dry_run)

    async def validate(
        self, rt: ResourceType, operation: str, obj: dict[str, Any], old: dict[str, Any] | None, dry_run: bool
    ) -> dict[str, Any]:
        return await self._run(VALIDATING, rt, operation, obj, old, dry_run=dry_run)
