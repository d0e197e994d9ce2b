#!/usr/bin/env python3
"""GPU check: real workloads under the probe and the sidecar on one NVIDIA GPU, verdicts checked.

    tools/gpu-check.sh [--seconds 20] [--warmup 8] [--out .out/gpu-check] [--only NAME ...]
    python tools/gpu_check.py --rehearse     # the same pipeline on a CPU-only machine

Starts ``dam sidecar`` (real NVML, GPM on Hopper+), then runs four short
workloads one after another, each under the probe (``dam_probe.instrument``):

    input-starved    a DataLoader whose workers wait on slow "I/O"   -> input-bound
    memory-bound     a chain of elementwise ops on a 2 GiB tensor     -> memory-bound
    compute-bound    bf16 8192^3 matmuls                              -> compute-bound
    launch-overhead  thousands of one-element kernels per step        -> latency-bound

For each it waits for the workload's first counted step, lets it warm up for
``--warmup`` seconds, takes a /metrics snapshot and another one ``--seconds``
later, prints the sampled metrics (GPM included; the interconnect byte counters
``dam_gpu_pcie_bytes_total`` and ``dam_gpu_nvlink_bytes_total`` as rates over the
window, GPU memory used/total, the container's memory and OOM kills and the
resident memory of the trainer and its loader workers), runs ``dam evaluate BEFORE
AFTER --json`` and compares the regime with the expected one. Exit status: 0
all regimes right, 1 a regime wrong or the sidecar reported no GPU data, 2 the
environment cannot run the check, 130 interrupted (Ctrl-C or SIGTERM; the
sidecar and the workloads are stopped either way). Snapshots, logs and
summary.json land in ``--out``.

``--rehearse`` runs the same pipeline end to end without a GPU: the real
``dam sidecar`` with one simulated GPU (``DAM_FAKE_GPUS=1``), each workload as a
real subprocess under the probe on the CPU (smaller sizes), the same snapshots
and ``dam evaluate``. It checks what a CPU can show: every verdict is valid
JSON with a regime, the probe counters moved, the (simulated) GPU series are
there (the interconnect byte counters included, and moving: the fake NVML
advances them), and the input-starved workload reads input-bound once the constant
simulated GPU series are left out (its GPU-side regime would only echo the fake).
On a GPU, a missing interconnect series is reported (a GPU without NVLink, a
driver without the counters) but does not fail the check.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Workload:
    name: str
    expected_regime: str
    what: str
    cpu_what: str = ""


WORKLOADS: tuple[Workload, ...] = (
    Workload(
        "input-starved",
        "input-bound",
        "DataLoader workers sleep 8 ms per item; tiny model on the GPU",
        "the same loader; the tiny model on the CPU",
    ),
    Workload(
        "memory-bound",
        "memory-bound",
        "24 in-place elementwise ops per step on 512 Mi fp32 elements (2 GiB)",
        "24 in-place elementwise ops per step on 4 Mi fp32 elements",
    ),
    Workload(
        "compute-bound",
        "compute-bound",
        "8 bf16 matmuls of 8192x8192 per step",
        "8 bf16 matmuls of 256x256 per step",
    ),
    Workload(
        "launch-overhead",
        "latency-bound",
        "2000 one-element kernels per step, batch size 1",
        "2000 one-element ops per step, batch size 1",
    ),
)
BY_NAME = {w.name: w for w in WORKLOADS}
REGIMES = frozenset({"input-bound", "memory-bound", "compute-bound", "latency-bound", "unknown"})

# Sizes per device: (memory-bound elements, compute-bound n). The GPU sizes fit an H200 easily
# (memory-bound 2 GiB, compute-bound 3 x 128 MiB); the CPU ones keep a step under ~0.3 s.
MEMORY_ELEMENTS = {"cuda": 512 * 2**20, "cpu": 4 * 2**20}
MATMUL_N = {"cuda": 8192, "cpu": 256}
ELEMENTWISE_PAIRS = 12  # mul_ + add_ per pair: 24 kernels per step
MATMULS_PER_STEP = 8
TINY_KERNELS_PER_STEP = 2000

GPU_GAUGES = (
    "dam_gpu_utilization_ratio",
    "dam_gpu_memory_busy_ratio",
    "dam_gpu_sm_active_ratio",
    "dam_gpu_sm_occupancy_ratio",
    "dam_gpu_tensor_active_ratio",
    "dam_gpu_dram_bandwidth_utilization_ratio",
    "dam_gpu_fp16_active_ratio",
    "dam_gpu_fp32_active_ratio",
    "dam_gpu_power_watts",
    "dam_gpu_sm_clock_hertz",
    "dam_gpu_memory_used_bytes",
    "dam_gpu_temperature_celsius",
    "dam_gpu_pcie_tx_bytes_per_second",
    "dam_gpu_pcie_rx_bytes_per_second",
)
GPM_GAUGES = (
    "dam_gpu_sm_active_ratio",
    "dam_gpu_tensor_active_ratio",
    "dam_gpu_dram_bandwidth_utilization_ratio",
)
GPU_PREFIX = "dam_gpu_"
INTERCONNECT_COUNTERS = ("dam_gpu_pcie_bytes_total", "dam_gpu_nvlink_bytes_total")
DIRECTIONS = ("tx", "rx")

EXIT_OK, EXIT_WRONG, EXIT_ENV, EXIT_INTERRUPTED = 0, 1, 2, 130
GPU_DEFAULTS = {"seconds": 20.0, "warmup": 8.0, "start_timeout": 120.0}
REHEARSAL_DEFAULTS = {"seconds": 4.0, "warmup": 1.0, "start_timeout": 60.0}
MIN_WINDOW_SECONDS = 2.0  # the sidecar samples at 1 Hz: a shorter window may hold no new sample
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
SETTLE_SECONDS = 1.5  # after a workload stops: one sidecar tick folds its closed probe file in


# --- argument handling ---------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tools/gpu-check.sh", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--seconds", type=float, default=None, help="measured window per workload (default 20; rehearsal 4)"
    )
    p.add_argument(
        "--warmup",
        type=float,
        default=None,
        help="seconds from a workload's first step to the first snapshot (default 8; rehearsal 1)",
    )
    p.add_argument(
        "--start-timeout",
        type=float,
        default=None,
        help="seconds a workload may take to its first step (default 120; rehearsal 60)",
    )
    p.add_argument(
        "--out", default=None, help="where snapshots and logs go (default .out/gpu-check[-rehearsal])"
    )
    p.add_argument(
        "--only", action="append", choices=sorted(BY_NAME), help="run only this workload (repeatable)"
    )
    p.add_argument("--port", type=int, default=0, help="sidecar port (default: a free one)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    p.add_argument(
        "--rehearse",
        action="store_true",
        help="no GPU: the same pipeline on the CPU with a simulated GPU behind the sidecar",
    )
    p.add_argument(
        "--workload", choices=sorted(BY_NAME), help=argparse.SUPPRESS
    )  # internal: run one workload
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help=argparse.SUPPRESS)  # internal
    return p


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    args = build_parser().parse_args(list(argv))
    defaults = REHEARSAL_DEFAULTS if args.rehearse else GPU_DEFAULTS
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.out is None:
        args.out = str(ROOT / ".out" / ("gpu-check-rehearsal" if args.rehearse else "gpu-check"))
    if args.workload:  # the internal child: --seconds is its whole run time
        if args.seconds <= 0:
            raise SystemExit("gpu-check: --seconds must be > 0")
        return args
    if args.seconds < MIN_WINDOW_SECONDS or args.warmup < 0 or args.start_timeout <= 0:
        raise SystemExit(
            f"gpu-check: --seconds must be >= {MIN_WINDOW_SECONDS:g} (the sidecar samples at 1 Hz), "
            "--warmup >= 0 and --start-timeout > 0"
        )
    return args


def selected(args: argparse.Namespace) -> list[Workload]:
    names = args.only or [w.name for w in WORKLOADS]
    return [BY_NAME[n] for n in dict.fromkeys(names)]


def plan(args: argparse.Namespace) -> str:
    mode = "rehearsal on the CPU, simulated GPU" if args.rehearse else "NVIDIA GPU"
    lines = [
        f"gpu-check ({mode}): {len(selected(args))} workloads, "
        f"warm-up {args.warmup:g} s, window {args.seconds:g} s"
    ]
    for w in selected(args):
        what = w.cpu_what if args.rehearse and w.cpu_what else w.what
        expect = "expect " + (
            w.expected_regime if not args.rehearse or w.name == "input-starved" else "a valid verdict"
        )
        lines.append(f"  {w.name:16s} {expect:22s} {what}")
    # + start-up (imports, CUDA init, first step), stopping, dam evaluate and the settle pause
    per = args.warmup + args.seconds + (10 if args.rehearse else 20)
    lines.append(f"  about {per * len(selected(args)) / 60:.1f} min; output in {args.out}")
    return "\n".join(lines)


# --- verdict check ---------------------------------------------------------------------
def check_verdict(workload: Workload, verdict: dict[str, Any]) -> tuple[bool, str]:
    """Whether ``dam evaluate --json`` named the expected regime; a one-line explanation."""
    bottleneck = verdict.get("bottleneck")
    if not isinstance(bottleneck, dict):
        return False, f"{workload.name}: no bottleneck in the verdict: {json.dumps(verdict)[:200]}"
    regime, axis = bottleneck.get("regime"), bottleneck.get("axis")
    conf = bottleneck.get("confidence")
    conf_text = f", confidence {conf:.2f}" if isinstance(conf, (int, float)) else ""
    if regime == workload.expected_regime:
        return True, f"OK    {workload.name}: {regime} ({axis}{conf_text})"
    evidence = "; ".join(str(e) for e in bottleneck.get("evidence", [])[:4])
    return (
        False,
        f"WRONG {workload.name}: got {regime} ({axis}{conf_text}), "
        f"expected {workload.expected_regime}. {evidence}",
    )


def verdict_problems(verdict: dict[str, Any]) -> list[str]:
    """What is wrong with the shape of a ``dam evaluate --json`` verdict (empty: well-formed)."""
    problems: list[str] = []
    bottleneck = verdict.get("bottleneck")
    if not isinstance(bottleneck, dict):
        return ["the verdict has no bottleneck object"]
    if bottleneck.get("regime") not in REGIMES:
        problems.append(f"the verdict names no known regime: {bottleneck.get('regime')!r}")
    conf = bottleneck.get("confidence")
    if not isinstance(conf, (int, float)) or not 0.0 <= conf <= 1.0:
        problems.append(f"the verdict's confidence is not a ratio: {conf!r}")
    if not isinstance(bottleneck.get("lever"), str) or not bottleneck.get("lever"):
        problems.append("the verdict names no lever")
    if not isinstance(verdict.get("metrics"), dict):
        problems.append("the verdict has no metrics object")
    return problems


def check_rehearsal(
    workload: Workload, verdict: dict[str, Any], cpu_verdict: dict[str, Any] | None
) -> tuple[bool, str]:
    """What a CPU can show: a well-formed verdict, and input-bound for the starved loader.

    The simulated GPU's series are constants (90 % busy), so the regime of the full
    verdict only echoes the fake; ``cpu_verdict`` (the same snapshots without the
    ``dam_gpu_*`` series) is judged from the probe and CPU figures alone.
    """
    problems = verdict_problems(verdict)
    regime = (verdict.get("bottleneck") or {}).get("regime") if isinstance(verdict, dict) else None
    if problems:
        return False, f"WRONG {workload.name}: " + "; ".join(problems)
    if workload.name != "input-starved":
        return True, f"OK    {workload.name}: valid verdict ({regime} against the simulated GPU)"
    if cpu_verdict is None:
        return False, f"WRONG {workload.name}: no verdict without the simulated GPU series"
    ok, message = check_verdict(workload, cpu_verdict)
    return ok, message + " (judged without the simulated GPU series)"


def evaluate(before: Path, after: Path, dam: Sequence[str]) -> dict[str, Any]:
    """Runs ``dam evaluate BEFORE AFTER --json``; raises RuntimeError with its stderr on failure."""
    try:
        done = subprocess.run(
            [*dam, "evaluate", str(before), str(after), "--json"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError("dam evaluate did not finish within 120 s") from None
    if done.returncode != 0:
        raise RuntimeError(f"dam evaluate exited {done.returncode}: {done.stderr.strip()[:500]}")
    try:
        result = json.loads(done.stdout)
    except json.JSONDecodeError as exc:
        raise RuntimeError(f"dam evaluate printed no JSON ({exc}): {done.stdout[:200]!r}") from None
    if not isinstance(result, dict):
        raise RuntimeError(f"dam evaluate printed JSON that is not an object: {done.stdout[:200]!r}")
    return result


# --- snapshots ---------------------------------------------------------------------------
Prom = dict[str, list[tuple[dict[str, str], float]]]


def _metric_name(line: str) -> str | None:
    """The metric a text-format line is about (samples and ``# HELP``/``# TYPE``), else None."""
    if line.startswith("#"):
        parts = line.split()
        return parts[2] if len(parts) > 2 and parts[1] in ("HELP", "TYPE", "UNIT") else None
    m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)", line)
    return m.group(1) if m else None


