"""Every body the operator reads has a cap: sidecar scrapes and Prometheus answers are streamed,
given up at the cap without reading the rest, counted, and named in the Reporting condition.

Against real local HTTP servers on 127.0.0.1 that stream what they send (a huge answer is
generated on the fly, never held)."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import tracemalloc
import zlib
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from dam_contract import names
from dam_contract.snapshot import parse_snapshot
from dam_operator.cluster.adapters import sources as src
from dam_operator.cluster.adapters.sources import PodTarget, PrometheusSource, ScrapeSource, SourceFactory
from dam_operator.cluster.runtime.main import url_policy
from dam_operator.cluster.runtime.opmetrics import OperatorMetrics
from dam_operator.cluster.settings import OperatorSettings
from dam_operator.cluster.steps import metric_names as n
from dam_operator.cluster.steps import status as st
from dam_operator.cluster.steps.source_error import SourceError
from dam_operator.cluster.steps.spec import parse_spec
from tests.support.bombs import bomb
from tests.support.fake_sidecar import FakeJob, serve_handler

MiB = 1024 * 1024


def _pod(port: int, name: str = "pod-a") -> PodTarget:
    return PodTarget("ns", name, "127.0.0.1", port)


def _series(pod: str, i: int) -> bytes:
    metric = {"__name__": names.STEPS_TOTAL, "namespace": "ns", "pod": pod, "instance": f"10.0.{i}.1:9450"}
    return json.dumps({"metric": metric, "value": [1000.0, str(i)]}).encode()


class HugeAnswer:
    """A Prometheus that answers ``/api/v1/query`` with ``total_bytes`` of valid JSON, generated
    chunk by chunk (chunked encoding: no Content-Length), counting what it managed to send."""

    def __init__(self, total_bytes: int) -> None:
        self.total_bytes = total_bytes
        self.sent = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        head = b'{"status":"success","data":{"resultType":"vector","result":['
        chunk = b",".join(_series("pod-x", i) for i in range(400)) + b","
        try:
            await resp.write(head)
            self.sent += len(head)
            while self.sent < self.total_bytes:
                await resp.write(chunk)
                self.sent += len(chunk)
            await resp.write(_series("pod-a", 0) + b"]}}")
            await resp.write_eof()
        except (ConnectionError, RuntimeError):
            pass  # the operator hung up: what a capped reader does
        return resp


def test_a_huge_prometheus_answer_is_given_up_at_the_cap_without_holding_or_reading_it() -> None:
    huge = HugeAnswer(64 * MiB)
    hits: list[str] = []

    async def scenario() -> tuple[SourceError | None, int]:
        async with serve_handler(huge.handle, "/api/v1/query") as port, aiohttp.ClientSession() as session:
            source = PrometheusSource(
                session, f"http://127.0.0.1:{port}", max_answer_bytes=1 * MiB, on_too_large=hits.append
            )
            tracemalloc.start()
            try:
                await source.fetch(_pod(1))
            except SourceError as exc:
                return exc, tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
        return None, 0

    err, peak = asyncio.run(scenario())
    assert err is not None and err.reason == src.REASON_TOO_LARGE, err
    assert "1 MiB" in err.message and "DAM_PROMETHEUS_MAX_ANSWER_BYTES" in err.message, err.message
    assert "operator.prometheus.maxAnswerBytes" in err.message
    assert hits == ["prometheus"]
    assert peak < 8 * MiB, f"the read held {peak / MiB:.1f} MiB for a 1 MiB cap"
    # Given up at the cap, not drained: what is left of 64 MB stayed unsent.
    assert huge.sent < 16 * MiB, f"the server got to send {huge.sent / MiB:.1f} MiB"


def test_a_content_length_over_the_cap_is_refused_before_the_body_is_read() -> None:
    async def declared(_: web.Request) -> web.Response:
        return web.Response(body=b"#" * (2 * MiB), content_type="text/plain")

    async def scenario() -> SourceError:
        async with serve_handler(declared, "/metrics") as port, aiohttp.ClientSession() as session:
            try:
                await ScrapeSource(session, max_bytes=MiB).fetch(_pod(port))
            except SourceError as exc:
                return exc
        raise AssertionError("expected a SourceError")

    err = asyncio.run(scenario())
    assert err.reason == src.REASON_TOO_LARGE
    assert "DAM_SCRAPE_MAX_BYTES=1048576" in err.message and "operator.scrapeMaxBytes" in err.message


def test_a_scrape_body_sent_in_pieces_is_read_whole() -> None:
    """One ``read(n)`` returns what happens to be buffered: a body that arrives in two pieces was
    cut at the first, and the pod reported garbage."""
    text = FakeJob(clock=lambda: 1.0).exposition().encode()
    half = len(text) // 2

    async def pieces(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await resp.prepare(request)
        await resp.write(text[:half])
        await asyncio.sleep(0.3)
        await resp.write(text[half:])
        await resp.write_eof()
        return resp

    async def scenario() -> Any:
        async with serve_handler(pieces, "/metrics") as port, aiohttp.ClientSession() as session:
            return await ScrapeSource(session).fetch(_pod(port))

    snap = asyncio.run(scenario())
    assert snap.samples(names.STEPS_TOTAL)[0].value == 100.0
    assert len(snap) == len(parse_snapshot(text.decode()))


def test_a_sidecar_that_trickles_its_body_is_cut_off_by_the_timeout() -> None:
    async def trickle(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await resp.prepare(request)
        with contextlib.suppress(ConnectionError, RuntimeError):
            for _ in range(100):
                await resp.write(b"# still going\n")
                await asyncio.sleep(0.05)
        return resp

    async def scenario() -> SourceError:
        async with serve_handler(trickle, "/metrics") as port, aiohttp.ClientSession() as session:
            try:
                await ScrapeSource(session, timeout_seconds=0.5).fetch(_pod(port))
            except SourceError as exc:
                return exc
        raise AssertionError("expected a SourceError")

    assert asyncio.run(scenario()).reason == src.REASON_TIMEOUT


def test_prometheus_answers_are_read_at_most_prometheus_concurrency_at_a_time() -> None:
    """The answers' caps add up to the operator's memory: at most ``prometheus_concurrency`` of
    them are being read at once, whatever the scrape concurrency (docs/performance.md)."""
    in_flight = {"now": 0, "max": 0}

    async def slow(_: web.Request) -> web.Response:
        in_flight["now"] += 1
        in_flight["max"] = max(in_flight["max"], in_flight["now"])
        await asyncio.sleep(0.2)
        in_flight["now"] -= 1
        body = {"status": "success", "data": {"resultType": "vector", "result": []}}
        return web.json_response(body)

    async def scenario() -> None:
        async with serve_handler(slow, "/{prefix}/api/v1/query") as port, aiohttp.ClientSession() as session:
            settings = OperatorSettings(
                prometheus_concurrency=2, prometheus_allowed_url_prefixes=f"http://127.0.0.1:{port}/"
            )
            factory = SourceFactory(session, settings, policy=url_policy(settings))
            limit = asyncio.Semaphore(64)
            sources = [
                factory(
                    parse_spec(
                        {"selector": {"matchLabels": {"a": "b"}}, "source": {"prometheus": {"url": url}}}
                    )
                )
                for url in (f"http://127.0.0.1:{port}/p{i}" for i in range(6))
            ]
            await asyncio.gather(*(s.fetch_all([_pod(1, f"pod-{i}")], limit) for i, s in enumerate(sources)))

    asyncio.run(scenario())
    assert in_flight["max"] == 2


def test_bodies_over_their_cap_are_counted_by_source_from_zero() -> None:
    metrics = OperatorMetrics(CollectorRegistry())

    def value(source: str) -> float | None:
        return metrics.registry.get_sample_value(n.OPERATOR_SOURCE_BODY_TOO_LARGE_TOTAL, {"source": source})

    assert [value(s) for s in n.BODY_SOURCES] == [0.0, 0.0]
    metrics.source_body_too_large("prometheus")
    metrics.source_body_too_large("prometheus")
    metrics.source_body_too_large("scrape")
    assert [value("scrape"), value("prometheus")] == [1.0, 2.0]


def test_an_answer_over_its_cap_makes_reporting_false_with_its_own_reason() -> None:
    too_large = SourceError(src.REASON_TOO_LARGE, "Prometheus at http://p answered more than 16 MiB")
    cond = st.reporting_condition(
        2, 0, [f"pod-a: {too_large.message}", f"pod-b: {too_large.message}"], 3, [too_large.reason] * 2
    )
    assert (cond["status"], cond["reason"]) == ("False", "SourceAnswerTooLarge")
    assert "16 MiB" in cond["message"]
    refused = st.reporting_condition(1, 0, ["pod-a: refused"], 3, [src.REASON_REFUSED])
    assert refused["reason"] == "SourceRefused"
    other = st.reporting_condition(1, 0, ["pod-a: timeout"], 3, [src.REASON_TIMEOUT])
    assert other["reason"] == st.REASON_NOT_REPORTING


# ---------------------------------------------------------------- compressed bodies

GB = 1024 * MiB


class Bomb:
    """Answers with a ``encoding`` stream that inflates to ``total`` bytes (tests/support/bombs.py),
    counting the compressed bytes it got to send, and the Accept-Encoding it was asked with."""

    def __init__(self, encoding: str, prefix: bytes, total: int = 2 * GB) -> None:
        self.encoding, self.prefix, self.total = encoding, prefix, total
        self.sent = 0
        self.asked: list[str] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.asked.append(request.headers.get("Accept-Encoding", ""))
        resp = web.StreamResponse(headers={"Content-Type": "text/plain", "Content-Encoding": self.encoding})
        await resp.prepare(request)
        try:
            for piece in bomb(self.encoding, self.prefix, self.total):
                await resp.write(piece)
                self.sent += len(piece)
            await resp.write_eof()
        except (ConnectionError, RuntimeError):
            pass  # the operator hung up at its cap
        return resp


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_compressed_scrape_that_inflates_to_2_gb_is_given_up_at_the_cap_in_bounded_memory(
    encoding: str,
) -> None:
    """The cap counts decompressed bytes, decoded a piece at a time by the operator itself
    (auto_decompress=False): what aiohttp's version does with a compressed chunk does not matter."""
    answer = Bomb(encoding, b"# bomb\n")

    async def scenario() -> tuple[SourceError | None, int]:
        async with serve_handler(answer.handle, "/metrics") as port, aiohttp.ClientSession() as session:
            tracemalloc.start()
            try:
                await ScrapeSource(session, max_bytes=MiB, timeout_seconds=30).fetch(_pod(port))
            except SourceError as exc:
                return exc, tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
        return None, 0

    err, peak = asyncio.run(scenario())
    assert err is not None and err.reason == src.REASON_TOO_LARGE, err
    assert "DAM_SCRAPE_MAX_BYTES" in err.message
    assert peak < 8 * MiB, f"the read held {peak / MiB:.1f} MiB for a 1 MiB cap"
    # (The 2 MB of compressed bytes fit in the sockets' buffers: what was sent says nothing here.)
    assert answer.asked == ["gzip, deflate"]


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_compressed_prometheus_answer_that_inflates_to_2_gb_is_given_up_at_the_cap(encoding: str) -> None:
    answer = Bomb(encoding, b'{"status":"success","data":{"resultType":"vector","result":[')

    async def scenario() -> tuple[SourceError | None, int]:
        async with serve_handler(answer.handle, "/api/v1/query") as port, aiohttp.ClientSession() as session:
            source = PrometheusSource(
                session, f"http://127.0.0.1:{port}", max_answer_bytes=MiB, timeout_seconds=30
            )
            tracemalloc.start()
            try:
                await source.fetch(_pod(1))
            except SourceError as exc:
                return exc, tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
        return None, 0

    err, peak = asyncio.run(scenario())
    assert err is not None and err.reason == src.REASON_TOO_LARGE, err
    assert "DAM_PROMETHEUS_MAX_ANSWER_BYTES" in err.message
    assert peak < 8 * MiB, f"the read held {peak / MiB:.1f} MiB for a 1 MiB cap"


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "raw-deflate"])
def test_a_compressed_scrape_under_the_cap_is_read_whole(encoding: str) -> None:
    text = FakeJob(clock=lambda: 1.0).exposition().encode()
    if encoding == "gzip":  # two members one after the other: gzip allows it
        half = len(text) // 2
        body, header = gzip.compress(text[:half]) + gzip.compress(text[half:]), "gzip"
    elif encoding == "deflate":
        body, header = zlib.compress(text), "deflate"
    else:  # a raw deflate stream, as some servers send for "deflate"
        c = zlib.compressobj(6, zlib.DEFLATED, -15)
        body, header = c.compress(text) + c.flush(), "deflate"

    async def handle(_: web.Request) -> web.Response:
        return web.Response(body=body, headers={"Content-Type": "text/plain", "Content-Encoding": header})

    async def scenario() -> Any:
        async with serve_handler(handle, "/metrics") as port, aiohttp.ClientSession() as session:
            return await ScrapeSource(session).fetch(_pod(port))

    snap = asyncio.run(scenario())
    assert len(snap) == len(parse_snapshot(text.decode()))


