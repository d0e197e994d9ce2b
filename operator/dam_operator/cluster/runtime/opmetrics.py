"""The operator's own Prometheus metrics and the small HTTP app that serves them.

``OperatorMetrics`` registers its collectors on the registry it is given (never the
global default one). Label sets are bounded: per-profile series carry
``namespace``/``profile`` only (plus enum labels), and every series of a profile is
removed when the profile goes away. Names come from ``dam_operator.cluster.steps.metric_names``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from dam_operator.cluster.steps import metric_names as n
from dam_operator.cluster.steps.registry import ProfileKey
from dam_operator.cluster.steps.sharding import BUCKETS
from dam_operator.diagnosis.model import Verdict

SCRAPE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
DELAY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)


@dataclass(frozen=True)
class _ActionFigures:
    """One ``status.actions[]`` entry, as its series show it."""

    action: str
    lever: str
    setting: str
    before: str
    after: str
    outcome: str
    steps_before: float | None
    steps_after: float | None


def _steps(figures: Any) -> float | None:
    value = figures.get("stepsPerSecond") if isinstance(figures, Mapping) else None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _action_figures(raw: Any) -> tuple[_ActionFigures, ...]:
    out = []
    for item in raw if isinstance(raw, list) else []:
        if not isinstance(item, Mapping) or not isinstance(item.get("setting"), Mapping):
            continue
        setting = item["setting"]
        out.append(
            _ActionFigures(
                action=str(item.get("id", "")),
                lever=str(item.get("lever", "")),
                setting=str(setting.get("name", "")),
                before=str(setting.get("before", "")),
                after=str(setting.get("after", "")),
                outcome=str(item.get("outcome", "")),
                steps_before=_steps(item.get("before")),
                steps_after=_steps(item.get("after")),
            )
        )
    return tuple(out)


@dataclass
class _ProfileFigures:
    """What the operator knows of one profile right now; the collector reads it at scrape time."""

    verdict: tuple[str, str, str] | None = None  # axis, regime, lever
    confidence: float | None = None
    data_wait: float | None = None
    steps: float | None = None
    mfu: float | None = None
    iron_law: dict[str, float] = field(default_factory=dict)
    pods: tuple[int, int, int] | None = None  # matched, instrumented, reporting
    last_evaluation: float | None = None
    actions: tuple[_ActionFigures, ...] = ()
    accelerator_seconds: dict[str, float] | None = None  # use -> accelerator-seconds, this process
    goodput: float | None = None  # status.goodput.ratio
    progress: tuple[str, float] | None = None  # status.progress.state, seconds without a step while Stalled
    uses: tuple[str, ...] = n.ACCELERATOR_USES  # the uses the job measures (the others: no series)


_PER_PROFILE = ("namespace", "profile")


def _gauge(name: str, documentation: str, *labels: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=[*_PER_PROFILE, *labels])


class _ProfileFamilies:
    """The per-profile families of one scrape, each filled from every profile's figures in turn."""

    def __init__(self) -> None:
        self.verdict = _gauge(
            n.PROFILE_VERDICT,
            "1 for the profile's current verdict (one series per profile; lever ids are bounded).",
            "axis",
            "regime",
            "lever",
        )
        self.confidence = _gauge(n.PROFILE_CONFIDENCE_RATIO, "Confidence of the current verdict, 0-1.")
        self.iron_law = _gauge(
            n.PROFILE_IRON_LAW_SECONDS,
            "Per-step estimate of an iron-law term (data, compute, latency), seconds.",
            "term",
        )
        self.data_wait = _gauge(
            n.PROFILE_DATA_WAIT_RATIO,
            "Share of step time blocked waiting for the DataLoader over the window.",
        )
        self.steps = _gauge(n.PROFILE_STEPS_PER_SECOND, "Training steps per second over the window.")
        self.mfu = _gauge(n.PROFILE_MFU_RATIO, "Model FLOPs utilization over the window, 0-1.")
        self.pods = _gauge(
            n.PROFILE_PODS, "Pods of the profile by state (matched, instrumented, reporting).", "state"
        )
        self.last = _gauge(
            n.PROFILE_LAST_EVALUATION_TIMESTAMP_SECONDS, "Unix time of the profile's last evaluation."
        )
        self.action_info = _gauge(
            n.PROFILE_ACTION_INFO,
            "1 per action of the profile's status.actions: lever, setting changed, values, outcome.",
            "action",
            "lever",
            "setting",
            "before",
            "after",
            "outcome",
        )
        self.action_steps = _gauge(
            n.PROFILE_ACTION_STEPS_PER_SECOND,
            "Steps per second per pod before an action and after it (once measured).",
            "action",
            "phase",
        )
        self.accelerator_seconds = CounterMetricFamily(
            n.PROFILE_ACCELERATOR_SECONDS_TOTAL,
            "Accelerator-seconds of the profile's job by use (productive, or the badput cause), counted "
            "by this operator process: sum by (use) (increase(...)) gives the fleet's accelerator-hours.",
            labels=[*_PER_PROFILE, "use"],
        )
        self.goodput = _gauge(
            n.PROFILE_GOODPUT_RATIO,
            "Productive step time / elapsed time over the job's life so far (status.goodput.ratio), 0-1.",
        )
        self.stalled = _gauge(
            n.PROFILE_STALLED_SECONDS,
            "Seconds the profile's job has made no training step while Stalled (status.progress); 0 "
            "while it progresses or has not started.",
        )
        self.progress_state = _gauge(
            n.PROFILE_PROGRESS_STATE,
            "1 for the profile's progress state (NotStarted, Progressing, Stalled), 0 for the others.",
            "state",
        )

    def families(self) -> tuple[Metric, ...]:
        """The families in the order they are exposed."""
        return (
            self.verdict,
            self.confidence,
            self.iron_law,
            self.data_wait,
            self.steps,
            self.mfu,
            self.pods,
            self.last,
            self.action_info,
            self.action_steps,
            self.accelerator_seconds,
            self.goodput,
            self.stalled,
            self.progress_state,
        )

    def add(self, key: list[str], f: _ProfileFigures) -> None:
        """One profile's series (``key``: its namespace and name); a figure not known has none."""
        self._add_goodput(key, f)
        self._add_actions(key, f)
        self._add_verdict(key, f)
        if f.pods is not None:
            for state, count in zip(n.POD_STATES, f.pods, strict=True):
                self.pods.add_metric([*key, state], float(count))
        if f.last_evaluation is not None:
            self.last.add_metric(key, f.last_evaluation)
        if f.progress is not None:
            state, stalled = f.progress
            self.stalled.add_metric(key, stalled if state == "Stalled" else 0.0)
            for value in n.PROGRESS_STATES:
                self.progress_state.add_metric([*key, value], 1.0 if value == state else 0.0)

    def _add_goodput(self, key: list[str], f: _ProfileFigures) -> None:
        if f.accelerator_seconds is not None:
            for use in f.uses:
                self.accelerator_seconds.add_metric([*key, use], f.accelerator_seconds.get(use, 0.0))
        if f.goodput is not None:
            self.goodput.add_metric(key, f.goodput)

    def _add_actions(self, key: list[str], f: _ProfileFigures) -> None:
        for a in f.actions:
            self.action_info.add_metric(
                [*key, a.action, a.lever, a.setting, a.before, a.after, a.outcome], 1.0
            )
            for phase, value in zip(n.ACTION_PHASES, (a.steps_before, a.steps_after), strict=True):
                if value is not None:
                    self.action_steps.add_metric([*key, a.action, phase], value)

    def _add_verdict(self, key: list[str], f: _ProfileFigures) -> None:
        if f.verdict is not None:
            self.verdict.add_metric([*key, *f.verdict], 1.0)
        for family, value in (
            (self.confidence, f.confidence),
            (self.data_wait, f.data_wait),
            (self.steps, f.steps),
            (self.mfu, f.mfu),
        ):
            if value is not None:
                family.add_metric(key, value)
        for term, seconds in f.iron_law.items():
            self.iron_law.add_metric([*key, term], seconds)


