"""Where the operator reads a pod's counters: one protocol, two sources.

- ``ScrapeSource`` (default): ``GET http://<podIP>:<port>/metrics`` from the sidecar,
  with a timeout and a size limit, parsed by the strict text-format reader.
- ``PrometheusSource``: ONE instant query per profile and window against the Prometheus
  HTTP API, for all of the profile's pods at once
  (``{__name__=~"dam_.+", namespace="NS", pod=~"POD1|POD2|..."}``, sent as a POST form so
  that thousands of pod names fit), split by pod into Snapshots with the target labels
  (namespace, pod, instance, job, ...) stripped. At 5,000 profiles and a 30 s window that
  is 5,000 queries per window (~170/s). A profile of more than ``PODS_PER_QUERY`` (64) pods
  is asked for in one query per 64 of them, one after the other: a 1,000-pod job's answer in
  one piece would pass the answer's cap (16 MiB) two- to fivefold.

Both raise ``SourceError`` with a short, bounded ``reason`` (used as a metric label)
and a message that says what went wrong; never anything else.

Every body is read with a cap (``read_capped``): streamed, and given up as soon as it passes
the cap, so a tenant's pod or Prometheus that answers 700 MB costs the operator the cap, not
the answer (docs/performance.md sizes the caps and the memory limit they add up to). A body
over its cap is counted (``dam_operator_source_body_too_large_total{source}``) and its pods
do not report (``Reporting=False``, reason ``SourceAnswerTooLarge``, naming the cap and the
setting that raises it). Which Prometheus a profile may query is the admin's choice
(``urlpolicy``): a refused URL is never asked, and the addresses a Prometheus host name
resolves to are checked when the operator connects (``PolicyResolver``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import socket
import time
import zlib
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from dam_contract import names
from dam_contract.snapshot import PromParseError, Sample, Snapshot, parse_snapshot
from dam_operator.cluster.settings import OperatorSettings
from dam_operator.cluster.steps.metric_names import BODY_SOURCES, SCRAPE_ERROR_REASONS
from dam_operator.cluster.steps.source_error import SourceError
from dam_operator.cluster.steps.spec import DAMProfileSpec
from dam_operator.cluster.steps.urlpolicy import UrlPolicy

# Bounded reasons (label values of dam_operator_evaluation_errors_total, declared in metric_names).
(
    REASON_TIMEOUT,
    REASON_UNREACHABLE,
    REASON_HTTP,
    REASON_TOO_LARGE,
    REASON_GARBAGE,
    REASON_NO_DATA,
    REASON_REFUSED,
) = SCRAPE_ERROR_REASONS
SOURCE_SCRAPE, SOURCE_PROMETHEUS = BODY_SOURCES

TooLarge = Callable[[str], None]
"""Told the source (``scrape`` or ``prometheus``) of each body given up at its cap."""
Observe = Callable[[float], None]
"""Told the seconds each request to a source took (a sidecar's scrape, a namespace's query)."""
PodResults = dict[str, Snapshot | SourceError]
"""By pod name: the pod's snapshot, or why it has none."""

# Labels that Prometheus (or its service discovery) adds to every series of a target.
TARGET_LABELS = frozenset(
    {"instance", "job", "namespace", "pod", "container", "endpoint", "service", "node", "prometheus"}
)


@dataclass(frozen=True)
class PodTarget:
    namespace: str
    name: str
    ip: str
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.ip}]" if ":" in self.ip else self.ip
        return f"http://{host}:{self.port}/metrics"


class MetricSource(Protocol):
    async def fetch(self, pod: PodTarget) -> Snapshot: ...

    async def fetch_all(
        self, pods: list[PodTarget], limit: asyncio.Semaphore, observe: Observe | None = None
    ) -> PodResults:
        """Every pod's snapshot (or the reason it has none); never raises."""
        ...


ACCEPT_ENCODING = "gzip, deflate"
"""What the operator asks for. Not ``br``: neither ``brotli`` nor ``brotlicffi`` is a dependency
(a brotli answer, which a server may only send when asked, is refused by name); not ``zstd``."""
_DECODE_PIECE = 256 * 1024
"""Decompressed bytes made per step, at most: the memory a compressed body costs beyond its cap."""


