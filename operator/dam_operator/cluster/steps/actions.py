"""Closing the loop in the cluster (``spec.actions``): which lever to apply, and what it did.

Pure: the profile's spec, its last status, the pods and this window's per-pod observations in;
the new ``status.actions`` list, Events and in-place resize requests out. No I/O, no clock.
Everything is derived from ``status.actions`` itself, so an operator restart loses nothing and
the webhook's overrides for a new pod are a function of the status alone (``desired_for``).

The policy (docs/automation.md says the same for users):

- **When**: only in mode ``Apply`` or ``InPlace``; only from a published verdict whose lever is
  an Apply lever for the verdict's regime (``levers.applicable``: today the input-pipeline levers
  of an ``input-bound`` verdict) with a confidence of at least ``minConfidence``; only
  while no action is pending or waiting for its rollback; only when every measured pod runs the
  current settings (its ``dam.mlsys.dev/action`` annotation is the one the webhook gives new pods
  now), so that the before-figures describe the settings the change starts from.
- **What** (one setting at a time, the Apply lever table ``levers.APPLY`` and its one climb,
  ``climb.next_value``): ``increase-dataloader-workers`` climbs ``num_workers`` 0 → 1 → 2 → 4 → …
  up to ``maxWorkers`` and the container's CPU limit divided by the ranks in the pod; once that
  climb stops, ``prefetch_factor`` 2 → 4 → 8 … up to ``maxPrefetchFactor`` (needs workers).
  ``raise-prefetch-factor`` and ``enable-pin-memory`` (with GPUs) likewise; ``raise-cpu-limit``
  doubles the training container's CPU limit, capped at ``maxCpu`` (never without it). Other
  levers (``use-sequential-shards``: a code change) are not in the table and not applied.
- **Before**: the mean per-pod steps/s and data wait of the window that triggered the action.
- **Pending** until a pod that carries it (annotation ``ID:applied``, or resized in place) has
  reported ``warmupWindows`` + 1 full windows; the last one is the **after** (mean over carriers;
  for a CPU raise only pods whose measured CPU limit reached the target count).
- **Judged** on steps/s with a noise margin m (``noiseMargin``, default 0.10): ``improved`` when
  after ≥ before × (1 + m), ``worse`` when after ≤ before × (1 − m), else ``no-change``. Improved
  settings are kept; no-change and worse ones are not: new pods are created without them (the
  annotation says ``ID:withheld``), and a worse one becomes ``rolled-back`` once such a pod has
  reported a full window. A setting whose change was not kept is not tried again in that profile
  generation (the entry stores the generation); it may be tried again after a spec change.
- **Bounded**: at most ``MAX_HISTORY`` entries, plus the ones that still decide something (the
  newest, a pending or unrolled-back one, the newest kept entry of each setting and the newest
  blocking entry of each setting in this generation).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from dam_operator.cluster.steps import status as st
from dam_operator.cluster.steps.injection import ActionOverrides
from dam_operator.cluster.steps.registry import PodInfo
from dam_operator.cluster.steps.spec import ActionsSpec, DAMProfileSpec, quantity_value
from dam_operator.diagnosis import climb, levers
from dam_operator.diagnosis.climb import IMPROVED, NO_CHANGE, WORSE, ApplyLever, Channel, Kind
from dam_operator.diagnosis.model import Observation, Verdict
from dam_probe.overrides import OverrideError, loader_override_env

__all__ = [
    "EVENT_OUTCOMES",
    "OUTCOMES",
    "ActionEntry",
    "ActionStep",
    "ResizeRequest",
    "desired_for",
    "desired_label",
    "judge",
    "next_setting",
    "parse_entries",
    "record_resizes",
    "trim",
    "window_actions",
]

Outcome = Literal["pending", "improved", "no-change", "worse", "rolled-back"]

CHANNELS: Final = frozenset({Channel.LOADER, Channel.POD_CPU})
"""What the operator can apply: the probe's DataLoader overrides, the training container's CPU."""

PENDING: Final = "pending"
ROLLED_BACK: Final = "rolled-back"
OUTCOMES: Final = (PENDING, IMPROVED, NO_CHANGE, WORSE, ROLLED_BACK)
KEPT: Final = frozenset({PENDING, IMPROVED})
"""Outcomes whose setting new pods get."""
BLOCKING: Final = frozenset({NO_CHANGE, WORSE, ROLLED_BACK})
"""Outcomes that stop the setting for the rest of the generation."""

APPLIED: Final = "applied"
WITHHELD: Final = "withheld"

MAX_HISTORY: Final = 10
CPU_REACHED: Final = 0.95
"""A pod counts as carrying a CPU raise once its measured CPU limit is this share of the target."""

REASON_PLANNED: Final = "ActionPlanned"
REASON_APPLIED: Final = "ActionApplied"
REASON_IMPROVED: Final = "ActionImproved"
REASON_NO_CHANGE: Final = "ActionNoChange"
REASON_WORSE: Final = "ActionWorse"
REASON_ROLLED_BACK: Final = "ActionRolledBack"
REASON_RESIZE_REFUSED: Final = "ActionResizeRefused"
EVENT_OUTCOMES: Final = {
    REASON_PLANNED: PENDING,
    REASON_IMPROVED: IMPROVED,
    REASON_NO_CHANGE: NO_CHANGE,
    REASON_WORSE: WORSE,
    REASON_ROLLED_BACK: ROLLED_BACK,
}
"""The outcome each Event reports (``dam_operator_actions_total{outcome}``)."""


# ---------------------------------------------------------------- the status entries


class _Wire(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)


def _apply_setting(name: str) -> str:
    if name not in levers.APPLY_SETTINGS:
        raise ValueError(f"unknown setting {name!r} (Apply levers set {', '.join(levers.APPLY_SETTINGS)})")
    return name


def _on_pod_cpu(name: str) -> bool:
    """The setting is the training container's CPU limit (resized in place, measured on the pod)."""
    lever = levers.APPLY_SETTINGS.get(name)
    return lever is not None and lever.channel is Channel.POD_CPU


