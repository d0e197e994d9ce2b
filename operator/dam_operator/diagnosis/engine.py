"""The D·A·M diagnosis: one window of observations in, one verdict out.

Pure and deterministic: no clock, no I/O. The rules are small units in ``diagnosis/rules/``,
listed with their regimes in ``regimes.REGIMES`` and refereed by ``rules.decide``; they are
spelled out, with their thresholds, in ``docs/method.md``. In short, in order:

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
   often than every ``CHECKPOINT_OFTEN_STEPS`` steps. The three are compared as shares of the
   same wall time. Where one rank saves while the others wait for it in the collectives, their
   wait is the checkpoint's (``ranks.save_wait``), not communication.
3. **Communication-bound** (Machine, boundary Algorithm): the *skew-corrected* exposed
   communication — the least-waiting rank's — above ``communication_suspect`` of the step.
   When the job is also input-bound, the larger share of the step wins.
   A screen crossed (communication or data wait) under two screens, beside a rest of the window
   four times as large, is a suspect named in the evidence, not the verdict (``rules.dominance``).
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

from collections.abc import Mapping

from dam_operator.diagnosis import regimes
from dam_operator.diagnosis.axes import Axis, Kind, Regime
from dam_operator.diagnosis.derived import Derived, derive
from dam_operator.diagnosis.evidence import Evidence, note, pct
from dam_operator.diagnosis.gpus import Peak, resolve
from dam_operator.diagnosis.model import (
    Bottleneck,
    Hardware,
    Observation,
    RankId,
    Straggler,
    Thresholds,
    Verdict,
    WindowMetrics,
)
from dam_operator.diagnosis.ranks import (
    SaveWait,
    find_straggler,
    is_synchronous,
    rank_figures,
    save_wait,
    straggler_sentence,
)
from dam_operator.diagnosis.rules import decide
from dam_operator.diagnosis.rules.base import Context, Finding
from dam_operator.diagnosis.rules.context_lines import add_context_lines
from dam_operator.diagnosis.signals import status_values

__all__ = ["Derived", "derive", "diagnose"]

MIN_CONFIDENCE = 0.05
MAX_CONFIDENCE = 0.99


def _metrics(obs: Observation, d: Derived, peak: Peak) -> WindowMetrics:
    """``status.metrics``: the signals' own figures (the signal table's ``status``) and the derived."""
    known = peak.hardware is not None and peak.hardware.peak_flops is not None
    return WindowMetrics(
        **status_values(obs),
        steps_per_second=d.steps_per_second,
        mfu=d.mfu,
        peak_flops=peak.hardware.peak_flops if known and peak.hardware else None,
        peak_basis=peak.basis if known else None,
        arithmetic_intensity=d.arithmetic_intensity,
        ridge_point=d.ridge_point,
        iron_law=d.iron_law,
    )


def _held_by_straggler(
    obs: Observation, ranks: Mapping[RankId, Observation], straggler: Straggler | None
) -> tuple[Observation, Evidence | None]:
    """A synchronous job steps at its straggler's pace: the late rank's data wait is in every
    rank's step (its peers spend it waiting in the collectives), not the ranks' mean."""
    if straggler is None or straggler.cause is not Axis.DATA or not is_synchronous(ranks):
        return obs, None
    who = RankId(straggler.pod or "", straggler.rank)
    late = ranks.get(who)
    w = late.data_wait_ratio if late is not None else None
    if w is None or (obs.data_wait_ratio is not None and w <= obs.data_wait_ratio):
        return obs, None
    mean = obs.data_wait_ratio
    mean_text = "" if mean is None else f" (mean over the ranks {pct(mean)})"
    line = note(
        f"the data wait is that of {who.describe()}, the straggler: "
        "every rank of the synchronous job waits for it" + mean_text
    )
    return obs.model_copy(update={"data_wait_ratio": w}), line


def _without_save_wait(obs: Observation, waits: SaveWait | None) -> Observation:
    """The exposed communication without the wait for a saving rank's checkpoint: where the
    least-waiting rank waits for it (``ranks.save_wait``), that wait is checkpoint time."""
    x = obs.exposed_communication_ratio
    if waits is None or waits.exposed_ratio is None or x is None or waits.exposed_ratio >= x:
        return obs
    return obs.model_copy(update={"exposed_communication_ratio": waits.exposed_ratio})


def _bottleneck(f: Finding, straggler: Straggler | None) -> Bottleneck:
    spec = regimes.SPECS[f.regime]
    axis, boundary = spec.axis, spec.boundary
    if f.boundary_set:
        boundary = f.boundary
    if f.regime is Regime.UNKNOWN:
        confidence, lever = 0.0, "collect-more-evidence"
    else:
        confidence = round(min(MAX_CONFIDENCE, max(MIN_CONFIDENCE, f.confidence)), 2)
        lever = f.lever
    records = list(f.evidence)
    if straggler is not None:
        records.append(Evidence(Kind.STRAGGLER, straggler_sentence(straggler)))
    return Bottleneck.of(
        records,
        axis=axis,
        boundary=boundary,
        regime=f.regime,
        lever=lever,
        lever_detail=regimes.detail(lever, f.regime, also=f.also),
        confidence=confidence,
        avoid=[x for x in regimes.avoid(f.regime) if x != lever],
        missing=list(dict.fromkeys(f.missing)),
        straggler=straggler,
    )


def diagnose(
    obs: Observation,
    thresholds: Thresholds | None = None,
    hardware: Hardware | None = None,
    *,
    ranks: Mapping[RankId, Observation] | None = None,
) -> Verdict:
    """The verdict for one window: the referee's pick among the answers of ``regimes.RULES``,
    with the lines every verdict carries (``rules.context_lines``).

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
    if ranks:
        obs, held_by = _held_by_straggler(obs, ranks, straggler)
    waits = save_wait(ranks) if ranks else None
    obs = _without_save_wait(obs, waits)
    peak = resolve(obs.gpu_model, hardware, precision=obs.matmul_precision, slice_ratio=obs.gpu_slice_ratio)
    hw = peak.hardware
    d = derive(obs, hw)
    ctx = Context(obs, t, hw, d, save_wait=waits)
    f = decide(ctx, regimes.RULES)
    if held_by is not None:
        f.evidence.append(held_by)
    add_context_lines(ctx, f)
    metrics = _metrics(obs, d, peak)
    if ranks and len(ranks) > 1:
        metrics = metrics.model_copy(update={"rank_count": len(ranks), "ranks": rank_figures(ranks)})
    return Verdict(bottleneck=_bottleneck(f, straggler if ranks else None), metrics=metrics)