class UnreadableEncodingError(Exception):
    """A body in a Content-Encoding the operator does not decode (it asked for ``ACCEPT_ENCODING``)."""

    def __init__(self, encoding: str) -> None:
        super().__init__(
            f"answered with Content-Encoding {encoding[:40]!r}, which the operator does not read "
            f"(it asks for {ACCEPT_ENCODING}, or none)"
        )


class _Inflater:
    """Incremental gzip or deflate decoding, ``max_length`` at a time (zlib.decompressobj): the
    cap counts decompressed bytes and memory stays bounded whatever the aiohttp version does
    (aiohttp before 3.13.3 inflated a chunk without bound, GHSA-6mq8-rvhq-8wgg; the operator
    asks for raw bytes, ``auto_decompress=False``)."""

    def __init__(self, encoding: str) -> None:
        self._gzip = encoding == "gzip"
        self._d: Any = None  # made at the first bytes (deflate: zlib-wrapped or raw, by its header)

    def _new(self, first: bytes) -> Any:
        if self._gzip:
            return zlib.decompressobj(16 + zlib.MAX_WBITS)
        # RFC 9110 "deflate" is the zlib format; some servers send a raw stream (as aiohttp accepts).
        zlib_header = len(first) >= 2 and first[0] & 0x0F == 8 and (first[0] << 8 | first[1]) % 31 == 0
        return zlib.decompressobj(zlib.MAX_WBITS if zlib_header else -zlib.MAX_WBITS)

    def feed(self, data: bytes, room: int) -> Iterator[bytes]:
        """The decompressed bytes of ``data``, in pieces; stops making them once ``room`` is passed."""
        made = 0
        while data and made <= room:
            if self._d is None:
                self._d = self._new(data)
            try:
                out = self._d.decompress(data, min(_DECODE_PIECE, room - made + 1))
            except zlib.error as exc:
                raise ValueError(f"a broken compressed body ({exc})") from None
            data = self._d.unconsumed_tail
            if self._d.eof:
                # gzip allows several members one after the other; anything after a deflate stream is junk.
                data = self._d.unused_data if self._gzip else b""
                self._d = None
            made += len(out)
            if out:
                yield out
            elif self._d is not None:
                break  # no output and no progress: nothing more this call can make


async def read_capped(resp: aiohttp.ClientResponse, max_bytes: int) -> bytearray:
    """The whole body of ``resp`` decoded, or ``BodyTooLargeError`` once it passes ``max_bytes``.

    The request must ask for raw bytes (``auto_decompress=False``, ``Accept-Encoding:
    ACCEPT_ENCODING``): a gzip or deflate body is decompressed here, a piece at a time, and the
    cap counts the decompressed bytes, so a 2 GB bomb in a few MB costs the cap, not 2 GB. An
    encoding other than those is ``UnreadableEncodingError``. Otherwise as ``_read_capped``.
    """
    encoding = resp.headers.get("Content-Encoding", "").strip().lower()
    if encoding in ("", "identity"):
        return await _read_capped(resp, max_bytes, None)
    if encoding not in ("gzip", "x-gzip", "deflate"):
        resp.close()
        raise UnreadableEncodingError(encoding)
    return await _read_capped(resp, max_bytes, _Inflater("gzip" if encoding != "deflate" else "deflate"))


RAW_BODY: dict[str, Any] = {"auto_decompress": False, "headers": {"Accept-Encoding": ACCEPT_ENCODING}}
"""Request arguments of every body read with ``read_capped``."""


class BodyTooLargeError(Exception):
    """A body passed its cap; ``read`` bytes had arrived when the read stopped."""

    def __init__(self, limit: int, read: int) -> None:
        super().__init__(f"more than {limit} bytes")
        self.limit = limit
        self.read = read


