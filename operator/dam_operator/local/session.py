"""The snapshots of one local run and the verdicts drawn from them (pure apart from its own state).

``LocalSession`` is shared by ``dam run`` (live and final verdicts) and ``dam tune``
(one measurement per trial). It never reads a clock or a file: the caller adds
``(seconds since start, snapshot)`` pairs.

An OOM kill is decisive evidence wherever it happens in the run: the final verdict's
window always contains it (``final_span``), and its memory figures are the peaks seen
during the run (``with_memory_peaks``): the processes that held the memory are gone by
the last snapshot.

Every verdict's loader worker count is the most workers any snapshot of its window saw
(``with_peaks`` over ``dam_processes``): the last snapshot of a run is taken after the
command exited, when its workers are gone.

Slow steps: a live window that holds fewer than ``min_steps`` steps grows back over earlier
snapshots until it holds them, up to ``MAX_WINDOW_GROWTH`` windows and never before the first
step (``window_start``), so a job at 0.2 steps/s gets a verdict instead of "only 2 steps".
"""

from __future__ import annotations

import itertools
import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from dam_contract import names
from dam_contract.snapshot import Labels, Sample, Snapshot
from dam_operator.diagnosis.engine import diagnose
from dam_operator.diagnosis.hysteresis import Stabilizer
from dam_operator.diagnosis.model import Hardware, RankFigures, Thresholds, Verdict
from dam_operator.diagnosis.ranks import rank_figures
from dam_operator.diagnosis.rules.memory import MAIN_KILLED_EXIT_CODE
from dam_operator.diagnosis.window import (
    PodWindow,
    counter_increase,
    job_window,
    observation_from_snapshots,
)

MAX_ANCHORS = 256
"""Snapshots kept since the first batch for the final verdict (thinned by half when full)."""

WARMUP_FRACTION = 0.2
"""The final verdict skips this share of the run (at most one window): worker start-up, autotuning."""

MAX_WINDOW_GROWTH = 6
"""A live window with too few steps grows back to at most this many windows (10 s → 60 s)."""

MAX_HISTORY = 4096
"""Snapshots kept for the live window at most (a short interval with a long window)."""

MAX_LISTED_RANKS = 64
"""``dam run --json`` lists at most this many ranks (the worst ones, in rank order)."""

PEAK_SERIES: frozenset[str] = frozenset(
    {names.PROCESS_RESIDENT_MEMORY_BYTES, names.PROCESSES, names.CONTAINER_MEMORY_USAGE_BYTES}
)
"""Gauges whose highest value in the run the final verdict of an OOM-killed run reports."""

Timed = tuple[float, Snapshot]
Peaks = dict[tuple[str, Labels], float]


def steps_of(snap: Snapshot) -> float:
    """Training steps counted in a snapshot (every process and rank together)."""
    return sum(s.value for s in snap.samples(names.STEPS_TOTAL))


def job_steps_of(snap: Snapshot) -> float:
    """Steps the job advanced: for ranks of one distributed job the median rank's (synchronous
    ranks step together: summing would count each step once per rank, the signal table's job
    rate does the same), else every process together."""
    per_rank: dict[str, float] = {}
    unranked = 0.0
    for s in snap.samples(names.STEPS_TOTAL):
        rank = s.label(names.RANK_LABEL)
        if rank:
            per_rank[rank] = per_rank.get(rank, 0.0) + s.value
        else:
            unranked += s.value
    if len(per_rank) < 2:
        return unranked + sum(per_rank.values())
    return statistics.median(per_rank.values())


def _work_of(snap: Snapshot) -> tuple[float, float, float]:
    """Steps, collectives and checkpoint saves counted in a snapshot (every process together)."""
    return (
        steps_of(snap),
        sum(s.value for s in snap.samples(names.COLLECTIVES_TOTAL)),
        sum(s.value for s in snap.samples(names.CHECKPOINTS_TOTAL)),
    )


def progress_steps(snap: Snapshot) -> float:
    """Steps of the furthest process: a job's training steps, each rank counting its own."""
    return max((s.value for s in snap.samples(names.STEPS_TOTAL)), default=0.0)


def oom_kills_between(before: Snapshot, after: Snapshot) -> float:
    """OOM kills the memory cgroup counted between two snapshots (0 when not measured)."""
    return counter_increase(before, after, names.CONTAINER_OOM_KILLS_TOTAL) or 0.0


