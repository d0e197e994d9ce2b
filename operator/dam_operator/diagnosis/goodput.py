"""Goodput over a job's life from the probes' cumulative counters (``status.goodput``'s shape).

Each training process's probe counts from the process's start its productive step time
(``dam_goodput_seconds_total``) and the time it lost by cause (``dam_badput_seconds_total{cause}``:
``startup``, ``data-wait``, ``communication``, ``checkpoint``, ``other``); ``other`` is the rest
of its elapsed time, so one process's series add up to its elapsed time. One snapshot is enough:
the counters are cumulative.

Units: the figures are summed over the processes (``rank`` label) and divided by their number,
so a job of eight ranks that trained an hour reads about 3,600 s, not 28,800 s.
``acceleratorSecondsLost`` is the badput times the job's accelerators (the GPUs its sidecar
attributes to it): 0 for a CPU-only job, absent when the accelerators are unknown.
``restart`` is the cluster's (the operator adds it); a local run has none.

Unknown is not zero: a cause the probes could not measure in every process of the job (collectives
not timed in a distributed process, saves not timed: its series is absent) is absent from
``badputSeconds`` and from ``measured``, and ``ratioUpperBound`` says the ratio may be lower (the
time it lost counts as productive or other).

Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections import defaultdict

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from dam_contract import names
from dam_contract.snapshot import Snapshot

CAUSE_FIELDS: dict[str, str] = {
    names.CAUSE_STARTUP: "startup",
    names.CAUSE_DATA_WAIT: "data_wait",
    names.CAUSE_COMMUNICATION: "communication",
    names.CAUSE_CHECKPOINT: "checkpoint",
    names.CAUSE_OTHER: "other",
}
"""``cause`` label value → ``BadputSeconds`` field."""


class _Wire(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


Seconds = float


class BadputSeconds(_Wire):
    """``status.goodput.badputSeconds``: time lost by cause, seconds; None: not measured (absent)."""

    startup: Seconds | None = Field(default=0.0, ge=0.0)
    data_wait: Seconds | None = Field(default=0.0, ge=0.0)
    communication: Seconds | None = Field(default=0.0, ge=0.0)
    checkpoint: Seconds | None = Field(default=0.0, ge=0.0)
    restart: Seconds | None = Field(default=0.0, ge=0.0)
    other: Seconds | None = Field(default=0.0, ge=0.0)

    def total(self) -> float:
        return math.fsum(v for _, v in self.items())

    def items(self) -> list[tuple[str, float]]:
        """``(field name, seconds)`` of the measured causes, in display order."""
        order = ("startup", "data_wait", "communication", "checkpoint", "restart", "other")
        return [(k, v) for k in order if (v := getattr(self, k)) is not None]


class Goodput(_Wire):
    """``status.goodput``: over the job's life so far."""

    ratio: float = Field(ge=0.0, le=1.0)
    """Productive step time / elapsed time."""
    elapsed_seconds: Seconds = Field(ge=0.0)
    productive_seconds: Seconds = Field(ge=0.0)
    badput_seconds: BadputSeconds
    accelerator_seconds_lost: Seconds | None = Field(default=None, ge=0.0)
    measured: list[str] | None = None
    """The causes measured in every process (``badputSeconds`` keys); the others are absent."""
    ratio_upper_bound: bool | None = None
    """True when a cause could not be measured: the ratio may be lower."""


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) and v >= 0 else None


def accelerators_of(snapshot: Snapshot, *, local: bool = False) -> int | None:
    """The GPUs a sidecar (or ``dam run``) attributes to the job: ``dam_gpu_info`` series; 0 when
    NVML answers and none is the job's; None when unknown. ``local``: on ``dam run``'s own machine
    NVML not answering means no NVIDIA driver, so no GPU (0)."""
    gpus = {s.label("uuid") or s.label("gpu") for s in snapshot.samples(names.GPU_INFO)}
    if gpus:
        return len(gpus)
    up = [s.value for s in snapshot.samples(names.NVML_UP)]
    if (up and up[0] == 1.0) or local:
        return 0
    return None


def goodput_of(snapshot: Snapshot, accelerators: int | None = None) -> Goodput | None:
    """The goodput of the processes in ``snapshot``; None when no probe accounts for it.

    ``accelerators``: the job's accelerators (GPUs), None when unknown.
    """
    productive: dict[str, float] = {}
    for s in snapshot.samples(names.GOODPUT_SECONDS_TOTAL):
        v = _finite(s.value)
        if v is not None:
            productive[s.label(names.RANK_LABEL)] = productive.get(s.label(names.RANK_LABEL), 0.0) + v
    if not productive:
        return None
    lost: dict[str, float] = defaultdict(float)
    seen: dict[str, set[str]] = defaultdict(set)  # field -> the processes that measured it
    for s in snapshot.samples(names.BADPUT_SECONDS_TOTAL):
        field = CAUSE_FIELDS.get(s.label(names.CAUSE_LABEL))
        v = _finite(s.value)
        if field is not None and v is not None and s.label(names.RANK_LABEL) in productive:
            lost[field] += v
            seen[field].add(s.label(names.RANK_LABEL))
    processes = len(productive)
    measured = {f for f in CAUSE_FIELDS.values() if seen[f] >= productive.keys()}
    badput = BadputSeconds(
        restart=0.0, **{f: (lost[f] / processes if f in measured else None) for f in CAUSE_FIELDS.values()}
    )
    good = math.fsum(productive.values()) / processes
    elapsed = good + badput.total()
    lost_total = badput.total()
    return Goodput(
        ratio=min(1.0, good / elapsed) if elapsed > 0 else 0.0,
        elapsed_seconds=elapsed,
        productive_seconds=good,
        badput_seconds=badput,
        accelerator_seconds_lost=None if accelerators is None else lost_total * accelerators,
        measured=[
            _camel(f)
            for f in ("startup", "data_wait", "communication", "checkpoint", "other")
            if f in measured
        ],
        ratio_upper_bound=len(measured) < len(CAUSE_FIELDS),
    )


def _camel(field: str) -> str:
    return to_camel(field)
