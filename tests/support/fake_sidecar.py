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


BIG_JOB = Regime(
    steps_per_second=4.0, data_wait_ratio=0.02, gpu_util=0.97, sm_active=0.62, dram=0.35, tensor=0.45
)
"""A synchronous multi-rank job that computes most of its step (``RankedJob``'s default)."""


def _jitter(n: int) -> float:
    """A fixed pseudo-random figure in [0, 1) for ``n`` (Knuth's multiplicative hash)."""
    return ((n * 2654435761) % 2**32) / 2**32


@dataclass
class RankedJob(FakeJob):
    """One pod of a synchronous data-parallel job: ``ranks`` rank processes on ``gpus`` GPUs, each
    rank's probe series (steps, data wait, collectives, goodput, progress) and each GPU's gauges,
    in the shape of a real sidecar's exposition (tests/unit/sidecar/golden/full.prom): about 40
    series a rank with one GPU each, 330 for 8.

    Every rank counts every step (the job is synchronous). A rank waits ``data_wait_ratio`` of its
    step for data and ``COLLECTIVE_RATIO`` (plus a fixed jitter by global rank) in collectives;
    the ``late_rank`` (a local rank of this pod, or None) waits ``LATE_DATA_WAIT`` for data and
    so arrives last at the collectives, where it waits only ``LATE_COLLECTIVE``: the straggler,
    cause Data. Its GPU is as busy as its peers'."""

    regime: Regime = BIG_JOB
    pod_index: int = 0
    ranks: int = 8
    gpus: int = 8
    late_rank: int | None = None

    COLLECTIVE_RATIO = 0.30
    JITTER = 0.04
    LATE_DATA_WAIT = 0.30
    LATE_COLLECTIVE = 0.02

    def _rank_lines(self, now: float, local: int) -> list[str]:
        rank = self.pod_index * self.ranks + local
        late = local == self.late_rank
        s = self.step_seconds
        wait = s * (self.LATE_DATA_WAIT if late else self.regime.data_wait_ratio)
        coll = s * (self.LATE_COLLECTIVE if late else self.COLLECTIVE_RATIO + self.JITTER * _jitter(rank))
        calls = self.steps * 4
        r = f'rank="{rank}"'
        lines = [
            f"{names.STEPS_TOTAL}{{{r}}} {self.steps!r}",
            f"{names.STEP_SECONDS_TOTAL}{{{r}}} {s!r}",
            f"{names.DATALOADER_WAIT_SECONDS_TOTAL}{{{r}}} {wait!r}",
            f"{names.COLLECTIVES_TOTAL}{{{r}}} {calls!r}",
            f"{names.COLLECTIVE_SECONDS_TOTAL}{{{r}}} {coll!r}",
            f"{names.COLLECTIVE_EXPOSED_SECONDS_TOTAL}{{{r}}} {coll * 0.5!r}",
            f"{names.COLLECTIVE_BYTES_TOTAL}{{{r}}} {calls * 2**24!r}",
            f"{names.BATCH_SIZE}{{{r}}} 32.0",
            f'{names.PROCESS_RANK_INFO}{{{r},local_rank="{local}",world_size="{self.ranks * 1000}"}} 1.0',
            f"{names.LAST_BATCH_TIMESTAMP_SECONDS}{{{r}}} {now - 0.1!r}",
            f"{names.COLLECTIVE_SEQUENCE}{{{r}}} {float(int(calls))!r}",
            f"{names.RANK_UP}{{{r}}} 1.0",
            f"{names.GOODPUT_SECONDS_TOTAL}{{{r}}} {s - wait - coll * 0.5!r}",
        ]
        causes = {
            names.CAUSE_STARTUP: 5.0,
            names.CAUSE_DATA_WAIT: wait,
            names.CAUSE_COMMUNICATION: coll * 0.5,
        }
        for cause in names.BADPUT_CAUSES:
            lines.append(f'{names.BADPUT_SECONDS_TOTAL}{{cause="{cause}",{r}}} {causes.get(cause, 0.0)!r}')
        return lines

    def _gpu_lines(self, gpu: int) -> list[str]:
        r = self.regime
        g = f'gpu="{gpu}",uuid="GPU-{self.pod_index}-{gpu}"'
        gauges = (
            (names.GPU_UTILIZATION_RATIO, r.gpu_util),
            (names.GPU_SM_ACTIVE_RATIO, r.sm_active),
            (names.GPU_DRAM_BANDWIDTH_UTILIZATION_RATIO, r.dram),
            (names.GPU_TENSOR_ACTIVE_RATIO, r.tensor),
            (names.GPU_MEMORY_BUSY_RATIO, 0.4),
            (names.GPU_MEMORY_USED_BYTES, 64e9),
            (names.GPU_MEMORY_TOTAL_BYTES, 141e9),
            (names.GPU_POWER_WATTS, 600.0),
            (names.GPU_SM_CLOCK_HERTZ, 1.98e9),
            (names.GPU_TEMPERATURE_CELSIUS, 70.0),
        )
        lines = [f'{names.GPU_INFO}{{{g},name="NVIDIA H200"}} 1.0']
        lines += [f"{name}{{{g}}} {value!r}" for name, value in gauges if value is not None]
        nvlink = self.step_seconds * 1e11
        lines += [
            f'{names.GPU_NVLINK_BYTES_TOTAL}{{{g},direction="tx"}} {nvlink!r}',
            f'{names.GPU_NVLINK_BYTES_TOTAL}{{{g},direction="rx"}} {nvlink!r}',
        ]
        return lines

    def exposition(self) -> str:
        now = self.advance()
        self.scrapes += 1
        lines: list[str] = []
        for local in range(self.ranks):
            lines += self._rank_lines(now, local)
        for gpu in range(self.gpus):
            lines += self._gpu_lines(gpu)
        lines += [
            f"{names.PROBE_UP} 1",
            f"{names.PROBE_PROCESSES} {float(self.ranks)!r}",
            f"{names.NVML_UP} 1",
            f'{names.PROCESS_CPU_SECONDS_TOTAL}{{role="main"}} {self.cpu_seconds * self.ranks!r}',
            f'{names.PROCESS_CPU_SECONDS_TOTAL}{{role="worker"}} {self.cpu_seconds * 2 * self.ranks!r}',
            f'{names.PROCESSES}{{role="main"}} {float(self.ranks)!r}',
            f'{names.PROCESSES}{{role="worker"}} {float(4 * self.ranks)!r}',
            f'{names.PROCESS_RESIDENT_MEMORY_BYTES}{{role="main"}} {8e9 * self.ranks!r}',
            f'{names.PROCESS_RESIDENT_MEMORY_BYTES}{{role="worker"}} {2e9 * self.ranks!r}',
            f"{names.CONTAINER_CPU_THROTTLED_SECONDS_TOTAL} 0.0",
            f"{names.CONTAINER_CPU_LIMIT_CORES} {8.0 * self.ranks!r}",
            f"{names.CONTAINER_MEMORY_USAGE_BYTES} {1.2e10 * self.ranks!r}",
            f"{names.CONTAINER_MEMORY_LIMIT_BYTES} {3.2e10 * self.ranks!r}",
            f"{names.NODE_CPU_UTILIZATION_RATIO} 0.35",
            f"{names.SNAPSHOT_TIMESTAMP_SECONDS} {now!r}",
        ]
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
