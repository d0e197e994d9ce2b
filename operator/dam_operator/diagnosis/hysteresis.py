"""Hysteresis: a published verdict does not flap with every noisy window.

One ``Stabilizer`` per profile (or per ``dam run``). Feed it each window's raw verdict
and the evaluation time; it returns the verdict to publish. The rule:

* The first verdict is published as it is; ``since`` is the time it was first seen.
* A window whose regime equals the published one refreshes the published verdict
  (new evidence, lever, confidence, metrics) and keeps ``since``.
* A different *known* regime replaces the published one when it has won
  ``confirm_windows`` consecutive windows (default 2), or at once when its confidence
  exceeds the published confidence by at least ``confidence_margin`` (default 0.3).
  ``since`` then becomes the time of the switch.
* ``unknown`` replaces a known verdict only after ``unknown_windows`` consecutive
  unknown windows (default 3): a short gap in the counters (a scrape missed, a pod
  restarting) does not erase a diagnosis. Its confidence is 0, so it never switches
  by the margin.
* While a challenger is pending, the published bottleneck is held, with one evidence
  line saying what is pending, and the metrics are the current window's.
* The straggler (``bottleneck.straggler``) has its own hysteresis, keyed by its pod and
  rank: the first window's is published as it is; the same rank refreshes it (cause,
  evidence); a different rank, or none, replaces it after ``confirm_windows`` consecutive
  windows. Until then the published straggler is kept, with an evidence line saying so.

Pure apart from its own state: the clock is passed in.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime

from dam_operator.diagnosis.axes import Kind
from dam_operator.diagnosis.evidence import Evidence, note
from dam_operator.diagnosis.levers import Regime
from dam_operator.diagnosis.model import Bottleneck, Straggler, Verdict
from dam_operator.diagnosis.ranks import STRAGGLER_PREFIX, straggler_sentence

_StragglerKey = tuple[str | None, int | None] | None
_HOLDING_STRAGGLER = "holding straggler"
_STRAGGLER_LINES = (Kind.STRAGGLER, Kind.HOLDING_STRAGGLER)


def _read_back(bottleneck: Bottleneck) -> Bottleneck:
    """A bottleneck with its straggler lines known as such where it has no records for them (one
    read from a status, or built by hand): the one place their text is read; everything after
    reads the records' kinds."""

    def record(r: Evidence) -> Evidence:
        if r.kind is not Kind.NOTE:
            return r
        if r.sentence.startswith(STRAGGLER_PREFIX):
            return Evidence(Kind.STRAGGLER, r.sentence)
        if r.sentence.startswith(_HOLDING_STRAGGLER):
            return Evidence(Kind.HOLDING_STRAGGLER, r.sentence)
        return r

    return bottleneck.with_records([record(r) for r in bottleneck.records()])


def _key(straggler: Straggler | None) -> _StragglerKey:
    return None if straggler is None else (straggler.pod, straggler.rank)


def _describe(key: _StragglerKey) -> str:
    if key is None:
        return "none"
    pod, rank = key
    who = f"rank {rank}" if rank is not None else ""
    if pod:
        who = f"{who} (pod {pod})" if who else f"pod {pod}"
    return who or "a process"