def parse_prom(text: str) -> Prom:
    """A small reader of the text format (the check must not depend on the package being importable)."""
    out: Prom = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)", line)
        if not m:
            continue
        labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
        try:
            value = float(m.group(4))
        except ValueError:
            continue
        out.setdefault(m.group(1), []).append((labels, value))
    return out


def without_gpu_series(text: str) -> str:
    """The snapshot without any ``dam_gpu_*`` series: what the sidecar of a CPU-only job serves."""
    kept = [line for line in text.splitlines() if not (_metric_name(line) or "").startswith(GPU_PREFIX)]
    return "\n".join(kept) + "\n"


def _scalar(snap: Prom, name: str) -> float | None:
    values = snap.get(name)
    return values[0][1] if values else None


def _sum(snap: Prom, name: str, **labels: str) -> float | None:
    values = [v for lb, v in snap.get(name, []) if all(lb.get(k) == x for k, x in labels.items())]
    return sum(values) if values else None


def steps_total(text: str) -> float:
    """Steps over every series (one per rank when the trainer has ranks)."""
    return _sum(parse_prom(text), "dam_steps_total") or 0.0


def _bytes(value: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value:.0f} B"


def memory_and_interconnect(b: Prom, a: Prom, dt: float | None) -> tuple[list[str], list[str], list[str]]:
    """Lines on interconnect counters and memory; the interconnect series missing, and the unmoved ones."""
    lines: list[str] = []
    missing: list[str] = []
    still: list[str] = []
    gpus = sorted({lb.get("gpu", "?") for lb, _ in a.get("dam_gpu_utilization_ratio", [])})
    for gpu in gpus:
        parts = []
        for name in INTERCONNECT_COUNTERS:
            short = name.removeprefix(GPU_PREFIX).removesuffix("_bytes_total")
            for direction in DIRECTIONS:
                vb, va = (
                    _sum(b, name, gpu=gpu, direction=direction),
                    _sum(a, name, gpu=gpu, direction=direction),
                )
                if va is None:
                    missing.append(f"{name}{{gpu={gpu},direction={direction}}}")
                    continue
                if vb is not None and dt:
                    parts.append(f"{short}_{direction}={_bytes((va - vb) / dt)}/s")
                    if va <= vb:
                        still.append(f"{name}{{gpu={gpu},direction={direction}}}")
                else:
                    parts.append(f"{short}_{direction}={_bytes(va)} total")
        used, total = (
            _sum(a, "dam_gpu_memory_used_bytes", gpu=gpu),
            _sum(a, "dam_gpu_memory_total_bytes", gpu=gpu),
        )
        if used is not None and total:
            parts.append(f"memory {_bytes(used)} of {_bytes(total)} ({used / total:.0%})")
        lines.append(f"  gpu {gpu} interconnect and memory: " + (" ".join(parts) or "none reported"))
    usage, limit = (
        _scalar(a, "dam_container_memory_usage_bytes"),
        _scalar(a, "dam_container_memory_limit_bytes"),
    )
    kills = _scalar(a, "dam_container_oom_kills_total")
    source = [lb.get("source") for lb, v in a.get("dam_container_memory_source", []) if v == 1.0]
    rss_main = _sum(a, "dam_process_resident_memory_bytes", role="main")
    rss_workers = _sum(a, "dam_process_resident_memory_bytes", role="worker")
    host = [f"source {source[0] if source else '?'}"]
    if usage is not None:
        host.append(f"usage {_bytes(usage)}" + (f" of {_bytes(limit)}" if limit else " (no limit)"))
    if kills is not None:
        host.append(f"OOM kills {kills:g}")
    if rss_main is not None:
        host.append(f"resident: main {_bytes(rss_main)}, workers {_bytes(rss_workers or 0.0)}")
    lines.append("  container memory: " + ", ".join(host))
    return lines, missing, still


