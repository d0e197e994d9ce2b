"""The window step: what one window of one profile decides, as pure functions.

Snapshots and pods in; observation, pod counts, conditions, the status patch and the
Event out. No I/O, no clock, no kopf: the scheduler fetches (``sources``), calls one of
the three steps here, then writes what it returns. The first write after a (re)start
(``initial_step``) and every later window (``window_step``) count pods and scrape
failures with the same functions (``classify`` and ``count_pods``), so ``status.pods``
and the conditions cannot differ between them with nothing changed in the cluster.

A profile's state between windows is one frozen ``ProfileState`` (plain data: its baselines,
memory marks, hysteresis, goodput ledger, slowdown tracker and published verdict);
``window_step(state, inputs)`` returns the next one and never mutates the one passed in (it
works on copies of the mutable ``Stabilizer``, ``GoodputLedger`` and ``SlowdownTracker``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError

from dam_contract import names
from dam_contract.snapshot import CompactSnapshot, Sample, Snapshot
from dam_operator.cluster.steps import status as st
from dam_operator.cluster.steps.actions import ActionStep, ResizeRequest, window_actions
from dam_operator.cluster.steps.goodput import GoodputLedger, parse_datetime
from dam_operator.cluster.steps.progress_step import (
    CONDITION_PROGRESSING,
    ProgressStep,
    progress_step,
    slowdown_key,
    slowdown_update,
)
from dam_operator.cluster.steps.registry import PodInfo
from dam_operator.cluster.steps.source_error import SourceError
from dam_operator.cluster.steps.spec import DAMProfileSpec
from dam_operator.diagnosis import series
from dam_operator.diagnosis.engine import diagnose
from dam_operator.diagnosis.hysteresis import Stabilizer
from dam_operator.diagnosis.model import Bottleneck, Observation, Verdict
from dam_operator.diagnosis.slowdown import SlowdownTracker
from dam_operator.diagnosis.window import JobWindow, PodWindow, baseline, furthest_steps, job_window

Results = Mapping[str, "Snapshot | SourceError"]


@dataclass(frozen=True)
class Scrape:
    """This window's scrape results, classified."""

    answered: dict[str, Snapshot]
    """Pods whose sidecar (injected or added by hand) answered."""
    problems: list[str]
    """Why instrumented pods did not report (not running, no IP, a sidecar error)."""
    error_reasons: list[str]
    """One ``SourceError.reason`` per failed scrape of an instrumented pod (for the metrics)."""
    gapped: frozenset[str] = frozenset()
    """Answered pods whose sidecar the kubelet restarted within the window (``sidecar_gaps``):
    their sidecar did not report the whole window, so they do not count as reporting."""


@dataclass(frozen=True)
class PodCounts:
    matched: int
    instrumented: int
    reporting: int
    uninstrumented: list[str]
    notes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Pod name → how the webhook (did not) instrument it (``PodInfo.notes``), pods with notes only."""


@dataclass
class StepResult:
    patch: dict[str, Any]
    """The one status merge patch to write."""
    counts: PodCounts | None = None
    events: list[st.EventSpec] = field(default_factory=list)
    verdict: Verdict | None = None
    baselines: dict[str, Snapshot] = field(default_factory=dict)
    """Each pod's snapshot to difference the next window against."""
    published: tuple[str, str] | None = None
    """(axis, regime) now in the status."""
    error_reasons: list[str] = field(default_factory=list)
    resizes: list[ResizeRequest] = field(default_factory=list)
    """In-place CPU resizes to send before the patch (``spec.actions.mode: InPlace``)."""
    marks: dict[str, Snapshot] = field(default_factory=dict)
    """Each pod's last memory gauges (``memory_mark``), kept for a pod that dies before a window."""
    progress: ProgressStep = field(default_factory=ProgressStep)
    """The job's progress (``progress_step``): its state, and Pods to delete (``onStall: Restart``)."""


MARK_NAMES = frozenset(
    {
        names.PROCESS_RESIDENT_MEMORY_BYTES,
        names.PROCESSES,
        names.CONTAINER_MEMORY_USAGE_BYTES,
        names.CONTAINER_MEMORY_LIMIT_BYTES,
    }
)
"""The gauges that say which process held the memory: RSS by role, processes by role (the loader's
workers), the container's memory and limit. ``baseline`` keeps counters only."""


