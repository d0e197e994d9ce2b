"""Whether a job runs well below its own steady step rate, and what changed when it does (pure).

Numbers in, answer out: each evaluation window's figures (``WindowFigures``: the job's step rate,
the shares of the step its signals take, each rank's mean step) and the window's time; the answer
is ``status.progress.slowdown``'s shape (``Slowdown``, DESIGN.md §3), or None.

The baseline is the job's own steady rate, not its warm-up, and not a slowdown it is in:

- After a reset (the first window, or a new ``key``: the spec's generation and the Pods' template
  hash) the first ``warmup_windows`` windows with steps are skipped (compilation, caches filling).
- The next ``min_baseline_windows`` windows form the baseline; from then on a window enters it only
  when it is healthy: at or above the recovery line (``1 - drop_fraction / 2`` of the baseline)
  and in no slowdown. A slow window, or one between the two lines, never enters it.
- The baseline is the higher of two medians over the windows that entered: the latest
  ``baseline_windows`` (it follows a job that grew faster within a few windows) and the latest
  ``memory_windows`` (a job that creeps slower, each window within the noise of the one before,
  cannot drag the baseline down with it before the creep crosses the line). Medians: one odd
  window moves neither.

A slowdown starts when ``windows`` windows in a row run below ``1 - drop_fraction`` of the baseline
(``since`` is the first of them); it ends when a window is back at the recovery line, or the key
changes. Windows without steps (``steps_per_second`` None or 0: a stall, ``progress``'s business)
are skipped: they neither count toward a slowdown, nor end one, nor enter the baseline.

Evidence (sentences, each with its numbers): the rate, then each signal that explains the longer
step, then the rank whose step grew most:

- ``steps/s 12.4 -> 7.9 (64 % of the job's baseline) for 3 windows``.
- ``data wait 5 % -> 41 % of the step``: a signal whose share of the step rose by at least
  ``signal_rise`` (10 percentage points) and whose own time per step grew by at least
  ``signal_share`` of the step's growth (a quarter). Shares alone mislead: a signal that kept its
  time takes a smaller share of a longer step, and one that rose from 30 % to 55 % while the step
  grew half again took all of the added time although it did not double.
- ``rank 3's step time 0.21 s -> 0.44 s (2.1x)``: the rank whose mean step grew most against its
  own baseline, when it grew ``rank_growth`` (1.5x) or more; when every rank grew alike (within
  10 % of one another) the sentence says so instead (``all 8 ranks' step time ...``), since then
  no rank stands out.

Memory is bounded: ``memory_windows`` rates and the figures of the latest ``baseline_windows``
healthy windows (the signals' and the ranks' baselines are their medians over those).
"""

from __future__ import annotations

import copy
import math
import re
import statistics
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pydantic import Field

from dam_operator.diagnosis.model import Verdict, _Wire

DROP_FRACTION_DEFAULT = 0.30
"""A window slower than 70 % of the baseline is slow."""
WINDOWS_DEFAULT = 3
"""... and three slow windows in a row are a slowdown."""

_ALIKE = 1.10
"""Ranks whose growths lie within this factor of one another grew alike."""


class Slowdown(_Wire):
    """``status.progress.slowdown`` (DESIGN.md §3)."""

    since: str
    """The first slow window of the slowdown (the caller's RFC 3339 time of that window)."""
    ratio: float = Field(ge=0.0, le=1.0)
    """The latest window's step rate over the baseline rate (rounded to 3 digits)."""
    evidence: list[str] = Field(default_factory=list)

    def describe(self) -> str:
        """The evidence on one line (an Event's message)."""
        return "; ".join(self.evidence)


@dataclass(frozen=True)
class WindowFigures:
    """One evaluation window of a job, as the caller measured it."""

    steps_per_second: float | None
    """The job's step rate (None or 0: no step in the window)."""
    signals: Mapping[str, float] = field(default_factory=dict)
    """Shares (0-1) of the step time by human name, e.g. ``data wait``, ``exposed communication``."""
    rank_step_seconds: Mapping[str, float] = field(default_factory=dict)
    """Each rank's mean step in the window, in seconds, by human label, e.g. ``rank 3``."""


