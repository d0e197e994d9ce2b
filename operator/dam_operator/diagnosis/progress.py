"""Whether a job makes progress, and when it does not, which rank holds it and where (pure).

Numbers in, answer out: each rank's latest probe figures (``RankPlace``: its steps, when it took
its latest batch, the collectives it entered, and where its watchdog found its training thread once
a step was overdue, ``dam_probe._watchdog``), the time now and the two settings
(``StallSettings``: the floor, ``spec.evaluation.stallAfterSeconds`` / ``dam run --stall-after``,
and the multiple of the median step, ``stallStepMultiple``). The answer is ``status.progress``'s
shape (``Progress``).

- ``NotStarted``: no rank finished a step (it took at most one batch: the first step may compile
  for minutes, a warm-up is no stall).
- ``Stalled``: no rank took a batch for ``StallSettings.after_seconds(median step)``, while at
  least one still runs. A synchronous job advances at its slowest rank's pace, so the job's latest
  batch is the latest of any rank.
- ``Progressing`` otherwise.

The culprit of a stall lines up the ranks' collective sequence numbers (the wavefront): the ranks
waiting inside a collective wait for #N, the highest number any rank entered; a rank that entered
fewer never reached #N and holds the others (its place and frames say where it is instead). With
no rank inside a collective, the rank whose watchdog read a place is the culprit (one process: the
job itself). A rank whose process ended while the others wait is the culprit, ``exited``.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal, get_args

from pydantic import Field

from dam_operator.diagnosis.hysteresis import rfc3339
from dam_operator.diagnosis.model import _Wire

ProgressState = Literal["NotStarted", "Progressing", "Stalled"]
Where = Literal["collective", "dataloader", "checkpoint", "backward", "optimizer", "user-code", "exited"]
WHERE_VALUES: tuple[str, ...] = get_args(Where)

STALL_AFTER_SECONDS_DEFAULT = 300.0
"""The floor: no batch for five minutes (PyTorch aborts a collective after 10 with NCCL, 30 with gloo)."""
STALL_STEP_MULTIPLE_DEFAULT = 10.0
"""... and at least ten median steps: a job of 60 s steps is stalled after 10 minutes."""


@dataclass(frozen=True)
class StallSettings:
    after_seconds: float = STALL_AFTER_SECONDS_DEFAULT
    step_multiple: float = STALL_STEP_MULTIPLE_DEFAULT

    def threshold_seconds(self, median_step_seconds: float | None) -> float:
        """No batch for this long is a stall: the floor, or the multiple of the median step."""
        return max(self.after_seconds, self.step_multiple * (median_step_seconds or 0.0))


@dataclass(frozen=True)
class RankPlace:
    """One process's latest figures, as its probe published them."""

    pod: str
    rank: int | None
    steps: int
    step_seconds: float
    """Time covered by its steps so far (the mean step is this over ``steps``)."""
    last_batch_ns: int
    """Unix ns of its latest batch (0: none yet)."""
    running: bool
    """Its process still runs (False: it ended, cleanly or not)."""
    entered: int = 0
    """Timed collectives its training thread entered: the number of the latest."""
    place: str | None = None
    """Where its watchdog read its training thread (``WHERE_VALUES`` less ``exited``); None: not read."""
    detail: str = ""
    frames: tuple[str, ...] = field(default_factory=tuple)


class Culprit(_Wire):
    pod: str | None = None
    rank: int | None = None
    where: Where
    detail: str | None = None
    frames: list[str] = Field(default_factory=list)


class Waiting(_Wire):
    ranks: int = Field(ge=0)
    where: Where
    detail: str | None = None