def memory_mark(snapshot: Snapshot) -> CompactSnapshot:
    """A scrape's memory gauges (``MARK_NAMES``) and time: a few series a pod.

    A window replaces a pod's mark only with a scrape that has resident memory by role: the
    sidecar answers one last time as the kernel kills the trainer, with no live training
    process and so none, and the mark that says who held the memory is the one before."""
    keep = [sample for name in sorted(MARK_NAMES & snapshot.names()) for sample in snapshot.samples(name)]
    return CompactSnapshot(keep, snapshot.timestamp_seconds)


def _oom_sentence(pod: PodInfo, mark: Snapshot | None) -> str:
    record = pod.oom
    who = f"container {record.container}" if record is not None and record.container else "a container"
    code = f", exit code {record.exit_code}" if record is not None and record.exit_code is not None else ""
    where = f" ({record.state}.terminated{code})" if record is not None else ""
    at = pod.last_oom_kill or "?"
    last = (
        "no scrape of it answered before it died"
        if mark is None or mark.timestamp_seconds is None
        else f"its last scrape at {st.format_time(dt.datetime.fromtimestamp(mark.timestamp_seconds, dt.UTC))}"
    )
    phase = f"the pod is {pod.phase}" if pod.phase in ("Failed", "Succeeded") else "before a window formed"
    return (
        f"pod {pod.name}: {who} was OOM-killed at {at}{where}, {phase}: judged from the kubelet's "
        f"container status and {last}"
    )


def with_last_words(snapshot: Snapshot, pod: PodInfo) -> Snapshot:
    """``snapshot`` with the series the OOM-killed container's probes left in its termination
    message (``OomRecord.last_words``) and the scrape lacks: the loader's ``num_workers`` by rank,
    and the workers DataLoader said died. A loader the kernel killed a second after the loop
    started reaches the operator only so (no scrape saw it): the loader lever, not the trainer's."""
    words = () if pod.oom is None else pod.oom.last_words
    if not words:
        return snapshot
    have = snapshot.names()
    added: list[Sample] = []
    if names.DATALOADER_NUM_WORKERS not in have:
        added.extend(
            Sample(
                names.DATALOADER_NUM_WORKERS,
                () if w.rank is None else ((names.RANK_LABEL, str(w.rank)),),
                float(w.loader_workers),
            )
            for w in words
            if w.loader_workers is not None
        )
    # The pod's count (the sidecar's, over every process it saw) and the dying processes' own
    # (said after the last scrape): the larger, never their sum (the scrape may have counted them).
    kills = float(sum(w.worker_kills for w in words))
    scraped = series.counter_increase(Snapshot([]), snapshot, names.DATALOADER_WORKER_KILLS_TOTAL)
    replace = scraped is None or kills > scraped
    if replace:
        added.append(Sample(names.DATALOADER_WORKER_KILLS_TOTAL, (), max(kills, scraped or 0.0)))
    if not added:
        return snapshot
    drop = {names.DATALOADER_WORKER_KILLS_TOTAL} if replace else set()
    keep = [s for n in sorted(have - drop) for s in snapshot.samples(n)]
    return Snapshot([*keep, *added], snapshot.timestamp_seconds)


def oom_exit_code(pod: PodInfo) -> int | None:
    """The exit code of the pod's latest OOM-killed container (137: its main process was the
    victim; another: a child was, e.g. a DataLoader worker); None when not known."""
    code = None if pod.oom is None else pod.oom.exit_code
    return code if code is not None and 0 <= code <= 255 else None


OOM_SLACK_SECONDS = 5.0
"""An OOM kill this much before the window's start still counts (clock skew between nodes)."""


def oom_killed_within(last_oom_kill: str | None, when: dt.datetime, window_seconds: float) -> bool | None:
    """True when the pod's last OOM kill (RFC 3339) fell in the window ending at ``when``.

    ``lastState`` keeps a termination until the next one, so an old kill must not hold the
    verdict at memory-capacity forever: only a kill inside this window counts. None (unknown)
    when the pod never reported one.
    """
    at = parse_datetime(last_oom_kill)
    if at is None:
        return None
    return at >= when - dt.timedelta(seconds=window_seconds + OOM_SLACK_SECONDS)


def sidecar_gaps(pods: Sequence[PodInfo], when: dt.datetime, window_seconds: float) -> dict[str, str]:
    """The instrumented pods whose sidecar the kubelet restarted within the window ending at
    ``when`` (name → why): their scrapes may both have answered, but the sidecar's own samples
    (GPU, CPU sampled at 1 Hz) have a hole there; the probe's counters in the pod kept counting."""
    return {
        p.name: f"{p.name}: its sidecar was restarted at {p.sidecar_restarted_at} (the kubelet's container "
        "status): its own samples have a gap there, the probe's counters kept counting"
        for p in pods
        if p.instrumented and p.active and oom_killed_within(p.sidecar_restarted_at, when, window_seconds)
    }


