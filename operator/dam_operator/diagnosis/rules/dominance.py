"""The regime by the dominant term (DESIGN.md §1, the iron law): a crossed screen makes a suspect,
the verdict is the term that dominates the window.

The terms a rule weighs are shares of one base, the window's wall time: the data wait and the
exposed communication are shares of the step time, the checkpoint saves of the wall time (the
heaviest saver's), so the first two are scaled by the share of the window the steps cover
(``step_cover``; 1 for a loop that runs the whole window) before they are compared with the
saves or with each other's rest.

A data wait or an exposed communication over its screen but under ``CONFIDENT_SCREENS`` times it,
beside a rest of the window (compute, once the data wait, the exposed communication and the saves
are out; with the GPU's utilization measured, at most the GPU's busy time) at least
``REST_DOMINANCE`` times as large, is a suspect: the rule passes and the finding
that decides names it (``Context.suspects``).
"""

from __future__ import annotations

from dam_operator.diagnosis import evidence as ev
from dam_operator.diagnosis.axes import Kind
from dam_operator.diagnosis.evidence import Evidence
from dam_operator.diagnosis.rules.base import Context

CONFIDENT_SCREENS = 2.0
"""A term at least this many times its screen is the verdict whatever else the step holds."""
REST_DOMINANCE = 4.0
"""Below that, the rest of the window at least this many times the term dominates it: the crossed
screen is a suspect, not the verdict (issue 28: 10.6 % exposed communication beside 85 % compute
on a saturated host read as communication-bound in 2 of 3 runs)."""


def step_cover(ctx: Context) -> float:
    """The share of the window's wall time one rank's steps cover (at most 1; 1 when unknown)."""
    o = ctx.obs
    steps = ctx.steps()
    if not o.window_seconds or not o.mean_step_seconds or not steps:
        return 1.0
    return min(1.0, o.mean_step_seconds * steps / o.window_seconds)


def of_window(ctx: Context, step_ratio: float | None) -> float:
    """A share of the step time as a share of the window's wall time."""
    return (step_ratio or 0.0) * step_cover(ctx)


def rest_of_window(ctx: Context) -> float:
    """The window less the data wait, the exposed communication and the checkpoint saves."""
    o = ctx.obs
    lost = of_window(ctx, o.data_wait_ratio) + of_window(ctx, o.exposed_communication_ratio)
    return max(0.0, 1.0 - lost - (o.checkpoint_ratio or 0.0))


def dominant_rest(ctx: Context) -> tuple[float, str]:
    """The term a crossed screen is weighed against, and its name: the rest of the window, or,
    with the GPU's utilization measured, the GPU's busy time when that is less (the iron law's
    compute term: a GPU that idles is not dominated by compute)."""
    rest = rest_of_window(ctx)
    u = ctx.obs.gpu_utilization
    if u is not None and of_window(ctx, u) < rest:
        return of_window(ctx, u), "the GPU's busy time"
    return rest, "the rest of the window"


def named_suspect(ctx: Context, x: float, *, screen: float, kind: Kind, what: str, key: str) -> bool:
    """Whether ``what`` (``x`` of the step, over its ``screen``) is a suspect, not the verdict: under
    ``CONFIDENT_SCREENS`` screens, and the rest of the window ``REST_DOMINANCE`` times it or more.
    A suspect is added to ``ctx.suspects`` (once)."""
    if x >= CONFIDENT_SCREENS * screen:
        return False
    (rest, name), share = dominant_rest(ctx), of_window(ctx, x)
    if rest < REST_DOMINANCE * share:
        return False
    text = (
        f"{what} {ev.pct(x)} of the step crossed its screen ({ev.pct(screen)}) "
        f"but {name} ({ev.pct(rest)}) dominates it: a suspect, not the bottleneck"
    )
    if all(e.sentence != text for e in ctx.suspects):
        ctx.suspects.append(Evidence(kind, text, {key: x, "rest_ratio": rest}))
    return True
