"""``dam operator``: settings, the registry, the scheduler, the metrics and webhook
servers, then kopf.

Everything is built once here and passed in; nothing registers itself on import.
The scheduler, the webhook and the metrics server (``/metrics``, ``/healthz`` for
liveness, ``/readyz`` for readiness: readiness.py) start before kopf and stop after it;
kopf's signal handling (SIGTERM, SIGINT) ends the whole process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import logging
import os
import socket
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import kopf
from aiohttp import web
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from dam_operator.cluster.adapters.clusteraddrs import ClusterAddressWatch
from dam_operator.cluster.adapters.kube import ApiError, KubeClient, LeaseClient, default_login
from dam_operator.cluster.adapters.podwatch import PodWatcher
from dam_operator.cluster.adapters.sources import SourceFactory, query_connector, scrape_connector
from dam_operator.cluster.runtime.handlers import build_registry
from dam_operator.cluster.runtime.heap import Collector, Trimmer
from dam_operator.cluster.runtime.opmetrics import OperatorMetrics, make_metrics_app
from dam_operator.cluster.runtime.readiness import Readiness
from dam_operator.cluster.runtime.scheduler import Evaluator, Scheduler
from dam_operator.cluster.runtime.shards import ShardMember
from dam_operator.cluster.runtime.webhook_lifecycle import WebhookLifecycle
from dam_operator.cluster.settings import OperatorSettings
from dam_operator.cluster.steps.injection import InjectionSettings
from dam_operator.cluster.steps.registry import Registry
from dam_operator.cluster.steps.urlpolicy import NO_CLUSTER_ADDRESSES, ClusterAddresses, UrlPolicy
from dam_sidecar.envcheck import known_variables, unknown_variables
from dam_sidecar.settings import SidecarSettings

log = logging.getLogger("dam_operator")

WEBHOOK_RETRY_FIRST_SECONDS = 5.0
WEBHOOK_RETRY_MAX_SECONDS = 300.0
CERT_RENEW_CHECK_SECONDS = 6 * 3600.0
CERT_FILES_CHECK_SECONDS = 60.0
CLUSTER_ADDRESSES_REFRESH_SECONDS = 300.0
"""How often the API server's endpoints and the operator's Services are read again (urlpolicy)."""
POD_SYNC_WAIT_SECONDS = 120.0
"""How long kopf (and with it the first evaluations) waits for the first list of pods."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dam operator",
        description="The DAM Kubernetes operator. Settings come from DAM_* environment variables "
        "(see docs/operator.md); these flags override them.",
    )
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", help="watch this namespace only")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch all namespaces")
    peering = p.add_mutually_exclusive_group()
    peering.add_argument(
        "--standalone",
        dest="standalone",
        action="store_true",
        default=None,
        help="run without kopf peering: one replica (the default)",
    )
    peering.add_argument("--peering", dest="standalone", action="store_false", help="use kopf peering")
    p.add_argument("--metrics-port", type=int, help="port of the operator's /metrics (0: off)")
    p.add_argument("--liveness", help="kopf liveness endpoint, e.g. http://0.0.0.0:8080/healthz ('' for off)")
    p.add_argument(
        "--webhook-url", help="register the webhook by URL (e.g. https://127.0.0.1:9443/mutate-pods)"
    )
    p.add_argument("--webhook-host", help="address the webhook listens on")
    p.add_argument("--webhook-port", type=int, help="port the webhook listens on")
    p.add_argument("--no-webhook", action="store_true", help="do not serve the pod webhook")
    p.add_argument("--operator-namespace", help="namespace of the operator's Secret and Service")
    p.add_argument("-v", "--verbose", action="store_true", default=None, help="debug logging")
    p.add_argument("-q", "--quiet", action="store_true", default=None, help="warnings and errors only")
    return p


