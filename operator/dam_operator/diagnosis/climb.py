"""What applying a lever means, for ``dam tune`` and the operator's Apply mode alike (pure).

An **Apply lever** (``ApplyLever``; the table is ``levers.APPLY``) is one setting of the job
that a program can change without a code change, with everything both loops need to know:

- the **setting** (``num_workers``, ``prefetch_factor``, ``pin_memory``, ``cpu``) and how its
  value is written (``Kind``);
- how it is **applied** (``Channel``): the probe's DataLoader overrides
  (``DAM_LOADER_OVERRIDES``, for ``dam tune``'s child and for a pod through the webhook), or the
  training container's CPU limit (the webhook's patch, or an in-place resize) — the cluster only;
- its **ladder**: the next value from the current one and the **bound** (``Bounds``: the CPUs
  a loader may use, ``spec.actions.maxWorkers`` / ``maxPrefetchFactor`` / ``maxCpu``, or
  ``dam tune``'s own caps);
- what it **needs** to be worth trying (``prefetch_factor`` needs workers, ``pin_memory`` a GPU),
  the **regimes** whose verdict may pull it, and the lever whose climb follows when its own stops
  (``then``);
- how an **outcome is judged** (``judge``: steps/s against the noise).

``next_value`` is the one climb: from the best value so far one rung up; after a step that
gained nothing the climb of that setting is over, except for the steps the lever names in
``not_final``. ``dam tune`` calls it after each trial; the operator, which keeps no trial
history but blocks a setting for the profile's generation once a change of it was not kept,
calls it with no last step.

Values are integers: counts, ``True``/``False`` for a switch (``bool`` is an ``int``) and
millicores for a CPU limit, so that both loops carry them unconverted.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final, Literal

from dam_operator.diagnosis.axes import Regime
from dam_operator.diagnosis.observation import Observation
from dam_probe.overrides import MAX_PREFETCH, MAX_WORKERS

__all__ = [
    "IMPROVED",
    "NO_CHANGE",
    "WORSE",
    "ApplyLever",
    "Bounds",
    "Channel",
    "Facts",
    "Judgement",
    "Judging",
    "Kind",
    "Rate",
    "Tried",
    "judge",
    "next_value",
    "parse",
    "render",
]

IMPROVED: Final = "improved"
NO_CHANGE: Final = "no-change"
WORSE: Final = "worse"
Judged = Literal["improved", "no-change", "worse"]
MIN_CPU_STEP: Final = 1.05
"""A CPU raise smaller than 5 % is not worth a pod restart."""


class Channel(StrEnum):
    """How a setting reaches the training process."""

    LOADER = "loader"
    """``DAM_LOADER_OVERRIDES``: the probe sets it when the DataLoader is built."""
    POD_CPU = "pod-cpu"
    """The training container's CPU limit (and request): a pod resource, cluster only."""


class Kind(StrEnum):
    """How a value is written in ``status.actions[].setting`` (``render`` / ``parse``)."""

    COUNT = "count"
    SWITCH = "switch"
    MILLICORES = "millicores"


@dataclass(frozen=True)
class Bounds:
    """What the caller knows of the job's limits; a ladder never climbs past them."""

    cpus_per_loader: int | None = None
    """CPUs one DataLoader's workers may use (None: unknown, no CPU bound)."""
    max_workers: int = MAX_WORKERS
    max_prefetch_factor: int = MAX_PREFETCH
    max_cpu_millicores: int | None = None
    """Cap of a CPU raise (``spec.actions.maxCpu``); None: the CPU is never raised."""


@dataclass(frozen=True)
class Facts:
    """What a lever's precondition may look at: each setting's current value, the GPUs."""

    values: Mapping[str, int | None]
    gpus: int = 0


Ladder = Callable[[int, int | None], int | None]


@dataclass(frozen=True)
class Rate:
    """A measured step rate and, when known, the standard error of its mean."""

    steps_per_second: float
    standard_error: float | None = None


@dataclass(frozen=True)
class Judging:
    """The rule a change is judged by; each loop brings its own figures.

    ``margin``: relative noise margin (Apply mode's ``noiseMargin``): improved only when
    after ≥ before × (1 + margin), worse only when after ≤ before × (1 − margin).
    ``sigmas``: the gain must exceed this many standard errors of the difference of the two
    means (``dam tune``). ``min_gain``: and this share of before.
    """

    margin: float = 0.0
    sigmas: float = 0.0
    min_gain: float = 0.0


@dataclass(frozen=True)
class Judgement:
    outcome: Judged
    gain: float
    """after − before, steps/s."""
    noise: float
    """``sigmas`` × the standard error of the difference (0 when unknown), steps/s."""
    reason: Literal["beyond-noise", "slower", "within-noise", "below-min-gain"]


def judge(before: Rate, after: Rate, rule: Judging) -> Judgement:
    """improved / no-change / worse on steps/s: beyond the noise, within it, or slower."""
    b, a = before.steps_per_second, after.steps_per_second
    gain = a - b
    noise = rule.sigmas * math.sqrt((after.standard_error or 0.0) ** 2 + (before.standard_error or 0.0) ** 2)
    if a >= b * (1.0 + rule.margin) and gain > noise and gain > rule.min_gain * b:
        return Judgement(IMPROVED, gain, noise, "beyond-noise")
    if a <= b * (1.0 - rule.margin) and gain < -noise:
        return Judgement(WORSE, gain, noise, "slower")
    return Judgement(NO_CHANGE, gain, noise, "within-noise" if gain <= noise else "below-min-gain")


def always(_facts: Facts) -> bool:
    return True


