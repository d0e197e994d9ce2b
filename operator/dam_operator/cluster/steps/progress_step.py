"""Whether the profile's job makes progress, from the pods' latest scrapes (pure).

Each sidecar exports, per rank of its pod, the latest batch's time
(``dam_last_batch_timestamp_seconds``), whether a process of the rank still runs (``dam_rank_up``),
the collectives its training thread entered (``dam_collective_sequence``) and, once a step is
overdue, where the probe's watchdog found that thread (``dam_training_place_info``: where, detail,
frames). ``rank_places`` turns a pod's scrape into the progress judge's ``RankPlace``s
(``diagnosis.progress``), ``progress_step`` judges the job and says what to write:
``status.progress``, the ``Progressing`` condition, the Events (``JobStalled``, ``JobProgressing``),
whether the ledger counts this window as ``stalled`` badput, and, with ``spec.actions.onStall:
Restart``, which Pods to delete.

Clocks. A batch's time is the training node's clock and the judge's ``now`` the operator's: each
pod's times are moved by the difference between the operator's time and its sidecar's sample time
(``Snapshot.timestamp_seconds``), so a node whose clock runs ahead or behind neither hides a stall
nor makes one.

State. Everything that lasts across windows is in ``status.progress`` itself (the state and its
``since``, the latest restart and its outcome): an operator restart loses nothing.

The restart (``onStall: Restart``): once a stall has lasted ``restartGraceSeconds`` past its
threshold, the profile's running Pods are deleted (only instrumented ones whose sidecar answered
the window: the Pods whose ranks were judged; RBAC cannot narrow ``pods/delete`` to them, so the
operator does), once per stall (the stall's ``since`` is kept
in ``status.progress.restart.stallSince``), so that their controller (a Job, a JobSet, a
StatefulSet) recreates them. What came of it is measured: ``resumed`` with the time the job took a
step again and what the stall cost (its start to that step), or ``stalled-again``. The operator
deletes Pods only where the chart granted it ``pods/delete`` (``allowed``); otherwise the
restart is recorded ``refused``, with the setting that grants it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from dam_contract import names
from dam_contract.snapshot import Snapshot
from dam_operator.cluster.steps import status as st
from dam_operator.cluster.steps.goodput import parse_time
from dam_operator.cluster.steps.registry import PodInfo
from dam_operator.cluster.steps.spec import DAMProfileSpec
from dam_operator.diagnosis.hysteresis import rfc3339
from dam_operator.diagnosis.model import Verdict
from dam_operator.diagnosis.progress import (
    WHERE_VALUES,
    Progress,
    RankPlace,
    Tracker,
    judge,
    median_step_seconds,
)
from dam_operator.diagnosis.slowdown import Slowdown, SlowdownTracker, figures_of

CONDITION_PROGRESSING: Final = "Progressing"
EVENT_STALLED: Final = "JobStalled"
EVENT_PROGRESSING: Final = "JobProgressing"
EVENT_RESTARTED: Final = "StalledJobRestarted"
EVENT_RESTART_REFUSED: Final = "StalledJobRestartRefused"
EVENT_SLOWED_DOWN: Final = "JobSlowedDown"
TEMPLATE_LABELS: Final = (
    "pod-template-hash",
    "controller-revision-hash",
    "batch.kubernetes.io/controller-uid",
    "controller-uid",
)
"""Labels that change with the Pods' template (a Deployment's ReplicaSet, a StatefulSet's
revision, a Job: a new Job is a new template): a slowdown's baseline starts again when they do."""
RESTART_GRANT: Final = "rbac.stallRestart"
"""The chart value that grants the operator pods/delete (``onStall: Restart``)."""
MAX_FRAMES: Final = 8
MAX_RANKS_PER_POD: Final = 1024
MAX_RESTART_PODS_LISTED: Final = 64
"""``status.progress.restart.pods`` names at most this many of the Pods deleted (sorted);
``podCount`` counts them all: a 1,000-Pod job's names would be 30 KB of the status."""

RESTART_PENDING: Final = "pending"
RESTART_RESUMED: Final = "resumed"
RESTART_STALLED_AGAIN: Final = "stalled-again"
RESTART_REFUSED: Final = "refused"
RESTART_OUTCOMES: Final = (RESTART_PENDING, RESTART_RESUMED, RESTART_STALLED_AGAIN, RESTART_REFUSED)


