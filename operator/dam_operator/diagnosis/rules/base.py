"""What every rule is handed (``Context``), what it answers (``Finding``) and its shape (``Rule``).

A rule is a small pure unit: ``judge(ctx)`` reads the window and returns a ``Finding`` when its
regime or screen applies to it, else None; it never asks another rule. Each rule has its
``Stage``; the referee (``rules.decide``) asks the stages in order and, among the findings of
the first stage that has any, picks the largest loss (``Finding.loss``). The rules are listed
with their regimes in ``regimes.REGIMES`` (``regimes.RULES`` is the list the engine walks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum

from dam_operator.diagnosis import evidence as ev
from dam_operator.diagnosis.axes import Kind
from dam_operator.diagnosis.derived import Derived, positive
from dam_operator.diagnosis.evidence import Evidence
from dam_operator.diagnosis.levers import Axis, Regime
from dam_operator.diagnosis.model import Hardware, Observation, Thresholds
from dam_operator.diagnosis.ranks import SaveWait

RSS_CORROBORATES = 0.80
"""Resident memory at this share of the container limit makes a full container a real shortage."""

UNKNOWN_LEVER = "collect-more-evidence"


@dataclass
class Finding:
    """A rule's answer: the regime, the lever, a raw confidence and the evidence records."""

    regime: Regime
    lever: str
    confidence: float
    evidence: list[Evidence] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    boundary: Axis | None = None
    boundary_set: bool = False
    """``boundary`` replaces the regime's usual boundary (``model.AXES``), None included."""
    also: tuple[str, ...] | None = None
    """The other effective levers named in ``leverDetail`` (None: the regime's list)."""
    loss: float | None = None
    """The share of the window's wall time the finding's term takes (``dominance.of_window``),
    for the rules of a stage that weigh their losses (``Stage.LOSS``); None for the others."""

    def has(self, *kinds: Kind) -> bool:
        """Whether an evidence line of one of these kinds is already there."""
        return any(e.kind in kinds for e in self.evidence)

    def on(self, boundary: Axis | None, lever: str) -> None:
        """Pull ``lever``, across the ``boundary`` to another axis (Machine: the host is the cause)."""
        self.lever, self.boundary, self.boundary_set = lever, boundary, True


def unknown(evidence: list[Evidence], missing: list[str]) -> Finding:
    """No verdict: what was seen, and what is missing for one."""
    return Finding(Regime.UNKNOWN, UNKNOWN_LEVER, 0.0, evidence=evidence, missing=missing)


@dataclass(frozen=True)
class Context:
    """One window as the rules see it: the observation, the thresholds, the hardware and the
    derived figures, with the predicates several rules share."""

    obs: Observation
    t: Thresholds
    hw: Hardware | None
    d: Derived
    suspects: list[Evidence] = field(default_factory=list)
    """Screens a rule saw crossed without their term dominating the window (``rules.dominance``):
    named in the evidence of whichever finding decides."""
    save_wait: SaveWait | None = None
    """One rank saves while the others wait for it in the collectives (``ranks.save_wait``)."""

    def steps(self) -> float | None:
        """The job's steps in the window (per rank for a distributed job)."""
        o = self.obs
        return o.job_steps if o.job_steps is not None else o.steps

    def throttled(self) -> bool:
        x = self.obs.cpu_throttled_ratio
        return x is not None and x > self.t.cpu_throttled_suspect

    def contended(self) -> bool:
        """The main process waits for a CPU (run-queue delay) at least ``cpu_wait_suspect`` of the time."""
        x = self.obs.cpu_wait_ratio
        return x is not None and x >= self.t.cpu_wait_suspect

    def main_saturated(self) -> bool:
        c = self.obs.main_cpu_cores
        return c is not None and c >= self.t.main_cpu_saturated_cores

    def container_full(self) -> bool:
        x = self.obs.container_memory_ratio
        return x is not None and x >= self.t.container_memory_full

    def rss_corroborates(self) -> bool:
        o = self.obs
        if not o.container_memory_limit_bytes or (o.main_rss_bytes is None and o.worker_rss_bytes is None):
            return False
        rss = (o.main_rss_bytes or 0.0) + (o.worker_rss_bytes or 0.0)
        return rss >= RSS_CORROBORATES * o.container_memory_limit_bytes

    def loader_contended(self) -> Evidence | None:
        """Why the loader is held back by a busy node, or None.

        The workers wait for a CPU. With no workers the first lever stays more workers (they load in
        parallel, which also hides a busy node's delays); the wait is then said beside it.
        """
        o, t = self.obs, self.t
        workers_wait = o.worker_cpu_wait_ratio
        if o.worker_count and workers_wait is not None and workers_wait >= t.cpu_wait_suspect:
            return ev.loader_cpu_wait(o, t).because(": a busy node starves the loader")
        return None

    def cpu_limit_saturated(self) -> Evidence | None:
        """The training process and its loader workers use their CPU limit up (the sentence), else None."""
        o = self.obs
        limit = positive(o.cpu_limit_cores)
        if limit is None or (o.main_cpu_cores is None and o.worker_cpu_cores is None):
            return None
        used = (o.main_cpu_cores or 0.0) + (o.worker_cpu_cores or 0.0)
        share = used / limit
        if share < self.t.worker_cpu_saturated:
            return None
        text = (
            f"training process and loader workers use {used:.2f} of the {limit:.2f}-core "
            f"CPU limit ({ev.pct(share)}, saturated ≥ {ev.thr(self.t.worker_cpu_saturated)})"
        )
        return Evidence(Kind.CPU_LIMIT, text, {"cpu_cores": used, "cpu_limit_cores": limit})


class Stage(IntEnum):
    """When a rule is asked: the referee asks the stages in this order, and the first stage with a
    finding decides (the largest loss among its findings, ``rules.decide``)."""

    MEMORY = 0
    """First, over everything: a job being killed for memory is not input-bound. It outranks the
    rest, which is still walked and named ("apart from memory the window reads as ...")."""
    NO_STEP = 1
    """Before any regime: with no training step every figure below is noise."""
    FEW_STEPS = 2
    """... and with too few steps."""
    LOSS = 3
    """The terms the job loses its wall time to, weighed against each other: checkpoint saves,
    the data wait, the exposed communication. The largest loss is cut first. Before the GPU
    rules: an idle GPU is their consequence, not their cause."""
    GPU_FED = 4
    """A fed GPU (utilization at or above the starved line): memory-, latency- or compute-bound,
    in that order. Before the busy node: a GPU kept busy is not held back by the host."""
    BUSY_NODE = 5
    """The host's run queue, before the GPU-starved rule, which would read the host's wait as
    launch overhead."""
    GPU_STARVED = 6
    """A starved GPU with no data wait: launch, Python or host-sync overhead."""
    CPU_ONLY = 7
    """No GPU counters at all: the CPU does the work (or overhead dominates)."""
    LAST = 8
    """Last, always answers: a GPU is there but its utilization is not measured."""


@dataclass(frozen=True)
class Rule:
    """One regime or screen: ``judge`` answers for the window or passes (None)."""

    name: str
    judge: Callable[[Context], Finding | None]
    stage: Stage = Stage.LAST
    aside: str | None = None
    """When set, the rule outranks the rest of the list, which is still walked: its verdict is
    named in one line that starts with this ("apart from memory")."""
