"""Metric sources against real local HTTP servers: a sidecar-like /metrics, a
Prometheus-like HTTP API, and (when installed) the real Prometheus."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from dam_contract import names
from dam_operator.cluster.adapters import sources as src
from dam_operator.cluster.adapters.sources import PodTarget, PrometheusSource, ScrapeSource, fetch_each
from dam_operator.cluster.steps.source_error import SourceError
from tests.support.fake_sidecar import FakeJob, Handler, serve_handler
from tests.support.procs import free_port, spawn


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


def _pod(port: int) -> PodTarget:
    return PodTarget("ns", "pod-a", "127.0.0.1", port)


async def _scrape(handler: Handler, **kw: Any) -> Any:
    async with serve_handler(handler) as port, aiohttp.ClientSession() as session:
        source = ScrapeSource(session, **kw)
        try:
            return await source.fetch(_pod(port))
        except SourceError as exc:
            return exc


def test_scrape_returns_the_sidecar_snapshot_with_its_own_timestamp() -> None:
    job = FakeJob(clock=lambda: 1234.5)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=job.exposition())

    snap = run(_scrape(metrics))
    assert snap.samples(names.STEPS_TOTAL)[0].value == pytest.approx(100.0)
    assert snap.timestamp_seconds == 1234.5


def test_scrape_of_a_slow_sidecar_times_out_with_a_clear_reason() -> None:
    async def slow(_: web.Request) -> web.Response:
        await asyncio.sleep(2)
        return web.Response(text="dam_steps_total 1\n")

    err = run(_scrape(slow, timeout_seconds=0.2))
    assert isinstance(err, SourceError)
    assert err.reason == src.REASON_TIMEOUT and "0.2 s" in err.message


def test_scrape_of_garbage_names_the_line() -> None:
    async def garbage(_: web.Request) -> web.Response:
        return web.Response(text="dam_steps_total 1\n<html>oops</html>\n")

    err = run(_scrape(garbage))
    assert isinstance(err, SourceError)
    assert err.reason == src.REASON_GARBAGE and ":2:" in err.message


def test_scrape_rejects_oversized_and_error_answers() -> None:
    async def huge(_: web.Request) -> web.Response:
        return web.Response(text="# " + "x" * 5000 + "\n")

    async def broken(_: web.Request) -> web.Response:
        return web.Response(status=500, text="boom")

    big = run(_scrape(huge, max_bytes=1024))
    assert isinstance(big, SourceError) and big.reason == src.REASON_TOO_LARGE
    err = run(_scrape(broken))
    assert isinstance(err, SourceError) and err.reason == src.REASON_HTTP and "500" in err.message


def test_scrape_of_a_closed_port_is_unreachable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def scenario() -> SourceError:
        async with aiohttp.ClientSession() as session:
            try:
                await ScrapeSource(session).fetch(_pod(port))
            except SourceError as exc:
                return exc
        raise AssertionError("expected a SourceError")

    err = run(scenario())
    assert err.reason == src.REASON_UNREACHABLE


def test_fetch_each_turns_failures_into_values_and_bounds_concurrency() -> None:
    in_flight = {"now": 0, "max": 0}

    async def metrics(request: web.Request) -> web.Response:
        in_flight["now"] += 1
        in_flight["max"] = max(in_flight["max"], in_flight["now"])
        await asyncio.sleep(0.05)
        in_flight["now"] -= 1
        if request.query.get("x") == "bad":
            return web.Response(status=503)
        return web.Response(text="dam_steps_total 5\n")

    async def scenario() -> tuple[dict[str, Any], list[float]]:
        durations: list[float] = []
        async with serve_handler(metrics) as port, aiohttp.ClientSession() as session:
            source = ScrapeSource(session)
            pods = [PodTarget("ns", f"p{i}", "127.0.0.1", port) for i in range(8)]
            got = await fetch_each(source, pods, asyncio.Semaphore(3), durations.append)
            return got, durations

    got, durations = run(scenario())
    assert set(got) == {f"p{i}" for i in range(8)}
    assert all(not isinstance(v, SourceError) for v in got.values())
    assert in_flight["max"] <= 3
    assert len(durations) == 8


# ---------------------------------------------------------------- Prometheus HTTP API


def _vector(*series: tuple[dict[str, str], float, float]) -> dict[str, Any]:
    return {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [{"metric": m, "value": [ts, repr(v)]} for m, ts, v in series],
        },
    }


def test_prometheus_source_queries_the_pod_and_strips_target_labels() -> None:
    seen: list[str] = []

    async def api(request: web.Request) -> web.Response:
        assert request.method == "POST"  # a profile's pod list can be long: a form, not a URL
        seen.append(str((await request.post())["query"]))
        target = {"namespace": "ns", "pod": "pod-a", "instance": "10.0.0.1:9450", "job": "dam"}
        return web.json_response(
            _vector(
                ({"__name__": names.STEPS_TOTAL, **target}, 1000.0, 42.0),
                ({"__name__": names.GPU_UTILIZATION_RATIO, "gpu": "0", **target}, 1001.0, 0.5),
                ({"__name__": names.STEPS_TOTAL, **target, "job": "dup"}, 1000.0, 43.0),
            )
        )

    async def scenario() -> Any:
        async with serve_handler(api, "/api/v1/query") as port, aiohttp.ClientSession() as session:
            source = PrometheusSource(session, f"http://127.0.0.1:{port}/")
            return await source.fetch(_pod(9450))

    snap = run(scenario())
    assert seen == ['{__name__=~"dam_.+",namespace="ns",pod="pod-a"}']
    assert [s.labels for s in snap.samples(names.STEPS_TOTAL)] == [()]  # duplicate from a 2nd job dropped
    assert snap.samples(names.STEPS_TOTAL)[0].value == 42.0
    assert snap.samples(names.GPU_UTILIZATION_RATIO)[0].labels == (("gpu", "0"),)
    assert snap.timestamp_seconds == 1001.0


@pytest.mark.parametrize(
    ("status", "body", "reason"),
    [
        (400, {"status": "error", "error": "parse error"}, src.REASON_HTTP),
        (200, {"status": "success", "data": {"resultType": "matrix", "result": []}}, src.REASON_GARBAGE),
        (200, _vector(), src.REASON_NO_DATA),
        (
            200,
            {"status": "success", "data": {"resultType": "vector", "result": [{"value": 1}]}},
            src.REASON_GARBAGE,
        ),
        (502, None, src.REASON_GARBAGE),
    ],
)
def test_prometheus_failures_become_source_errors(status: int, body: Any, reason: str) -> None:
    async def api(_: web.Request) -> web.Response:
        if body is None:
            return web.Response(status=status, text="<html>bad gateway</html>")
        return web.Response(status=status, text=json.dumps(body), content_type="application/json")

    async def scenario() -> SourceError:
        async with serve_handler(api, "/api/v1/query") as port, aiohttp.ClientSession() as session:
            try:
                await PrometheusSource(session, f"http://127.0.0.1:{port}").fetch(_pod(1))
            except SourceError as exc:
                return exc
        raise AssertionError("expected a SourceError")

    assert run(scenario()).reason == reason


def test_prometheus_source_reads_all_of_a_profiles_pods_with_one_query() -> None:
    seen: list[str] = []

    async def api(request: web.Request) -> web.Response:
        seen.append(str((await request.post())["query"]))
        series = [
            ({"__name__": names.STEPS_TOTAL, "namespace": "ns", "pod": pod, "rank": rank}, 1000.0, steps)
            for pod, rank, steps in (("job-0", "0", 10.0), ("job-1", "1", 11.0), ("other", "0", 9.0))
        ]
        return web.json_response(_vector(*series))

    async def scenario() -> Any:
        async with serve_handler(api, "/api/v1/query") as port, aiohttp.ClientSession() as session:
            source = PrometheusSource(session, f"http://127.0.0.1:{port}")
            pods = [PodTarget("ns", name, "", 0) for name in ("job-0", "job-1", "job-2")]
            return await source.fetch_all(pods, asyncio.Semaphore(1))

    got = run(scenario())
    assert seen == ['{__name__=~"dam_.+",namespace="ns",pod=~"job\\\\-0|job\\\\-1|job\\\\-2"}']
    assert got["job-0"].samples(names.STEPS_TOTAL)[0].labels == (("rank", "0"),)
    assert got["job-1"].samples(names.STEPS_TOTAL)[0].value == 11.0
    assert isinstance(got["job-2"], SourceError) and got["job-2"].reason == src.REASON_NO_DATA
    assert set(got) == {"job-0", "job-1", "job-2"}  # a pod the query did not ask for is ignored


def test_prometheus_source_times_one_query_per_namespace_and_turns_its_failure_into_values() -> None:
    async def api(request: web.Request) -> web.Response:
        if 'ns="broken"' in str((await request.post())["query"]):
            return web.json_response({"status": "error", "error": "boom"}, status=400)
        return web.json_response(_vector(({"__name__": names.STEPS_TOTAL, "pod": "a"}, 1000.0, 1.0)))

    async def scenario() -> tuple[dict[str, Any], list[float]]:
        durations: list[float] = []
        async with serve_handler(api, "/api/v1/query") as port, aiohttp.ClientSession() as session:
            source = PrometheusSource(session, f"http://127.0.0.1:{port}", namespace_label="ns")
            pods = [
                PodTarget("fine", "a", "", 0),
                PodTarget("broken", "b", "", 0),
                PodTarget("broken", "c", "", 0),
            ]
            return await source.fetch_all(pods, asyncio.Semaphore(1), durations.append), durations

    got, durations = run(scenario())
    assert got["a"].samples(names.STEPS_TOTAL)[0].value == 1.0
    assert got["b"] is got["c"] and got["b"].reason == src.REASON_HTTP  # one failed query: one error
    assert len(durations) == 2 and all(d >= 0 for d in durations)  # one per namespace, failed or not


def test_prometheus_query_escapes_label_values() -> None:
    source = PrometheusSource.__new__(PrometheusSource)
    source._ns_label, source._pod_label = "namespace", "pod"
    query = source.query_for(PodTarget('n"s', "a\\b", "1.2.3.4", 1))
    assert 'namespace="n\\"s"' in query and 'pod="a\\\\b"' in query


# ---------------------------------------------------------------- the real Prometheus


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs Debian's prometheus package")
def test_prometheus_source_reads_what_a_real_prometheus_scraped() -> None:
    job = FakeJob()

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=job.exposition())

    async def scenario(workdir: Path) -> Any:
        async with serve_handler(metrics) as sidecar_port:
            prom_port = free_port()
            config = workdir / "prometheus.yml"
            config.write_text(
                "global: {scrape_interval: 1s}\n"
                "scrape_configs:\n"
                "  - job_name: dam\n"
                f"    static_configs: [{{targets: ['127.0.0.1:{sidecar_port}'], "
                "labels: {namespace: ns, pod: pod-a}}]\n"
            )
            proc = spawn(
                [
                    "prometheus",
                    f"--config.file={config}",
                    f"--storage.tsdb.path={workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                async with aiohttp.ClientSession() as session:
                    source = PrometheusSource(session, f"http://127.0.0.1:{prom_port}")
                    deadline = time.monotonic() + 30
                    while True:
                        try:
                            return await source.fetch(_pod(0))
                        except SourceError:
                            if time.monotonic() > deadline:
                                raise
                            await asyncio.sleep(0.5)
            finally:
                proc.terminate()
                proc.wait(timeout=20)

    with tempfile.TemporaryDirectory() as tmp:
        snap = run(scenario(Path(tmp)))
    assert snap.samples(names.STEPS_TOTAL)[0].value >= 100.0
    assert snap.samples(names.STEPS_TOTAL)[0].labels == ()  # namespace/pod/instance/job stripped
    assert snap.timestamp_seconds > 0


def test_sidecar_scrapes_keep_no_connection_and_prometheus_queries_reuse_one() -> None:
    """A pod is scraped once a window: a kept-alive connection would never be reused, only held
    (10,000 pods held 6,363 sockets). Prometheus is asked many times a window: keep it alive."""
    peers: dict[str, list[int]] = {"/metrics": [], "/api/v1/query": []}
    job = FakeJob(clock=lambda: 1.0)

    async def handler(request: web.Request) -> web.Response:
        peername = request.transport.get_extra_info("peername") if request.transport else None
        peers[request.path].append(int(peername[1]))
        if request.path == "/metrics":
            return web.Response(text=job.exposition())
        target = {"namespace": "ns", "pod": "pod-a"}
        return web.json_response(_vector(({"__name__": names.STEPS_TOTAL, **target}, 1.0, 1.0)))

    async def scenario() -> None:
        app = web.Application()
        app.router.add_get("/metrics", handler)
        app.router.add_post("/api/v1/query", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = int(runner.addresses[0][1])
        scrape = aiohttp.ClientSession(connector=src.scrape_connector(4))
        query = aiohttp.ClientSession(connector=src.query_connector(4))
        try:
            sidecar = ScrapeSource(scrape)
            prometheus = PrometheusSource(query, f"http://127.0.0.1:{port}/")
            for _ in range(3):
                await sidecar.fetch(_pod(port))
                await prometheus.fetch(_pod(9450))
        finally:
            await scrape.close()
            await query.close()
            await runner.cleanup()

    run(scenario())
    assert len(peers["/metrics"]) == len(set(peers["/metrics"])) == 3  # a new connection per scrape
    assert len(peers["/api/v1/query"]) == 3
    assert len(set(peers["/api/v1/query"])) == 1  # one connection, kept alive