def _not_running(pods: Sequence[PodInfo]) -> list[str]:
    """Why instrumented pods were not scraped at all (not running yet, no IP)."""
    out = []
    for p in pods:
        if p.instrumented and not p.scrapable:
            why = f"phase {p.phase or 'unknown'}" if p.phase != "Running" else "no pod IP yet"
            out.append(f"{p.name}: not scraped ({why})")
    return out


def classify(pods: Sequence[PodInfo], results: Results) -> Scrape:
    """Splits scrape results into answers and problems.

    Every running pod is scraped, so that a sidecar added by hand is honoured; a pod
    without the injected sidecar that does not answer is expected silence, not a fault.
    """
    without_sidecar = {p.name for p in pods if not p.instrumented}
    answered: dict[str, Snapshot] = {}
    problems = _not_running(pods)
    reasons: list[str] = []
    for name, result in results.items():
        if isinstance(result, SourceError):
            if name in without_sidecar:
                continue
            problems.append(f"{name}: {result.message}")
            reasons.append(result.reason)
        else:
            answered[name] = result
    return Scrape(answered=answered, problems=problems, error_reasons=reasons)


def count_pods(pods: Sequence[PodInfo], scrape: Scrape) -> PodCounts:
    """``status.pods``' figures; a pod whose sidecar answered counts as instrumented whoever added it.

    Reporting: the pods whose sidecar answered and was not restarted within the window, so that
    ``status.pods.reporting`` and the ``Reporting`` condition (False, ``SidecarRestarted``) agree."""
    uninstrumented = [p.name for p in pods if not p.instrumented and p.name not in scrape.answered]
    return PodCounts(
        matched=len(pods),
        instrumented=len(pods) - len(uninstrumented),
        reporting=sum(1 for name in scrape.answered if name not in scrape.gapped),
        uninstrumented=uninstrumented,
        notes={p.name: p.notes for p in pods if p.notes},
    )


def _common_conditions(
    counts: PodCounts, scrape: Scrape, generation: int | None, webhook: bool, refused: str | None = None
) -> list[Any]:
    return [
        st.spec_condition(None, generation, refused),
        st.instrumented_condition(
            counts.matched,
            counts.uninstrumented,
            generation,
            webhook,
            notes=counts.notes,
        ),
        st.reporting_condition(
            counts.instrumented,
            counts.reporting,
            scrape.problems,
            generation,
            scrape.error_reasons,
            restarted=len(scrape.gapped & scrape.answered.keys()),
        ),
    ]


def invalid_step(status: Mapping[str, Any], error: str, generation: int | None, now: str) -> StepResult:
    """An invalid spec: the conditions say so; the Warning Event goes out once per generation.

    A restart of the operator, a resume or a metadata-only update re-registers the profile
    with the same generation: its status already carries ``SpecValid=False`` for that
    generation, so no second Event is posted.
    """
    previous = _conditions(status).get(st.SPEC_VALID)
    already = (
        previous is not None
        and previous.get("status") == "False"
        and previous.get("observedGeneration") == generation
    )
    return StepResult(
        patch=st.invalid_patch(status, error, generation, now),
        events=[] if already else [st.invalid_spec_event(error)],
    )


def _refused_events(
    status: Mapping[str, Any], refused: str | None, generation: int | None
) -> list[st.EventSpec]:
    """The Warning Event of a refused spec, unless the status says so for this generation already."""
    if refused is None:
        return []
    previous = _conditions(status).get(st.SPEC_VALID)
    already = (
        previous is not None
        and previous.get("reason") == st.REASON_REFUSED
        and previous.get("observedGeneration") == generation
    )
    return [] if already else [st.refused_spec_event(refused)]


def _conditions(status: Mapping[str, Any]) -> dict[Any, Mapping[str, Any]]:
    return {c.get("type"): c for c in status.get("conditions") or () if isinstance(c, Mapping)}


