"""The GPU rules.

* **GPU fed** (utilization at or above the starved line), three rules of one stage asked in this
  order: DRAM bandwidth saturated (or arithmetic intensity below the ridge point when DRAM is not
  measured) → ``memory-bound`` (``memory_bound``); kernels resident but SMs mostly idle →
  ``latency-bound`` (``small_kernels``: kernels too small to fill the GPU); otherwise →
  ``compute-bound`` (``compute_bound``).
* **GPU starved without data wait** → ``latency-bound`` (launch / Python / host-sync overhead),
  stronger when the main process saturates a core or the batch is 1.
* **GPU present, utilization not measured** → ``unknown``.
"""

from __future__ import annotations

from dam_operator.diagnosis import evidence as ev
from dam_operator.diagnosis import levers
from dam_operator.diagnosis.axes import Kind
from dam_operator.diagnosis.evidence import Evidence
from dam_operator.diagnosis.levers import Axis, Regime
from dam_operator.diagnosis.rules.base import Context, Finding, unknown

_DRAM_MISSING = "dramBandwidthUtilization (GPM, Hopper+)"


def _intensity(ctx: Context) -> Evidence | None:
    ai, ridge, hw = ctx.d.arithmetic_intensity, ctx.d.ridge_point, ctx.hw
    if ai is None or ridge is None:
        return None
    text = f"arithmetic intensity {ai:.0f} FLOP/B vs ridge point {ridge:.0f} FLOP/B" + (
        f" ({hw.gpu_model})" if hw and hw.gpu_model else ""
    )
    return Evidence(Kind.ARITHMETIC_INTENSITY, text, {"arithmetic_intensity": ai, "ridge_point": ridge})


def _memory_bound(ctx: Context, seen: list[Evidence], missing: list[str], penalty: float) -> Finding | None:
    """Device memory bandwidth limits the step (measured, or inferred from the intensity)."""
    o, t, d = ctx.obs, ctx.t, ctx.d
    lever = "increase-batch-size" if o.batch_size is not None and 0 < o.batch_size <= 4 else "fuse-operators"
    dram, intensity = o.dram_bandwidth_utilization, _intensity(ctx)
    if dram is not None and dram >= t.dram_bandwidth_saturated:
        seen.append(ev.dram_bandwidth(o, t).because(": device memory bandwidth limits the step"))
        if intensity is not None:
            seen.append(intensity)
        return Finding(Regime.MEMORY_BOUND, lever, 0.9 - penalty, seen, missing)
    if dram is None and intensity is not None and (d.arithmetic_intensity or 0.0) < (d.ridge_point or 0.0):
        seen.append(intensity.because(": below the ridge point"))
        missing.append(_DRAM_MISSING)
        return Finding(Regime.MEMORY_BOUND, lever, 0.75 - penalty, seen, missing)
    busy = o.gpu_memory_busy
    if dram is None and busy is not None and busy >= t.dram_bandwidth_saturated:
        text = f"GPU memory busy {ev.pct(busy)} of the time (NVML; a weak proxy for bandwidth)"
        seen.append(Evidence(Kind.GPU_MEMORY_BUSY, text, {"gpu_memory_busy": busy}))
        missing.append(_DRAM_MISSING)
        return Finding(Regime.MEMORY_BOUND, lever, 0.55 - penalty, seen, missing)
    return None


def _small_kernels(ctx: Context, seen: list[Evidence], missing: list[str], penalty: float) -> Finding | None:
    o, t = ctx.obs, ctx.t
    if o.sm_active is None or o.sm_active >= t.sm_active_busy:
        return None
    seen.append(
        ev.sm_active(o, t).because(
            ": kernels are resident but too small to fill the SMs (utilization counts any resident kernel)"
        )
    )
    if o.dram_bandwidth_utilization is not None:
        seen.append(ev.dram_bandwidth(o, t))
    lever = "increase-batch-size" if o.batch_size is None or o.batch_size <= 64 else "fuse-operators"
    return Finding(Regime.LATENCY_BOUND, lever, 0.7 - penalty, seen, missing)


def _compute_lever(ctx: Context, seen: list[Evidence], missing: list[str]) -> str:
    """bf16 when the tensor cores idle, torch.compile when MFU is low, else a faster accelerator."""
    o, t, mfu = ctx.obs, ctx.t, ctx.d.mfu
    tensor = o.tensor_active
    if tensor is not None:
        seen.append(ev.tensor_active(o, t))
    if tensor is not None and tensor < t.tensor_active_low:
        seen[-1] = seen[-1].because(": matrix math does not use the tensor cores")
        return "enable-bf16"
    if mfu is not None and mfu < t.mfu_investigate:
        text = (
            f"MFU {ev.pct(mfu)} (investigate < {ev.thr(t.mfu_investigate)}): "
            "hardware efficiency η is low, fuse the kernels"
        )
        seen.append(Evidence(Kind.MFU, text, {"mfu": mfu}))
        return "torch-compile"
    if (mfu is not None and mfu >= t.mfu_investigate) or tensor is not None:
        if mfu is not None:
            text = f"MFU {ev.pct(mfu)} (efficient > {ev.thr(t.mfu_efficient)}): the work itself is the limit"
            seen.append(Evidence(Kind.MFU, text, {"mfu": mfu}))
        return "faster-accelerator"
    missing.append("tensorActive or modelFlopsPerStep (to tell bf16 from a faster accelerator)")
    seen.append(ev.note("tensor-core activity and MFU unknown: check bf16/TF32 first"))
    return "enable-bf16"