class Setting(_Wire):
    name: Annotated[str, AfterValidator(_apply_setting)]
    before: Annotated[str, Field(max_length=64)]
    after: Annotated[str, Field(max_length=64)]

    def describe(self) -> str:
        name = "CPU limit" if _on_pod_cpu(self.name) else self.name
        return f"{name} {self.before} → {self.after}"


class Figures(_Wire):
    """Per pod: the mean over the pods measured."""

    steps_per_second: Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
    data_wait_ratio: Annotated[float, Field(ge=0.0, le=1.0)] | None = None

    def describe(self) -> str:
        wait = "" if self.data_wait_ratio is None else f", data wait {self.data_wait_ratio:.0%}"
        return f"{self.steps_per_second:.3g} steps/s{wait}"


MAX_IN_PLACE_PODS_LISTED = 64
"""``inPlace.pods`` names at most this many of the pods resized (the CRD's ``maxItems``: a longer
list would have the API server refuse the whole status write); ``podCount`` counts them all."""


class InPlaceResize(_Wire):
    state: Literal["Resized", "Partial", "Refused"]
    pods: list[str] = Field(default_factory=list)
    """The first ``MAX_IN_PLACE_PODS_LISTED`` pods resized, sorted."""
    pod_count: int | None = None
    """Every pod resized (None: written before the count was, the list is then complete)."""
    message: str | None = None

    def covers(self, pod: str) -> bool:
        """The pod was resized, as far as the record tells: listed, or (a list cut at its cap, no
        pod refused) any pod; the caller keeps to the pods that ran when the resize was sent
        (those without the entry's own labels, which only pods created after it carry)."""
        if pod in self.pods:
            return True
        return self.state == "Resized" and (self.pod_count or 0) > len(self.pods)