def initial_step(
    *,
    spec: DAMProfileSpec,
    status: Mapping[str, Any],
    generation: int | None,
    pods: Sequence[PodInfo],
    results: Results,
    now: str,
    webhook_enabled: bool,
    refused: str | None = None,
) -> StepResult:
    """The first write after (re)registration: validity, pods, conditions and a baseline.

    The verdict already in the status stays (``Diagnosed`` too, when it is for this generation).
    ``refused``: what of the spec the cluster admin's settings refuse (``injection.sidecar_refusals``):
    ``SpecValid=False`` says it, and a Warning Event once per generation (as ``invalid_step``).
    """
    scrape = classify(pods, results)
    counts = count_pods(pods, scrape)
    old_diag = _conditions(status).get(st.DIAGNOSED)
    if old_diag is not None and old_diag.get("observedGeneration") == generation and status.get("bottleneck"):
        diagnosed = {k: v for k, v in old_diag.items() if k != "lastTransitionTime"}
    else:
        diagnosed = st.pending_condition(generation, spec.evaluation.window_seconds)
    patch = st.evaluation_patch(
        status,
        verdict_status=None,
        pods=st.pods_status(counts.matched, counts.instrumented, counts.reporting, counts.uninstrumented),
        conditions=[*_common_conditions(counts, scrape, generation, webhook_enabled, refused), diagnosed],
        generation=generation,
        now=now,
        evaluated=False,
    )
    # Progress is judged at the next window; until then its condition stays as it was.
    patch["status"]["conditions"] += st.carry_conditions(status.get("conditions"), [CONDITION_PROGRESSING])
    return StepResult(
        patch=patch,
        counts=counts,
        events=_refused_events(status, refused, generation),
        baselines={name: baseline(snap) for name, snap in scrape.answered.items()},
        error_reasons=scrape.error_reasons,
        marks={name: memory_mark(snap) for name, snap in scrape.answered.items()},
    )


def _memory_marks(
    marks: Mapping[str, Snapshot], known: set[str], answered: Mapping[str, Snapshot]
) -> dict[str, Snapshot]:
    """Each known pod's last memory gauges: replaced only by a scrape with resident memory by role
    (the sidecar's last answer as the kernel killed the trainer may have none)."""
    kept = {k: v for k, v in marks.items() if k in known}
    return kept | {
        name: memory_mark(result)
        for name, result in answered.items()
        if name not in kept or names.PROCESS_RESIDENT_MEMORY_BYTES in result.names()
    }


def decide_window(inputs: WindowInputs, state: ProfileState) -> StepResult:
    """One window: difference each pod against its baseline, aggregate, diagnose, stabilize,
    act (``window_actions``), judge the job's progress and goodput (``_progress_and_goodput``).
    A pod OOM-killed before it formed a window is evidence (``_oom_windows``). ``state``'s
    hysteresis, goodput ledger and slowdown tracker are updated in place (``window_step`` is the
    form that does not mutate: it passes copies); its baselines, marks and verdict published are
    read, the next ones returned."""
    spec, status, generation, pods, when = (
        inputs.spec,
        inputs.status,
        inputs.generation,
        inputs.pods,
        inputs.when,
    )
    published = state.published
    window_seconds = spec.evaluation.window_seconds
    scrape = _classify_with_gaps(pods, inputs.results, when, window_seconds)
    counts = count_pods(pods, scrape)
    known = {p.name for p in pods} | {p.name for p in inputs.ended}
    new_marks = _memory_marks(state.marks, known, scrape.answered)
    windows, new_baselines = _pod_windows(
        spec,
        pods,
        scrape,
        state.baselines,
        known,
        when=when,
        max_baseline_seconds=inputs.settings.max_baseline_seconds,
    )
    oom_notes = _oom_windows(
        windows, [*pods, *inputs.ended], state.baselines, new_marks, when, window_seconds
    )
    patch, verdict, per_pod = _patch_and_verdict(
        spec,
        status,
        windows=windows,
        oom_notes=oom_notes,
        active=bool(pods),
        counts=counts,
        scrape=scrape,
        stabilizer=state.stabilizer,
        generation=generation,
        when=when,
        webhook_enabled=inputs.settings.webhook_enabled,
        refused=inputs.refused,
    )
    acted = _act(patch["status"], spec, status, generation, pods, per_pod, verdict, when)
    progress = _progress_and_goodput(
        inputs,
        patch["status"],
        scrape=scrape,
        goodput=state.goodput,
        verdict=verdict,
        slowdown=state.slowdown,
    )
    verdict_events = _verdict_events(status, published, verdict) if verdict else []
    return StepResult(
        patch=patch,
        counts=counts,
        verdict=verdict,
        baselines=new_baselines,
        published=published if verdict is None else st.verdict_key(verdict.bottleneck),
        error_reasons=scrape.error_reasons,
        resizes=acted.resizes,
        marks=new_marks,
        progress=progress,
        events=[*verdict_events, *acted.events, *progress.events],
    )


