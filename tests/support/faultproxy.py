"""A small fault-injecting HTTP proxy between a Kubernetes client and the real API server.

The client talks plain HTTP to ``proxy.url`` (its kubeconfig: :meth:`FaultProxy.kubeconfig`, the
same bearer token, ``server: http://127.0.0.1:PORT``); the proxy forwards every request to the
API server over HTTPS and streams the answer back (watches included, chunk by chunk). Each
request is recorded (:attr:`FaultProxy.records`: method, path, query, status, whether it was a
watch, which fault hit it), so a test can also assert what the client did, e.g. that it was never
refused (403).

Faults (:meth:`FaultProxy.add`), matched by method and a regular expression searched in the path
(with the query), each for ``count`` requests (-1: until cleared):

- ``status``: answer ``status`` (429, 500, 503, 410, ...) with a Kubernetes ``Status`` body and,
  if given, ``Retry-After``; the request never reaches the server.
- ``drop``: close the connection without an answer; the request never reaches the server.
- ``lost``: forward the request (it takes effect), then close the connection without passing the
  answer on: a client cannot tell whether its write happened.
- ``delay``: wait ``delay_s`` seconds, then forward (a slow answer; the client may time out).
- ``gone``: for a watch, answer ``200`` with one ``ERROR`` event carrying a 410 ``Expired`` Status
  and end the stream, as the API server does when the watch's resourceVersion is too old.

:meth:`FaultProxy.drop_watches` cuts every watch stream in flight (the socket closed mid-stream).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import aiohttp
import yaml
from aiohttp import web

Action = Literal["status", "drop", "lost", "delay", "gone"]

_REASONS = {
    410: "Expired",
    429: "TooManyRequests",
    500: "InternalError",
    502: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}
# Not passed on: hop-by-hop headers, and what the proxy sets itself.
_SKIP_REQUEST = {"host", "connection", "keep-alive", "transfer-encoding", "accept-encoding", "content-length"}
_SKIP_RESPONSE = {"connection", "keep-alive", "transfer-encoding", "content-encoding", "content-length"}


@dataclass
class Fault:
    action: Action
    path: str = ""
    method: str | None = None
    status: int = 503
    retry_after: float | None = None
    delay_s: float = 0.0
    count: int = 1
    watch: bool | None = None
    """True: only watch requests; False: only the others; None: both."""
    hits: int = 0

    def matches(self, method: str, target: str, watch: bool) -> bool:
        if self.count == 0:
            return False
        if self.method is not None and self.method != method:
            return False
        if self.watch is not None and self.watch != watch:
            return False
        return re.search(self.path, target) is not None


@dataclass(frozen=True)
class Record:
    method: str
    path: str
    query: str
    watch: bool
    status: int  # 0: no answer (dropped, or the upstream failed)
    fault: str | None
    at: float = field(default_factory=time.time)


def is_watch(request: web.Request) -> bool:
    return request.query.get("watch") in ("true", "1") or "/watch/" in request.path


def status_body(code: int, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": _REASONS.get(code, "InternalError"),
        "code": code,
    }


class FaultProxy:
    """The proxy on an event loop in a background thread; a context manager."""

    def __init__(self, upstream: str, ssl_context: ssl.SSLContext, *, host: str = "127.0.0.1") -> None:
        self.upstream = upstream.rstrip("/")
        self._ssl = ssl_context
        self._host = host
        self.port = 0
        self.records: list[Record] = []
        self._faults: list[Fault] = []
        self._lock = threading.Lock()
        self._streams: set[web.StreamResponse] = set()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fault-proxy", daemon=True)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._error: BaseException | None = None

    # -- faults and records

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self.port}"

    def add(self, fault: Fault) -> Fault:
        with self._lock:
            self._faults.append(fault)
        return fault

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    def _take(self, method: str, target: str, watch: bool) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.matches(method, target, watch):
                    fault.hits += 1
                    if fault.count > 0:
                        fault.count -= 1
                    return fault
        return None

    def drop_watches(self) -> int:
        """Close the socket of every watch stream in flight; how many there were."""
        future = asyncio.run_coroutine_threadsafe(self._drop_watches(), self._loop)
        return future.result(10)

    async def _drop_watches(self) -> int:
        streams = list(self._streams)
        for resp in streams:
            transport = resp._req.transport if resp._req is not None else None
            if transport is not None:
                transport.abort()
        return len(streams)

    def watches_open(self) -> int:
        return len(self._streams)

    def snapshot(self) -> list[Record]:
        with self._lock:
            return list(self.records)

    def kubeconfig(self, source: Path, dest: Path) -> Path:
        """A copy of kubeconfig ``source`` (its current user) that talks to the proxy."""
        config = yaml.safe_load(source.read_text())
        for cluster in config["clusters"]:
            cluster["cluster"] = {"server": self.url}
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(yaml.safe_dump(config, sort_keys=False))
        dest.chmod(0o600)
        return dest

    # -- lifecycle

    def __enter__(self) -> FaultProxy:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the fault proxy did not start")
        if self._error is not None:
            raise RuntimeError(f"the fault proxy did not start: {self._error}")

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._start())
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            self._loop.close()
            return
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._cleanup())
        self._loop.close()

    async def _start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self._ssl, limit=0), auto_decompress=False
        )
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, 0)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self.port = int(sockets[0].getsockname()[1])

    async def _cleanup(self) -> None:
        await self._drop_watches()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    # -- one request

    def _record(self, request: web.Request, watch: bool, status: int, fault: Fault | None) -> None:
        with self._lock:
            self.records.append(
                Record(
                    request.method,
                    request.path,
                    request.query_string,
                    watch,
                    status,
                    fault.action if fault else None,
                )
            )

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        watch = is_watch(request)
        target = request.path_qs
        fault = self._take(request.method, target, watch)
        if fault is not None and fault.action == "status":
            self._record(request, watch, fault.status, fault)
            headers = {"Retry-After": f"{fault.retry_after:g}"} if fault.retry_after is not None else {}
            message = f"injected by the fault proxy: HTTP {fault.status}"
            return web.json_response(status_body(fault.status, message), status=fault.status, headers=headers)
        if fault is not None and fault.action == "drop":
            self._record(request, watch, 0, fault)
            return await self._abort(request)
        if fault is not None and fault.action == "gone" and watch:
            self._record(request, watch, 200, fault)
            resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
            await resp.prepare(request)
            event = {"type": "ERROR", "object": status_body(410, "too old resource version (fault proxy)")}
            await resp.write(json.dumps(event).encode() + b"\n")
            await resp.write_eof()
            return resp
        if fault is not None and fault.action == "delay":
            await asyncio.sleep(fault.delay_s)
        return await self._forward(request, watch, fault)

    async def _abort(self, request: web.Request) -> web.StreamResponse:
        if request.transport is not None:
            request.transport.abort()
        raise asyncio.CancelledError  # the connection is gone: nothing to answer

    async def _forward(self, request: web.Request, watch: bool, fault: Fault | None) -> web.StreamResponse:
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _SKIP_REQUEST}
        body = await request.read() if request.can_read_body else None
        timeout = aiohttp.ClientTimeout(total=None if watch else 120, sock_connect=10)
        try:
            upstream = await self._session.request(
                request.method,
                self.upstream + request.path_qs,
                headers=headers,
                data=body,
                timeout=timeout,
                allow_redirects=False,
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            # The API server is down (e.g. restarting): what a client sees is a refused connection.
            self._record(request, watch, 0, fault)
            del exc
            return await self._abort(request)
        async with upstream:
            if fault is not None and fault.action == "lost":
                await upstream.read()
                self._record(request, watch, 0, fault)
                return await self._abort(request)
            out_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _SKIP_RESPONSE}
            if not watch:
                data = await upstream.read()
                self._record(request, watch, upstream.status, fault)
                return web.Response(body=data, status=upstream.status, headers=out_headers)
            resp = web.StreamResponse(status=upstream.status, headers=out_headers)
            self._record(request, watch, upstream.status, fault)
            await resp.prepare(request)
            self._streams.add(resp)
            try:
                with contextlib.suppress(aiohttp.ClientError, ConnectionError, TimeoutError):
                    async for chunk in upstream.content.iter_any():
                        await resp.write(chunk)
                    await resp.write_eof()
            finally:
                self._streams.discard(resp)
            return resp


def verb_and_resource(record: Record) -> tuple[str, str, str] | None:
    """(RBAC verb, API group, resource[/subresource]) of a resource request; None for discovery."""
    parts = [p for p in record.path.split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 2:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return None
    if rest[:1] == ["watch"]:
        rest = rest[1:]
    if len(rest) >= 2 and rest[0] == "namespaces" and len(rest) != 2:
        rest = rest[2:]  # a namespaced resource (``namespaces/NAME`` alone is the namespace itself)
    if not rest:
        return None
    resource, named = rest[0], len(rest) >= 2
    if len(rest) >= 3:
        resource += "/" + rest[2]
    if record.watch:
        verb = "watch"
    else:
        verb = {
            "GET": "get" if named else "list",
            "POST": "create",
            "PUT": "update",
            "PATCH": "patch",
            "DELETE": "delete" if named else "deletecollection",
        }.get(record.method, record.method.lower())
    return verb, group, resource


def refused(records: list[Record]) -> list[Record]:
    """The requests the API server (not a fault) answered 401 or 403."""
    return [r for r in records if r.fault is None and r.status in (401, 403)]


@contextlib.contextmanager
def fault_proxy(upstream: str, ssl_context: ssl.SSLContext) -> Iterator[FaultProxy]:
    with FaultProxy(upstream, ssl_context) as proxy:
        yield proxy
