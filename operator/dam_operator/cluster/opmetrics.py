"""The operator's own Prometheus metrics and the small HTTP app that serves them.

``OperatorMetrics`` registers its collectors on the registry it is given (never the
global default one). Label sets are bounded: per-profile series carry
``namespace``/``profile`` only (plus enum labels), and every series of a profile is
removed when the profile goes away. Names come from ``dam_operator.cluster.metric_names``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from dam_operator.cluster import metric_names as n
from dam_operator.diagnosis.model import Verdict

SCRAPE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

ProfileKey = tuple[str, str]


class OperatorMetrics:
    """Collectors of the operator, on ``registry``; see docs/operator.md for the list."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        per_profile = ["namespace", "profile"]
        self._verdict = Gauge(
            n.PROFILE_VERDICT,
            "1 for the profile's current verdict (one series per profile; lever ids are bounded).",
            [*per_profile, "axis", "regime", "lever"],
            registry=registry,
        )
        self._confidence = Gauge(
            n.PROFILE_CONFIDENCE_RATIO,
            "Confidence of the current verdict, 0-1.",
            per_profile,
            registry=registry,
        )
        self._iron_law = Gauge(
            n.PROFILE_IRON_LAW_SECONDS,
            "Per-step estimate of an iron-law term (data, compute, latency), seconds.",
            [*per_profile, "term"],
            registry=registry,
        )
        self._data_wait = Gauge(
            n.PROFILE_DATA_WAIT_RATIO,
            "Share of step time blocked waiting for the DataLoader over the window.",
            per_profile,
            registry=registry,
        )
        self._steps = Gauge(
            n.PROFILE_STEPS_PER_SECOND,
            "Training steps per second over the window.",
            per_profile,
            registry=registry,
        )
        self._mfu = Gauge(
            n.PROFILE_MFU_RATIO,
            "Model FLOPs utilization over the window, 0-1.",
            per_profile,
            registry=registry,
        )
        self._pods = Gauge(
            n.PROFILE_PODS,
            "Pods of the profile by state (matched, instrumented, reporting).",
            [*per_profile, "state"],
            registry=registry,
        )
        self._last_eval = Gauge(
            n.PROFILE_LAST_EVALUATION_TIMESTAMP_SECONDS,
            "Unix time of the profile's last evaluation.",
            per_profile,
            registry=registry,
        )
        self._evaluations = Counter(
            n.OPERATOR_EVALUATIONS_TOTAL, "Profile evaluations run.", registry=registry
        )
        self._errors = Counter(
            n.OPERATOR_EVALUATION_ERRORS_TOTAL,
            "Evaluation problems by reason (scrape failures, API errors, ...).",
            ["reason"],
            registry=registry,
        )
        self._scrape = Histogram(
            n.OPERATOR_SCRAPE_DURATION_SECONDS,
            "Duration of one sidecar scrape or Prometheus query.",
            buckets=SCRAPE_BUCKETS,
            registry=registry,
        )
        self._webhook = Counter(
            n.OPERATOR_WEBHOOK_REQUESTS_TOTAL,
            "Pod admission requests by result (injected, skipped, error, ...).",
            ["result"],
            registry=registry,
        )
        self._profiles = Gauge(n.OPERATOR_PROFILES, "DAMProfiles known to the operator.", registry=registry)
        self._lock = threading.Lock()
        self._verdict_labels: dict[ProfileKey, tuple[str, str, str]] = {}
        self._known: set[ProfileKey] = set()

    # ------------------------------------------------------------ per profile

    def observe_verdict(
        self, namespace: str, profile: str, verdict: Verdict, timestamp_seconds: float | None = None
    ) -> None:
        key = (namespace, profile)
        b = verdict.bottleneck
        labels = (str(b.axis.value), str(b.regime.value), b.lever)
        with self._lock:
            self._known.add(key)
            old = self._verdict_labels.get(key)
            if old is not None and old != labels:
                self._verdict.remove(namespace, profile, *old)
            self._verdict_labels[key] = labels
        self._verdict.labels(namespace, profile, *labels).set(1)
        self._confidence.labels(namespace, profile).set(b.confidence)
        m = verdict.metrics
        self._set_or_remove(self._data_wait, key, m.data_wait_ratio)
        self._set_or_remove(self._steps, key, m.steps_per_second)
        self._set_or_remove(self._mfu, key, m.mfu)
        law = m.iron_law
        terms = {
            "data": law.data_seconds if law else None,
            "compute": law.compute_seconds if law else None,
            "latency": law.latency_seconds if law else None,
        }
        for term in n.IRON_LAW_TERMS:
            self._set_or_remove(self._iron_law, (*key, term), terms[term])
        if timestamp_seconds is not None:
            self._last_eval.labels(namespace, profile).set(timestamp_seconds)

    def clear_verdict(self, namespace: str, profile: str, timestamp_seconds: float | None = None) -> None:
        """No verdict this window (no reporting pods): drop the verdict's series, keep the pod counts."""
        key = (namespace, profile)
        with self._lock:
            old = self._verdict_labels.pop(key, None)
        if old is not None:
            _remove(self._verdict, (*key, *old))
        for gauge in (self._confidence, self._data_wait, self._steps, self._mfu):
            _remove(gauge, key)
        for term in n.IRON_LAW_TERMS:
            _remove(self._iron_law, (*key, term))
        if timestamp_seconds is not None:
            with self._lock:
                self._known.add(key)
            self._last_eval.labels(namespace, profile).set(timestamp_seconds)

    def set_pods(self, namespace: str, profile: str, matched: int, instrumented: int, reporting: int) -> None:
        with self._lock:
            self._known.add((namespace, profile))
        for state, value in zip(n.POD_STATES, (matched, instrumented, reporting), strict=True):
            self._pods.labels(namespace, profile, state).set(value)

    def forget_profile(self, namespace: str, profile: str) -> None:
        """Remove every series of the profile (it was deleted or became invalid)."""
        key = (namespace, profile)
        self.clear_verdict(namespace, profile)
        _remove(self._last_eval, key)
        for state in n.POD_STATES:
            _remove(self._pods, (*key, state))
        with self._lock:
            self._known.discard(key)

    def set_profiles(self, count: int) -> None:
        self._profiles.set(count)

    # ------------------------------------------------------------ operator-wide

    def evaluation(self, ok: bool, reason: str = "") -> None:
        """Count one evaluation; a failed one also counts under ``reason``."""
        self._evaluations.inc()
        if not ok:
            self.error(reason or "unknown")

    def error(self, reason: str) -> None:
        self._errors.labels(reason).inc()

    def scrape_duration(self, seconds: float) -> None:
        self._scrape.observe(seconds)

    def webhook_request(self, result: str) -> None:
        self._webhook.labels(result).inc()

    def profiles_with_series(self) -> set[ProfileKey]:
        with self._lock:
            return set(self._known)

    # ------------------------------------------------------------ helpers

    def _set_or_remove(self, gauge: Gauge, labels: tuple[str, ...], value: float | None) -> None:
        if value is None:
            _remove(gauge, labels)
        else:
            gauge.labels(*labels).set(value)


def _remove(gauge: Gauge, labels: tuple[str, ...]) -> None:
    gauge.remove(*labels)  # a label set that is not there is no error


def make_metrics_app(
    registry: CollectorRegistry, healthy: Callable[[], bool] = lambda: True
) -> web.Application:
    """``/metrics`` (text format) and ``/healthz`` (200 while ``healthy()``, else 503)."""

    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        ok = healthy()
        return web.Response(text="ok\n" if ok else "unhealthy\n", status=200 if ok else 503)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    return app