@dataclass(frozen=True)
class ProfileState:
    """One profile's state between windows, as plain data: no API client, no callable, no clock.

    Everything a window needs from the windows before it, so that it can be serialized and
    travel with the profile between operator replicas (issue 30). ``window_step`` never mutates
    it: it returns the next one, which the scheduler keeps in place of this one."""

    stabilizer: Stabilizer
    """The verdict's hysteresis (``diagnosis.hysteresis``)."""
    baselines: Mapping[str, Snapshot] = field(default_factory=dict)
    """Each pod's snapshot to difference the next window against."""
    marks: Mapping[str, Snapshot] = field(default_factory=dict)
    """Each pod's last memory gauges (``memory_mark``): the evidence of a pod that dies."""
    goodput: GoodputLedger = field(default_factory=GoodputLedger)
    """The job's goodput so far (``cluster.steps.goodput``), resumed from ``status.goodput``."""
    slowdown: SlowdownTracker = field(default_factory=SlowdownTracker)
    """The job's step-rate baseline and slowdown (``diagnosis.slowdown``)."""
    published: tuple[str, str] | None = None
    """(axis, regime) last written to the status (or read from it on resume). The scheduler
    keeps the returned state's verdict out of it until the status write went through: a write
    that raises (a lost answer, a 5xx) leaves the last one, so the next window emits the
    verdict's Event again instead of taking it as told."""


def resumed_state(status: Mapping[str, Any], confirm_windows: int) -> ProfileState:
    """A profile's first state in this process, from what its status holds: the verdict written
    (the hysteresis starts from it, and it counts as published) and the goodput ledger."""
    stabilizer = Stabilizer(confirm_windows=confirm_windows)
    restored = _bottleneck_from(status.get("bottleneck"))
    if restored is not None:
        stabilizer.restore(restored)
    return ProfileState(
        stabilizer=stabilizer,
        goodput=GoodputLedger.resume(status),
        published=st.verdict_key(restored) if restored is not None else None,
    )


def with_confirm_windows(state: ProfileState, confirm_windows: int) -> ProfileState:
    """``spec.evaluation.hysteresisWindows`` changed: a fresh hysteresis that keeps the verdict."""
    fresh = Stabilizer(confirm_windows=confirm_windows)
    if state.stabilizer.current is not None:
        fresh.restore(state.stabilizer.current)
    return replace(state, stabilizer=fresh)


def _bottleneck_from(raw: Any) -> Bottleneck | None:
    if not isinstance(raw, Mapping):
        return None
    try:
        return Bottleneck.model_validate(dict(raw))
    except ValidationError:
        return None


@dataclass(frozen=True)
class WindowSettings:
    """The operator process's settings a window reads (the same for every profile)."""

    webhook_enabled: bool
    max_baseline_seconds: float
    restart_allowed: bool = False
    """pods/delete granted (``progress_step``, ``onStall: Restart``)."""


@dataclass(frozen=True)
class WindowInputs:
    """What one window of one profile observed: the profile, its pods, the scrapes, the time."""

    spec: DAMProfileSpec
    status: Mapping[str, Any]
    generation: int | None
    pods: Sequence[PodInfo]
    results: Results
    when: dt.datetime
    settings: WindowSettings
    ended: Sequence[PodInfo] = ()
    """Pods OOM-killed and gone (``Registry.oom_ended_pods_for``)."""
    finished: Sequence[PodInfo] = ()
    refused: str | None = None
    exited: Sequence[PodInfo] = ()
    """Pods no longer active whose processes left exit totals (``Registry.exited_pods_for``)."""


def window_step(state: ProfileState, inputs: WindowInputs) -> tuple[ProfileState, StepResult]:
    """One window (``decide_window``) as a function of the profile's state: the next state and
    what to write. ``state`` is left as it was: the step works on copies of its mutable parts."""
    stabilizer = state.stabilizer.copy()
    goodput = state.goodput.copy()
    slowdown = state.slowdown.copy()
    working = replace(state, stabilizer=stabilizer, goodput=goodput, slowdown=slowdown)
    result = decide_window(inputs, working)
    after = replace(working, baselines=result.baselines, marks=result.marks, published=result.published)
    return after, result


