"""Sampler errors: a counter per (sampler, reason) and a rate-limited log line."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("dam_sidecar")


class ErrorLog:
    """Counts sampler faults for ``dam_sampler_errors_total`` and logs each kind at most once per period.

    Thread-safe: samplers run in the sampling thread and in the NVML worker thread.
    """

    def __init__(
        self,
        log_interval_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        logger: logging.Logger = log,
    ) -> None:
        self._interval = log_interval_seconds
        self._clock = clock
        self._log = logger
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], int] = {}
        self._last_log: dict[tuple[str, str], float] = {}
        self._suppressed: dict[tuple[str, str], int] = {}

    def record(self, sampler: str, reason: str, message: str) -> None:
        key = (sampler, reason)
        now = self._clock()
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + 1
            last = self._last_log.get(key)
            if last is not None and now - last < self._interval:
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
                return
            self._last_log[key] = now
            suppressed = self._suppressed.pop(key, 0)
        more = f" ({suppressed} more since the last report)" if suppressed else ""
        self._log.warning("sampler=%s reason=%s %s%s", sampler, reason, message, more)

    def counts(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._counts)

    def count(self, sampler: str, reason: str) -> int:
        with self._lock:
            return self._counts.get((sampler, reason), 0)