def settings_from_args(argv: Sequence[str]) -> OperatorSettings:
    """The environment's settings with the command line's overrides (raises ValidationError)."""
    args = _parser().parse_args(list(argv))
    overrides: dict[str, Any] = {}
    if args.namespace is not None:
        overrides["namespace"] = args.namespace
    if args.all_namespaces:
        overrides["namespace"] = None
    for name in (
        "standalone",
        "metrics_port",
        "webhook_url",
        "webhook_host",
        "webhook_port",
        "verbose",
        "quiet",
    ):
        value = getattr(args, name)
        if value is not None:
            overrides[name] = value
    if args.liveness is not None:
        overrides["liveness_endpoint"] = args.liveness
    if args.no_webhook:
        overrides["webhook_enabled"] = False
    if args.operator_namespace is not None:
        overrides["operator_namespace"] = args.operator_namespace
    return OperatorSettings(**overrides)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = settings_from_args(sys.argv[1:] if argv is None else argv)
    except ValidationError as exc:
        for err in exc.errors(include_url=False):
            where = ".".join(str(p) for p in err.get("loc", ())) or "settings"
            sys.stderr.write(f"dam operator: setting {where} (DAM_{where.upper()}): {err.get('msg')}\n")
        return 2
    logging.basicConfig(
        level=logging.DEBUG if settings.verbose else logging.WARNING if settings.quiet else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for warning in unknown_variables(os.environ, known_variables(OperatorSettings, SidecarSettings)):
        log.warning("%s", warning)
    if not settings.verbose:
        # kopf logs every handler call at INFO: one line per pod event is noise at scale.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    try:
        asyncio.run(run_operator(settings))
    except kopf.LoginError as exc:
        sys.stderr.write(f"dam operator: cannot reach Kubernetes: {exc}\n")
        return 1
    except ApiError as exc:
        sys.stderr.write(
            f"dam operator: the Kubernetes API refused a startup call: {exc}. Check that the namespace "
            f"{settings.operator_namespace!r} exists (DAM_OPERATOR_NAMESPACE) and the operator's RBAC "
            "(docs/operator.md).\n"
        )
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


# ---------------------------------------------------------------- wiring


KOPF_WORKER_IDLE_SECONDS = 0.5


class NoDiffBase(kopf.DiffBaseStorage):
    """A diff base that is never built nor stored.

    kopf builds an "essence" of every event's body (a deep copy of the whole object, status
    and ``managedFields`` included) before it looks at the handlers, kopf 1.45
    (``_core/reactor/processing.py: _detect_causes``). Only on.create/update/resume/delete
    handlers and daemons use it; the operator registers one ``on.event`` handler
    (handlers.py), so the copy is thrown away. Every status write comes back as an event:
    at the switch of 5,000 profiles these copies took 10 % of the operator's CPU (py-spy,
    docs/performance.md).
    """

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[kopf.FieldSpec] | None = None
    ) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


def kopf_settings(settings: OperatorSettings) -> kopf.OperatorSettings:
    s = kopf.OperatorSettings()
    s.posting.level = logging.WARNING  # no "handler succeeded" Event per profile
    # Only event handlers (handlers.py): kopf stores nothing in the objects (no progress or
    # diff-base annotations, no finalizer), so the operator never patches a DAMProfile.
    s.persistence.diffbase_storage = NoDiffBase()
    s.watching.server_timeout = 300
    s.watching.client_timeout = 330
    s.watching.connect_timeout = 30
    # kopf lists each watched resource before it watches; chunked (``limit``/``continue``), the
    # start-up peak holds one page of pods, not the whole cluster's (kopf ≥ 1.38).
    s.watching.chunk_size = settings.list_chunk_size or None
    # kopf hands each object's events to a worker of its own, which lives on for
    # ``idle_timeout`` (5 s by default) after its last event, holding that object's last body.
    # Every status write comes back as a watch event of its profile, so at thousands of profiles
    # thousands of workers would idle with a body each: 0.5 s cut the operator's RSS by a
    # quarter at 1,500 profiles (benchmarks/operator_scale.py). A later event of the same object
    # starts a new worker (kopf ≥ 1.45 batches no events by time, so nothing waits on it).
    s.queueing.idle_timeout = KOPF_WORKER_IDLE_SECONDS
    s.networking.request_timeout = max(30.0, settings.api_timeout_seconds)
    s.peering.standalone = settings.standalone
    return s


def injection_settings(settings: OperatorSettings) -> InjectionSettings:
    return InjectionSettings(
        image=settings.default_sidecar_image,
        image_pull_policy=settings.sidecar_image_pull_policy,
        allowed_images=tuple(settings.sidecar_allowed_images),
        allow_share_process_namespace=settings.sidecar_allow_share_process_namespace,
        operator_namespace=settings.operator_namespace,
        excluded_namespaces=tuple(settings.excluded_namespaces),
        native_sidecar=settings.native_sidecar,
    )


