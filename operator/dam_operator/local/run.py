"""Local mode: ``dam run [--interval S] [--window S] [--json] -- CMD ...``.

Runs CMD with the probe's automatic instrumentation on its ``PYTHONPATH``,
samples the probe file, the process's CPU (main process and DataLoader
workers), cgroup throttling and NVML (when a GPU exists) in this process —
the same samplers as the sidecar, without HTTP — and diagnoses each window
with the same engine and hysteresis as the operator. A live one-line verdict
goes to stderr while CMD runs (on a terminal); the final verdict is printed
at the end. Exits with CMD's exit code.

With ``--json`` the final verdict is the only thing on stdout (the field names
of the resource status: ``bottleneck``, ``metrics``); CMD's own stdout is sent
to stderr so that ``dam run --json -- ... | jq`` works.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import FrameType
from typing import Protocol, TextIO

from dam_operator.diagnosis.engine import diagnose
from dam_operator.diagnosis.hysteresis import Stabilizer, rfc3339
from dam_operator.diagnosis.model import Hardware, Thresholds, Verdict
from dam_operator.diagnosis.render import render_line, render_text
from dam_operator.diagnosis.window import observation_from_snapshots
from dam_probe.bootstrap import install_into
from dam_sidecar import names
from dam_sidecar.promtext import Snapshot


class SnapshotSource(Protocol):
    """Takes one fresh sample of every counter and returns it as a snapshot."""

    def snapshot(self) -> Snapshot: ...

    def close(self) -> None: ...


MAX_ANCHORS = 256
"""Snapshots kept since the first batch for the final verdict (thinned by half when full)."""

WARMUP_FRACTION = 0.2
"""The final verdict skips this share of the run (at most one window): worker start-up, autotuning."""


@dataclass
class LocalSession:
    """Keeps the snapshots of one run and turns them into verdicts (pure apart from its state).

    Memory is bounded for a month-long run: the rolling window holds the snapshots of one
    window, and at most ``MAX_ANCHORS`` thinned snapshots since the first batch are kept for
    the final verdict.
    """

    window_seconds: float
    thresholds: Thresholds = field(default_factory=Thresholds)
    hardware: Hardware | None = None
    now: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    history: deque[tuple[float, Snapshot]] = field(default_factory=deque)
    anchors: list[tuple[float, Snapshot]] = field(default_factory=list)
    first: tuple[float, Snapshot] | None = None
    baseline: tuple[float, Snapshot] | None = None
    stabilizer: Stabilizer = field(default_factory=Stabilizer)

    def add(self, t: float, snap: Snapshot) -> None:
        if self.first is None:
            self.first = (t, snap)
        self.history.append((t, snap))
        # The final verdict starts at the first batch: interpreter start-up and imports are
        # not part of the training loop. The last snapshot before it is kept as a baseline.
        trained = self.anchors or _steps(snap) > 0
        if not trained:
            self.baseline = (t, snap)
        else:
            self.anchors.append((t, snap))
            if len(self.anchors) > MAX_ANCHORS:
                self.anchors = self.anchors[::2]
        # Keep one snapshot older than the window so that a full window is always available.
        while len(self.history) > 2 and self.history[1][0] <= t - self.window_seconds:
            self.history.popleft()

    def _verdict(self, before: tuple[float, Snapshot], after: tuple[float, Snapshot]) -> Verdict:
        elapsed = max(after[0] - before[0], 0.0)
        obs = observation_from_snapshots(before[1], after[1], elapsed_seconds=elapsed or None)
        return diagnose(obs, self.thresholds, self.hardware)

    def window_verdict(self) -> Verdict | None:
        """The stabilised verdict of the latest window (None until two snapshots exist)."""
        if len(self.history) < 2:
            return None
        raw = self._verdict(self.history[0], self.history[-1])
        return self.stabilizer.update(raw, self.now())

    def final_verdict(self) -> Verdict:
        """The verdict over the run from the first batch to the last snapshot, warm-up skipped.

        The warm-up is ``WARMUP_FRACTION`` of the run since the first batch, at most one
        window: DataLoader workers starting, cudnn autotuning and compilation belong to no
        steady state.
        """
        if not self.history or self.first is None:
            return self._verdict_from_nothing()
        last = self.history[-1]
        start = self.first
        if self.anchors:
            first_t = self.anchors[0][0]
            warmup = min(self.window_seconds, WARMUP_FRACTION * (last[0] - first_t))
            start = next((a for a in self.anchors if a[0] >= first_t + warmup), self.anchors[0])
            if start[0] >= last[0]:
                start = self.anchors[0]
        if start[0] >= last[0] or _steps(start[1]) >= _steps(last[1]):
            # A run that trained within about one sampling interval: every batch happened
            # before the first snapshot that shows one. The probe's counters start at zero
            # with the process, so the last snapshot before any batch is an exact baseline.
            start = self.baseline or self.first
        if start[0] >= last[0]:
            return self._verdict_from_nothing()
        return self._verdict(start, last)

    def _verdict_from_nothing(self) -> Verdict:
        empty = Snapshot([])
        return diagnose(
            observation_from_snapshots(empty, empty, elapsed_seconds=None), self.thresholds, self.hardware
        )


def _steps(snap: Snapshot) -> float:
    return sum(s.value for s in snap.samples(names.STEPS_TOTAL))


def child_environment(base: Mapping[str, str], inject_dir: str, probe_dir: str) -> dict[str, str]:
    """The CMD's environment: the probe first on ``PYTHONPATH``, an existing value kept."""
    env = dict(base)
    existing = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = inject_dir + (os.pathsep + existing if existing else "")
    env["DAM_PROBE_DIR"] = probe_dir
    env.pop("DAM_PROBE_DISABLE", None)
    return env


