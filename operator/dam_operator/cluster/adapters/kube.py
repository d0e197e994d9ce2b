"""The Kubernetes adapter: the few API calls the operator makes outside kopf.

kopf watches (DAMProfiles, pods) and keeps its own API session; the scheduler's
status patches, Events, the webhook certificate Secret and the webhook
configuration go through ``KubeClient``, an aiohttp session built from kopf's own
``ConnectionInfo`` (``login_with_service_account`` here, in a Pod, else kopf's
``login_with_kubeconfig``: the same credentials kopf uses, without the kubernetes client library).

Every call retries 429, 5xx and connection errors with exponential backoff
(``Retry-After`` wins), re-reads the credentials once on 401, and raises
``ApiError`` (``NotFoundError`` for 404) with a bounded ``reason_label``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import kopf

from dam_operator.cluster.steps import status as st

log = logging.getLogger("dam_operator.cluster.kube")

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
RETRYABLE = frozenset({429, 500, 502, 503, 504})


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}" if status else message)
        self.status = status
        self.message = message

    @property
    def reason_label(self) -> str:
        """Bounded label value: api-429, api-5xx, api-4xx, api-connection."""
        if self.status == 0:
            return "api-connection"
        if self.status >= 500:
            return "api-5xx"
        if self.status in (404, 409, 410, 422, 429):
            return f"api-{self.status}"
        return "api-4xx"


class NotFoundError(ApiError):
    """404: the object is gone."""


class ConflictError(ApiError):
    """409: a stale write or an object that already exists."""


class GoneError(ApiError):
    """410: a resourceVersion or a list's continue token the server no longer has: list again."""


Login = Callable[[], kopf.ConnectionInfo | None]


SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
"""Where the kubelet mounts a Pod's service account token, CA and namespace."""
FALLBACK_SERVER = "https://kubernetes.default.svc"


def in_cluster_server(environ: Mapping[str, str]) -> str | None:
    """``https://HOST:PORT`` of the API server from ``KUBERNETES_SERVICE_HOST``/``_PORT``; None without them.

    The kubelet sets both in every container for the ``kubernetes`` Service of the
    ``default`` namespace, even with ``enableServiceLinks: false`` (kubelet_pods.go: "we
    always want to add environment variables for master services"); client-go's
    ``rest.InClusterConfig`` builds its host from the same two variables. An IPv6 address
    is bracketed.
    """
    host = environ.get("KUBERNETES_SERVICE_HOST", "").strip()
    port = environ.get("KUBERNETES_SERVICE_PORT", "").strip()
    if not host or not port:
        return None
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"https://{host}:{port}"


