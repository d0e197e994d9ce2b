"""The sidecar's own health: sampler errors by reason, each sampler's duration, the tick's timestamp."""

from __future__ import annotations

from collections.abc import Iterator

from dam_contract import names as n
from dam_sidecar.collectors.base import Feed, TickRecord, counter, gauge, single
from dam_sidecar.errors import ErrorLog
from dam_sidecar.exposition import Family


class HealthCollector:
    """Reports the tick itself, wherever it stands in the list: it ``observe``s the tick's record
    (each sampler's duration, the end of sampling) after every collector sampled."""

    sampler = ""  # nothing of its own to time
    feeds: tuple[Feed, ...] = ()

    def __init__(self, errors: ErrorLog) -> None:
        self.errors = errors
        self.record = TickRecord()

    def sample(self) -> None:
        return None

    def fallback(self) -> None:
        return None

    def observe(self, record: TickRecord) -> None:
        self.record = record

    def close(self) -> None:
        return None

    def collect(self) -> Iterator[Family]:
        errors = counter(n.SAMPLER_ERRORS_TOTAL, ("sampler", "reason"))
        for (sampler, reason), count in sorted(self.errors.counts().items()):
            errors.add_metric([sampler, reason], count)
        yield errors
        durations = gauge(n.SAMPLER_DURATION_SECONDS, ("sampler",))
        for sampler, seconds in self.record.durations:
            durations.add_metric([sampler], seconds)
        yield durations
        if self.record.timestamp_seconds > 0:
            yield single(n.SNAPSHOT_TIMESTAMP_SECONDS, self.record.timestamp_seconds)
