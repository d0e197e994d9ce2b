"""Local mode: ``dam run [--interval S] [--window S] [--json] -- CMD ...``.

Runs CMD with the probe's automatic instrumentation on its ``PYTHONPATH``,
samples the probe file, the process's CPU (main process and DataLoader
workers), cgroup throttling and NVML (when a GPU exists) in this process —
the same samplers as the sidecar, without HTTP — and diagnoses each window
with the same engine and hysteresis as the operator. While CMD runs, the live
verdict goes to stderr (``dam_operator.local.live``: one status line redrawn in
place on a terminal, one line per verdict change elsewhere); the final verdict
is printed at the end. Exits with CMD's exit code.

With ``--json`` the final verdict is the only thing on stdout (the field names
of the resource status: ``bottleneck``, ``metrics``, ``goodput``); CMD's own stdout is sent
to stderr so that ``dam run --json -- ... | jq`` works.

``--stall-after SECONDS --on-stall {report,exit}`` (``dam_operator.local.stall``): a job that takes
no batch for max(SECONDS, 10 median steps) is stalled; the culprit rank, where it is and its frames
are printed while the job lives (``report``), or the command's process group is stopped and
``dam run`` exits 3 (``exit``); ``--json`` carries ``progress`` (``status.progress``'s shape).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from types import FrameType
from typing import IO, Any, TextIO

from dam_contract.snapshot import Snapshot
from dam_operator.diagnosis.goodput import Goodput, ProcessLife, accelerators_of, goodput_of
from dam_operator.diagnosis.hysteresis import rfc3339
from dam_operator.diagnosis.model import Hardware, RankFigures, Verdict
from dam_operator.diagnosis.progress import STALL_AFTER_SECONDS_DEFAULT, StallSettings
from dam_operator.diagnosis.render import render_goodput, render_text
from dam_operator.local.child import (
    SnapshotSource,
    SourceFactory,
    Workspace,
    child_environment,
    command_after_dashes,
    default_source,
    lives_of,
    probe_workspace,
    sample_while_running,
    shell_exit_status,
)
from dam_operator.local.live import (
    LIVE_MODES,
    ChangeFilter,
    OutputRelay,
    StatusLine,
    live_mode,
    progress_text,
    terminal_columns,
    verdict_text,
)
from dam_operator.local.memory import MemoryCgroupSource, OwnMemoryCgroup
from dam_operator.local.session import LocalSession
from dam_operator.local.stall import ON_STALL, STALL_EXIT_CODE, StallWatch


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
        "--live",
        choices=LIVE_MODES,
        default="auto",
        help="live verdict on stderr: auto (default) = one status line redrawn in place on a terminal, "
        "a line per verdict change elsewhere; line, changes or never force one",
    )
    parser.add_argument(
        "--stall-after",
        type=float,
        default=STALL_AFTER_SECONDS_DEFAULT,
        help="a job that takes no batch for this many seconds (and 10 median steps) is stalled "
        f"(default {STALL_AFTER_SECONDS_DEFAULT:.0f})",
    )
    parser.add_argument(
        "--on-stall",
        choices=ON_STALL,
        default="report",
        help="report (default): print the stalled rank, its place and frames while the job lives; "
        f"exit: stop the command's process group and exit {STALL_EXIT_CODE}",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    args = parser.parse_args(list(argv))
    cmd = command_after_dashes(parser, args.command, "dam run")
    if not (0.05 <= args.interval <= 3600):
        parser.error(f"--interval must be between 0.05 and 3600 seconds, got {args.interval}")
    if not (args.interval <= args.window <= 86400):
        parser.error(
            f"--window must be between --interval ({args.interval}) and 86400 seconds, got {args.window}"
        )
    if not (1 <= args.stall_after <= 7 * 86400):
        parser.error(f"--stall-after must be between 1 and 604800 seconds, got {args.stall_after}")
    for flag, value in (("--peak-flops", args.peak_flops), ("--memory-bandwidth", args.memory_bandwidth)):
        if value is not None and not value > 0:
            parser.error(f"{flag} must be a positive number, got {value}")
    args.command = cmd
    return args


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


def _fd(stream: IO[Any]) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):  # a stream without a descriptor (a test's capture)
        return None


@dataclass
class _Live:
    """Where the live verdict (``--live``) and the command's own output (``--json``) go."""

    mode: str
    status: StatusLine | None = None
    """The status line redrawn in place (mode ``line``)."""
    relay: OutputRelay | None = None
    """Copies the command's output above the status line (mode ``line``, both streams on descriptors)."""
    command_out: Any = None
    command_err: Any = None

    def finish(self) -> None:
        """The command has exited: its last output copied, the status line cleared."""
        if self.relay is not None:
            self.relay.drain()
        if self.status is not None:
            self.status.close()