def _act(  # noqa: PLR0917 (called once, in window_step)
    patch: dict[str, Any],
    spec: DAMProfileSpec,
    status: Mapping[str, Any],
    generation: int | None,
    pods: Sequence[PodInfo],
    per_pod: Mapping[str, Observation],
    verdict: Verdict | None,
    when: dt.datetime,
) -> ActionStep:
    """The window's actions (``window_actions``); ``status.actions`` into ``patch`` when changed."""
    acted = window_actions(
        spec=spec,
        status=status,
        generation=generation,
        pods=pods,
        per_pod=per_pod,
        verdict=verdict,
        when=when,
    )
    if acted.actions is not None:
        patch["actions"] = acted.actions
    return acted


def _progress_and_goodput(
    inputs: WindowInputs,
    patch: dict[str, Any],
    *,
    scrape: Scrape,
    goodput: GoodputLedger,
    verdict: Verdict | None,
    slowdown: SlowdownTracker,
) -> ProgressStep:
    """The job's progress (and slowdown) into ``patch``, then the goodput ledger (which counts a
    stall's time)."""
    spec, status, pods, when, generation = (
        inputs.spec,
        inputs.status,
        inputs.pods,
        inputs.when,
        inputs.generation,
    )
    progress = progress_step(
        spec=spec,
        status=status,
        answered=scrape.answered,
        pods=pods,
        generation=generation,
        when=when,
        restart_allowed=inputs.settings.restart_allowed,
    )
    if progress.progress is not None:
        progress.events += slowdown_update(
            slowdown, progress.progress, verdict, slowdown_key(generation, pods), st.format_time(when)
        )
    _progress_patch(patch, status, progress, st.format_time(when))
    goodput.update(
        pods=pods,
        answered=scrape.answered,
        finished=inputs.finished,
        stalled_since=progress.stalled_since,
        now=when.timestamp(),
        exited=inputs.exited,
    )
    if progress.delete_pods:
        goodput.pods_deleted(pods, progress.delete_pods, when.timestamp())
    patch["goodput"] = st.goodput_patch(status.get("goodput"), goodput.status())
    return progress


def _progress_patch(
    patch: dict[str, Any], status: Mapping[str, Any], progress: ProgressStep, now: str
) -> None:
    """``status.progress`` and the ``Progressing`` condition into the window's patch (kept as
    they were when no pod answered)."""
    conditions = patch.setdefault("conditions", [])
    if progress.condition is None:
        conditions += st.carry_conditions(status.get("conditions"), [CONDITION_PROGRESSING])
        return
    conditions += st.merge_conditions(status.get("conditions"), [progress.condition], now)
    if progress.progress is not None:
        old = status.get("progress")
        patch["progress"] = (
            st.null_out(old, progress.progress) if isinstance(old, Mapping) else progress.progress
        )


def _patch_and_verdict(
    spec: DAMProfileSpec,
    status: Mapping[str, Any],
    *,
    windows: Mapping[str, PodWindow],
    oom_notes: Sequence[str],
    active: bool,
    counts: PodCounts,
    scrape: Scrape,
    stabilizer: Stabilizer,
    generation: int | None,
    when: dt.datetime,
    webhook_enabled: bool,
    refused: str | None = None,
) -> tuple[dict[str, Any], Verdict | None, Mapping[str, Observation]]:
    """The window's status patch, its verdict and the pods' observations; with no pod of the
    profile active and no window, the kept verdict's patch (no verdict, no observation), when
    the status has a verdict to keep."""
    if not active and not windows:
        kept = _kept_patch(
            status,
            counts,
            scrape,
            generation=generation,
            webhook_enabled=webhook_enabled,
            when=when,
            refused=refused,
        )
        if kept is not None:  # the stabilizer is left as it is: the Job's next pod resumes from it
            return kept, None, {}
    job, verdict = _verdict(spec, windows, oom_notes, stabilizer, when)
    patch = _window_patch(
        status,
        generation=generation,
        counts=counts,
        scrape=scrape,
        job=job,
        verdict=verdict,
        when=when,
        webhook_enabled=webhook_enabled,
        refused=refused,
    )
    return patch, verdict, job.pods