def _compute_bound(ctx: Context, seen: list[Evidence], missing: list[str], penalty: float) -> Finding:
    o, t = ctx.obs, ctx.t
    conf = 0.9 - penalty
    if o.sm_active is not None:
        seen.append(ev.sm_active(o, t))
    else:
        conf -= 0.15
        missing.append("smActive (GPM, Hopper+)")
    intensity = _intensity(ctx)
    if o.dram_bandwidth_utilization is not None:
        seen.append(ev.dram_bandwidth(o, t).because(": memory bandwidth is not the limit"))
    elif intensity is not None:
        seen.append(intensity.because(": above the ridge point"))
        conf -= 0.05
    else:
        conf -= 0.1
        missing.append(_DRAM_MISSING)
    lever = _compute_lever(ctx, seen, missing)
    return Finding(Regime.COMPUTE_BOUND, lever, conf, seen, missing)


def _fed(ctx: Context) -> tuple[list[Evidence], list[str], float] | None:
    """A fed GPU (utilization at or above the starved line): the lines and the confidence penalty
    the three fed-GPU rules start from; None when the GPU is starved or not measured."""
    o, t = ctx.obs, ctx.t
    u = o.gpu_utilization
    if u is None or u < t.gpu_util_starved:
        return None
    seen = [ev.gpu_utilization(o, t)]
    missing: list[str] = []
    w = o.data_wait_ratio
    if w is not None and w > t.data_wait_suspect:
        seen.append(
            ev.data_wait(o, t).because(
                " but the GPU stays busy: the asynchronous queue hides it, Data is not the bottleneck"
            )
        )
    penalty = 0.0 if u >= t.gpu_util_busy else 0.15
    if w is None:
        penalty += 0.05
        missing.append("dataWaitRatio")
    return seen, missing, penalty


def memory_bound(ctx: Context) -> Finding | None:
    """A fed GPU whose device memory bandwidth limits the step."""
    fed = _fed(ctx)
    return None if fed is None else _memory_bound(ctx, *fed)


def small_kernels(ctx: Context) -> Finding | None:
    """A fed GPU whose SMs mostly idle: kernels too small to fill it (latency-bound)."""
    fed = _fed(ctx)
    return None if fed is None else _small_kernels(ctx, *fed)


def compute_bound(ctx: Context) -> Finding | None:
    """A fed GPU: the work itself (the stage's last rule, after memory- and latency-bound)."""
    fed = _fed(ctx)
    return None if fed is None else _compute_bound(ctx, *fed)


def _starved_lever(ctx: Context, seen: list[Evidence]) -> str:
    o = ctx.obs
    if o.batch_size == 1:
        return "increase-batch-size"
    if ctx.main_saturated():
        seen.append(ev.note("the Python thread is busy launching work while the GPU idles (launch overhead)"))
        return "cuda-graphs"
    if o.main_cpu_cores is None:
        seen.append(
            ev.note(
                "the loader is not the cause and the main process's CPU is not measured: suspect "
                "per-step host synchronisation or launch overhead"
            )
        )
    else:
        seen.append(
            ev.note("neither the loader nor the Python thread is busy: suspect per-step host synchronisation")
        )
    return "remove-host-syncs"


def gpu_starved(ctx: Context) -> Finding | None:
    o, t = ctx.obs, ctx.t
    u = o.gpu_utilization
    if u is None or u >= t.gpu_util_starved:
        return None
    seen = [ev.gpu_utilization(o, t)]
    missing: list[str] = []
    w = o.data_wait_ratio
    saturated, batch1 = ctx.main_saturated(), o.batch_size == 1
    if w is None:
        if not (saturated or batch1):
            seen.append(ev.note("the GPU idles but the data wait is not measured"))
            return unknown(seen, ["dataWaitRatio (instrument the training loop to tell Data from overhead)"])
        conf = 0.5
        missing.append("dataWaitRatio")
    else:
        conf = 0.6
        if w > t.data_wait_fine:
            conf -= 0.1
        seen.append(ev.data_wait(o, t).because(": the loader is not the cause"))
    if o.main_cpu_cores is not None:
        seen.append(ev.main_cpu(o, t))
    else:
        missing.append("mainCpuCores")
    if saturated:
        conf += 0.2
    if batch1:
        conf += 0.1
    if o.sm_active is not None:
        seen.append(ev.sm_active(o, t))
    if ctx.throttled():
        seen.append(ev.cpu_throttled(o, t).because(": the host cannot issue work fast enough"))
        finding = Finding(Regime.LATENCY_BOUND, levers.RAISE_CPU_LIMIT, conf, seen, missing)
        finding.on(Axis.MACHINE, levers.RAISE_CPU_LIMIT)
        return finding
    return Finding(Regime.LATENCY_BOUND, _starved_lever(ctx, seen), conf, seen, missing)


def gpu_unmeasured(ctx: Context) -> Finding:
    """The last rule: a GPU is there but its utilization is not measured. Always answers."""
    seen: list[Evidence] = []
    if ctx.obs.data_wait_ratio is not None:
        seen.append(ev.data_wait(ctx.obs, ctx.t).because(": the loader is not the cause"))
    seen.append(ev.note("GPU present but its utilization is not measured"))
    return unknown(seen, ["gpuUtilization (is NVML reachable from the sidecar?)"])