def login_with_service_account(
    *,
    trust_env: bool = False,
    directory: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> kopf.ConnectionInfo | None:
    """The Pod's service account, addressed without cluster DNS; None outside a Pod.

    kopf's ``login_with_service_account`` (kopf 1.45, ``_core/intents/piggybacking.py``)
    always names ``https://kubernetes.default.svc``, which needs cluster DNS. This one reads
    the same token, CA and namespace files and addresses the API server as client-go does,
    by ``KUBERNETES_SERVICE_HOST``/``KUBERNETES_SERVICE_PORT`` (the serving certificate of
    the API server covers the Service's cluster IP); without them it falls back to kopf's name.
    The token is read on every call: bound tokens are rotated by the kubelet, and the
    client logs in again on 401.
    """
    env = os.environ if environ is None else environ
    folder = Path(SERVICE_ACCOUNT_DIR if directory is None else directory)
    token_file = folder / "token"
    if not token_file.is_file():
        return None
    token = token_file.read_text(encoding="utf-8").strip()
    ns_file, ca_file = folder / "namespace", folder / "ca.crt"
    namespace = ns_file.read_text(encoding="utf-8").strip() if ns_file.is_file() else ""
    server = in_cluster_server(env)
    if server is None:
        log.warning(
            "KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT are not set; using %s (needs cluster DNS)",
            FALLBACK_SERVER,
        )
    return kopf.ConnectionInfo(
        server=server or FALLBACK_SERVER,
        ca_path=str(ca_file) if ca_file.is_file() else None,
        token=token or None,
        default_namespace=namespace or None,
        trust_env=trust_env,
    )


def default_login() -> kopf.ConnectionInfo:
    """The in-cluster service account, else the kubeconfig (as kopf's own fallbacks)."""
    settings = kopf.OperatorSettings()
    info = login_with_service_account(trust_env=settings.networking.trust_env) or kopf.login_with_kubeconfig(
        settings=settings
    )
    if info is None:
        raise kopf.LoginError(
            "No Kubernetes credentials: neither a service account nor a kubeconfig was found."
        )
    return info


def pods_path(namespace: str | None) -> str:
    """The pods of ``namespace``, or of all namespaces (None)."""
    return f"/api/v1/namespaces/{quote(namespace)}/pods" if namespace else "/api/v1/pods"


def _retry_after(headers: Mapping[str, str]) -> float | None:
    raw = headers.get("Retry-After")
    if raw is None:
        return None
    try:
        return max(0.0, min(float(raw), 60.0))
    except ValueError:
        return None


class KubeClient:
    def __init__(
        self,
        login: Login = default_login,
        *,
        timeout_seconds: float = 10.0,
        retries: int = 4,
        backoff_seconds: float = 0.5,
        max_connections: int = 16,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._login = login
        self._max_connections = max_connections
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self._retries = retries
        self._backoff = backoff_seconds
        self._sleep = sleep
        self._session: aiohttp.ClientSession | None = None
        self._server = ""
        self.requests = 0
        self.last_success: float | None = None
        """``time.monotonic()`` of the latest answer below 400 (a request, a watch opened or an
        event of it): what readiness calls "the API server is reachable"."""

    # ------------------------------------------------------------ session

    def _open(self) -> aiohttp.ClientSession:
        info = self._login()
        if info is None:
            raise kopf.LoginError("The login function returned no credentials.")
        self._server = info.server.rstrip("/")
        # A request beyond the limit waits in aiohttp for a free connection (its timeout counts).
        connector = aiohttp.TCPConnector(limit=self._max_connections, ssl=info.as_ssl_context())
        self._session = aiohttp.ClientSession(
            connector=connector, headers={**info.as_http_headers(), "User-Agent": "dam-operator"}
        )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _relogin(self) -> None:
        await self.close()
        self._open()

    @property
    def server(self) -> str:
        return self._server

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str = "application/json",
        params: Mapping[str, str] | None = None,
    ) -> Any:
        """One API call with retries; the decoded JSON answer (None for an empty body)."""
        session = self._session or self._open()
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type} if body is not None else {}
        relogged = False
        attempt = 0
        while True:
            self.requests += 1
            delay: float | None = None
            try:
                async with session.request(
                    method,
                    self._server + path,
                    data=data,
                    headers=headers,
                    params=params,
                    timeout=self._timeout,
                ) as resp:
                    text = await resp.text()
                    if resp.status < 400:
                        self.last_success = time.monotonic()
                        return json.loads(text) if text else None
                    message = _message(text)
                    if resp.status == 401 and not relogged:
                        relogged = True
                        await self._relogin()
                        session = self._session or self._open()
                        continue
                    if resp.status == 404:
                        raise NotFoundError(404, message)
                    if resp.status == 409:
                        raise ConflictError(409, message)
                    if resp.status == 410:
                        raise GoneError(410, message)
                    if resp.status not in RETRYABLE or attempt >= self._retries:
                        raise ApiError(resp.status, message)
                    delay = _retry_after(resp.headers)
                    log.debug("%s %s: HTTP %s, retrying", method, path, resp.status)
            except (aiohttp.ClientError, TimeoutError) as exc:
                if attempt >= self._retries:
                    raise ApiError(0, f"{method} {path}: {type(exc).__name__}: {exc}") from None
            if delay is None:
                delay = self._backoff * (2**attempt) * (0.5 + random.random() / 2)
            attempt += 1
            await self._sleep(delay)

    async def watch(
        self, path: str, params: Mapping[str, str], *, read_timeout_seconds: float
    ) -> AsyncIterator[Mapping[str, Any]]:
        """The events of one watch request (``?watch=1``), decoded, until the server ends it.

        One attempt, no retries: the caller resumes from the last resourceVersion it saw.
        Raises ``ApiError`` (``GoneError`` for 410) when the server refuses the watch or a
        connection fails, and ``ApiError(0, ...)`` when nothing (not even a bookmark) arrives
        for ``read_timeout_seconds``. Lines are split here, not by aiohttp's ``readline``,
        whose line limit a large object would exceed.
        """
        session = self._session or self._open()
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self._timeout.total, sock_read=read_timeout_seconds
        )
        self.requests += 1
        try:
            async with session.get(
                self._server + path, params={**params, "watch": "1"}, timeout=timeout
            ) as resp:
                if resp.status >= 400:
                    message = _message(await resp.text())
                    if resp.status == 401:
                        await self._relogin()
                    raise (GoneError if resp.status == 410 else ApiError)(resp.status, message)
                self.last_success = time.monotonic()
                buffer = b""
                async for chunk in resp.content.iter_any():
                    self.last_success = time.monotonic()
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        if line.strip():
                            event = json.loads(line)
                            if isinstance(event, Mapping):
                                yield event
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise ApiError(0, f"watch {path}: {type(exc).__name__}: {exc}") from None

    async def ping(self, timeout_seconds: float) -> None:
        """One ``GET /version`` with no retries (readiness); raises ``ApiError`` when it fails.

        ``/version`` is readable by every client (the ``system:public-info-viewer`` role), so
        the check needs no RBAC of its own.
        """
        session = self._session or self._open()
        self.requests += 1
        try:
            async with session.get(
                self._server + "/version", timeout=aiohttp.ClientTimeout(total=timeout_seconds)
            ) as resp:
                text = await resp.text()
                if resp.status >= 400:
                    if resp.status == 401:
                        await self._relogin()
                    raise ApiError(resp.status, _message(text))
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ApiError(0, f"GET /version: {type(exc).__name__}: {exc}") from None
        self.last_success = time.monotonic()

    async def _get_or_none(self, path: str) -> Mapping[str, Any] | None:
        """The object at ``path``; None where there is none (404)."""
        try:
            return _object_or_none(await self.request("GET", path))
        except NotFoundError:
            return None

    async def _landed(self, method: str, path: str, body: Mapping[str, Any]) -> bool:
        """Writes ``body``: False where the API refuses it with 409 (the object exists already, or
        the write names a resourceVersion that is no longer the object's)."""
        try:
            await self.request(method, path, body=body)
        except ConflictError:
            return False
        return True

    # ------------------------------------------------------------ DAMProfiles

    def _profile_path(self, namespace: str, name: str) -> str:
        return f"/apis/{st.GROUP}/{st.VERSION}/namespaces/{quote(namespace)}/{st.PLURAL}/{quote(name)}"

    async def patch_profile_status(
        self, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> Mapping[str, Any]:
        result = await self.request(
            "PATCH", self._profile_path(namespace, name) + "/status", body=patch, content_type=MERGE_PATCH
        )
        return _object_or_none(result) or {}

    async def get_profile(self, namespace: str, name: str) -> Mapping[str, Any]:
        result = await self.request("GET", self._profile_path(namespace, name))
        return _object_or_none(result) or {}

    # ------------------------------------------------------------ core

    async def create_event(self, namespace: str, body: Mapping[str, Any]) -> None:
        """Post an Event once, even when an answer is lost and the POST is retried: a
        ``generateName`` becomes a name derived from the Event's content, so a retry of a POST
        the server already stored gets 409 AlreadyExists, which means posted."""
        meta = body.get("metadata") or {}
        if meta.get("generateName") and not meta.get("name"):
            digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
            prefix = str(meta["generateName"])[: 253 - len(digest)]
            meta = {k: v for k, v in meta.items() if k != "generateName"} | {"name": prefix + digest}
            body = {**body, "metadata": meta}
        with contextlib.suppress(ConflictError):
            await self.request("POST", f"/api/v1/namespaces/{quote(namespace)}/events", body=body)

    async def get_pod(self, namespace: str, name: str) -> Mapping[str, Any]:
        result = await self.request("GET", f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}")
        return _object_or_none(result) or {}

    async def resize_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> Mapping[str, Any]:
        """Patch a running pod's container resources in place (``pods/resize``, Kubernetes ≥ 1.33).

        The API refuses with 404 where the subresource does not exist, 403 without RBAC for
        ``pods/resize``, 422 for a change it does not allow (e.g. one that changes the QoS class).
        """
        result = await self.request(
            "PATCH",
            f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}/resize",
            body=patch,
            content_type=STRATEGIC_MERGE_PATCH,
        )
        return _object_or_none(result) or {}

    async def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        """Delete the pod ``name`` only if it is still the object ``uid`` (a precondition: a
        StatefulSet's replacement has the same name and must not go); one already gone (404) or
        replaced (409, the precondition failed) is not an error. ``onStall: Restart``."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}
        with contextlib.suppress(NotFoundError, ConflictError):
            await self.request(
                "DELETE", f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}", body=body
            )

    async def list_pods(self, namespace: str | None, label_selector: str = "") -> list[Mapping[str, Any]]:
        path = pods_path(namespace)
        params = {"labelSelector": label_selector} if label_selector else None
        result = await self.request("GET", path, params=params)
        items = result.get("items") if isinstance(result, Mapping) else None
        return list(items or [])

    async def get_secret(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return await self._get_or_none(f"/api/v1/namespaces/{quote(namespace)}/secrets/{quote(name)}")

    async def put_secret(self, namespace: str, name: str, body: Mapping[str, Any]) -> None:
        """Create the Secret, or replace it (on the current resourceVersion)."""
        base = f"/api/v1/namespaces/{quote(namespace)}/secrets"
        if await self._landed("POST", base, body):
            return
        for _ in range(3):
            current = await self.get_secret(namespace, name) or {}
            replacement = json.loads(json.dumps(body))
            rv = (current.get("metadata") or {}).get("resourceVersion")
            if rv:
                replacement.setdefault("metadata", {})["resourceVersion"] = rv
            if await self._landed("PUT", f"{base}/{quote(name)}", replacement):
                return
        raise ConflictError(409, f"secret {namespace}/{name} kept changing under us")

    # ------------------------------------------------------------ admission

    _MWC = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"

    async def get_webhook_configuration(self, name: str) -> Mapping[str, Any] | None:
        return await self._get_or_none(f"{self._MWC}/{quote(name)}")

    async def apply_webhook_configuration(self, body: Mapping[str, Any]) -> None:
        """Create the MutatingWebhookConfiguration, or replace it when it differs."""
        name = body["metadata"]["name"]
        for _ in range(3):
            current = await self.get_webhook_configuration(name)
            if current is None:
                if await self._landed("POST", self._MWC, body):
                    return
                continue
            if current.get("webhooks") == body.get("webhooks"):
                return
            replacement = json.loads(json.dumps(body))
            replacement["metadata"]["resourceVersion"] = (current.get("metadata") or {}).get(
                "resourceVersion"
            )
            if await self._landed("PUT", f"{self._MWC}/{quote(name)}", replacement):
                return
        raise ConflictError(409, f"MutatingWebhookConfiguration {name} kept changing under us")

    async def patch_webhook_ca(self, name: str, ops: list[dict[str, Any]]) -> None:
        if ops:
            await self.request("PATCH", f"{self._MWC}/{quote(name)}", body=ops, content_type=JSON_PATCH)

    async def delete_webhook_configuration(self, name: str) -> None:
        with contextlib.suppress(NotFoundError):
            await self.request("DELETE", f"{self._MWC}/{quote(name)}")


class LeaseClient:
    """The Lease calls of sharding (``runtime/shards.LeaseAPI``) over ``KubeClient``."""

    def __init__(self, kube: KubeClient) -> None:
        self._kube = kube

    @staticmethod
    def _leases_path(namespace: str) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{quote(namespace)}/leases"

    async def list_leases(self, namespace: str, label_selector: str) -> list[Mapping[str, Any]]:
        """The Leases of ``namespace`` that ``label_selector`` selects (one unpaged list: a few)."""
        result = await self._kube.request(
            "GET", self._leases_path(namespace), params={"labelSelector": label_selector}
        )
        items = result.get("items") if isinstance(result, Mapping) else None
        return [i for i in items or () if isinstance(i, Mapping)]

    async def create_lease(self, namespace: str, body: Mapping[str, Any]) -> Mapping[str, Any]:
        """POST a Lease; raises ``ConflictError`` when one of that name exists."""
        answer = await self._kube.request("POST", self._leases_path(namespace), body=body)
        return _object_or_none(answer) or {}

    async def replace_lease(self, namespace: str, name: str, body: Mapping[str, Any]) -> Mapping[str, Any]:
        """PUT a Lease; ``body.metadata.resourceVersion`` makes it conditional (409 when stale)."""
        path = f"{self._leases_path(namespace)}/{quote(name)}"
        return _object_or_none(await self._kube.request("PUT", path, body=body)) or {}

    async def get_lease(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return await self._kube._get_or_none(f"{self._leases_path(namespace)}/{quote(name)}")

    async def delete_lease(self, namespace: str, name: str, resource_version: str | None = None) -> None:
        """Delete a Lease (only at ``resource_version`` when given: a Lease renewed since stays);
        one already gone or changed is not an error."""
        body = None
        if resource_version:
            body = {
                "apiVersion": "v1",
                "kind": "DeleteOptions",
                "preconditions": {"resourceVersion": resource_version},
            }
        with contextlib.suppress(NotFoundError, ConflictError):
            await self._kube.request("DELETE", f"{self._leases_path(namespace)}/{quote(name)}", body=body)


def _object_or_none(answer: Any) -> Mapping[str, Any] | None:
    """The API's answer where it is an object (a JSON mapping), else None."""
    return answer if isinstance(answer, Mapping) else None


