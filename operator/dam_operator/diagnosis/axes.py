"""The names a verdict gives: its axis (``Axis``) and its regime (``Regime``), a fixed contract
(docs/architecture.md, DESIGN.md §2). A leaf: it imports no other module of the engine, so that
the rules, the lever catalogue, the Apply levers and the verdict's model all name them.
"""

from __future__ import annotations

from enum import StrEnum


class Axis(StrEnum):
    DATA = "Data"
    ALGORITHM = "Algorithm"
    MACHINE = "Machine"
    UNKNOWN = "Unknown"


class Regime(StrEnum):
    """The regimes a verdict names (a fixed contract: docs/architecture.md, DESIGN.md)."""

    INPUT_BOUND = "input-bound"
    MEMORY_BOUND = "memory-bound"
    COMPUTE_BOUND = "compute-bound"
    LATENCY_BOUND = "latency-bound"
    COMMUNICATION_BOUND = "communication-bound"
    MEMORY_CAPACITY = "memory-capacity"
    CHECKPOINT_BOUND = "checkpoint-bound"
    UNKNOWN = "unknown"
