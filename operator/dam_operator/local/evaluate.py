"""``dam evaluate BEFORE.prom AFTER.prom``: a verdict from two metric snapshots.

The snapshots are Prometheus text exposition (what ``curl http://POD:9450/metrics``
prints). Exit status: 0 with a verdict (``unknown`` included), 2 on bad input (a
missing file, a malformed line, a bad option), with one message on stderr naming the
file, the line and the problem.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from dam_operator.diagnosis.engine import diagnose
from dam_operator.diagnosis.model import Hardware, Thresholds
from dam_operator.diagnosis.render import render_text
from dam_operator.diagnosis.window import observation_from_snapshots
from dam_sidecar.promtext import PromParseError, Snapshot, parse_snapshot

PROG = "dam evaluate"


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number")
    return value


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Diagnose the D·A·M bottleneck between two Prometheus text snapshots of the dam sidecar.",
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
    return p


def _read(path: str) -> Snapshot:
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"{path}: is a directory, not a snapshot file") from None
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"{path}: not UTF-8 text (byte {exc.start}); expected Prometheus text format"
        ) from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return parse_snapshot(text, source=path)


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


def _run(argv: list[str]) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error already printed by argparse (2)
        return int(exc.code) if isinstance(exc.code, int) else 2
    if args.batch_size is not None and args.batch_size < 0:
        raise UsageError("--batch-size must be a non-negative integer")
    thresholds = _thresholds(args.threshold)
    before = _read(args.before)
    after = _read(args.after)
    obs = observation_from_snapshots(
        before,
        after,
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
    if args.json:
        sys.stdout.write(json.dumps(verdict.to_status(), indent=2, ensure_ascii=False) + "\n")
    else:
        sys.stdout.write(render_text(verdict))
    return 0


def main(argv: Sequence[str]) -> int:
    try:
        return _run(list(argv))
    except (UsageError, PromParseError) as exc:
        sys.stderr.write(f"{PROG}: {exc}\n")
        return 2
