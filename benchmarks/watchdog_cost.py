"""What the probe's stall watchdog (dam_probe._watchdog) costs a training loop.

Prints, in one run: the time per batch of a DataLoader loop (trivial in-memory dataset, batch size
4, no workers) under the probe with the watchdog on and off (``DAM_PROBE_WATCHDOG=0``), the median
of ``--repeats`` interleaved repeats of ``--batches`` batches, each repeat in a fresh child process;
and the CPU time of the watchdog's own thread per second of the run (``/proc/self/task/<tid>/stat``).
PASS when the watchdog adds <= 0.5 us a batch (nothing runs per step: the figure is noise) and its
thread uses <= 0.1 % of a core.

    .venv/bin/python benchmarks/watchdog_cost.py [--batches 20000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

TARGET_US = 0.5
TARGET_CORE_SHARE = 0.001

CHILD = r"""
import json, os, sys, threading, time
import torch
from torch.utils.data import DataLoader

batches = int(sys.argv[1])
data = torch.zeros(batches * 4, 2)
loader = DataLoader(data, batch_size=4)
t0 = time.perf_counter()
for _ in loader:
    pass
elapsed = time.perf_counter() - t0
time.sleep(2.0)  # the watchdog's thread wakes twice more, with the loop over
ticks = os.sysconf("SC_CLK_TCK")
cpu = 0.0
for t in threading.enumerate():
    if t.name == "dam-probe-watchdog" and t.native_id:
        fields = open(f"/proc/self/task/{t.native_id}/stat").read().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / ticks
print(json.dumps({"us_per_batch": elapsed / batches * 1e6, "watchdog_cpu_s": cpu, "wall_s": elapsed + 2.0}))
"""


def run_child(batches: int, watchdog: bool) -> dict[str, float]:
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory(prefix="dam-watchdog-bench-") as probe_dir:
        env = dict(
            os.environ,
            DAM_PROBE_DIR=probe_dir,
            PYTHONPATH=os.pathsep.join(
                [os.path.join(repo, "sidecar", "dam_probe", "autoinstrument"), os.path.join(repo, "sidecar")]
            ),
            DAM_PROBE_WATCHDOG="1" if watchdog else "0",
            PYTHONWARNINGS="ignore",
        )
        out = subprocess.run(
            [sys.executable, "-c", CHILD, str(batches)], env=env, capture_output=True, text=True, check=True
        )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str]) -> int:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=fmt)
    parser.add_argument("--batches", type=int, default=20000, help="batches per repeat (default 20000)")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats, median (default 5)")
    args = parser.parse_args(argv)
    on: list[dict[str, float]] = []
    off: list[dict[str, float]] = []
    started = time.monotonic()
    for _ in range(args.repeats):
        off.append(run_child(args.batches, watchdog=False))
        on.append(run_child(args.batches, watchdog=True))
    per_on = statistics.median(r["us_per_batch"] for r in on)
    per_off = statistics.median(r["us_per_batch"] for r in off)
    share = statistics.median(r["watchdog_cpu_s"] / r["wall_s"] for r in on)
    added = per_on - per_off
    print(f"watchdog off: {per_off:.2f} us/batch (median of {args.repeats} x {args.batches} batches)")
    print(f"watchdog on:  {per_on:.2f} us/batch; added {added:+.2f} us/batch (target <= {TARGET_US})")
    print(f"watchdog thread: {share * 100:.4f} % of a core (target <= {TARGET_CORE_SHARE * 100:.1f} %)")
    print(f"({time.monotonic() - started:.0f} s)")
    ok = added <= TARGET_US and share <= TARGET_CORE_SHARE
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
