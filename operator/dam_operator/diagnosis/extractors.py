"""How one pod's (or rank's) value of a signal is read from the two scrapes of a window.

The kinds a ``diagnosis.signals.Signal`` is declared with: ``Increase`` (a counter's increase),
``Rate`` (per second of the window), ``Quotient`` (one counter over another: a share of the
step time, seconds per step), ``Gauge`` (read from AFTER: one pod-wide series, or the mean or
sum over the job's GPUs or a process role), ``FirstOf`` (a preferred reading, then a fallback)
and ``Custom`` (a named function). Each reads a ``Scrapes``: the two snapshots, the window's
length, and what the caller knows (``Known``: the job's GPUs, explicit batch size, FLOPs, GPU
model, an OOM kill).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypedDict, TypeVar

from dam_contract import names
from dam_contract.snapshot import Labels, Snapshot
from dam_operator.diagnosis import series

T = TypeVar("T")
_UNREAD: Any = object()


# --- the window's two scrapes ----------------------------------------------------------------


@dataclass(frozen=True)
class Known:
    """What the caller knows about a pod's window; explicit values win over the snapshots'."""

    elapsed_seconds: float | None = None
    """The window's length (the pods' scrape times, ``dam run``'s clock)."""
    gpu_uuids: set[str] | None = None
    """The job's GPUs; samples of other GPUs are ignored (None: every GPU is the job's)."""
    batch_size: int | None = None
    flops_per_step: float | None = None
    gpu_model: str | None = None
    oom_killed: bool | None = None
    """The pod's training container was OOM-killed (Pod status, ``dam run``'s child)."""
    starting: bool | None = None
    """The pod may still be starting (``Observation.starting``)."""
    oom_exit_code: int | None = None
    """The OOM-killed container's exit code (``Observation.oom_exit_code``: 137, the main process)."""


class KnownArgs(TypedDict, total=False):
    """``Known`` as keyword arguments (``window.observation_from_snapshots``, ``rank_observations``)."""

    elapsed_seconds: float | None
    gpu_uuids: set[str] | None
    batch_size: int | None
    flops_per_step: float | None
    gpu_model: str | None
    oom_killed: bool | None
    starting: bool | None
    oom_exit_code: int | None


@dataclass(frozen=True)
class Scrapes:
    """One pod's (or one rank's) two scrapes and what the caller knows about the window.

    Counter increases are computed once per window and kept (several signals share the step
    seconds); ``memo`` does the same for a custom reading that several signals share.
    """

    before: Snapshot
    after: Snapshot
    known: Known = Known()
    elapsed: float | None = field(init=False)
    """The window's length, seconds, in order: ``known.elapsed_seconds`` when given, the difference of
    ``dam_snapshot_timestamp_seconds``, the snapshots' own timestamps, and finally the
    step-seconds counter's increase."""
    _memo: dict[Any, Any] = field(default_factory=dict, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "elapsed", self._length())

    def _length(self) -> float | None:
        elapsed = series.valid(self.known.elapsed_seconds) or None
        if elapsed is None:
            t0 = series.first_gauge(self.before, names.SNAPSHOT_TIMESTAMP_SECONDS)
            t1 = series.first_gauge(self.after, names.SNAPSHOT_TIMESTAMP_SECONDS)
            if t0 is not None and t1 is not None and t1 > t0:
                elapsed = t1 - t0
        if elapsed is None:
            t0, t1 = series.valid(self.before.timestamp_seconds), series.valid(self.after.timestamp_seconds)
            if t0 is not None and t1 is not None and t1 > t0:
                elapsed = t1 - t0
        if elapsed is None:
            elapsed = self.increase(names.STEP_SECONDS_TOTAL) or None
        return elapsed

    def increase(self, metric: str, role: str | None = None, gpus: bool = False) -> float | None:
        """The counter's increase over the window: its series with ``role``, of the job's GPUs."""
        key = (metric, role, gpus)
        value: float | None = self._memo.get(key, _UNREAD)
        if value is _UNREAD:
            where: Callable[[Labels], bool] | None = None
            if role is not None:
                where = lambda labels, r=role: series.label_of(labels, "role") == r  # noqa: E731
            elif gpus:
                where = lambda labels: series.attributed_labels(labels, self.known.gpu_uuids)  # noqa: E731
            value = self._memo[key] = series.counter_increase(self.before, self.after, metric, where)
        return value

    def gpu_values(self, metric: str, check: Check) -> list[tuple[str, float]]:
        """(GPU, value) of each sample of a per-GPU gauge in AFTER of the job's GPUs that passes ``check``."""
        key = (metric, check)
        found: list[tuple[str, float]] | None = self._memo.get(key)
        if found is None:
            apply, uuids = _CHECKS[check], self.known.gpu_uuids
            found = self._memo[key] = [
                (series.gpu_key(sample), v)
                for sample in self.after.samples(metric)
                if (uuids is None or series.attributed(sample, uuids))
                and (v := apply(sample.value)) is not None
            ]
        return found

    def memo(self, read: Callable[[Scrapes], T]) -> T:
        """``read(self)``, computed once for this window."""
        value: T = self._memo.get(read, _UNREAD)
        if value is _UNREAD:
            value = self._memo[read] = read(self)
        return value