class ActionEntry(_Wire):
    """One ``status.actions[]`` entry (crds/damprofile.yaml)."""

    id: Annotated[int, Field(ge=1)]
    lever: Annotated[str, Field(max_length=64)]
    setting: Setting
    generation: int | None = None
    outcome: Outcome = PENDING
    pod: str | None = None
    planned_at: str | None = None
    applied_at: str | None = None
    judged_at: str | None = None
    rolled_back_at: str | None = None
    measured_windows: Annotated[int, Field(ge=0)] = 0
    before: Figures
    after: Figures | None = None
    in_place: InPlaceResize | None = None
    message: str | None = None

    @property
    def applied_label(self) -> str:
        return f"{self.id}:{APPLIED}"

    @property
    def withheld_label(self) -> str:
        return f"{self.id}:{WITHHELD}"

    def title(self) -> str:
        return f"Action {self.id} ({self.setting.describe()})"

    def wire(self) -> dict[str, Any]:
        out: dict[str, Any] = self.model_dump(by_alias=True, exclude_none=True, mode="json")
        return out


def parse_entries(status: Mapping[str, Any] | None) -> list[ActionEntry]:
    """The valid entries of ``status.actions``, by id (an entry that does not parse is dropped)."""
    raw = (status or {}).get("actions")
    out: list[ActionEntry] = []
    for item in raw if isinstance(raw, list) else []:
        try:
            out.append(ActionEntry.model_validate(item))
        except ValidationError:
            continue
    return sorted({e.id: e for e in out}.values(), key=lambda e: e.id)


def desired_label(entries: Sequence[ActionEntry]) -> str | None:
    """The annotation new pods get now: the newest entry, applied when its setting is kept."""
    if not entries:
        return None
    newest = entries[-1]
    return newest.applied_label if newest.outcome in KEPT else newest.withheld_label


def kept_settings(entries: Iterable[ActionEntry]) -> dict[str, str]:
    """Each setting's value new pods get: the newest pending or improved entry of that setting."""
    out: dict[str, str] = {}
    for e in sorted(entries, key=lambda e: e.id):
        if e.outcome in KEPT:
            out[e.setting.name] = e.setting.after
    return out


def cpu_quantity(cores: float) -> str:
    """Cores as a Kubernetes quantity: whole cores as ``4``, else millicores (``1500m``)."""
    return climb.render(Kind.MILLICORES, max(1, round(cores * 1000)))


def desired_for(spec: DAMProfileSpec, status: Mapping[str, Any] | None) -> ActionOverrides | None:
    """What the webhook gives a new pod of the profile; None in mode Recommend or before any action.

    A CPU raise is capped at the current ``maxCpu`` (and dropped when it was unset since).
    """
    if spec.actions.mode == "Recommend":
        return None
    entries = parse_entries(status)
    label = desired_label(entries)
    if label is None:
        return None
    kept = kept_settings(entries)
    loader: dict[str, int | bool] = {}
    cpu = None
    for lever in levers.APPLY.values():
        if lever.setting not in kept:
            continue
        if lever.channel is Channel.LOADER:
            value = climb.parse(lever.kind, kept[lever.setting])
            if value is not None:
                loader[lever.setting] = value
        elif lever.channel is Channel.POD_CPU and spec.actions.max_cpu is not None:
            try:
                cores = min(quantity_value(kept[lever.setting]), quantity_value(spec.actions.max_cpu))
                cpu = cpu_quantity(cores) if cores > 0 else None
            except ValueError:
                cpu = None
    try:
        loader_override_env(loader)
    except OverrideError:
        loader = {}  # a status edited by hand: never let it break the pod's creation
    return ActionOverrides(label=label, loader=loader, cpu=cpu)


# ---------------------------------------------------------------- the window


@dataclass(frozen=True)
class ResizeRequest:
    """Resize the training container of ``pod`` to ``cpu`` in place (mode InPlace)."""

    pod: str
    action_id: int
    cpu: str


@dataclass
class ActionStep:
    actions: list[dict[str, Any]] | None = None
    """The new ``status.actions`` (None: unchanged, leave it out of the patch)."""
    events: list[st.EventSpec] = field(default_factory=list)
    resizes: list[ResizeRequest] = field(default_factory=list)