def summarize(before_text: str, after_text: str, rehearse: bool = False) -> tuple[list[str], list[str]]:
    """Lines describing the window, and problems with the sidecar's data (no GPU, no GPM, no steps).

    With ``rehearse`` (the simulated GPU), interconnect counters that are missing or
    did not move are problems too; on a real GPU they are only reported.
    """
    b, a = parse_prom(before_text), parse_prom(after_text)
    lines: list[str] = []
    problems: list[str] = []
    dt = None
    tb, ta = _scalar(b, "dam_snapshot_timestamp_seconds"), _scalar(a, "dam_snapshot_timestamp_seconds")
    if tb is not None and ta is not None and ta > tb:
        dt = ta - tb
    else:
        problems.append(f"the snapshots are not a window (timestamps {tb} -> {ta})")

    def delta(name: str, **labels: str) -> float | None:
        vb, va = _sum(b, name, **labels), _sum(a, name, **labels)
        return None if vb is None or va is None else va - vb

    steps, wait, step_s = (
        delta("dam_steps_total"),
        delta("dam_dataloader_wait_seconds_total"),
        delta("dam_step_seconds_total"),
    )
    main_cpu, worker_cpu = (
        delta("dam_process_cpu_seconds_total", role="main"),
        delta("dam_process_cpu_seconds_total", role="worker"),
    )
    if dt:
        lines.append(f"  window {dt:.1f} s, steps/s {((steps or 0) / dt):.2f}")
        if main_cpu is not None:
            cores = f"  CPU cores: main {main_cpu / dt:.2f}"
            lines.append(cores + (f", workers {worker_cpu / dt:.2f}" if worker_cpu is not None else ""))
    if wait is not None and step_s:
        lines.append(f"  data wait ratio {wait / step_s:.3f}")
    if not steps:
        problems.append("no steps counted between the snapshots (probe not publishing?)")
    elif not step_s:
        problems.append("steps counted but no step time (dam_step_seconds_total did not move)")
    nvml_up = _scalar(a, "dam_nvml_up")
    attribution = [lb.get("state") for lb, v in a.get("dam_gpu_attribution", []) if v == 1.0]
    lines.append(f"  dam_nvml_up {nvml_up}  attribution {attribution[0] if attribution else '?'}")
    if nvml_up != 1.0:
        problems.append("dam_nvml_up is not 1")
    gpus = sorted({lb.get("gpu", "?") for lb, _ in a.get("dam_gpu_utilization_ratio", [])})
    if not gpus:
        problems.append("no dam_gpu_utilization_ratio series (NVML or attribution failed)")
    for gpu in gpus:
        parts = []
        for name in GPU_GAUGES:
            for lb, v in a.get(name, []):
                if lb.get("gpu") == gpu:
                    short = name.removeprefix(GPU_PREFIX)
                    parts.append(f"{short}={v:.3g}")
        lines.append(f"  gpu {gpu}: " + " ".join(parts))
        if not any(lb.get("gpu") == gpu for name in GPM_GAUGES for lb, _ in a.get(name, [])):
            lines.append(f"  gpu {gpu}: no GPM series (pre-Hopper GPU, or GPM unavailable)")
    more, missing, still = memory_and_interconnect(b, a, dt)
    lines += more
    if missing:
        note = (
            "missing (no NVLink on this GPU, or a driver without the counters)" if not rehearse else "missing"
        )
        lines.append(f"  interconnect series {note}: {', '.join(missing)}")
    if rehearse and gpus:
        problems += [f"{m} is missing (the simulated GPU has it)" for m in missing]
        problems += [f"{m} did not move over the window" for m in still]
    throttled = [lb.get("reason") for lb, v in a.get("dam_gpu_clock_throttle_reason", []) if v == 1.0]
    if throttled:
        lines.append(f"  clock event reasons: {', '.join(sorted({t or '?' for t in throttled}))}")
    durations = [(lb.get("sampler"), v) for lb, v in a.get("dam_sampler_duration_seconds", [])]
    if durations:
        lines.append(
            "  sampler durations: "
            + ", ".join(f"{s}={v * 1000:.2f} ms" for s, v in sorted(durations, key=str))
        )
    errors = [(lb.get("sampler"), lb.get("reason"), v) for lb, v in a.get("dam_sampler_errors_total", [])]
    if errors:
        lines.append("  sampler errors: " + ", ".join(f"{s}/{r}={v:g}" for s, r, v in errors))
    return lines, problems