@dataclass(frozen=True)
class SlowdownSettings:
    drop_fraction: float = DROP_FRACTION_DEFAULT
    """A window below ``1 - drop_fraction`` of the baseline is slow; back at ``1 - drop_fraction / 2``
    it is healthy again."""
    windows: int = WINDOWS_DEFAULT
    """Slow windows in a row that make a slowdown."""
    warmup_windows: int = 2
    """Windows with steps skipped after a reset before any enters the baseline."""
    min_baseline_windows: int = 3
    """Healthy windows the baseline needs before any window is judged against it."""
    baseline_windows: int = 5
    """The recent healthy windows whose median is the baseline (and whose figures are kept)."""
    memory_windows: int = 20
    """The longer run of healthy rates whose median keeps the baseline from sinking with a creep."""
    signal_rise: float = 0.10
    """A signal named in the evidence rose by at least this share of the step (percentage points)..."""
    signal_share: float = 0.25
    """... and its own time per step grew by at least this part of the step's growth."""
    rank_growth: float = 1.5
    """A rank named in the evidence: its mean step grew at least this much against its baseline."""

    def __post_init__(self) -> None:
        if not 0.0 < self.drop_fraction < 1.0:
            raise ValueError(f"drop_fraction must lie between 0 and 1, not {self.drop_fraction}")
        if self.windows < 1 or self.warmup_windows < 0:
            raise ValueError("windows must be at least 1 and warmup_windows at least 0")
        if not 1 <= self.min_baseline_windows <= self.baseline_windows <= self.memory_windows:
            raise ValueError("need 1 <= min_baseline_windows <= baseline_windows <= memory_windows")
        if self.rank_growth <= 1.0:
            raise ValueError(f"rank_growth must exceed 1, not {self.rank_growth}")

    @property
    def slow_below(self) -> float:
        """The share of the baseline below which a window is slow (0.7)."""
        return 1.0 - self.drop_fraction

    @property
    def healthy_at(self) -> float:
        """The share of the baseline at which a window is healthy again (0.85)."""
        return 1.0 - self.drop_fraction / 2.0


@dataclass(frozen=True)
class _Kept:
    """A healthy window's figures, cleaned (finite, in range)."""

    rate: float
    signals: dict[str, float]
    ranks: dict[str, float]


@dataclass
class SlowdownTracker:
    """The baseline and the slowdown across evaluation windows of one job."""

    settings: SlowdownSettings = field(default_factory=SlowdownSettings)
    key: str | None = field(default=None, init=False)
    """The previous window's key (None before the first)."""
    warmup_left: int = field(default=0, init=False)
    """Windows with steps still to skip before the baseline forms."""
    rates: deque[float] = field(default_factory=deque, init=False, repr=False)
    """Healthy rates, the latest ``memory_windows``."""
    recent: deque[_Kept] = field(default_factory=deque, init=False, repr=False)
    """Healthy windows' figures, the latest ``baseline_windows``."""
    slow_since: str | None = field(default=None, init=False)
    """The first window of the current run of slow windows (pending or reported)."""
    slow_run: int = field(default=0, init=False)
    """Slow windows in a row so far (before the slowdown is reported)."""
    windows_in: int = field(default=0, init=False)
    """Windows with steps since ``slow_since`` (the slowdown's length, once reported)."""
    current: Slowdown | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.rates = deque(maxlen=self.settings.memory_windows)
        self.recent = deque(maxlen=self.settings.baseline_windows)
        self.warmup_left = self.settings.warmup_windows

    def copy(self) -> SlowdownTracker:
        """A copy to update while this one stays as it was (``window_step``): its deques new, the
        rest values (a ``_Kept`` and a ``Slowdown`` are replaced, never changed in place)."""
        out = copy.copy(self)
        out.rates = deque(self.rates, maxlen=self.rates.maxlen)
        out.recent = deque(self.recent, maxlen=self.recent.maxlen)
        return out

    def reset(self) -> None:
        """Forget the baseline and any slowdown (a new spec or Pod template: a new normal)."""
        self.warmup_left = self.settings.warmup_windows
        self.rates.clear()
        self.recent.clear()
        self._clear_run()
        self.current = None

    def baseline_rate(self) -> float | None:
        """The job's steady rate (None while the baseline forms)."""
        if len(self.rates) < self.settings.min_baseline_windows:
            return None
        short = statistics.median(r.rate for r in self.recent)
        return max(short, statistics.median(self.rates))

    def update(self, figures: WindowFigures, now_iso: str, key: str) -> tuple[Slowdown | None, bool]:
        """The slowdown after this window (None: none), and whether one started or ended with it.

        ``key`` is opaque; when it differs from the previous window's the baseline starts over (and a
        slowdown in progress ends). A window's new evidence alone is no change.
        """
        ended = False
        if key != self.key:
            ended = self.current is not None
            self.key = key
            self.reset()
        rate = figures.steps_per_second
        if rate is None or not math.isfinite(rate) or rate <= 0.0:
            return self.current, ended
        if self.warmup_left > 0:
            self.warmup_left -= 1
            return None, ended
        kept = _Kept(rate, _clean(figures.signals, upper=1.0), _clean(figures.rank_step_seconds))
        baseline = self.baseline_rate()
        if baseline is None:
            self._keep(kept)
            return None, ended
        share = rate / baseline
        s = self.settings
        if share >= s.healthy_at:
            self._keep(kept)
            self._clear_run()
            if self.current is not None:
                self.current = None
                return None, True
            return None, ended
        if self.current is not None:  # still in the slowdown (slow, or between the two lines)
            self.windows_in += 1
            self.current = self._slowdown(kept, baseline)
            return self.current, False
        if share >= s.slow_below:  # between the lines: not slow, not healthy
            self._clear_run()
            return None, ended
        if self.slow_run == 0:
            self.slow_since = now_iso
        self.slow_run += 1
        self.windows_in += 1
        if self.slow_run < s.windows:
            return None, ended
        self.current = self._slowdown(kept, baseline)
        return self.current, True

    def _keep(self, kept: _Kept) -> None:
        self.rates.append(kept.rate)
        self.recent.append(kept)

    def _clear_run(self) -> None:
        self.slow_since, self.slow_run, self.windows_in = None, 0, 0

    def _slowdown(self, now: _Kept, baseline: float) -> Slowdown:
        ratio = min(1.0, round(now.rate / baseline, 3))
        runs = f"{self.windows_in} window{'s' if self.windows_in != 1 else ''}"
        rates = f"steps/s {_num(baseline)} -> {_num(now.rate)}"
        evidence = [f"{rates} ({ratio * 100:.0f} % of the job's baseline) for {runs}"]
        growth = baseline / now.rate  # the step's length now, the baseline step's being 1
        signals = _medians(k.signals for k in self.recent)
        evidence += _signal_sentences(signals, now.signals, growth, self.settings)
        rank = _rank_sentence(_medians(k.ranks for k in self.recent), now.ranks, self.settings)
        if rank is not None:
            evidence.append(rank)
        return Slowdown(since=self.slow_since or "", ratio=ratio, evidence=evidence)


