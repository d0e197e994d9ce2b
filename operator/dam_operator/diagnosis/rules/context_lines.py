"""The lines every verdict carries, whichever rule found it: the figures a reader wants beside any
verdict (throttling, a busy node, exposed communication, a nearly full container, MFU, the rate),
each said once: a line is added only when the finding has none of its kind."""

from __future__ import annotations

from dam_operator.diagnosis import evidence as ev
from dam_operator.diagnosis.axes import Kind
from dam_operator.diagnosis.levers import Regime
from dam_operator.diagnosis.rules.base import Context, Finding


def add_context_lines(ctx: Context, f: Finding) -> None:
    o, t, d = ctx.obs, ctx.t, ctx.d
    if o.batch_size == 1:
        f.evidence.append(
            ev.note(
                "batch size 1: launch overhead and latency may dominate; confirm before blaming the algorithm"
            )
        )
    if ctx.throttled() and not f.has(Kind.CPU_THROTTLED):
        f.evidence.append(ev.cpu_throttled(o, t))
    if ctx.contended() and not f.has(Kind.CPU_WAIT, Kind.LOADER_CPU_WAIT):
        f.evidence.append(ev.cpu_wait(o, t))
    if o.exposed_communication_ratio is not None and not f.has(Kind.EXPOSED_COMMUNICATION):
        f.evidence.append(ev.exposed_communication(o, t))
    if ctx.container_full() and not f.has(Kind.CONTAINER_MEMORY):
        f.evidence.append(ev.container_memory(o, t).because(": an OOM kill may follow"))
    if d.mfu is not None and not f.has(Kind.MFU):
        f.evidence.append(ev.mfu(d.mfu, t))
        if d.mfu > 1.0:
            f.evidence.append(ev.note("MFU above 100%: check flops_per_step and the peak FLOP/s"))
    if o.flops_per_step is None and o.flops_unavailable:
        f.evidence.append(ev.note(f"FLOPs unavailable: {o.flops_unavailable}"))
    if d.steps_per_second is not None:
        f.evidence.append(
            ev.rate(d.steps_per_second, ctx.steps(), o.window_seconds, each_rank=o.job_steps is not None)
        )
    if o.steps is None and f.regime is not Regime.UNKNOWN:
        f.confidence -= 0.05
        f.missing.append("steps")
