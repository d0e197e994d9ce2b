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
``restart`` (``restarts_of``): in the cluster the operator adds the container restarts and Failed
pods' replacements; ``dam run`` adds the restarts inside its one command (``torchrun
--max-restarts``, a retry loop of ranked processes) from every process's life (``ProcessLife``).

One cause per second, across ranks (``behind_saves``): in a synchronous job the ranks that saved
less than the slowest saver wait for it in their next collective, so that wait is ``checkpoint``,
not ``communication`` (rank 0 saving for all while rank 1 waits at a barrier: both lost the save).

Unknown is not zero: a cause the probes could not measure in every process of the job (collectives
not timed in a distributed process, saves not timed: its series is absent) is absent from
``badputSeconds`` and from ``measured``, and ``ratioUpperBound`` says the ratio may be lower (the
time it lost counts as productive or other).

Pure: no I/O, no clock.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

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
    restarts: int | None = None
    """Restarts inside the command (``dam run``: torchrun restarting its workers, a retry loop)."""


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


@dataclass(frozen=True)
class ProcessLife:
    """One training process's life as its probe last published it (``dam run`` keeps them all)."""

    rank: int | None
    start_seconds: float
    """The process's start, Unix seconds."""
    end_seconds: float
    """Its last publish, Unix seconds: for a process that died, about when it died."""
    startup_seconds: float
    productive_seconds: float
    steps: int
    steps_since_checkpoint: int | None
    """Steps since its latest save (every step when it saved none); None: saves not timed."""
    saved: bool


@dataclass(frozen=True)
class Restarts:
    """What restarts inside one command cost, in process-seconds (summed over processes)."""

    count: int = 0
    restart_seconds: float = 0.0
    """Downtime, the restarted processes' startup and the progress they redid."""
    startup_seconds: float = 0.0
    """The restarted processes' startup (moved from ``startup`` to ``restart``)."""
    lost_seconds: float = 0.0
    """Productive seconds the dead processes did since the job's checkpoint (moved to ``restart``)."""


def _attempts(lives: Iterable[ProcessLife]) -> dict[int, list[ProcessLife]]:
    """Each rank's processes one after another, by start (processes of a rank that overlap in time
    are not restarts of one another). Processes without a rank are none: one unranked program
    after another (``prep.py && train.py``) cannot be told from a retry."""
    by_rank: dict[int, list[ProcessLife]] = defaultdict(list)
    for life in sorted(lives, key=lambda x: x.start_seconds):
        if life.rank is None:
            continue
        chain = by_rank[life.rank]
        if not chain or life.start_seconds >= chain[-1].end_seconds:
            chain.append(life)
    return by_rank


def _job_since(lives: Sequence[ProcessLife]) -> float | None:
    """Steps since the checkpoint an attempt's processes resume from: the oldest latest save of the
    processes that saved (rank 0 saving for all: its own); None when none saved."""
    found = [x.steps_since_checkpoint for x in lives if x.saved and x.steps_since_checkpoint is not None]
    return float(max(found)) if found else None


def restarts_of(lives: Iterable[ProcessLife]) -> Restarts:
    """Restarts of a rank inside one command (``torchrun --max-restarts``, a retry loop of ranked
    processes): each process that takes the place of an ended one of the same rank restarts it.
    Its cost, per process: the downtime (the old process's last publish to the new one's start),
    the new process's startup, and the dead process's productive time since the job's checkpoint
    (``_job_since`` over the processes of the same attempt), which the new one redoes (none when
    its saves are not timed). A surviving rank's time between a
    peer's failure and its own end keeps the cause its probe gave it (torchrun stops it within
    about its monitor interval)."""
    chains = _attempts(lives)
    attempts: dict[int, list[ProcessLife]] = defaultdict(list)
    for chain in chains.values():
        for i, life in enumerate(chain):
            attempts[i].append(life)
    since = {i: _job_since(group) for i, group in attempts.items()}
    count, restart, startup, lost = 0, 0.0, 0.0, 0.0
    for chain in chains.values():
        for i, (old, new) in enumerate(itertools.pairwise(chain)):
            steps = since[i] if since[i] is not None else old.steps_since_checkpoint
            per_step = old.productive_seconds / old.steps if old.steps else 0.0
            redone = min(old.productive_seconds, (steps or 0) * per_step)
            count += 1
            startup += new.startup_seconds
            lost += redone
            restart += max(0.0, new.start_seconds - old.end_seconds) + new.startup_seconds + redone
    return Restarts(len(attempts) - 1 if count else 0, restart, startup, lost)


def behind_saves(lost: dict[str, dict[str, float]]) -> None:
    """A rank's wait behind a slower peer's save is checkpoint (``behind_saves`` in the module
    docstring; the cluster's ledger applies it to each window's increments): per rank, up to its
    communication, the slowest saver's checkpoint less its own moves from communication to
    checkpoint. In place; ``lost``: rank → field → seconds."""
    saves = [figures["checkpoint"] for figures in lost.values() if "checkpoint" in figures]
    if len(saves) < 2 or any("communication" not in f or "checkpoint" not in f for f in lost.values()):
        return
    slowest = max(saves)
    for figures in lost.values():
        moved = min(figures["communication"], max(0.0, slowest - figures["checkpoint"]))
        figures["communication"] -= moved
        figures["checkpoint"] += moved


def goodput_of(
    snapshot: Snapshot, accelerators: int | None = None, lives: Iterable[ProcessLife] | None = None
) -> Goodput | None:
    """The goodput of the processes in ``snapshot``; None when no probe accounts for it.

    ``accelerators``: the job's accelerators (GPUs), None when unknown. ``lives``: every process
    the run saw (``dam run``): restarts inside it cost ``restart`` (``restarts_of``); None: not
    known (``dam evaluate``'s two snapshots), no ``restarts`` field.
    """
    productive: dict[str, float] = {}
    for s in snapshot.samples(names.GOODPUT_SECONDS_TOTAL):
        v = _finite(s.value)
        if v is not None:
            productive[s.label(names.RANK_LABEL)] = productive.get(s.label(names.RANK_LABEL), 0.0) + v
    if not productive:
        return None
    by_rank: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for s in snapshot.samples(names.BADPUT_SECONDS_TOTAL):
        field = CAUSE_FIELDS.get(s.label(names.CAUSE_LABEL))
        v = _finite(s.value)
        if field is not None and v is not None and s.label(names.RANK_LABEL) in productive:
            by_rank[s.label(names.RANK_LABEL)][field] += v
    behind_saves(by_rank)
    lost: dict[str, float] = defaultdict(float)
    seen: dict[str, set[str]] = defaultdict(set)  # field -> the processes that measured it
    for rank, figures in by_rank.items():
        for field, v in figures.items():
            lost[field] += v
            seen[field].add(rank)
    processes = len(productive)
    measured = {f for f in CAUSE_FIELDS.values() if seen[f] >= productive.keys()}
    restarts = restarts_of(lives or ())
    if "startup" in measured:
        lost["startup"] = max(0.0, lost["startup"] - restarts.startup_seconds)
    badput = BadputSeconds(
        restart=restarts.restart_seconds / processes,
        **{f: (lost[f] / processes if f in measured else None) for f in CAUSE_FIELDS.values()},
    )
    good = max(0.0, math.fsum(productive.values()) - restarts.lost_seconds) / processes
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
        restarts=None if lives is None else restarts.count,
    )


def _camel(field: str) -> str:
    return to_camel(field)
