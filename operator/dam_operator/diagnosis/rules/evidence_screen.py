"""Enough evidence? No training step, too few steps, or nothing measured: no verdict (``unknown``)."""

from __future__ import annotations

from dam_operator.diagnosis.axes import Kind
from dam_operator.diagnosis.evidence import Evidence, pct
from dam_operator.diagnosis.rules.base import Context, Finding, unknown


def sampled(ctx: Context) -> Evidence:
    """What the window did measure, in words (for a window without a training step)."""
    o, d = ctx.obs, ctx.d
    parts: list[str] = []
    if o.main_cpu_cores is not None:
        parts.append(f"the main process used {o.main_cpu_cores:.2f} CPU cores")
    if o.gpu_utilization is not None:
        parts.append(f"GPU utilization {pct(o.gpu_utilization)}")
    elif d.gpu_signals:
        parts.append("GPU counters")
    elif o.gpu_count == 0:
        parts.append("no GPU is the job's (a CPU-only job)")
    if o.node_cpu_utilization is not None:
        parts.append(f"node CPU {pct(o.node_cpu_utilization)} busy")
    if o.container_memory_ratio is not None:
        parts.append(f"container memory {pct(o.container_memory_ratio)} of its limit")
    if not parts:
        return Evidence(
            Kind.SAMPLED,
            "nothing else was sampled: the training process is found through its probe file, "
            "which it writes from its first batch on",
        )
    return Evidence(Kind.SAMPLED, "sampled in the window: " + ", ".join(parts))


NOT_STARTED = (
    "no training step was seen in the window: the job has not reached its first step yet (it is "
    "starting: pulling its image, importing, loading its data or a checkpoint), or it ended before it"
)
"""The window of a training process not seen at all (``not_started``)."""


def not_started(ctx: Context) -> bool:
    """No figure of the training process itself (no data wait, no CPU of its main process), and the
    caller does not say the job is past its start-up (``Observation.starting`` not False).

    The sidecar and ``dam run`` find the training process through its probe file, which the probe
    writes from the process's first batch on: a Pod that is still starting (imports, loading) and a
    loop that iterates no DataLoader read the same. The caller tells them apart by time: a Pod past
    its first minutes, or a ``dam run`` command that ended, gets the custom-loop answer of
    ``no_step``; a job that may still be starting is told its first step is still to come, and
    nothing says that the code needs a change."""
    o = ctx.obs
    return o.data_wait_ratio is None and o.main_cpu_cores is None and o.starting is not False


def no_step(ctx: Context) -> Finding | None:
    """No batch was delivered. Not started (``not_started``: a Pod still starting): say the first
    step is still to come. Else the command never iterated a DataLoader (a custom loop, or it exited
    or failed before its first step): say so, and how to measure a custom loop."""
    o = ctx.obs
    steps = ctx.steps()
    nothing = o.data_wait_ratio is None and not ctx.d.gpu_signals and o.main_cpu_cores is None
    if not (steps == 0 or (steps is None and nothing)):
        return None
    if not_started(ctx):
        return unknown(
            [Evidence(Kind.STEPS, NOT_STARTED, {"steps": 0.0} if steps == 0 else {}), sampled(ctx)],
            [
                "steps: the first verdict comes with the first window after the job's first batch "
                "(docs/troubleshooting.md, Verdict unknown, says what to check if it never comes)"
            ],
        )
    seen = Evidence(
        Kind.STEPS,
        "no training step was seen in the window: no DataLoader was iterated (a custom "
        "training loop, or the command exited before its first step)",
        {"steps": 0.0} if steps == 0 else {},
    )
    return unknown(
        [seen, sampled(ctx)],
        [
            "steps: a custom loop is measured by wrapping its batches, "
            "`for batch in dam_probe.instrument(batches):` (docs/probe.md, Explicit API)",
            "dataWaitRatio",
        ],
    )


def too_few_steps(ctx: Context) -> Finding | None:
    """Fewer than ``min_steps`` steps (per rank for a distributed job), or no signal at all."""
    o, t = ctx.obs, ctx.t
    steps = ctx.steps()
    if steps is not None and steps < t.min_steps:
        per_rank = " per rank" if o.job_steps is not None else ""
        line = f"only {steps:.0f} steps{per_rank} in the window (need at least {t.min_steps})"
        return unknown(
            [Evidence(Kind.STEPS, line, {"steps": steps})],
            [f"steps (at least {t.min_steps} per window; a longer window or a running job)"],
        )
    if o.data_wait_ratio is None and not ctx.d.gpu_signals and o.main_cpu_cores is None:
        return unknown(
            [Evidence(Kind.SAMPLED, "no data-wait ratio, no GPU counters and no CPU figures in the window")],
            ["dataWaitRatio (instrument the training loop)", "gpuUtilization", "mainCpuCores"],
        )
    return None
