"""The host CPU rules.

* **A busy node**: the main process runnable but waiting for a CPU (run-queue delay) at least
  ``cpu_wait_suspect`` of the window, not CPU-throttled → ``compute-bound`` on the host (Machine,
  no boundary, lever ``raise-cpu-request``).
* **CPU-only, no data wait** and the main process saturating a core → ``compute-bound`` on the CPU
  (Machine, lever ``move-to-accelerator``), except at batch size 1 with under 1.5 cores busy (one
  saturated Python thread: overhead) → ``latency-bound``; CPU-throttled → ``compute-bound`` with
  lever ``raise-cpu-limit``.
"""

from __future__ import annotations

from dam_operator.diagnosis import evidence as ev
from dam_operator.diagnosis import levers
from dam_operator.diagnosis.axes import Kind
from dam_operator.diagnosis.evidence import Evidence
from dam_operator.diagnosis.levers import Regime
from dam_operator.diagnosis.rules.base import Context, Finding, unknown

CPU_MULTI_THREAD_CORES = 1.5
"""A CPU-only main process above this many cores is doing multi-threaded arithmetic, not Python overhead."""
NODE_CPU_BUSY = 0.90
"""A node whose CPUs are this busy leaves a CPU-only job no spare cores: the host CPU is the limit."""


def busy_node(ctx: Context) -> Finding | None:
    """A busy node: the training process is runnable but waits for a CPU (Machine, ``raise-cpu-request``).

    Not under CFS throttling: a throttled cgroup's runnable tasks also accrue run-queue delay,
    and there the quota (``raise-cpu-limit``, the throttling rules) is the cause, not the node.
    """
    o, t, d = ctx.obs, ctx.t, ctx.d
    if not ctx.contended() or ctx.throttled():
        return None
    x = o.cpu_wait_ratio or 0.0
    seen = [ev.cpu_wait(o, t).because(": it is ready to run but other processes hold the node's cores")]
    missing: list[str] = []
    conf = 0.85 if x >= 2 * t.cpu_wait_suspect else 0.7
    step = d.step_seconds
    if step is not None:
        text = (
            f"with a CPU of its own the {step * 1000:.1f} ms step would take about "
            f"{step * (1.0 - x) * 1000:.1f} ms (the time it waited taken out)"
        )
        seen.append(
            Evidence(Kind.CPU_WAIT, text, {"step_seconds": step, "own_cpu_step_seconds": step * (1 - x)})
        )
    if o.main_cpu_cores is not None:
        seen.append(ev.main_cpu(o, t))
    if o.node_cpu_utilization is not None:
        node = o.node_cpu_utilization
        seen.append(Evidence(Kind.NODE_CPU, f"node CPU {ev.pct(node)} busy", {"node_cpu_utilization": node}))
    if o.gpu_utilization is not None:
        seen.append(ev.gpu_utilization(o, t).because(": the host cannot issue work fast enough"))
    if o.data_wait_ratio is not None and o.data_wait_ratio > t.data_wait_suspect:
        # Only a main-process loader gets here with a data wait over the screen (data._busy_node_dominates).
        seen.append(
            ev.data_wait(o, t).because(
                ": less than the wait for a CPU, which the loading in the main process waits out too"
            )
        )
    elif o.data_wait_ratio is not None:
        seen.append(ev.data_wait(o, t).because(": the loader is not the cause"))
    else:
        conf -= 0.1
        missing.append("dataWaitRatio")
    finding = Finding(Regime.COMPUTE_BOUND, "raise-cpu-request", conf, seen, missing, also=())
    finding.on(None, "raise-cpu-request")
    return finding


MOSTLY_BUSY_MARGIN_CORES = 0.10
"""A CPU-only job's main process within this of ``mainCpuSaturatedCores`` (0.80 of a core by
default) is compute-bound at lower confidence; below it, without other evidence, unknown."""