def _parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="dam run",
        description="Run a training command with the DAM probe and print which axis holds it back.",
        epilog="example: dam run --json -- python train.py --epochs 1",
    )
    parser.add_argument("--interval", type=float, default=1.0, help="sampling period in seconds (default 1)")
    parser.add_argument(
        "--window", type=float, default=10.0, help="evaluation window in seconds (default 10)"
    )
    parser.add_argument("--json", action="store_true", help="print the final verdict as JSON on stdout")
    parser.add_argument("--gpu-model", default=None, help="GPU model for peak figures (default: from NVML)")
    parser.add_argument(
        "--peak-flops", type=float, default=None, help="override peak FLOP/s of one accelerator"
    )
    parser.add_argument(
        "--memory-bandwidth", type=float, default=None, help="override memory bandwidth, bytes per second"
    )
    parser.add_argument(
        "--verbose", action="store_true", help="log the samplers' messages (absent NVML and the like)"
    )
    parser.add_argument(
        "--live", choices=["auto", "always", "never"], default="auto", help="live verdict line"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    args = parser.parse_args(list(argv))
    cmd = list(args.command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        parser.error("no command given: use `dam run [options] -- CMD ...`")
    if not (0.05 <= args.interval <= 3600):
        parser.error(f"--interval must be between 0.05 and 3600 seconds, got {args.interval}")
    if not (args.interval <= args.window <= 86400):
        parser.error(
            f"--window must be between --interval ({args.interval}) and 86400 seconds, got {args.window}"
        )
    for flag, value in (("--peak-flops", args.peak_flops), ("--memory-bandwidth", args.memory_bandwidth)):
        if value is not None and not value > 0:
            parser.error(f"{flag} must be a positive number, got {value}")
    args.command = cmd
    return args


class _CollectorSource:
    """The sidecar's samplers, sampled on demand in this process (no HTTP, no thread)."""

    def __init__(self, probe_dir: str, interval_seconds: float) -> None:
        from dam_sidecar.collector import build_collector
        from dam_sidecar.settings import SidecarSettings

        settings = SidecarSettings(probe_dir=probe_dir, interval_seconds=interval_seconds, port=0)
        self._collector = build_collector(settings)

    def snapshot(self) -> Snapshot:
        self._collector.sample_now()
        return self._collector.snapshot()

    def close(self) -> None:
        self._collector.close()


def _default_source(probe_dir: str, interval_seconds: float) -> SnapshotSource:
    return _CollectorSource(probe_dir, interval_seconds)


def _hardware(args: argparse.Namespace) -> Hardware | None:
    if args.gpu_model is None and args.peak_flops is None and args.memory_bandwidth is None:
        return None
    return Hardware(
        gpu_model=args.gpu_model,
        peak_flops=args.peak_flops,
        memory_bandwidth_bytes_per_second=args.memory_bandwidth,
    )


def _writer(stream: TextIO) -> Callable[[str], None]:
    def write(text: str) -> None:
        stream.write(text)
        stream.flush()

    return write


def run(
    args: argparse.Namespace,
    make_source: Callable[[str, float], SnapshotSource] = _default_source,
    out: Callable[[str], None] | None = None,
    err: Callable[[str], None] | None = None,
) -> int:
    out = out or _writer(sys.stdout)
    err = err or _writer(sys.stderr)
    live = args.live == "always" or (args.live == "auto" and sys.stderr.isatty() and not args.json)
    with tempfile.TemporaryDirectory(prefix="dam-run-") as tmp:
        inject_dir = install_into(os.path.join(tmp, "inject"))
        probe_dir = os.path.join(tmp, "probe")
        os.makedirs(probe_dir, exist_ok=True)
        env = child_environment(os.environ, inject_dir, probe_dir)
        try:
            child = subprocess.Popen(args.command, env=env, stdout=sys.stderr if args.json else None)
        except OSError as exc:
            err(f"dam run: cannot start {args.command[0]!r}: {exc.strerror or exc}\n")
            return 127
        forwarded: list[int] = []

        def forward(signum: int, _frame: FrameType | None) -> None:
            forwarded.append(signum)
            if child.poll() is None:
                child.send_signal(signum)

        previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
        session = LocalSession(window_seconds=args.window, hardware=_hardware(args))
        source = make_source(probe_dir, args.interval)
        try:
            start = time.monotonic()
            last_eval = start
            session.add(0.0, source.snapshot())
            while True:
                try:
                    child.wait(timeout=args.interval)
                    break
                except subprocess.TimeoutExpired:
                    pass
                now = time.monotonic()
                session.add(now - start, source.snapshot())
                if now - last_eval >= min(args.window, max(args.interval, 1.0)):
                    last_eval = now
                    verdict = session.window_verdict()
                    if live and verdict is not None:
                        err(f"dam: {now - start:5.0f}s  {render_line(verdict)}\n")
            session.add(time.monotonic() - start, source.snapshot())
        finally:
            source.close()
            for s, handler in previous.items():
                signal.signal(s, handler)
        code = child.wait()
        if code < 0:  # killed by a signal: report it the way a shell does (128 + signal number)
            code = 128 - code
        final = session.final_verdict()
    if args.json:
        doc = final.to_status()
        doc["lastEvaluationTime"] = rfc3339(datetime.now(UTC))
        doc["exitCode"] = code
        out(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    else:
        out("\n" + render_text(final) + "\n")
    return code


def main(argv: Sequence[str]) -> int:
    args = _parse_args(argv)
    # Local mode samples whatever exists: no NVML on a laptop is normal, not a warning.
    # Faults still reach the verdict (missing signals are named in `missing`).
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR, format="dam: %(message)s")
    return run(args)