# --- the workloads (run in a child process: --workload NAME [--device cpu]) -----------------
def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)  # atexit runs: the probe publishes its final counters and closes its file


def run_workload(name: str, seconds: float, device: str = "cuda") -> int:
    """One workload for ``seconds`` (or until SIGTERM) on ``device``; 2 when the device is missing."""
    import itertools

    import torch

    import dam_probe

    cuda = device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("gpu-check: torch.cuda is not available", file=sys.stderr)
        return EXIT_ENV
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    dev = torch.device(device)
    # Every step ends with a synchronisation, so that the probe's step time covers the GPU work.
    sync: Callable[[], None] = torch.cuda.synchronize if cuda else (lambda: None)
    deadline = time.monotonic() + seconds

    def batches(size: int) -> Any:
        cpu = torch.empty(size, 1)
        return dam_probe.instrument(itertools.repeat(cpu))

    if name == "input-starved":
        from torch.utils.data import DataLoader, Dataset

        class SlowIO(Dataset[torch.Tensor]):
            def __len__(self) -> int:
                return 10**9

            def __getitem__(self, i: int) -> torch.Tensor:
                time.sleep(0.008)  # waiting on storage
                return torch.randn(1024)

        model = torch.nn.Sequential(
            torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)
        ).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        loader = DataLoader(SlowIO(), batch_size=32, num_workers=2, pin_memory=cuda)
        for x in dam_probe.instrument(loader):
            loss = model(x.to(dev, non_blocking=True)).square().mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sync()
            if time.monotonic() > deadline:
                break
    elif name == "memory-bound":
        x = torch.ones(MEMORY_ELEMENTS[device], device=dev)
        for _ in batches(64):
            for _ in range(ELEMENTWISE_PAIRS):
                x.mul_(0.999).add_(0.001)  # stays near 1: no denormals, no overflow
            sync()
            if time.monotonic() > deadline:
                break
    elif name == "compute-bound":
        n = MATMUL_N[device]
        a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        c = torch.empty(n, n, device=dev, dtype=torch.bfloat16)
        dam_probe.set_flops_per_step(MATMULS_PER_STEP * 2 * n**3)
        for _ in batches(64):
            for _ in range(MATMULS_PER_STEP):
                torch.matmul(a, b, out=c)
            sync()
            if time.monotonic() > deadline:
                break
    elif name == "launch-overhead":
        t = torch.zeros(1, device=dev)
        for _ in batches(1):
            for _ in range(TINY_KERNELS_PER_STEP):
                t.add_(1.0)
            sync()
            if time.monotonic() > deadline:
                break
    return EXIT_OK