def figures(observations: Iterable[Observation]) -> Figures | None:
    """Mean per-pod steps/s and data wait of pods that took steps in the window. A window without
    a step (a pod still starting, or whose training ended inside it: seen on the real node, a
    2-core machine under load, the next Pod judged "worse" at 0 steps/s) judges nothing."""
    obs = [o for o in observations if o.steps_per_second]
    if not obs:
        return None
    waits = [o.data_wait_ratio for o in obs if o.data_wait_ratio is not None]
    return Figures(
        steps_per_second=math.fsum(o.steps_per_second or 0.0 for o in obs) / len(obs),
        data_wait_ratio=math.fsum(waits) / len(waits) if waits else None,
    )


def judge(before: Figures, after: Figures, margin: float, lever: str | None = None) -> Outcome:
    """improved / worse / no-change on steps/s, with the noise margin (``lever``'s own judge)."""
    entry = levers.APPLY.get(lever) if lever is not None else None
    judged = entry.judge if entry is not None else climb.judge
    rule = climb.Judging(margin=margin)
    return judged(climb.Rate(before.steps_per_second), climb.Rate(after.steps_per_second), rule).outcome


def _change(before: Figures, after: Figures) -> str:
    ratio = after.steps_per_second / before.steps_per_second - 1.0 if before.steps_per_second else 0.0
    text = f"steps/s {before.steps_per_second:.3g} → {after.steps_per_second:.3g} ({ratio:+.0%})"
    if before.data_wait_ratio is not None and after.data_wait_ratio is not None:
        text += f", data wait {before.data_wait_ratio:.0%} → {after.data_wait_ratio:.0%}"
    return text


def _generation(e: ActionEntry) -> str:
    """The generation a blocked setting stays blocked in, as the messages name it."""
    return f"generation {e.generation}" if e.generation is not None else "this generation"


def _outcome_event(e: ActionEntry, margin: float) -> tuple[str, st.EventSpec]:
    assert e.after is not None
    change = _change(e.before, e.after)
    gen = _generation(e)
    if e.outcome == IMPROVED:
        message = (
            f"{e.title()} improved {change}, beyond the {margin:.0%} noise margin. Kept: new pods get it."
        )
        return message, st.EventSpec(REASON_IMPROVED, message)
    if e.outcome == WORSE:
        message = (
            f"{e.title()} made the job slower: {change}. Rolled back on the next pod created; "
            f"{e.setting.name} is not changed again in {gen}."
        )
        return message, st.EventSpec(REASON_WORSE, message, type="Warning")
    message = (
        f"{e.title()} changed {change}, within the {margin:.0%} noise margin. Not kept: new pods go "
        f"without it; {e.setting.name} is not changed again in {gen}."
    )
    return message, st.EventSpec(REASON_NO_CHANGE, message)


def _reached(e: ActionEntry, obs: Observation) -> bool:
    """A CPU raise counts once the pod's measured CPU limit reached it (a resize may be deferred)."""
    if not _on_pod_cpu(e.setting.name) or obs.cpu_limit_cores is None:
        return True
    try:
        return obs.cpu_limit_cores >= CPU_REACHED * quantity_value(e.setting.after)
    except ValueError:
        return True


def _not_taken(e: ActionEntry, counted: Sequence[Observation]) -> str | None:
    """Why the carriers do not run the setting (their loaders, as the probe reads them, have less
    than it gives: the probe refused the override, or the job ignores it), or None: it took
    effect, or the pods do not report the setting (unknown is not a refusal). The setting itself
    is read, not the worker processes alive (none between epochs without persistent workers).
    Judging steps/s then would credit noise to a change that never happened."""
    lever = levers.APPLY.get(e.lever)
    if lever is None or lever.observe is None or lever.channel is Channel.POD_CPU:
        return None
    seen, wanted = lever.observe(counted), climb.parse(lever.kind, e.setting.after)
    if seen is None or wanted is None or seen >= wanted:
        return None
    return f"its pods run {e.setting.name} {climb.render(lever.kind, seen)}, not {e.setting.after}"


