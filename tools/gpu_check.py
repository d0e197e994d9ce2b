#!/usr/bin/env python3
"""GPU check: real workloads under the probe and the sidecar on one NVIDIA GPU, verdicts checked.

    tools/gpu-check.sh [--seconds 20] [--warmup 8] [--out .out/gpu-check] [--only NAME ...]

Starts ``dam sidecar`` (real NVML, GPM on Hopper+), then runs four short
workloads one after another, each under the probe (``dam_probe.instrument``):

    input-starved    a DataLoader whose workers wait on slow "I/O"   -> input-bound
    memory-bound     a chain of elementwise ops on a 2 GiB tensor     -> memory-bound
    compute-bound    bf16 8192^3 matmuls                              -> compute-bound
    launch-overhead  thousands of one-element kernels per step        -> latency-bound

For each it takes a /metrics snapshot after the warm-up and another one
``--seconds`` later, prints the sampled metrics (GPM included), runs
``dam evaluate BEFORE AFTER --json`` and compares the regime with the
expected one. Exit status: 0 all regimes right, 1 a regime wrong or the
sidecar reported no GPU data, 2 the environment cannot run the check.
Snapshots, logs and summary.json land in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Workload:
    name: str
    expected_regime: str
    what: str


WORKLOADS: tuple[Workload, ...] = (
    Workload("input-starved", "input-bound", "DataLoader workers sleep 8 ms per item; tiny model on the GPU"),
    Workload("memory-bound", "memory-bound", "24 in-place elementwise ops per step on 512 Mi fp32 elements"),
    Workload("compute-bound", "compute-bound", "8 bf16 matmuls of 8192x8192 per step"),
    Workload("launch-overhead", "latency-bound", "2000 one-element kernels per step, batch size 1"),
)
BY_NAME = {w.name: w for w in WORKLOADS}

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


# --- argument handling ---------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tools/gpu-check.sh", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--seconds", type=float, default=20.0, help="measured window per workload (default 20)")
    p.add_argument("--warmup", type=float, default=8.0, help="seconds before the first snapshot (default 8)")
    p.add_argument("--out", default=str(ROOT / ".out" / "gpu-check"), help="where snapshots and logs go")
    p.add_argument(
        "--only", action="append", choices=sorted(BY_NAME), help="run only this workload (repeatable)"
    )
    p.add_argument("--port", type=int, default=0, help="sidecar port (default: a free one)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    p.add_argument(
        "--workload", choices=sorted(BY_NAME), help=argparse.SUPPRESS
    )  # internal: run one workload
    return p


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    args = build_parser().parse_args(list(argv))
    if args.seconds <= 0 or args.warmup < 0:
        raise SystemExit("gpu-check: --seconds must be > 0 and --warmup >= 0")
    return args


def selected(args: argparse.Namespace) -> list[Workload]:
    names = args.only or [w.name for w in WORKLOADS]
    return [BY_NAME[n] for n in names]


def plan(args: argparse.Namespace) -> str:
    lines = [
        f"gpu-check: {len(selected(args))} workloads, warm-up {args.warmup:g} s, window {args.seconds:g} s"
    ]
    for w in selected(args):
        lines.append(f"  {w.name:16s} expect {w.expected_regime:14s} {w.what}")
    per = args.warmup + args.seconds + 15  # + start-up (CUDA init) and shutdown
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


def evaluate(before: Path, after: Path, dam: Sequence[str]) -> dict[str, Any]:
    """Runs ``dam evaluate BEFORE AFTER --json``; raises RuntimeError with its stderr on failure."""
    done = subprocess.run(
        [*dam, "evaluate", str(before), str(after), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"dam evaluate exited {done.returncode}: {done.stderr.strip()[:500]}")
    try:
        result: dict[str, Any] = json.loads(done.stdout)
    except json.JSONDecodeError as exc:
        raise RuntimeError(f"dam evaluate printed no JSON ({exc}): {done.stdout[:200]!r}") from None
    return result


# --- snapshots ---------------------------------------------------------------------------
def parse_prom(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """A small reader of the text format (the check must not depend on the package being importable)."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
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


def _scalar(snap: dict[str, list[tuple[dict[str, str], float]]], name: str) -> float | None:
    values = snap.get(name)
    return values[0][1] if values else None


def summarize(before_text: str, after_text: str) -> tuple[list[str], list[str]]:
    """Lines describing the window, and problems with the sidecar's data (no GPU, no GPM, no steps)."""
    b, a = parse_prom(before_text), parse_prom(after_text)
    lines: list[str] = []
    problems: list[str] = []
    dt = None
    tb, ta = _scalar(b, "dam_snapshot_timestamp_seconds"), _scalar(a, "dam_snapshot_timestamp_seconds")
    if tb is not None and ta is not None and ta > tb:
        dt = ta - tb

    def delta(name: str) -> float | None:
        vb, va = _scalar(b, name), _scalar(a, name)
        return None if vb is None or va is None else va - vb

    steps, wait, step_s = (
        delta("dam_steps_total"),
        delta("dam_dataloader_wait_seconds_total"),
        delta("dam_step_seconds_total"),
    )
    if dt:
        lines.append(f"  window {dt:.1f} s, steps/s {((steps or 0) / dt):.2f}")
    if wait is not None and step_s:
        lines.append(f"  data wait ratio {wait / step_s:.3f}")
    if not steps:
        problems.append("no steps counted between the snapshots (probe not publishing?)")
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
                    short = name.removeprefix("dam_gpu_")
                    parts.append(f"{short}={v:.3g}")
        lines.append(f"  gpu {gpu}: " + " ".join(parts))
        if not any(lb.get("gpu") == gpu for name in GPM_GAUGES for lb, _ in a.get(name, [])):
            lines.append(f"  gpu {gpu}: no GPM series (pre-Hopper GPU, or GPM unavailable)")
    throttled = [lb.get("reason") for lb, v in a.get("dam_gpu_clock_throttle_reason", []) if v == 1.0]
    if throttled:
        lines.append(f"  clock event reasons: {', '.join(sorted({t or '?' for t in throttled}))}")
    errors = [(lb.get("sampler"), lb.get("reason"), v) for lb, v in a.get("dam_sampler_errors_total", [])]
    if errors:
        lines.append("  sampler errors: " + ", ".join(f"{s}/{r}={v:g}" for s, r, v in errors))
    return lines, problems