async def _read_capped(resp: aiohttp.ClientResponse, max_bytes: int, inflater: _Inflater | None) -> bytearray:
    """The whole body of ``resp``, or ``BodyTooLargeError`` once it passes ``max_bytes``.

    Never holds more than ``max_bytes`` plus one network chunk: a Content-Length over the cap
    is refused before any byte is read, and otherwise the body is taken chunk by chunk as it
    arrives (aiohttp's StreamReader pauses the socket while its buffer is full, so an unread
    rest stays in the kernel, not in the heap). On a refusal the connection is closed rather
    than drained: the rest of a 700 MB answer is never read. (``StreamReader.read(n)`` returns
    what happens to be buffered, up to ``n``; one call can return part of a body.)
    """
    length = resp.content_length
    if length is not None and length > max_bytes:
        resp.close()
        raise BodyTooLargeError(max_bytes, 0)
    body = bytearray()
    async for chunk in resp.content.iter_any():
        pieces = (chunk,) if inflater is None else inflater.feed(chunk, max_bytes - len(body))
        for piece in pieces:
            if len(body) + len(piece) > max_bytes:
                read = len(body) + len(piece)
                del body
                resp.close()
                raise BodyTooLargeError(max_bytes, read)
            body += piece
    return body


@contextlib.asynccontextmanager
async def _timed_slot(limit: asyncio.Semaphore, observe: Observe | None) -> AsyncIterator[None]:
    """One slot of ``limit`` for a request; ``observe`` is told how long the request held it."""
    async with limit:
        start = time.monotonic()
        try:
            yield
        finally:
            if observe is not None:
                observe(time.monotonic() - start)


def _too_large(on_too_large: TooLarge | None, source: str, message: str) -> SourceError:
    """The error of a body given up at its cap, once ``on_too_large`` is told its source."""
    if on_too_large is not None:
        on_too_large(source)
    return SourceError(REASON_TOO_LARGE, message)