def _progress(
    e: ActionEntry, cfg: ActionsSpec, pods: Sequence[PodInfo], measured: Mapping[str, Observation], now: str
) -> tuple[ActionEntry, list[st.EventSpec]]:
    own = (e.applied_label, e.withheld_label)
    carriers = sorted(
        p.name
        for p in pods
        if p.action == e.applied_label
        or (e.in_place is not None and p.action not in own and e.in_place.covers(p.name))
    )
    events: list[st.EventSpec] = []
    if carriers and e.applied_at is None:
        e = e.model_copy(update={"applied_at": now, "pod": carriers[0]})
        events.append(st.EventSpec(REASON_APPLIED, f"{e.title()} applied to pod {carriers[0]}."))
    counted = [measured[n] for n in carriers if n in measured and _reached(e, measured[n])]
    after = figures(counted)
    if after is None:
        return e, events
    windows = e.measured_windows + 1
    if windows <= cfg.warmup_windows:
        return e.model_copy(update={"measured_windows": windows}), events
    ignored = _not_taken(e, counted)
    if ignored is not None:
        update = {"measured_windows": windows, "after": after, "outcome": NO_CHANGE, "judged_at": now}
        e = e.model_copy(update=update)
        message = (
            f"{e.title()} did not take effect: {ignored}; the probe leaves a loader alone when the "
            "setting cannot work there (e.g. workers over a /dev/shm under 64 MiB; the training "
            f"container's log says why). Not kept; {e.setting.name} is not changed again in "
            f"{_generation(e)}."
        )
        return e.model_copy(update={"message": message}), [*events, st.EventSpec(REASON_NO_CHANGE, message)]
    e = e.model_copy(
        update={
            "measured_windows": windows,
            "after": after,
            "outcome": judge(e.before, after, cfg.noise_margin, e.lever),
            "judged_at": now,
        }
    )
    message, event = _outcome_event(e, cfg.noise_margin)
    return e.model_copy(update={"message": message}), [*events, event]


def _rollback(
    e: ActionEntry, labels: Mapping[str, str | None], measured: Mapping[str, Observation], now: str
) -> tuple[ActionEntry, list[st.EventSpec]]:
    without = sorted(n for n in measured if labels.get(n) == e.withheld_label)
    if not without:
        return e, []
    message = (
        f"{e.title()} rolled back: pod {without[0]} runs without it "
        f"({figures(measured[n] for n in without) or 'no figures'})."
    )
    e = e.model_copy(update={"outcome": ROLLED_BACK, "rolled_back_at": now, "message": message})
    return e, [st.EventSpec(REASON_ROLLED_BACK, message)]


def _current(name: str, label: str | None, entries: Sequence[ActionEntry]) -> bool:
    """The pod runs the settings new pods get now (created with them, or resized in place)."""
    if label == desired_label(entries):
        return True
    newest = entries[-1] if entries else None
    return (
        newest is not None
        and newest.outcome in KEPT
        and newest.in_place is not None
        and newest.in_place.covers(name)
        and label == desired_label(entries[:-1])
    )


def _value_now(lever: ApplyLever, obs: Sequence[Observation], kept: Mapping[str, str]) -> int | None:
    """A setting's current value: what the pods report (a pod resource: only that), else the
    lever's estimate from the pods (the worker processes seen), else the value the status gives
    new pods, else its default, for a setting without an estimate. None: unknown, and then it is
    not climbed."""
    seen = lever.observe(obs) if lever.observe is not None else None
    if seen is None and lever.estimate is not None:
        seen = lever.estimate(obs)
    if seen is not None or lever.channel is Channel.POD_CPU:
        return seen
    if lever.setting in kept:
        return climb.parse(lever.kind, kept[lever.setting])
    return lever.default if lever.estimate is None else None