# --- orchestration ---------------------------------------------------------------------------
class CheckEnvironmentError(Exception):
    """The machine cannot run the check (exit status 2)."""


class WorkloadError(Exception):
    """A workload did not start, or died during its window."""


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        body: bytes = r.read()
    return body.decode("utf-8")


def _tail(path: Path, lines: int = 8) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join("    | " + line for line in text.splitlines()[-lines:])


def child_env(probe_dir: str, **extra: str) -> dict[str, str]:
    """The environment of the sidecar and the workloads: ours, minus DAM_* settings that would skew them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAM_")}
    env.update({"DAM_PROBE_DIR": probe_dir, "PYTHONUNBUFFERED": "1", **extra})
    return env


def start_sidecar(
    port: int, probe_dir: str, log: Any, fake_gpus: int = 0, timeout: float = 30.0
) -> tuple[subprocess.Popen[bytes], int]:
    env = child_env(
        probe_dir,
        DAM_GPU_ATTRIBUTION_FALLBACK="all",
        DAM_FAKE_GPUS=str(fake_gpus),
        DAM_ERROR_LOG_INTERVAL_SECONDS="10",
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dam_sidecar.app",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--interval",
            "1",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # our signals, not the terminal's, stop it (see stop())
    )
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            time.sleep(0.2)
            if proc.poll() is not None:
                raise CheckEnvironmentError(
                    f"the sidecar exited with {proc.returncode}; see {log.name}:\n{_tail(Path(log.name))}"
                )
            text = Path(log.name).read_text(errors="replace")
            m = re.search(r"listening on http://[^:]+:(\d+)/metrics", text)
            if m:
                return proc, int(m.group(1))
        raise CheckEnvironmentError(f"the sidecar did not start within {timeout:g} s; see {log.name}")
    except BaseException:
        stop(proc)
        raise


def stop(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """SIGTERM to the process, SIGKILL after ``timeout``; then SIGKILL to what is left of its group.

    Children are started in their own session (process group), so the group also
    holds a workload's DataLoader workers: none is left behind.
    """
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def wait_for_first_step(port: int, baseline: float, child: subprocess.Popen[bytes], timeout: float) -> float:
    """Seconds until the sidecar counts a step beyond ``baseline``; WorkloadError on exit or timeout."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if child.poll() is not None:
            raise WorkloadError(f"the workload exited with {child.returncode} before its first step")
        if steps_total(scrape(port)) > baseline:
            return time.monotonic() - t0
        time.sleep(0.25)
    raise WorkloadError(f"no step counted within {timeout:g} s of the workload's start")