def _mib(n: int) -> str:
    return f"{n / 2**20:g} MiB" if n % (2**20 // 16) == 0 else f"{n} bytes"


def _sidecar_timestamp(snapshot: Snapshot) -> float | None:
    for sample in snapshot.samples(names.SNAPSHOT_TIMESTAMP_SECONDS):
        if math.isfinite(sample.value) and sample.value > 0:
            return sample.value
    return None


class ScrapeSource:
    """Direct scrape of the sidecar. The snapshot's timestamp is the sidecar's own
    sample time when it exports one (``dam_snapshot_timestamp_seconds``), else the
    time the answer arrived: deltas of one pod always use one clock."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        *,
        timeout_seconds: float = 2.0,
        max_bytes: int = 1024 * 1024,
        clock: Callable[[], float] = time.time,
        on_too_large: TooLarge | None = None,
    ) -> None:
        self._session = session
        # ``total`` bounds the whole exchange, the body's last byte included (aiohttp runs the
        # response's reads under the request's timer): a sidecar that trickles is cut off too.
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self._timeout_seconds = timeout_seconds
        self._max_bytes = max_bytes
        self._clock = clock
        self._on_too_large = on_too_large

    async def fetch_all(
        self, pods: list[PodTarget], limit: asyncio.Semaphore, observe: Observe | None = None
    ) -> PodResults:
        return await fetch_each(self, pods, limit, observe)

    async def fetch(self, pod: PodTarget) -> Snapshot:
        url = pod.url
        try:
            async with self._session.get(
                url, timeout=self._timeout, allow_redirects=False, **RAW_BODY
            ) as resp:
                if resp.status != 200:
                    raise SourceError(REASON_HTTP, f"{url} answered HTTP {resp.status}")
                body = await read_capped(resp, self._max_bytes)
        except (UnreadableEncodingError, ValueError) as exc:
            raise SourceError(REASON_GARBAGE, f"{url} {_short(exc)}") from None
        except BodyTooLargeError:
            raise _too_large(
                self._on_too_large,
                SOURCE_SCRAPE,
                f"{url} answered more than {_mib(self._max_bytes)}, the operator's cap on one /metrics "
                f"body (DAM_SCRAPE_MAX_BYTES={self._max_bytes}; chart: operator.scrapeMaxBytes); "
                "the body was not read",
            ) from None
        except TimeoutError:
            raise SourceError(
                REASON_TIMEOUT, f"{url} did not answer within {self._timeout_seconds:g} s"
            ) from None
        except aiohttp.ClientError as exc:
            raise SourceError(REASON_UNREACHABLE, f"{url} is unreachable: {_short(exc)}") from None
        received = self._clock()
        try:
            text = body.decode("utf-8")
            snapshot = parse_snapshot(text, source=url)
        except UnicodeDecodeError:
            raise SourceError(REASON_GARBAGE, f"{url} returned text that is not UTF-8") from None
        except PromParseError as exc:
            raise SourceError(REASON_GARBAGE, f"not Prometheus text: {exc}") from None
        if len(snapshot) == 0:
            raise SourceError(REASON_NO_DATA, f"{url} returned no samples")
        snapshot.timestamp_seconds = _sidecar_timestamp(snapshot) or received
        return snapshot


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:199] + "…"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


PODS_PER_QUERY = 64
"""Pods asked for in one Prometheus query, at most. One pod's series weigh 18 KB (1 GPU) to 87 KB
(8 GPUs, 8 ranks) of JSON: 64 such pods answer in about 5.6 MB, under the answer's cap
(``DAM_PROMETHEUS_MAX_ANSWER_BYTES``, 16 MiB, which one query for a 1,000-pod job would pass
two- to fivefold). A bigger job's pods are asked for in several queries, one after the other
(docs/performance.md, "The biggest jobs")."""


class PrometheusSource:
    """Instant queries of pods' ``dam_`` series in Prometheus: one query for a profile's pods, or
    one per ``PODS_PER_QUERY`` of them."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        *,
        timeout_seconds: float = 5.0,
        namespace_label: str = "namespace",
        pod_label: str = "pod",
        max_series: int = 10_000,
        max_answer_bytes: int = 16 * 1024 * 1024,
        read_limit: asyncio.Semaphore | None = None,
        on_too_large: TooLarge | None = None,
        pods_per_query: int = PODS_PER_QUERY,
    ) -> None:
        self._session = session
        self._base = base_url.rstrip("/")
        self._pods_per_query = max(1, pods_per_query)
        # ``total`` covers the body too (see ScrapeSource).
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self._timeout_seconds = timeout_seconds
        self._ns_label = namespace_label
        self._pod_label = pod_label
        self._max_series = max_series
        self._max_answer_bytes = max_answer_bytes
        self._read_limit = read_limit
        self._on_too_large = on_too_large
        self._strip = TARGET_LABELS | {namespace_label, pod_label}

    def query_for(self, pod: PodTarget) -> str:
        return self.query_for_pods(pod.namespace, [pod.name])

    def query_for_pods(self, namespace: str, pods: list[str]) -> str:
        """The series of ``pods`` in ``namespace``: an exact match for one pod, else an anchored
        alternation (Prometheus anchors ``=~``; names are regex-escaped, then string-escaped)."""
        if len(pods) == 1:
            selector = f'{self._pod_label}="{_escape(pods[0])}"'
        else:
            alternation = "|".join(re.escape(name) for name in sorted(set(pods)))
            selector = f'{self._pod_label}=~"{_escape(alternation)}"'
        return f'{{__name__=~"dam_.+",{self._ns_label}="{_escape(namespace)}",{selector}}}'

    async def fetch(self, pod: PodTarget) -> Snapshot:
        result = (await self._query(pod.namespace, [pod]))[pod.name]
        if isinstance(result, SourceError):
            raise result
        return result

    async def fetch_all(
        self, pods: list[PodTarget], limit: asyncio.Semaphore, observe: Observe | None = None
    ) -> PodResults:
        """One query per namespace and ``pods_per_query`` pods (a profile's pods share a namespace),
        each under one slot of ``limit``, one after the other; a failed query is a value for its
        pods. One at a time: a query's timeout counts its wait for Prometheus, and 16 queries of a
        1,000-pod job at once made Prometheus answer each 16 times slower (past the timeout on a
        busy node: docs/performance.md, "The biggest jobs"), for the same time in all."""
        groups: list[tuple[str, list[PodTarget]]] = []
        by_ns: dict[str, list[PodTarget]] = {}
        for pod in pods:
            by_ns.setdefault(pod.namespace, []).append(pod)
        step = self._pods_per_query
        for namespace, members in by_ns.items():
            ordered = sorted(members, key=lambda p: p.name)
            groups += [(namespace, ordered[i : i + step]) for i in range(0, len(ordered), step)]

        async def one(namespace: str, group: list[PodTarget]) -> PodResults:
            async with _timed_slot(limit, observe):
                try:
                    return await self._query(namespace, group)
                except SourceError as exc:
                    return dict.fromkeys((p.name for p in group), exc)

        out: PodResults = {}
        for namespace, group in groups:
            out.update(await one(namespace, group))
        return out

    async def _query(self, namespace: str, pods: list[PodTarget]) -> PodResults:
        if self._read_limit is None:
            return await self._query_now(namespace, pods)
        async with self._read_limit:
            return await self._query_now(namespace, pods)

    async def _query_now(self, namespace: str, pods: list[PodTarget]) -> PodResults:
        url = f"{self._base}/api/v1/query"
        query = self.query_for_pods(namespace, [p.name for p in pods])
        try:
            async with self._session.post(
                url, data={"query": query}, timeout=self._timeout, allow_redirects=False, **RAW_BODY
            ) as resp:
                status = resp.status
                try:
                    body = await read_capped(resp, self._max_answer_bytes)
                except (UnreadableEncodingError, ValueError) as exc:
                    raise SourceError(
                        REASON_GARBAGE, f"Prometheus at {self._base} (HTTP {status}) {_short(exc)}"
                    ) from None
            try:
                payload: Any = json.loads(body)
            except ValueError:  # not JSON, or not UTF-8
                payload = None
            del body
        except BodyTooLargeError:
            raise _too_large(
                self._on_too_large,
                SOURCE_PROMETHEUS,
                f"Prometheus at {self._base} answered more than {_mib(self._max_answer_bytes)}, the "
                f"operator's cap on one answer (DAM_PROMETHEUS_MAX_ANSWER_BYTES={self._max_answer_bytes}; "
                "chart: operator.prometheus.maxAnswerBytes); the answer was not read. An answer for "
                f"{len(pods)} pod(s) should weigh well under 100 KB per pod",
            ) from None
        except aiohttp.ClientConnectorDNSError as exc:
            if isinstance(exc.os_error, AddressRefusedError):
                raise SourceError(REASON_REFUSED, str(exc.os_error)) from None
            raise SourceError(
                REASON_UNREACHABLE, f"Prometheus at {self._base} is unreachable: {_short(exc)}"
            ) from None
        except TimeoutError:
            raise SourceError(
                REASON_TIMEOUT,
                f"Prometheus at {self._base} did not answer within {self._timeout_seconds:g} s",
            ) from None
        except aiohttp.ClientError as exc:
            raise SourceError(
                REASON_UNREACHABLE, f"Prometheus at {self._base} is unreachable: {_short(exc)}"
            ) from None
        if not isinstance(payload, Mapping):
            raise SourceError(
                REASON_GARBAGE, f"Prometheus at {self._base} answered HTTP {status} without JSON"
            )
        if status != 200 or payload.get("status") != "success":
            # The HTTP status only: the upstream's words would let a tenant read any internal
            # service through the status (the operator never echoes an answer's text).
            raise SourceError(
                REASON_HTTP, f"Prometheus at {self._base} answered HTTP {status}, not a success"
            )
        return self._snapshots(payload.get("data"), namespace, pods)

    def _snapshots(self, data: Any, namespace: str, pods: list[PodTarget]) -> PodResults:
        if not isinstance(data, Mapping) or data.get("resultType") != "vector":
            raise SourceError(REASON_GARBAGE, "Prometheus answered something other than an instant vector")
        result = data.get("result")
        if not isinstance(result, list):
            raise SourceError(REASON_GARBAGE, "Prometheus answer has no result list")
        max_series = self._max_series * len(pods)
        if len(result) > max_series:
            raise SourceError(REASON_TOO_LARGE, f"Prometheus returned more than {max_series} series")
        wanted = {p.name for p in pods}
        samples: dict[str, list[Sample]] = {name: [] for name in wanted}
        newest: dict[str, float] = dict.fromkeys(wanted, 0.0)
        seen: set[tuple[str, str, tuple[tuple[str, str], ...]]] = set()
        strip = self._strip | {"__name__"}
        for item in result:  # 263,000 series for a 1,000-pod job: no copy of each series' labels
            try:
                metric = item["metric"]
                name = str(metric["__name__"])
                pod = str(metric.get(self._pod_label, ""))
                ts_raw, value_raw = item["value"]
                ts, value = float(ts_raw), float(value_raw)
            except (KeyError, TypeError, ValueError, AttributeError):
                raise SourceError(REASON_GARBAGE, "Prometheus answer has a malformed sample") from None
            if pod not in wanted:
                continue
            labels = tuple(sorted((str(k), str(v)) for k, v in metric.items() if k not in strip))
            if (pod, name, labels) in seen:
                continue  # the same series from two scrape jobs: keep the first
            seen.add((pod, name, labels))
            samples[pod].append(Sample(name, labels, value))
            newest[pod] = max(newest[pod], ts)
        out: PodResults = {}
        for pod in sorted(wanted):
            if not samples[pod]:
                out[pod] = SourceError(
                    REASON_NO_DATA, f"Prometheus has no dam_ series for pod {namespace}/{pod}"
                )
                continue
            snapshot = Snapshot(samples[pod], timestamp_seconds=newest[pod])
            sidecar_ts = _sidecar_timestamp(snapshot)
            if sidecar_ts is not None:
                snapshot.timestamp_seconds = sidecar_ts
            out[pod] = snapshot
        return out


