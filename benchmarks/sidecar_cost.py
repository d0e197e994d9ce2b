"""Cost of the sidecar: CPU % of one core, RSS, /metrics latency, with 8 simulated GPUs at 1 Hz.

    .venv/bin/python benchmarks/sidecar_cost.py [--seconds 30] [--requests 300] [--gpus 8]

Runs ``dam sidecar`` as a subprocess (the real samplers; NVML is the fake
pynvml module behind the real NVML sampler, DAM_FAKE_GPUS, 18 NVLink links
each), with a live probe file (layout version 2: a rank, collective counters,
its cgroup's memory) and this process as the training process. Measures over ``--seconds``
while scraping once a second, then times ``--requests`` back-to-back scrapes.
Targets: CPU <= 0.5 % of a core, RSS <= 60 MiB, p99 <= 5 ms. Prints PASS/FAIL.
For comparison, users of dcgm-exporter report ~15-20 % of a core and ~70 MiB.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time

import httpx
import psutil
from sidecar_http_load import start_sidecar, stop_sidecar  # a script beside this one (benchmarks/)

from dam_probe.layout import ProbeWriter, probe_path

TARGET_CPU_PERCENT = 0.5
TARGET_RSS_MIB = 60.0
TARGET_P99_MS = 5.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--gpus", type=int, default=8)
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="dam-bench-") as probe_dir:
        writer = ProbeWriter(probe_path(probe_dir, os.getpid()), os.getpid())
        stop = threading.Event()

        def publish() -> None:
            steps = 0
            while not stop.wait(0.1):
                steps += 1
                writer.publish(
                    steps,
                    steps * 10**6,
                    steps * 10**8,
                    batch_size=64,
                    device_uuids=(),
                    rank=0,
                    local_rank=0,
                    world_size=8,
                    collectives=(steps * 12, steps * 10**7, steps * 10**6, steps * 2**24),
                    memory=(2**30, 2**32, 0, 1),
                )

        pub = threading.Thread(target=publish, daemon=True)
        pub.start()
        proc, port = start_sidecar(probe_dir, args.gpus)
        try:
            url = f"http://127.0.0.1:{port}/metrics"
            ps = psutil.Process(proc.pid)
            with httpx.Client() as client:
                body = client.get(url).text
                time.sleep(2.0)  # past start-up (imports) before measuring
                c0 = ps.cpu_times()
                t0 = time.monotonic()
                while time.monotonic() - t0 < args.seconds:
                    client.get(url)
                    time.sleep(1.0)
                c1 = ps.cpu_times()
                elapsed = time.monotonic() - t0
                rss_mib = ps.memory_info().rss / 2**20
                cpu_pct = 100.0 * ((c1.user - c0.user) + (c1.system - c0.system)) / elapsed
                lat: list[float] = []
                for _ in range(args.requests):
                    s = time.perf_counter()
                    client.get(url)
                    lat.append((time.perf_counter() - s) * 1000)
                body = client.get(url).text
        finally:
            stop.set()
            pub.join()
            writer.close()
            stop_sidecar(proc, timeout_seconds=10)
            if proc.stderr is not None:
                proc.stderr.close()

    lat.sort()
    p50 = statistics.median(lat)
    p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
    series = sum(1 for ln in body.splitlines() if ln and not ln.startswith("#"))
    checks = [
        ("CPU (% of one core, 1 Hz sampling + 1 scrape/s)", cpu_pct, TARGET_CPU_PERCENT, "%"),
        ("RSS", rss_mib, TARGET_RSS_MIB, " MiB"),
        (f"/metrics p99 over {len(lat)} requests", p99, TARGET_P99_MS, " ms"),
    ]
    print(
        f"sidecar with {args.gpus} simulated GPUs, {elapsed:.0f} s, {series} series, {len(body)} bytes/scrape"
    )
    print(f"/metrics latency p50 {p50:.2f} ms  p99 {p99:.2f} ms")
    ok = True
    for label, value, target, unit in checks:
        passed = value <= target
        ok &= passed
        print(f"{'PASS' if passed else 'FAIL'}  {label}: {value:.2f}{unit} (target <= {target}{unit})")
    print("dcgm-exporter, as reported by its users: ~15-20 % of a core, ~70 MiB")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