@dataclass(frozen=True)
class ApplyLever:
    """One entry of the Apply lever table (see the module doc)."""

    id: str
    setting: str
    channel: Channel
    kind: Kind
    ladder: Ladder
    bound: Callable[[Bounds], int | None]
    default: int | None = None
    """The value when the job does not say (torch's default); None: unknown."""
    observe: Callable[[Sequence[Observation]], int | None] | None = None
    """The value the pods run with, read from a window's per-pod observations: the setting as the
    probe reports it (None: not reported). What Apply checks a change took effect by."""
    estimate: Callable[[Sequence[Observation]], int | None] | None = None
    """A guess of the value where the pods do not report it (the worker processes seen): a climb
    may start from it, a change is never judged by it."""
    needs: Callable[[Facts], bool] = always
    needs_text: str = ""
    regimes: frozenset[Regime] = field(kw_only=True)
    """The regimes whose verdict may pull it (``levers.applicable``)."""
    then: str | None = None
    """The lever whose climb follows when this one's stops (a verdict names the first)."""
    not_final: tuple[tuple[int, int], ...] = ()
    """(best, tried) steps that gained nothing and still lead one rung further."""
    judge: Callable[[Rate, Rate, Judging], Judgement] = judge


@dataclass(frozen=True)
class Tried:
    """The last value tried of a setting, and whether it was kept."""

    value: int
    kept: bool


def next_value(lever: ApplyLever, best: int, bound: int | None, last: Tried | None = None) -> int | None:
    """The climb's next value of ``lever``'s setting, or None when its climb is over.

    From the best value so far, one rung up. After a step that gained nothing the climb stops,
    except for the lever's ``not_final`` steps (one DataLoader worker only moves loading out
    of the training process; two parallelise it), which go one rung further.
    """
    if last is None or last.kept:
        return lever.ladder(best, bound)
    if (best, last.value) in lever.not_final:
        return lever.ladder(last.value, bound)
    return None


# --- ladders ------------------------------------------------------------------------------------


def powers_of_two(value: int, bound: int | None) -> int | None:
    """0 → 1 → 2 → 4 → …, capped at ``bound``; the bound itself between two rungs (6: 4 → 6)."""
    rung = 1 << value.bit_length()
    if bound is None or rung <= bound:
        return rung
    return bound if bound > value else None


def doubling(value: int, bound: int | None) -> int | None:
    """2 → 4 → 8 → …, capped at ``bound``."""
    rung = 2 * value if bound is None else min(2 * value, bound)
    return rung if rung > value else None


def switch_on(value: int, _bound: int | None) -> int | None:
    """false → true, once."""
    return None if value else True


def double_cpu(millicores: int, bound: int | None) -> int | None:
    """Double the CPU limit, capped at ``bound`` (never without one), by at least ``MIN_CPU_STEP``."""
    if bound is None:
        return None
    target = min(2 * millicores, bound)
    return None if target < millicores * MIN_CPU_STEP else target


# --- bounds, preconditions and what the pods report ---------------------------------------------


def workers_bound(b: Bounds) -> int:
    return b.max_workers if b.cpus_per_loader is None else min(b.max_workers, b.cpus_per_loader)


def prefetch_bound(b: Bounds) -> int:
    return b.max_prefetch_factor


def cpu_raise_bound(b: Bounds) -> int | None:
    return b.max_cpu_millicores


def no_bound(_b: Bounds) -> None:
    return None


def has_gpu(facts: Facts) -> bool:
    return facts.gpus > 0


def _fewest(values: Sequence[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return min(known) if known else None


def loader_workers(obs: Sequence[Observation]) -> int | None:
    """num_workers as the probes read it from the loader (fewest over the pods; None: not reported).
    Not the worker processes alive: non-persistent workers are gone between epochs."""
    return _fewest([o.loader_num_workers for o in obs])


def worker_processes_per_rank(obs: Sequence[Observation]) -> int | None:
    """The pods' worker processes per rank (fewest over the pods): num_workers where the probe does
    not report it (an older probe), at an instant the workers are alive."""
    per_loader = [round(o.worker_count / max(1, o.ranks or 1)) for o in obs if o.worker_count is not None]
    return min(per_loader) if per_loader else None


def loader_prefetch(obs: Sequence[Observation]) -> int | None:
    """prefetch_factor as the probes read it (lowest; None: not reported, or no workers)."""
    return _fewest([o.loader_prefetch_factor for o in obs])


def loader_pin_memory(obs: Sequence[Observation]) -> int | None:
    """Whether the pods' loaders pin their batches (False when any does not; None: not reported)."""
    return _fewest([None if o.loader_pin_memory is None else int(o.loader_pin_memory) for o in obs])


def cpu_limit_cores(obs: Sequence[Observation]) -> float | None:
    """The lowest CPU limit of the pods, cores (None: none has one)."""
    limits = [o.cpu_limit_cores for o in obs if o.cpu_limit_cores]
    return min(limits) if limits else None


def cpu_limit_millicores(obs: Sequence[Observation]) -> int | None:
    cores = cpu_limit_cores(obs)
    return None if cores is None else max(1, round(cores * 1000))


# --- values as status.actions writes them -------------------------------------------------------


def render(kind: Kind, value: int) -> str:
    """``4``, ``true``/``false``, or a CPU quantity (``4``, ``1500m``)."""
    if kind is Kind.SWITCH:
        return "true" if value else "false"
    if kind is Kind.MILLICORES:
        return str(value // 1000) if value % 1000 == 0 else f"{value}m"
    return str(value)


def parse(kind: Kind, text: str) -> int | None:
    """The value ``render`` wrote (None when the text is not one)."""
    if kind is Kind.SWITCH:
        return {"true": True, "false": False}.get(text)
    try:
        if kind is Kind.MILLICORES:
            return int(text[:-1]) if text.endswith("m") else int(text) * 1000
        return int(text)
    except ValueError:
        return None