SCRAPES_IN_FLIGHT_PER_PROFILE = 32
"""One profile's scrapes in flight at once, at most (within the shared ``scrape_concurrency``).
A scrape's timeout counts the time its answer waits for the operator's event loop, which parses
the answers that came before it (3 ms for a pod of 8 GPUs and 8 ranks): with 128 of one
1,000-pod profile in flight on a loaded node, the last waited past the 2 s timeout and its pod
did not report (docs/performance.md, "The biggest jobs"). 32 at a time take as long in all (the
parsing is the cost) and none waits long. Profiles of a few pods are not affected."""


async def fetch_each(
    source: MetricSource, pods: list[PodTarget], limit: asyncio.Semaphore, observe: Observe | None = None
) -> PodResults:
    """Fetch every pod with its own request, concurrently (bounded by ``limit``, and by
    ``SCRAPES_IN_FLIGHT_PER_PROFILE`` for this call); a failure is a value, not a raise. What
    ``ScrapeSource.fetch_all`` does: one sidecar per pod."""
    mine = asyncio.Semaphore(SCRAPES_IN_FLIGHT_PER_PROFILE)

    async def one(pod: PodTarget) -> Snapshot | SourceError:
        async with mine, _timed_slot(limit, observe):
            try:
                return await source.fetch(pod)
            except SourceError as exc:
                return exc

    results = await asyncio.gather(*(one(p) for p in pods))
    return {p.name: r for p, r in zip(pods, results, strict=True)}


