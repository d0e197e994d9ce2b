"""The D·A·M decision rules: one window of observations in, one verdict out.

Pure and deterministic: no clock, no I/O. The rules are spelled out, with their
thresholds, in ``docs/method.md``. In short, in order:

1. **Memory capacity** (Algorithm, boundary Machine): the container was OOM-killed (the
   caller's ``oom_killed``), the cgroup counted OOM kills in the window, or the fullest
   GPU's memory is above ``gpu_memory_full``; the container near its memory limit counts
   only when the processes' resident memory corroborates it (page cache fills a limit
   harmlessly). It takes precedence over everything: a job being killed is not input-bound.
2. **Enough evidence?** Fewer than ``min_steps`` steps (per rank: ``job_steps``), or
   neither a data-wait ratio nor a GPU signal nor the main process's CPU → ``unknown``
   (``collect-more-evidence``, ``missing`` names what is absent). No step at all: "no
   training step was seen", what was sampled, and how to instrument a custom loop.
2b. **Checkpoint-bound** (Machine, boundary Data): checkpoint saves block the training thread
   above ``checkpoint_suspect`` of the wall time, more than the data wait or the exposed
   communication; lever ``async-checkpoint``, or ``checkpoint-less-often`` when it saves more
   often than every ``CHECKPOINT_OFTEN_STEPS`` steps.
3. **Communication-bound** (Machine, boundary Algorithm): the *skew-corrected* exposed
   communication — the least-waiting rank's — above ``communication_suspect`` of the step.
   When the job is also input-bound, the larger share of the step wins.
4. **Input-bound** (Data): data wait above the screen *and* the accelerator idle
   (utilization below the starved line). With no GPU counters at all (a CPU-only job,
   or NVML unavailable) the data wait alone decides, at lower confidence. Loader wait
   while the GPU stays busy is hidden by the asynchronous queue and does not count.
   Boundary Machine, lever ``raise-cpu-limit``, when the container is CPU-throttled or
   the training process saturates its CPU limit.
5. **GPU fed** (utilization at or above the starved line):
   DRAM bandwidth saturated (or arithmetic intensity below the ridge point when DRAM is
   not measured) → ``memory-bound``; kernels resident but SMs mostly idle →
   ``latency-bound`` (kernels too small to fill the GPU); otherwise → ``compute-bound``.
6. **A busy node**: the main process runnable but waiting for a CPU (run-queue delay) at
   least ``cpu_wait_suspect`` of the window, not CPU-throttled → ``compute-bound`` on the host
   (Machine, no boundary, lever ``raise-cpu-request``). A loader starved the same way gives
   ``input-bound`` with lever ``raise-cpu-request`` (boundary Machine).
7. **GPU starved without data wait** → ``latency-bound`` (launch / Python / host-sync
   overhead), stronger when the main process saturates a core or the batch is 1.
8. **CPU-only, no data wait** and the main process saturating a core → ``compute-bound``
   on the CPU (Machine, lever ``move-to-accelerator``), except at batch size 1 with
   under 1.5 cores busy (one saturated Python thread: overhead) → ``latency-bound``;
   CPU-throttled → ``compute-bound`` with lever ``raise-cpu-limit``.

With per-rank observations (``diagnose(..., ranks=...)``) the verdict also names a straggler
(``bottleneck.straggler``) and lists the worst few ranks (``metrics.ranks``); see
``diagnosis.ranks``.

Every absent corroborating signal lowers the confidence and is named in ``missing``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from dam_operator.diagnosis import levers
from dam_operator.diagnosis.gpus import resolve_hardware, ridge_point
from dam_operator.diagnosis.model import (
    Axis,
    Bottleneck,
    Hardware,
    IronLaw,
    Observation,
    RankId,
    Regime,
    Thresholds,
    Verdict,
    WindowMetrics,
)
from dam_operator.diagnosis.ranks import find_straggler, is_synchronous, rank_figures, straggler_sentence

_AXES: dict[Regime, tuple[Axis, Axis | None]] = {
    Regime.INPUT_BOUND: (Axis.DATA, None),
    Regime.MEMORY_BOUND: (Axis.DATA, Axis.MACHINE),
    Regime.COMPUTE_BOUND: (Axis.MACHINE, Axis.ALGORITHM),
    Regime.LATENCY_BOUND: (Axis.ALGORITHM, Axis.MACHINE),
    Regime.COMMUNICATION_BOUND: (Axis.MACHINE, Axis.ALGORITHM),
    Regime.MEMORY_CAPACITY: (Axis.ALGORITHM, Axis.MACHINE),
    Regime.CHECKPOINT_BOUND: (Axis.MACHINE, Axis.DATA),
    Regime.UNKNOWN: (Axis.UNKNOWN, None),
}

RSS_CORROBORATES = 0.80
"""Resident memory at this share of the container limit makes a full container a real shortage."""
OVERLAP_HIDDEN_WELL = 0.5
"""Collective time more than this share hidden behind the backward pass: overlap already works."""
GIB = float(1 << 30)

CPU_MULTI_THREAD_CORES = 1.5
NODE_CPU_BUSY = 0.90
"""A node whose CPUs are this busy leaves a CPU-only job no spare cores: the host CPU is the limit."""
"""A CPU-only main process above this many cores is doing multi-threaded arithmetic, not Python overhead."""

CHECKPOINT_OFTEN_STEPS = 10
"""A job that saves more often than every this many steps is told to save less often first
(``checkpoint-less-often``); otherwise to save asynchronously (``async-checkpoint``)."""

MIN_CONFIDENCE = 0.05
MAX_CONFIDENCE = 0.99

_SAMPLE_SIZE = re.compile(r" \(\d+ steps in \d+ s\)")
"""The sample-size clause of the steps/s evidence line (``Finding.context``)."""


def without_sample_size(sentence: str) -> str:
    """``sentence`` without the window's sample size ("(240 steps in 30 s)").

    The size of the sample says how much evidence a window had, not what it found: a window
    that ran 33 s instead of 30 s (an operator under load) finds the same thing. The cluster
    side compares evidence through this to decide whether a status changed.
    """
    return _SAMPLE_SIZE.sub("", sentence)


def _pct(x: float) -> str:
    return f"{x:.1%}"


def _thr(x: float) -> str:
    return f"{x:.0%}" if round(x * 100, 6) == round(x * 100) else f"{x:.1%}"


@dataclass
class _Finding:
    regime: Regime
    lever: str
    confidence: float
    boundary: Axis | None = None
    boundary_set: bool = False
    evidence: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    also: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Derived:
    """Figures computed from an observation and the hardware, shared by the rules and the metrics."""

    step_seconds: float | None
    steps_per_second: float | None
    gpu_signals: bool
    cpu_only: bool
    """No GPU counters at all (``gpu_count`` 0, or unknown and no GPU gauge present)."""
    cpu_only_declared: bool
    """``gpu_count`` is explicitly 0."""
    mfu: float | None
    arithmetic_intensity: float | None
    ridge_point: float | None
    iron_law: IronLaw | None


def _positive(x: float | None) -> float | None:
    return x if x is not None and x > 0 and math.isfinite(x) else None


def derive(obs: Observation, hardware: Hardware | None) -> Derived:
    sps = obs.steps_per_second
    if sps is None and obs.steps is not None and _positive(obs.window_seconds):
        sps = obs.steps / obs.window_seconds  # type: ignore[operator]
    step = _positive(obs.mean_step_seconds)
    job_steps = obs.job_steps if obs.job_steps is not None else obs.steps
    if step is None and _positive(job_steps) and _positive(obs.window_seconds):
        step = obs.window_seconds / job_steps  # type: ignore[operator]
    if step is None and _positive(sps):
        step = 1.0 / sps  # type: ignore[operator]

    gpu_signals = any(
        v is not None
        for v in (
            obs.gpu_utilization,
            obs.sm_active,
            obs.sm_occupancy,
            obs.tensor_active,
            obs.dram_bandwidth_utilization,
            obs.gpu_memory_busy,
        )
    )
    cpu_only_declared = obs.gpu_count == 0 and not gpu_signals
    cpu_only = not gpu_signals and (obs.gpu_count is None or obs.gpu_count == 0)

    peak = hardware.peak_flops if hardware else None
    bw = hardware.memory_bandwidth_bytes_per_second if hardware else None
    gpus = max(1, obs.gpu_count or 1)
    mfu = None
    # A CPU-only job has a peak only when the user gave one (``--peak-flops``, spec.hardware): the
    # GPU table has no entry without a GPU model. Its MFU is then against that peak.
    if (
        obs.flops_per_step is not None
        and sps is not None
        and peak
        and (not cpu_only or obs.gpu_model is None)
    ):
        mfu = obs.flops_per_step * sps / (peak * gpus)

    intensity = None
    if _positive(obs.flops_per_step) and _positive(obs.bytes_per_step):
        intensity = obs.flops_per_step / obs.bytes_per_step  # type: ignore[operator]
    elif (
        _positive(obs.flops_per_step)
        and _positive(sps)
        and bw
        and _positive(obs.dram_bandwidth_utilization)
        and not cpu_only
    ):
        achieved_flops = obs.flops_per_step * sps / gpus  # type: ignore[operator]
        achieved_bytes = obs.dram_bandwidth_utilization * bw  # type: ignore[operator]
        intensity = achieved_flops / achieved_bytes

    iron = None
    if step is not None:
        data_s = step * obs.data_wait_ratio if obs.data_wait_ratio is not None else None
        compute_s: float | None = None
        if obs.gpu_utilization is not None:
            compute_s = step * obs.gpu_utilization
        elif mfu is not None:
            compute_s = step * min(1.0, mfu)  # lower bound: the work at peak efficiency
        latency_s = None
        if data_s is not None and compute_s is not None:
            latency_s = max(0.0, step - data_s - compute_s)
        iron = IronLaw(
            step_seconds=step, data_seconds=data_s, compute_seconds=compute_s, latency_seconds=latency_s
        )

    return Derived(
        step_seconds=step,
        steps_per_second=sps,
        gpu_signals=gpu_signals,
        cpu_only=cpu_only,
        cpu_only_declared=cpu_only_declared,
        mfu=mfu,
        arithmetic_intensity=intensity,
        ridge_point=ridge_point(hardware),
        iron_law=iron,
    )


class _Rules:
    def __init__(self, obs: Observation, t: Thresholds, hw: Hardware | None, d: Derived) -> None:
        self.obs, self.t, self.hw, self.d = obs, t, hw, d

    # --- sentences --------------------------------------------------------------
    def wait_sentence(self) -> str:
        w = self.obs.data_wait_ratio
        assert w is not None
        return f"data wait {_pct(w)} of step time (screen > {_thr(self.t.data_wait_suspect)})"

    def util_sentence(self) -> str:
        u = self.obs.gpu_utilization
        assert u is not None
        return (
            f"GPU utilization {_pct(u)} (starved < {_thr(self.t.gpu_util_starved)}, "
            f"busy > {_thr(self.t.gpu_util_busy)})"
        )

    def sm_sentence(self) -> str:
        s = self.obs.sm_active
        assert s is not None
        return f"SM active {_pct(s)} (busy ≥ {_thr(self.t.sm_active_busy)})"

    def dram_sentence(self) -> str:
        x = self.obs.dram_bandwidth_utilization
        assert x is not None
        return f"DRAM bandwidth {_pct(x)} of peak (saturated ≥ {_thr(self.t.dram_bandwidth_saturated)})"

    def tensor_sentence(self) -> str:
        x = self.obs.tensor_active
        assert x is not None
        return f"tensor pipes active {_pct(x)} (low < {_thr(self.t.tensor_active_low)})"

    def main_cpu_sentence(self) -> str:
        c = self.obs.main_cpu_cores
        assert c is not None
        limit = self.t.main_cpu_saturated_cores
        return f"main training process uses {c:.2f} CPU cores (saturated ≥ {limit:.2f})"

    def throttle_sentence(self) -> str:
        x = self.obs.cpu_throttled_ratio
        assert x is not None
        limit = _thr(self.t.cpu_throttled_suspect)
        return f"container CPU-throttled {_pct(x)} of the window (suspect > {limit})"

    def cpu_wait_sentence(self) -> str:
        x = self.obs.cpu_wait_ratio
        assert x is not None
        return (
            f"the main training process waited for a CPU {_pct(x)} of the window "
            f"(run-queue delay; suspect ≥ {_thr(self.t.cpu_wait_suspect)})"
        )

    def worker_wait_sentence(self) -> str:
        o = self.obs
        x = o.worker_cpu_wait_ratio
        assert x is not None
        workers = f"the {o.worker_count} loader workers" if o.worker_count else "the loader workers"
        return (
            f"{workers} waited for a CPU {_pct(x)} of the window each "
            f"(run-queue delay; suspect ≥ {_thr(self.t.cpu_wait_suspect)})"
        )

    def exposed_sentence(self) -> str:
        x = self.obs.exposed_communication_ratio
        assert x is not None
        who = "least-waiting rank" if (self.obs.ranks or 0) > 1 else "not hidden by the backward pass"
        return (
            f"exposed communication {_pct(x)} of the step time ({who}; "
            f"screen > {_thr(self.t.communication_suspect)})"
        )

    def container_memory_sentence(self) -> str:
        o = self.obs
        assert o.container_memory_ratio is not None
        limit = (
            f" of its {o.container_memory_limit_bytes / GIB:.1f} GiB limit"
            if o.container_memory_limit_bytes
            else " of its limit"
        )
        return (
            f"container memory at {_pct(o.container_memory_ratio)}{limit} "
            f"(full ≥ {_thr(self.t.container_memory_full)}; page cache included)"
        )

    def rss_sentence(self) -> str | None:
        o = self.obs
        parts = []
        if o.worker_rss_bytes is not None:
            workers = f"{o.worker_count} loader workers" if o.worker_count else "loader workers"
            parts.append(f"{workers} {o.worker_rss_bytes / GIB:.2f} GiB")
        if o.main_rss_bytes is not None:
            parts.append(f"main process {o.main_rss_bytes / GIB:.2f} GiB")
        return ("resident memory: " + ", ".join(parts)) if parts else None

    # --- predicates -------------------------------------------------------------
    def throttled(self) -> bool:
        x = self.obs.cpu_throttled_ratio
        return x is not None and x > self.t.cpu_throttled_suspect

    def contended(self) -> bool:
        """The main process waits for a CPU (run-queue delay) at least ``cpu_wait_suspect`` of the time."""
        x = self.obs.cpu_wait_ratio
        return x is not None and x >= self.t.cpu_wait_suspect

    def loader_contended(self) -> str | None:
        """Why the loader is held back by a busy node (a sentence), or None.

        The workers wait for a CPU; or, with no workers, the main process (which loads the batches).
        """
        o, t = self.obs, self.t
        workers_wait = o.worker_cpu_wait_ratio
        if o.worker_count and workers_wait is not None and workers_wait >= t.cpu_wait_suspect:
            return self.worker_wait_sentence() + ": a busy node starves the loader"
        if o.worker_count == 0 and self.contended():
            return (
                self.cpu_wait_sentence()
                + ": a busy node starves the loader (batches load in the main process)"
            )
        return None

    def main_saturated(self) -> bool:
        c = self.obs.main_cpu_cores
        return c is not None and c >= self.t.main_cpu_saturated_cores

    def cpu_limit_saturated(self) -> tuple[bool, str]:
        o = self.obs
        if not _positive(o.cpu_limit_cores):
            return False, ""
        used = (o.main_cpu_cores or 0.0) + (o.worker_cpu_cores or 0.0)
        if o.main_cpu_cores is None and o.worker_cpu_cores is None:
            return False, ""
        share = used / o.cpu_limit_cores  # type: ignore[operator]
        sentence = (
            f"training process and loader workers use {used:.2f} of the {o.cpu_limit_cores:.2f}-core "
            f"CPU limit ({_pct(share)}, saturated ≥ {_thr(self.t.worker_cpu_saturated)})"
        )
        return share >= self.t.worker_cpu_saturated, sentence

    # --- rules ------------------------------------------------------------------
    def sampled_sentence(self) -> str:
        """What the window did measure, in words (for a window without a training step)."""
        o, d = self.obs, self.d
        parts: list[str] = []
        if o.main_cpu_cores is not None:
            parts.append(f"the main process used {o.main_cpu_cores:.2f} CPU cores")
        if o.gpu_utilization is not None:
            parts.append(f"GPU utilization {_pct(o.gpu_utilization)}")
        elif d.gpu_signals:
            parts.append("GPU counters")
        elif o.gpu_count == 0:
            parts.append("no GPU is the job's (a CPU-only job)")
        if o.node_cpu_utilization is not None:
            parts.append(f"node CPU {_pct(o.node_cpu_utilization)} busy")
        if o.container_memory_ratio is not None:
            parts.append(f"container memory {_pct(o.container_memory_ratio)} of its limit")
        if not parts:
            return (
                "nothing else was sampled: the training process is found through its probe file, "
                "which it writes from its first batch on"
            )
        return "sampled in the window: " + ", ".join(parts)

    def insufficient(self) -> _Finding | None:
        o, t = self.obs, self.t
        steps = o.job_steps if o.job_steps is not None else o.steps
        nothing = o.data_wait_ratio is None and not self.d.gpu_signals and o.main_cpu_cores is None
        if steps == 0 or (steps is None and nothing):
            # No batch was delivered: the command never iterated a DataLoader (a custom loop, or
            # it exited or failed before its first step). Say so, and how to measure a custom loop.
            return _Finding(
                Regime.UNKNOWN,
                "collect-more-evidence",
                0.0,
                evidence=[
                    "no training step was seen in the window: no DataLoader was iterated (a custom "
                    "training loop, or the command exited before its first step)",
                    self.sampled_sentence(),
                ],
                missing=[
                    "steps: a custom loop is measured by wrapping its batches, "
                    "`for batch in dam_probe.instrument(batches):` (docs/probe.md, Explicit API)",
                    "dataWaitRatio",
                ],
            )
        if steps is not None and steps < t.min_steps:
            per_rank = " per rank" if o.job_steps is not None else ""
            return _Finding(
                Regime.UNKNOWN,
                "collect-more-evidence",
                0.0,
                evidence=[f"only {steps:.0f} steps{per_rank} in the window (need at least {t.min_steps})"],
                missing=[f"steps (at least {t.min_steps} per window; a longer window or a running job)"],
            )
        if nothing:
            return _Finding(
                Regime.UNKNOWN,
                "collect-more-evidence",
                0.0,
                evidence=["no data-wait ratio, no GPU counters and no CPU figures in the window"],
                missing=["dataWaitRatio (instrument the training loop)", "gpuUtilization", "mainCpuCores"],
            )
        return None

    def container_full(self) -> bool:
        x = self.obs.container_memory_ratio
        return x is not None and x >= self.t.container_memory_full

    def rss_corroborates(self) -> bool:
        o = self.obs
        if not o.container_memory_limit_bytes or (o.main_rss_bytes is None and o.worker_rss_bytes is None):
            return False
        rss = (o.main_rss_bytes or 0.0) + (o.worker_rss_bytes or 0.0)
        return rss >= RSS_CORROBORATES * o.container_memory_limit_bytes

    def memory_capacity(self) -> _Finding | None:
        o, t, d = self.obs, self.t, self.d
        killed = o.oom_killed is True
        kills = o.oom_kills is not None and o.oom_kills > 0
        # Certain, not inferred from a 1 Hz memory sample: DataLoader itself said its worker was killed.
        loader_killed = o.loader_worker_kills is not None and o.loader_worker_kills > 0
        gpu_full = o.gpu_memory_used_ratio is not None and o.gpu_memory_used_ratio > t.gpu_memory_full
        host_full = self.container_full() and self.rss_corroborates()
        if not (killed or kills or loader_killed or gpu_full or host_full):
            return None
        ev: list[str] = []
        missing: list[str] = []
        if killed:
            ev.append("the training container was OOM-killed (reason OOMKilled): host memory ran out")
        if kills:
            ev.append(
                f"{o.oom_kills:.0f} OOM kill{'s' if o.oom_kills != 1 else ''} in the container's cgroup "
                "in the window"
            )
        if o.container_memory_ratio is not None:
            ev.append(self.container_memory_sentence())
        if gpu_full:
            assert o.gpu_memory_used_ratio is not None
            ev.append(
                f"GPU memory {_pct(o.gpu_memory_used_ratio)} used on the fullest GPU "
                f"(full > {_thr(t.gpu_memory_full)}; the caching allocator keeps freed blocks, "
                "so the peak may be a little lower)"
            )
        rss = self.rss_sentence()
        if rss:
            ev.append(rss)

        if loader_killed:
            assert o.loader_worker_kills is not None
            n = o.loader_worker_kills
            ev.append(
                f"{n:.0f} DataLoader worker{'s' if n != 1 else ''} killed in the window (DataLoader's own "
                "error, seen by the probe): the OOM killer took the loader, not the training process"
            )
            w_rss, m_rss = o.worker_rss_bytes, o.main_rss_bytes
            if w_rss is not None and w_rss > 0 and (m_rss is None or w_rss >= m_rss):
                ev.append(
                    "the loader workers hold most of the resident memory (each worker copies what it touches)"
                )
            return _Finding(
                Regime.MEMORY_CAPACITY,
                "reduce-loader-memory",
                0.95 if killed or kills else 0.85,
                evidence=ev,
                missing=missing,
                also=("raise-memory-limit", "smaller-micro-batch"),
            )
        if killed or kills or host_full:
            # Host (cgroup) memory: CUDA out-of-memory raises in Python, it is not a kill.
            conf = 0.95 if killed and kills else (0.9 if killed or kills else 0.5)
            workers = (o.worker_count or 0) > 0 or (o.worker_rss_bytes or 0.0) > 0
            w_rss, m_rss = o.worker_rss_bytes, o.main_rss_bytes
            if w_rss is not None and w_rss > 0 and (m_rss is None or w_rss >= m_rss):
                ev.append(
                    "the loader workers hold most of the resident memory (each worker copies what it touches)"
                )
                return _Finding(
                    Regime.MEMORY_CAPACITY,
                    "reduce-loader-memory",
                    conf,
                    evidence=ev,
                    missing=missing,
                    also=("raise-memory-limit", "smaller-micro-batch"),
                )
            if workers and not (m_rss is not None and w_rss is not None):
                missing.append("workerRssBytes and mainRssBytes (which process holds the memory)")
                ev.append(
                    "DataLoader workers run in the container and host memory ran out: suspect the loader"
                )
                return _Finding(
                    Regime.MEMORY_CAPACITY,
                    "reduce-loader-memory",
                    conf - 0.1,
                    evidence=ev,
                    missing=missing,
                    also=("raise-memory-limit", "smaller-micro-batch"),
                )
            if o.main_rss_bytes is None and o.worker_rss_bytes is None:
                missing.append("mainRssBytes and workerRssBytes (which process holds the memory)")
                conf -= 0.1
            if d.cpu_only:
                ev.append("a CPU-only job: activations and optimizer state live in host memory")
                return _Finding(
                    Regime.MEMORY_CAPACITY,
                    "smaller-micro-batch",
                    conf,
                    evidence=ev,
                    missing=missing,
                    also=("activation-checkpointing", "raise-memory-limit"),
                )
            ev.append("the main process holds the host memory")
            return _Finding(
                Regime.MEMORY_CAPACITY,
                "raise-memory-limit",
                conf,
                evidence=ev,
                missing=missing,
                also=("smaller-micro-batch", "reduce-loader-memory"),
            )

        assert o.gpu_memory_used_ratio is not None
        conf = 0.7 if o.gpu_memory_used_ratio >= 0.99 else 0.65
        if (o.ranks or 0) > 1 or (o.gpu_count or 0) > 1:
            ev.append(
                "several data-parallel replicas each hold the full parameters, gradients and optimizer state"
            )
            return _Finding(
                Regime.MEMORY_CAPACITY,
                "shard-model-states",
                conf,
                evidence=ev,
                missing=missing,
                also=("activation-checkpointing", "smaller-micro-batch"),
            )
        return _Finding(
            Regime.MEMORY_CAPACITY,
            "activation-checkpointing",
            conf,
            evidence=ev,
            missing=missing,
            also=("smaller-micro-batch", "shard-model-states"),
        )

    def communication_bound(self) -> _Finding | None:
        o, t = self.obs, self.t
        x = o.exposed_communication_ratio
        if x is None or x <= t.communication_suspect:
            return None
        conf = 0.85 if x >= 2 * t.communication_suspect else 0.7
        ev = [self.exposed_sentence()]
        missing: list[str] = []
        if o.collective_skew is not None:
            ev.append(
                f"collective skew {_pct(o.collective_skew)} of the step: waiting for a late peer is not "
                "counted as communication"
            )
        else:
            conf -= 0.1
            missing.append("collectiveSeconds from every rank (to correct for waiting on a late peer)")
        lever = "overlap-gradient-communication"
        c = o.collective_ratio
        if c is not None and c > 0:
            hidden = max(0.0, 1.0 - x / c)
            ev.append(f"collectives take {_pct(c)} of the step time, {hidden:.0%} of it hidden by overlap")
            if hidden >= OVERLAP_HIDDEN_WELL:
                lever = "accumulate-gradients"
                ev.append("overlap already hides most of it: synchronise less often")
        if o.collectives is not None and o.steps:
            text = f"{o.collectives / o.steps:.1f} collectives per step"
            if o.collective_bytes is not None:
                text += f", {o.collective_bytes / o.steps / 1e6:.1f} MB per step"
            ev.append(text)
        links = []
        if o.nvlink_bytes_per_second is not None:
            links.append(f"NVLink {o.nvlink_bytes_per_second / 1e9:.2f} GB/s")
        if o.pcie_bytes_per_second is not None:
            links.append(f"PCIe {o.pcie_bytes_per_second / 1e9:.2f} GB/s")
        if links:
            ev.append("interconnect traffic: " + ", ".join(links))
            if not o.nvlink_bytes_per_second and (o.pcie_bytes_per_second or 0.0) > 0:
                ev.append("no NVLink traffic: the ranks talk over PCIe or the network")
        if (o.data_wait_ratio or 0.0) > t.data_wait_suspect:
            ev.append(self.wait_sentence())
        return _Finding(Regime.COMMUNICATION_BOUND, lever, conf, evidence=ev, missing=missing)

    def checkpoint_bound(self) -> _Finding | None:
        """Saves block the training thread above ``checkpoint_suspect`` of the wall time, and more than
        the data wait or the exposed communication does (the largest loss is cut first)."""
        o, t = self.obs, self.t
        x = o.checkpoint_ratio
        if x is None or x <= t.checkpoint_suspect:
            return None
        if self.communication_bound() is not None and (o.exposed_communication_ratio or 0.0) > x:
            return None
        if self.input_bound() is not None and (o.data_wait_ratio or 0.0) > x:
            return None
        ev = [
            f"checkpoint saves blocked the training thread {_pct(x)} of the window "
            f"(screen > {_thr(t.checkpoint_suspect)}): the accelerator waits while the state is written"
        ]
        conf = 0.85 if x >= 2 * t.checkpoint_suspect else 0.7
        lever = "async-checkpoint"
        saves, steps = o.checkpoints, o.job_steps if o.job_steps is not None else o.steps
        if saves and o.checkpoint_seconds is not None:
            text = f"{saves:.0f} saves in the window, {o.checkpoint_seconds / saves:.2f} s each"
            if steps:
                every = steps / saves
                text += f", one every {every:.0f} steps"
                if every < CHECKPOINT_OFTEN_STEPS:
                    lever = "checkpoint-less-often"
                    text += f" (more often than every {CHECKPOINT_OFTEN_STEPS} steps: save less often)"
            ev.append(text)
        if o.data_wait_ratio is not None:
            ev.append(self.wait_sentence())
        if o.gpu_utilization is not None:
            ev.append(self.util_sentence())
        return _Finding(Regime.CHECKPOINT_BOUND, lever, conf, evidence=ev)

    def data_or_communication(self) -> _Finding | None:
        comm = self.communication_bound()
        data = self.input_bound()
        if comm is None or data is None:
            return comm or data
        # Both screens fire: the larger share of the step is the bottleneck.
        x = self.obs.exposed_communication_ratio or 0.0
        w = self.obs.data_wait_ratio or 0.0
        return comm if x > w else data

    def input_bound(self) -> _Finding | None:
        o, t, d = self.obs, self.t, self.d
        w = o.data_wait_ratio
        if w is None or w <= t.data_wait_suspect:
            return None
        strong = w >= 2 * t.data_wait_suspect
        ev = [self.wait_sentence()]
        missing: list[str] = []
        if o.gpu_utilization is not None:
            if o.gpu_utilization >= t.gpu_util_starved:
                return None  # the queue hides the wait; judged by the GPU rules
            conf = 0.9 if strong else 0.75
            ev.append(self.util_sentence() + ": the accelerator idles while the loop waits for data")
        elif d.cpu_only:
            conf = 0.7 if strong else 0.6
            if not d.cpu_only_declared:
                conf -= 0.05
                missing.append("gpuUtilization (no GPU counters: judged from the data wait alone)")
            ev.append("no GPU counters (CPU-only job): judged from the data wait alone")
        else:
            conf = 0.6 if strong else 0.5
            missing.append("gpuUtilization (GPU present but not measured)")
            ev.append("GPU utilization not measured: judged from the data wait alone")

        finding = _Finding(
            Regime.INPUT_BOUND, levers.INCREASE_DATALOADER_WORKERS, conf, evidence=ev, missing=missing
        )
        limit_saturated, limit_sentence = self.cpu_limit_saturated()
        if self.throttled():
            finding.lever = levers.RAISE_CPU_LIMIT
            finding.boundary, finding.boundary_set = Axis.MACHINE, True
            ev.append(self.throttle_sentence() + ": the host CPU quota starves the loader")
        elif limit_saturated:
            finding.lever = levers.RAISE_CPU_LIMIT
            finding.boundary, finding.boundary_set = Axis.MACHINE, True
            ev.append(limit_sentence)
        elif (starved_by_node := self.loader_contended()) is not None:
            finding.lever = "raise-cpu-request"
            finding.boundary, finding.boundary_set = Axis.MACHINE, True
            ev.append(starved_by_node)
        elif o.worker_count is not None and o.worker_count == 0:
            ev.append("batches are loaded in the main process (no DataLoader workers)")
        elif o.worker_count and o.worker_cpu_cores is not None and o.worker_cpu_cores / o.worker_count < 0.5:
            finding.lever = "use-sequential-shards"
            ev.append(
                f"{o.worker_count} loader workers use only {o.worker_cpu_cores:.2f} CPU cores: "
                "they wait on storage, not on decoding"
            )
        elif o.worker_cpu_cores is not None:
            ev.append(f"loader workers use {o.worker_cpu_cores:.2f} CPU cores")
        return finding

    def gpu_fed(self) -> _Finding | None:
        o, t, d = self.obs, self.t, self.d
        u = o.gpu_utilization
        if u is None or u < t.gpu_util_starved:
            return None
        ev = [self.util_sentence()]
        missing: list[str] = []
        w = o.data_wait_ratio
        if w is not None and w > t.data_wait_suspect:
            ev.append(
                self.wait_sentence() + " but the GPU stays busy: the asynchronous queue hides it, "
                "Data is not the bottleneck"
            )
        penalty = 0.0 if u >= t.gpu_util_busy else 0.15
        if w is None:
            penalty += 0.05
            missing.append("dataWaitRatio")

        dram = o.dram_bandwidth_utilization
        ai, ridge = d.arithmetic_intensity, d.ridge_point
        intensity_sentence = None
        if ai is not None and ridge is not None:
            intensity_sentence = f"arithmetic intensity {ai:.0f} FLOP/B vs ridge point {ridge:.0f} FLOP/B" + (
                f" ({self.hw.gpu_model})" if self.hw and self.hw.gpu_model else ""
            )
        memory_lever = "fuse-operators"
        if o.batch_size is not None and 0 < o.batch_size <= 4:
            memory_lever = "increase-batch-size"
        if dram is not None and dram >= t.dram_bandwidth_saturated:
            ev.append(self.dram_sentence() + ": device memory bandwidth limits the step")
            if intensity_sentence:
                ev.append(intensity_sentence)
            return _Finding(Regime.MEMORY_BOUND, memory_lever, 0.9 - penalty, evidence=ev, missing=missing)
        if dram is None and ai is not None and ridge is not None and ai < ridge:
            ev.append(intensity_sentence + ": below the ridge point")  # type: ignore[operator]
            missing.append("dramBandwidthUtilization (GPM, Hopper+)")
            return _Finding(Regime.MEMORY_BOUND, memory_lever, 0.75 - penalty, evidence=ev, missing=missing)
        if dram is None and o.gpu_memory_busy is not None and o.gpu_memory_busy >= t.dram_bandwidth_saturated:
            ev.append(
                f"GPU memory busy {_pct(o.gpu_memory_busy)} of the time (NVML; a weak proxy for bandwidth)"
            )
            missing.append("dramBandwidthUtilization (GPM, Hopper+)")
            return _Finding(Regime.MEMORY_BOUND, memory_lever, 0.55 - penalty, evidence=ev, missing=missing)

        sm = o.sm_active
        if sm is not None and sm < t.sm_active_busy:
            ev.append(
                self.sm_sentence() + ": kernels are resident but too small to fill the SMs "
                "(utilization counts any resident kernel)"
            )
            if dram is not None:
                ev.append(self.dram_sentence())
            lever = "increase-batch-size" if o.batch_size is None or o.batch_size <= 64 else "fuse-operators"
            return _Finding(Regime.LATENCY_BOUND, lever, 0.7 - penalty, evidence=ev, missing=missing)

        # compute-bound
        conf = 0.9 - penalty
        if sm is not None:
            ev.append(self.sm_sentence())
        else:
            conf -= 0.15
            missing.append("smActive (GPM, Hopper+)")
        if dram is not None:
            ev.append(self.dram_sentence() + ": memory bandwidth is not the limit")
        elif ai is not None and ridge is not None:
            ev.append(intensity_sentence + ": above the ridge point")  # type: ignore[operator]
            conf -= 0.05
        else:
            conf -= 0.1
            missing.append("dramBandwidthUtilization (GPM, Hopper+)")
        lever = "enable-bf16"
        tensor, mfu = o.tensor_active, d.mfu
        if tensor is not None:
            ev.append(self.tensor_sentence())
        if tensor is not None and tensor < t.tensor_active_low:
            ev[-1] += ": matrix math does not use the tensor cores"
        elif mfu is not None and mfu < t.mfu_investigate:
            lever = "torch-compile"
            ev.append(
                f"MFU {_pct(mfu)} (investigate < {_thr(t.mfu_investigate)}): "
                "hardware efficiency η is low, fuse the kernels"
            )
        elif (mfu is not None and mfu >= t.mfu_investigate) or tensor is not None:
            lever = "faster-accelerator"
            if mfu is not None:
                ev.append(
                    f"MFU {_pct(mfu)} (efficient > {_thr(t.mfu_efficient)}): the work itself is the limit"
                )
        else:
            missing.append("tensorActive or modelFlopsPerStep (to tell bf16 from a faster accelerator)")
            ev.append("tensor-core activity and MFU unknown: check bf16/TF32 first")
        return _Finding(Regime.COMPUTE_BOUND, lever, conf, evidence=ev, missing=missing)

    def cpu_contention(self) -> _Finding | None:
        """A busy node: the training process is runnable but waits for a CPU (Machine, ``raise-cpu-request``).

        Not under CFS throttling: a throttled cgroup's runnable tasks also accrue run-queue delay,
        and there the quota (``raise-cpu-limit``, the throttling rules) is the cause, not the node.
        """
        o, t, d = self.obs, self.t, self.d
        if not self.contended() or self.throttled():
            return None
        x = o.cpu_wait_ratio
        assert x is not None
        ev = [self.cpu_wait_sentence() + ": it is ready to run but other processes hold the node's cores"]
        missing: list[str] = []
        conf = 0.85 if x >= 2 * t.cpu_wait_suspect else 0.7
        step = d.step_seconds
        if step is not None:
            ev.append(
                f"with a CPU of its own the {step * 1000:.1f} ms step would take about "
                f"{step * (1.0 - x) * 1000:.1f} ms (the time it waited taken out)"
            )
        if o.main_cpu_cores is not None:
            ev.append(self.main_cpu_sentence())
        node = o.node_cpu_utilization
        if node is not None:
            ev.append(f"node CPU {_pct(node)} busy")
        if o.gpu_utilization is not None:
            ev.append(self.util_sentence() + ": the host cannot issue work fast enough")
        if o.data_wait_ratio is not None:
            ev.append(self.wait_sentence() + ": the loader is not the cause")
        else:
            conf -= 0.1
            missing.append("dataWaitRatio")
        return _Finding(
            Regime.COMPUTE_BOUND,
            "raise-cpu-request",
            conf,
            boundary=None,
            boundary_set=True,
            evidence=ev,
            missing=missing,
            also=(),
        )

    def gpu_starved(self) -> _Finding | None:
        o, t = self.obs, self.t
        u = o.gpu_utilization
        if u is None or u >= t.gpu_util_starved:
            return None
        ev = [self.util_sentence()]
        missing: list[str] = []
        w = o.data_wait_ratio
        saturated = self.main_saturated()
        batch1 = o.batch_size == 1
        if w is None:
            if not (saturated or batch1):
                return _Finding(
                    Regime.UNKNOWN,
                    "collect-more-evidence",
                    0.0,
                    evidence=[*ev, "the GPU idles but the data wait is not measured"],
                    missing=["dataWaitRatio (instrument the training loop to tell Data from overhead)"],
                )
            conf = 0.5
            missing.append("dataWaitRatio")
        else:
            conf = 0.6
            ev.append(self.wait_sentence() + ": the loader is not the cause")
            if w > t.data_wait_fine:
                conf -= 0.1
        if o.main_cpu_cores is not None:
            ev.append(self.main_cpu_sentence())
        else:
            missing.append("mainCpuCores")
        if saturated:
            conf += 0.2
        if batch1:
            conf += 0.1
        if o.sm_active is not None:
            ev.append(self.sm_sentence())
        if self.throttled():
            ev.append(self.throttle_sentence() + ": the host cannot issue work fast enough")
            return _Finding(
                Regime.LATENCY_BOUND,
                levers.RAISE_CPU_LIMIT,
                conf,
                boundary=Axis.MACHINE,
                boundary_set=True,
                evidence=ev,
                missing=missing,
            )
        if batch1:
            lever = "increase-batch-size"
        elif saturated:
            lever = "cuda-graphs"
            ev.append("the Python thread is busy launching work while the GPU idles (launch overhead)")
        elif o.main_cpu_cores is None:
            lever = "remove-host-syncs"
            ev.append(
                "the loader is not the cause and the main process's CPU is not measured: suspect "
                "per-step host synchronisation or launch overhead"
            )
        else:
            lever = "remove-host-syncs"
            ev.append(
                "neither the loader nor the Python thread is busy: suspect per-step host synchronisation"
            )
        return _Finding(Regime.LATENCY_BOUND, lever, conf, evidence=ev, missing=missing)

    def cpu_only(self) -> _Finding:
        o, d = self.obs, self.d
        ev: list[str] = []
        missing: list[str] = []
        base = 0.7 if d.cpu_only_declared else 0.55
        if not d.cpu_only_declared:
            missing.append("gpuUtilization (no GPU counters: treated as a CPU-only job)")
        ev.append("no GPU counters: treated as a CPU-only job")
        if o.data_wait_ratio is None:
            return _Finding(
                Regime.UNKNOWN,
                "collect-more-evidence",
                0.0,
                evidence=ev,
                missing=["dataWaitRatio (instrument the training loop)", *missing],
            )
        ev.insert(0, self.wait_sentence() + ": the loader is not the cause")
        if self.throttled():
            ev.append(self.throttle_sentence() + ": the CPU quota limits the arithmetic")
            return _Finding(
                Regime.COMPUTE_BOUND,
                levers.RAISE_CPU_LIMIT,
                base - 0.1,
                boundary=None,
                boundary_set=True,
                evidence=ev,
                missing=missing,
                also=("move-to-accelerator",),
            )
        if o.main_cpu_cores is None:
            return _Finding(
                Regime.UNKNOWN,
                "collect-more-evidence",
                0.0,
                evidence=ev,
                missing=["mainCpuCores", *missing],
            )
        ev.append(self.main_cpu_sentence())
        if self.main_saturated() and o.batch_size == 1 and (o.main_cpu_cores or 0.0) < CPU_MULTI_THREAD_CORES:
            ev.append(
                "one Python thread is saturated at batch size 1: per-step overhead, not arithmetic, "
                "dominates (multi-threaded CPU compute would use more than one core)"
            )
            return _Finding(
                Regime.LATENCY_BOUND, "increase-batch-size", base - 0.1, evidence=ev, missing=missing
            )
        if self.main_saturated():
            ev.append("the training process computes on the CPU")
            return _Finding(
                Regime.COMPUTE_BOUND,
                "move-to-accelerator",
                base,
                evidence=ev,
                missing=missing,
                also=("torch-compile", "reduce-python-ops"),
            )
        node = o.node_cpu_utilization
        waited = o.cpu_wait_ratio
        if node is not None and node >= NODE_CPU_BUSY and waited is not None:
            # The run-queue delay measures the competition itself (rule 6 names it when it is high):
            # measured and low, the busy node is not what holds this process back — a process that
            # sleeps or blocks off the CPU gets no verdict from the node's load.
            ev.append(
                f"node CPU {node:.0%} busy, but the main training process waited for a CPU only "
                f"{_pct(waited)} of the window (run-queue delay): the node's load does not hold it back"
            )
        elif node is not None and node >= NODE_CPU_BUSY:
            ev.append(
                f"node CPU {node:.0%} busy (≥ {NODE_CPU_BUSY:.0%}): the training process competes for cores, "
                "so the host CPU limits the arithmetic"
            )
            return _Finding(
                Regime.COMPUTE_BOUND,
                "move-to-accelerator",
                base - 0.15,
                evidence=ev,
                missing=missing,
                also=(levers.RAISE_CPU_LIMIT,),
            )
        ev.append("neither the data wait nor CPU use explains the step time")
        return _Finding(
            Regime.UNKNOWN,
            "collect-more-evidence",
            0.0,
            evidence=ev,
            missing=["a busy signal (GPU counters, or a profile of where the step sleeps)", *missing],
        )

    def gpu_unmeasured(self) -> _Finding:
        ev = []
        if self.obs.data_wait_ratio is not None:
            ev.append(self.wait_sentence() + ": the loader is not the cause")
        ev.append("GPU present but its utilization is not measured")
        return _Finding(
            Regime.UNKNOWN,
            "collect-more-evidence",
            0.0,
            evidence=ev,
            missing=["gpuUtilization (is NVML reachable from the sidecar?)"],
        )

    def decide(self) -> _Finding:
        memory = self.memory_capacity()
        if memory is None:
            return self.decide_rest()
        rest = self.decide_rest()
        if rest.regime is not Regime.UNKNOWN:
            memory.evidence.append(
                f"apart from memory the window reads as {rest.regime.value} (lever {rest.lever})"
            )
        return memory

    def decide_rest(self) -> _Finding:
        for rule in (
            self.insufficient,
            self.checkpoint_bound,
            self.data_or_communication,
            self.gpu_fed,
            self.cpu_contention,
            self.gpu_starved,
        ):
            found = rule()
            if found is not None:
                return found
        if self.d.cpu_only:
            return self.cpu_only()
        return self.gpu_unmeasured()

    # --- context evidence shared by all verdicts -------------------------------
    def context(self, f: _Finding) -> None:
        o, t, d = self.obs, self.t, self.d
        if o.batch_size == 1:
            f.evidence.append(
                "batch size 1: launch overhead and latency may dominate; confirm before blaming the algorithm"
            )
        if self.throttled() and not any("throttled" in e for e in f.evidence):
            f.evidence.append(self.throttle_sentence())
        if self.contended() and not any("waited for a CPU" in e for e in f.evidence):
            f.evidence.append(self.cpu_wait_sentence())
        if o.exposed_communication_ratio is not None and not any(
            e.startswith("exposed communication") for e in f.evidence
        ):
            f.evidence.append(self.exposed_sentence())
        if self.container_full() and not any(e.startswith("container memory") for e in f.evidence):
            f.evidence.append(self.container_memory_sentence() + ": an OOM kill may follow")
        if d.mfu is not None and not any(e.startswith("MFU") for e in f.evidence):
            label = (
                "efficient"
                if d.mfu > t.mfu_efficient
                else ("investigate" if d.mfu < t.mfu_investigate else "")
            )
            f.evidence.append(f"MFU {_pct(d.mfu)}" + (f" ({label})" if label else ""))
            if d.mfu > 1.0:
                f.evidence.append("MFU above 100%: check flops_per_step and the peak FLOP/s")
        if d.steps_per_second is not None:
            text = f"{d.steps_per_second:.2f} steps/s"
            steps = o.job_steps if o.job_steps is not None else o.steps
            if steps is not None and o.window_seconds is not None:
                text += f" ({steps:.0f} steps in {o.window_seconds:.0f} s)"  # without_sample_size
            if o.job_steps is not None:
                text += ", each rank"
            f.evidence.append(text)
        if o.steps is None and f.regime is not Regime.UNKNOWN:
            f.confidence -= 0.05
            f.missing.append("steps")


def _metrics(obs: Observation, d: Derived) -> WindowMetrics:
    return WindowMetrics(
        data_wait_ratio=obs.data_wait_ratio,
        gpu_utilization=obs.gpu_utilization,
        gpu_memory_busy=obs.gpu_memory_busy,
        sm_active=obs.sm_active,
        sm_occupancy=obs.sm_occupancy,
        tensor_active=obs.tensor_active,
        dram_bandwidth_utilization=obs.dram_bandwidth_utilization,
        cpu_throttled_ratio=obs.cpu_throttled_ratio,
        main_cpu_cores=obs.main_cpu_cores,
        worker_cpu_cores=obs.worker_cpu_cores,
        worker_count=obs.worker_count,
        cpu_wait_ratio=obs.cpu_wait_ratio,
        worker_cpu_wait_ratio=obs.worker_cpu_wait_ratio,
        steps_per_second=d.steps_per_second,
        mfu=d.mfu,
        flops_per_step=obs.flops_per_step,
        flops_per_step_source=obs.flops_per_step_source if obs.flops_per_step is not None else None,
        checkpoint_ratio=obs.checkpoint_ratio,
        arithmetic_intensity=d.arithmetic_intensity,
        ridge_point=d.ridge_point,
        iron_law=d.iron_law,
        collective_ratio=obs.collective_ratio,
        exposed_communication_ratio=obs.exposed_communication_ratio,
        collective_skew=obs.collective_skew,
        nvlink_bytes_per_second=obs.nvlink_bytes_per_second,
        pcie_bytes_per_second=obs.pcie_bytes_per_second,
        gpu_memory_used_ratio=obs.gpu_memory_used_ratio,
        container_memory_ratio=obs.container_memory_ratio,
        oom_kills=obs.oom_kills,
    )


def diagnose(
    obs: Observation,
    thresholds: Thresholds | None = None,
    hardware: Hardware | None = None,
    *,
    ranks: Mapping[RankId, Observation] | None = None,
) -> Verdict:
    """The verdict for one window.

    ``ranks`` (per-rank observations of the same window, e.g. ``window.job_window(...).ranks``)
    adds the straggler (``bottleneck.straggler``) and, for two ranks or more, the worst few
    ranks' figures (``metrics.ranks``). ``obs`` is the job-level observation.

    ``hardware`` holds the user's overrides (spec ``hardware``, ``--gpu-model`` …), never a final
    answer: every entry point passes them here and this is the one place they are resolved, with
    the GPU table's entry for the model (the override's, else ``obs.gpu_model``) as the base.
    """
    t = thresholds or Thresholds()
    straggler = find_straggler(ranks, t) if ranks else None
    held_by = None
    if ranks and straggler is not None and straggler.cause is Axis.DATA and is_synchronous(ranks):
        # A synchronous job steps at its straggler's pace: the late rank's data wait is in every
        # rank's step (its peers spend it waiting in the collectives), not the ranks' mean.
        late = ranks.get(RankId(straggler.pod or "", straggler.rank))
        w = late.data_wait_ratio if late is not None else None
        if w is not None and (obs.data_wait_ratio is None or w > obs.data_wait_ratio):
            held_by = (straggler, obs.data_wait_ratio)
            obs = obs.model_copy(update={"data_wait_ratio": w})
    hw = resolve_hardware(obs.gpu_model, hardware)
    d = derive(obs, hw)
    rules = _Rules(obs, t, hw, d)
    f = rules.decide()
    if held_by is not None:
        late_straggler, mean = held_by
        who = RankId(late_straggler.pod or "", late_straggler.rank).describe()
        mean_text = "" if mean is None else f" (mean over the ranks {_pct(mean)})"
        f.evidence.append(
            f"the data wait is that of {who}, the straggler: every rank of the synchronous job waits for it"
            + mean_text
        )
    rules.context(f)
    axis, boundary = _AXES[f.regime]
    if f.boundary_set:
        boundary = f.boundary
    if f.regime is Regime.UNKNOWN:
        confidence = 0.0
        lever = "collect-more-evidence"
    else:
        confidence = round(min(MAX_CONFIDENCE, max(MIN_CONFIDENCE, f.confidence)), 2)
        lever = f.lever
    bottleneck = Bottleneck(
        axis=axis,
        boundary=boundary,
        regime=f.regime,
        lever=lever,
        lever_detail=levers.detail(lever, f.regime, also=f.also),
        confidence=confidence,
        evidence=f.evidence,
        avoid=[x for x in levers.avoid(f.regime) if x != lever],
        missing=list(dict.fromkeys(f.missing)),
    )
    metrics = _metrics(obs, d)
    if ranks:
        if straggler is not None:
            bottleneck = bottleneck.model_copy(
                update={
                    "straggler": straggler,
                    "evidence": [*bottleneck.evidence, straggler_sentence(straggler)],
                }
            )
        if len(ranks) > 1:
            metrics = metrics.model_copy(update={"rank_count": len(ranks), "ranks": rank_figures(ranks)})
    return Verdict(bottleneck=bottleneck, metrics=metrics)
