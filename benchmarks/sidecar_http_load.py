"""The sidecar's HTTP server under load: concurrent scrapes, then a slow-request (slowloris) flood.

    .venv/bin/python benchmarks/sidecar_http_load.py [--clients 100] [--scrapes 20] [--half-sent 600]
                                                      [--gpus 8] [--wait 30]

Runs ``dam sidecar`` as a subprocess (8 simulated GPUs, a live probe file) and:

1. ``--clients`` clients at once, each scraping ``/metrics`` ``--scrapes`` times, one new TCP connection per
   scrape (what many Prometheus servers, ``curl`` health checks and load balancers do): errors (refused,
   reset, timed out after 10 s, wrong status or short body), latency p50 / p99 / max.
2. ``--half-sent`` connections that send half a request head and then nothing, all held open: the sidecar's
   thread count while they are held, ten normal scrapes meanwhile (answered? how fast?), and how many of the
   half-sent connections the sidecar closed within ``--wait`` seconds (and when).

Everything runs on one asyncio loop here, so the client adds no threads. Prints the figures and PASS/FAIL
against: zero errors, p99 under 1 s, every half-sent connection closed within ``--wait``, at most 64
threads, every normal scrape answered during the flood.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

from dam_probe.layout import ProbeWriter, probe_path

TEXT_REQUEST = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
# What Prometheus 2.x sends (it prefers OpenMetrics): rendered per request by the client library.
OPENMETRICS_REQUEST = (
    b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nAccept: "
    b"application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    b"text/plain;version=0.0.4;q=0.5,*/*;q=0.1\r\n\r\n"
)
REQUEST = TEXT_REQUEST
HALF = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: slow"  # no end of the head, ever
SCRAPE_TIMEOUT_SECONDS = 10.0
TARGET_P99_SECONDS = 1.0
TARGET_THREADS = 64


def threads_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return -1


async def scrape(port: int) -> tuple[float, str | None]:
    """One scrape on a new connection: (seconds, None) or (seconds, what went wrong)."""
    start = time.perf_counter()
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(SCRAPE_TIMEOUT_SECONDS):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(REQUEST)
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            status = head.split(b" ", 2)[1]
            m = re.search(rb"(?i)content-length:\s*(\d+)", head)
            if status != b"200" or m is None:
                return time.perf_counter() - start, f"status {status.decode()}"
            await reader.readexactly(int(m.group(1)))
        return time.perf_counter() - start, None
    except TimeoutError:
        return time.perf_counter() - start, "timeout"
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
        return time.perf_counter() - start, type(exc).__name__
    finally:
        if writer is not None:
            writer.close()


def percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


async def concurrent_scrapes(port: int, clients: int, scrapes: int) -> dict[str, object]:
    async def client() -> list[tuple[float, str | None]]:
        return [await scrape(port) for _ in range(scrapes)]

    t0 = time.perf_counter()
    results = [r for rs in await asyncio.gather(*(client() for _ in range(clients))) for r in rs]
    elapsed = time.perf_counter() - t0
    lat = sorted(s for s, _ in results)
    errors: dict[str, int] = {}
    for _, e in results:
        if e is not None:
            errors[e] = errors.get(e, 0) + 1
    return {
        "requests": len(results),
        "errors": sum(errors.values()),
        "error_kinds": errors,
        "p50": percentile(lat, 0.5),
        "p99": percentile(lat, 0.99),
        "max": lat[-1],
        "rate": len(results) / elapsed,
    }


async def half_sent_flood(port: int, pid: int, count: int, wait: float) -> dict[str, object]:
    conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    refused = 0
    for _ in range(count):
        try:
            r, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5.0)
            w.write(HALF)
            conns.append((r, w))
        except (OSError, TimeoutError):
            refused += 1
    sent_at = time.perf_counter()
    await asyncio.sleep(1.0)
    threads_held = threads_of(pid)
    during: list[tuple[float, str | None]] = []
    for _ in range(10):
        during.append(await scrape(port))
    threads_peak = max(threads_held, threads_of(pid))

    closed_after: list[float] = []

    async def until_closed(reader: asyncio.StreamReader) -> None:
        try:
            await reader.read(65536)  # b"" (or an error response, then b"") once the server gives up
            while await reader.read(65536):
                pass
        except OSError:
            pass
        closed_after.append(time.perf_counter() - sent_at)

    waiters = [asyncio.ensure_future(until_closed(r)) for r, _ in conns]
    await asyncio.wait(waiters, timeout=max(0.0, wait - (time.perf_counter() - sent_at)))
    for t in waiters:
        t.cancel()
    for _, w in conns:
        w.close()
    closed_after.sort()
    ok_during = [s for s, e in during if e is None]
    return {
        "opened": len(conns),
        "refused": refused,
        "threads_held": threads_held,
        "threads_peak": threads_peak,
        "scrapes_during": len(during),
        "scrapes_during_ok": len(ok_during),
        "scrape_during_max": max((s for s, _ in during), default=0.0),
        "closed": len(closed_after),
        "closed_p50": percentile(closed_after, 0.5) if closed_after else None,
        "closed_max": closed_after[-1] if closed_after else None,
        "threads_after": threads_of(pid),
    }


def start_sidecar(probe_dir: str, gpus: int) -> tuple[subprocess.Popen[str], int]:
    env = {
        **os.environ,
        "DAM_FAKE_GPUS": str(gpus),
        "DAM_GPU_ATTRIBUTION_FALLBACK": "all",
        "DAM_PROBE_DIR": probe_dir,
        "DAM_INTERVAL_SECONDS": "1",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "dam_sidecar.app", "--host", "127.0.0.1", "--port", "0"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    for _ in range(50):
        line = proc.stderr.readline()
        m = re.search(r"listening on http://[^:]+:(\d+)/metrics", line)
        if m:
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, int(m.group(1))
    proc.kill()
    proc.wait()
    raise SystemExit("FAIL: the sidecar did not start")


def stop_sidecar(proc: subprocess.Popen[str], timeout_seconds: float) -> None:
    """SIGTERM, then SIGKILL if it has not ended within ``timeout_seconds``."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--scrapes", type=int, default=20, help="scrapes per client")
    ap.add_argument("--half-sent", type=int, default=600)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--wait", type=float, default=30.0, help="seconds to wait for half-sent ones to close")
    ap.add_argument(
        "--openmetrics",
        action="store_true",
        help="ask for OpenMetrics as Prometheus does (rendered per request)",
    )
    args = ap.parse_args(argv)
    global REQUEST
    REQUEST = OPENMETRICS_REQUEST if args.openmetrics else TEXT_REQUEST

    with tempfile.TemporaryDirectory(prefix="dam-bench-") as probe_dir:
        writer = ProbeWriter(probe_path(probe_dir, os.getpid()), os.getpid())
        writer.publish(
            1000, 10**9, 10**10, batch_size=64, device_uuids=(), rank=0, local_rank=0, world_size=1
        )
        proc, port = start_sidecar(probe_dir, args.gpus)
        try:
            time.sleep(2.0)  # past start-up
            threads_idle = threads_of(proc.pid)
            load = asyncio.run(concurrent_scrapes(port, args.clients, args.scrapes))
            threads_load = threads_of(proc.pid)
            flood = asyncio.run(half_sent_flood(port, proc.pid, args.half_sent, args.wait))
        finally:
            writer.close()
            stop_sidecar(proc, timeout_seconds=15)

    err_pct = 100.0 * int(load["errors"]) / int(load["requests"])  # type: ignore[call-overload]
    fmt = "OpenMetrics" if args.openmetrics else "Prometheus text"
    print(f"{fmt}; sidecar threads idle: {threads_idle}, after the scrape load: {threads_load}")
    print(
        f"{args.clients} clients x {args.scrapes} scrapes (new connection each): "
        f"{load['requests']} requests, "
        f"{load['errors']} errors ({err_pct:.2f} %) {load['error_kinds'] or ''}, "
        f"p50 {load['p50']:.3f} s, p99 {load['p99']:.3f} s, max {load['max']:.3f} s, "
        f"{load['rate']:.0f} req/s"
    )
    closed_when = (
        f"p50 {flood['closed_p50']:.1f} s, last {flood['closed_max']:.1f} s"
        if flood["closed"]
        else "none closed"
    )
    print(
        f"{flood['opened']} half-sent requests held ({flood['refused']} refused): sidecar threads "
        f"{flood['threads_held']} (peak {flood['threads_peak']}); normal scrapes meanwhile "
        f"{flood['scrapes_during_ok']}/{flood['scrapes_during']} answered, slowest "
        f"{flood['scrape_during_max']:.3f} s; closed by the sidecar within {args.wait:g} s: "
        f"{flood['closed']}/{flood['opened']} ({closed_when}); threads afterwards {flood['threads_after']}"
    )
    checks = [
        ("no errors under concurrent scrapes", load["errors"] == 0),
        (f"p99 under {TARGET_P99_SECONDS:g} s", float(load["p99"]) < TARGET_P99_SECONDS),  # type: ignore[arg-type]
        ("every half-sent request closed", flood["closed"] == flood["opened"] and flood["refused"] == 0),
        (f"at most {TARGET_THREADS} threads", int(flood["threads_peak"]) <= TARGET_THREADS),  # type: ignore[call-overload]
        ("scrapes answered during the flood", flood["scrapes_during_ok"] == flood["scrapes_during"]),
    ]
    ok = True
    for name, passed in checks:
        print(f"{'PASS' if passed else 'FAIL'}  {name}")
        ok = ok and passed
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