def update_peaks(peaks: Peaks, snap: Snapshot) -> None:
    """Raises each ``PEAK_SERIES`` gauge's recorded peak to its value in ``snap``."""
    for name in PEAK_SERIES:
        for s in snap.samples(name):
            key = (name, s.labels)
            if s.value == s.value and s.value > peaks.get(key, float("-inf")):  # NaN never
                peaks[key] = s.value


def with_peaks(snap: Snapshot, peaks: Peaks, series: frozenset[str]) -> Snapshot:
    """``snap`` with the ``series`` gauges replaced by their ``peaks`` where these are higher."""
    chosen = {key: v for key, v in peaks.items() if key[0] in series}
    if not chosen:
        return snap
    samples = [
        s
        for name in sorted(snap.names())
        for s in snap.samples(name)
        if (name, s.labels) not in chosen or not chosen[(name, s.labels)] > s.value
    ]
    for (name, labels), value in sorted(chosen.items()):
        current = next((s.value for s in snap.samples(name) if s.labels == labels), None)
        if current is None or value > current:
            samples.append(Sample(name, labels, value))
    return Snapshot(samples, snap.timestamp_seconds)


def peaks_of(snaps: list[Timed], series: frozenset[str]) -> Peaks:
    """The highest value of each ``series`` gauge over ``snaps``."""
    peaks: Peaks = {}
    for _, snap in snaps:
        for name in series:
            for s in snap.samples(name):
                key = (name, s.labels)
                if s.value == s.value and s.value > peaks.get(key, float("-inf")):  # NaN never
                    peaks[key] = s.value
    return peaks


WINDOW_PEAK_SERIES: frozenset[str] = frozenset({names.PROCESSES})
"""Gauges a verdict reads as the most its window saw, not their value at its end."""


def with_memory_peaks(snap: Snapshot, peaks: Peaks) -> Snapshot:
    """``snap`` with the ``PEAK_SERIES`` gauges replaced by their peaks in the run.

    For an OOM-killed run: by the last snapshot the killed process and the training process
    it took down are gone (no resident memory, no loader workers, the cgroup nearly empty),
    but which process held the memory is what the verdict needs.
    """
    if not peaks:
        return snap
    samples = [s for name in sorted(snap.names() - PEAK_SERIES) for s in snap.samples(name)]
    samples += [Sample(name, labels, value) for (name, labels), value in sorted(peaks.items())]
    return Snapshot(samples, snap.timestamp_seconds)