class _ProfileCollector(Collector):
    """Per-profile series built from ``OperatorMetrics``' state at scrape time.

    As the sidecar's collector does: no labelled gauges to keep in step with hand-made
    ``remove()`` calls; a profile that is forgotten simply has no series at the next scrape.
    """

    def __init__(self, owner: OperatorMetrics) -> None:
        self._owner = owner

    def describe(self) -> Iterable[Metric]:
        return []  # collected lazily; nothing to check for duplicates at registration

    def collect(self) -> Iterable[Metric]:
        scrape = _ProfileFamilies()
        for (namespace, profile), f in self._owner.figures().items():
            scrape.add([namespace, profile], f)
        yield from scrape.families()


def _closed_counter(
    registry: CollectorRegistry, name: str, documentation: str, label: str, values: Iterable[str]
) -> Counter:
    """A counter with one label whose closed set of ``values`` is exposed from 0."""
    counter = Counter(name, documentation, [label], registry=registry)
    for value in values:
        counter.labels(value)
    return counter


class OperatorMetrics:
    """The operator's metrics, on ``registry``; see docs/metrics.md for the list.

    Per-profile figures are state read by a collector at scrape time; operator-wide
    counters are ordinary counters whose closed label sets start at 0.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._lock = threading.Lock()
        self._figures: dict[ProfileKey, _ProfileFigures] = {}
        registry.register(_ProfileCollector(self))
        self._evaluations = Counter(
            n.OPERATOR_EVALUATIONS_TOTAL, "Profile evaluations run.", registry=registry
        )
        self._errors = _closed_counter(
            registry,
            n.OPERATOR_EVALUATION_ERRORS_TOTAL,
            "Evaluation problems by reason (scrape failures, API errors, ...).",
            "reason",
            n.ERROR_REASONS,
        )
        self._scrape = Histogram(
            n.OPERATOR_SCRAPE_DURATION_SECONDS,
            "Duration of one sidecar scrape or Prometheus query.",
            buckets=SCRAPE_BUCKETS,
            registry=registry,
        )
        self._delay = Histogram(
            n.OPERATOR_EVALUATION_DELAY_SECONDS,
            "How late an evaluation started after it was due (all evaluation workers busy).",
            buckets=DELAY_BUCKETS,
            registry=registry,
        )
        self._webhook = _closed_counter(
            registry,
            n.OPERATOR_WEBHOOK_REQUESTS_TOTAL,
            "Pod admission requests by result (injected, skipped, error, ...).",
            "result",
            n.WEBHOOK_RESULTS,
        )
        self._profiles = Gauge(n.OPERATOR_PROFILES, "DAMProfiles known to the operator.", registry=registry)
        self._shard_buckets = Gauge(
            n.OPERATOR_SHARD_BUCKETS,
            "Profile buckets (of 4,096) this replica evaluates (sharding; 4,096 unsharded).",
            registry=registry,
        )
        self._shard_buckets.set(BUCKETS)
        self._shard_members = Gauge(
            n.OPERATOR_SHARD_MEMBERS,
            "Live replicas sharing the profiles, as this one sees their Leases (1 unsharded).",
            registry=registry,
        )
        self._shard_members.set(1)
        self._actions = _closed_counter(
            registry,
            n.OPERATOR_ACTIONS_TOTAL,
            "Actions by outcome (pending: planned; improved, no-change, worse, rolled-back: judged).",
            "outcome",
            n.ACTION_OUTCOMES,
        )
        self._too_large = _closed_counter(
            registry,
            n.OPERATOR_SOURCE_BODY_TOO_LARGE_TOTAL,
            "Bodies given up at their cap, by source (scrape: a sidecar's /metrics over "
            "DAM_SCRAPE_MAX_BYTES; prometheus: an answer over DAM_PROMETHEUS_MAX_ANSWER_BYTES).",
            "source",
            n.BODY_SOURCES,
        )

    # ------------------------------------------------------------ per profile

    def _entry(self, namespace: str, profile: str) -> _ProfileFigures:
        return self._figures.setdefault((namespace, profile), _ProfileFigures())

    def observe_verdict(
        self, namespace: str, profile: str, verdict: Verdict, timestamp_seconds: float | None = None
    ) -> None:
        b = verdict.bottleneck
        m = verdict.metrics
        law = m.iron_law
        terms = {
            "data": law.data_seconds if law else None,
            "compute": law.compute_seconds if law else None,
            "latency": law.latency_seconds if law else None,
        }
        with self._lock:
            f = self._entry(namespace, profile)
            f.verdict = (str(b.axis.value), str(b.regime.value), b.lever)
            f.confidence = b.confidence
            f.data_wait, f.steps, f.mfu = m.shown.data_wait_ratio, m.steps_per_second, m.mfu
            f.iron_law = {t: v for t in n.IRON_LAW_TERMS if (v := terms[t]) is not None}
            if timestamp_seconds is not None:
                f.last_evaluation = timestamp_seconds

    def clear_verdict(self, namespace: str, profile: str, timestamp_seconds: float | None = None) -> None:
        """No verdict this window (no reporting pods): drop the verdict's series, keep the pod counts."""
        with self._lock:
            old = self._figures.get((namespace, profile))
            if old is None and timestamp_seconds is None:
                return
            f = _ProfileFigures(
                pods=old.pods if old else None,
                last_evaluation=old.last_evaluation if old else None,
                actions=old.actions if old else (),
                accelerator_seconds=old.accelerator_seconds if old else None,
                goodput=old.goodput if old else None,
                progress=old.progress if old else None,
                uses=old.uses if old else n.ACCELERATOR_USES,
            )
            if timestamp_seconds is not None:
                f.last_evaluation = timestamp_seconds
            self._figures[(namespace, profile)] = f

    def set_pods(self, namespace: str, profile: str, matched: int, instrumented: int, reporting: int) -> None:
        with self._lock:
            self._entry(namespace, profile).pods = (matched, instrumented, reporting)

    def observe_actions(self, namespace: str, profile: str, actions: Any) -> None:
        """The profile's ``status.actions`` as written (none: no series)."""
        figures = _action_figures(actions)
        with self._lock:
            if figures or (namespace, profile) in self._figures:
                self._entry(namespace, profile).actions = figures

    def observe_goodput(
        self,
        namespace: str,
        profile: str,
        *,
        accelerator_seconds: Mapping[str, float] | None,
        ratio: float | None,
        uses: Sequence[str] | None = None,
    ) -> None:
        """The profile's goodput: accelerator-seconds by use counted since this process started
        (None: its accelerators are unknown, no series) and the life-so-far ratio.

        A counter must never go down while the process lives: each use keeps the larger of what
        it exported and what it is given (the ledger only adds, so this is a guard)."""
        with self._lock:
            f = self._entry(namespace, profile)
            if accelerator_seconds is not None:
                before = f.accelerator_seconds or {}
                f.accelerator_seconds = {
                    use: max(before.get(use, 0.0), float(accelerator_seconds.get(use, 0.0)))
                    for use in n.ACCELERATOR_USES
                }
            f.goodput = ratio
            if uses is not None:
                f.uses = tuple(u for u in n.ACCELERATOR_USES if u in uses)

    def observe_progress(
        self, namespace: str, profile: str, state: str | None, stalled_seconds: float
    ) -> None:
        """The profile's progress (``status.progress.state``); None: not judged this window (kept)."""
        if state not in n.PROGRESS_STATES:
            return
        with self._lock:
            self._entry(namespace, profile).progress = (state, max(0.0, stalled_seconds))

    def forget_profile(self, namespace: str, profile: str) -> None:
        """Remove every series of the profile (it was deleted or became invalid)."""
        with self._lock:
            self._figures.pop((namespace, profile), None)

    def set_profiles(self, count: int) -> None:
        self._profiles.set(count)

    def set_shard(self, buckets: int, members: int) -> None:
        """This replica's share (``runtime/shards.py``): buckets held, live members seen."""
        self._shard_buckets.set(buckets)
        self._shard_members.set(members)

    def figures(self) -> dict[ProfileKey, _ProfileFigures]:
        """A consistent copy of the per-profile state (what the next scrape will show)."""
        with self._lock:
            return {
                k: replace(
                    v,
                    iron_law=dict(v.iron_law),
                    accelerator_seconds=None
                    if v.accelerator_seconds is None
                    else dict(v.accelerator_seconds),
                )
                for k, v in self._figures.items()
            }

    def profiles_with_series(self) -> set[ProfileKey]:
        with self._lock:
            return set(self._figures)

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

    def evaluation_delay(self, seconds: float) -> None:
        self._delay.observe(max(0.0, seconds))

    def webhook_request(self, result: str) -> None:
        self._webhook.labels(result).inc()

    def source_body_too_large(self, source: str) -> None:
        """Count one body given up at its cap (``source``: one of ``metric_names.BODY_SOURCES``)."""
        self._too_large.labels(source).inc()

    def action(self, outcome: str) -> None:
        """Count an action planned (``pending``) or judged."""
        self._actions.labels(outcome).inc()


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