def scrape_connector(limit: int) -> aiohttp.TCPConnector:
    """Connections to the sidecars: one per scrape, closed after its answer.

    A pod is scraped once per window (30 s by default), and aiohttp keeps an idle connection
    for 15 s: kept alive, a connection is never reused, yet it holds a socket, a parser and
    its buffers until the pool's clean-up closes it. At 10,000 pods that was 6,363 open
    connections and about 40 MiB of the operator's heap (docs/performance.md). Closed after
    each answer, at most ``limit`` are open at once; a connect on a pod network costs far
    less than a window.
    """
    return aiohttp.TCPConnector(limit=limit, force_close=True)


class AddressRefusedError(OSError):
    """A Prometheus host name resolved to an address the admin's rules refuse (``urlpolicy``)."""


class PolicyResolver(AbstractResolver):
    """Resolves as aiohttp would, then checks every address against ``policy``.

    aiohttp connects to exactly the addresses its resolver returns (literal IP hosts skip the
    resolver; ``UrlPolicy.check_url`` decides those before any request), so the address that
    is checked is the address that is connected to: a name that rebinds to 169.254.169.254
    between the spec's validation and the query is refused here. One refused address refuses
    the name (a mixed answer would connect to it some of the time).
    """

    def __init__(self, policy: UrlPolicy, inner: AbstractResolver | None = None) -> None:
        self._policy = policy
        self._inner = inner if inner is not None else DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        for result in results:
            problem = self._policy.check_address(host, port, result["host"])
            if problem is not None:
                raise AddressRefusedError(problem)
        return results

    async def close(self) -> None:
        await self._inner.close()


