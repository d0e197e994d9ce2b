"""Pure builders of what the operator writes: status merge patches, conditions, Events.

Nothing here does I/O or reads a clock; callers pass ``now``. Status writes are JSON
merge patches (RFC 7386), so a key that was there before and is gone now is written
as ``null`` (``null_out``): nothing stale survives an update, including after an
operator restart (the previous status comes from the object itself).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dam_operator.cluster.steps.injection import (
    NOTE_NO_SHARED_PROCESS_NAMESPACE,
    NOTE_PYTHONPATH_REF,
    NOTE_SKIP_HOST_NETWORK,
    NOTE_SKIP_POLICY,
    NOTE_SKIP_PORT,
    NOTE_SKIP_PROBE_PATH,
    OPTED_OUT,
)
from dam_operator.cluster.steps.metric_names import SCRAPE_ERROR_REASONS
from dam_operator.diagnosis.evidence import Evidence
from dam_operator.diagnosis.hysteresis import rfc3339
from dam_operator.diagnosis.model import Bottleneck, Straggler

GROUP = "dam.mlsys.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "DAMProfile"
PLURAL = "damprofiles"
COMPONENT = "dam-operator"

# Condition types the operator owns (crds/damprofile.yaml); any other type found is stale.
SPEC_VALID = "SpecValid"
INSTRUMENTED = "Instrumented"
REPORTING = "Reporting"
DIAGNOSED = "Diagnosed"
MANAGED_CONDITIONS = (SPEC_VALID, INSTRUMENTED, REPORTING, DIAGNOSED)

# Reasons (CamelCase, stable: automation may match on them).
REASON_VALID = "SpecValid"
REASON_INVALID = "InvalidSpec"
REASON_REFUSED = "RefusedByClusterPolicy"
"""SpecValid=False: the spec parses, but asks for what the cluster admin does not allow (a sidecar
image not listed, a shared process namespace): no pod is instrumented, the pods are still listed."""
REASON_DIAGNOSED = "BottleneckFound"
REASON_INSUFFICIENT = "InsufficientData"
REASON_PENDING = "AwaitingWindow"
REASON_NO_PODS = "NoMatchingPods"
REASON_NO_REPORTING = "NoReportingPods"
REASON_NO_INSTRUMENTED = "NoInstrumentedPods"
REASON_ALL_INSTRUMENTED = "AllPodsInstrumented"
REASON_NOT_INSTRUMENTED = "PodsNotInstrumented"
REASON_PROBE_UNCERTAIN = "ProbeMayNotLoad"  # Unknown: the sidecar is there, the probe may not be
REASON_ALL_REPORTING = "AllPodsReporting"
REASON_NOT_REPORTING = "SidecarsNotReporting"
REASON_SIDECAR_RESTARTED = "SidecarRestarted"
"""Reporting=False: every sidecar answered, but the kubelet restarted one within the window."""
REASON_NO_ACTIVE_PODS = "NoActivePods"
"""Reporting=False: no pod of the profile is active any more (the Job finished); the last verdict stays."""
REASON_TOO_LARGE = "SourceAnswerTooLarge"
"""Reporting=False: an answer (a sidecar's /metrics, a Prometheus answer) passed the operator's cap."""
REASON_SOURCE_REFUSED = "SourceRefused"
"""Reporting=False: the profile's Prometheus resolved to an address the admin's rules refuse."""
REASON_BOTTLENECK_CHANGED = "BottleneckChanged"
REASON_STRAGGLER = "StragglerDetected"

# Two of the failed scrapes' reasons (metric_names.SCRAPE_ERROR_REASONS) that name the condition.
REASON_LABEL_TOO_LARGE, REASON_LABEL_REFUSED = (
    r for r in SCRAPE_ERROR_REASONS if r in ("scrape-too-large", "scrape-refused")
)

MAX_NOT_INSTRUMENTED_LISTED = 50
MAX_MESSAGE = 1024
MAX_NAMES_LISTED = 5


format_time = rfc3339
"""RFC 3339 in UTC with second precision, as Kubernetes writes times (one formatter for the project)."""


def _clip(text: str, limit: int = MAX_MESSAGE) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def condition(type_: str, ok: bool, reason: str, message: str, generation: int | None) -> dict[str, Any]:
    """One condition without ``lastTransitionTime`` (``merge_conditions`` sets it)."""
    out: dict[str, Any] = {
        "type": type_,
        "status": "True" if ok else "False",
        "reason": reason,
        "message": _clip(message),
    }
    if generation is not None:
        out["observedGeneration"] = generation
    return out


def merge_conditions(
    previous: Sequence[Mapping[str, Any]] | None, new: Sequence[Mapping[str, Any]], now: str
) -> list[dict[str, Any]]:
    """The full conditions list to write: ``new`` in order, each keeping its previous
    ``lastTransitionTime`` when its status did not change; previous conditions of
    types absent from ``new`` are dropped (they are stale)."""
    before = {c.get("type"): c for c in previous or () if isinstance(c, Mapping)}
    out: list[dict[str, Any]] = []
    for cond in new:
        item = dict(cond)
        old = before.get(item["type"])
        if old is not None and old.get("status") == item["status"] and old.get("lastTransitionTime"):
            item["lastTransitionTime"] = old["lastTransitionTime"]
        else:
            item["lastTransitionTime"] = now
        out.append(item)
    return out


def carry_conditions(
    previous: Sequence[Mapping[str, Any]] | None, types: Sequence[str]
) -> list[dict[str, Any]]:
    """Previous conditions of ``types``, unchanged (for partial updates that keep them)."""
    return [dict(c) for c in previous or () if isinstance(c, Mapping) and c.get("type") in types]


def null_out(previous: Mapping[str, Any] | None, new: Mapping[str, Any]) -> dict[str, Any]:
    """``new`` as a merge patch over ``previous``: keys only in ``previous`` become None,
    recursively into mappings present on both sides. Lists replace wholesale."""
    out: dict[str, Any] = {}
    prev = previous or {}
    for key, value in new.items():
        old = prev.get(key)
        if isinstance(value, Mapping) and isinstance(old, Mapping):
            out[key] = null_out(old, value)
        else:
            out[key] = value
    for key in prev:
        if key not in new:
            out[key] = None
    return out


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(sorted(names)[:MAX_NAMES_LISTED])
    more = len(names) - MAX_NAMES_LISTED
    return shown + (f" and {more} more" if more > 0 else "")


def spec_condition(error: str | None, generation: int | None, refused: str | None = None) -> dict[str, Any]:
    """``SpecValid``: False for an invalid spec (``error``) or one the admin's rules refuse (``refused``)."""
    if refused is not None and error is None:
        return condition(
            SPEC_VALID,
            False,
            REASON_REFUSED,
            f"Refused by the cluster admin's settings; no pod is instrumented: {refused}",
            generation,
        )
    if error is None:
        return condition(SPEC_VALID, True, REASON_VALID, "The spec is valid.", generation)
    return condition(SPEC_VALID, False, REASON_INVALID, f"Invalid spec: {error}", generation)


# Why a pod has no sidecar, from the note the webhook left on it (injection.NOTE_SKIP_*) or its
# opt-out, and what to do about it. Pods with neither were created while the webhook was down or
# before the profile existed.
_NOT_INJECTED_FIXES = (
    (
        NOTE_SKIP_POLICY,
        "were admitted without the sidecar because this DAMProfile asks for what the cluster admin does "
        "not allow (SpecValid says what): change the profile, then delete these pods so that new ones "
        "are created",
    ),
    (
        OPTED_OUT,
        "opted out with dam.mlsys.dev/inject=false (label or annotation): remove it from the pod template, "
        "then delete these pods so that their controller creates new ones",
    ),
    (
        NOTE_SKIP_HOST_NETWORK,
        "use hostNetwork, so the sidecar would listen on the node itself: annotate the pod template "
        'dam.mlsys.dev/host-network-port: "<spec.sidecar.port>" to accept that, then delete these pods '
        "so that new ones are created",
    ),
    (
        NOTE_SKIP_PORT,
        "have a container on the sidecar's port: set spec.sidecar.port of this DAMProfile to a free port, "
        "then delete these pods so that new ones are created",
    ),
    (
        NOTE_SKIP_PROBE_PATH,
        "mount volumes over every probe directory under /dam: move those mounts, then delete these pods "
        "so that new ones are created",
    ),
)


def _by_note(names: Sequence[str], notes: Mapping[str, Sequence[str]], note: str) -> list[str]:
    return [n for n in names if note in notes.get(n, ())]


def instrumented_condition(
    matched: int,
    uninstrumented: Sequence[str],
    generation: int | None,
    webhook_enabled: bool = True,
    notes: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, Any]:
    """``Instrumented``: False (reason PodsNotInstrumented) when matched pods lack the sidecar, saying
    per cause what to do; Unknown (ProbeMayNotLoad) when every pod has it but some cannot load the
    probe (PYTHONPATH from a Secret or ConfigMap). ``notes``: pod name → the webhook's notes
    (``dam.mlsys.dev/injection-notes``, plus ``opted-out``)."""
    notes = notes or {}
    if matched == 0:
        return condition(
            INSTRUMENTED, True, REASON_NO_PODS, "No running pod matches the selector.", generation
        )
    without = set(uninstrumented)
    instrumented = [n for n in notes if n not in without]
    unshared = _by_note(instrumented, notes, NOTE_NO_SHARED_PROCESS_NAMESPACE)
    caveat = (
        f" {len(unshared)} of them keep shareProcessNamespace: false although the profile asks for a shared "
        f"one (spec.sidecar.shareProcessNamespace) ({_names(unshared)}): their CPU time and memory come "
        "from the probe, as in a pod that did not ask, and processes without the probe are not counted."
        if unshared
        else ""
    )
    if not uninstrumented:
        uncertain = _by_note(instrumented, notes, NOTE_PYTHONPATH_REF)
        if uncertain:
            out = condition(
                INSTRUMENTED,
                False,
                REASON_PROBE_UNCERTAIN,
                f"All {matched} matched pods have the sidecar, but {len(uncertain)} take PYTHONPATH from a "
                f"Secret or ConfigMap, which the webhook cannot extend: {_names(uncertain)}. The probe "
                "loads there only if that value holds the probe directory (/dam/probe); set PYTHONPATH as "
                "a literal value in the pod template, or add the probe directory to the referenced value."
                + caveat,
                generation,
            )
            out["status"] = "Unknown"
            return out
        return condition(
            INSTRUMENTED,
            True,
            REASON_ALL_INSTRUMENTED,
            f"All {matched} matched pods have the sidecar.{caveat}",
            generation,
        )
    if not webhook_enabled:
        how = " The operator's webhook is disabled; add the sidecar by hand or enable the webhook."
    else:
        rest = list(uninstrumented)
        parts = []
        for note, fix in _NOT_INJECTED_FIXES:
            these = _by_note(rest, notes, note)
            if these:
                parts.append(f"{_names(these)}: {fix}.")
                listed = set(these)
                rest = [n for n in rest if n not in listed]
        if rest:
            parts.append(
                f"{_names(rest)}: created while the webhook was down or before this profile existed; the "
                "webhook acts only when a pod is created, so delete them and let their controller (Job, "
                "Deployment, PyTorchJob…) create new ones (kubectl delete pod NAME); a pod without a "
                "controller must be created again from its manifest."
            )
        how = " " + " ".join(parts)
    return condition(
        INSTRUMENTED,
        False,
        REASON_NOT_INSTRUMENTED,
        f"{len(uninstrumented)} of {matched} matched pods have no DAM sidecar.{how}{caveat}",
        generation,
    )


def reporting_condition(
    instrumented: int,
    reporting: int,
    problems: Sequence[str],
    generation: int | None,
    reasons: Sequence[str] = (),
    *,
    restarted: int = 0,
) -> dict[str, Any]:
    """``Reporting``: True when every instrumented pod's sidecar answered this window.

    ``reasons``: the failed scrapes' ``SourceError.reason`` labels; an answer over its cap
    (``SourceAnswerTooLarge``) or a refused address (``SourceRefused``) names itself, since
    the fix is the admin's setting, not the pods. ``restarted``: pods whose sidecar answered but
    was restarted within the window; not in ``reporting`` (``status.pods.reporting`` says the
    same), and when they are all that is missing the reason is ``SidecarRestarted``."""
    if instrumented == 0:
        return condition(
            REPORTING, False, REASON_NO_INSTRUMENTED, "No matched pod has the sidecar.", generation
        )
    if reporting >= instrumented and not problems:
        return condition(
            REPORTING,
            True,
            REASON_ALL_REPORTING,
            f"All {instrumented} instrumented pods reported.",
            generation,
        )
    shown = "; ".join(problems[:MAX_NAMES_LISTED])
    more = len(problems) - MAX_NAMES_LISTED
    detail = shown + (f"; and {more} more" if more > 0 else "")
    if restarted and reporting + restarted >= instrumented:  # all answered, some with a gap
        return condition(
            REPORTING,
            False,
            REASON_SIDECAR_RESTARTED,
            f"{reporting} of {instrumented} instrumented pods reported the whole window; {restarted} "
            f"answered with a gap, their sidecar restarted: {detail}",
            generation,
        )
    reason = REASON_NOT_REPORTING
    if REASON_LABEL_TOO_LARGE in reasons:
        reason = REASON_TOO_LARGE
    elif REASON_LABEL_REFUSED in reasons:
        reason = REASON_SOURCE_REFUSED
    return condition(
        REPORTING,
        False,
        reason,
        f"{instrumented - reporting} of {instrumented} instrumented pods did not report: {detail}",
        generation,
    )


def diagnosed_condition(
    *, bottleneck: Bottleneck | None, matched: int, instrumented: int, reporting: int, generation: int | None
) -> dict[str, Any]:
    """``Diagnosed``: True with the verdict, or False with why there is none this window."""
    if matched == 0:
        return condition(DIAGNOSED, False, REASON_NO_PODS, "No running pod matches the selector.", generation)
    if instrumented == 0:
        return condition(
            DIAGNOSED,
            False,
            REASON_NO_INSTRUMENTED,
            f"None of the {matched} matched pods has the sidecar.",
            generation,
        )
    if reporting == 0 or bottleneck is None:
        held = (
            f" Holding the last verdict ({bottleneck.axis.value}, {bottleneck.regime.value})."
            if bottleneck is not None and bottleneck.axis.value != "Unknown"
            else ""
        )
        return condition(
            DIAGNOSED,
            False,
            REASON_NO_REPORTING,
            f"None of the {instrumented} instrumented pods reported metrics this window.{held}",
            generation,
        )
    b = bottleneck
    if b.axis.value == "Unknown":
        missing = f" Missing: {', '.join(b.missing)}." if b.missing else ""
        return condition(
            DIAGNOSED,
            False,
            REASON_INSUFFICIENT,
            f"Not enough evidence for a verdict from {reporting} reporting pods.{missing}",
            generation,
        )
    return condition(
        DIAGNOSED,
        True,
        REASON_DIAGNOSED,
        f"{b.axis.value} ({b.regime.value}), confidence {b.confidence:.2f}: pull {b.lever}. "
        f"{reporting} of {matched} pods reporting.",
        generation,
    )


def kept_conditions(
    bottleneck: Mapping[str, Any], kept_from: str, generation: int | None
) -> list[dict[str, Any]]:
    """``Reporting`` and ``Diagnosed`` once no pod of the profile is active any more (its Job
    finished, its Pods Succeeded or deleted): the last verdict stays in the status, as a VPA
    keeps its recommendation, and the conditions say where it comes from."""
    kept = f"the last verdict is kept from {kept_from}; no training pod is running"
    return [
        condition(REPORTING, False, REASON_NO_ACTIVE_PODS, kept, generation),
        condition(
            DIAGNOSED,
            True,
            REASON_DIAGNOSED,
            f"{bottleneck.get('axis')} ({bottleneck.get('regime')}): pull {bottleneck.get('lever')}; {kept}.",
            generation,
        ),
    ]


def pending_condition(generation: int | None, window_seconds: float) -> dict[str, Any]:
    return condition(
        DIAGNOSED,
        False,
        REASON_PENDING,
        f"Collecting the first {window_seconds:g}-second window.",
        generation,
    )


def pods_status(
    matched: int,
    instrumented: int,
    reporting: int,
    not_instrumented: Sequence[str] = (),
) -> dict[str, Any]:
    """``status.pods``; ``notInstrumented`` is None (removed) when empty.

    ``straggler`` is always null: the straggler lives in ``bottleneck.straggler`` now, and the
    null removes the pod name that operators before 0.2 wrote here."""
    listed = sorted(not_instrumented)[:MAX_NOT_INSTRUMENTED_LISTED]
    return {
        "matched": matched,
        "instrumented": instrumented,
        "reporting": reporting,
        "notInstrumented": listed or None,
        "straggler": None,
    }


def evaluation_patch(
    previous_status: Mapping[str, Any] | None,
    *,
    verdict_status: Mapping[str, Any] | None,
    pods: Mapping[str, Any],
    conditions: Sequence[Mapping[str, Any]],
    generation: int | None,
    now: str,
    evaluated: bool = True,
) -> dict[str, Any]:
    """The one merge patch of an evaluation: ``{"status": {...}}``.

    ``verdict_status`` is ``Verdict.to_status()`` (``bottleneck``, ``metrics``) or None
    to remove both. ``evaluated=False`` (the first write after a (re)start or a spec
    change) leaves ``bottleneck``/``metrics``/``lastEvaluationTime`` as they are.
    Conditions not in ``conditions`` are removed (stale).
    """
    prev = dict(previous_status or {})
    status: dict[str, Any] = {
        "pods": dict(pods),
        "conditions": merge_conditions(prev.get("conditions"), conditions, now),
    }
    if generation is not None:
        status["observedGeneration"] = generation
    if evaluated:
        status["lastEvaluationTime"] = now
        verdict = dict(verdict_status or {})
        for key in ("bottleneck", "metrics"):
            new = verdict.get(key)
            old = prev.get(key)
            if new is None:
                status[key] = None
            elif isinstance(old, Mapping):
                status[key] = null_out(old, new)
            else:
                status[key] = new
    return {"status": status}


def goodput_patch(previous: Any, goodput: Mapping[str, Any] | None) -> Any:
    """``status.goodput`` as a merge patch over the previous one: keys gone become null. None when
    no goodput is known (no pod reported any, and the status had none: a ledger resumed from a
    status keeps its figures, so this never removes what was written)."""
    if goodput is None:
        return None
    if isinstance(previous, Mapping):
        return null_out(previous, goodput)
    return dict(goodput)


def invalid_patch(
    previous_status: Mapping[str, Any] | None, error: str, generation: int | None, now: str
) -> dict[str, Any]:
    """An invalid spec: SpecValid=False and Diagnosed=False name the field and the fix; no verdict."""
    prev = dict(previous_status or {})
    conditions = [
        spec_condition(error, generation),
        condition(
            DIAGNOSED, False, REASON_INVALID, f"Not evaluated: the spec is invalid ({error}).", generation
        ),
    ]
    status: dict[str, Any] = {
        "conditions": merge_conditions(prev.get("conditions"), conditions, now),
        "bottleneck": None,
        "metrics": None,
        "pods": None,
        "lastEvaluationTime": None,
    }
    if generation is not None:
        status["observedGeneration"] = generation
    return {"status": status}


FIGURE_TOLERANCE = 0.01
"""Relative: figures closer than this are the same figure. A window's figures are measurements
(steps over seconds, busy time over wall time): a steady job's move by a fraction of a percent
from window to window, and the scheduling of the scrapes alone moves them that much. The status
keeps the last figure written until one moves by more than this from it, so what it shows is
never further than this from the truth, and a steady job costs no API write a window."""

FIGURE_ABS_TOLERANCE = 0.001
"""Absolute, for figures near zero (a data-wait ratio of 0.0002 after one of 0: no change)."""


def _apply_merge_patch(target: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7386 on a copy: None removes a key, mappings merge, anything else replaces."""
    out = dict(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping):
            old = out.get(key)
            out[key] = _apply_merge_patch(old if isinstance(old, Mapping) else {}, value)
        else:
            out[key] = value
    return out


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _same(a: Any, b: Any, rel_tol: float, abs_tol: float) -> bool:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same(a[k], b[k], rel_tol, abs_tol) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y, rel_tol, abs_tol) for x, y in zip(a, b, strict=True))
    if _number(a) and _number(b):
        return math.isclose(a, b, rel_tol=rel_tol, abs_tol=abs_tol)
    return bool(a == b)


def _by_identity(status: dict[str, Any], known: Mapping[str, tuple[str, str]]) -> None:
    """``bottleneck.evidence`` as what each line finds (``Evidence.identity``) where its record is
    known, else as its text: the comparison then reads the records' fields, not the sentences."""
    bottleneck = status.get("bottleneck")
    if not isinstance(bottleneck, Mapping) or not isinstance(bottleneck.get("evidence"), list):
        return
    lines = [known.get(e, ("", e)) if isinstance(e, str) else e for e in bottleneck["evidence"]]
    status["bottleneck"] = {**bottleneck, "evidence": lines}


def _readers_part(status: dict[str, Any]) -> dict[str, Any]:
    """``status`` without what no reader uses: ``lastEvaluationTime`` and ``goodput.handover``
    (the ledger's readings for the next owner: they change every window a pod reports, and are
    written with the totals they belong to whenever those are)."""
    status.pop("lastEvaluationTime", None)
    goodput = status.get("goodput")
    if isinstance(goodput, Mapping) and "handover" in goodput:
        status["goodput"] = {k: v for k, v in goodput.items() if k != "handover"}
    return status


def changes_status(
    previous_status: Mapping[str, Any] | None,
    patch: Mapping[str, Any],
    *,
    records: Iterable[Evidence] = (),
    rel_tol: float = FIGURE_TOLERANCE,
    abs_tol: float = FIGURE_ABS_TOLERANCE,
) -> bool:
    """Whether writing ``patch`` (``{"status": {...}}``) would change anything a reader can use.

    ``lastEvaluationTime`` alone is not a change, nor ``goodput.handover``, nor a figure that
    moved by less than ``rel_tol`` (relative) or ``abs_tol`` (absolute), nor an evidence line
    whose record finds the same (``Evidence.identity``: only the window's sample size differs,
    "(240 steps in 30 s)": a window stretched by an operator under load finds the same thing).
    ``records`` are the records behind the evidence sentences on either side (those the status
    holds, those of the patch's verdict: ``Bottleneck.records()``); a line with none is compared
    as text, so after an operator restart (no records of what the status holds) the first such
    window writes once. Text, order, keys added or removed are changes.
    The operator skips such a write, so a profile whose job and pods do not change costs the
    API server no write (and its watchers no event) per window; ``lastEvaluationTime`` is then
    the time of the evaluation that last changed the status.
    """
    before = _readers_part(dict(previous_status or {}))
    after = _readers_part(_apply_merge_patch(dict(previous_status or {}), patch.get("status") or {}))
    known = {r.sentence: r.identity for r in records}
    if known:
        _by_identity(before, known)
        _by_identity(after, known)
    return not _same(before, after, rel_tol, abs_tol)


def verdict_key(bottleneck: Mapping[str, Any] | Bottleneck | None) -> tuple[str, str] | None:
    """(axis, regime) of a bottleneck in either form; None when there is none."""
    if bottleneck is None:
        return None
    if isinstance(bottleneck, Bottleneck):
        return (bottleneck.axis.value, bottleneck.regime.value)
    axis, regime = bottleneck.get("axis"), bottleneck.get("regime")
    if not isinstance(axis, str) or not isinstance(regime, str):
        return None
    return (axis, regime)


@dataclass(frozen=True)
class EventSpec:
    reason: str
    message: str
    type: str = "Normal"


def bottleneck_changed_event(previous: Mapping[str, Any] | None, new: Bottleneck) -> EventSpec | None:
    """The Event to emit when the verdict's (axis, regime) changed; None when it did not
    (the first ``unknown`` of a new profile is no change either)."""
    old_key = verdict_key(previous)
    if old_key == verdict_key(new):
        return None
    if old_key is None and new.regime.value == "unknown":
        return None  # no verdict yet and still none: nothing changed for a reader
    was = f" It was {old_key[0]} ({old_key[1]})." if old_key else ""
    detail = new.lever_detail.rstrip()
    if detail and not detail.endswith("."):
        detail += "."
    message = (
        f"Bottleneck is {new.axis.value} ({new.regime.value}), confidence {new.confidence:.2f}: "
        f"pull lever {new.lever} — {detail}{was}"
    )
    return EventSpec(reason=REASON_BOTTLENECK_CHANGED, message=_clip(message))


def straggler_event(previous: Mapping[str, Any] | None, new: Straggler | None) -> EventSpec | None:
    """``StragglerDetected`` when the straggler (pod, rank or cause) changed to a new one; None
    when it is the same or there is none now (its disappearance shows in the status)."""
    if new is None:
        return None
    old = (previous.get("pod"), previous.get("rank"), previous.get("cause")) if previous else None
    if old == (new.pod, new.rank, new.cause.value):
        return None
    who = f"pod {new.pod}" if new.pod else "a pod"
    if new.rank is not None:
        who += f" (rank {new.rank})"
    because = f": {new.evidence[0]}" if new.evidence else ""
    message = f"Straggler: {who} holds the job back, cause {new.cause.value}{because}"
    return EventSpec(reason=REASON_STRAGGLER, message=_clip(message), type="Warning")


def refused_spec_event(refused: str) -> EventSpec:
    """A Warning Event for a spec the admin's rules refuse (once per generation): the field, the
    chart value and the fix."""
    return EventSpec(
        reason=REASON_REFUSED,
        message=_clip(f"Refused by the cluster admin's settings; no pod is instrumented: {refused}"),
        type="Warning",
    )


def invalid_spec_event(error: str) -> EventSpec:
    """A Warning Event for an invalid spec (once per generation): the field and the fix."""
    return EventSpec(reason=REASON_INVALID, message=_clip(f"Invalid spec: {error}"), type="Warning")


def event_manifest(
    *,
    namespace: str,
    name: str,
    uid: str | None,
    spec: EventSpec,
    now: str,
    instance: str,
) -> dict[str, Any]:
    """A core/v1 Event about a DAMProfile (what ``kubectl describe`` and ``get events`` show)."""
    involved: dict[str, Any] = {"apiVersion": API_VERSION, "kind": KIND, "name": name, "namespace": namespace}
    if uid:
        involved["uid"] = uid
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{name}.", "namespace": namespace},
        "involvedObject": involved,
        "reason": spec.reason,
        "message": spec.message,
        "type": spec.type,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": instance,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
