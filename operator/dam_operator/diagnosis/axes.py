"""The names a verdict gives: its axis (``Axis``) and its regime (``Regime``), a fixed contract
(docs/architecture.md, DESIGN.md §2), and what each of its evidence lines is about (``Kind``).
A leaf: it imports no other module of the engine, so that the rules, the evidence, the lever
catalogue, the Apply levers and the verdict's model all name them; a new regime and the evidence
kind its rule states are one file's edit.
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


class Kind(StrEnum):
    """What an evidence line is about (a bounded set: one per figure or finding the rules state)."""

    DATA_WAIT = "data-wait"
    GPU_UTILIZATION = "gpu-utilization"
    SM_ACTIVE = "sm-active"
    DRAM_BANDWIDTH = "dram-bandwidth"
    GPU_MEMORY_BUSY = "gpu-memory-busy"
    TENSOR_ACTIVE = "tensor-active"
    ARITHMETIC_INTENSITY = "arithmetic-intensity"
    MFU = "mfu"
    MAIN_CPU = "main-cpu"
    LOADER_CPU = "loader-cpu"
    CPU_LIMIT = "cpu-limit"
    CPU_THROTTLED = "cpu-throttled"
    CPU_WAIT = "cpu-wait"
    """The main process waited for a CPU (run-queue delay)."""
    LOADER_CPU_WAIT = "loader-cpu-wait"
    """The loader workers waited for a CPU (run-queue delay)."""
    NODE_CPU = "node-cpu"
    EXPOSED_COMMUNICATION = "exposed-communication"
    COLLECTIVES = "collectives"
    INTERCONNECT = "interconnect"
    CHECKPOINT = "checkpoint"
    CONTAINER_MEMORY = "container-memory"
    RESIDENT_MEMORY = "resident-memory"
    GPU_MEMORY = "gpu-memory"
    OOM = "oom"
    LOADER_KILLED = "loader-killed"
    STEPS = "steps"
    """Too few (or no) training steps in the window."""
    SAMPLED = "sampled"
    """What a window without a training step did measure."""
    RATE = "rate"
    """The job's steps per second, with the window's sample size."""
    STRAGGLER = "straggler"
    """The straggler's line (``ranks.straggler_sentence``)."""
    HOLDING_STRAGGLER = "holding-straggler"
    """The published straggler is held while another rank's challenge is pending (hysteresis)."""
    COLLECTIVE_SKEW = "collective-skew"
    """A straggler's line: it arrives last at the collectives (a synchronous job)."""
    LATE_RANKS = "late-ranks"
    """A straggler's line: other ranks arrive about as late as it."""
    STEP_RATE = "step-rate"
    """A straggler's line: its step rate is well below its peers' (independent processes)."""
    GPU_SLOWDOWN = "gpu-slowdown"
    """A straggler's line: its GPU clocks are held down for reasons its peers do not share."""
    SM_CLOCK = "sm-clock"
    """A straggler's line: its SM clock is below its peers'."""
    NOTE = "note"
    """A reasoning step in words (what the figures mean), or a sentence from elsewhere (a status)."""
