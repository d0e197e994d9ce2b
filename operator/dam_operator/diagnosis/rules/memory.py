"""Memory capacity (Algorithm, boundary Machine): the job is out of memory, host or device.

The container was OOM-killed (the caller's ``oom_killed``), the cgroup counted OOM kills in the
window, DataLoader said a worker was killed, or the fullest GPU's memory is above
``gpu_memory_full``; the container near its memory limit counts only when the processes' resident
memory corroborates it (page cache fills a limit harmlessly).

The container's exit code (``oom_exit_code``) says whom the OOM killer took: 137 (128 + SIGKILL)
the training process itself; another code a child of it, after which the training process exited
on its own. A child killed in a container that runs DataLoader workers is the loader's: the lever
is then ``reduce-loader-memory`` even when the probe's count of the kill is missing; with nothing
known of the loader (no scrape, no last words), the loader is suspected, with less confidence.
A loader killed before any scrape still tells its workers and the kill: the probe's last words in
the container's termination message (``dam_probe.lastwords``), read into the window by the
cluster's window step.
"""

from __future__ import annotations

from dam_operator.diagnosis import evidence as ev
from dam_operator.diagnosis.axes import Kind
from dam_operator.diagnosis.evidence import Evidence
from dam_operator.diagnosis.levers import Regime
from dam_operator.diagnosis.rules.base import Context, Finding

_LOADER_ALSO = ("raise-memory-limit", "smaller-micro-batch")
MAIN_KILLED_EXIT_CODE = 137
"""128 + SIGKILL: the container's main process died of the OOM killer's signal."""


def child_killed(ctx: Context) -> bool:
    """The OOM killer took a child of the training process, not the process itself: the container
    was OOM-killed and exited with a code other than 137."""
    code = ctx.obs.oom_exit_code
    return ctx.obs.oom_killed is True and code is not None and code != MAIN_KILLED_EXIT_CODE


def _killed_evidence(ctx: Context) -> Evidence:
    """Whom the OOM killer took, as the container's exit code says."""
    code = ctx.obs.oom_exit_code
    if code == MAIN_KILLED_EXIT_CODE:
        text = (
            "the training process was OOM-killed (reason OOMKilled, exit code 137 = 128 + SIGKILL): "
            "its container's memory ran out"
        )
    elif code is not None:
        text = (
            f"a child of the training process was OOM-killed (reason OOMKilled), not the process "
            f"itself: the container exited with code {code}, not 137 (128 + SIGKILL), after the "
            "kill: its memory ran out"
        )
    else:
        text = (
            "the training container was OOM-killed (reason OOMKilled; its exit code, which tells the "
            "training process from a child, is not known): its memory ran out"
        )
    return Evidence(Kind.OOM, text, {} if code is None else {"oom_exit_code": float(code)})


def _seen(ctx: Context, *, killed: bool, kills: bool, gpu_full: bool) -> list[Evidence]:
    """The memory figures of the window, in the order the verdict states them."""
    o, t = ctx.obs, ctx.t
    out: list[Evidence] = []
    if killed:
        out.append(_killed_evidence(ctx))
    if kills:
        n = o.oom_kills or 0.0
        text = f"{n:.0f} OOM kill{'s' if n != 1 else ''} in the container's cgroup in the window"
        out.append(Evidence(Kind.OOM, text, {"oom_kills": n}))
    if o.container_memory_ratio is not None:
        out.append(ev.container_memory(o, t))
    if gpu_full:
        x = o.gpu_memory_used_ratio or 0.0
        text = (
            f"GPU memory {ev.pct(x)} used on the fullest GPU (full > {ev.thr(t.gpu_memory_full)}; the "
            "caching allocator keeps freed blocks, so the peak may be a little lower)"
        )
        out.append(Evidence(Kind.GPU_MEMORY, text, {"gpu_memory_used_ratio": x}))
    rss = ev.resident_memory(o)
    if rss is not None:
        out.append(rss)
    return out


def _workers_hold_most(ctx: Context) -> Evidence | None:
    w_rss, m_rss = ctx.obs.worker_rss_bytes, ctx.obs.main_rss_bytes
    if w_rss is not None and w_rss > 0 and (m_rss is None or w_rss >= m_rss):
        return ev.note(
            "the loader workers hold most of the resident memory (each worker copies what it touches)"
        )
    return None


def _loader_killed(ctx: Context, seen: list[Evidence], *, certain_kill: bool) -> Finding:
    n = ctx.obs.loader_worker_kills or 0.0
    seen.append(
        Evidence(
            Kind.LOADER_KILLED,
            f"{n:.0f} DataLoader worker{'s' if n != 1 else ''} killed in the window (DataLoader's own "
            "error, seen by the probe): the OOM killer took the loader, not the training process",
            {"loader_worker_kills": n},
        )
    )
    most = _workers_hold_most(ctx)
    if most is not None:
        seen.append(most)
    conf = 0.95 if certain_kill else 0.85
    return Finding(Regime.MEMORY_CAPACITY, "reduce-loader-memory", conf, evidence=seen, also=_LOADER_ALSO)


