"""One evaluation loop for every profile: a heap of due times and a bounded worker pool.

Why not kopf timers: a kopf timer is one asyncio task (and one sleeping loop) per
object; at thousands of profiles that is thousands of tasks waking independently,
with no bound on how many scrape at once. Here one task keeps a heap of
``(due, profile)``; due work runs on at most ``concurrency`` workers, and every
scrape goes through one shared semaphore.

Per profile and window (``spec.evaluation.windowSeconds``), the ``Evaluator``:

1. scrapes every matched, running pod once (direct or Prometheus); a pod without the injected
   sidecar whose port answers anyway counts as instrumented (a sidecar added by hand);
2. differences each pod's counters against its previous scrape (one scrape per pod
   per window is enough for counters; the sidecar samples every
   ``spec.sampling.intervalSeconds`` on its own);
3. aggregates the pods, names a straggler, diagnoses, and passes the verdict through
   the profile's ``Stabilizer`` (hysteresis);
4. writes ONE merge patch of the status (none when it would change nothing but
   ``lastEvaluationTime``: ``status.changes_status``) and, when the published verdict's
   (axis, regime) changed, one ``BottleneckChanged`` Event; with ``spec.actions`` the patch
   carries ``status.actions`` and the Events say each action's outcome
   (``dam_operator.cluster.steps.actions``). In mode InPlace a planned CPU raise is sent to the
   running pods (``pods/resize``) before the patch; the API's refusal is recorded in the
   action (never retried: the next pod created gets the raise through the webhook).

The scheduler posts a window's Events after the worker is free, ``event_concurrency`` at a
time (``Evaluator.evaluate_window`` then ``Evaluator.post_events``): when thousands of
profiles change in one window, their status writes reach the API server before the Events.

A sidecar that is down, slow or returns garbage makes that pod "not reporting" for
the window; it never fails the evaluation.

An Event the API did not take (the API server or etcd restarting) is kept, at most
``MAX_PENDING_EVENTS`` a profile, and posted again before anything else at the
profile's next initialisation or window, with its original timestamps; its name is
derived from its content (``kube.KubeClient.create_event``), so a POST the server
stored although its answer was lost is not posted twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import functools
import heapq
import itertools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from dam_operator.cluster.adapters.kube import ApiError, NotFoundError
from dam_operator.cluster.adapters.sources import MetricSource, PodResults, PodTarget
from dam_operator.cluster.runtime.opmetrics import OperatorMetrics
from dam_operator.cluster.steps import status as st
from dam_operator.cluster.steps.actions import EVENT_OUTCOMES, record_resizes
from dam_operator.cluster.steps.goodput import GoodputLedger, goodput_ratio
from dam_operator.cluster.steps.injection import InjectionSettings, resize_patch, sidecar_refusals
from dam_operator.cluster.steps.registry import ChangeKind, PodInfo, ProfileEntry, ProfileKey, Registry
from dam_operator.cluster.steps.sharding import bucket_of
from dam_operator.cluster.steps.spec import DAMProfileSpec
from dam_operator.cluster.steps.window_step import (
    ProfileState,
    StepResult,
    WindowInputs,
    WindowSettings,
    initial_step,
    invalid_step,
    resumed_state,
    window_step,
    with_confirm_windows,
)
from dam_operator.diagnosis.evidence import Evidence

log = logging.getLogger("dam_operator.cluster.scheduler")

Job = Literal["init", "adopt", "evaluate"]


class StatusAPI(Protocol):
    """What the evaluator needs of Kubernetes (``kube.KubeClient`` implements it)."""

    async def patch_profile_status(
        self, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> Mapping[str, Any]:
        """Merge-patch the status subresource; return the object. Raises NotFoundError."""
        ...

    async def create_event(self, namespace: str, body: Mapping[str, Any]) -> None: ...


@runtime_checkable
class ProfileReadAPI(Protocol):
    """What adopting a profile from another replica needs (``kube.KubeClient`` implements it)."""

    async def get_profile(self, namespace: str, name: str) -> Mapping[str, Any]:
        """The object as the API has it now. Raises NotFoundError."""
        ...


@runtime_checkable
class PodResizeAPI(Protocol):
    """What an in-place CPU raise needs (``kube.KubeClient`` implements it)."""

    async def get_pod(self, namespace: str, name: str) -> Mapping[str, Any]: ...

    async def resize_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> Mapping[str, Any]:
        """Strategic-merge-patch the ``pods/resize`` subresource. Raises ApiError when refused."""
        ...


@runtime_checkable
class PodDeleteAPI(Protocol):
    """What ``onStall: Restart`` needs (``kube.KubeClient`` implements it)."""

    async def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        """Delete the pod if it is still ``uid``. Raises ApiError when refused."""
        ...


SourceFactory = Callable[[DAMProfileSpec], MetricSource]


def observe_window(
    metrics: OperatorMetrics,
    entry: ProfileEntry,
    result: StepResult,
    *,
    status: Mapping[str, Any],
    gp: GoodputLedger,
    when: dt.datetime,
) -> None:
    """The window's per-profile figures into the operator's metrics (``status``: as written)."""
    if result.verdict is not None:
        metrics.observe_verdict(entry.namespace, entry.name, result.verdict, when.timestamp())
    metrics.observe_actions(entry.namespace, entry.name, status.get("actions"))
    metrics.observe_goodput(
        entry.namespace,
        entry.name,
        accelerator_seconds=gp.accelerator_seconds if gp.accelerators_known else None,
        ratio=goodput_ratio(gp),
        uses=gp.measured_uses(),
    )
    metrics.observe_progress(
        entry.namespace, entry.name, result.progress.state, result.progress.stalled_seconds
    )


async def delete_stalled_pods(
    api: PodDeleteAPI,
    metrics: OperatorMetrics,
    entry: ProfileEntry,
    pods: Sequence[PodInfo],
    names: Sequence[str],
) -> None:
    """``onStall: Restart``: delete the stalled job's pods (after the status that says so is
    written), each only if it is still the pod judged (its uid); a refusal is logged and counted."""
    uids = {p.name: p.uid for p in pods}
    for name in names:
        if name not in uids:
            continue
        try:
            await api.delete_pod(entry.namespace, name, uids[name])
        except ApiError as exc:
            metrics.error(exc.reason_label)
            log.warning("profile %s/%s: deleting stalled pod %s refused: %s", *entry.key, name, exc)


MAX_PENDING_EVENTS = 16
"""Events kept per profile while the API does not take them; the oldest goes first beyond this."""


async def read_status(api: ProfileReadAPI, entry: ProfileEntry) -> None:
    """Replaces the entry's status by the API's, where the object is still the entry's (its uid).

    The registry's copy of a profile another replica evaluated is as old as this replica's
    listing: the watch events of the other's status writes are dropped unparsed (handlers.py)."""
    obj = await api.get_profile(entry.namespace, entry.name)
    meta = obj.get("metadata") or {}
    if meta.get("uid") == entry.uid and isinstance(obj.get("status"), Mapping):
        entry.status = obj["status"]