def _clean(values: Mapping[str, float], upper: float = math.inf) -> dict[str, float]:
    return {k: float(v) for k, v in values.items() if math.isfinite(v) and 0.0 <= v <= upper}


def _medians(windows: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Each name's median over the windows that carried it."""
    by_name: dict[str, list[float]] = {}
    for window in windows:
        for name, value in window.items():
            by_name.setdefault(name, []).append(value)
    return {name: statistics.median(values) for name, values in by_name.items()}


def _signal_sentences(
    before: Mapping[str, float], now: Mapping[str, float], growth: float, s: SlowdownSettings
) -> list[str]:
    """The signals that took the added step time, the largest part first."""
    added = growth - 1.0
    if added <= 0.0:
        return []
    named: list[tuple[float, str, str]] = []
    for name, was in before.items():
        share = now.get(name)
        if share is None or share - was < s.signal_rise - 1e-9:
            continue
        part = (share * growth - was) / added  # its time per step grew by this part of the step's growth
        if part >= s.signal_share:
            named.append((-part, name, f"{name} {was * 100:.0f} % -> {share * 100:.0f} % of the step"))
    return [sentence for _, _, sentence in sorted(named)]


def _rank_sentence(before: Mapping[str, float], now: Mapping[str, float], s: SlowdownSettings) -> str | None:
    labels = sorted((label for label, was in before.items() if was > 0 and label in now), key=_natural)
    if not labels:
        return None
    grew = {label: now[label] / before[label] for label in labels}
    label = max(labels, key=grew.__getitem__)  # ties: the first in order (rank 2 before rank 10)
    if grew[label] < s.rank_growth:
        return None
    if len(labels) > 1 and grew[label] <= min(grew.values()) * _ALIKE:
        was = statistics.median(before[x] for x in labels)
        is_now = statistics.median(now[x] for x in labels)
        return f"all {len(labels)} ranks' step time {_num(was)} s -> {_num(is_now)} s ({is_now / was:.1f}x)"
    return f"{label}'s step time {_num(before[label])} s -> {_num(now[label])} s ({grew[label]:.1f}x)"


def _natural(label: str) -> list[tuple[int, str]]:
    """``rank 2`` before ``rank 10``."""
    return [(int(part), "") if part.isdigit() else (-1, part) for part in re.split(r"(\d+)", label)]


def _num(x: float) -> str:
    """Three significant digits, no exponent for the usual sizes: ``12.4``, ``7.9``, ``0.21``, ``1234``."""
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"


_SIGNALS: tuple[tuple[str, str], ...] = (
    ("data wait", "data_wait_ratio"),
    ("exposed communication", "exposed_communication_ratio"),
    ("checkpoint saves", "checkpoint_ratio"),
    ("CPU wait", "cpu_wait_ratio"),
    ("CPU throttling", "cpu_throttled_ratio"),
)
"""The signals a slowdown's evidence may name (a share of the step each), by their sentence name."""


def figures_of(verdict: Verdict) -> WindowFigures:
    """A window's figures for the tracker, from the window's verdict: the job's rate, the shown
    signals (those the window has) and each listed rank's mean step (the inverse of its rate)."""
    m = verdict.metrics
    signals = {name: value for name, attr in _SIGNALS if (value := getattr(m.shown, attr, None)) is not None}
    ranks: dict[str, float] = {}
    for r in m.ranks or ():
        if r.steps_per_second and r.steps_per_second > 0:
            label = f"rank {r.rank}" if r.rank is not None else f"pod {r.pod}"
            ranks[label] = 1.0 / r.steps_per_second
    return WindowFigures(steps_per_second=m.steps_per_second, signals=signals, rank_step_seconds=ranks)
