"""One DAMProfile of one very large job: what a window of 1,000 Pods x 8 ranks costs the operator.

    .venv/bin/python benchmarks/big_job.py [--pods 1000] [--ranks 8] [--gpus 8] [--windows 3]
        [--window-seconds 30] [--source scrape|prometheus|both] [--prometheus-interval 10]

What it does:

1. starts ONE fake-sidecar HTTP server in a child process (``tests.support.fake_sidecar``): every
   pod gets its own loopback podIP (127.x.y.z) on one port, which tells the server which pod's
   counters to serve; each pod is a ``RankedJob``: ``--ranks`` rank processes on ``--gpus`` GPUs
   of a synchronous job (263 series a pod at 8 x 8, 14 KB of text), one rank of one pod planted
   late (its data wait 30 % against its peers' 2 %: the straggler, cause Data);
2. builds the operator's evaluation as ``dam operator`` wires it (``runtime.main.start_components``):
   the ``Registry`` with one profile and its pods, the ``Evaluator`` on the real ``SourceFactory``
   (sidecar scrapes on ``scrape_connector``, Prometheus queries on ``query_connector``), in this
   process; only the Kubernetes API is an in-memory one that applies the status merge patches
   (the 5,000-profile benchmark, operator_scale.py, measures the real API server's side);
3. ``--source scrape``: the operator scrapes the pods itself (``spec.sidecar``), as by default;
   ``--source prometheus``: a real Prometheus (the ``prometheus`` binary, ``make system-deps``)
   scrapes every fake pod as its own target (``pod`` and ``namespace`` target labels, as a
   PodMonitor gives), and the profile reads it (``spec.source.prometheus``);
4. runs ``--windows`` windows of the profile (``Evaluator.evaluate_window``, the scheduler's call)
   ``--window-seconds`` apart, after the first write (``initialize``: the baseline scrape), and
   prints, per window: its wall time, the operator's CPU seconds (this process: nothing else runs
   in it meanwhile), its peak RSS, where the time went (fetching and parsing, the per-rank
   window, ``diagnose`` and in it the straggler search and the rank table, the progress judge),
   the status' size as JSON, and for Prometheus the queries' time and Prometheus' own CPU.

Checks (PASS/FAIL): every window ends within its window's time; the status stays under 64 KiB
(the API server refuses an object over 1.5 MiB); the straggler named and the first rank of
``status.metrics.ranks`` are the planted one; every pod reports.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import functools
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import httpx
from prometheus_client import CollectorRegistry

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools" / "node"))  # dam_cluster (tests.support.procs imports it)

from tests.support.fake_sidecar import RankedJob, ThreadedFakeSidecars, pod_ip  # noqa: E402
from tests.support.merge_patch import merge  # noqa: E402
from tests.support.procs import free_port, spawn, stop_process  # noqa: E402

from dam_operator.cluster.adapters import sources  # noqa: E402
from dam_operator.cluster.adapters.sources import SourceFactory, query_connector, scrape_connector  # noqa: E402
from dam_operator.cluster.runtime.opmetrics import OperatorMetrics  # noqa: E402
from dam_operator.cluster.runtime.scheduler import Evaluator  # noqa: E402
from dam_operator.cluster.settings import OperatorSettings  # noqa: E402
from dam_operator.cluster.steps import window_step  # noqa: E402
from dam_operator.cluster.steps.registry import PodInfo, Registry  # noqa: E402
from dam_operator.cluster.steps.spec import parse_spec  # noqa: E402
from dam_operator.cluster.steps.urlpolicy import UrlPolicy  # noqa: E402
from dam_operator.diagnosis import engine  # noqa: E402

NAMESPACE = "big"
STATUS_TARGET_BYTES = 64 * 1024
CLK_TCK = os.sysconf("SC_CLK_TCK")


def pod_name(i: int) -> str:
    return f"train-{i:04d}"


def late_pod(pods: int) -> int:
    return 517 if pods > 517 else pods // 2


LATE_LOCAL_RANK = 3


# ---------------------------------------------------------------- the fake sidecars (child process)


def serve_sidecars(count: int, ranks: int, gpus: int) -> int:
    """Child process: ``count`` fake pods on one port; prints the port, then answers ``requests``."""
    late = late_pod(count)
    with ThreadedFakeSidecars("0.0.0.0") as sidecars:
        for i in range(count):
            job = RankedJob(
                pod_index=i, ranks=ranks, gpus=gpus, late_rank=LATE_LOCAL_RANK if i == late else None
            )
            sidecars.add(pod_ip(i), job)
        print(f"port {sidecars.port}", flush=True)
        for line in sys.stdin:
            print(sidecars.requests if line.strip() == "requests" else "?", flush=True)
    return 0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


def rss_mib(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# ---------------------------------------------------------------- timing the window's parts


class Timers:
    """Seconds spent in named functions of the operator, summed while a window runs."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._undo: list[tuple[Any, str, Any]] = []

    def wrap(self, module: Any, attr: str, label: str) -> None:
        original = getattr(module, attr)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - start
                self.calls[label] += 1

        setattr(module, attr, timed)
        self._undo.append((module, attr, original))

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()


