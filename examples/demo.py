"""`make demo`: real PyTorch training under `dam run`, three shapes of one job.

1. starved  — slow __getitem__, 0 DataLoader workers  → expect Data / input-bound
2. fixed    — the same dataset with workers + prefetch → no longer input-bound
3. compute  — heavy model, in-memory data            → not input-bound (the CPU computes)

Each runs as `dam run --json -- python examples/train.py --scenario NAME`; the
verdicts are printed side by side at the end.

First `python examples/train.py --calibrate` sizes the scenarios for this machine (a
fast machine's model is wider, a slow one's narrower): what decides the verdicts is the
ratio of a step's compute to a batch's loading, and calibration keeps those ratios, so
the same verdicts come out on a 2-core VM and on a many-core workstation.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SCENARIOS = {
    "starved": "slow __getitem__, 0 workers",
    "fixed": "same data, 16 workers + prefetch",
    "compute": "heavy model, in-memory data",
}


def dam_command() -> list[str]:
    exe = os.path.join(os.path.dirname(sys.executable), "dam")
    return [exe] if os.path.exists(exe) else [sys.executable, "-m", "dam_operator.cli"]


def calibrate() -> dict[str, float]:
    """The sizes ``train.py --calibrate`` measures for this machine."""
    t0 = time.monotonic()
    cmd = [sys.executable, os.path.join(HERE, "train.py"), "--calibrate"]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"demo: calibration failed with exit code {proc.returncode}")
    sizes: dict[str, float] = json.loads(proc.stdout)
    print(
        f"calibrated in {time.monotonic() - t0:.0f}s on {sizes['threads']:.0f} torch threads: "
        f"model width {sizes['hidden']:.0f} ({sizes['stepSeconds'] * 1000:.1f} ms a step), "
        f"compute model width {sizes['computeHidden']:.0f} ({sizes['computeStepSeconds'] * 1000:.1f} ms), "
        f"{sizes['sampleDelayMs']:.2f} ms a sample (a batch without the delay: "
        f"{sizes['loadSeconds'] * 1000:.2f} ms to load, "
        f"{sizes['receiveSeconds'] * 1000:.2f} ms from a worker)",
        flush=True,
    )
    return sizes


def sizing_args(sizes: dict[str, float]) -> list[str]:
    return [
        "--hidden",
        str(int(sizes["hidden"])),
        "--compute-hidden",
        str(int(sizes["computeHidden"])),
        "--sample-delay-ms",
        str(sizes["sampleDelayMs"]),
        "--workers",
        str(int(sizes["workers"])),
    ]


def run_scenario(name: str, seconds: float, sizing: list[str]) -> dict[str, object]:
    cmd = [
        *dam_command(),
        "run",
        "--json",
        "--interval",
        "0.5",
        "--window",
        "4",
        "--",
        sys.executable,
        os.path.join(HERE, "train.py"),
        "--scenario",
        name,
        "--seconds",
        str(seconds),
        *sizing,
    ]
    print(f"\n=== {name}: {SCENARIOS[name]}", flush=True)
    print(f"$ dam run --json -- python examples/train.py --scenario {name} {' '.join(sizing)}", flush=True)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"demo: scenario {name} failed with exit code {proc.returncode}")
    verdict: dict[str, object] = json.loads(proc.stdout)
    b = verdict["bottleneck"]
    assert isinstance(b, dict)
    print(f"    {time.monotonic() - t0:.0f}s  ->  {b['axis']} / {b['regime']}  lever: {b['lever']}")
    for line in b.get("evidence", []):
        print(f"      - {line}")
    return verdict


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="training time per scenario")
    args = parser.parse_args()
    started = time.monotonic()
    sizing = sizing_args(calibrate())
    results = {name: run_scenario(name, args.seconds, sizing) for name in SCENARIOS}
    print("\n" + "=" * 96)
    print(f"{'scenario':<10} {'axis':<10} {'regime':<14} {'conf':>5} {'wait':>6} {'steps/s':>8}  lever")
    print("-" * 96)
    for name, verdict in results.items():
        b = verdict["bottleneck"]
        m = verdict.get("metrics", {})
        assert isinstance(b, dict) and isinstance(m, dict)
        wait = m.get("dataWaitRatio")
        sps = m.get("stepsPerSecond")
        wait_s = f"{wait:.0%}" if isinstance(wait, float) else "n/a"
        sps_s = f"{sps:.1f}" if isinstance(sps, float) else "n/a"
        print(
            f"{name:<10} {b['axis']:<10} {b['regime']:<14} {b['confidence']:>5.2f} {wait_s:>6} {sps_s:>8}  "
            f"{b['lever']}"
        )
    print("=" * 96)
    print(f"{time.monotonic() - started:.0f}s in all")
    starved = results["starved"]["bottleneck"]
    fixed = results["fixed"]["bottleneck"]
    assert isinstance(starved, dict) and isinstance(fixed, dict)
    ok = starved["regime"] == "input-bound" and fixed["regime"] != "input-bound"
    print(
        "The starved loader is input-bound; adding workers and prefetch moves the bottleneck."
        if ok
        else "Unexpected verdicts: see the evidence above."
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
