"""Sharded operator replicas at scale against a REAL Kubernetes API server: N profiles x M pods
evaluated by 1 replica, then by R sharded replicas (``DAM_SHARDING``), on the same objects.

    .venv/bin/python benchmarks/operator_shards.py [--profiles 10000] [--pods-per-profile 2]
        [--replicas 3] [--window-seconds 30] [--duration 60]

Built on benchmarks/operator_scale.py's pieces (the control plane, one fake-sidecar child process
serving every pod on its own loopback podIP, the objects written through the API): for each run
it starts the replicas (as admin, no webhook), waits until they hold every bucket between them
and have evaluated two windows, then measures ``--duration`` seconds of steady state: each
replica's CPU (share of a core) and RSS (now and peak), the profiles each evaluates (its
``dam_profile_*`` series) and the sidecar scrapes per pod per window (1.0: every pod scraped once
a window, by one replica; 2.0 would be two replicas evaluating alike).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import operator_scale as scale  # noqa: E402
from tests.support.kubecluster import ControlPlane, find_kube_binaries  # noqa: E402
from tests.support.procs import free_port, stop_process, wait_for  # noqa: E402

SERIES = re.compile(r'^dam_profile_\w+\{[^}]*profile="([^"]+)"', re.MULTILINE)
BUCKETS = re.compile(r"^dam_operator_shard_buckets (\S+)$", re.MULTILINE)


class Replica:
    def __init__(
        self, cp: ControlPlane, workdir: Path, identity: str, sharded: bool, args: argparse.Namespace
    ):
        self.identity = identity
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "DAM_"))}
        env |= {
            "KUBECONFIG": str(cp.kubeconfig),
            "DAM_OPERATOR_NAMESPACE": scale.OPERATOR_NAMESPACE,
            "PYTHONUNBUFFERED": "1",
            "HOSTNAME": identity,
        }
        if sharded:
            env |= {
                "DAM_SHARDING": "true",
                "DAM_SHARD_LEASE_DURATION_SECONDS": str(args.lease_seconds),
                "DAM_SHARD_RENEW_SECONDS": str(args.lease_seconds / 5),
            }
        cmd = [sys.executable, "-m", "dam_operator.cli", "operator", "--all-namespaces", "--standalone"]
        cmd += ["--no-webhook", "--metrics-port", str(self.port), "--liveness", ""]
        self.log = workdir / f"{identity}.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(cmd, cwd=scale.ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)

    def metrics(self) -> str:
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.identity} exited:\n{self.log.read_text()[-3000:]}")
        return httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=30).text

    def buckets(self) -> float:
        found = BUCKETS.search(self.metrics())
        return float(found.group(1)) if found else 0.0

    def profiles(self) -> int:
        return len(set(SERIES.findall(self.metrics())))

    def stop(self) -> None:
        stop_process(self.proc)


def measure(
    cp: ControlPlane, workdir: Path, sidecars: scale.SidecarProcess, replicas: int, args: argparse.Namespace
) -> dict[str, Any]:
    sharded = replicas > 1
    started = time.monotonic()
    ops = [Replica(cp, workdir, f"op-{replicas}-{k}", sharded, args) for k in range(replicas)]
    try:
        wait_for(lambda: sum(op.buckets() for op in ops) == 4096, 600, "every bucket held", interval=2.0)
        covered_s = time.monotonic() - started
        # Every profile evaluated (its series exist once its first window is done), then one
        # more window: the start-up listing and the first writes are behind.
        wait_for(
            lambda: sum(op.profiles() for op in ops) >= args.profiles, 1200, "every profile evaluated", 5.0
        )
        ready_s = time.monotonic() - started
        time.sleep(args.window_seconds)
        cpu0 = {op.identity: scale.cpu_seconds(op.proc.pid) for op in ops}
        scrapes0, t0 = int(sidecars.command("requests")), time.monotonic()
        time.sleep(args.duration)
        elapsed = time.monotonic() - t0
        scrapes = int(sidecars.command("requests")) - scrapes0
        per: list[dict[str, Any]] = []
        for op in ops:
            rss, peak = scale.rss_mib(op.proc.pid)
            cpu = (scale.cpu_seconds(op.proc.pid) - cpu0[op.identity]) / elapsed
            per.append(
                {"replica": op.identity, "cpu": cpu, "rss": rss, "peak": peak, "profiles": op.profiles()}
            )
        pods = args.profiles * args.pods_per_profile
        return {
            "replicas": replicas,
            "covered_s": covered_s,
            "ready_s": ready_s,
            "per": per,
            "scrapes_per_pod_window": scrapes / pods / (elapsed / args.window_seconds),
        }
    finally:
        for op in ops:
            op.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profiles", type=int, default=10_000)
    p.add_argument("--pods-per-profile", type=int, default=2)
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--window-seconds", type=float, default=30.0)
    p.add_argument("--duration", type=float, default=60.0, help="seconds of steady state measured per run")
    p.add_argument("--lease-seconds", type=float, default=15.0, help="DAM_SHARD_LEASE_DURATION_SECONDS")
    p.add_argument("--create-concurrency", type=int, default=32)
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = p.parse_args(argv)
    # What operator_scale's Run.create reads.
    args.interval_seconds, args.hysteresis = 1.0, 1
    workdir = Path(tempfile.mkdtemp(prefix="dam-shards-"))
    print(f"work directory {workdir}", flush=True)
    sidecars = scale.SidecarProcess(args.profiles * args.pods_per_profile, workdir / "sidecars.log")
    results = []
    try:
        with ControlPlane(find_kube_binaries(), workdir / "kube") as cp:
            run = scale.Run(args, cp, workdir)
            run.prepare()

            async def create() -> None:
                async with run.client(args.create_concurrency) as api:
                    await run.create(api, sidecars.port)

            asyncio.run(create())
            for replicas in (1, args.replicas):
                results.append(measure(cp, workdir, sidecars, replicas, args))
                print(results[-1], flush=True)
    finally:
        sidecars.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    n, m = args.profiles, args.pods_per_profile
    print(f"\n{n} profiles x {m} pods, window {args.window_seconds:g} s, steady state {args.duration:g} s")
    print("| replicas | replica | profiles evaluated | CPU (cores) | RSS now / peak (MiB) |")
    print("|---|---|---|---|---|")
    for r in results:
        for x in r["per"]:
            row = f"| {r['replicas']} | {x['replica']} | {x['profiles']} | {x['cpu']:.2f} |"
            print(f"{row} {x['rss']:.0f} / {x['peak']:.0f} |")
    for r in results:
        print(
            f"{r['replicas']} replica(s): every bucket held {r['covered_s']:.0f} s after start, every "
            f"profile evaluated after {r['ready_s']:.0f} s; "
            f"{r['scrapes_per_pod_window']:.2f} scrapes per pod per window"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
