"""Input-bound (Data): data wait above the screen *and* the accelerator idle (utilization below
the starved line). With no GPU counters at all (a CPU-only job, or NVML unavailable) the data wait
alone decides, at lower confidence. Loader wait while the GPU stays busy is hidden by the
asynchronous queue and does not count. Under two screens, beside a rest of the window four times
as large, the data wait is a suspect, not the verdict (``rules.dominance``). Boundary Machine,
lever ``raise-cpu-limit``, when the container is CPU-throttled or the training process saturates
its CPU limit; lever ``raise-cpu-request`` when a busy node starves the loader. A loader in the
main process (no workers) on a busy node whose run-queue delay dominates the data wait is left to
the busy-node rule (``_busy_node_dominates``)."""

from __future__ import annotations

from dam_operator.diagnosis import evidence as ev
from dam_operator.diagnosis import levers
from dam_operator.diagnosis.axes import Kind
from dam_operator.diagnosis.evidence import Evidence
from dam_operator.diagnosis.levers import Axis, Regime
from dam_operator.diagnosis.rules.base import Context, Finding
from dam_operator.diagnosis.rules.dominance import named_suspect, of_window


def _confidence(ctx: Context, seen: list[Evidence], missing: list[str]) -> float | None:
    """The confidence from what says the accelerator idles; None when the GPU stays busy."""
    o, t, d = ctx.obs, ctx.t, ctx.d
    strong = (o.data_wait_ratio or 0.0) >= 2 * t.data_wait_suspect
    if o.gpu_utilization is not None:
        if o.gpu_utilization >= t.gpu_util_starved:
            return None  # the queue hides the wait; judged by the GPU rules
        seen.append(ev.gpu_utilization(o, t).because(": the accelerator idles while the loop waits for data"))
        return 0.9 if strong else 0.75
    if d.cpu_only:
        conf = 0.7 if strong else 0.6
        if not d.cpu_only_declared:
            conf -= 0.05
            missing.append("gpuUtilization (no GPU counters: judged from the data wait alone)")
        seen.append(ev.note("no GPU counters (CPU-only job): judged from the data wait alone"))
        return conf
    missing.append("gpuUtilization (GPU present but not measured)")
    seen.append(ev.note("GPU utilization not measured: judged from the data wait alone"))
    return 0.6 if strong else 0.5


def _cause(ctx: Context, finding: Finding) -> None:
    """What starves the loader: the CPU quota, a busy node, storage; the lever follows."""
    o, t = ctx.obs, ctx.t
    seen = finding.evidence
    limit = ctx.cpu_limit_saturated()
    if ctx.throttled():
        finding.on(Axis.MACHINE, levers.RAISE_CPU_LIMIT)
        seen.append(ev.cpu_throttled(o, t).because(": the host CPU quota starves the loader"))
    elif limit is not None:
        finding.on(Axis.MACHINE, levers.RAISE_CPU_LIMIT)
        seen.append(limit)
    elif (starved_by_node := ctx.loader_contended()) is not None:
        finding.on(Axis.MACHINE, "raise-cpu-request")
        seen.append(starved_by_node)
    elif o.worker_count is not None and o.worker_count == 0:
        seen.append(ev.note("batches are loaded in the main process (no DataLoader workers)"))
        if ctx.contended():
            seen.append(
                ev.cpu_wait(o, t).because(
                    ": the node is busy too; workers load in parallel (raise-cpu-request if it stays busy)"
                )
            )
    elif o.worker_count and o.worker_cpu_cores is not None and o.worker_cpu_cores / o.worker_count < 0.5:
        finding.lever = "use-sequential-shards"
        text = (
            f"{o.worker_count} loader workers use only {o.worker_cpu_cores:.2f} CPU cores: "
            "they wait on storage, not on decoding"
        )
        seen.append(Evidence(Kind.LOADER_CPU, text, {"worker_cpu_cores": o.worker_cpu_cores}))
    elif o.worker_cpu_cores is not None:
        text = f"loader workers use {o.worker_cpu_cores:.2f} CPU cores"
        seen.append(Evidence(Kind.LOADER_CPU, text, {"worker_cpu_cores": o.worker_cpu_cores}))


BUSY_NODE_DOMINANCE = 1.5
"""The run-queue delay must be this many times the data wait to take a main-process loader's verdict."""
BOTH_SHARES_SLACK = 0.1
"""How far the run-queue delay and the data wait, both shares of the window, may add up beyond it
(a loading that waits for a CPU counts in both) before the pair is implausible: seen on the real
node, a sleeping loader's 49 % data wait beside a 100 % CPU wait."""


def _busy_node_dominates(ctx: Context) -> bool:
    """Batches loaded in the main process (no workers), on a node where that process waits for a CPU
    ``BUSY_NODE_DOMINANCE`` times as long as it waits for data (the two fitting in the window), and
    no CPU quota to blame: the run-queue delay is the
    larger loss, and the data wait is partly that same delay (the loading in the main process waits
    for a CPU like the step does). More workers would add processes competing for the same cores:
    the busy-node rule answers (``raise-cpu-request``), its evidence saying the data wait.

    Both ratios are shares of the same wall time (the data wait of the step time, the delay of the
    window), so the larger is the dominant term; ``BUSY_NODE_DOMINANCE`` keeps a loader that sleeps
    (I/O) on a loaded node, whose two figures are close, a loader question. Measured with `dam run`
    on a job pinned to one CPU beside four busy loops: data wait 12.8-15.1 %, run-queue delay
    29.5-32.1 %."""
    o = ctx.obs
    if o.worker_count != 0 or not ctx.contended() or ctx.throttled() or ctx.cpu_limit_saturated() is not None:
        return False
    cpu_wait, data_wait = o.cpu_wait_ratio or 0.0, o.data_wait_ratio or 0.0
    if cpu_wait + data_wait > 1.0 + BOTH_SHARES_SLACK:
        # More than the window between them: a loader that sleeps (I/O) is not runnable while it
        # waits, so the two cannot both be that large; the CPU figure is not trusted to overturn.
        return False
    return cpu_wait >= BUSY_NODE_DOMINANCE * data_wait


def input_bound(ctx: Context) -> Finding | None:
    o, t = ctx.obs, ctx.t
    w = o.data_wait_ratio
    if w is None or w <= t.data_wait_suspect or _busy_node_dominates(ctx):
        return None
    if named_suspect(
        ctx, w, screen=t.data_wait_suspect, kind=Kind.DATA_WAIT, what="data wait", key="data_wait_ratio"
    ):
        return None
    seen = [ev.data_wait(o, t)]
    missing: list[str] = []
    conf = _confidence(ctx, seen, missing)
    if conf is None:
        return None
    lever = levers.INCREASE_DATALOADER_WORKERS
    finding = Finding(Regime.INPUT_BOUND, lever, conf, seen, missing, loss=of_window(ctx, w))
    _cause(ctx, finding)
    return finding