def _host(ctx: Context, seen: list[Evidence], *, killed: bool, kills: bool) -> Finding:
    """Host (cgroup) memory ran out: which process holds it decides the lever."""
    o = ctx.obs
    conf = 0.95 if killed and kills else (0.9 if killed or kills else 0.5)
    missing: list[str] = []
    most = _workers_hold_most(ctx)
    if most is not None:
        seen.append(most)
        return Finding(Regime.MEMORY_CAPACITY, "reduce-loader-memory", conf, evidence=seen, also=_LOADER_ALSO)
    workers = (o.worker_count or 0) > 0 or (o.worker_rss_bytes or 0.0) > 0 or (o.loader_num_workers or 0) > 0
    if workers and child_killed(ctx):
        seen.append(
            ev.note(
                "the OOM killer took a child of the training process and DataLoader workers run in the "
                "container: the loader was its victim"
            )
        )
        return Finding(Regime.MEMORY_CAPACITY, "reduce-loader-memory", conf, evidence=seen, also=_LOADER_ALSO)
    unknown = o.worker_count is None and o.worker_rss_bytes is None and o.loader_num_workers is None
    if unknown and child_killed(ctx):
        # No scrape and no last words (the probe did not load, or its process was SIGKILLed): a
        # Python training process's child is most often a DataLoader worker.
        missing.append("loaderNumWorkers (whether the killed child was a DataLoader worker)")
        seen.append(
            ev.note(
                "the OOM killer took a child of the training process; no probe record says whether "
                "DataLoader workers ran: suspect the loader"
            )
        )
        also = ("smaller-micro-batch", "raise-memory-limit")
        return Finding(Regime.MEMORY_CAPACITY, "reduce-loader-memory", conf - 0.2, seen, missing, also=also)
    if workers and not (o.main_rss_bytes is not None and o.worker_rss_bytes is not None):
        missing.append("workerRssBytes and mainRssBytes (which process holds the memory)")
        seen.append(
            ev.note("DataLoader workers run in the container and its memory ran out: suspect the loader")
        )
        return Finding(
            Regime.MEMORY_CAPACITY, "reduce-loader-memory", conf - 0.1, seen, missing, also=_LOADER_ALSO
        )
    if o.main_rss_bytes is None and o.worker_rss_bytes is None:
        missing.append("mainRssBytes and workerRssBytes (which process holds the memory)")
        conf -= 0.1
    if ctx.d.cpu_only:
        seen.append(ev.note("a CPU-only job: activations and optimizer state live in host memory"))
        also = ("activation-checkpointing", "raise-memory-limit")
        return Finding(Regime.MEMORY_CAPACITY, "smaller-micro-batch", conf, seen, missing, also=also)
    seen.append(ev.note("the main process holds the host memory"))
    also = ("smaller-micro-batch", "reduce-loader-memory")
    return Finding(Regime.MEMORY_CAPACITY, "raise-memory-limit", conf, seen, missing, also=also)


def _device(ctx: Context, seen: list[Evidence]) -> Finding:
    """Device memory is full (CUDA out-of-memory raises in Python, it is not a kill)."""
    o = ctx.obs
    conf = 0.7 if (o.gpu_memory_used_ratio or 0.0) >= 0.99 else 0.65
    if (o.ranks or 0) > 1 or (o.gpu_count or 0) > 1:
        seen.append(
            ev.note(
                "several data-parallel replicas each hold the full parameters, gradients and optimizer state"
            )
        )
        also = ("activation-checkpointing", "smaller-micro-batch")
        return Finding(Regime.MEMORY_CAPACITY, "shard-model-states", conf, evidence=seen, also=also)
    also = ("smaller-micro-batch", "shard-model-states")
    return Finding(Regime.MEMORY_CAPACITY, "activation-checkpointing", conf, evidence=seen, also=also)


def memory_capacity(ctx: Context) -> Finding | None:
    o, t = ctx.obs, ctx.t
    killed = o.oom_killed is True
    kills = o.oom_kills is not None and o.oom_kills > 0
    # Certain, not inferred from a 1 Hz memory sample: DataLoader itself said its worker was killed.
    loader_killed = o.loader_worker_kills is not None and o.loader_worker_kills > 0
    gpu_full = o.gpu_memory_used_ratio is not None and o.gpu_memory_used_ratio > t.gpu_memory_full
    host_full = ctx.container_full() and ctx.rss_corroborates()
    if not (killed or kills or loader_killed or gpu_full or host_full):
        return None
    seen = _seen(ctx, killed=killed, kills=kills, gpu_full=gpu_full)
    if loader_killed:
        return _loader_killed(ctx, seen, certain_kill=killed or kills)
    if killed or kills or host_full:
        return _host(ctx, seen, killed=killed, kills=kills)
    return _device(ctx, seen)
