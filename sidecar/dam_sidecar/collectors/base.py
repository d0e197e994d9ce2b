"""What every per-source collector is: one ``sample()`` per tick, one ``collect()`` of its families.

The shape of prometheus client_python's ``ProcessCollector`` (one ``collect()``; the registry it
goes on is given, never the process-wide default) and of dcgm-exporter's collector factory (a
list built from the settings): ``dam_sidecar.collector.standard_collectors``. Unlike
``ProcessCollector``, ``collect()`` never reads its source: the sidecar's sampling tick calls
``sample()`` on each collector once (one thread, every ``interval_seconds``), then ``collect()``
once, and caches the families and their text until the next tick.

Each collector reads its own source and is given, at construction, whatever else it needs: the
GPU and host collectors read the probe's GPU UUIDs, pids and cgroup figures from the ``ProbeFeed``
they are handed (``feeds``), which the tick refreshes once, before any collector samples. So no
collector depends on another one's place in the list (tests/unit/sidecar/test_collector_order.py
samples them in every order). What the tick measured of itself (each sampler's duration, its end)
is handed to the collectors that ``observe`` it (the health collector), after every one sampled.

A family that is one field of the collector's sample is not written here: its declaration in
``dam_contract.names`` names the field (``MetricSpec.sample``), ``declared`` picks a source's
declarations and ``fields`` builds their families from the samples. Only a family that is not a
field (per role, per rank, a state set, the GPU's name) is built by hand.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, cast, runtime_checkable

from dam_contract import names as n
from dam_contract.names import BY_NAME, CATALOG, MetricSpec
from dam_sidecar.exposition import Family

# Reads one declared sample field of a collector's sample (None: unknown, the series is left out).
Reader = Callable[[object], float | None]


@dataclass(frozen=True)
class TickRecord:
    """What one sampling tick measured of itself, handed to the observers after every collector sampled."""

    durations: tuple[tuple[str, float], ...] = ()
    """(sampler, seconds) of each timed feed and collector, in the order they sampled."""
    timestamp_seconds: float = 0.0
    """Unix time when the samplers were done (0: no tick yet)."""


class Feed(Protocol):
    """A source that several collectors read (the probe files): the tick refreshes it once, before
    any collector samples, and times it as ``sampler``."""

    sampler: str

    def refresh(self) -> None:
        """Read the source once (may raise: counted like a collector's, then ``fallback``)."""
        ...

    def fallback(self) -> None:
        """``refresh`` raised this tick: keep what was read before, marked down."""
        ...


class SourceCollector(Protocol):
    """One source's collector. ``sampler`` names it in ``dam_sidecar_sampler_*`` ("" if untimed);
    ``feeds``: the shared sources it reads besides its own (refreshed by the tick before it samples)."""

    sampler: str
    feeds: tuple[Feed, ...]

    def sample(self) -> None:
        """Read the source once (on the sampling thread) and keep what ``collect()`` shows.

        May raise: the tick counts it in ``dam_sidecar_sampler_errors_total{reason="exception"}``
        and calls ``fallback`` instead; the other collectors still run.
        """
        ...

    def fallback(self) -> None:
        """``sample`` raised this tick: keep the previous counters (never a counter reset), marked down."""
        ...

    def collect(self) -> Iterator[Family]:
        """The families of the latest sample (never reads the source)."""
        ...

    def close(self) -> None:
        """Release the source (NVML); the others have nothing to release."""
        ...


@runtime_checkable
class TickObserver(Protocol):
    """A collector that reports on the tick itself (the health collector)."""

    def observe(self, record: TickRecord) -> None:
        """Called once a tick, after every feed and collector sampled."""
        ...


def gauge(name: str, labels: Iterable[str] = ()) -> Family:
    return Family(name, "gauge", BY_NAME[name].help, tuple(labels))


def counter(name: str, labels: Iterable[str] = ()) -> Family:
    return Family(name, "counter", BY_NAME[name].help, tuple(labels))


def single(name: str, value: float, kind: str = "gauge") -> Family:
    """An unlabelled family of one sample."""
    fam = Family(name, kind, BY_NAME[name].help)
    fam.add_metric([], value)
    return fam


def per_rank(name: str) -> Family:
    """A probe family labelled ``rank`` where the process has one, unlabelled where it has none."""
    spec = BY_NAME[name]
    return Family(name, spec.kind, spec.help, (n.RANK_LABEL,), optional_labels=True)


def labelled(name: str, labels: tuple[str, ...]) -> Family:
    """A probe family with more labels; ``rank`` is left out where the process has none."""
    spec = BY_NAME[name]
    return Family(name, spec.kind, spec.help, labels, optional_labels=True)


def rank_value(rank: int | None) -> str:
    return "" if rank is None else str(rank)


def declared(*sources: str) -> tuple[MetricSpec, ...]:
    """The declarations of ``sources`` whose family is a sample field, in declaration order."""
    return tuple(m for m in CATALOG if m.source in sources and m.sample)


def fields(
    specs: Iterable[MetricSpec],
    rows: Iterable[tuple[tuple[str, ...], object]],
    *,
    optional_labels: bool = False,
) -> Iterator[Family]:
    """Each spec's family from its sample field, read on every row (label values, sample object).

    A field that is None on a row (or a key its dict lacks) leaves that series out, and a family
    without a series is left out. For ``(label value, path)`` pairs, each pair's value is a series
    with that value as the family's last label. ``optional_labels``: an empty label value is left
    out of its series (the probe's ``rank`` where a process has none).
    """
    rows = tuple(rows)
    for spec in specs:
        fam = Family(spec.name, spec.kind, spec.help, spec.labels, optional_labels)
        readers = _readers(spec)
        for labels, obj in rows:
            for label, read in readers:
                value = read(obj)
                if value is not None:
                    fam.add_metric(labels if label is None else (*labels, label), value)
        if fam.samples:
            yield fam


def read_field(obj: object, path: str) -> float | None:
    """``obj``'s value at the dotted ``path`` (attributes, or keys of a dict), None when unknown."""
    value = _reader(path)(obj)
    return None if value is None else float(value)


@functools.cache
def _readers(spec: MetricSpec) -> tuple[tuple[str | None, Reader], ...]:
    pairs = ((None, spec.sample),) if isinstance(spec.sample, str) else spec.sample
    return tuple((label, _reader(path)) for label, path in pairs)


@functools.cache
def _reader(path: str) -> Reader:
    """A reader of ``path``: attribute by attribute, or a key where the value is a dict (``gpm``)."""
    parts = tuple(path.split("."))
    if len(parts) == 1:
        return operator.attrgetter(path)

    def read(obj: object) -> float | None:
        value: Any = obj
        for part in parts:
            value = value.get(part) if type(value) is dict else getattr(value, part)
            if value is None:
                return None
        return cast(float, value)

    return read