def _live(args: argparse.Namespace, err: Callable[[str], None]) -> _Live:
    err_fd = _fd(sys.stderr)
    mode = live_mode(args.live, stderr_is_terminal=err_fd is not None and os.isatty(err_fd))
    # --json: stdout carries only the verdict, the command's stdout goes to stderr.
    live = _Live(mode, command_out=sys.stderr if args.json else None)
    if mode != "line":
        return live
    live.status = StatusLine(err, lambda: terminal_columns(2 if err_fd is None else err_fd))
    out_fd = _fd(sys.stderr if args.json else sys.stdout)
    if err_fd is not None and out_fd is not None:
        sys.stdout.flush()
        live.relay = OutputRelay({1: out_fd, 2: err_fd}, live.status)
        live.command_out, live.command_err = live.relay.child_fds[1], live.relay.child_fds[2]
    return live


def _start(
    args: argparse.Namespace, live: _Live, workspace: Workspace, err: Callable[[str], None]
) -> subprocess.Popen[bytes] | None:
    """Starts the command under the probe; None (said on ``err``) when it cannot start."""
    env = child_environment(os.environ, workspace.inject_dir, workspace.probe_dir)
    # --on-stall exit stops the command's whole process group (torchrun and its ranks): its own.
    group = 0 if args.on_stall == "exit" else None
    try:
        child = subprocess.Popen(
            args.command, env=env, stdout=live.command_out, stderr=live.command_err, process_group=group
        )
    except OSError as exc:
        if live.relay is not None:
            live.relay.close()
        err(f"dam run: cannot start {args.command[0]!r}: {exc.strerror or exc}\n")
        return None
    if live.relay is not None:
        live.relay.started()
    return child


_FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _forward_signals(child: subprocess.Popen[bytes]) -> dict[signal.Signals, Any]:
    """Ctrl-C and SIGTERM go to the command (which decides how to stop); the previous handlers."""

    def forward(signum: int, _frame: FrameType | None) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    return {s: signal.signal(s, forward) for s in _FORWARDED_SIGNALS}


def _progress_lines(t: float, watch: StallWatch) -> str:
    """A change of progress while the job lives: the stall (culprit, frames, who waits), or its end."""
    p = watch.progress
    if p is None:
        return ""
    head = f"dam: {t:4.0f}s  "
    if p.state != "Stalled":
        return head + f"progress: {p.state} again (the stall ended)\n"
    lines = [head + p.describe()]
    if p.culprit is not None:
        lines += [f"dam:          {frame}" for frame in p.culprit.frames]
    return "\n".join(lines) + "\n"


def _live_verdicts(
    session: LocalSession,
    live: _Live,
    args: argparse.Namespace,
    err: Callable[[str], None],
    watch: StallWatch | None = None,
) -> Callable[[float, Snapshot], bool]:
    """The sampling callback: each snapshot into ``session``; the live verdict (at most once per
    evaluation period) on the status line, or on ``err`` when it changed; the job's progress
    (``watch``): a change printed, True (stop sampling) at a stall under ``--on-stall exit``."""
    changes = ChangeFilter()
    eval_period = min(args.window, max(args.interval, 1.0))
    last_eval = float("-inf")

    def on_sample(t: float, snap: Snapshot) -> bool:
        nonlocal last_eval
        session.add(t, snap)
        if watch is not None:
            progress, changed = watch.sample()
            if changed and "Stalled" in (progress.state, watch.tracker.previous):
                err(_progress_lines(t, watch))
            if watch.stops():
                return True
        if live.mode == "never":
            return False
        if session.warming_up():
            if live.status is not None:
                live.status.show(progress_text(t, session.steps, args.window))
            return False
        if t - last_eval < eval_period:
            return False
        last_eval = t
        verdict = session.window_verdict()
        if verdict is None:
            return False
        if live.status is not None:
            live.status.show(verdict_text(t, verdict))
        elif changes.changed(verdict):
            err(verdict_text(t, verdict) + "\n")
        return False

    return on_sample


def _watch(
    child: subprocess.Popen[bytes],
    source: SnapshotSource,
    on_sample: Callable[[float, Snapshot], bool],
    *,
    interval_seconds: float,
    live: _Live,
    previous_handlers: Mapping[signal.Signals, Any],
) -> int:
    """Samples until the command exits; then the signal handlers are restored and its return code
    is returned (also when sampling failed: the command is waited for). Sampling stopped early
    (a stall under ``--on-stall exit``) stops the command's process group first."""
    try:
        pump = None if live.relay is None else live.relay.pump
        if not sample_while_running(child, source, interval_seconds, on_sample, pump=pump):
            stop_group(child)
    finally:
        source.close()
        for s, handler in previous_handlers.items():
            signal.signal(s, handler)
        returncode = child.wait()
        live.finish()
    return returncode


