"""The snapshots of one local run and the verdicts drawn from them (pure apart from its own state).

``LocalSession`` is shared by ``dam run`` (live and final verdicts) and ``dam tune``
(one measurement per trial). It never reads a clock or a file: the caller adds
``(seconds since start, snapshot)`` pairs.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from dam_operator.diagnosis.engine import diagnose
from dam_operator.diagnosis.hysteresis import Stabilizer
from dam_operator.diagnosis.model import Hardware, RankFigures, Thresholds, Verdict
from dam_operator.diagnosis.ranks import rank_figures
from dam_operator.diagnosis.window import PodWindow, job_window, observation_from_snapshots
from dam_sidecar import names
from dam_sidecar.promtext import Snapshot

MAX_ANCHORS = 256
"""Snapshots kept since the first batch for the final verdict (thinned by half when full)."""

WARMUP_FRACTION = 0.2
"""The final verdict skips this share of the run (at most one window): worker start-up, autotuning."""

MAX_LISTED_RANKS = 64
"""``dam run --json`` lists at most this many ranks (the worst ones, in rank order)."""

Timed = tuple[float, Snapshot]


def steps_of(snap: Snapshot) -> float:
    """Training steps counted in a snapshot (every process and rank together)."""
    return sum(s.value for s in snap.samples(names.STEPS_TOTAL))


def progress_steps(snap: Snapshot) -> float:
    """Steps of the furthest process: a job's training steps, each rank counting its own."""
    return max((s.value for s in snap.samples(names.STEPS_TOTAL)), default=0.0)


def verdict_between(
    before: Snapshot,
    after: Snapshot,
    elapsed_seconds: float | None,
    thresholds: Thresholds | None = None,
    hardware: Hardware | None = None,
) -> Verdict:
    """The raw verdict (no hysteresis) of the window between two snapshots of one local job.

    A job of several ranks (``torchrun``: one probe file per rank, per-rank series) is judged
    as one job — the job's observation plus each rank's, so the verdict names a straggler
    (``bottleneck.straggler``) and lists the ranks (``metrics.ranks``); a single process is
    judged from its own observation.
    """
    jw = job_window({"": PodWindow(before, after, elapsed_seconds=elapsed_seconds)})
    if len(jw.ranks) > 1:
        return diagnose(jw.job, thresholds, hardware, ranks=jw.ranks)
    obs = observation_from_snapshots(before, after, elapsed_seconds=elapsed_seconds)
    return diagnose(obs, thresholds, hardware)


@dataclass
class LocalSession:
    """Keeps the snapshots of one run and turns them into verdicts.

    Memory is bounded for a month-long run: the rolling window holds the snapshots of one
    window, and at most ``MAX_ANCHORS`` thinned snapshots since the first batch are kept for
    the final verdict.
    """

    window_seconds: float
    thresholds: Thresholds = field(default_factory=Thresholds)
    hardware: Hardware | None = None
    now: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    history: deque[Timed] = field(default_factory=deque)
    anchors: list[Timed] = field(default_factory=list)
    first: Timed | None = None
    baseline: Timed | None = None
    stabilizer: Stabilizer = field(default_factory=Stabilizer)

    def add(self, t: float, snap: Snapshot) -> None:
        if self.first is None:
            self.first = (t, snap)
        self.history.append((t, snap))
        # The final verdict starts at the first batch: interpreter start-up and imports are
        # not part of the training loop. The last snapshot before it is kept as a baseline.
        trained = self.anchors or steps_of(snap) > 0
        if not trained:
            self.baseline = (t, snap)
        else:
            self.anchors.append((t, snap))
            if len(self.anchors) > MAX_ANCHORS:
                self.anchors = self.anchors[::2]
        # Keep one snapshot older than the window so that a full window is always available.
        while len(self.history) > 2 and self.history[1][0] <= t - self.window_seconds:
            self.history.popleft()

    # -- progress ---------------------------------------------------------------------------

    @property
    def steps(self) -> float:
        """Training steps so far (the latest snapshot; a job's ranks each count their own)."""
        return progress_steps(self.history[-1][1]) if self.history else 0.0

    @property
    def first_step_time(self) -> float | None:
        """When the first snapshot that shows a step was taken (None before any step)."""
        return self.anchors[0][0] if self.anchors else None

    def warming_up(self) -> bool:
        """True until one full window has passed since the first step.

        Before that a window verdict would mix interpreter start-up, imports and worker
        start-up into the figures, so ``dam run`` shows progress instead of a verdict.
        """
        first = self.first_step_time
        return first is None or not self.history or self.history[-1][0] - first < self.window_seconds

    # -- verdicts ---------------------------------------------------------------------------

    def verdict_of(self, before: Timed, after: Timed) -> Verdict:
        """The raw verdict (no hysteresis) of the window between two snapshots."""
        elapsed = max(after[0] - before[0], 0.0)
        return verdict_between(before[1], after[1], elapsed or None, self.thresholds, self.hardware)

    def window_verdict(self) -> Verdict | None:
        """The stabilised verdict of the latest window (None until two snapshots exist)."""
        if len(self.history) < 2:
            return None
        raw = self.verdict_of(self.history[0], self.history[-1])
        return self.stabilizer.update(raw, self.now())

    def final_span(self) -> tuple[Timed, Timed] | None:
        """The (start, end) snapshots of the final verdict; None when there is no span.

        From the first batch to the last snapshot, with the warm-up skipped: the warm-up is
        ``WARMUP_FRACTION`` of the run since the first batch, at most one window (DataLoader
        workers starting, cudnn autotuning and compilation belong to no steady state).
        """
        if not self.history or self.first is None:
            return None
        last = self.history[-1]
        start = self.first
        if self.anchors:
            first_t = self.anchors[0][0]
            warmup = min(self.window_seconds, WARMUP_FRACTION * (last[0] - first_t))
            start = next((a for a in self.anchors if a[0] >= first_t + warmup), self.anchors[0])
            if start[0] >= last[0]:
                start = self.anchors[0]
        if start[0] >= last[0] or steps_of(start[1]) >= steps_of(last[1]):
            # A run that trained within about one sampling interval: every batch happened
            # before the first snapshot that shows one. The probe's counters start at zero
            # with the process, so the last snapshot before any batch is an exact baseline.
            start = self.baseline or self.first
        if start[0] >= last[0]:
            return None
        return start, last

    def final_verdict(self) -> Verdict:
        """The verdict over the run from the first batch to the last snapshot, warm-up skipped."""
        span = self.final_span()
        if span is None:
            return self.verdict_from_nothing()
        return self.verdict_of(*span)

    def final_ranks(self, limit: int = MAX_LISTED_RANKS) -> list[RankFigures]:
        """Each rank's figures over the final verdict's span, in rank order (empty for one process).

        At most ``limit`` ranks: the worst ones (latest at the collectives, most data wait).
        """
        span = self.final_span()
        if span is None:
            return []
        (t0, before), (t1, after) = span
        ranks = job_window({"": PodWindow(before, after, elapsed_seconds=(t1 - t0) or None)}).ranks
        if len(ranks) < 2:
            return []
        figures = rank_figures(ranks, limit=limit)
        return sorted(figures, key=lambda f: -1 if f.rank is None else f.rank)

    def verdict_from_nothing(self) -> Verdict:
        empty = Snapshot([])
        return diagnose(
            observation_from_snapshots(empty, empty, elapsed_seconds=None), self.thresholds, self.hardware
        )
