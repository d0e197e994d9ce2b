"""A cumulative counter exported so that it never goes down: a reset (a restarted cgroup, a GPU
counter that wrapped) is carried over. The CPU sampler's throttling and OOM counters and the NVML
sampler's hardware counters use it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Monotonic:
    """One cumulative counter; ``update`` returns the carried total plus the current value."""

    carried: float = 0.0
    last: float | None = None

    def update(self, value: float) -> float:
        if self.last is not None and value < self.last:
            self.carried += self.last
        self.last = value
        return self.carried + value
