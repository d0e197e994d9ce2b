"""Fake dam sidecars for operator tests and the scale benchmark.

``FakeJob`` integrates a training job's counters over time at the rates of its
current ``Regime`` (switchable at any moment) and renders them in the sidecar's
exposition format (names from ``dam_contract.names``). ``FakeSidecars`` serves many
jobs from ONE aiohttp server: a pod is told apart by the loopback address the
request arrived on (pods get podIPs 127.x.y.z; all of 127/8 is loopback on Linux),
so one port serves thousands of pods. A job can also be made to fail: ``down``
(connection refused is simulated by HTTP 503), ``slow`` (answers after a delay) or
``garbage`` (not Prometheus text).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

from aiohttp import web

from dam_contract import names

Fault = Literal["none", "down", "slow", "garbage"]


@dataclass(frozen=True)
class Regime:
    steps_per_second: float
    data_wait_ratio: float
    gpu_util: float | None = None
    sm_active: float | None = None
    dram: float | None = None
    tensor: float | None = None
    main_cpu_cores: float = 0.5


STARVED = Regime(
    steps_per_second=4.0, data_wait_ratio=0.7, gpu_util=0.25, sm_active=0.2, dram=0.1, tensor=0.05
)
COMPUTE = Regime(
    steps_per_second=10.0, data_wait_ratio=0.0, gpu_util=0.99, sm_active=0.92, dram=0.30, tensor=0.60
)


@dataclass
class FakeJob:
    regime: Regime = STARVED
    clock: Callable[[], float] = time.time
    fault: Fault = "none"
    slow_seconds: float = 5.0
    steps: float = 100.0
    step_seconds: float = 50.0
    wait_seconds: float = 20.0
    cpu_seconds: float = 10.0
    goodput: bool = False
    """Also serve the probe's goodput series: productive = step time less data wait, badput
    data-wait = the wait, startup = ``startup_seconds``, the other causes 0."""
    startup_seconds: float = 5.0
    steps_since_checkpoint: float | None = None
    """With ``goodput``: served as ``dam_steps_since_checkpoint`` (None: not served, as a probe that
    times no saves)."""
    last_checkpoint_at: float | None = None
    """With ``goodput``: served as ``dam_last_checkpoint_timestamp_seconds`` (None: no save seen)."""
    scrapes: int = 0
    """Expositions served (a test waits for the next scrape with it)."""
    _last: float | None = field(default=None, repr=False)

    def switch(self, regime: Regime) -> None:
        self.advance()
        self.regime = regime

    def advance(self) -> float:
        now = self.clock()
        if self._last is not None and now > self._last:
            dt = now - self._last
            r = self.regime
            self.steps += r.steps_per_second * dt
            self.step_seconds += dt
            self.wait_seconds += r.data_wait_ratio * dt
            self.cpu_seconds += r.main_cpu_cores * dt
        self._last = now
        return now

    def exposition(self) -> str:
        now = self.advance()
        self.scrapes += 1
        r = self.regime
        lines = [
            f"# TYPE {names.STEPS_TOTAL} counter",
            f"{names.STEPS_TOTAL} {self.steps!r}",
            f"# TYPE {names.STEP_SECONDS_TOTAL} counter",
            f"{names.STEP_SECONDS_TOTAL} {self.step_seconds!r}",
            f"# TYPE {names.DATALOADER_WAIT_SECONDS_TOTAL} counter",
            f"{names.DATALOADER_WAIT_SECONDS_TOTAL} {self.wait_seconds!r}",
            f"# TYPE {names.PROCESS_CPU_SECONDS_TOTAL} counter",
            f'{names.PROCESS_CPU_SECONDS_TOTAL}{{role="main"}} {self.cpu_seconds!r}',
            f"{names.PROBE_UP} 1",
            f"{names.SNAPSHOT_TIMESTAMP_SECONDS} {now!r}",
        ]
        gauges = (
            (names.GPU_UTILIZATION_RATIO, r.gpu_util),
            (names.GPU_SM_ACTIVE_RATIO, r.sm_active),
            (names.GPU_DRAM_BANDWIDTH_UTILIZATION_RATIO, r.dram),
            (names.GPU_TENSOR_ACTIVE_RATIO, r.tensor),
        )
        for name, value in gauges:
            if value is not None:
                lines.append(f'{name}{{gpu="0"}} {value!r}')
        if r.gpu_util is not None:
            lines.append(f"{names.NVML_UP} 1")
        if self.goodput:
            productive = self.step_seconds - self.wait_seconds
            causes = dict.fromkeys(names.BADPUT_CAUSES, 0.0)
            causes |= {names.CAUSE_STARTUP: self.startup_seconds, names.CAUSE_DATA_WAIT: self.wait_seconds}
            lines += [
                f"# TYPE {names.GOODPUT_SECONDS_TOTAL} counter",
                f"{names.GOODPUT_SECONDS_TOTAL} {productive!r}",
            ]
            lines.append(f"# TYPE {names.BADPUT_SECONDS_TOTAL} counter")
            lines += [f'{names.BADPUT_SECONDS_TOTAL}{{cause="{c}"}} {v!r}' for c, v in causes.items()]
            for name, value in (
                (names.STEPS_SINCE_CHECKPOINT, self.steps_since_checkpoint),
                (names.LAST_CHECKPOINT_TIMESTAMP_SECONDS, self.last_checkpoint_at),
            ):
                if value is not None:
                    lines += [f"# TYPE {name} gauge", f"{name} {value!r}"]
        return "\n".join(lines) + "\n"


class FakeSidecars:
    """One HTTP server for many fake sidecars, keyed by the local (pod) IP of the request."""

    def __init__(self) -> None:
        self.jobs: dict[str, FakeJob] = {}
        self.requests = 0
        self._runner: web.AppRunner | None = None
        self.port = 0

    def add(self, ip: str, job: FakeJob | None = None) -> FakeJob:
        job = job or FakeJob()
        self.jobs[ip] = job
        return job

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        ip = sockname[0] if sockname else ""
        job = self.jobs.get(ip)
        if job is None or job.fault == "down":
            return web.Response(status=503, text="sidecar down\n")
        if job.fault == "slow":
            await asyncio.sleep(job.slow_seconds)
        if job.fault == "garbage":
            return web.Response(text="<html>this is not prometheus text</html>\n{{{\n")
        return web.Response(text=job.exposition(), content_type="text/plain")

    async def start(self, host: str = "0.0.0.0", port: int = 0) -> int:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        server = site._server
        assert server is not None
        sockets = getattr(server, "sockets", None) or []
        self.port = int(sockets[0].getsockname()[1])
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


def pod_ip(index: int) -> str:
    """A distinct loopback address for pod ``index`` (127.1.0.1, 127.1.0.2, ...)."""
    n = index + 1
    return f"127.{1 + n // 65536}.{(n // 256) % 256}.{n % 256}"


class ThreadedFakeSidecars:
    """``FakeSidecars`` on an event loop in a background thread, for synchronous tests.

    Jobs are plain objects: switching a regime or setting a fault from the test thread
    takes effect on the next scrape.
    """

    def __init__(self, host: str = "0.0.0.0", port: int = 0) -> None:
        import threading

        self.sidecars = FakeSidecars()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._host, self._port = host, port
        self._thread = threading.Thread(target=self._run, name="fake-sidecars", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self.sidecars.start(self._host, self._port))
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self.sidecars.stop())
        self._loop.close()

    def __enter__(self) -> FakeSidecars:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the fake sidecars did not start")
        return self.sidecars

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@contextlib.asynccontextmanager
async def serve_handler(handler: Handler, path: str = "/metrics") -> AsyncIterator[int]:
    """``handler`` answering every method at ``path`` on 127.0.0.1 (a free port, yielded)."""
    app = web.Application()
    app.router.add_route("*", path, handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield int(runner.addresses[0][1])
    finally:
        await runner.cleanup()