@dataclass(slots=True)
class _ProfileState:
    uid: str
    confirm_windows: int
    profile: ProfileState
    """What the windows carry from one to the next (``window_step.ProfileState``, plain data);
    each window replaces it with the one ``window_step`` returns."""
    written: tuple[Evidence, ...] = ()
    """The records behind the evidence sentences the status holds (those of the last verdict
    written; none after a restart): ``status.changes_status`` compares evidence by them."""


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Evaluator:
    """Everything one profile's evaluation does; the scheduler decides when."""

    def __init__(
        self,
        registry: Registry,
        api: StatusAPI,
        source_for: SourceFactory,
        metrics: OperatorMetrics,
        *,
        scrape_concurrency: int = 128,
        max_baseline_windows: float = 3.0,
        webhook_enabled: bool = True,
        instance: str = "dam-operator",
        now: Callable[[], dt.datetime] = _utcnow,
        injection: InjectionSettings | None = None,
        stall_restart_enabled: bool = False,
    ) -> None:
        """``injection``: the admin's rules on ``spec.sidecar`` (``injection.sidecar_refusals``), which
        a profile's ``SpecValid`` reports; None: nothing refused (the webhook's own check stands).
        ``stall_restart_enabled``: the chart granted pods/delete (``spec.actions.onStall: Restart``)."""
        self._stall_restart = stall_restart_enabled and isinstance(api, PodDeleteAPI)
        self._registry = registry
        self._api = api
        self._source_for = source_for
        self._metrics = metrics
        self._scrape_limit = asyncio.Semaphore(scrape_concurrency)
        self._max_baseline_windows = max_baseline_windows
        self._webhook_enabled = webhook_enabled
        self._injection = injection
        self._instance = instance
        self._now = now
        self._state: dict[ProfileKey, _ProfileState] = {}
        self._pending_events: dict[ProfileKey, tuple[str | None, list[dict[str, Any]]]] = {}
        """Per profile: its uid and the Events the API did not take yet, oldest first."""

    # ------------------------------------------------------------ state

    def _state_for(self, entry: ProfileEntry, spec: DAMProfileSpec) -> _ProfileState:
        confirm = spec.evaluation.hysteresis_windows
        state = self._state.get(entry.key)
        if state is None or state.uid != entry.uid:
            state = _ProfileState(
                uid=entry.uid, confirm_windows=confirm, profile=resumed_state(entry.status, confirm)
            )
            log.debug("profile %s/%s: new state, resumed verdict %s", *entry.key, state.profile.published)
            self._state[entry.key] = state
        elif state.confirm_windows != confirm:
            state.profile = with_confirm_windows(state.profile, confirm)
            state.confirm_windows = confirm
        return state

    def forget(self, entry: ProfileEntry) -> None:
        """The profile was deleted: drop its state and its metric series."""
        state = self._state.get(entry.key)
        if state is not None and state.uid == entry.uid:
            del self._state[entry.key]
        pending = self._pending_events.get(entry.key)
        if pending is not None and pending[0] == entry.uid:
            del self._pending_events[entry.key]
        self._metrics.forget_profile(entry.namespace, entry.name)

    def _refused(self, spec: DAMProfileSpec) -> str | None:
        """What of the spec the admin's settings refuse, one message; None when nothing is."""
        if self._injection is None:
            return None
        refusals = sidecar_refusals(spec, self._injection)
        return "; ".join(refusals) if refusals else None

    # ------------------------------------------------------------ jobs

    async def adopt(self, entry: ProfileEntry) -> bool:
        """``initialize`` a profile taken over from another replica (sharding), on its status read
        again (``read_status``): hysteresis, verdict and goodput resume from it, as after a restart."""
        if isinstance(self._api, ProfileReadAPI):
            await read_status(self._api, entry)
        self._state.pop(entry.key, None)
        return await self.initialize(entry)

    async def initialize(self, entry: ProfileEntry) -> bool:
        """First write after (re)registration: validity, pods and conditions; a baseline
        scrape. Returns True when the profile should be evaluated every window."""
        now = st.format_time(self._now())
        await self._post_pending(entry)
        if entry.spec is None:
            self._metrics.forget_profile(entry.namespace, entry.name)
            self._state.pop(entry.key, None)
            result = invalid_step(entry.status, entry.error or "invalid", entry.generation, now)
            await self._write(entry, result.patch)
            for event in result.events:
                await self._post(entry, event, now)
            return False
        spec = entry.spec
        state = self._state_for(entry, spec)
        pods = self._registry.pods_for(entry)
        result = initial_step(
            spec=spec,
            status=entry.status,
            generation=entry.generation,
            pods=pods,
            results=await self._scrape(spec, pods),
            now=now,
            webhook_enabled=self._webhook_enabled,
            refused=self._refused(spec),
        )
        state.profile = dataclasses.replace(
            state.profile,
            baselines={**state.profile.baselines, **result.baselines},
            marks={**state.profile.marks, **result.marks},
        )
        self._record(entry, result)
        await self._write(entry, result.patch)
        for event in result.events:
            await self._post(entry, event, now)
        return True

    async def evaluate(self, entry: ProfileEntry) -> None:
        """One window: scrape, then the pure window step, one status patch, maybe an Event."""
        await self.post_events(entry, await self.evaluate_window(entry))

    async def post_events(self, entry: ProfileEntry, events: list[tuple[st.EventSpec, str]]) -> None:
        """Posts a window's Events (``evaluate_window``), in order, after any still waiting."""
        for event, now in events:
            await self._post(entry, event, now)

    async def evaluate_window(self, entry: ProfileEntry) -> list[tuple[st.EventSpec, str]]:
        """``evaluate`` up to the status write; returns the Events to post, each with its time.

        The scheduler posts them after it has freed the evaluation worker: at a switch of
        thousands of profiles the status writes, which automation waits for, go first.
        """
        await self._post_pending(entry)
        spec = entry.spec
        if spec is None:
            return []
        state = self._state_for(entry, spec)
        when = self._now()
        pods = self._registry.pods_for(entry)
        status: Mapping[str, Any] = entry.status
        inputs = WindowInputs(
            spec=spec,
            status=status,
            generation=entry.generation,
            pods=pods,
            results=await self._scrape(spec, pods),
            when=when,
            settings=WindowSettings(
                webhook_enabled=self._webhook_enabled,
                max_baseline_seconds=self._max_baseline_windows * spec.evaluation.window_seconds,
                restart_allowed=self._stall_restart,
            ),
            ended=self._registry.oom_ended_pods_for(entry),
            finished=self._registry.finished_pods_for(entry),
            refused=self._refused(spec),
            exited=self._registry.exited_pods_for(entry),
        )
        after, result = window_step(state.profile, inputs)
        # published once written (ProfileState.published): a write that raises tells it again
        state.profile = dataclasses.replace(after, published=state.profile.published)
        self._record(entry, result)
        if result.resizes:
            await self._resize(entry, result, st.format_time(when))
        records = result.verdict.bottleneck.records() if result.verdict is not None else []
        if st.changes_status(status, result.patch, records=(*state.written, *records)):
            written = await self._write(entry, result.patch)
            if written is not None:
                status = written
                if result.verdict is not None:
                    state.written = tuple(records)
        state.profile = dataclasses.replace(state.profile, published=result.published)
        observe_window(self._metrics, entry, result, status=status, gp=state.profile.goodput, when=when)
        if result.progress.delete_pods and isinstance(self._api, PodDeleteAPI):
            await delete_stalled_pods(self._api, self._metrics, entry, pods, result.progress.delete_pods)
        self._metrics.evaluation(ok=True)
        at = st.format_time(when)
        for event in result.events:
            if event.reason in EVENT_OUTCOMES:
                self._metrics.action(EVENT_OUTCOMES[event.reason])
        return [(event, at) for event in result.events]

    async def _resize(self, entry: ProfileEntry, result: StepResult, now: str) -> None:
        """Send the in-place CPU raises; record what was resized and what the API refused."""
        actions = result.patch["status"].get("actions")
        if not isinstance(actions, list):
            return
        resized: list[str] = []
        refused: dict[str, str] = {}
        for request in result.resizes:
            if not isinstance(self._api, PodResizeAPI):
                refused[request.pod] = "the operator's API client cannot resize pods"
                continue
            try:
                pod = await self._api.get_pod(entry.namespace, request.pod)
                body = resize_patch(pod, request.cpu)
                if body is None:
                    refused[request.pod] = f"the training container has no CPU limit below {request.cpu}"
                    continue
                await self._api.resize_pod(entry.namespace, request.pod, body)
                resized.append(request.pod)
            except ApiError as exc:
                self._metrics.error(exc.reason_label)
                refused[request.pod] = str(exc)
                log.warning(
                    "profile %s/%s: in-place resize of pod %s refused: %s", *entry.key, request.pod, exc
                )
        new_actions, events = record_resizes(actions, result.resizes[0].action_id, resized, refused, now)
        result.patch["status"]["actions"] = new_actions
        result.events.extend(events)

    def _record(self, entry: ProfileEntry, result: StepResult) -> None:
        for reason in result.error_reasons:
            self._metrics.error(reason)
        if result.counts is not None:
            c = result.counts
            self._metrics.set_pods(entry.namespace, entry.name, c.matched, c.instrumented, c.reporting)

    # ------------------------------------------------------------ helpers

    async def _scrape(self, spec: DAMProfileSpec, pods: list[PodInfo]) -> PodResults:
        targets = [
            PodTarget(p.namespace, p.name, p.pod_ip or "", spec.sidecar.port) for p in pods if p.scrapable
        ]
        if not targets:
            return {}
        source = self._source_for(spec)
        return await source.fetch_all(targets, self._scrape_limit, self._metrics.scrape_duration)

    async def _post(self, entry: ProfileEntry, event: st.EventSpec, now: str) -> None:
        body = st.event_manifest(
            namespace=entry.namespace,
            name=entry.name,
            uid=entry.uid,
            spec=event,
            now=now,
            instance=self._instance,
        )
        pending = self._pending_events.get(entry.key)
        if pending is not None and pending[0] == entry.uid and pending[1]:
            self._keep_event(entry, body)  # after the ones still waiting: Events keep their order
        elif not await self._send_event(entry, body):
            self._keep_event(entry, body)

    async def _send_event(self, entry: ProfileEntry, body: Mapping[str, Any]) -> bool:
        """One POST; False when the API did not take it (an Event never fails the evaluation)."""
        try:
            await self._api.create_event(entry.namespace, body)
        except Exception as exc:
            self._metrics.error("event-failed")
            log.warning("profile %s/%s: could not post an event: %s", entry.namespace, entry.name, exc)
            return False
        return True

    def _keep_event(self, entry: ProfileEntry, body: dict[str, Any]) -> None:
        uid, events = self._pending_events.get(entry.key, (entry.uid, []))
        if uid != entry.uid:
            uid, events = entry.uid, []  # a new object of the same name: the old one's Events go
        events.append(body)
        if len(events) > MAX_PENDING_EVENTS:
            dropped = events.pop(0)
            log.warning(
                "profile %s/%s: more than %d Events not posted; dropped the oldest (%s)",
                *entry.key,
                MAX_PENDING_EVENTS,
                dropped.get("reason"),
            )
        self._pending_events[entry.key] = (uid, events)

    async def _post_pending(self, entry: ProfileEntry) -> None:
        """Posts the Events the API did not take before, oldest first; stops at the first refusal."""
        pending = self._pending_events.get(entry.key)
        if pending is None:
            return
        uid, events = pending
        if uid != entry.uid:
            del self._pending_events[entry.key]
            return
        while events and await self._send_event(entry, events[0]):
            events.pop(0)
        if not events:
            del self._pending_events[entry.key]

    async def _write(self, entry: ProfileEntry, patch: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """Patches the status; keeps and returns the status the API answered with (None: none)."""
        obj = await self._api.patch_profile_status(entry.namespace, entry.name, patch)
        new_status = obj.get("status") if isinstance(obj, Mapping) else None
        if not isinstance(new_status, Mapping):
            return None
        entry.status = new_status
        current = self._registry.profile(entry.namespace, entry.name)
        if current is not None and current is not entry and current.uid == entry.uid:
            current.status_packed = entry.status_packed
        return new_status


# ---------------------------------------------------------------- the loop


@dataclass(order=True, slots=True)
class _Due:
    at: float
    seq: int
    key: ProfileKey = field(compare=False)
    revision: int = field(compare=False)
    job: Job = field(compare=False)
    epoch: int = field(compare=False, default=0)
    """The profile's bucket's ownership epoch when pushed (sharding): work pushed before this
    replica released the bucket is dropped when it comes due."""


class Scheduler:
    """Runs ``Evaluator`` jobs when they are due, ``concurrency`` at a time.

    Subscribe it to the registry (``registry.subscribe(scheduler.on_change)``); a new or
    changed profile gets an ``init`` job at once, then an ``evaluate`` job every window.
    Work for an old revision of a profile is dropped when it comes due.
    """

    def __init__(
        self,
        registry: Registry,
        evaluator: Evaluator,
        metrics: OperatorMetrics,
        *,
        concurrency: int = 32,
        event_concurrency: int = 4,
        clock: Callable[[], float] = time.monotonic,
        retry_seconds: float = 5.0,
    ) -> None:
        self._registry = registry
        self._evaluator = evaluator
        self._metrics = metrics
        self._concurrency = concurrency
        self._event_limit = asyncio.Semaphore(event_concurrency)
        self._clock = clock
        self._retry_seconds = retry_seconds
        self._heap: list[_Due] = []
        self._seq = itertools.count()
        self._wake = asyncio.Event()
        self._in_flight: set[ProfileKey] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._task_of: dict[ProfileKey, asyncio.Task[None]] = {}
        self._held: frozenset[int] | None = None
        """The buckets this replica evaluates (sharding); None: every profile."""
        self._epochs: dict[int, int] = {}

    # ------------------------------------------------------------ inputs

    def on_change(self, kind: ChangeKind, entry: ProfileEntry) -> None:
        if kind == "upsert":
            if self.owns(entry.key):
                self._push(self._clock(), entry, "init")
        else:
            self._evaluator.forget(entry)
        self._metrics.set_profiles(len(self._registry))

    def _push(self, at: float, entry: ProfileEntry, job: Job, epoch: int | None = None) -> None:
        if epoch is None:
            epoch = self._epoch(entry.key)
        heapq.heappush(self._heap, _Due(at, next(self._seq), entry.key, entry.revision, job, epoch))
        self._wake.set()

    # ------------------------------------------------------------ shards (runtime/shards.py)

    def owns(self, key: ProfileKey) -> bool:
        """Whether this replica evaluates the profile (always, unless sharded)."""
        return self._held is None or bucket_of(*key) in self._held

    def _epoch(self, key: ProfileKey) -> int:
        return 0 if self._held is None else self._epochs.get(bucket_of(*key), 0)

    def shard(self) -> None:
        """Turn sharding on, holding no bucket yet (before the first profile is registered)."""
        if self._held is None:
            self._held = frozenset()

    def adopt(self, buckets: frozenset[int]) -> int:
        """Start evaluating the profiles of ``buckets`` (their owner released them); returns how many."""
        self.shard()
        assert self._held is not None
        self._held |= buckets
        now = self._clock()
        adopted = [e for e in self._registry.profiles() if bucket_of(*e.key) in buckets]
        for entry in adopted:
            self._push(now, entry, "adopt")
        return len(adopted)

    async def release(self, buckets: frozenset[int], timeout_seconds: float) -> None:
        """Stop evaluating the profiles of ``buckets``: no new work starts there at once, the work
        in flight (an evaluation, its Events) may end for ``timeout_seconds`` and is cancelled
        then; their state and metric series are dropped. After it returns this replica writes
        nothing more of them, and the bucket may be handed over."""
        self.shard()
        assert self._held is not None
        self._held -= buckets
        for b in buckets:
            self._epochs[b] = self._epochs.get(b, 0) + 1

        def busy() -> list[ProfileKey]:
            return [k for k in self._in_flight if bucket_of(*k) in buckets]

        deadline = self._clock() + timeout_seconds
        while busy() and self._clock() < deadline:
            await asyncio.sleep(0.05)
        late = [self._task_of[k] for k in busy() if k in self._task_of]
        for task in late:
            task.cancel()
        if late:
            await asyncio.gather(*late, return_exceptions=True)
            log.warning("released buckets: %d evaluations cancelled after %.1f s", len(late), timeout_seconds)
        for entry in self._registry.profiles():
            if bucket_of(*entry.key) in buckets:
                self._evaluator.forget(entry)

    # ------------------------------------------------------------ the loop

    async def run(self) -> None:
        """Forever (until cancelled): wait for the next due job, hand it to a worker."""
        limit = asyncio.Semaphore(self._concurrency)
        try:
            while True:
                self._wake.clear()
                now = self._clock()
                if not self._heap or self._heap[0].at > now:
                    timeout = None if not self._heap else self._heap[0].at - now
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), timeout)
                    continue
                due = heapq.heappop(self._heap)
                entry = self._registry.profile(*due.key)
                if entry is None or entry.revision != due.revision:
                    continue  # deleted or replaced by a newer revision
                if not self.owns(due.key) or due.epoch != self._epoch(due.key):
                    continue  # handed over to another replica (sharding)
                if due.key in self._in_flight:
                    heapq.heappush(
                        self._heap, _Due(now + 0.05, next(self._seq), due.key, due.revision, due.job)
                    )
                    continue
                await limit.acquire()
                self._metrics.evaluation_delay(self._clock() - due.at)
                self._in_flight.add(due.key)
                task = asyncio.create_task(
                    self._work(due, entry, limit), name=f"dam-eval-{due.key[0]}/{due.key[1]}"
                )
                self._tasks.add(task)
                self._task_of[due.key] = task
                task.add_done_callback(functools.partial(self._done, due.key))
        finally:
            for task in list(self._tasks):
                task.cancel()
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)

    def _done(self, key: ProfileKey, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if self._task_of.get(key) is task:
            del self._task_of[key]

    async def _work(self, due: _Due, entry: ProfileEntry, limit: asyncio.Semaphore) -> None:
        next_job: Job | None = "evaluate"
        next_at: float | None = None
        events: list[tuple[st.EventSpec, str]] = []
        try:
            window = entry.spec.evaluation.window_seconds if entry.spec else 0.0
            if due.job in ("init", "adopt"):
                first = self._evaluator.adopt if due.job == "adopt" else self._evaluator.initialize
                next_job = "evaluate" if await first(entry) else None
                next_at = self._clock() + window
            else:
                events = await self._evaluator.evaluate_window(entry)
                next_at = due.at + window
                now = self._clock()
                if next_at <= now:  # overran: skip the missed slots, keep the phase
                    missed = int((now - next_at) // window) + 1
                    next_at += missed * window
                    self._metrics.error("evaluation-overrun")
        except asyncio.CancelledError:
            raise
        except NotFoundError:
            next_job = None
            log.info("profile %s/%s is gone from the API; dropping it", *due.key)
            if self._same(entry):
                self._registry.remove_profile(*due.key)
        except ApiError as exc:
            self._metrics.evaluation(ok=False, reason=exc.reason_label)
            log.warning("profile %s/%s: %s failed: %s; retrying", due.key[0], due.key[1], due.job, exc)
            next_at, next_job = self._clock() + self._retry_delay(entry), due.job
        except Exception:
            self._metrics.evaluation(ok=False, reason="internal")
            log.exception("profile %s/%s: %s failed; retrying", due.key[0], due.key[1], due.job)
            next_at, next_job = self._clock() + self._retry_delay(entry), due.job
        finally:
            limit.release()
            if not events:
                self._in_flight.discard(due.key)
        if events:
            # Off the evaluation worker, a few at a time: at a switch of thousands of profiles
            # the status writes go first. The profile stays in flight, so that its next window
            # waits for its Events and they keep their order.
            try:
                async with self._event_limit:
                    await self._evaluator.post_events(entry, events)
            except asyncio.CancelledError:
                raise
            except Exception:  # an Event never stops the profile's evaluations
                self._metrics.error("event-failed")
                log.exception("profile %s/%s: posting its Events failed", *due.key)
            finally:
                self._in_flight.discard(due.key)
        if next_job is not None and next_at is not None and self._same(entry):
            self._push(next_at, entry, next_job, due.epoch)

    def _same(self, entry: ProfileEntry) -> bool:
        current = self._registry.profile(*entry.key)
        return current is not None and current.revision == entry.revision

    def _retry_delay(self, entry: ProfileEntry) -> float:
        window = entry.spec.evaluation.window_seconds if entry.spec else self._retry_seconds
        return min(self._retry_seconds, window)