class Progress(_Wire):
    """``status.progress`` (DESIGN.md §3); ``since`` is kept by the caller across evaluations."""

    state: ProgressState
    since: str | None = None
    last_step_time: str | None = None
    stalled_seconds: float | None = Field(default=None, ge=0)
    culprit: Culprit | None = None
    waiting: Waiting | None = None

    def describe(self) -> str:
        """One line: ``stalled 42 s: rank 1 in user-code (train.py:23 main); 1 rank waiting in
        collective all_reduce #5``."""
        if self.state != "Stalled":
            return self.state
        text = f"stalled {self.stalled_seconds or 0:.0f} s"
        c = self.culprit
        if c is not None:
            who = f"rank {c.rank}" if c.rank is not None else (f"pod {c.pod}" if c.pod else "the process")
            text += f": {who} in {c.where}"
            if c.detail:
                text += f" {c.detail}"
            if c.frames:
                text += f" ({c.frames[0]})"
        w = self.waiting
        if w is not None and w.ranks:
            text += f"; {w.ranks} rank{'s' if w.ranks != 1 else ''} waiting in {w.where}"
            if w.detail:
                text += f" {w.detail}"
        return text


def rfc3339_ns(unix_ns: int) -> str:
    return rfc3339(datetime.fromtimestamp(unix_ns / 1e9, UTC))


def median_step_seconds(ranks: Sequence[RankPlace]) -> float | None:
    """The median over ranks of each rank's mean step; None before any finished a step."""
    means = [r.step_seconds / (r.steps - 1) for r in ranks if r.steps > 1 and r.step_seconds > 0]
    return statistics.median(means) if means else None


def _culprit(ranks: Sequence[RankPlace]) -> tuple[Culprit | None, Waiting | None]:
    """The wavefront (see the module docstring): who holds the others, and who waits in what."""
    inside = [r for r in ranks if r.running and r.place == "collective"]
    front = max((r.entered for r in inside), default=0)
    at_front = [r for r in inside if r.entered == front]
    waiting = None
    if inside:
        waiting = Waiting(ranks=len(at_front), where="collective", detail=at_front[0].detail or None)
    exited = [r for r in ranks if not r.running]
    if exited:
        gone = min(exited, key=_order)
        return Culprit(pod=gone.pod or None, rank=gone.rank, where="exited"), waiting
    front_ids = {id(r) for r in at_front}  # by identity: a list's ``in`` made this O(ranks²)
    behind = [r for r in ranks if r.running and r.place is not None and id(r) not in front_ids]
    if not behind:
        return None, waiting  # every rank read waits at the same collective (or none was read yet)
    first = min(behind, key=lambda r: (r.entered, *_order(r)))
    where: Where = first.place if first.place in WHERE_VALUES else "user-code"  # type: ignore[assignment]
    culprit = Culprit(
        pod=first.pod or None,
        rank=first.rank,
        where=where,
        detail=first.detail or None,
        frames=list(first.frames),
    )
    return culprit, waiting


def _order(r: RankPlace) -> tuple[bool, int, str]:
    return (r.rank is None, r.rank or 0, r.pod)


def judge(ranks: Sequence[RankPlace], now_ns: int, settings: StallSettings) -> Progress:
    """The job's progress now (``since`` left to the caller: ``Tracker``)."""
    started = [r for r in ranks if r.steps > 1]
    if not started:
        return Progress(state="NotStarted")
    last_ns = max(r.last_batch_ns for r in ranks)
    idle_seconds = max(0.0, (now_ns - last_ns) / 1e9)
    threshold = settings.threshold_seconds(median_step_seconds(ranks))
    if idle_seconds < threshold or not any(r.running for r in ranks):
        return Progress(state="Progressing", last_step_time=rfc3339_ns(last_ns))
    culprit, waiting = _culprit(ranks)
    return Progress(
        state="Stalled",
        since=rfc3339_ns(last_ns),
        last_step_time=rfc3339_ns(last_ns),
        stalled_seconds=round(idle_seconds, 1),
        culprit=culprit,
        waiting=waiting,
    )


@dataclass
class Tracker:
    """``since`` across evaluations: when the state last changed (a stall's is its last step)."""

    state: str | None = None
    since: str | None = None
    previous: str | None = None

    def update(self, progress: Progress, now_iso: str) -> tuple[Progress, bool]:
        """The progress with ``since`` filled in, and whether the state changed."""
        changed = progress.state != self.state
        if changed:
            self.previous, self.state = self.state, progress.state
            self.since = progress.since or now_iso
        return progress.model_copy(update={"since": self.since}), changed