def _kept_patch(
    status: Mapping[str, Any],
    counts: PodCounts,
    scrape: Scrape,
    *,
    generation: int | None,
    webhook_enabled: bool,
    when: dt.datetime,
    refused: str | None = None,
) -> dict[str, Any] | None:
    """No pod of the profile is active any more (its Job finished, its Pods Succeeded or deleted)
    and none died OOM-killed before a window: the status keeps the last verdict (``bottleneck``,
    ``metrics``, ``lastEvaluationTime``; ``goodput`` as the ledger has it), as a VPA keeps its
    recommendation, and ``Reporting``/``Diagnosed`` say it is kept and from when. None when there
    is no verdict to keep (no pod ever reported, or the last one was Unknown)."""
    bottleneck = status.get("bottleneck")
    if not isinstance(bottleneck, Mapping) or bottleneck.get("axis") in (None, "Unknown"):
        return None
    kept_from = str(status.get("lastEvaluationTime") or bottleneck.get("since") or "?")
    conditions = [
        *_common_conditions(counts, scrape, generation, webhook_enabled, refused)[:2],
        *st.kept_conditions(bottleneck, kept_from, generation),
    ]
    return st.evaluation_patch(
        status,
        verdict_status=None,
        pods=st.pods_status(counts.matched, counts.instrumented, counts.reporting, counts.uninstrumented),
        conditions=conditions,
        generation=generation,
        now=st.format_time(when),
        evaluated=False,
    )


def _classify_with_gaps(
    pods: Sequence[PodInfo], results: Results, when: dt.datetime, window_seconds: float
) -> Scrape:
    """``classify``, and the pods whose sidecar restarted within the window as problems (``gapped``)."""
    scrape = classify(pods, results)
    gaps = sidecar_gaps(pods, when, window_seconds)
    if gaps:
        scrape = Scrape(
            scrape.answered, [*scrape.problems, *gaps.values()], scrape.error_reasons, frozenset(gaps)
        )
    return scrape


def _pod_windows(
    spec: DAMProfileSpec,
    pods: Sequence[PodInfo],
    scrape: Scrape,
    baselines: Mapping[str, Snapshot],
    known: set[str],
    *,
    when: dt.datetime,
    max_baseline_seconds: float,
) -> tuple[dict[str, PodWindow], dict[str, Snapshot]]:
    """Each answering pod's window against its baseline, and the baselines for the next window."""
    new_baselines = {k: v for k, v in baselines.items() if k in known}
    by_name = {p.name: p for p in pods}
    windows: dict[str, PodWindow] = {}
    min_steps = spec.thresholds_model().min_steps
    for name, result in scrape.answered.items():
        before = baselines.get(name)
        if before is None or result.timestamp_seconds is None or before.timestamp_seconds is None:
            new_baselines[name] = baseline(result)
            continue
        elapsed = result.timestamp_seconds - before.timestamp_seconds
        if elapsed <= 0:
            continue  # no new sample since the last scrape (e.g. Prometheus has not scraped yet)
        new_baselines[name] = baseline(result)
        if elapsed > max_baseline_seconds:
            continue  # too old to difference against; this scrape is the new baseline
        steps = furthest_steps(before, result)
        if (
            steps is not None
            and steps < min_steps
            and elapsed + spec.evaluation.window_seconds <= max_baseline_seconds
        ):
            # Slow steps: too few in this window for a verdict. The baseline stays, so the next
            # window reaches back over this one and holds more steps (up to max_baseline_seconds);
            # meanwhile this window's unknown is held off by the stabilizer.
            new_baselines[name] = before
        killed = oom_killed_within(by_name[name].last_oom_kill, when, elapsed)
        windows[name] = PodWindow(
            before,
            with_last_words(result, by_name[name]) if killed else result,
            elapsed_seconds=elapsed,
            oom_killed=killed,
            starting=pod_starting(by_name[name], when),
            oom_exit_code=oom_exit_code(by_name[name]) if killed else None,
        )
    return windows, new_baselines