def _bounds(cfg: ActionsSpec, obs: Sequence[Observation]) -> climb.Bounds:
    limit = climb.cpu_limit_cores(obs)
    ranks = max((o.ranks or 1) for o in obs) if obs else 1
    return climb.Bounds(
        cpus_per_loader=None if limit is None else max(1, math.floor(limit / ranks + 1e-9)),
        max_workers=cfg.max_workers,
        max_prefetch_factor=cfg.max_prefetch_factor,
        max_cpu_millicores=(
            None if cfg.max_cpu is None else math.floor(quantity_value(cfg.max_cpu) * 1000 + 1e-6)
        ),
    )


Step = tuple[str, str, str, str]
"""(lever, setting, before, after)."""


def next_setting(
    lever: str,
    cfg: ActionsSpec,
    entries: Sequence[ActionEntry],
    generation: int | None,
    obs: Sequence[Observation],
) -> Step | None:
    """The next change for ``lever`` (its own setting, then each lever its climb hands on to),
    or None when there is nothing (left) to try. A setting whose change was not kept in this
    generation is not climbed again."""
    kept = kept_settings(entries)
    blocked = {e.setting.name for e in entries if e.generation == generation and e.outcome in BLOCKING}
    values = {a.setting: _value_now(a, obs, kept) for a in levers.APPLY.values()}
    facts = climb.Facts(values, gpus=max((o.gpu_count or 0 for o in obs), default=0))
    bounds = _bounds(cfg, obs)
    for entry in levers.chain(lever, CHANNELS):
        current = values[entry.setting]
        if entry.setting in blocked or current is None or not entry.needs(facts):
            continue
        nxt = climb.next_value(entry, current, entry.bound(bounds))
        if nxt is not None:
            return entry.id, entry.setting, climb.render(entry.kind, current), climb.render(entry.kind, nxt)
    return None


def _plan(
    *,
    spec: DAMProfileSpec,
    entries: Sequence[ActionEntry],
    generation: int | None,
    measured: Mapping[str, Observation],
    labels: Mapping[str, str | None],
    verdict: Verdict | None,
    now: str,
) -> tuple[ActionEntry, st.EventSpec] | None:
    cfg = spec.actions
    if verdict is None or not spec.sidecar.inject or not measured:
        return None
    b = verdict.bottleneck
    if levers.applicable(b.lever, b.regime, CHANNELS) is None or b.confidence < cfg.min_confidence:
        return None
    if any(e.outcome in (PENDING, WORSE) for e in entries):
        return None  # one at a time; a worse change is rolled back first
    if not all(_current(n, labels.get(n), entries) for n in measured):
        return None  # some pods run older settings: their figures are not the baseline
    before = figures(measured.values())
    if before is None or before.steps_per_second <= 0:
        return None
    step = next_setting(b.lever, cfg, entries, generation, list(measured.values()))
    if step is None:
        return None
    lever, name, old, new = step
    entry = ActionEntry(
        id=max((e.id for e in entries), default=0) + 1,
        lever=lever,
        setting=Setting(name=name, before=old, after=new),
        generation=generation,
        planned_at=now,
        before=before,
    )
    how = (
        "the running pods are resized now, and new pods of the job get it"
        if cfg.mode == "InPlace" and _on_pod_cpu(name)
        else "the next pod created for the job gets it (restart the job to apply it now)"
    )
    message = (
        f"{entry.title()} planned: verdict {b.regime.value} at confidence {b.confidence:.2f}, "
        f"lever {lever}; before: {before.describe()} per pod; {how}."
    )
    entry = entry.model_copy(update={"message": message})
    return entry, st.EventSpec(REASON_PLANNED, message)


def trim(entries: Sequence[ActionEntry], generation: int | None) -> list[ActionEntry]:
    """At most ``MAX_HISTORY`` entries plus those that still decide something (see the module doc)."""
    ordered = sorted(entries, key=lambda e: e.id)
    if len(ordered) <= MAX_HISTORY:
        return ordered
    protected = {ordered[-1].id}
    protected |= {e.id for e in ordered if e.outcome in (PENDING, WORSE)}
    newest_kept: dict[str, int] = {}
    newest_block: dict[str, int] = {}
    for e in ordered:
        if e.outcome in KEPT:
            newest_kept[e.setting.name] = e.id
        if e.outcome in BLOCKING and e.generation == generation:
            newest_block[e.setting.name] = e.id
    protected |= set(newest_kept.values()) | set(newest_block.values())
    rest = [e for e in ordered if e.id not in protected]
    room = max(0, MAX_HISTORY - len(protected))
    keep = protected | {e.id for e in rest[len(rest) - room :]} if room else protected
    return [e for e in ordered if e.id in keep]