def verdict_between(
    before: Snapshot,
    after: Snapshot,
    elapsed_seconds: float | None,
    thresholds: Thresholds | None = None,
    hardware: Hardware | None = None,
    *,
    oom_killed: bool | None = None,
    starting: bool | None = None,
) -> Verdict:
    """The raw verdict (no hysteresis) of the window between two snapshots of one local job.

    A job of several ranks (``torchrun``: one probe file per rank, per-rank series) is judged
    as one job — the job's observation plus each rank's, so the verdict names a straggler
    (``bottleneck.straggler``) and lists the ranks (``metrics.ranks``); a single process is
    judged from its own observation. ``oom_killed``: the command itself was OOM-killed.
    ``starting``: ``Observation.starting`` (False for the final verdict: the command has ended).
    """
    # dam run calls a command OOM-killed only when it died of SIGKILL itself (local.memory): 137.
    code = MAIN_KILLED_EXIT_CODE if oom_killed else None
    window = PodWindow(
        before,
        after,
        elapsed_seconds=elapsed_seconds,
        oom_killed=oom_killed,
        starting=starting,
        oom_exit_code=code,
    )
    jw = job_window({"": window})
    if len(jw.ranks) > 1:
        return diagnose(jw.job, thresholds, hardware, ranks=jw.ranks)
    obs = observation_from_snapshots(
        before,
        after,
        elapsed_seconds=elapsed_seconds,
        oom_killed=oom_killed,
        starting=starting,
        oom_exit_code=code,
    )
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
    peaks: Peaks = field(default_factory=dict)
    """The highest value of each ``PEAK_SERIES`` gauge in the run (for an OOM-killed run)."""

    def add(self, t: float, snap: Snapshot) -> None:
        if self.first is None:
            self.first = (t, snap)
        self.history.append((t, snap))
        update_peaks(self.peaks, snap)
        # The final verdict starts at the first batch: interpreter start-up and imports are
        # not part of the training loop. The last snapshot before it is kept as a baseline.
        trained = self.anchors or steps_of(snap) > 0
        if not trained:
            self.baseline = (t, snap)
        else:
            self.anchors.append((t, snap))
            if len(self.anchors) > MAX_ANCHORS:
                self.anchors = self.anchors[::2]
        # Keep one snapshot older than the longest window (a window grows for slow steps, see
        # ``window_start``) so that a full window is always available.
        horizon = t - self.window_seconds * MAX_WINDOW_GROWTH
        while len(self.history) > 2 and (self.history[1][0] <= horizon or len(self.history) > MAX_HISTORY):
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
        """True until one full window has passed since the first step (and ``min_steps`` were made).

        Before that a window verdict would mix interpreter start-up, imports and worker
        start-up into the figures, so ``dam run`` shows progress instead of a verdict.
        """
        first = self.first_step_time
        if first is None or not self.history or self.history[-1][0] - first < self.window_seconds:
            return True
        # Slow steps: not before the run holds the fewest steps a verdict needs (the window grows).
        return self.steps < self.thresholds.min_steps

    # -- verdicts ---------------------------------------------------------------------------

    def verdict_of(
        self, before: Timed, after: Timed, oom_killed: bool | None = None, *, starting: bool | None = None
    ) -> Verdict:
        """The raw verdict (no hysteresis) of the window between two snapshots.

        The window's worker count is the most any kept snapshot in it saw (``WINDOW_PEAK_SERIES``).
        """
        elapsed = max(after[0] - before[0], 0.0)
        inside = [x for x in (*self._kept(after), *self.history) if before[0] <= x[0] <= after[0]]
        snap = with_peaks(after[1], peaks_of(inside, WINDOW_PEAK_SERIES), WINDOW_PEAK_SERIES)
        return verdict_between(
            before[1],
            snap,
            elapsed or None,
            self.thresholds,
            self.hardware,
            oom_killed=oom_killed,
            starting=starting,
        )

    def window_start(self) -> Timed:
        """The start of the live window ending at the latest snapshot.

        One window back, or further back when that holds fewer than ``thresholds.min_steps``
        steps (of the furthest rank): the window grows over earlier snapshots until it holds
        them, up to ``MAX_WINDOW_GROWTH`` windows, and never starts before the last snapshot
        without a step (start-up is not part of the training loop).
        """
        last = self.history[-1]
        earlier = list(self.history)[:-1]
        floor = self.baseline[0] if self.baseline is not None else float("-inf")
        start = next((x for x in reversed(earlier) if x[0] <= last[0] - self.window_seconds), earlier[0])
        need = self.thresholds.min_steps
        done = progress_steps(last[1])
        if done - progress_steps(start[1]) >= need:
            return start
        for item in reversed(earlier):
            if item[0] >= start[0]:
                continue
            if item[0] < floor:
                break
            start = item
            if done - progress_steps(item[1]) >= need:
                break
        return start

    def window_verdict(self) -> Verdict | None:
        """The stabilised verdict of the latest window (None until two snapshots exist)."""
        if len(self.history) < 2:
            return None
        raw = self.verdict_of(self.window_start(), self.history[-1])
        return self.stabilizer.update(raw, self.now())

    def final_span(self, completed: bool = False) -> tuple[Timed, Timed] | None:
        """The (start, end) snapshots of the final verdict; None when there is no span.

        From the first batch to the last snapshot (or the first that shows the run's last work:
        ``_without_tail``; ``completed``: the command exited 0 by itself), with the warm-up
        skipped: the warm-up is ``WARMUP_FRACTION`` of the run from the first batch to the
        span's end, at most one window (DataLoader workers starting, cudnn autotuning and
        compilation belong to no steady state).

        An OOM kill anywhere in the run is decisive: when that span misses the run's first
        kill (in the warm-up, before the first batch, or a run without a batch), the span
        starts at the last kept snapshot before the kill instead.
        """
        if not self.history or self.first is None:
            return None
        last = self.history[-1]
        span = self._steady_span(last)
        if span is None or oom_kills_between(span[0][1], span[1][1]) <= 0:
            before_kill = self._before_first_oom_kill(last)
            if before_kill is not None:
                return before_kill, last
        if span is None:
            return None
        start, end = self._without_tail(*span, completed=completed)
        if end is not last:  # the warm-up is a fraction of the training: to its last step
            start = (self._steady_span(end) or (start, end))[0]
        return start, end

    def _without_tail(self, start: Timed, last: Timed, *, completed: bool = False) -> tuple[Timed, Timed]:
        """The span ended at the first snapshot that shows the run's last step (and the
        collectives and checkpoint saves counted by the end: a last save and its barrier stay in).

        The last snapshot is taken after the command exited; between its last step and then
        the interpreter, gloo and torchrun tear down (3 s for two gloo ranks under torchrun),
        and a job may save a last checkpoint: no training, yet a span that held it divided the
        steps and the CPU seconds by it (two ranks at 18.8 steps/s reported 14.7; a 12 s tail
        after a 10.8 steps/s job's last step gave half its MFU). Kept when that tail holds an
        OOM kill or a killed loader worker (decisive, and seen only after the last step), or,
        in a command that did not complete (``completed`` False: it failed, was stopped as
        stalled or interrupted), is longer than a window: a job that stopped making progress
        for that long (a hang) belongs in its verdict. A command that exited 0 by itself
        finished its steps: whatever it did after the last one (a final save, an evaluation,
        the teardown) is not its training loop's rate.
        """
        final = _work_of(last[1])
        if final[0] <= steps_of(start[1]):
            return start, last
        inside = sorted(
            {id(x): x for x in (*self._kept(last), *self.history) if start[0] < x[0] < last[0]}.values(),
            key=lambda x: x[0],
        )
        # The run's last work: its last step and the saves and collectives that came with it (a
        # save after the last step, the barrier its peers wait for it in, are the job's).
        done = (x for x in inside if all(a >= b for a, b in zip(_work_of(x[1]), final, strict=True)))
        end = next(done, last)
        if end is last or (not completed and last[0] - end[0] > self.window_seconds):
            return start, last
        killed = counter_increase(end[1], last[1], names.DATALOADER_WORKER_KILLS_TOTAL) or 0.0
        if oom_kills_between(end[1], last[1]) > 0 or killed > 0:
            return start, last
        return start, end

    def _steady_span(self, last: Timed) -> tuple[Timed, Timed] | None:
        assert self.first is not None
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
        if start[0] >= last[0] and not self.anchors:
            # No step at all (the command never iterated a DataLoader, or exited before its
            # first batch): the whole run, so that the verdict keeps what was sampled.
            start = self.first
        if start[0] >= last[0]:
            return None
        return start, last

    def _kept(self, last: Timed) -> list[Timed]:
        """Every snapshot still kept (the first, the baseline, the anchors, the last), in time order."""
        kept = {id(x): x for x in (self.first, self.baseline, *self.anchors, last) if x is not None}
        return sorted(kept.values(), key=lambda x: x[0])

    def _before_first_oom_kill(self, last: Timed) -> Timed | None:
        """The latest kept snapshot before the run's first OOM kill; None when the run had none."""
        kept = self._kept(last)
        origin = kept[0][1]
        for previous, item in itertools.pairwise(kept):
            if oom_kills_between(origin, item[1]) > 0:
                return previous
        return None

    def final_verdict(self, oom_killed: bool | None = None, *, completed: bool = False) -> Verdict:
        """The verdict over the run from the first batch to the last snapshot, warm-up skipped.

        ``oom_killed``: the command itself was OOM-killed. When the run had an OOM kill, the
        window's resident memory, loader worker count and container memory are the run's
        peaks (``with_memory_peaks``). ``completed``: the command exited 0 by itself
        (``final_span``).
        """
        span = self.final_span(completed)
        if span is None:
            return self.verdict_from_nothing(oom_killed)
        before, after = span
        if oom_killed or oom_kills_between(before[1], after[1]) > 0:
            after = (after[0], with_memory_peaks(after[1], self.peaks))
        return self.verdict_of(before, after, oom_killed, starting=False)  # the command has ended

    def final_ranks(self, limit: int = MAX_LISTED_RANKS, *, completed: bool = False) -> list[RankFigures]:
        """Each rank's figures over the final verdict's span, in rank order (empty for one process).

        At most ``limit`` ranks: the worst ones (latest at the collectives, most data wait).
        ``completed``: as for ``final_verdict``.
        """
        span = self.final_span(completed)
        if span is None:
            return []
        (t0, before), (t1, after) = span
        ranks = job_window({"": PodWindow(before, after, elapsed_seconds=(t1 - t0) or None)}).ranks
        if len(ranks) < 2:
            return []
        figures = rank_figures(ranks, limit=limit)
        return sorted(figures, key=lambda f: -1 if f.rank is None else f.rank)

    def verdict_from_nothing(self, oom_killed: bool | None = None) -> Verdict:
        empty = Snapshot([])
        # The final verdict: the command has ended (starting False).
        obs = observation_from_snapshots(
            empty, empty, elapsed_seconds=None, oom_killed=oom_killed, starting=False
        )
        return diagnose(
            obs,
            self.thresholds,
            self.hardware,
        )
