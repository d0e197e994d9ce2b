"""``dam evaluate BEFORE.prom AFTER.prom``: a verdict from two metric snapshots.

The snapshots are Prometheus text exposition (what ``curl http://POD:9450/metrics``
prints). A pair it cannot judge is refused, never answered: one message on stderr
names the file and the fix; with ``--json`` stdout carries ``{"error": {...},
"inputProblems": [...]}`` as well. Exit status:

- ``0``: a verdict (``unknown`` included);
- ``2``: unusable input: a missing or unreadable file, text that is not the exposition
  format (the line and the problem named), an empty file or one without the ``dam_``
  series the diagnosis reads, more of them than ``--max-series``, a bad option;
- ``3``: the pair cannot be compared: AFTER is older than BEFORE (swapped files),
  both are the same sample, or a counter was reset between them (a restart);
- ``4``: a series the verdict needs (the probe's step, step-time and data-wait
  counters; the sidecar's sample time unless ``--elapsed-seconds`` is given) holds NaN,
  an infinity or a negative value.

Any other ``dam_`` series with such a value is ignored, never silently: a warning on
stderr and an entry in the JSON's ``inputProblems`` (a counter is then ignored in both
snapshots, as its increase is unknown). Files are read line by line and only the
series the diagnosis reads (the ``dam_`` names of ``dam_contract.names`` and the
catalog) are kept, so a 100 MB snapshot costs what its ``dam_`` series cost.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from dam_contract import names
from dam_contract.snapshot import (
    ParseStats,
    PromParseError,
    Sample,
    Snapshot,
    TooManySeriesError,
    read_snapshot,
)
from dam_operator.diagnosis.engine import diagnose
from dam_operator.diagnosis.goodput import accelerators_of, goodput_of
from dam_operator.diagnosis.model import Hardware, Thresholds
from dam_operator.diagnosis.render import render_goodput, render_text
from dam_operator.diagnosis.window import observation_from_snapshots
from dam_sidecar import catalog

PROG = "dam evaluate"

EXIT_VERDICT = 0
EXIT_UNUSABLE = 2
EXIT_NOT_COMPARABLE = 3
EXIT_INVALID_REQUIRED = 4

DEFAULT_MAX_SERIES = 50_000
"""Series kept per file. A sidecar exports a few hundred (about 20 per GPU, a few per rank)."""
PROBLEMS_SHOWN = 100
"""``inputProblems`` entries in the JSON (the count of the rest in ``inputProblemsNotShown``)."""
WARNINGS_SHOWN = 10

READ_NAMES: frozenset[str] = frozenset(
    {v for k, v in vars(names).items() if k.isupper() and isinstance(v, str) and v.startswith("dam_")}
    | set(catalog.BY_NAME)
)
"""The series the diagnosis can read: every ``dam_`` metric name of the contract."""
REQUIRED_COUNTERS: tuple[str, ...] = (
    names.STEPS_TOTAL,
    names.STEP_SECONDS_TOTAL,
    names.DATALOADER_WAIT_SECONDS_TOTAL,
)
"""Counters every verdict is built on: a bad value here refuses the verdict."""


class RefusedError(Exception):
    """A pair the command will not judge: ``message`` names the file and the fix."""

    def __init__(self, code: int, reason: str, message: str, file: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.file = file


class UsageError(RefusedError):
    """Bad input from the user: printed as one line, exit status 2."""

    def __init__(self, message: str, reason: str = "bad-option", file: str | None = None) -> None:
        super().__init__(EXIT_UNUSABLE, reason, message, file)


@dataclass
class Read:
    """One snapshot file as read: its kept series and what the read saw."""

    path: str
    role: str
    snapshot: Snapshot
    stats: ParseStats = field(default_factory=ParseStats)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive whole number")
    return value


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Diagnose the D·A·M bottleneck between two Prometheus text snapshots of the dam sidecar.",
        epilog="exit status: 0 verdict, 2 unusable input, 3 snapshots not comparable "
        "(swapped, same sample, counter reset), 4 a series the verdict needs is NaN/Inf/negative",
    )
    p.add_argument("before", metavar="BEFORE.prom", help="the earlier snapshot")
    p.add_argument("after", metavar="AFTER.prom", help="the later snapshot")
    p.add_argument("--json", action="store_true", help="print the verdict as JSON (status field names)")
    p.add_argument("--gpu-model", metavar="M", help="GPU model, e.g. 'H100 SXM' (default: dam_gpu_info)")
    p.add_argument(
        "--elapsed-seconds",
        metavar="S",
        type=_positive_float,
        help="seconds between the snapshots (default: dam_snapshot_timestamp_seconds)",
    )
    p.add_argument("--peak-flops", metavar="F", type=_positive_float, help="peak FLOP/s of one GPU")
    p.add_argument(
        "--memory-bandwidth", metavar="B", type=_positive_float, help="memory bandwidth of one GPU, bytes/s"
    )
    p.add_argument("--batch-size", metavar="N", type=int, help="batch size (default: dam_batch_size)")
    p.add_argument(
        "--flops-per-step", metavar="F", type=_positive_float, help="model FLOPs per step (default: gauge)"
    )
    p.add_argument(
        "--threshold",
        metavar="NAME=VALUE",
        action="append",
        default=[],
        help="override a threshold, e.g. dataWaitSuspect=0.2 (repeatable)",
    )
    p.add_argument(
        "--max-series",
        metavar="N",
        type=_positive_int,
        default=DEFAULT_MAX_SERIES,
        help=f"dam_ series kept per file before it is refused (default {DEFAULT_MAX_SERIES})",
    )
    return p


# --- reading -------------------------------------------------------------------------------


def _read(path: str, role: str, max_series: int) -> Read:
    stats = ParseStats()
    try:
        # newline="\n": only "\n" ends a line (a label value may hold "\r" or U+2028).
        with open(path, encoding="utf-8", newline="\n") as fh:
            snapshot = read_snapshot(
                fh, path, keep=READ_NAMES.__contains__, max_series=max_series, stats=stats
            )
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file", "unreadable", path) from None
    except IsADirectoryError:
        raise UsageError(f"{path}: is a directory, not a snapshot file", "unreadable", path) from None
    except UnicodeDecodeError:
        raise UsageError(
            f"{path}: not UTF-8 text (near line {stats.lines + 1}); expected Prometheus text format",
            "not-text",
            path,
        ) from None
    except TooManySeriesError as exc:
        raise UsageError(
            f"{path}:{exc.line}: more than {exc.limit} dam_ series ({exc.name} is one too many); "
            f"a sidecar exports a few hundred: is this one pod's /metrics? "
            f"(--max-series N raises the cap)",
            "too-many-series",
            path,
        ) from None
    except PromParseError as exc:
        raise UsageError(str(exc), "malformed", path) from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read ({exc.strerror or exc})", "unreadable", path) from None
    if stats.samples == 0:
        raise UsageError(
            f"{path}: {role} is empty (no samples): expected the dam sidecar's /metrics text, "
            f"e.g. curl -s http://POD:9450/metrics > {path}",
            "empty",
            path,
        )
    if stats.kept == 0:
        seen = ", ".join(stats.dropped_names)
        raise UsageError(
            f"{path}: {role} has {stats.samples} samples but no dam_ series the diagnosis reads "
            f"(it has {seen}): scrape the dam sidecar (http://POD:9450/metrics), not another exporter",
            "no-dam-series",
            path,
        )
    return Read(path, role, snapshot, stats)


# --- values --------------------------------------------------------------------------------


def _series_text(sample: Sample) -> str:
    if not sample.labels:
        return sample.name
    inner = ",".join(f'{k}="{v}"' for k, v in sample.labels)
    return f"{sample.name}{{{inner}}}"


def _bad_value(v: float) -> str | None:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v < 0:
        return "negative"
    return None


def _screen_values(
    before: Read, after: Read, required: frozenset[str], problems: list[dict[str, Any]]
) -> None:
    """Adds the ``inputProblems`` to ``problems``; refuses a bad required series, takes the others out.

    A counter with a bad value in either file goes from both (its increase is unknown;
    left in AFTER it would be counted from zero); a gauge only from its own file.
    """
    drop: dict[str, set[tuple[str, tuple[tuple[str, str], ...]]]] = {before.path: set(), after.path: set()}
    counters_out: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for read in (before, after):
        for name in sorted(read.snapshot.names()):
            for sample in read.snapshot.samples(name):
                what = _bad_value(sample.value)
                if what is None:
                    continue
                series = _series_text(sample)
                shown = what if what != "negative" else f"negative ({sample.value:g})"
                if name in required:
                    raise RefusedError(
                        EXIT_INVALID_REQUIRED,
                        "invalid-required-series",
                        f"{read.path}: {series} is {shown} in {read.role}: the verdict needs this "
                        f"series and is refused; take a new snapshot (a NaN, infinite or negative "
                        f"{'counter' if name.endswith('_total') else 'value'} is a corrupt probe "
                        f"file or exporter)",
                        read.path,
                    )
                key = (sample.name, sample.labels)
                counter = name.endswith("_total")
                if counter:
                    counters_out.add(key)
                else:
                    drop[read.path].add(key)
                problems.append(
                    {
                        "file": read.path,
                        "snapshot": read.role,
                        "series": series,
                        "value": str(sample.value) if what == "negative" else what,
                        "problem": "negative" if what == "negative" else "not finite",
                        "action": "ignored in both snapshots" if counter else "ignored",
                    }
                )
    for read in (before, after):
        out = drop[read.path] | counters_out
        if out:
            keep = [
                s
                for name in sorted(read.snapshot.names())
                for s in read.snapshot.samples(name)
                if (s.name, s.labels) not in out
            ]
            read.snapshot = Snapshot(keep, read.snapshot.timestamp_seconds)


# --- order ---------------------------------------------------------------------------------


def _clock(read: Read) -> float | None:
    for s in read.snapshot.samples(names.SNAPSHOT_TIMESTAMP_SECONDS):
        if math.isfinite(s.value) and s.value > 0:
            return s.value
    return None


def _check_order(before: Read, after: Read) -> None:
    """Refuses a pair whose time or counters go back (swapped files, a reset) or stand still."""
    t0, t1 = _clock(before), _clock(after)
    clock = names.SNAPSHOT_TIMESTAMP_SECONDS
    if t0 is None or t1 is None:
        ms0, ms1 = before.stats.newest_timestamp_ms, after.stats.newest_timestamp_ms
        t0, t1 = (ms0 / 1000.0, ms1 / 1000.0) if ms0 is not None and ms1 is not None else (None, None)
        clock = "the samples' timestamps"
    went_back: list[str] = []
    went_up = 0
    # The probe's counters first (the step counter leads): they are what a reader recognises.
    order = {name: i for i, name in enumerate(REQUIRED_COUNTERS)}
    for name in sorted(after.snapshot.names(), key=lambda x: (order.get(x, len(order)), x)):
        if not name.endswith("_total"):
            continue
        prev = before.snapshot.series(name)
        for labels, a in after.snapshot.series(name).items():
            b = prev.get(labels)
            if b is None:
                continue
            if a < b:
                went_back.append(f"{_series_text(Sample(name, labels, a))} went from {b:g} to {a:g}")
            elif a > b:
                went_up += 1
    if t0 is not None and t1 is not None:
        if t1 < t0:
            also = "; counters went back" if went_back else ""
            raise RefusedError(
                EXIT_NOT_COMPARABLE,
                "after-older-than-before",
                f"{after.path}: AFTER is older than BEFORE {before.path} "
                f"({clock} goes back {t0 - t1:.3g} s{also}): swap the files?",
                after.path,
            )
        if t1 == t0:
            raise RefusedError(
                EXIT_NOT_COMPARABLE,
                "same-sample",
                f"{after.path}: AFTER is the same sample as BEFORE {before.path} ({clock} is {t0:.15g} in "
                f"both): take AFTER at least one sampling interval later (e.g. 30 s)",
                after.path,
            )
    if not went_back:
        return
    first = went_back[0] + (f" (and {len(went_back) - 1} more)" if len(went_back) > 1 else "")
    if t0 is None and not went_up:
        raise RefusedError(
            EXIT_NOT_COMPARABLE,
            "after-older-than-before",
            f"{after.path}: AFTER is older than BEFORE {before.path} (counters went back: {first}): "
            f"swap the files?",
            after.path,
        )
    moved = f"{clock} went forward {t1 - t0:.3g} s" if t0 is not None and t1 is not None else "others went up"
    raise RefusedError(
        EXIT_NOT_COMPARABLE,
        "counter-reset",
        f"{after.path}: a counter was reset between BEFORE and AFTER: {first}, while {moved} "
        f"(the sidecar or its pod restarted in between, or the exporter's process): take both "
        f"snapshots from one run",
        after.path,
    )


# --- the command ---------------------------------------------------------------------------


def _validation_message(what: str, exc: ValidationError) -> str:
    first = exc.errors()[0]
    loc = ".".join(str(x) for x in first.get("loc", ())) or what
    return f"{what}: {loc}: {first.get('msg', 'invalid value')}"


def _thresholds(items: list[str]) -> Thresholds:
    values: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"--threshold {item!r}: expected NAME=VALUE, e.g. dataWaitSuspect=0.2")
        values[name.strip()] = value.strip()
    try:
        return Thresholds(**values)
    except ValidationError as exc:
        raise UsageError(_validation_message("--threshold", exc)) from None


def _with_problems(out: dict[str, Any], problems: list[dict[str, Any]]) -> dict[str, Any]:
    if problems:
        out["inputProblems"] = problems[:PROBLEMS_SHOWN]
        if len(problems) > PROBLEMS_SHOWN:
            out["inputProblemsNotShown"] = len(problems) - PROBLEMS_SHOWN
    return out


def _warn(problems: list[dict[str, Any]]) -> None:
    for p in problems[:WARNINGS_SHOWN]:
        sys.stderr.write(f"{PROG}: warning: {p['file']}: {p['series']} is {p['value']}: {p['action']}\n")
    if len(problems) > WARNINGS_SHOWN:
        sys.stderr.write(f"{PROG}: warning: and {len(problems) - WARNINGS_SHOWN} more series ignored\n")


class _Run:
    def __init__(self) -> None:
        self.json = False
        self.problems: list[dict[str, Any]] = []

    def __call__(self, argv: list[str]) -> int:
        parser = _parser()
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:  # --help (0) or a usage error already printed by argparse (2)
            return int(exc.code) if isinstance(exc.code, int) else EXIT_UNUSABLE
        self.json = bool(args.json)
        if args.batch_size is not None and args.batch_size < 0:
            raise UsageError("--batch-size must be a non-negative integer")
        thresholds = _thresholds(args.threshold)
        before = _read(args.before, "BEFORE", args.max_series)
        after = _read(args.after, "AFTER", args.max_series)
        required = set(REQUIRED_COUNTERS)
        if args.elapsed_seconds is None:
            required.add(names.SNAPSHOT_TIMESTAMP_SECONDS)
        _screen_values(before, after, frozenset(required), self.problems)
        _check_order(before, after)
        _warn(self.problems)
        obs = observation_from_snapshots(
            before.snapshot,
            after.snapshot,
            elapsed_seconds=args.elapsed_seconds,
            batch_size=args.batch_size,
            flops_per_step=args.flops_per_step,
            gpu_model=args.gpu_model[:64] if args.gpu_model else None,
        )
        overrides = None
        if args.gpu_model or args.peak_flops or args.memory_bandwidth:
            overrides = Hardware(
                gpu_model=args.gpu_model[:64] if args.gpu_model else None,
                peak_flops=args.peak_flops,
                memory_bandwidth_bytes_per_second=args.memory_bandwidth,
            )
        verdict = diagnose(obs, thresholds, overrides)
        # The job's life up to AFTER (the probe's counters are cumulative): status.goodput's shape.
        goodput = goodput_of(after.snapshot, accelerators_of(after.snapshot))
        if args.json:
            out = verdict.to_status()
            if goodput is not None:
                out["goodput"] = goodput.model_dump(by_alias=True, exclude_none=True, mode="json")
            out = _with_problems(out, self.problems)
            sys.stdout.write(json.dumps(out, indent=2, ensure_ascii=False) + "\n")
        else:
            sys.stdout.write(render_text(verdict) + ("" if goodput is None else render_goodput(goodput)))
        return EXIT_VERDICT


def main(argv: Sequence[str]) -> int:
    run = _Run()
    try:
        return run(list(argv))
    except RefusedError as exc:
        sys.stderr.write(f"{PROG}: {exc.message}\n")
        if run.json:
            error: dict[str, Any] = {"exitCode": exc.code, "reason": exc.reason, "message": exc.message}
            if exc.file is not None:
                error["file"] = exc.file
            out = _with_problems({"error": error}, run.problems)
            sys.stdout.write(json.dumps(out, indent=2, ensure_ascii=False) + "\n")
        return exc.code
