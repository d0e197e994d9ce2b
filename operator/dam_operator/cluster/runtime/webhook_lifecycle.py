"""The pod webhook's life: serve it, keep its certificate and registration current, and
never stop the operator when it cannot start (log, retry with backoff).

Without the webhook new pods start uninstrumented and the profiles' ``Instrumented``
condition says so; diagnosis of instrumented pods goes on.

Certificates: ``cert_mode=self-signed`` makes a CA and a serving certificate with
``certs.CertManager`` (kept in a Secret, renewed before expiry); ``cert_mode=files``
serves what cert-manager mounts and reloads it when the files change.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ipaddress
import logging
import os
import shutil
import ssl
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from dam_operator.cluster.adapters import certs
from dam_operator.cluster.adapters.kube import KubeClient, WebhookCertStore
from dam_operator.cluster.runtime.webhook import (
    MUTATE_PATH,
    WEBHOOK_NAME,
    ProfileRef,
    WebhookLimits,
    WebhookServer,
    make_webhook_app,
    serve_webhook,
    webhook_configuration,
    webhook_configuration_for_url,
)
from dam_operator.cluster.settings import OperatorSettings
from dam_operator.cluster.steps.injection import InjectionSettings
from dam_operator.cluster.steps.registry import Registry

log = logging.getLogger("dam_operator.cluster.webhook")

WEBHOOK_RETRY_FIRST_SECONDS = 5.0
WEBHOOK_RETRY_MAX_SECONDS = 300.0
CERT_RENEW_CHECK_SECONDS = 6 * 3600.0
CERT_FILES_CHECK_SECONDS = 60.0


def _url_host(url: str | None) -> tuple[list[str], list[str]]:
    """(extra DNS names, IP addresses) for the serving certificate of a URL-registered webhook."""
    if not url:
        return [], []
    host = urlsplit(url).hostname or ""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return ([host] if host else []), []
    return [], [host]


def configuration_builder(settings: OperatorSettings) -> Callable[[bytes | None], dict[str, Any]]:
    """The MutatingWebhookConfiguration for a CA bundle, registered by Service or by URL."""

    def build(ca: bytes | None) -> dict[str, Any]:
        excluded = [settings.operator_namespace, *settings.excluded_namespaces]
        if settings.webhook_url:
            return webhook_configuration_for_url(
                settings.webhook_configuration_name,
                settings.webhook_url,
                ca_bundle=ca,
                timeout_seconds=settings.webhook_timeout_seconds,
                exclude_namespaces=excluded,
            )
        return webhook_configuration(
            settings.webhook_configuration_name,
            settings.webhook_service_name,
            settings.operator_namespace,
            path=MUTATE_PATH,
            ca_bundle=ca,
            timeout_seconds=settings.webhook_timeout_seconds,
            exclude_namespaces=excluded,
            port=settings.webhook_service_port,
        )

    return build


class WebhookLifecycle:
    """Starts the webhook (retrying in the background on failure) and stops everything it started."""

    def __init__(
        self,
        settings: OperatorSettings,
        injection: InjectionSettings,
        registry: Registry,
        kube: KubeClient,
        on_request: Callable[[str], None],
    ) -> None:
        self._settings = settings
        self._kube = kube

        def profiles_for(namespace: str) -> list[ProfileRef]:
            return [
                ProfileRef(e.namespace, e.name, e.spec, e.status)
                for e in registry.profiles_in(namespace)
                if e.spec
            ]

        # Slow clients are cut off a little after the API server itself gives up (timeoutSeconds).
        limits = WebhookLimits.for_timeout(settings.webhook_timeout_seconds)
        self._app = make_webhook_app(profiles_for, injection, on_request, limits)
        self.server: WebhookServer | None = None
        self.cert_dir: str | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> bool:
        """Try once now; on failure keep retrying in the background. True when it is serving."""
        if await self._try_start():
            return True
        self._tasks.append(asyncio.create_task(self._retry(), name="dam-webhook-retry"))
        return False

    def expected_server_name(self) -> str:
        """The name the API server checks the serving certificate against: the URL's host, or
        the Service's ``NAME.NAMESPACE.svc`` (what ``clientConfig.service`` is called by)."""
        settings = self._settings
        if settings.webhook_url:
            return urlsplit(settings.webhook_url).hostname or "localhost"
        return f"{settings.webhook_service_name}.{settings.operator_namespace}.svc"

    async def serving_problem(self, timeout_seconds: float) -> str | None:
        """None when the webhook serves with a certificate that the registered caBundle verifies;
        else why not (readiness).

        Reads the MutatingWebhookConfiguration (``get`` on it is in the chart's RBAC), then makes
        a TLS handshake with the local server as the API server would: trusting only the
        ``caBundle`` of our webhook entry and checking the name it calls. So an empty caBundle
        (cert-manager's CA injector not done yet), a stale one, a server that is not listening or
        serves another certificate all read as not ready. The check never goes through the
        Service, whose endpoints are the ready Pods only: a readiness that needed the Service
        would never become true.
        """
        if self.server is None:
            return "the pod webhook is not serving yet (see the log for why; it is retried)"
        settings = self._settings
        try:
            current = await self._kube.get_webhook_configuration(settings.webhook_configuration_name)
        except Exception as exc:
            return f"cannot read MutatingWebhookConfiguration {settings.webhook_configuration_name}: {exc}"
        if current is None:
            return f"MutatingWebhookConfiguration {settings.webhook_configuration_name} does not exist"
        hooks = [h for h in current.get("webhooks") or () if isinstance(h, dict)]
        ours = [h for h in hooks if h.get("name") == WEBHOOK_NAME] or hooks
        encoded = str(((ours[0] if ours else {}).get("clientConfig") or {}).get("caBundle") or "")
        if not encoded:
            return (
                f"MutatingWebhookConfiguration {settings.webhook_configuration_name} has no caBundle: "
                "the API server cannot call the webhook"
            )
        try:
            ca_pem = base64.b64decode(encoded).decode("ascii")
            context = ssl.create_default_context(cadata=ca_pem)
        except (ValueError, ssl.SSLError) as exc:
            return f"the caBundle of {settings.webhook_configuration_name} is not a CA certificate: {exc}"
        host = settings.webhook_host if settings.webhook_host not in ("", "0.0.0.0", "::") else "127.0.0.1"
        name = self.expected_server_name()
        try:
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(host, settings.webhook_port, ssl=context, server_hostname=name),
                timeout_seconds,
            )
        except ssl.SSLCertVerificationError as exc:
            return (
                f"the webhook's serving certificate does not verify against the caBundle of "
                f"{settings.webhook_configuration_name} for {name}: {exc.verify_message}"
            )
        except (OSError, TimeoutError) as exc:
            return (
                f"the webhook does not answer on {host}:{settings.webhook_port}: {type(exc).__name__}: {exc}"
            )
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.wait_closed()
        return None

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.server is not None:
            await self.server.close()
            self.server = None
        if self.cert_dir is not None:
            shutil.rmtree(self.cert_dir, ignore_errors=True)

    async def _try_start(self) -> bool:
        try:
            await self._start()
            return True
        except Exception as exc:
            log.error(
                "pod webhook not started: %s; the operator runs on, pods created meanwhile are reported "
                "as not instrumented; retrying",
                exc,
            )
            if self.server is not None:
                await self.server.close()
                self.server = None
            return False

    async def _retry(self) -> None:
        delay = WEBHOOK_RETRY_FIRST_SECONDS
        while True:
            await asyncio.sleep(delay)
            if await self._try_start():
                log.info("pod webhook started")
                return
            delay = min(delay * 2, WEBHOOK_RETRY_MAX_SECONDS)

    async def _start(self) -> None:
        settings, kube = self._settings, self._kube
        build = configuration_builder(settings)
        if settings.cert_mode == "files":
            folder = Path(settings.cert_dir)
            certfile, keyfile = folder / certs.TLS_CRT, folder / certs.TLS_KEY
            self.server = await serve_webhook(
                self._app, settings.webhook_host, settings.webhook_port, str(certfile), str(keyfile)
            )
            if settings.webhook_manage_configuration:
                ca_path = folder / certs.CA_CRT
                await kube.apply_webhook_configuration(
                    build(ca_path.read_bytes() if ca_path.exists() else None)
                )
            self._tasks.append(asyncio.create_task(_watch_cert_files(self.server), name="dam-cert-files"))
            return

        store = WebhookCertStore(
            kube, build if settings.webhook_manage_configuration else None, certs.ca_bundle_patch
        )
        dns, ips = _url_host(settings.webhook_url)
        manager = certs.CertManager(
            store,
            namespace=settings.operator_namespace,
            secret_name=settings.cert_secret_name,
            service_name=settings.webhook_service_name,
            webhook_configuration_name=settings.webhook_configuration_name,
            extra_dns_names=dns,
            ip_addresses=ips,
        )
        bundle, _ = await manager.ensure()
        if self.cert_dir is None:
            self.cert_dir = tempfile.mkdtemp(prefix="dam-webhook-")
        certfile_p, keyfile_p = certs.write_pem_files(bundle, self.cert_dir)
        self.server = await serve_webhook(
            self._app, settings.webhook_host, settings.webhook_port, str(certfile_p), str(keyfile_p)
        )
        await store.release()  # register the caBundle only once the server answers
        self._tasks.append(
            asyncio.create_task(_renew_certs(manager, self.server, self.cert_dir), name="dam-cert-renewal")
        )


async def _renew_certs(manager: certs.CertManager, server: WebhookServer, folder: str) -> None:
    while True:
        await asyncio.sleep(CERT_RENEW_CHECK_SECONDS)
        try:
            bundle, issued = await manager.ensure()
            if issued:
                certs.write_pem_files(bundle, folder)
                server.reload_certificate()
                log.info("renewed the webhook's serving certificate")
        except Exception:
            log.exception("webhook certificate renewal failed; retrying later")


async def _watch_cert_files(server: WebhookServer) -> None:
    def stamp() -> tuple[float, float]:
        return (os.stat(server.certfile).st_mtime, os.stat(server.keyfile).st_mtime)

    last = stamp()
    while True:
        await asyncio.sleep(CERT_FILES_CHECK_SECONDS)
        try:
            now = stamp()
            if now != last:
                server.reload_certificate()
                last = now
                log.info("reloaded the webhook's certificate files")
        except (OSError, ValueError) as exc:
            log.warning("cannot reload the webhook certificate files: %s", exc)