@pytest.mark.parametrize("encoding", ["br", "zstd", "gzip, br"])
def test_an_answer_in_an_encoding_the_operator_does_not_read_is_refused_by_name(encoding: str) -> None:
    """Neither brotli nor brotlicffi is a dependency: ``br`` is not asked for, and a server that
    sends it anyway is refused naming the encoding (not "unreachable")."""

    async def handle(_: web.Request) -> web.Response:
        return web.Response(
            body=b"\x0b\x02\x80hi\x03", headers={"Content-Type": "text/plain", "Content-Encoding": encoding}
        )

    async def scenario() -> SourceError:
        async with serve_handler(handle, "/metrics") as port, aiohttp.ClientSession() as session:
            try:
                await ScrapeSource(session).fetch(_pod(port))
            except SourceError as exc:
                return exc
        raise AssertionError("expected a SourceError")

    err = asyncio.run(scenario())
    assert err.reason == src.REASON_GARBAGE, err.message
    assert f"Content-Encoding {encoding!r}" in err.message and "gzip, deflate" in err.message, err.message


def test_a_failed_prometheus_query_shows_the_http_status_only_never_the_answers_text() -> None:
    secret = "root:x:0:0:secret-of-an-internal-service"

    async def handle(_: web.Request) -> web.Response:
        return web.json_response({"status": "error", "errorType": "bad_data", "error": secret}, status=400)

    async def scenario() -> SourceError:
        async with serve_handler(handle, "/api/v1/query") as port, aiohttp.ClientSession() as session:
            try:
                await PrometheusSource(session, f"http://127.0.0.1:{port}").fetch(_pod(1))
            except SourceError as exc:
                return exc
        raise AssertionError("expected a SourceError")

    err = asyncio.run(scenario())
    assert err.reason == src.REASON_HTTP and "HTTP 400" in err.message, err.message
    assert "secret" not in err.message and "bad_data" not in err.message, err.message