def _oom_windows(  # noqa: PLR0917 (six positional: called once, in window_step)
    windows: dict[str, PodWindow],
    pods: Sequence[PodInfo],
    baselines: Mapping[str, Snapshot],
    marks: Mapping[str, Snapshot],
    when: dt.datetime,
    window_seconds: float,
) -> list[str]:
    """Adds to ``windows`` the pods OOM-killed before they formed one; the evidence for each.

    ``pods``: the active pods and the ``ended`` ones. A finished pod counts only while no pod of
    the profile forms a window (its evidence is not current otherwise).
    """
    notes: list[str] = []
    live = bool(windows)
    for pod in pods:
        if pod.name in windows or pod.last_oom_kill is None:
            continue
        if pod.active and not oom_killed_within(pod.last_oom_kill, when, window_seconds):
            continue
        if not pod.active and live:
            continue  # a pod of the profile forms windows now: its evidence is current
        first: Snapshot = baselines.get(pod.name) or Snapshot([])
        mark = marks.get(pod.name)
        # The mark's series replace the baseline's of the same name (both keep ``dam_processes``:
        # added up, two workers would be four).
        marked = set() if mark is None else mark.names()
        parts = (first,) if mark is None else (first, mark)
        last = Snapshot(
            [
                s
                for part in parts
                for n in sorted(part.names())
                if part is mark or n not in marked
                for s in part.samples(n)
            ],
            first.timestamp_seconds,
        )
        last = with_last_words(last, pod)
        windows[pod.name] = PodWindow(
            first, last, elapsed_seconds=None, oom_killed=True, oom_exit_code=oom_exit_code(pod)
        )
        notes.append(_oom_sentence(pod, mark))
    return notes


STARTUP_GRACE_SECONDS = 300.0
"""A pod is taken as maybe still starting for this long after its ``status.startTime`` (image
pull, imports, loading a dataset or a checkpoint before the first batch)."""


def pod_starting(pod: PodInfo, when: dt.datetime) -> bool | None:
    """``Observation.starting`` of a pod's window ending at ``when``: True within
    ``STARTUP_GRACE_SECONDS`` of its ``status.startTime``, False after; None when unknown. A job
    (any of its pods starting: ``Agg.ANY``) without a step then reads "not reached its first step
    yet" (True, None) or "no DataLoader was iterated" (False: a custom loop, docs/method.md)."""
    at = parse_datetime(pod.started_at)
    return None if at is None else when - at < dt.timedelta(seconds=STARTUP_GRACE_SECONDS)


def _verdict(
    spec: DAMProfileSpec,
    windows: Mapping[str, PodWindow],
    oom_notes: Sequence[str],
    stabilizer: Stabilizer,
    when: dt.datetime,
) -> tuple[JobWindow, Verdict]:
    """The job's window and its verdict, stabilized (the stabilizer is updated in place)."""
    job = job_window(
        windows,
        batch_size=spec.model.batch_size if spec.model else None,
        flops_per_step=spec.model.flops_per_step if spec.model else None,
        gpu_model=spec.hardware.gpu_model if spec.hardware else None,
    )
    raw = diagnose(job.job, spec.thresholds_model(), spec.hardware_model(), ranks=job.ranks)
    if oom_notes:
        raw = Verdict(
            bottleneck=raw.bottleneck.model_copy(update={"evidence": [*raw.bottleneck.evidence, *oom_notes]}),
            metrics=raw.metrics,
        )
    # No data this window gives an unknown verdict, which the stabilizer holds off
    # for a few windows: a missed scrape does not erase a diagnosis.
    return job, stabilizer.update(raw, when)


def _window_patch(
    status: Mapping[str, Any],
    *,
    generation: int | None,
    counts: PodCounts,
    scrape: Scrape,
    job: JobWindow,
    verdict: Verdict,
    when: dt.datetime,
    webhook_enabled: bool,
    refused: str | None = None,
) -> dict[str, Any]:
    """The status patch of a window: the verdict, the pods and the conditions."""
    conditions = [
        *_common_conditions(counts, scrape, generation, webhook_enabled, refused),
        st.diagnosed_condition(
            bottleneck=verdict.bottleneck,
            matched=counts.matched,
            instrumented=counts.instrumented,
            reporting=len(job.pods),
            generation=generation,
        ),
    ]
    return st.evaluation_patch(
        status,
        verdict_status=verdict.to_status(),
        pods=st.pods_status(counts.matched, counts.instrumented, counts.reporting, counts.uninstrumented),
        conditions=conditions,
        generation=generation,
        now=st.format_time(when),
    )


def _verdict_events(
    status: Mapping[str, Any], published: tuple[str, str] | None, verdict: Verdict
) -> list[st.EventSpec]:
    """The Events of a new verdict: the bottleneck changed, a straggler appeared or went."""
    previous = None if published is None else {"axis": published[0], "regime": published[1]}
    old_bottleneck = status.get("bottleneck")
    events = [
        st.bottleneck_changed_event(previous, verdict.bottleneck),
        st.straggler_event(
            old_bottleneck.get("straggler") if isinstance(old_bottleneck, Mapping) else None,
            verdict.bottleneck.straggler,
        ),
    ]
    return [e for e in events if e is not None]