# --- how a value is read: the kinds --------------------------------------------------------------


class Check(StrEnum):
    """What a gauge's value must be to count."""

    VALID = "valid"
    """A finite number at or above 0."""
    RATIO = "ratio"
    """A ratio: up to 1.05 clamped to 1, above it garbage."""
    NONZERO = "nonzero"
    """Valid and not 0 (a limit of 0 is no limit)."""

    def apply(self, v: float | None) -> float | None:
        return _CHECKS[self](v)


def _nonzero(v: float | None) -> float | None:
    return series.valid(v) or None


_CHECKS: dict[Check, Callable[[float | None], float | None]] = {
    Check.VALID: series.valid,
    Check.RATIO: series.ratio,
    Check.NONZERO: _nonzero,
}


class Combine(StrEnum):
    """How a gauge's samples in AFTER become one value."""

    FIRST = "first"
    """The first valid sample (a pod-wide gauge has one series), then checked."""
    MEAN = "mean"
    """The mean of the samples that pass the check (e.g. over the job's GPUs)."""
    SUM = "sum"
    """The sum of the samples that pass the check."""


@dataclass(frozen=True)
class Increase:
    """A counter's increase over the window, summed over its series (``role``: those of it)."""

    metric: str
    role: str | None = None

    @property
    def metrics(self) -> tuple[str, ...]:
        return (self.metric,)

    def read(self, s: Scrapes) -> float | None:
        return s.increase(self.metric, self.role)


@dataclass(frozen=True)
class Rate:
    """A counter's increase per second of the window.

    ``role``: only its series of that process role; ``gpus``: only the job's GPUs' series;
    ``at_most_one``: a share of the wall time, clamped to 1.
    """

    metric: str
    role: str | None = None
    gpus: bool = False
    at_most_one: bool = False

    @property
    def metrics(self) -> tuple[str, ...]:
        return (self.metric,)

    def read(self, s: Scrapes) -> float | None:
        if not s.elapsed:
            return None
        done = s.increase(self.metric, self.role, self.gpus)
        if done is None:
            return None
        rate = done / s.elapsed
        return min(1.0, rate) if self.at_most_one else rate


@dataclass(frozen=True)
class Quotient:
    """One counter's increase over another's (None when the denominator did not move).

    ``ratio``: a share (garbage above 1.05, clamped to 1); ``when``: a precondition of the window.
    """

    numerator: str
    denominator: str
    ratio: bool = False
    when: Callable[[Scrapes], bool] | None = None

    @property
    def metrics(self) -> tuple[str, ...]:
        return (self.numerator, self.denominator)

    def read(self, s: Scrapes) -> float | None:
        num, den = s.increase(self.numerator), s.increase(self.denominator)
        if num is None or not den or (self.when is not None and not self.when(s)):
            return None
        return series.ratio(num / den) if self.ratio else num / den


@dataclass(frozen=True)
class Gauge:
    """A gauge read from AFTER (gauges of BEFORE do not count).

    ``gpus``: only the job's GPUs' samples; ``role``: only the samples of that process role.
    """

    metrics: tuple[str, ...]
    combine: Combine = Combine.FIRST
    check: Check = Check.VALID
    gpus: bool = False
    role: str | None = None

    def __post_init__(self) -> None:
        if self.combine is Combine.FIRST and (self.gpus or self.role or len(self.metrics) != 1):
            raise ValueError("Gauge: Combine.FIRST reads one pod-wide series (no gpus, no role)")

    def read(self, s: Scrapes) -> float | None:
        if self.combine is Combine.FIRST:
            return self.check.apply(series.first_gauge(s.after, self.metrics[0]))
        if self.gpus:
            values = [v for metric in self.metrics for _, v in s.gpu_values(metric, self.check)]
        else:
            check, role = _CHECKS[self.check], self.role
            values = [
                v
                for metric in self.metrics
                for sample in s.after.samples(metric)
                if (role is None or sample.label("role") == role) and (v := check(sample.value)) is not None
            ]
        if not values:
            return None
        return statistics.fmean(values) if self.combine is Combine.MEAN else series.fsum(values)


@dataclass(frozen=True)
class FirstOf:
    """The first of several readings that has a value (a preferred source, then a fallback)."""

    kinds: tuple[Increase | Rate | Quotient | Gauge, ...]

    @property
    def metrics(self) -> tuple[str, ...]:
        return tuple(m for kind in self.kinds for m in kind.metrics)

    def read(self, s: Scrapes) -> float | None:
        for kind in self.kinds:
            value = kind.read(s)
            if value is not None:
                return value
        return None


@dataclass(frozen=True)
class Custom:
    """A named function of the window, for a signal no kind describes; ``metrics`` it reads."""

    read: Callable[[Scrapes], Any]
    metrics: tuple[str, ...] = ()


Extractor = Increase | Rate | Quotient | Gauge | FirstOf | Custom