@dataclass
class Running:
    """What ``start_components`` started; ``stop()`` undoes it in reverse."""

    registry: Registry
    metrics: OperatorMetrics
    scheduler: Scheduler
    kube: KubeClient
    session: aiohttp.ClientSession
    """Sidecar scrapes (``sources.scrape_connector``)."""
    query_session: aiohttp.ClientSession
    """Prometheus queries (``sources.query_connector``)."""
    scheduler_task: asyncio.Task[None]
    pod_watcher: PodWatcher
    pod_task: asyncio.Task[None]
    webhook: WebhookLifecycle | None = None
    metrics_runner: web.AppRunner | None = None
    trim_task: asyncio.Task[None] | None = None
    freeze_task: asyncio.Task[None] | None = None
    addresses_task: asyncio.Task[None] | None = None
    """Reads the API server's endpoints and the operator's Services (``ClusterAddressWatch``)."""
    readiness: Readiness | None = None
    """``/readyz`` on the metrics server (readiness.py)."""
    shard_member: ShardMember | None = None
    """This replica's Lease and share of the profiles (sharding; shards.py)."""
    shard_task: asyncio.Task[None] | None = None
    url_policy: UrlPolicy | None = None
    """The admin's rules on ``spec.source.prometheus.url`` (urlpolicy.py)."""

    def healthy(self) -> bool:
        """Liveness: the scheduler, the pod watcher (and the shard membership) still run."""
        shard_ok = self.shard_task is None or not self.shard_task.done()
        return not self.scheduler_task.done() and not self.pod_task.done() and shard_ok

    async def webhook_problem(self, timeout_seconds: float) -> str | None:
        """Readiness of the webhook (``WebhookLifecycle.serving_problem``)."""
        if self.webhook is None:
            return "the pod webhook is not started"
        return await self.webhook.serving_problem(timeout_seconds)

    async def pods_synced(self, timeout_seconds: float) -> None:
        """Waits for the first list of pods (at most ``timeout_seconds``, then goes on: the
        watcher keeps trying); raises what ended the watcher (e.g. ``kopf.LoginError``)."""
        synced = asyncio.ensure_future(self.pod_watcher.synced.wait())
        try:
            await asyncio.wait(
                {synced, self.pod_task}, timeout=timeout_seconds, return_when="FIRST_COMPLETED"
            )
        finally:
            synced.cancel()
        if self.pod_task.done():
            self.pod_task.result()  # raises what ended it
            raise RuntimeError("the pod watcher ended")
        if not self.pod_watcher.synced.is_set():
            log.warning(
                "pods not listed after %.0f s; starting anyway (the watcher keeps trying)", timeout_seconds
            )

    async def stop(self) -> None:
        if self.shard_task is not None:
            self.shard_task.cancel()
            await asyncio.gather(self.shard_task, return_exceptions=True)
        if self.shard_member is not None:
            # Before the scheduler stops: the work in flight ends, then the Lease goes.
            with contextlib.suppress(Exception):
                await self.shard_member.leave()
        tasks = [
            t
            for t in (
                self.scheduler_task,
                self.pod_task,
                self.trim_task,
                self.freeze_task,
                self.addresses_task,
            )
            if t is not None
        ]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.webhook is not None:
            await self.webhook.close()
        if self.metrics_runner is not None:
            await self.metrics_runner.cleanup()
        await self.session.close()
        await self.query_session.close()
        await self.kube.close()


def url_policy(
    settings: OperatorSettings,
    api_server: Callable[[], str] = lambda: "",
    cluster: Callable[[], ClusterAddresses] = lambda: NO_CLUSTER_ADDRESSES,
) -> UrlPolicy:
    """The admin's rules on ``spec.source.prometheus.url`` (urlpolicy.py) from the settings, the
    API server the operator talks to and the addresses read from it (``ClusterAddressWatch``)."""
    return UrlPolicy(
        configured_url=settings.prometheus_url,
        allowed_prefixes=tuple(settings.prometheus_allowed_url_prefixes),
        allowed_networks=tuple(
            ipaddress.ip_network(n, strict=False) for n in settings.prometheus_allowed_networks
        ),
        api_server_hosts=tuple(h for h in (settings.kubernetes_service_host,) if h),
        own_addresses=tuple(settings.pod_ips),
        api_server=api_server,
        cluster=cluster,
    )


def _start_memory_tasks(settings: OperatorSettings, running: Running) -> None:
    """The C heap's trimmer and the garbage collector's settings (``heap``); the shard membership."""
    if settings.sharding:
        _start_shard(settings, running)
    if settings.heap_trim_interval_seconds > 0:
        running.trim_task = asyncio.create_task(
            Trimmer.for_this_process().run(settings.heap_trim_interval_seconds), name="dam-heap-trim"
        )
    collector = Collector()
    collector.tune(settings.gc_young_threshold)
    if settings.gc_freeze_after_seconds > 0:
        running.freeze_task = asyncio.create_task(
            collector.freeze_after(settings.gc_freeze_after_seconds), name="dam-gc-freeze"
        )


def shard_identity(settings: OperatorSettings) -> str:
    """This replica's name among the shards: the setting, else HOSTNAME (a Pod's name)."""
    return settings.shard_identity or os.environ.get("HOSTNAME") or socket.gethostname()


