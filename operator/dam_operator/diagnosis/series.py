"""Reading series out of metric snapshots: validity, counter increases, GPU attribution.

The small vocabulary the signal table (``diagnosis.signals``) and the window
(``diagnosis.window``) are written in. Garbage never raises: a NaN, an infinity or a
negative value is no value (None), and a ratio well above 1 is garbage too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from dam_contract import names
from dam_contract.snapshot import Labels, Sample, Snapshot

RATIO_TOLERANCE = 1.05
"""Ratios up to this are clamped to 1 (sampling jitter); above it they are garbage."""


def valid(v: float | None) -> float | None:
    """``v`` when it is a finite number at or above 0, else None."""
    if v is None or not math.isfinite(v) or v < 0:
        return None
    return v


def ratio(v: float | None) -> float | None:
    """``v`` as a ratio 0–1: up to ``RATIO_TOLERANCE`` clamped to 1, above it None."""
    v = valid(v)
    if v is None or v > RATIO_TOLERANCE:
        return None
    return min(v, 1.0)


def label_of(labels: Labels, key: str) -> str | None:
    """The value of label ``key`` (None when the series has no such label)."""
    for k, v in labels:
        if k == key:
            return v
    return None


def increase(before: float | None, after: float | None) -> float | None:
    """A counter's increase: a counter that went down was reset (a restarted process), so AFTER
    is the increase, as Prometheus takes it; a series absent from BEFORE counts from zero."""
    a = valid(after)
    if a is None:
        return None
    b = valid(before)
    return a if b is None or a < b else a - b


def counter_increase(
    before: Snapshot, after: Snapshot, name: str, where: Callable[[Labels], bool] | None = None
) -> float | None:
    """Sum over series of the counter's increase; None when AFTER has no valid series."""
    prev = before.series(name)
    total: float | None = None
    for labels, value in after.series(name).items():
        if where is not None and not where(labels):
            continue
        # ``increase``, inline: this runs for every series of every counter of every window.
        a = valid(value)
        if a is None:
            continue
        b = valid(prev.get(labels))
        delta = a if b is None or a < b else a - b
        total = delta if total is None else total + delta
    return total


def first_gauge(snapshot: Snapshot, name: str) -> float | None:
    """The first valid sample of a gauge (a pod-wide gauge has one series)."""
    for s in snapshot.samples(name):
        v = valid(s.value)
        if v is not None:
            return v
    return None


def role_count(snapshot: Snapshot, role: str) -> float | None:
    """``dam_processes{role}`` summed over its series; None when absent or garbage."""
    total: float | None = None
    for s in snapshot.samples(names.PROCESSES):
        count = valid(s.value)
        if label_of(s.labels, "role") == role and count is not None and count <= 100_000:
            total = count if total is None else total + count
    return total


def attribution_state(snapshot: Snapshot) -> str | None:
    """The ``state`` label of ``dam_gpu_attribution`` whose value is 1 (None when absent)."""
    for s in snapshot.samples(names.GPU_ATTRIBUTION):
        if s.value == 1.0:
            return s.label("state") or None
    return None


def attributed(sample: Sample, gpu_uuids: set[str] | None) -> bool:
    """The sample is of one of the job's GPUs (or has no ``uuid``, or no set is given)."""
    if gpu_uuids is None:
        return True
    uuid = sample.label("uuid")
    return not uuid or uuid in gpu_uuids


def attributed_labels(labels: Labels, gpu_uuids: set[str] | None) -> bool:
    """``attributed`` for a series' labels."""
    if gpu_uuids is None:
        return True
    uuid = label_of(labels, "uuid")
    return not uuid or uuid in gpu_uuids


def gpu_key(sample: Sample) -> str:
    """Which GPU a sample is of: its ``uuid``, else its ``gpu`` index."""
    return sample.label("uuid") or sample.label("gpu") or ""


def known(values: Iterable[float | int | None]) -> list[float]:
    """The values that are not None, as floats."""
    return [float(v) for v in values if v is not None]


def fsum(values: Iterable[float]) -> float | None:
    """``math.fsum``, None when the sum overflows (garbage in: the signal is dropped)."""
    try:
        total = math.fsum(values)
    except OverflowError:
        return None
    return total if math.isfinite(total) else None