def _message(text: str) -> str:
    try:
        doc = json.loads(text)
    except ValueError:
        return text[:300]
    if isinstance(doc, Mapping) and doc.get("message"):
        return str(doc["message"])[:300]
    return text[:300]


class WebhookCertStore:
    """``certs.CertStore`` over ``KubeClient``. The caBundle goes into the webhook
    configuration: the whole configuration (built by ``configuration(ca_pem)``) when
    the operator manages it, else a JSON patch of ``caBundle`` on the existing one.
    ``hold()`` keeps the CA until ``release()`` (register only once the server serves)."""

    def __init__(
        self,
        kube: KubeClient,
        configuration: Callable[[bytes], Mapping[str, Any]] | None,
        ca_patch: Callable[[Mapping[str, Any], bytes], list[dict[str, Any]]],
    ) -> None:
        self._kube = kube
        self._configuration = configuration
        self._ca_patch = ca_patch
        self._held = True
        self._pending: tuple[str, bytes] | None = None

    async def get_secret(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return await self._kube.get_secret(namespace, name)

    async def put_secret(self, namespace: str, name: str, body: Mapping[str, Any]) -> None:
        await self._kube.put_secret(namespace, name, body)

    async def patch_webhook_ca(self, configuration_name: str, ca_bundle_pem: bytes) -> None:
        if self._held:
            self._pending = (configuration_name, ca_bundle_pem)
            return
        await self._register(configuration_name, ca_bundle_pem)

    async def release(self) -> None:
        self._held = False
        if self._pending is not None:
            name, ca = self._pending
            self._pending = None
            await self._register(name, ca)

    async def _register(self, name: str, ca: bytes) -> None:
        if self._configuration is not None:
            await self._kube.apply_webhook_configuration(self._configuration(ca))
            return
        current = await self._kube.get_webhook_configuration(name)
        if current is None:
            log.warning("MutatingWebhookConfiguration %s does not exist; pods will not be instrumented", name)
            return
        await self._kube.patch_webhook_ca(name, self._ca_patch(current, ca))