def _start_shard(settings: OperatorSettings, running: Running) -> None:
    """Before kopf lists the first profile: the scheduler holds nothing until its Lease says so."""
    running.scheduler.shard()
    running.shard_member = ShardMember(
        LeaseClient(running.kube),
        running.scheduler,
        namespace=settings.operator_namespace,
        identity=shard_identity(settings),
        group=settings.shard_group,
        lease_duration_seconds=settings.shard_lease_duration_seconds,
        renew_seconds=settings.shard_renew_seconds,
        on_change=running.metrics.set_shard,
    )
    running.shard_task = asyncio.create_task(running.shard_member.run(), name="dam-shard")


async def start_components(
    settings: OperatorSettings, login: Callable[[], kopf.ConnectionInfo | None] = default_login
) -> Running:
    kube = KubeClient(
        login,
        timeout_seconds=settings.api_timeout_seconds,
        retries=settings.api_retries,
        backoff_seconds=settings.api_backoff_seconds,
        max_connections=settings.api_max_connections,
    )
    metrics = OperatorMetrics(CollectorRegistry())
    registry = Registry()
    session = aiohttp.ClientSession(connector=scrape_connector(settings.scrape_concurrency))
    addresses = ClusterAddressWatch(kube, settings.operator_namespace)
    policy = url_policy(settings, api_server=lambda: kube.server, cluster=addresses.current)
    query_session = aiohttp.ClientSession(connector=query_connector(settings.scrape_concurrency, policy))
    evaluator = Evaluator(
        registry,
        kube,
        SourceFactory(
            session,
            settings,
            query_session,
            policy=policy,
            on_too_large=metrics.source_body_too_large,
        ),
        metrics,
        scrape_concurrency=settings.scrape_concurrency,
        max_baseline_windows=settings.max_baseline_windows,
        webhook_enabled=settings.webhook_enabled,
        instance=os.environ.get("HOSTNAME", "dam-operator"),
        injection=injection_settings(settings),
        stall_restart_enabled=settings.stall_restart_enabled,
    )
    scheduler = Scheduler(
        registry,
        evaluator,
        metrics,
        concurrency=settings.evaluation_concurrency,
        event_concurrency=settings.event_concurrency,
    )
    registry.subscribe(scheduler.on_change)
    pod_watcher = PodWatcher(kube, registry, namespace=settings.namespace, page_size=settings.list_chunk_size)
    running = Running(
        url_policy=policy,
        registry=registry,
        metrics=metrics,
        scheduler=scheduler,
        kube=kube,
        session=session,
        query_session=query_session,
        scheduler_task=asyncio.create_task(scheduler.run(), name="dam-scheduler"),
        pod_watcher=pod_watcher,
        pod_task=asyncio.create_task(pod_watcher.run(), name="dam-pod-watch"),
    )
    _start_memory_tasks(settings, running)
    await addresses.refresh()  # before the first profile's connection (failures are logged, not raised)
    running.addresses_task = asyncio.create_task(
        addresses.run(CLUSTER_ADDRESSES_REFRESH_SECONDS), name="dam-cluster-addresses"
    )
    running.readiness = Readiness(
        kube, pod_watcher.synced.is_set, running.webhook_problem if settings.webhook_enabled else None
    )
    try:
        if settings.metrics_port:
            app = make_metrics_app(metrics.registry, running.healthy)
            app.router.add_get("/readyz", running.readiness.handle)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, settings.metrics_host, settings.metrics_port).start()
            running.metrics_runner = runner
        if settings.webhook_enabled:
            running.webhook = WebhookLifecycle(
                settings, injection_settings(settings), registry, kube, metrics.webhook_request
            )
            await running.webhook.start()
    except BaseException:
        await running.stop()
        raise
    return running


async def run_operator(
    settings: OperatorSettings,
    *,
    login: Callable[[], kopf.ConnectionInfo | None] = default_login,
    stop_flag: asyncio.Event | None = None,
    ready_flag: asyncio.Event | None = None,
) -> None:
    """Run until a signal or ``stop_flag``: components first, the pods listed, then kopf."""
    running = await start_components(settings, login)
    try:
        await running.pods_synced(POD_SYNC_WAIT_SECONDS)
        namespaces = [] if settings.namespace is None else [settings.namespace]
        await kopf.operator(
            registry=build_registry(running.registry, login, running.url_policy),
            settings=kopf_settings(settings),
            standalone=settings.standalone,
            peering_name=None if settings.standalone else settings.peering_name,
            clusterwide=settings.namespace is None,
            namespaces=namespaces,
            liveness_endpoint=settings.liveness_endpoint,
            stop_flag=stop_flag,
            ready_flag=ready_flag,
        )
    finally:
        with contextlib.suppress(Exception):
            await running.stop()
