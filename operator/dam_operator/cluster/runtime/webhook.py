"""The mutating admission webhook that injects the dam sidecar into training pods.

``POST /mutate-pods`` takes an AdmissionReview (admission.k8s.io/v1) and answers
one: the request's uid echoed, ``allowed: true`` always, and, when a DAMProfile
in the pod's namespace selects the pod, a base64 JSON patch (``patchType:
JSONPatch``); with ``spec.actions.mode`` Apply or InPlace the patch also carries the
settings the profile's ``status.actions`` keep (``actions.desired_for``). The webhook
never blocks pod creation: any error, including a body that is not an AdmissionReview,
is answered "allowed, no patch" with a warning (kubectl prints it) and counted.
``GET /healthz`` answers ``ok``.

The server holds nobody's connection for long (``WebhookLimits``): a request's headers and body
must arrive within ``request_timeout_seconds`` of the connection's start (or of the previous
answer on a kept-alive connection), a TLS handshake within the same time, a body is at most
``max_body_bytes``, the bodies being read at once take at most ``max_buffered_bytes``, and at
most ``max_connections`` connections are open; beyond that a new one is closed at once. Whatever
is cut short is counted as ``error`` and answered, where it can be, "allowed, no patch".

``webhook_configuration`` builds the MutatingWebhookConfiguration that points
the API server here (``failurePolicy: Ignore``, short timeout, kube-system and
the operator's namespace excluded, opt-out label honoured).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import ssl
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from aiohttp import web

from dam_operator.cluster.steps.actions import desired_for
from dam_operator.cluster.steps.injection import (
    LABEL_INJECT,
    InjectionError,
    InjectionSettings,
    build_injection,
    should_inject,
    skip_patch,
)
from dam_operator.cluster.steps.metric_names import WEBHOOK_RESULTS
from dam_operator.cluster.steps.spec import DAMProfileSpec, selector_matches

__all__ = [
    "MUTATE_PATH",
    "WEBHOOK_NAME",
    "ProfileRef",
    "WebhookServer",
    "admission_response",
    "make_webhook_app",
    "review",
    "serve_webhook",
    "webhook_configuration",
    "webhook_configuration_for_url",
]

log = logging.getLogger("dam_operator.cluster.webhook")

MUTATE_PATH = "/mutate-pods"
HEALTH_PATH = "/healthz"
WEBHOOK_NAME = "pods.dam.mlsys.dev"
MAX_BODY_BYTES = 4 * 1024 * 1024  # the API server takes request bodies of at most 3 MiB (a Pod included)

# Results counted by the ``metrics`` callback (bounded label values).
RESULT_INJECTED, RESULT_SKIPPED, RESULT_NO_PROFILE, RESULT_ERROR = WEBHOOK_RESULTS


class ProfileRef(NamedTuple):
    namespace: str
    name: str
    spec: DAMProfileSpec
    status: Mapping[str, Any] = {}
    """The profile's last status: ``status.actions`` decides what a new pod gets (mode Apply)."""


ProfilesFor = Callable[[str], Sequence[ProfileRef]]
MetricsCallback = Callable[[str], None]


@dataclass(frozen=True)
class WebhookLimits:
    """How much of the operator one webhook client can hold, and for how long.

    The API server gives up on the webhook after the configuration's ``timeoutSeconds`` (1..5), so
    a request that takes longer than that to arrive is not the API server's; the defaults leave
    slack for a slow network. aiohttp (3.10+) arms its keep-alive timer when a connection opens
    and re-arms it after each answer; when it fires while the request's headers are incomplete
    it closes the connection, so ``keepalive_timeout`` is the header timeout too.
    """

    request_timeout_seconds: float = 10.0
    max_body_bytes: int = MAX_BODY_BYTES
    # Each open connection weighs up to 0.64 MiB measured (0.31 MiB before a byte of its request:
    # asyncio's SSL protocol with its 256 KiB read buffer; the rest, its request's bytes in
    # asyncio's, OpenSSL's and aiohttp's buffers), a body taken whole about 2.5 x its bytes: these
    # two caps are what the chart's memory limit holds for the webhook (docs/performance.md).
    max_buffered_bytes: int = 32 * 1024 * 1024
    max_connections: int = 512
    max_header_bytes: int = 8190  # per line and per header field (aiohttp's defaults)
    max_headers: int = 64

    @classmethod
    def for_timeout(cls, timeout_seconds: int) -> WebhookLimits:
        """Limits for a webhook registered with ``timeoutSeconds``: twice that, and 10 s at least."""
        return cls(request_timeout_seconds=max(10.0, 2.0 * timeout_seconds))