def measure(
    w: Workload, args: argparse.Namespace, port: int, probe_dir: str, out: Path
) -> tuple[str, str, float]:
    """Runs one workload and returns the BEFORE and AFTER scrapes and its start-up time."""
    device = "cpu" if args.rehearse else "cuda"
    # The child's own deadline is a backstop: it is normally stopped right after the AFTER scrape.
    total = args.start_timeout + args.warmup + args.seconds + 30
    log_path = out / f"{w.name}.log"
    baseline = steps_total(scrape(port))
    with open(log_path, "wb") as wlog:
        child = subprocess.Popen(
            [sys.executable, __file__, "--workload", w.name, "--device", device, "--seconds", f"{total:g}"],
            env=child_env(probe_dir),
            stdout=wlog,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            try:
                started = wait_for_first_step(port, baseline, child, args.start_timeout)
            except WorkloadError as exc:
                detail = f"{exc}; see {log_path}:\n{_tail(log_path)}"
                if child.returncode == EXIT_ENV:
                    raise CheckEnvironmentError(f"{w.name}: {detail}") from None
                raise WorkloadError(detail) from None
            time.sleep(args.warmup)
            before = scrape(port)
            time.sleep(args.seconds)
            after = scrape(port)
            if child.poll() is not None:
                raise WorkloadError(
                    f"the workload exited with {child.returncode} during its window; "
                    f"see {log_path}:\n{_tail(log_path)}"
                )
        finally:
            stop(child)
    return before, after, started


def run_check(w: Workload, args: argparse.Namespace, port: int, probe_dir: str, out: Path) -> dict[str, Any]:
    """Measures, summarises and evaluates one workload; the summary.json entry (``ok`` says it passed)."""
    dam = [sys.executable, "-m", "dam_operator.cli"]
    entry: dict[str, Any] = {"workload": w.name, "expected": w.expected_regime, "problems": []}
    try:
        before, after, started = measure(w, args, port, probe_dir, out)
    except (WorkloadError, OSError) as exc:  # OSError: /metrics did not answer (the sidecar died?)
        message = f"ERROR {w.name}: {exc}"
        if isinstance(exc, OSError):
            message += f"; see {out / 'sidecar.log'}:\n{_tail(out / 'sidecar.log')}"
        entry.update(ok=False, problems=[str(exc)])
        print(message, flush=True)
        return entry
    entry["startup_seconds"] = round(started, 2)
    bpath, apath = out / f"{w.name}.before.prom", out / f"{w.name}.after.prom"
    bpath.write_text(before)
    apath.write_text(after)
    lines, problems = summarize(before, after, rehearse=args.rehearse)
    print(f"  first step after {started:.1f} s")
    print("\n".join(lines))
    try:
        verdict = evaluate(bpath, apath, dam)
        entry["verdict"] = verdict
        print("  metrics: " + json.dumps(verdict.get("metrics", {}), sort_keys=True))
        if args.rehearse:
            cpu_verdict = None
            if w.name == "input-starved":
                cb, ca = out / f"{w.name}.before.cpu.prom", out / f"{w.name}.after.cpu.prom"
                cb.write_text(without_gpu_series(before))
                ca.write_text(without_gpu_series(after))
                cpu_verdict = evaluate(cb, ca, dam)
                entry["cpu_verdict"] = cpu_verdict
            ok, message = check_rehearsal(w, verdict, cpu_verdict)
        else:
            ok, message = check_verdict(w, verdict)
    except RuntimeError as exc:
        ok, message = False, f"ERROR {w.name}: {exc}"
    for p in problems:
        print(f"  PROBLEM: {p}")
    entry["problems"] = problems
    entry["ok"] = ok = ok and not problems
    print(message if not problems or not message.startswith("OK") else f"WRONG {w.name}: {problems[0]}")
    sys.stdout.flush()
    return entry


def _nvml_usable() -> str | None:
    """None when NVML initialises here, else why not."""
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except Exception as exc:
        return f"NVML is not usable here ({exc}); this check needs an NVIDIA GPU (or --rehearse)"
    return None


def orchestrate(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.rehearse:
        import importlib.util

        if importlib.util.find_spec("torch") is None:
            print("gpu-check: the rehearsal needs PyTorch (CPU is fine)", file=sys.stderr)
            return EXIT_ENV
    else:
        why = _nvml_usable()
        if why is not None:
            print(f"gpu-check: {why}", file=sys.stderr)
            return EXIT_ENV
    summary: list[dict[str, Any]] = []
    print(plan(args), flush=True)
    # Ctrl-C, SIGTERM (timeout) or a closed terminal: unwind, so that the finally blocks stop the
    # sidecar and the workload (they run in their own sessions and see none of these signals).
    previous = {s: signal.signal(s, _raise_interrupt) for s in STOP_SIGNALS}
    probe_dir = tempfile.mkdtemp(prefix="dam-probe-")
    status = EXIT_OK
    try:
        with open(out / "sidecar.log", "wb") as slog:
            sidecar, port = start_sidecar(args.port, probe_dir, slog, fake_gpus=1 if args.rehearse else 0)
            try:
                for w in selected(args):
                    expect = w.expected_regime if not args.rehearse else "a valid verdict"
                    if args.rehearse and w.name == "input-starved":
                        expect = w.expected_regime
                    print(f"\n== {w.name} (expect {expect}): {w.cpu_what if args.rehearse else w.what}")
                    sys.stdout.flush()
                    summary.append(run_check(w, args, port, probe_dir, out))
                    time.sleep(SETTLE_SECONDS)  # the finished probe file is folded in before the next one
            finally:
                stop(sidecar)
    except CheckEnvironmentError as exc:
        print(f"gpu-check: {exc}", file=sys.stderr)
        status = EXIT_ENV
    except KeyboardInterrupt:
        print("\ngpu-check: interrupted; the sidecar and the workload are stopped", file=sys.stderr)
        status = EXIT_INTERRUPTED
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        shutil.rmtree(probe_dir, ignore_errors=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    failures = sum(1 for e in summary if not e.get("ok"))
    if status != EXIT_OK:
        return status
    print(f"\ngpu-check: {len(summary) - failures}/{len(summary)} checks passed; details in {out}")
    return EXIT_OK if failures == 0 else EXIT_WRONG


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.workload:
        return run_workload(args.workload, args.seconds, args.device)
    if args.dry_run:
        print(plan(args))
        return EXIT_OK
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