# --- the workloads (run in a child process: --workload NAME) ------------------------------
def run_workload(name: str, seconds: float) -> int:  # pragma: no cover - needs a GPU
    import itertools

    import torch

    import dam_probe

    if not torch.cuda.is_available():
        print("gpu-check: torch.cuda is not available", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
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
        loader = DataLoader(SlowIO(), batch_size=32, num_workers=2, pin_memory=True)
        for x in dam_probe.instrument(loader):
            loss = model(x.to(dev, non_blocking=True)).square().mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            torch.cuda.synchronize()
            if time.monotonic() > deadline:
                break
    elif name == "memory-bound":
        x = torch.ones(512 * 2**20, device=dev)
        for _ in batches(64):
            for _ in range(12):
                x.mul_(0.999).add_(0.001)
            torch.cuda.synchronize()
            if time.monotonic() > deadline:
                break
    elif name == "compute-bound":
        n = 8192
        a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        dam_probe.set_flops_per_step(8 * 2 * n**3)
        for _ in batches(64):
            for _ in range(8):
                c = a @ b
            torch.cuda.synchronize()
            del c
            if time.monotonic() > deadline:
                break
    elif name == "launch-overhead":
        t = torch.zeros(1, device=dev)
        for _ in batches(1):
            for _ in range(2000):
                t.add_(1.0)
            torch.cuda.synchronize()
            if time.monotonic() > deadline:
                break
    return 0


# --- orchestration ---------------------------------------------------------------------------
def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        body: bytes = r.read()
    return body.decode("utf-8")


def start_sidecar(port: int, probe_dir: str, log: Any) -> tuple[subprocess.Popen[bytes], int]:
    env = {**os.environ, "DAM_PROBE_DIR": probe_dir, "DAM_GPU_ATTRIBUTION_FALLBACK": "all"}
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
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        time.sleep(0.3)
        if proc.poll() is not None:
            raise RuntimeError(f"the sidecar exited with {proc.returncode}; see {log.name}")
        text = Path(log.name).read_text(errors="replace")
        m = re.search(r"listening on http://[^:]+:(\d+)/metrics", text)
        if m:
            return proc, int(m.group(1))
    proc.kill()
    proc.wait()
    raise RuntimeError(f"the sidecar did not start within 30 s; see {log.name}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def orchestrate(args: argparse.Namespace) -> int:  # pragma: no cover - needs a GPU
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except Exception as exc:
        print(f"gpu-check: NVML is not usable here ({exc}); this check needs an NVIDIA GPU", file=sys.stderr)
        return 2
    dam = [sys.executable, "-m", "dam_operator.cli"]
    summary: list[dict[str, Any]] = []
    failures = 0
    print(plan(args), flush=True)
    with (
        tempfile.TemporaryDirectory(prefix="dam-probe-") as probe_dir,
        open(out / "sidecar.log", "wb") as slog,
    ):
        sidecar, port = start_sidecar(args.port, probe_dir, slog)
        try:
            for w in selected(args):
                print(f"\n== {w.name} (expect {w.expected_regime}): {w.what}", flush=True)
                env = {**os.environ, "DAM_PROBE_DIR": probe_dir}
                total = args.warmup + args.seconds + 5
                with open(out / f"{w.name}.log", "wb") as wlog:
                    child = subprocess.Popen(
                        [sys.executable, __file__, "--workload", w.name, "--seconds", str(total)],
                        env=env,
                        stdout=wlog,
                        stderr=subprocess.STDOUT,
                    )
                    try:
                        time.sleep(args.warmup)
                        before = scrape(port)
                        time.sleep(args.seconds)
                        after = scrape(port)
                    finally:
                        stop(child)
                bpath, apath = out / f"{w.name}.before.prom", out / f"{w.name}.after.prom"
                bpath.write_text(before)
                apath.write_text(after)
                lines, problems = summarize(before, after)
                print("\n".join(lines))
                entry: dict[str, Any] = {
                    "workload": w.name,
                    "expected": w.expected_regime,
                    "problems": problems,
                }
                try:
                    verdict = evaluate(bpath, apath, dam)
                    ok, message = check_verdict(w, verdict)
                    entry["verdict"] = verdict
                    print("  metrics: " + json.dumps(verdict.get("metrics", {}), sort_keys=True))
                except RuntimeError as exc:
                    ok, message = False, f"ERROR {w.name}: {exc}"
                for p in problems:
                    print(f"  PROBLEM: {p}")
                ok = ok and not problems
                entry["ok"] = ok
                print(message, flush=True)
                failures += 0 if ok else 1
                summary.append(entry)
                time.sleep(2)  # let the finished probe file be folded in before the next workload
        finally:
            stop(sidecar)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"\ngpu-check: {len(summary) - failures}/{len(summary)} verdicts right; details in {out}")
    return 0 if failures == 0 else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.workload:
        return run_workload(args.workload, args.seconds)
    if args.dry_run:
        print(plan(args))
        return 0
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