def query_connector(limit: int, policy: UrlPolicy | None = None) -> aiohttp.TCPConnector:
    """Connections to Prometheus: a few hosts asked many times a window, so kept alive; with
    ``policy``, each host name's addresses are checked when it is resolved (``PolicyResolver``)."""
    if policy is None:
        return aiohttp.TCPConnector(limit=limit)
    return aiohttp.TCPConnector(limit=limit, resolver=PolicyResolver(policy))


class RefusedSource:
    """The source of a profile whose Prometheus URL the admin's rules refuse: asks nothing."""

    def __init__(self, message: str) -> None:
        self.message = message

    async def fetch(self, pod: PodTarget) -> Snapshot:
        raise SourceError(REASON_REFUSED, self.message)

    async def fetch_all(
        self, pods: list[PodTarget], limit: asyncio.Semaphore, observe: Observe | None = None
    ) -> PodResults:
        error = SourceError(REASON_REFUSED, self.message)
        return {p.name: error for p in pods}


class SourceFactory:
    """The metric source for a profile's spec: the shared direct scrape (on ``scrape_session``,
    see ``scrape_connector``), or one Prometheus source per (url, timeout) on ``query_session``
    (``query_connector``; the scrape session when none is given).

    A profile without ``spec.source`` reads the admin's Prometheus (``prometheus_url``) when
    one is configured, else scrapes. A URL that ``policy`` refuses gets a ``RefusedSource``
    (the spec is refused at validation too; this holds for a spec parsed without the policy).
    Prometheus answers are read ``prometheus_concurrency`` at a time, each at most
    ``prometheus_max_answer_bytes``."""

    def __init__(
        self,
        scrape_session: aiohttp.ClientSession,
        settings: OperatorSettings,
        query_session: aiohttp.ClientSession | None = None,
        *,
        policy: UrlPolicy | None = None,
        on_too_large: TooLarge | None = None,
    ) -> None:
        self._session = query_session if query_session is not None else scrape_session
        self._settings = settings
        # The wired policy comes from runtime.main.url_policy; without it, only the admin's URL.
        self._policy = policy if policy is not None else UrlPolicy(configured_url=settings.prometheus_url)
        self._on_too_large = on_too_large
        self._scrape = ScrapeSource(
            scrape_session,
            timeout_seconds=settings.scrape_timeout_seconds,
            max_bytes=settings.scrape_max_bytes,
            on_too_large=on_too_large,
        )
        self._read_limit = asyncio.Semaphore(settings.prometheus_concurrency)
        self._prometheus: dict[tuple[str, float], MetricSource] = {}

    def __call__(self, spec: DAMProfileSpec) -> MetricSource:
        prom = spec.source.prometheus if spec.source is not None else None
        if prom is not None:
            url, timeout = prom.url, prom.timeout_seconds
        elif self._settings.prometheus_url is not None:
            url, timeout = self._settings.prometheus_url, self._settings.prometheus_timeout_seconds
        else:
            return self._scrape
        key = (url, timeout)
        source = self._prometheus.get(key)
        if source is None:
            problem = self._policy.check_url(url)
            source = (
                RefusedSource(problem)
                if problem is not None
                else PrometheusSource(
                    self._session,
                    url,
                    timeout_seconds=timeout,
                    namespace_label=self._settings.prometheus_namespace_label,
                    pod_label=self._settings.prometheus_pod_label,
                    max_answer_bytes=self._settings.prometheus_max_answer_bytes,
                    read_limit=self._read_limit,
                    on_too_large=self._on_too_large,
                )
            )
            self._prometheus[key] = source
        return source
