"""Operator at scale: N profiles x M pods against the API stand-in, fake sidecars on loopback.

    .venv/bin/python benchmarks/operator_scale.py [--profiles 500] [--pods 2] [--window 10]

What it does:

1. starts the API stand-in in its own process and ONE fake-sidecar HTTP server in this
   process; every pod gets its own loopback podIP (127.x.y.z), which tells the server
   which job's counters to serve (all jobs start input-starved);
2. creates N DAMProfiles and N x M pods (already instrumented, Running) through the API,
   then starts the real ``dam operator`` (a child process, standalone, no webhook);
3. waits until every profile says Data, measures the operator's CPU and RSS over a few
   windows of steady state;
4. at time T switches every fake sidecar to compute-bound and records, per profile, when
   its status first says Machine (polling the API): the lag p50/p99.

Prints the figures and PASS/FAIL against the targets: RSS <= 300 MiB and
p99 lag <= window + interval + 2 s (with ``hysteresisWindows: 1``; with more, each extra
confirmation window adds up to one window).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.fake_sidecar import COMPUTE, FakeJob, ThreadedFakeSidecars, pod_ip  # noqa: E402
from tests.support.operator_harness import OperatorProcess, wait_for  # noqa: E402
from tests.support.standin import StandIn  # noqa: E402

RSS_TARGET_MIB = 300.0
GROUP_PATH = "/apis/dam.mlsys.dev/v1alpha1/namespaces/default/damprofiles"


def _profile(i: int, port: int, window: float, interval: float, hysteresis: int) -> dict[str, Any]:
    return {
        "apiVersion": "dam.mlsys.dev/v1alpha1",
        "kind": "DAMProfile",
        "metadata": {"name": f"p{i:04d}"},
        "spec": {
            "selector": {"matchLabels": {"job": f"j{i:04d}"}},
            "sampling": {"intervalSeconds": interval},
            "evaluation": {"windowSeconds": window, "hysteresisWindows": hysteresis},
            "sidecar": {"port": port},
        },
    }


def _pod(i: int, k: int) -> dict[str, Any]:
    sidecar = {"name": "dam-sidecar", "image": "dam:bench", "restartPolicy": "Always"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"p{i:04d}-{k}", "labels": {"job": f"j{i:04d}"}},
        "spec": {"initContainers": [sidecar], "containers": [{"name": "train", "image": "python:3.11"}]},
    }


def _axes(client: httpx.Client) -> dict[str, str | None]:
    items = client.get(GROUP_PATH, timeout=60).json()["items"]
    return {
        o["metadata"]["name"]: ((o.get("status") or {}).get("bottleneck") or {}).get("axis") for o in items
    }


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profiles", type=int, default=500)
    p.add_argument("--pods", type=int, default=2, help="pods per profile")
    p.add_argument("--window", type=float, default=10.0, help="spec.evaluation.windowSeconds")
    p.add_argument("--interval", type=float, default=1.0, help="spec.sampling.intervalSeconds")
    p.add_argument("--hysteresis", type=int, default=1, help="spec.evaluation.hysteresisWindows")
    p.add_argument("--steady-windows", type=float, default=3.0, help="windows of steady state to measure")
    p.add_argument("--json", action="store_true", help="print the figures as JSON too")
    args = p.parse_args(argv)
    n, m = args.profiles, args.pods

    with (
        tempfile.TemporaryDirectory(prefix="dam-scale-") as tmp,
        StandIn.running(subprocess=True, history_size=4 * n * m + 1000) as api,
        ThreadedFakeSidecars("0.0.0.0") as sidecars,
    ):
        assert api.kubectl("apply", "-f", str(ROOT / "crds")).returncode == 0
        t0 = time.monotonic()
        for i in range(n):
            api.create("damprofiles", _profile(i, sidecars.port, args.window, args.interval, args.hysteresis))
            for k in range(m):
                ip = pod_ip(i * m + k)
                sidecars.add(ip, FakeJob())
                api.create("pods", _pod(i, k))
                api.patch(
                    "pods",
                    "default",
                    f"p{i:04d}-{k}",
                    {"status": {"phase": "Running", "podIP": ip}},
                    subresource="status",
                )
        print(f"created {n} profiles and {n * m} pods in {time.monotonic() - t0:.1f} s", flush=True)

        op = OperatorProcess(api, Path(tmp), webhook=False, env={"DAM_EVALUATION_CONCURRENCY": "64"})
        started = time.monotonic()
        op.start()
        proc = psutil.Process(op.pid)
        client = httpx.Client(base_url=api.url)
        try:
            wait_for(
                lambda: all(a == "Data" for a in _axes(client).values()) and len(_axes(client)) == n,
                30 + 6 * args.window + n * 0.1,
                "every profile to say Data",
                interval=1.0,
            )
            first_verdicts = time.monotonic() - started
            print(
                f"all {n} profiles diagnosed Data {first_verdicts:.1f} s after the operator started",
                flush=True,
            )

            proc.cpu_percent(None)
            steady = args.steady_windows * args.window
            time.sleep(steady)
            cpu = proc.cpu_percent(None)
            rss = proc.memory_info().rss / 2**20

            switch_at = time.monotonic()
            for job in sidecars.jobs.values():
                job.switch(COMPUTE)
            lags: dict[str, float] = {}
            deadline = switch_at + 10 * args.window + 60
            while len(lags) < n and time.monotonic() < deadline:
                now = time.monotonic()
                for name, a in _axes(client).items():
                    if a == "Machine" and name not in lags:
                        lags[name] = now - switch_at
                time.sleep(0.25)
            peak_rss = max(rss, proc.memory_info().rss / 2**20)
            metrics = op.metrics()
        finally:
            client.close()
            op.stop()
        standin_stats = api.stats()

    values = list(lags.values())
    target = args.window + args.interval + 2.0
    p50, p99 = _percentile(values, 0.50), _percentile(values, 0.99)
    missing = n - len(values)
    rss_ok = peak_rss <= RSS_TARGET_MIB
    lag_ok = missing == 0 and p99 <= target
    errors = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("dam_operator_evaluation_errors_total{")
    )
    print()
    print(
        f"profiles x pods              {n} x {m} (window {args.window:g} s, interval {args.interval:g} s, "
        f"hysteresis {args.hysteresis})"
    )
    print(f"first verdicts after start   {first_verdicts:.1f} s")
    print(f"operator CPU (steady)        {cpu:.1f} % of one core")
    print(
        f"operator RSS (peak)          {peak_rss:.1f} MiB   target <= {RSS_TARGET_MIB:.0f}   "
        f"{'PASS' if rss_ok else 'FAIL'}"
    )
    print(f"lag metrics->status p50      {p50:.2f} s")
    print(
        f"lag metrics->status p99      {p99:.2f} s   target <= {target:.1f}   {'PASS' if lag_ok else 'FAIL'}"
        + (f" ({missing} profiles never switched)" if missing else "")
    )
    print(f"evaluation errors            {errors:.0f}")
    print(f"fake sidecar scrapes         {sidecars.requests}")
    print(f"stand-in                     {json.dumps(standin_stats)[:300]}")
    if args.json:
        print(
            json.dumps(
                {
                    "profiles": n,
                    "pods": n * m,
                    "cpu_percent": cpu,
                    "rss_mib": peak_rss,
                    "lag_p50_s": p50,
                    "lag_p99_s": p99,
                    "missing": missing,
                    "first_verdicts_s": first_verdicts,
                }
            )
        )
    print("PASS" if rss_ok and lag_ok else "FAIL")
    return 0 if rss_ok and lag_ok else 1


if __name__ == "__main__":
    sys.exit(main())