STOP_GRACE_SECONDS = 10.0
"""SIGTERM to the stalled command's process group, then SIGKILL after this long."""


def stop_group(child: subprocess.Popen[bytes], grace_seconds: float = STOP_GRACE_SECONDS) -> None:
    """Stops the command's process group (its own: ``--on-stall exit`` starts it in one)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(child.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            child.wait(timeout=grace_seconds)
            return
        except subprocess.TimeoutExpired:
            continue


def _report(
    args: argparse.Namespace,
    final: Verdict,
    ranks: Sequence[RankFigures],
    goodput: Goodput | None,
    code: int,
    *,
    watch: StallWatch | None = None,
) -> str:
    """The final verdict: the status's fields as JSON (``--json``), else the text."""
    if not args.json:
        return "\n" + render_text(final) + ("" if goodput is None else render_goodput(goodput)) + "\n"
    doc = final.to_status()
    if ranks:  # a multi-rank job (torchrun): each rank's figures
        doc["ranks"] = [r.model_dump(by_alias=True, exclude_none=True, mode="json") for r in ranks]
    if goodput is not None:  # status.goodput's shape: over the command's life
        doc["goodput"] = goodput.model_dump(by_alias=True, exclude_none=True, mode="json")
    if watch is not None and watch.progress is not None:  # status.progress's shape
        doc["progress"] = watch.progress.model_dump(by_alias=True, exclude_none=True, mode="json")
    doc["lastEvaluationTime"] = rfc3339(datetime.now(UTC))
    doc["exitCode"] = code
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def run(
    args: argparse.Namespace,
    make_source: SourceFactory = default_source,
    out: Callable[[str], None] | None = None,
    err: Callable[[str], None] | None = None,
    memory_cgroup: Callable[[], OwnMemoryCgroup] | None = OwnMemoryCgroup,
) -> int:
    """Runs the command under the probe; prints the live and the final verdicts.

    ``memory_cgroup`` reads ``dam run``'s own memory cgroup, which the command inherits: its
    figures replace the samplers' container memory while the command shares it, so the
    snapshot taken after the command exited still counts an OOM kill that ended it (see
    ``dam_operator.local.memory``). None: the samplers' figures only.
    """
    out = out or _writer(sys.stdout)
    err = err or _writer(sys.stderr)
    live = _live(args, err)
    with probe_workspace() as workspace:
        child = _start(args, live, workspace, err)
        if child is None:
            return 127
        previous_handlers = _forward_signals(child)
        session = LocalSession(window_seconds=args.window, hardware=_hardware(args))
        watch = StallWatch(workspace.probe_dir, StallSettings(after_seconds=args.stall_after), args.on_stall)
        source = make_source(workspace.probe_dir, args.interval)
        memory = None if memory_cgroup is None else MemoryCgroupSource(source, memory_cgroup(), child.pid)
        returncode = _watch(
            child,
            source if memory is None else memory,
            _live_verdicts(session, live, args, err, watch),
            interval_seconds=args.interval,
            live=live,
            previous_handlers=previous_handlers,
        )
        # The command finished its steps by itself: what came after its last work (its last
        # step, save and collective) is no part of the final rate (LocalSession._without_tail).
        completed = returncode == 0 and not watch.stops()
        oom_killed = None if memory is None else memory.oom_killed(returncode)
        final = session.final_verdict(oom_killed=oom_killed, completed=completed)
        ranks = session.final_ranks(completed=completed)
        goodput = _goodput(session, lives_of(source))
    code = STALL_EXIT_CODE if watch.stops() else shell_exit_status(returncode)
    out(_report(args, final, ranks, goodput, code, watch=watch))
    return code


def _goodput(session: LocalSession, lives: Sequence[ProcessLife] | None = None) -> Goodput | None:
    """Goodput over the command's life, from the last sample (taken after it exited); ``lives``:
    every training process the run saw (restarts inside the command cost ``restart``)."""
    if not session.history:
        return None
    last = session.history[-1][1]
    return goodput_of(last, accelerators_of(last, local=True), lives)


def main(argv: Sequence[str]) -> int:
    args = _parse_args(argv)
    # Local mode samples whatever exists: no NVML on a laptop is normal, not a warning.
    # Faults still reach the verdict (missing signals are named in `missing`).
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR, format="dam: %(message)s")
    return run(args)