def window_actions(
    *,
    spec: DAMProfileSpec,
    status: Mapping[str, Any],
    generation: int | None,
    pods: Sequence[PodInfo],
    per_pod: Mapping[str, Observation],
    verdict: Verdict | None,
    when: dt.datetime,
) -> ActionStep:
    """One window of the loop: progress and judge the pending action, see a rollback through,
    maybe plan the next action. Nothing at all in mode Recommend."""
    cfg = spec.actions
    if cfg.mode == "Recommend":
        return ActionStep()
    now = st.format_time(when)
    entries = parse_entries(status)
    measured = {n: o for n, o in per_pod.items() if o.steps_per_second is not None}
    labels = {p.name: p.action for p in pods}
    events: list[st.EventSpec] = []
    for i, e in enumerate(entries):
        if e.outcome == PENDING:
            entries[i], more = _progress(e, cfg, pods, measured, now)
        elif e.outcome == WORSE:
            entries[i], more = _rollback(e, labels, measured, now)
        else:
            continue
        events.extend(more)
    resizes: list[ResizeRequest] = []
    planned = _plan(
        spec=spec,
        entries=entries,
        generation=generation,
        measured=measured,
        labels=labels,
        verdict=verdict,
        now=now,
    )
    if planned is not None:
        entry, event = planned
        entries.append(entry)
        events.append(event)
        if cfg.mode == "InPlace" and _on_pod_cpu(entry.setting.name):
            resizes = [ResizeRequest(n, entry.id, entry.setting.after) for n in sorted(measured)]
    new = [e.wire() for e in trim(entries, generation)]
    old = status.get("actions")
    unchanged = new == old or (not new and not old)
    return ActionStep(actions=None if unchanged else new, events=events, resizes=resizes)


def record_resizes(
    actions: Sequence[Mapping[str, Any]],
    action_id: int,
    resized: Sequence[str],
    refused: Mapping[str, str],
    now: str,
) -> tuple[list[dict[str, Any]], list[st.EventSpec]]:
    """The actions list with the outcome of the in-place resizes of ``action_id`` recorded (never
    retried: a refused resize leaves the action to the next pod created), and the Events."""
    entries = parse_entries({"actions": list(actions)})
    events: list[st.EventSpec] = []
    out: list[dict[str, Any]] = []
    for e in entries:
        if e.id == action_id:
            state: Literal["Resized", "Partial", "Refused"] = (
                "Refused" if not resized else ("Partial" if refused else "Resized")
            )
            first = next(iter(sorted(refused.items())), None)
            update: dict[str, Any] = {
                "in_place": InPlaceResize(
                    state=state,
                    pods=sorted(resized)[:MAX_IN_PLACE_PODS_LISTED],
                    pod_count=len(resized),
                    message=None if first is None else f"{first[0]}: {first[1]}"[:1024],
                )
            }
            if resized and e.applied_at is None:
                update.update(applied_at=now, pod=sorted(resized)[0])
                events.append(
                    st.EventSpec(REASON_APPLIED, f"{e.title()} applied in place to pod {sorted(resized)[0]}.")
                )
            if first is not None:
                events.append(
                    st.EventSpec(
                        REASON_RESIZE_REFUSED,
                        f"{e.title()}: the API server refused to resize pod {first[0]} in place "
                        f"({first[1][:300]}); the next pod created for the job gets it instead. "
                        "Not retried.",
                        type="Warning",
                    )
                )
            out.append(e.model_copy(update=update).wire())
        else:
            out.append(e.wire())
    return out, events
