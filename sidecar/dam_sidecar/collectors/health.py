"""The sidecar's own health: sampler errors by reason, each sampler's duration, the tick's timestamp."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from dam_contract import names as n
from dam_sidecar.collectors.base import Tick, counter, gauge, single
from dam_sidecar.errors import ErrorLog
from dam_sidecar.exposition import Family


class HealthCollector:
    """Last in the list: it reports the durations of the collectors before it and stamps the tick."""

    sampler = ""  # nothing of its own to time

    def __init__(self, errors: ErrorLog, clock: Callable[[], float] = time.time) -> None:
        self.errors = errors
        self.clock = clock
        self.durations: tuple[tuple[str, float], ...] = ()
        self.timestamp_seconds = 0.0  # 0: no tick yet

    def sample(self, tick: Tick) -> None:
        tick.timestamp_seconds = self.clock()
        self.durations = tuple(tick.durations)
        self.timestamp_seconds = tick.timestamp_seconds

    def fallback(self, tick: Tick) -> None:
        return None

    def close(self) -> None:
        return None

    def collect(self) -> Iterator[Family]:
        errors = counter(n.SAMPLER_ERRORS_TOTAL, ("sampler", "reason"))
        for (sampler, reason), count in sorted(self.errors.counts().items()):
            errors.add_metric([sampler, reason], count)
        yield errors
        durations = gauge(n.SAMPLER_DURATION_SECONDS, ("sampler",))
        for sampler, seconds in self.durations:
            durations.add_metric([sampler], seconds)
        yield durations
        if self.timestamp_seconds > 0:
            yield single(n.SNAPSHOT_TIMESTAMP_SECONDS, self.timestamp_seconds)
