"""A real ``dam sidecar`` under concurrent scrapes and a slow-request flood keeps answering.

The sidecar runs as a process (``python -m dam_operator.cli sidecar``, two
simulated GPUs, a live probe file) on loopback. The clients are asyncio streams
in this process, so they add no threads and open connections as fast as the
loop allows:

- 100 clients at once, ten scrapes each, a new TCP connection per scrape: every
  scrape answers 200 with the whole body within ``SCRAPE_BOUND_SECONDS``;
- 600 connections that send half a request head and then nothing: the sidecar's
  thread count stays bounded while they are held, normal scrapes are answered
  meanwhile, and the sidecar closes every one of them once
  ``DAM_HTTP_REQUEST_TIMEOUT_SECONDS`` has passed.

Before the server was rewritten (``ThreadingHTTPServer``: listen backlog 5, no
read timeout, a thread per connection) the first took up to 8.8 s per scrape
and the second held 604 threads, closing none.
"""

from __future__ import annotations

import asyncio
import os
import re
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from dam_probe.layout import ProbeWriter, probe_path
from tests.support.procs import spawn, stop_process

CLIENTS = 100
SCRAPES_PER_CLIENT = 10
HALF_SENT = 600
REQUEST_TIMEOUT_SECONDS = 2.0
SCRAPE_BOUND_SECONDS = (
    3.0  # a cached body on loopback takes milliseconds; SYN retries after overflow take 1-7 s
)
THREAD_BOUND = 32  # main, sampler, NVML worker, the HTTP loop, at most DAM_HTTP_WORKER_THREADS renderers
CLOSE_MARGIN_SECONDS = 3.0

REQUEST = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
HALF = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: slo"


@dataclass
class Sidecar:
    proc: subprocess.Popen[str]
    port: int

    def threads(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as fh:
            return next(int(line.split()[1]) for line in fh if line.startswith("Threads:"))


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4 * HALF_SENT
    if soft != resource.RLIM_INFINITY and soft < wanted:  # the sidecar inherits it too
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))
    probe_dir = tmp_path_factory.mktemp("concurrency") / "probe"
    probe_dir.mkdir()
    writer = ProbeWriter(probe_path(str(probe_dir), os.getpid()), os.getpid())
    writer.publish(42, 10**9, 4 * 10**9, batch_size=32, device_uuids=())
    env = {
        **os.environ,
        "DAM_FAKE_GPUS": "2",
        "DAM_GPU_ATTRIBUTION_FALLBACK": "all",
        "DAM_HTTP_REQUEST_TIMEOUT_SECONDS": str(REQUEST_TIMEOUT_SECONDS),
    }
    proc = spawn(
        [
            *(sys.executable, "-m", "dam_operator.cli", "sidecar", "--host", "127.0.0.1", "--port", "0"),
            *("--probe-dir", str(probe_dir), "--interval", "0.5"),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        port, log = 0, []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not port:
            line = proc.stderr.readline()
            if not line:
                break
            log.append(line)
            m = re.search(r"listening on http://[^:]+:(\d+)/metrics", line)
            port = int(m.group(1)) if m else 0
        assert port, "the sidecar did not start:\n" + "".join(log)
        yield Sidecar(proc, port)
    finally:
        stop_process(proc)
        writer.close()


async def scrape(port: int, bound: float = SCRAPE_BOUND_SECONDS) -> tuple[float, str | None]:
    """One scrape on a new connection: (seconds, None), or (seconds, what went wrong)."""
    start = time.perf_counter()
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(bound):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(REQUEST)
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            m = re.search(rb"(?i)\r\ncontent-length:\s*(\d+)", head)
            if not head.startswith(b"HTTP/1.1 200 ") or m is None:
                return time.perf_counter() - start, head.split(b"\r\n", 1)[0].decode()
            body = await reader.readexactly(int(m.group(1)))
            if b"dam_steps_total 42.0" not in body:
                return time.perf_counter() - start, "no probe counters in the body"
        return time.perf_counter() - start, None
    except TimeoutError:
        return time.perf_counter() - start, f"no answer within {bound:g} s"
    except (OSError, asyncio.IncompleteReadError) as exc:
        return time.perf_counter() - start, repr(exc)
    finally:
        if writer is not None:
            writer.close()


def test_a_hundred_concurrent_scrapers_all_get_answers_without_errors(sidecar: Sidecar) -> None:
    async def run() -> list[tuple[float, str | None]]:
        async def client() -> list[tuple[float, str | None]]:
            return [await scrape(sidecar.port) for _ in range(SCRAPES_PER_CLIENT)]

        return [r for rs in await asyncio.gather(*(client() for _ in range(CLIENTS))) for r in rs]

    results = asyncio.run(run())
    errors = [e for _, e in results if e is not None]
    slowest = max(s for s, _ in results)
    assert len(results) == CLIENTS * SCRAPES_PER_CLIENT
    assert not errors, f"{len(errors)} of {len(results)} scrapes failed, e.g. {sorted(set(errors))[:3]}"
    assert slowest < SCRAPE_BOUND_SECONDS
    assert sidecar.threads() <= THREAD_BOUND


def test_half_sent_requests_are_closed_after_the_timeout_while_scrapes_are_still_served(
    sidecar: Sidecar,
) -> None:
    async def run() -> tuple[int, list[tuple[float, str | None]], list[float], int]:
        conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        began = time.perf_counter()  # each timeout runs from its connection's accept, after this
        try:
            for _ in range(HALF_SENT):
                reader, writer = await asyncio.open_connection("127.0.0.1", sidecar.port)
                writer.write(HALF)
                conns.append((reader, writer))
            await asyncio.sleep(0.5)
            threads = sidecar.threads()
            during = [await scrape(sidecar.port, bound=1.0) for _ in range(10)]
            threads = max(threads, sidecar.threads())

            async def closed_after(reader: asyncio.StreamReader) -> float:
                try:
                    while await reader.read(65536):  # a 408 answer, then the end of the stream
                        pass
                except OSError:
                    pass
                return time.perf_counter() - began

            wait = began + REQUEST_TIMEOUT_SECONDS + CLOSE_MARGIN_SECONDS - time.perf_counter()
            tasks = [asyncio.ensure_future(closed_after(r)) for r, _ in conns]
            done, pending = await asyncio.wait(tasks, timeout=wait)
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            return threads, during, sorted(t.result() for t in done), len(pending)
        finally:
            for _, writer in conns:
                writer.close()

    threads, during, closed, still_open = asyncio.run(run())
    assert threads <= THREAD_BOUND, f"{threads} threads while {HALF_SENT} half-sent requests were held"
    assert [e for _, e in during] == [None] * len(during), during
    assert still_open == 0, f"{still_open} of {HALF_SENT} half-sent requests still open after the timeout"
    assert closed[0] >= REQUEST_TIMEOUT_SECONDS  # closed by the timeout, not at once
    assert sidecar.threads() <= THREAD_BOUND