def _ranked(snapshot: Snapshot, name: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in snapshot.samples(name):
        key = s.label(names.RANK_LABEL)
        if s.value == s.value and (key in out or len(out) < MAX_RANKS_PER_POD):  # NaN is not a figure
            out[key] = s.value
    return out


def _rank_number(key: str) -> int | None:
    return int(key) if key.isdigit() else None


def rank_places(pod: str, snapshot: Snapshot, now_seconds: float) -> list[RankPlace]:
    """The pod's ranks as the judge sees them; none for a sidecar that exports no batch times (an
    older one, or no batch yet). Batch times are moved to the operator's clock (module docstring)."""
    last = _ranked(snapshot, names.LAST_BATCH_TIMESTAMP_SECONDS)
    if not last:
        return []
    shift = now_seconds - snapshot.timestamp_seconds if snapshot.timestamp_seconds is not None else 0.0
    steps = _ranked(snapshot, names.STEPS_TOTAL)
    step_seconds = _ranked(snapshot, names.STEP_SECONDS_TOTAL)
    up = _ranked(snapshot, names.RANK_UP)
    entered = _ranked(snapshot, names.COLLECTIVE_SEQUENCE)
    places: dict[str, tuple[str, str, tuple[str, ...]]] = {}
    for s in snapshot.samples(names.TRAINING_PLACE_INFO):
        found = s.label("where")
        if s.value == 1.0 and found in WHERE_VALUES:
            frames = tuple(line for line in s.label("frames").split("\n") if line)[:MAX_FRAMES]
            places[s.label(names.RANK_LABEL)] = (found, s.label(names.DETAIL_LABEL), frames)
    out = []
    for key, at in sorted(last.items()):
        read = places.get(key)
        where, detail, frames = read if read is not None else (None, "", ())
        out.append(
            RankPlace(
                pod=pod,
                rank=_rank_number(key),
                steps=max(0, int(steps.get(key, 0.0))),
                step_seconds=max(0.0, step_seconds.get(key, 0.0)),
                last_batch_ns=max(0, int((at + shift) * 1e9)) if at > 0 else 0,
                running=up.get(key, 1.0) >= 1.0,
                entered=max(0, int(entered.get(key, 0.0))),
                place=where,
                detail=detail,
                frames=frames,
            )
        )
    return out


def job_places(answered: Mapping[str, Snapshot], now_seconds: float) -> list[RankPlace]:
    return [place for pod in sorted(answered) for place in rank_places(pod, answered[pod], now_seconds)]


@dataclass
class ProgressStep:
    """What a window decides about progress."""

    progress: dict[str, Any] | None = None
    """``status.progress`` to write; None: leave it (no pod answered)."""
    condition: dict[str, Any] | None = None
    events: list[st.EventSpec] = field(default_factory=list)
    stalled_since: float | None = None
    """Unix seconds the stall began (its last step) while the job is Stalled: the goodput ledger
    counts the time since then as ``stalled``."""
    delete_pods: list[str] = field(default_factory=list)
    """Pods to delete now (``onStall: Restart``)."""
    state: str | None = None
    stalled_seconds: float = 0.0


def _tracker(previous: Mapping[str, Any]) -> Tracker:
    state = previous.get("state")
    since = previous.get("since")
    return Tracker(
        state=state if isinstance(state, str) else None, since=since if isinstance(since, str) else None
    )


def progressing_condition(progress: Progress, generation: int | None) -> dict[str, Any]:
    """``Progressing``: True while steps come, False while Stalled (so ``kubectl wait
    --for=condition=Progressing=False`` waits for a stall), Unknown before the first step."""
    if progress.state == "Progressing":
        last = progress.last_step_time or "?"
        return st.condition(CONDITION_PROGRESSING, True, "Progressing", f"latest step at {last}", generation)
    if progress.state == "Stalled":
        return st.condition(CONDITION_PROGRESSING, False, "Stalled", progress.describe(), generation)
    found = st.condition(
        CONDITION_PROGRESSING, False, "NotStarted", "no rank has finished a training step yet", generation
    )
    found["status"] = "Unknown"
    return found


def _events(previous_state: str | None, progress: Progress) -> list[st.EventSpec]:
    if progress.state == "Stalled":
        return [st.EventSpec(EVENT_STALLED, f"Job {progress.describe()}", "Warning")]
    if previous_state == "Stalled":
        if progress.state == "Progressing":
            text = f"the job takes steps again (latest at {progress.last_step_time})"
        else:
            text = "the stalled job's processes were replaced; no step yet"
        return [st.EventSpec(EVENT_PROGRESSING, text)]
    if progress.state == "Progressing" and previous_state == "NotStarted":
        return [st.EventSpec(EVENT_PROGRESSING, f"first steps (at {progress.last_step_time})")]
    return []


def _restart(
    spec: DAMProfileSpec,
    previous: Mapping[str, Any] | None,
    progress: Progress,
    pods: Sequence[PodInfo],
    now: str,
    *,
    allowed: bool,
    threshold: float,
    answered: Collection[str] = frozenset(),
) -> tuple[dict[str, Any] | None, list[str], list[st.EventSpec]]:
    """The restart record to keep, the Pods to delete now and the Events (module docstring)."""
    record = dict(previous) if isinstance(previous, Mapping) else None
    if record is not None and record.get("outcome") == RESTART_PENDING:
        if progress.state == "Progressing" and progress.last_step_time and record.get("at"):
            resumed = parse_time(progress.last_step_time)
            at, began = parse_time(str(record["at"])), parse_time(str(record.get("stallSince") or ""))
            if resumed is not None and at is not None and resumed > at:
                record |= {"outcome": RESTART_RESUMED, "resumedAt": progress.last_step_time}
                if began is not None:
                    record["stallCostSeconds"] = round(resumed - began, 1)
        elif progress.state == "Stalled" and progress.since != record.get("stallSince"):
            record["outcome"] = RESTART_STALLED_AGAIN
    if spec.actions.on_stall != "Restart" or progress.state != "Stalled":
        return record, [], []
    if record is not None and record.get("stallSince") == progress.since:
        return record, [], []  # this stall was acted on already
    if (progress.stalled_seconds or 0.0) < threshold + spec.actions.restart_grace_seconds:
        return record, [], []
    # The job's Pods as judged: instrumented, live, and with a sidecar that answered this window
    # (their ranks are the stall's). A Pod the selector matches that is not instrumented, or is
    # being deleted already, is left alone.
    targets = sorted(
        p.name
        for p in pods
        if p.phase in ("Running", "Pending") and p.instrumented and not p.deleting and p.name in answered
    )
    new: dict[str, Any] = {
        "at": now,
        "stallSince": progress.since,
        "stalledSeconds": progress.stalled_seconds,
        "pods": targets[:MAX_RESTART_PODS_LISTED],
        "podCount": len(targets),
    }
    if not allowed:
        message = f"the operator may not delete pods: the chart grants it with {RESTART_GRANT}=true"
        new |= {"outcome": RESTART_REFUSED, "message": message}
        return (
            new,
            [],
            [st.EventSpec(EVENT_RESTART_REFUSED, f"onStall Restart refused: {message}", "Warning")],
        )
    new["outcome"] = RESTART_PENDING
    text = (
        f"deleted {len(targets)} pod{'s' if len(targets) != 1 else ''} of the job stalled "
        f"{progress.stalled_seconds or 0:.0f} s ({', '.join(targets)[:300]}) so that their "
        "controller recreates them"
    )
    return new, targets, [st.EventSpec(EVENT_RESTARTED, text, "Warning")]


def progress_step(
    *,
    spec: DAMProfileSpec,
    status: Mapping[str, Any],
    answered: Mapping[str, Snapshot],
    pods: Sequence[PodInfo],
    generation: int | None,
    when: dt.datetime,
    restart_allowed: bool,
) -> ProgressStep:
    """The window's progress (module docstring); nothing to write when no pod answered."""
    if not answered:
        return ProgressStep()
    previous = status.get("progress")
    previous = previous if isinstance(previous, Mapping) else {}
    now_seconds = when.timestamp()
    ranks = job_places(answered, now_seconds)
    settings = spec.evaluation.stall_settings()
    found = judge(ranks, int(now_seconds * 1e9), settings)
    tracker = _tracker(previous)
    progress, changed = tracker.update(found, rfc3339(when))
    now = st.format_time(when)
    restart, delete, restart_events = _restart(
        spec,
        previous.get("restart"),
        progress,
        pods,
        now,
        allowed=restart_allowed,
        threshold=settings.threshold_seconds(median_step_seconds(ranks)),
        answered=answered.keys(),
    )
    wire = progress.model_dump(by_alias=True, exclude_none=True, mode="json")
    if restart is not None:
        wire["restart"] = restart
    events = _events(tracker.previous, progress) if changed else []
    stalled_since = parse_time(progress.since) if progress.state == "Stalled" else None
    return ProgressStep(
        progress=wire,
        condition=progressing_condition(progress, generation),
        events=[*events, *restart_events],
        stalled_since=stalled_since,
        delete_pods=delete,
        state=progress.state,
        stalled_seconds=progress.stalled_seconds or 0.0,
    )


def slowdown_key(generation: int | None, pods: Sequence[PodInfo]) -> str:
    """The profile's generation and the Pods' templates (``TEMPLATE_LABELS``): a slowdown's
    baseline is the job's own under one spec and one template."""
    templates = sorted({f"{k}={p.labels[k]}" for p in pods for k in TEMPLATE_LABELS if k in p.labels})
    return f"{generation}|{','.join(templates)[:1000]}"


def slowdown_update(
    tracker: SlowdownTracker, progress: dict[str, Any], verdict: Verdict | None, key: str, now: str
) -> list[st.EventSpec]:
    """The window's verdict into the slowdown tracker; ``status.progress.slowdown`` into
    ``progress`` (the wire) while there is one, and the Event of a change. A window without a
    verdict keeps what the tracker holds."""
    found: Slowdown | None
    if verdict is None:
        found, changed = tracker.current, False
    else:
        found, changed = tracker.update(figures_of(verdict), now, key)
    if found is not None:
        progress["slowdown"] = found.model_dump(by_alias=True, mode="json")
    if not changed:
        return []
    if found is not None:
        return [st.EventSpec(EVENT_SLOWED_DOWN, f"Job slowed down: {found.describe()}"[:1000], "Warning")]
    return [st.EventSpec(EVENT_PROGRESSING, "the step rate is back to the job's own baseline")]
