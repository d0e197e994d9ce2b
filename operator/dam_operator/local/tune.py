"""``dam tune [--budget S] [--window S] [--json] -- CMD ...``: change a DataLoader setting, keep what helps.

1. **Baseline.** CMD runs under the probe (the same machinery as ``dam run``), and is
   measured for ``--window`` seconds once ``--warmup`` seconds have passed since its
   first training step; then it is stopped (SIGTERM to its whole process group, SIGKILL
   after a grace period). The window is diagnosed.
2. **Only a lever it can pull is pulled.** The verdict's lever must be an Apply lever
   (``levers.APPLY``, the table the operator's Apply mode reads too) for the verdict's
   regime that reaches the job through the probe's DataLoader overrides: today the
   input-pipeline levers of an input-bound job. Any other verdict (compute-bound,
   unknown, …) ends the run with the reason; so does an input-bound verdict whose lever is
   not a DataLoader setting (``raise-cpu-limit``, ``use-sequential-shards``).
3. **Hill climb** (the table's ladders and its one climb, ``climb.next_value``). CMD is
   restarted with one setting changed through the probe's DataLoader overrides
   (``DAM_LOADER_OVERRIDES``, ``dam_probe.overrides``) and measured again the same way:
   for ``increase-dataloader-workers``, ``num_workers`` 0 → 1 → 2 → 4 …, bounded by the
   CPUs the job may use (its affinity and its cgroup CPU limit), then ``prefetch_factor``
   2 → 4 → 8 → 16.
   A change is **kept** only when its steps/s beat the best so far by more than the
   measurement's noise and by at least ``MIN_GAIN`` (5 %). A lever's climb stops at its
   first step that gains nothing — except 0 → 1 worker, which moves loading out of the
   training process without parallelising it, so 2 workers are still tried — or at its
   bound. Everything stops when the budget is spent or the job is no longer input-bound.

**Noise.** Steps/s of a measurement is steps over the window; its noise is estimated
from the spread of the per-interval step rates inside the window: the standard error of
their mean (sample standard deviation / √n). A candidate beats the best when its gain
exceeds ``NOISE_SIGMAS`` (2) × the standard error of the difference,
√(SE_best² + SE_candidate²) — about a 95 % one-sided test if the rates were independent.

CMD is started once per trial, so it must be safe to run again (checkpoints and logs it
writes are written again). ``--json`` prints the result in the shape of
docs/architecture.md: ``baseline``, ``trials`` (each with ``kept``), ``best``,
``applied`` and ``reason``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import FrameType
from typing import Any, Final, Protocol

from dam_contract.snapshot import Snapshot
from dam_operator.diagnosis import climb, levers
from dam_operator.diagnosis.climb import ApplyLever, Channel, Tried
from dam_operator.diagnosis.levers import NUM_WORKERS, PREFETCH_FACTOR, Regime
from dam_operator.diagnosis.model import Observation, Verdict
from dam_operator.diagnosis.window import observation_from_snapshots
from dam_operator.local.child import (
    SourceFactory,
    Workspace,
    child_environment,
    command_after_dashes,
    default_source,
    fresh_probe_dir,
    probe_workspace,
    sample_while_running,
    shell_exit_status,
    stop_process_group,
)
from dam_operator.local.session import job_steps_of, steps_of, verdict_between
from dam_probe.cgroup import CgroupReader
from dam_probe.overrides import ENV_LOADER_OVERRIDES, MAX_PREFETCH, loader_override_env

PROG: Final = "dam tune"
CHANNELS: Final = frozenset({Channel.LOADER})
"""What ``dam tune`` can apply: the probe's DataLoader overrides in the command's environment."""
MIN_GAIN: Final = 0.05
"""A change must gain at least this share of the best steps/s (as well as beat the noise)."""
NOISE_SIGMAS: Final = 2.0
"""A change must gain more than this many standard errors of the difference of two means."""
PREFETCH_CAP: Final = min(16, MAX_PREFETCH)
"""prefetch_factor climbs 2 → 4 → 8 → 16 at most (each batch in flight costs host memory)."""
MIN_INTERVALS: Final = 3
"""A measurement needs at least this many sampling intervals with training in them."""
STOP_GRACE_SECONDS: Final = 5.0

Settings = dict[str, int]


# --- pure parts ------------------------------------------------------------------------------


def interval_rates(points: Sequence[tuple[float, float]]) -> list[float]:
    """Step rates of consecutive ``(seconds, cumulative steps)`` points, one per interval."""
    return [(s1 - s0) / (t1 - t0) for (t0, s0), (t1, s1) in itertools.pairwise(points) if t1 > t0]


def standard_error(rates: Sequence[float]) -> float | None:
    """The standard error of the mean of ``rates`` (sample standard deviation / √n); None below 2."""
    if len(rates) < 2:
        return None
    return statistics.stdev(rates) / math.sqrt(len(rates))


JUDGING: Final = climb.Judging(sigmas=NOISE_SIGMAS, min_gain=MIN_GAIN)
"""How ``dam tune`` judges a trial against the best so far."""


def judge(
    candidate_rate: float,
    candidate_se: float | None,
    best_rate: float,
    best_se: float | None,
    lever: ApplyLever | None = None,
) -> tuple[bool, str]:
    """Whether a candidate's steps/s beat the best's beyond the noise (and by ``MIN_GAIN``), and why
    (``lever``'s own judge, ``climb.judge`` by default)."""
    judged = lever.judge if lever is not None else climb.judge
    j = judged(climb.Rate(best_rate, best_se), climb.Rate(candidate_rate, candidate_se), JUDGING)
    pct = f"{j.gain / best_rate:+.1%}" if best_rate > 0 else f"{j.gain:+.2f} steps/s"
    if j.reason == "beyond-noise":
        return True, f"{pct}, beyond the noise (±{j.noise:.2f} steps/s)"
    if j.reason == "slower":
        return False, f"{pct}: slower, beyond the noise (±{j.noise:.2f} steps/s)"
    if j.reason == "within-noise":
        return False, f"{pct}, within the noise (±{j.noise:.2f} steps/s)"
    return False, f"{pct}, less than the {MIN_GAIN:.0%} worth a change"


def cpu_bound(affinity_cpus: int | None, cgroup_limit_cores: float | None) -> int:
    """The most DataLoader workers worth trying: the CPUs the job may run on, at least 1.

    The smaller of its CPU affinity and its cgroup CPU limit (rounded up: 1.5 cores let two
    processes run part of the time).
    """
    bounds = [n for n in (affinity_cpus,) if n]
    if cgroup_limit_cores:
        bounds.append(math.ceil(cgroup_limit_cores - 1e-9))
    return max(1, min(bounds)) if bounds else 1


def setting_value(settings: Mapping[str, int], setting: str) -> int | None:
    """A setting's effective value: the one set, else the table's default (torch's: 0 workers,
    prefetch_factor 2, no pinned memory); None when neither says."""
    lever = levers.APPLY_SETTINGS.get(setting)
    return settings.get(setting, lever.default if lever is not None else None)


def changed_settings(baseline: Mapping[str, int], settings: Mapping[str, int]) -> Settings:
    """The settings that differ from the baseline's: what the overrides must set."""
    return {k: v for k, v in settings.items() if baseline.get(k) != v}


def paste_lines(applied: Mapping[str, int]) -> list[str]:
    """The change as code to paste into the training script, and as the probe's variable."""
    args = ", ".join(f"{k}={v}" for k, v in applied.items())
    env = loader_override_env(dict(applied))[ENV_LOADER_OVERRIDES]
    return [
        "Paste into the training code:",
        f"    DataLoader(dataset, ..., {args})",
        "Or, without a code change, run it under the dam probe (dam run, or a pod with the probe) with:",
        f"    export {ENV_LOADER_OVERRIDES}='{env}'",
    ]


# --- measurements ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Measurement:
    """One run of the command, measured over one window after its warm-up."""

    settings: Settings
    steps_per_second: float
    data_wait_ratio: float | None
    standard_error: float | None
    intervals: int
    window_seconds: float
    verdict: Verdict
    worker_count: int | None
    run_seconds: float
    note: str | None = None
    gpu_count: int | None = None
    seen: Mapping[str, int | None] = field(default_factory=dict)
    """Each Apply setting as the probe read it from the command's DataLoader (``observe``)."""

    @property
    def regime(self) -> Regime:
        return self.verdict.bottleneck.regime

    def doc(self) -> dict[str, Any]:
        """The ``--json`` shape: settings, stepsPerSecond, dataWaitRatio."""
        wait = None if self.data_wait_ratio is None else round(self.data_wait_ratio, 4)
        return {
            "settings": dict(self.settings),
            "stepsPerSecond": round(self.steps_per_second, 3),
            "dataWaitRatio": wait,
        }


@dataclass(frozen=True)
class Trial:
    measurement: Measurement
    kept: bool
    why: str


class MeasureError(Exception):
    """A run gave no measurement (the command failed, trained too little, or the budget ran out)."""


def measurement_from(
    settings: Settings,
    points: Sequence[tuple[float, Snapshot]],
    *,
    run_seconds: float,
    note: str | None = None,
) -> Measurement:
    """The measurement of the window between the first and the last of ``points`` (pure)."""
    (t0, before), (t1, after) = points[0], points[-1]
    obs: Observation = observation_from_snapshots(before, after, elapsed_seconds=(t1 - t0) or None)
    verdict = verdict_between(before, after, (t1 - t0) or None)
    rates = interval_rates([(t, job_steps_of(s)) for t, s in points])
    steps = job_steps_of(after) - job_steps_of(before)
    return Measurement(
        settings=dict(settings),
        steps_per_second=steps / (t1 - t0) if t1 > t0 else 0.0,
        data_wait_ratio=obs.data_wait_ratio,
        standard_error=standard_error(rates),
        intervals=len(rates),
        window_seconds=t1 - t0,
        verdict=verdict,
        worker_count=obs.worker_count,
        run_seconds=run_seconds,
        note=note,
        gpu_count=obs.gpu_count,
        seen={a.setting: a.observe([obs]) for a in levers.APPLY.values() if a.observe is not None},
    )


def window_points(
    points: Sequence[tuple[float, Snapshot]], warmup_seconds: float
) -> tuple[list[tuple[float, Snapshot]], str | None]:
    """The snapshots of the measurement window: from ``warmup_seconds`` after the first step on.

    A command that ended before its warm-up was over is measured from its first step, with a
    note saying so. Pure.
    """
    trained = [(t, s) for t, s in points if steps_of(s) > 0]
    if not trained:
        return [], None
    # The snapshot before the first one showing a step is the window's start when measuring
    # from the first step: the counters start at zero with the process.
    first_t = trained[0][0]
    after_warmup = [(t, s) for t, s in points if t >= first_t + warmup_seconds]
    if len(after_warmup) > MIN_INTERVALS:
        return after_warmup, None
    start = max((i for i, (t, _) in enumerate(points) if t < first_t), default=0)
    return list(points[start:]), "the command ended during the warm-up: measured from its first step"


# --- the tuner ---------------------------------------------------------------------------------


@dataclass
class Tuner:
    """Runs the command once per trial and climbs; impure (processes, clock)."""

    args: argparse.Namespace
    workspace: Workspace
    make_source: SourceFactory = default_source
    out: Callable[[str], None] = lambda _text: None
    clock: Callable[[], float] = time.monotonic
    started: float = field(default_factory=time.monotonic)
    runs: int = 0
    interrupted: bool = False
    current: subprocess.Popen[bytes] | None = None
    log_path: str = ""

    @property
    def deadline(self) -> float:
        return self.started + float(self.args.budget)

    def measure(self, settings: Settings, baseline: Settings) -> Measurement:
        """Runs the command with ``settings`` (the overrides for what differs from ``baseline``)."""
        self.runs += 1
        ws = fresh_probe_dir(self.workspace, f"probe-{self.runs}")
        overrides = changed_settings(baseline, settings)
        loader_env = loader_override_env(overrides) if overrides else {}
        env = child_environment(os.environ, ws.inject_dir, ws.probe_dir, loader_env=loader_env)
        self.log_path = os.path.join(os.path.dirname(ws.probe_dir), f"run-{self.runs}.log")
        window = float(self.args.window)
        warmup = float(self.args.warmup)
        points: list[tuple[float, Snapshot]] = []
        first_step: list[float] = []
        t_start = self.clock()

        def on_sample(t: float, snap: Snapshot) -> bool:
            points.append((t, snap))
            if not first_step and steps_of(snap) > 0:
                first_step.append(t)
            if self.interrupted or self.clock() >= self.deadline:
                return True
            return bool(first_step) and t >= first_step[0] + warmup + window

        with open(self.log_path, "wb") as log:
            try:
                child = subprocess.Popen(
                    self.args.command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
            except OSError as exc:
                raise MeasureError(f"cannot start {self.args.command[0]!r}: {exc.strerror or exc}") from None
            self.current = child
            source = self.make_source(ws.probe_dir, float(self.args.interval))
            try:
                exited = sample_while_running(child, source, float(self.args.interval), on_sample)
            finally:
                source.close()
                code = stop_process_group(child, STOP_GRACE_SECONDS)
                self.current = None
        run_seconds = self.clock() - t_start
        if self.interrupted:
            raise MeasureError("interrupted")
        if exited and code != 0:
            raise MeasureError(f"the command failed (exit {shell_exit_status(code)}); {self._log_tail()}")
        window_pts, note = window_points(points, warmup)
        if len(window_pts) <= MIN_INTERVALS:
            if not exited:
                raise MeasureError(
                    f"the budget ran out after {run_seconds:.0f} s of this run, before its measurement window"
                )
            raise MeasureError(
                f"the command ended after {run_seconds:.0f} s with too little training to measure "
                f"(fewer than {MIN_INTERVALS} sampling intervals of {self.args.interval:g} s); "
                "give it a longer run or a shorter --window/--warmup"
            )
        if note is None and window_pts[-1][0] - window_pts[0][0] < window - float(self.args.interval):
            note = (
                "the command ended before the window was full: measured until its end"
                if exited
                else "the budget ran out: a shorter window"
            )
        return measurement_from(settings, window_pts, run_seconds=run_seconds, note=note)

    def probe_messages(self) -> list[str]:
        """The probe's lines (``dam-probe: ...``) of the last run: what the overrides did."""
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as fh:
                return [line.strip() for line in fh if line.startswith("dam-probe:")][:5]
        except OSError:
            return []

    def _log_tail(self, lines: int = 5) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as fh:
                tail = fh.read().splitlines()[-lines:]
        except OSError:
            tail = []
        return "its last output: " + " | ".join(tail) if tail else "no output"

    def remaining(self) -> float:
        return self.deadline - self.clock()

    def say(self, text: str) -> None:
        self.out(text)


@dataclass
class Result:
    baseline: Measurement | None
    trials: list[Trial]
    best: Measurement | None
    applied: Settings
    reason: str

    def doc(self) -> dict[str, Any]:
        return {
            "baseline": None if self.baseline is None else self.baseline.doc(),
            "trials": [{**t.measurement.doc(), "kept": t.kept} for t in self.trials],
            "best": None if self.best is None else self.best.doc(),
            "applied": dict(self.applied),
            "reason": self.reason,
        }


def _not_tunable(m: Measurement) -> str | None:
    """Why the baseline's verdict rules the DataLoader settings out, or None when it does not."""
    b = m.verdict.bottleneck
    if b.regime is Regime.UNKNOWN:
        missing = "; ".join(b.missing[:2]) or "too little evidence"
        return f"nothing changed: no verdict for the baseline (unknown: {missing})"
    served = sorted({r.value for a in levers.APPLY.values() if a.channel in CHANNELS for r in a.regimes})
    if b.regime.value not in served:
        first = f" ({b.evidence[0]})" if b.evidence else ""
        return (
            f"nothing changed: the job is {b.regime.value} ({b.axis.value} axis), not {' or '.join(served)}"
            f"{first}; DataLoader settings cannot speed it up"
        )
    if levers.applicable(b.lever, b.regime, CHANNELS) is None:
        return (
            f"nothing changed: the job is {b.regime.value}, but its lever is {b.lever} ({b.lever_detail}); "
            "more DataLoader workers or prefetching cannot help"
        )
    return None


NOISE_NOTE: Final = (
    f"a change is kept only when its steps/s gain more than {NOISE_SIGMAS:g} × the standard error of the "
    "difference of the two mean per-interval step rates, and at least "
    f"{MIN_GAIN:.0%}"
)


class Runner(Protocol):
    """What ``tune`` needs from the tuner (a fake in the unit tests)."""

    args: argparse.Namespace

    def say(self, text: str) -> None: ...

    def measure(self, settings: Settings, baseline: Settings) -> Measurement: ...

    def remaining(self) -> float: ...

    def probe_messages(self) -> list[str]: ...


@dataclass
class _Climb:
    """The state of ``tune``'s hill climb: the best measurement so far and what was tried."""

    baseline: Measurement
    best: Measurement
    trials: list[Trial] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    stop: str | None = None


def _climb_lever(tuner: Runner, state: _Climb, lever: ApplyLever, bound: int | None) -> None:
    """Climb one setting from the best so far until its climb is over (a note) or all stops."""
    say = tuner.say
    last: Tried | None = None
    while state.stop is None:
        best = setting_value(state.best.settings, lever.setting)
        value = None if best is None else climb.next_value(lever, best, bound, last)
        if value is None:
            state.notes.append(_lever_end(lever, state.best, last, bound))
            return
        longest = max([state.baseline.run_seconds, *(t.measurement.run_seconds for t in state.trials)])
        if tuner.remaining() < longest:
            state.stop = f"the budget ({tuner.args.budget:g} s) is spent: {len(state.trials)} trial(s) run"
            return
        settings = {**state.best.settings, lever.setting: value}
        n = len(state.trials) + 1
        say(f"{PROG}: trial {n}: {_settings_text(settings)}")
        try:
            m = tuner.measure(settings, state.baseline.settings)
        except MeasureError as exc:
            state.stop = f"trial {n} ({_settings_text(settings)}) gave no measurement: {exc}"
            return
        ran = _ran_with(m, lever)
        if ran is not None and ran != value:
            probe = "; ".join(tuner.probe_messages()) or "no message from the probe"
            state.stop = (
                f"the probe could not set {lever.setting}={climb.render(lever.kind, value)} (the "
                f"command ran {lever.setting}={climb.render(lever.kind, ran)}): {probe}"
            )
            return
        best_m = state.best
        kept, why = judge(
            m.steps_per_second, m.standard_error, best_m.steps_per_second, best_m.standard_error, lever
        )
        state.trials.append(Trial(m, kept, why))
        say(f"{PROG}: trial {n}: {_summary(m)}: {'kept' if kept else 'not kept'} ({why})")
        last = Tried(value, kept)
        if kept:
            state.best = m
            if m.regime not in lever.regimes:
                served = " or ".join(sorted(r.value for r in lever.regimes))
                state.stop = (
                    f"with {_settings_text(m.settings)} the job is no longer {served} "
                    f"({m.regime.value}): the loader keeps up"
                )


def _ran_with(m: Measurement, lever: ApplyLever) -> int | None:
    """The value of the lever's setting the command ran with: as the probe read it from the loader,
    else (num_workers, an older probe) the worker processes seen; None: not known."""
    ran = m.seen.get(lever.setting)
    if ran is None and lever.setting == NUM_WORKERS:
        ran = m.worker_count
    return ran


def tune(tuner: Runner, bound: int) -> Result:
    """The whole procedure: baseline, then the hill climb over the verdict's levers (see the
    module doc); ``bound``: the CPUs the job may use."""
    say = tuner.say
    say(f"{PROG}: baseline run (warm-up {tuner.args.warmup:g} s, window {tuner.args.window:g} s)")
    try:
        baseline = tuner.measure({}, {})
    except MeasureError as exc:
        return Result(None, [], None, {}, f"no baseline: {exc}")
    base_settings: Settings = {}
    workers = baseline.seen.get(NUM_WORKERS)
    if workers is None:
        workers = baseline.worker_count
    if workers is not None:
        base_settings[NUM_WORKERS] = workers
    baseline = replace(baseline, settings=dict(base_settings))
    say(f"{PROG}: baseline {_summary(baseline)}")
    why_not = _not_tunable(baseline)
    if why_not is not None:
        return Result(baseline, [], baseline, {}, why_not)

    state = _Climb(baseline, baseline)
    bounds = climb.Bounds(cpus_per_loader=bound, max_prefetch_factor=PREFETCH_CAP)
    for lever in levers.chain(baseline.verdict.bottleneck.lever, CHANNELS):
        values = {a.setting: setting_value(state.best.settings, a.setting) for a in levers.APPLY.values()}
        if not lever.needs(climb.Facts(values, gpus=baseline.gpu_count or 0)):
            state.notes.append(f"{lever.setting} not tried: it needs {lever.needs_text}")
            break
        _climb_lever(tuner, state, lever, lever.bound(bounds))
        if state.stop is not None:
            break

    best = state.best
    applied = changed_settings(baseline.settings, best.settings) if best is not baseline else {}
    if applied:
        ratio = best.steps_per_second / baseline.steps_per_second if baseline.steps_per_second else math.inf
        head = (
            f"{_settings_text(applied)}: {baseline.steps_per_second:.2f} → "
            f"{best.steps_per_second:.2f} steps/s (×{ratio:.2f})"
        )
    else:
        head = "nothing changed: no setting beat the baseline"
    tail = [state.stop] if state.stop else state.notes
    reason = "; ".join([head, *[t for t in tail if t]]) + f". Noise: {NOISE_NOTE}."
    return Result(baseline, state.trials, best, applied, reason)


def _lever_end(lever: ApplyLever, best: Measurement, last: Tried | None, bound: int | None) -> str:
    value = setting_value(best.settings, lever.setting)
    if last is not None and not last.kept:
        return f"{lever.setting} {last.value} gained nothing over {value}"
    if lever.setting == NUM_WORKERS:
        return f"num_workers at the CPU bound ({bound} CPU{'s' if bound != 1 else ''} for this job)"
    if bound is None:
        return f"{lever.setting} at {value}, the end of its ladder"
    return f"{lever.setting} at its bound ({bound})"


def _settings_text(settings: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in settings.items()) or "as written"


def _summary(m: Measurement) -> str:
    wait = "n/a" if m.data_wait_ratio is None else f"{m.data_wait_ratio:.0%}"
    se = "" if m.standard_error is None else f" ± {m.standard_error:.2f}"
    return f"{m.steps_per_second:.2f}{se} steps/s, data wait {wait}, {m.regime.value}"


# --- output ----------------------------------------------------------------------------------


def render_table(result: Result) -> str:
    """The before/after table, the best settings and the lines to paste."""
    rows: list[tuple[str, Measurement, str]] = []
    if result.baseline is not None:
        rows.append(("baseline", result.baseline, ""))
    for i, t in enumerate(result.trials, 1):
        rows.append((str(i), t.measurement, ("kept: " if t.kept else "not kept: ") + t.why))
    lines: list[str] = []
    if rows:
        header = (
            f"{'run':<9}{'num_workers':>12}{'prefetch':>10}{'steps/s':>10}{'± SE':>7}{'data wait':>11}  "
            f"{'verdict':<15}"
        )
        lines += [header, "-" * len(header)]
        for name, m, why in rows:
            workers = str(m.settings[NUM_WORKERS]) if NUM_WORKERS in m.settings else "?"
            pf = str(m.settings[PREFETCH_FACTOR]) if PREFETCH_FACTOR in m.settings else "-"
            se = "" if m.standard_error is None else f"{m.standard_error:.2f}"
            wait = "n/a" if m.data_wait_ratio is None else f"{m.data_wait_ratio:.1%}"
            lines.append(
                f"{name:<9}{workers:>12}{pf:>10}{m.steps_per_second:>10.2f}{se:>7}{wait:>11}  "
                f"{m.regime.value:<15}{why}"
            )
            if m.note:
                lines.append(f"{'':<9}({m.note})")
        lines.append("")
    if result.applied and result.best is not None and result.baseline is not None:
        base, best = result.baseline, result.best
        ratio = best.steps_per_second / base.steps_per_second if base.steps_per_second else math.inf
        lines.append(
            f"best: {_settings_text(best.settings)}: {best.steps_per_second:.2f} steps/s, "
            f"×{ratio:.2f} the baseline's {base.steps_per_second:.2f}"
        )
        lines += paste_lines(result.applied)
        lines.append("")
    lines.append(f"reason: {result.reason}")
    return "\n".join(lines) + "\n"


# --- command line ----------------------------------------------------------------------------


def _parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "Measure a training command, and if it is input-bound, restart it with more DataLoader "
            "workers (then a larger prefetch_factor), keeping each change only when steps/s improve "
            "beyond the noise. The command is run once per trial."
        ),
        epilog="example: dam tune --budget 180 -- python train.py",
    )
    parser.add_argument(
        "--budget", type=float, default=300.0, help="wall-clock seconds for all runs together (default 300)"
    )
    parser.add_argument(
        "--window", type=float, default=10.0, help="measurement window of each run, seconds (default 10)"
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=2.0,
        help="seconds after a run's first training step before its window starts (default 2)",
    )
    parser.add_argument(
        "--interval", type=float, default=0.5, help="sampling period in seconds (default 0.5)"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    parser.add_argument("--verbose", action="store_true", help="log the samplers' messages")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    args = parser.parse_args(list(argv))
    cmd = command_after_dashes(parser, args.command, "dam tune")
    if not (0.05 <= args.interval <= 60):
        parser.error(f"--interval must be between 0.05 and 60 seconds, got {args.interval}")
    if not (MIN_INTERVALS * args.interval <= args.window <= 3600):
        parser.error(
            f"--window must be between {MIN_INTERVALS} intervals ({MIN_INTERVALS * args.interval:g} s) "
            f"and 3600 seconds, got {args.window}"
        )
    if not (0 <= args.warmup <= 3600):
        parser.error(f"--warmup must be between 0 and 3600 seconds, got {args.warmup}")
    if not (args.window + args.warmup <= args.budget <= 7 * 86400):
        parser.error(
            f"--budget must be at least --warmup + --window ({args.warmup + args.window:g} s), "
            f"got {args.budget}"
        )
    args.command = cmd
    return args


def job_cpu_bound() -> int:
    """``cpu_bound`` for the CPUs this process (and so the command) may use."""
    try:
        affinity: int | None = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = os.cpu_count()
    read = CgroupReader().read(time.monotonic_ns())
    limit = read[1] / 1000 if read is not None and read[1] > 0 else None
    return cpu_bound(affinity, limit)


def run(args: argparse.Namespace, make_source: SourceFactory = default_source) -> int:
    def say(text: str) -> None:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()

    bound = job_cpu_bound()
    with probe_workspace(prefix="dam-tune-") as workspace:
        tuner = Tuner(args, workspace, make_source=make_source, out=say)

        def interrupt(_signum: int, _frame: FrameType | None) -> None:
            tuner.interrupted = True

        previous = {s: signal.signal(s, interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            result = tune(tuner, bound)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
    if args.json:
        sys.stdout.write(json.dumps(result.doc(), indent=2) + "\n")
    else:
        sys.stdout.write("\n" + render_table(result))
    sys.stdout.flush()
    if tuner.interrupted:
        return 130
    return 1 if result.baseline is None else 0


def main(argv: Sequence[str]) -> int:
    args = _parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR, format="dam: %(message)s")
    return run(args)