def rfc3339(now: datetime) -> str:
    """``2026-01-02T03:04:05Z``; a naive datetime is taken to be UTC."""
    if now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Stabilizer:
    __slots__ = (
        "_current",
        "_pending",
        "_pending_count",
        "_straggler",
        "_straggler_pending",
        "_straggler_pending_count",
        "confidence_margin",
        "confirm_windows",
        "unknown_windows",
    )
    """One per profile the operator holds: no ``__dict__`` (docs/performance.md)."""

    def __init__(
        self, *, confirm_windows: int = 2, confidence_margin: float = 0.3, unknown_windows: int = 3
    ) -> None:
        if confirm_windows < 1 or unknown_windows < 1:
            raise ValueError("confirm_windows and unknown_windows must be at least 1")
        if not confidence_margin >= 0.0:
            raise ValueError("confidence_margin must be >= 0")
        self.confirm_windows = confirm_windows
        self.confidence_margin = confidence_margin
        self.unknown_windows = unknown_windows
        self._current: Bottleneck | None = None
        self._pending: Regime | None = None
        self._pending_count = 0
        self._straggler: Straggler | None = None
        self._straggler_pending: _StragglerKey = None
        self._straggler_pending_count = 0

    def copy(self) -> Stabilizer:
        """A copy to update while this one stays as it was (``window_step``). Shallow: what it
        holds (a ``Bottleneck``, a ``Straggler``, a regime, counts) is replaced, never changed
        in place."""
        return copy.copy(self)

    @property
    def current(self) -> Bottleneck | None:
        """The published bottleneck (None before the first window)."""
        return self._current

    @property
    def pending(self) -> tuple[Regime, int] | None:
        """The challenger regime and the number of consecutive windows it has won."""
        return (self._pending, self._pending_count) if self._pending is not None else None

    def restore(self, bottleneck: Bottleneck) -> None:
        """Resume from a published bottleneck (e.g. the resource status after an operator restart)."""
        self._current = _read_back(bottleneck)
        self._pending, self._pending_count = None, 0
        self._straggler = bottleneck.straggler
        self._straggler_pending, self._straggler_pending_count = None, 0

    @property
    def straggler(self) -> Straggler | None:
        """The published straggler (None when there is none)."""
        return self._straggler

    def _stabilize_straggler(self, cand: Straggler | None, first: bool) -> str | None:
        """Updates the published straggler; returns a note while a change is pending."""
        published = _key(self._straggler)
        if first or _key(cand) == published:
            self._straggler = cand
            self._straggler_pending, self._straggler_pending_count = None, 0
            return None
        if self._straggler_pending_count and self._straggler_pending == _key(cand):
            self._straggler_pending_count += 1
        else:
            self._straggler_pending, self._straggler_pending_count = _key(cand), 1
        if self._straggler_pending_count >= self.confirm_windows:
            self._straggler = cand
            self._straggler_pending, self._straggler_pending_count = None, 0
            return None
        return (
            f"{_HOLDING_STRAGGLER} {_describe(published)}: {_describe(_key(cand))} seen in "
            f"{self._straggler_pending_count} of the {self.confirm_windows} consecutive windows "
            "needed to switch"
        )

    def _with_straggler(self, bottleneck: Bottleneck, pending: str | None) -> Bottleneck:
        records = [r for r in bottleneck.records() if r.kind is not Kind.STRAGGLER]
        if self._straggler is not None:
            records.append(Evidence(Kind.STRAGGLER, straggler_sentence(self._straggler)))
        if pending:
            records.append(Evidence(Kind.HOLDING_STRAGGLER, pending))
        return bottleneck.model_copy(update={"straggler": self._straggler}).with_records(records)

    def update(self, verdict: Verdict, now: datetime) -> Verdict:
        pending_straggler = self._stabilize_straggler(
            verdict.bottleneck.straggler, first=self._current is None
        )
        cand = self._with_straggler(_read_back(verdict.bottleneck), pending_straggler)
        verdict = Verdict(bottleneck=cand, metrics=verdict.metrics)
        current = self._current
        if current is None or cand.regime == current.regime:
            since = current.since if current is not None and current.since else rfc3339(now)
            return self._publish(verdict, since)

        if self._pending == cand.regime:
            self._pending_count += 1
        else:
            self._pending, self._pending_count = cand.regime, 1
        needed = self.unknown_windows if cand.regime is Regime.UNKNOWN else self.confirm_windows
        by_margin = (
            cand.regime is not Regime.UNKNOWN
            and cand.confidence >= current.confidence + self.confidence_margin
        )
        if self._pending_count >= needed or by_margin:
            return self._publish(verdict, rfc3339(now))

        pending = (
            f"holding {current.regime.value}: {cand.regime.value} seen in {self._pending_count} "
            f"of the {needed} consecutive windows needed to switch"
        )
        records = [
            *(r for r in cand.records() if r.kind in _STRAGGLER_LINES),
            *(r for r in current.records() if r.kind not in _STRAGGLER_LINES),
            note(pending),
        ]
        held = current.model_copy(update={"straggler": self._straggler}).with_records(records)
        return Verdict(bottleneck=held, metrics=verdict.metrics)

    def _publish(self, verdict: Verdict, since: str) -> Verdict:
        bottleneck = verdict.bottleneck.model_copy(update={"since": since})
        self._current = bottleneck
        self._pending, self._pending_count = None, 0
        return Verdict(bottleneck=bottleneck, metrics=verdict.metrics)