class _Budget:
    """Bytes of request bodies held at once, over every connection."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, n: int) -> bool:
        if self.used + n > self.limit:
            return False
        self.used += n
        return True

    def give(self, n: int) -> None:
        self.used -= n


class _BodyRefusedError(Exception):
    pass


@dataclass
class Decision:
    result: str
    patch: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    profile: str | None = None
    reason: str = ""


def admission_response(uid: str, decision: Decision) -> dict[str, Any]:
    """The AdmissionReview answer: always allowed; a JSONPatch when there is one."""
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if decision.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(decision.patch).encode()).decode("ascii")
    if decision.warnings:
        response["warnings"] = decision.warnings
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def _matching_profile(
    pod: Mapping[str, Any], namespace: str, profiles_for: ProfilesFor
) -> tuple[ProfileRef | None, list[str]]:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    matching = sorted(
        (p for p in profiles_for(namespace) if selector_matches(p.spec.selector, labels)),
        key=lambda p: p.name,
    )
    warnings: list[str] = []
    if len(matching) > 1:
        names = ", ".join(p.name for p in matching)
        warnings.append(
            f"dam: pod matches several DAMProfiles ({names}); instrumenting it for {matching[0].name}"
        )
    return (matching[0] if matching else None), warnings


def review(request: Mapping[str, Any], profiles_for: ProfilesFor, settings: InjectionSettings) -> Decision:
    """The decision for one AdmissionRequest (the ``request`` member of the review). May raise."""
    kind = (request.get("kind") or {}).get("kind")
    if kind != "Pod" or request.get("operation") != "CREATE":
        return Decision(RESULT_SKIPPED)
    pod = request.get("object")
    if not isinstance(pod, Mapping):
        raise ValueError("the AdmissionRequest carries no pod object")
    namespace = str(request.get("namespace") or (pod.get("metadata") or {}).get("namespace") or "")
    eligible, reason = should_inject(pod, namespace, settings)
    if not eligible:
        return Decision(RESULT_SKIPPED, reason=reason)
    profile, warnings = _matching_profile(pod, namespace, profiles_for)
    if profile is None:
        return Decision(RESULT_NO_PROFILE)
    if not profile.spec.sidecar.inject:
        return Decision(RESULT_SKIPPED, profile=profile.name)
    try:
        injection = build_injection(
            pod, profile.name, profile.spec, settings, desired_for(profile.spec, profile.status)
        )
    except InjectionError as exc:
        # Admitted as it is but for a note saying why, which the profile's status reads back.
        warnings.append(f"dam: pod not instrumented for DAMProfile {profile.name}: {exc}")
        return Decision(RESULT_SKIPPED, skip_patch(pod, exc.note), warnings, profile.name, exc.note)
    warnings.extend(f"dam: {w}" for w in injection.warnings)
    patch = injection.patch
    return Decision(RESULT_INJECTED if patch else RESULT_SKIPPED, patch, warnings, profile.name)


_LIMITS_KEY: web.AppKey[WebhookLimits] = web.AppKey("limits", WebhookLimits)
_BUDGET_KEY: web.AppKey[_Budget] = web.AppKey("budget", _Budget)
_PROFILES_KEY: web.AppKey[ProfilesFor] = web.AppKey("profiles_for")
_SETTINGS_KEY: web.AppKey[InjectionSettings] = web.AppKey("settings", InjectionSettings)
_METRICS_KEY: web.AppKey[MetricsCallback | None] = web.AppKey("metrics")


def _count(app: web.Application, result: str) -> None:
    callback = app[_METRICS_KEY]
    if callback is None:
        return
    try:
        callback(result)
    except Exception:  # a metrics failure must not change the answer
        log.exception("webhook metrics callback failed")


async def _read_body(request: web.Request, limits: WebhookLimits, budget: _Budget, held: list[int]) -> bytes:
    """The body, within the size cap and the shared budget; ``held[0]``: what it took of the budget
    (the caller gives it back, whatever happened)."""
    declared = request.content_length
    if declared is not None and declared > limits.max_body_bytes:
        raise _BodyRefusedError(f"a body of {declared} bytes is over the {limits.max_body_bytes}-byte cap")
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = await request.content.read(64 * 1024)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > limits.max_body_bytes:
            raise _BodyRefusedError(f"the body is over the {limits.max_body_bytes}-byte cap")
        if not budget.take(len(chunk)):
            raise _BodyRefusedError("the webhook holds too many request bodies at once")
        chunks.append(chunk)
        held[0] += len(chunk)


def _close(request: web.Request) -> None:
    if request.transport is not None:
        request.transport.close()


async def _mutate(request: web.Request) -> web.Response:
    app = request.app
    limits, budget = app[_LIMITS_KEY], app[_BUDGET_KEY]
    uid = ""
    held = [0]
    try:
        try:
            # The request's own deadline, from the start of its body (the headers had theirs).
            async with asyncio.timeout(limits.request_timeout_seconds):
                body = await _read_body(request, limits, budget, held)
        except (TimeoutError, _BodyRefusedError) as exc:
            # Not the API server (it sends a whole AdmissionReview at once): let the connection go.
            why = "a body that did not arrive in time" if isinstance(exc, TimeoutError) else str(exc)
            log.debug("webhook closed a connection: %s", why)
            _count(app, RESULT_ERROR)
            _close(request)
            return web.json_response(
                admission_response("", Decision(RESULT_ERROR, warnings=[f"dam: not injected: {why}"])),
                status=413 if isinstance(exc, _BodyRefusedError) else 408,
            )
        finally:
            budget.give(held[0])
        document = json.loads(body)
        if not isinstance(document, Mapping) or not isinstance(document.get("request"), Mapping):
            raise ValueError("the body is not an AdmissionReview with a request")
        admission = document["request"]
        uid = str(admission.get("uid") or "")
        decision = review(admission, app[_PROFILES_KEY], app[_SETTINGS_KEY])
    except Exception as exc:  # never block a pod: admit unchanged, say why, count it
        log.warning("webhook admitted a pod unchanged after an error: %s", exc, exc_info=True)
        decision = Decision(
            RESULT_ERROR,
            warnings=[f"dam: sidecar not injected (webhook error: {type(exc).__name__}: {str(exc)[:200]})"],
        )
    _count(app, decision.result)
    if decision.result == RESULT_INJECTED:
        log.info("injected the dam sidecar (profile %s, uid %s)", decision.profile, uid)
    return web.json_response(admission_response(uid, decision))


async def _healthz(_: web.Request) -> web.Response:
    return web.Response(text="ok")


def make_webhook_app(
    profiles_for: ProfilesFor,
    settings: InjectionSettings,
    metrics: MetricsCallback | None = None,
    limits: WebhookLimits | None = None,
) -> web.Application:
    """The webhook application. ``profiles_for(namespace)`` returns that namespace's profiles
    (from the operator's in-memory index: the webhook makes no API call); ``metrics(result)``
    counts each answer (``injected``, ``skipped``, ``no-profile``, ``error``)."""
    limits = limits or WebhookLimits()
    app = web.Application(client_max_size=limits.max_body_bytes)
    app[_LIMITS_KEY] = limits
    app[_BUDGET_KEY] = _Budget(limits.max_buffered_bytes)
    app[_PROFILES_KEY] = profiles_for
    app[_SETTINGS_KEY] = settings
    app[_METRICS_KEY] = metrics
    app.router.add_post(MUTATE_PATH, _mutate)
    app.router.add_get(HEALTH_PATH, _healthz)
    return app


@dataclass
class WebhookServer:
    runner: web.AppRunner
    ssl_context: ssl.SSLContext
    certfile: str
    keyfile: str
    listener: asyncio.Server | None = None
    handshakes: set[_Handshake] = field(default_factory=set)

    def reload_certificate(self) -> None:
        """Load renewed files; new connections use them (no restart)."""
        self.ssl_context.load_cert_chain(self.certfile, self.keyfile)

    async def close(self) -> None:
        if self.listener is not None:
            self.listener.close()
        for pending in list(self.handshakes):
            pending.cancel()
        await self.runner.cleanup()


class _Handshake(asyncio.Protocol):
    """One accepted TCP connection before its TLS handshake is done.

    It counts toward ``max_connections`` from the accept on: a connection over the cap is
    closed at once, before asyncio builds its SSL protocol (and that protocol's 256 KiB read
    buffer; 3,000 bare TCP connections that never started a handshake took the operator from 73
    to 975 MiB while the cap counted only connections past their handshake). Under the cap, TLS
    is started on it (``loop.start_tls``, server side, within the request timeout) and the
    connection is handed to aiohttp's protocol, which counts it from then on
    (``handler.connections``).
    """

    def __init__(
        self,
        server: WebhookServer,
        make_protocol: Callable[[], asyncio.Protocol],
        at_cap: Callable[[], bool],
        timeout_seconds: float,
    ) -> None:
        self._server = server
        self._make_protocol = make_protocol
        self._at_cap = at_cap
        self._timeout = timeout_seconds
        self._task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        if self._at_cap():
            transport.abort()
            return
        self._server.handshakes.add(self)
        transport.pause_reading()  # the client's first bytes wait in the kernel for the TLS layer
        self._task = asyncio.get_running_loop().create_task(self._start_tls(transport))

    async def _start_tls(self, transport: asyncio.Transport) -> None:
        protocol = self._make_protocol()
        try:
            # start_tls answers with the TLS transport once the handshake is done; it does not
            # call the protocol's connection_made (asyncio: call_connection_made=False).
            tls = await asyncio.get_running_loop().start_tls(
                transport,
                protocol,
                self._server.ssl_context,
                server_side=True,
                ssl_handshake_timeout=self._timeout,
            )
        except (OSError, ssl.SSLError, TimeoutError, asyncio.CancelledError) as exc:
            # A failed, timed-out or cut handshake, or the server closing: nothing to answer.
            log.debug("webhook: TLS handshake not completed: %r", exc)
            transport.abort()
            return
        finally:
            self._server.handshakes.discard(self)
        if tls is None:  # the connection closed as the handshake ended
            transport.abort()
            return
        protocol.connection_made(tls)

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()


async def serve_webhook(
    app: web.Application, host: str, port: int, certfile: str, keyfile: str
) -> WebhookServer:
    """Serve ``app`` over TLS (1.2+) on host:port within its ``WebhookLimits``; ``await server.close()``."""
    limits = app.get(_LIMITS_KEY) or WebhookLimits()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certfile, keyfile)
    runner = web.AppRunner(
        app,
        access_log=None,
        keepalive_timeout=limits.request_timeout_seconds,  # also the header timeout (``WebhookLimits``)
        lingering_time=1.0,  # an answered request whose body was not read whole: not held for long
        max_line_size=limits.max_header_bytes,
        max_field_size=limits.max_header_bytes,
        max_headers=limits.max_headers,
    )
    await runner.setup()
    handler = runner.server
    assert handler is not None
    server = WebhookServer(runner, context, certfile, keyfile)

    def at_cap() -> bool:
        # Connections in their handshake plus those past it (aiohttp's own list).
        return len(server.handshakes) + len(handler.connections) >= limits.max_connections

    def connection() -> asyncio.BaseProtocol:
        return _Handshake(server, handler, at_cap, limits.request_timeout_seconds)

    # TLS is started per connection (``_Handshake``), after the cap is checked: no ``ssl=`` here.
    server.listener = await asyncio.get_running_loop().create_server(
        connection, host, port, backlog=1024, reuse_address=True
    )
    return server


# ---------------------------------------------------------------- configuration


def _webhook(
    client_config: dict[str, Any],
    timeout_seconds: int,
    exclude_namespaces: Sequence[str],
) -> dict[str, Any]:
    if not 1 <= timeout_seconds <= 5:
        raise ValueError("timeout_seconds must be between 1 and 5: pod creation waits on the webhook")
    excluded = sorted({"kube-system", *exclude_namespaces})
    return {
        "name": WEBHOOK_NAME,
        "admissionReviewVersions": ["v1"],
        "clientConfig": client_config,
        "rules": [
            {
                "operations": ["CREATE"],
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "resources": ["pods"],
                "scope": "Namespaced",
            }
        ],
        "failurePolicy": "Ignore",
        "matchPolicy": "Equivalent",
        "sideEffects": "None",
        "timeoutSeconds": timeout_seconds,
        "reinvocationPolicy": "IfNeeded",
        "namespaceSelector": {
            "matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": excluded}
            ]
        },
        # Labels only (annotations are invisible to selectors); the annotation opt-out
        # is honoured by the webhook itself.
        "objectSelector": {
            "matchExpressions": [{"key": LABEL_INJECT, "operator": "NotIn", "values": ["false"]}]
        },
    }


def _configuration(name: str, hook: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "dam-operator"}},
        "webhooks": [hook],
    }


def _ca(ca_bundle: bytes | str | None) -> dict[str, Any]:
    if not ca_bundle:
        return {}
    if isinstance(ca_bundle, bytes):
        return {"caBundle": base64.b64encode(ca_bundle).decode("ascii")}
    return {"caBundle": ca_bundle}  # already base64


def webhook_configuration(
    name: str,
    service_name: str,
    namespace: str,
    path: str = MUTATE_PATH,
    ca_bundle: bytes | str | None = None,
    *,
    timeout_seconds: int = 5,
    exclude_namespaces: Sequence[str] = (),
    port: int = 443,
) -> dict[str, Any]:
    """The MutatingWebhookConfiguration for the webhook behind Service ``namespace/service_name``.

    ``ca_bundle``: PEM bytes (encoded here) or a base64 string. The operator's
    namespace is always excluded, as is kube-system.
    """
    client = {"service": {"name": service_name, "namespace": namespace, "path": path, "port": port}}
    client.update(_ca(ca_bundle))
    return _configuration(name, _webhook(client, timeout_seconds, [namespace, *exclude_namespaces]))


def webhook_configuration_for_url(
    name: str,
    url: str,
    ca_bundle: bytes | str | None = None,
    *,
    timeout_seconds: int = 5,
    exclude_namespaces: Sequence[str] = (),
) -> dict[str, Any]:
    """The same configuration with ``clientConfig.url`` (a webhook outside the cluster, tests)."""
    if not url.startswith("https://"):
        raise ValueError("an admission webhook URL must be https://")
    client: dict[str, Any] = {"url": url}
    client.update(_ca(ca_bundle))
    return _configuration(name, _webhook(client, timeout_seconds, exclude_namespaces))