def _cpu_only_on_cores(ctx: Context, seen: list[Evidence], missing: list[str], base: float) -> Finding:
    """A CPU-only job whose main process's CPU is measured: what that use says."""
    o = ctx.obs
    if ctx.main_saturated() and o.batch_size == 1 and (o.main_cpu_cores or 0.0) < CPU_MULTI_THREAD_CORES:
        seen.append(
            ev.note(
                "one Python thread is saturated at batch size 1: per-step overhead, not arithmetic, "
                "dominates (multi-threaded CPU compute would use more than one core)"
            )
        )
        return Finding(Regime.LATENCY_BOUND, "increase-batch-size", base - 0.1, seen, missing)
    if ctx.main_saturated():
        seen.append(ev.note("the training process computes on the CPU"))
        also = ("torch-compile", "reduce-python-ops")
        return Finding(Regime.COMPUTE_BOUND, "move-to-accelerator", base, seen, missing, also=also)
    cores = o.main_cpu_cores or 0.0
    if cores >= ctx.t.main_cpu_saturated_cores - MOSTLY_BUSY_MARGIN_CORES and not ctx.contended():
        # Just under the saturated line and nothing else measured explains the rest: the process
        # mostly computes on the CPU (framework hooks, locks and short I/O take the remainder).
        seen.append(ev.note("the training process computes on the CPU most of the window"))
        also = ("torch-compile", "reduce-python-ops")
        return Finding(Regime.COMPUTE_BOUND, "move-to-accelerator", base - 0.15, seen, missing, also=also)
    node = o.node_cpu_utilization
    waited = o.cpu_wait_ratio
    if node is not None and node >= NODE_CPU_BUSY and waited is not None:
        # The run-queue delay measures the competition itself (the busy-node rule names it when it
        # is high): measured and low, the busy node is not what holds this process back — a process
        # that sleeps or blocks off the CPU gets no verdict from the node's load.
        text = (
            f"node CPU {node:.0%} busy, but the main training process waited for a CPU only "
            f"{ev.pct(waited)} of the window (run-queue delay): the node's load does not hold it back"
        )
        seen.append(Evidence(Kind.CPU_WAIT, text, {"node_cpu_utilization": node, "cpu_wait_ratio": waited}))
    elif node is not None and node >= NODE_CPU_BUSY:
        text = (
            f"node CPU {node:.0%} busy (≥ {NODE_CPU_BUSY:.0%}): the training process competes for cores, "
            "so the host CPU limits the arithmetic"
        )
        seen.append(Evidence(Kind.NODE_CPU, text, {"node_cpu_utilization": node}))
        return Finding(
            Regime.COMPUTE_BOUND,
            "move-to-accelerator",
            base - 0.15,
            seen,
            missing,
            also=(levers.RAISE_CPU_LIMIT,),
        )
    seen.append(ev.note("neither the data wait nor CPU use explains the step time"))
    return unknown(seen, ["a busy signal (GPU counters, or a profile of where the step sleeps)", *missing])


def cpu_only(ctx: Context) -> Finding | None:
    """No GPU counters at all and no data wait: the CPU does the arithmetic (or overhead dominates)."""
    o, t, d = ctx.obs, ctx.t, ctx.d
    if not d.cpu_only:
        return None
    seen: list[Evidence] = []
    missing: list[str] = []
    base = 0.7 if d.cpu_only_declared else 0.55
    if not d.cpu_only_declared:
        missing.append("gpuUtilization (no GPU counters: treated as a CPU-only job)")
    seen.append(ev.note("no GPU counters: treated as a CPU-only job"))
    if o.data_wait_ratio is None:
        return unknown(seen, ["dataWaitRatio (instrument the training loop)", *missing])
    seen.insert(0, ev.data_wait(o, t).because(": the loader is not the cause"))
    if ctx.throttled():
        seen.append(ev.cpu_throttled(o, t).because(": the CPU quota limits the arithmetic"))
        also = ("move-to-accelerator",)
        finding = Finding(Regime.COMPUTE_BOUND, levers.RAISE_CPU_LIMIT, base - 0.1, seen, missing, also=also)
        finding.on(None, levers.RAISE_CPU_LIMIT)
        return finding
    if o.main_cpu_cores is None:
        return unknown(seen, ["mainCpuCores", *missing])
    seen.append(ev.main_cpu(o, t))
    return _cpu_only_on_cores(ctx, seen, missing, base)
