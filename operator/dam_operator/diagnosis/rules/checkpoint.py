"""Checkpoint-bound (Machine, boundary Data): checkpoint saves block the training thread above
``checkpoint_suspect`` of the wall time. Its loss is that share of the wall time, which the referee
weighs against the data wait's and the exposed communication's (``Stage.LOSS``: the largest loss
is cut first). Lever ``async-checkpoint``, or ``checkpoint-less-often`` when the job saves more often than
every ``CHECKPOINT_OFTEN_STEPS`` steps.

Where one rank saves and the others wait for it in the collectives ("rank 0 saves, the others wait
at a barrier", ``ranks.save_wait``), their wait is the checkpoint's: the engine takes it out of the
exposed communication, and the evidence says how long they waited while the saver saved."""

from __future__ import annotations

from dam_operator.diagnosis import evidence as ev
from dam_operator.diagnosis.axes import Kind
from dam_operator.diagnosis.evidence import Evidence
from dam_operator.diagnosis.levers import Regime
from dam_operator.diagnosis.rules.base import Context, Finding

CHECKPOINT_OFTEN_STEPS = 10
"""A job that saves more often than every this many steps is told to save less often first
(``checkpoint-less-often``); otherwise to save asynchronously (``async-checkpoint``)."""


def checkpoint_bound(ctx: Context) -> Finding | None:
    o, t = ctx.obs, ctx.t
    x = o.checkpoint_ratio
    if x is None or x <= t.checkpoint_suspect:
        return None
    text = (
        f"checkpoint saves blocked the training thread {ev.pct(x)} of the window "
        f"(screen > {ev.thr(t.checkpoint_suspect)}): the accelerator waits while the state is written"
    )
    seen = [Evidence(Kind.CHECKPOINT, text, {"checkpoint_ratio": x})]
    conf = 0.85 if x >= 2 * t.checkpoint_suspect else 0.7
    lever = "async-checkpoint"
    saves, steps = o.checkpoints, ctx.steps()
    if saves and o.checkpoint_seconds is not None:
        each = o.checkpoint_seconds / saves
        text = f"{saves:.0f} saves in the window, {each:.2f} s each"
        numbers = {"checkpoints": saves, "seconds_each": each}
        if steps:
            every = steps / saves
            text += f", one every {every:.0f} steps"
            numbers["steps_between"] = every
            if every < CHECKPOINT_OFTEN_STEPS:
                lever = "checkpoint-less-often"
                text += f" (more often than every {CHECKPOINT_OFTEN_STEPS} steps: save less often)"
        seen.append(Evidence(Kind.CHECKPOINT, text, numbers))
    if ctx.save_wait is not None:
        seen.append(ctx.save_wait.evidence())
    if o.data_wait_ratio is not None:
        seen.append(ev.data_wait(o, t))
    if o.gpu_utilization is not None:
        seen.append(ev.gpu_utilization(o, t))
    return Finding(Regime.CHECKPOINT_BOUND, lever, conf, seen, loss=x)