def install_timers() -> Timers:
    t = Timers()
    t.wrap(sources, "parse_snapshot", "parse (scrape)")
    t.wrap(sources.PrometheusSource, "_snapshots", "split the answer (prometheus)")
    t.wrap(window_step, "job_window", "per-pod and per-rank window")
    t.wrap(window_step, "diagnose", "diagnose (verdict)")
    t.wrap(engine, "find_straggler", "  straggler search")
    t.wrap(engine, "rank_figures", "  rank table")
    t.wrap(window_step, "progress_step", "progress judge")
    t.wrap(window_step, "window_actions", "actions")
    return t


# ---------------------------------------------------------------- the in-memory API


class MemoryAPI:
    """The status subresource and Events in memory, as the API server merges them."""

    def __init__(self) -> None:
        self.status: dict[str, Any] = {}
        self.writes = 0
        self.patch_bytes = 0
        self.events: list[dict[str, Any]] = []

    async def patch_profile_status(
        self, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> Mapping[str, Any]:
        self.writes += 1
        self.patch_bytes = len(json.dumps(patch, separators=(",", ":")))
        merge(self.status, dict(patch.get("status") or {}))
        return {"status": json.loads(json.dumps(self.status))}

    async def create_event(self, namespace: str, body: Mapping[str, Any]) -> None:
        self.events.append(dict(body))


# ---------------------------------------------------------------- Prometheus


def prometheus_config(port: int, pods: int, interval: float) -> str:
    lines = [
        "global:",
        f"  scrape_interval: {interval:g}s",
        f"  scrape_timeout: {min(interval, 10):g}s",
        "scrape_configs:",
        "  - job_name: dam",
        "    static_configs:",
    ]
    for i in range(pods):
        lines += [
            f'      - targets: ["{pod_ip(i)}:{port}"]',
            f'        labels: {{namespace: "{NAMESPACE}", pod: "{pod_name(i)}"}}',
        ]
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def prometheus(workdir: Path, sidecar_port: int, pods: int, interval: float) -> Iterator[tuple[str, int]]:
    binary = "prometheus"
    port = free_port()
    config = workdir / "prometheus.yml"
    config.write_text(prometheus_config(sidecar_port, pods, interval))
    log = open(workdir / "prometheus.log", "wb")  # noqa: SIM115 - closed below
    proc = spawn(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=2h",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield f"http://127.0.0.1:{port}", proc.pid
    finally:
        stop_process(proc)
        log.close()


def prom_value(base: str, query: str) -> float:
    r = httpx.post(f"{base}/api/v1/query", data={"query": query}, timeout=30)
    result = r.json()["data"]["result"]
    return float(result[0]["value"][1]) if result else float("nan")


def wait_for_prometheus(base: str, pods: int, interval: float) -> float:
    """Until every target is up and its series are in; returns the seconds it took."""
    start = time.monotonic()
    deadline = start + 600
    while time.monotonic() < deadline:
        time.sleep(2.0)
        with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
            up = prom_value(base, "count(up == 1)")
            fresh = prom_value(base, "count(dam_snapshot_timestamp_seconds)")
            if up == pods and fresh == pods:
                time.sleep(interval)  # one more round: every target scraped twice
                return time.monotonic() - start
    raise RuntimeError(f"Prometheus did not get all {pods} targets up in 600 s")


# ---------------------------------------------------------------- one run


def build(
    args: argparse.Namespace, sidecar_port: int, prometheus_url: str | None
) -> tuple[Registry, MemoryAPI, Evaluator, list[aiohttp.ClientSession]]:
    settings = OperatorSettings()
    registry = Registry()
    api = MemoryAPI()
    metrics = OperatorMetrics(CollectorRegistry())
    session = aiohttp.ClientSession(connector=scrape_connector(settings.scrape_concurrency))
    policy = UrlPolicy(configured_url=prometheus_url)
    query_session = aiohttp.ClientSession(connector=query_connector(settings.scrape_concurrency, policy))
    factory = SourceFactory(session, settings, query_session, policy=policy)
    evaluator = Evaluator(
        registry,
        api,
        factory,
        metrics,
        scrape_concurrency=settings.scrape_concurrency,
        max_baseline_windows=settings.max_baseline_windows,
        webhook_enabled=False,
    )
    raw: dict[str, Any] = {
        "selector": {"matchLabels": {"job": "big"}},
        "evaluation": {"windowSeconds": args.window_seconds, "hysteresisWindows": 1},
        "sidecar": {"port": sidecar_port},
    }
    if prometheus_url is not None:
        raw["source"] = {"prometheus": {"url": prometheus_url}}
    registry.upsert_profile(NAMESPACE, "big", uid="uid-big", generation=1, spec=parse_spec(raw, policy))
    started = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    for i in range(args.pods):
        registry.upsert_pod(
            PodInfo(
                NAMESPACE,
                pod_name(i),
                {"job": "big"},
                uid=f"uid-{i}",
                pod_ip=pod_ip(i),
                phase="Running",
                instrumented=True,
                started_at=started,
            )
        )
    return registry, api, evaluator, [session, query_session]


def _status_size(status: Mapping[str, Any]) -> int:
    return len(json.dumps(status, separators=(",", ":")).encode())


async def run_windows(
    args: argparse.Namespace,
    source: str,
    sidecar_port: int,
    timers: Timers,
    *,
    prometheus_url: str | None = None,
    prometheus_pid: int | None = None,
) -> list[dict[str, Any]]:
    registry, api, evaluator, sessions = build(args, sidecar_port, prometheus_url)
    entry = registry.profile(NAMESPACE, "big")
    assert entry is not None
    queries: list[float] = []
    out: list[dict[str, Any]] = []
    try:
        start = time.monotonic()
        await evaluator.initialize(entry)
        print(f"[{source}] first write (baseline) {time.monotonic() - start:.1f} s", flush=True)
        # Time each request to the source (the operator's own observe hook, scrape_duration).
        observe = evaluator._metrics.scrape_duration  # the benchmark listens in

        def listen(seconds: float) -> None:
            queries.append(seconds)
            observe(seconds)

        evaluator._metrics.scrape_duration = listen  # type: ignore[method-assign]
        for k in range(1, args.windows + 1):
            due = start + k * args.window_seconds
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            timers.reset()
            queries.clear()
            entry = registry.profile(NAMESPACE, "big")
            assert entry is not None
            prom_cpu = cpu_seconds(prometheus_pid) if prometheus_pid else 0.0
            cpu0, wall0 = time.process_time(), time.perf_counter()
            await evaluator.evaluate_window(entry)
            wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
            status = api.status
            bottleneck = status.get("bottleneck") or {}
            straggler = bottleneck.get("straggler") or {}
            metrics = status.get("metrics") or {}
            worst = (metrics.get("ranks") or [{}])[0]
            row = {
                "source": source,
                "window": k,
                "wall_s": wall,
                "cpu_s": cpu,
                "rss_mib": rss_mib(),
                "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "parts": dict(timers.seconds),
                "requests": len(queries),
                "request_s_max": max(queries, default=0.0),
                "request_s_sum": sum(queries),
                "prometheus_cpu_s": (cpu_seconds(prometheus_pid) - prom_cpu) if prometheus_pid else None,
                "status_bytes": _status_size(status),
                "patch_bytes": api.patch_bytes,
                "reporting": (status.get("pods") or {}).get("reporting"),
                "load_average": os.getloadavg()[0],
                "verdict": f"{bottleneck.get('axis')} ({bottleneck.get('regime')})",
                "straggler": (straggler.get("pod"), straggler.get("rank"), straggler.get("cause")),
                "worst_rank": (worst.get("pod"), worst.get("rank")),
                "rank_count": metrics.get("rankCount"),
                "ranks_listed": len(metrics.get("ranks") or []),
            }
            out.append(row)
            print_row(row, args)
        if args.keep_status:
            Path(args.keep_status).with_suffix(f".{source}.json").write_text(json.dumps(api.status, indent=1))
    finally:
        for s in sessions:
            await s.close()
    return out


def print_row(row: dict[str, Any], args: argparse.Namespace) -> None:
    parts = ", ".join(f"{k.strip()} {v:.2f}" for k, v in row["parts"].items())
    prom = f", Prometheus CPU {row['prometheus_cpu_s']:.2f} s" if row["prometheus_cpu_s"] is not None else ""
    print(
        f"[{row['source']}] window {row['window']}: wall {row['wall_s']:.2f} s (of {args.window_seconds:g}), "
        f"CPU {row['cpu_s']:.2f} s, RSS {row['rss_mib']:.0f} MiB (peak {row['peak_rss_mib']:.0f}), "
        f"status {row['status_bytes']} B (patch {row['patch_bytes']} B), "
        f"{row['requests']} requests (longest {row['request_s_max']:.2f} s){prom}\n"
        f"    parts (wall s, summed over calls): {parts}\n"
        f"    verdict {row['verdict']}, straggler {row['straggler']}, worst rank listed {row['worst_rank']}, "
        f"{row['ranks_listed']} of {row['rank_count']} ranks listed, {row['reporting']} pods reporting; "
        f"load average {row['load_average']:.1f}",
        flush=True,
    )


def check(rows: list[dict[str, Any]], args: argparse.Namespace) -> bool:
    late = (pod_name(late_pod(args.pods)), late_pod(args.pods) * args.ranks + LATE_LOCAL_RANK)
    ok = True
    for row in rows:
        problems = []
        if row["wall_s"] > args.window_seconds:
            problems.append(f"wall {row['wall_s']:.1f} s > window {args.window_seconds:g} s")
        if row["status_bytes"] > STATUS_TARGET_BYTES:
            problems.append(f"status {row['status_bytes']} B > {STATUS_TARGET_BYTES} B")
        if row["straggler"][:2] != late:
            problems.append(f"straggler {row['straggler']} is not the planted {late}")
        if tuple(row["worst_rank"]) != late:
            problems.append(f"first rank listed {row['worst_rank']} is not the planted {late}")
        if row["reporting"] != args.pods:
            problems.append(f"{row['reporting']} of {args.pods} pods reporting")
        if problems:
            ok = False
            print(f"FAIL [{row['source']}] window {row['window']}: " + "; ".join(problems))
    return ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pods", type=int, default=1000)
    p.add_argument("--ranks", type=int, default=8, help="ranks per pod")
    p.add_argument("--gpus", type=int, default=8, help="GPUs per pod")
    p.add_argument("--windows", type=int, default=3)
    p.add_argument("--window-seconds", type=float, default=30.0)
    p.add_argument("--source", choices=("scrape", "prometheus", "both"), default="both")
    p.add_argument("--prometheus-interval", type=float, default=10.0, help="Prometheus' scrape interval, s")
    p.add_argument("--keep-status", help="write the last status of each source to PATH.<source>.json")
    p.add_argument("--json", action="store_true", help="print the rows as JSON too")
    p.add_argument("--serve-sidecars", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve_sidecars:
        return serve_sidecars(args.serve_sidecars, args.ranks, args.gpus)

    workdir = Path(tempfile.mkdtemp(prefix="dam-bigjob-"))
    child = spawn(
        [
            sys.executable,
            __file__,
            "--serve-sidecars",
            str(args.pods),
            "--ranks",
            str(args.ranks),
            "--gpus",
            str(args.gpus),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    first = child.stdout.readline().strip()
    if not first.startswith("port "):
        raise SystemExit(f"the fake sidecars did not start: {first!r}")
    port = int(first.split()[1])
    print(
        f"{args.pods} pods x {args.ranks} ranks ({args.pods * args.ranks} ranks), {args.gpus} GPUs a pod, "
        f"window {args.window_seconds:g} s; fake sidecars on port {port} (pid {child.pid}); "
        f"planted straggler: {pod_name(late_pod(args.pods))} "
        f"rank {late_pod(args.pods) * args.ranks + LATE_LOCAL_RANK}; load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    timers = install_timers()
    rows: list[dict[str, Any]] = []
    try:
        if args.source in ("scrape", "both"):
            sidecar_cpu = cpu_seconds(child.pid)
            rows += asyncio.run(run_windows(args, "scrape", port, timers))
            print(f"[scrape] fake sidecars' CPU over the run: {cpu_seconds(child.pid) - sidecar_cpu:.1f} s")
        if args.source in ("prometheus", "both"):
            with prometheus(workdir, port, args.pods, args.prometheus_interval) as (url, pid):
                took = wait_for_prometheus(url, args.pods, args.prometheus_interval)
                series = prom_value(url, 'count({__name__=~"dam_.+"})')
                scrape_s = prom_value(url, 'avg(scrape_duration_seconds{job="dam"})')
                print(
                    f"[prometheus] {args.pods} targets up after {took:.0f} s; {series:.0f} dam_ series; "
                    f"a target's scrape {scrape_s * 1000:.0f} ms on average; "
                    f"Prometheus RSS {rss_mib(pid):.0f} MiB",
                    flush=True,
                )
                cpu0, t0 = cpu_seconds(pid), time.monotonic()
                run = run_windows(args, "prometheus", port, timers, prometheus_url=url, prometheus_pid=pid)
                rows += asyncio.run(run)
                print(
                    f"[prometheus] Prometheus CPU over the windows: "
                    f"{100 * (cpu_seconds(pid) - cpu0) / (time.monotonic() - t0):.0f} % of one core "
                    f"(scraping {args.pods} targets every {args.prometheus_interval:g} s, and the queries); "
                    f"RSS {rss_mib(pid):.0f} MiB",
                    flush=True,
                )
    finally:
        stop_process(child)
    ok = check(rows, args)
    if args.json:
        print(json.dumps(rows, default=str))
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
