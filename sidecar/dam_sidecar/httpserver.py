"""The sidecar's HTTP/1.1 server: one asyncio loop for every connection, a few threads to render.

Why not ``http.server.ThreadingHTTPServer``: it starts one thread per
connection, reads with no timeout and listens with a backlog of 5. A hundred
clients connecting at once overflowed the backlog (SYNs retried after 1, 3,
7 s: p99 4.3 s, max 8.8 s), and 600 connections that sent half a request held
604 threads for good.

Here one event-loop thread accepts and reads every connection (a waiting
connection costs a socket and a coroutine, not a thread), with these bounds
(``HttpLimits``, set from ``SidecarSettings``):

- ``listen_backlog``: the ``listen(2)`` backlog (Linux caps it at
  ``net.core.somaxconn``, 4096 since 5.4);
- ``request_timeout_seconds``: a request's line, headers and body must arrive
  within this of its first byte (on a new connection: of the accept), or the
  connection gets ``408`` and is closed;
- ``idle_timeout_seconds``: a kept-alive connection with no new request for
  this long is closed;
- ``write_timeout_seconds``: a response the client does not read within this
  is dropped with the connection;
- ``max_connections``: at the cap, a new connection closes the oldest one that
  is not being answered (idle or still sending), so a flood of slow
  connections can never lock a scraper out;
- ``max_header_bytes`` / ``max_body_bytes``: larger heads get ``431``, larger
  bodies ``413`` (``/metrics`` needs none);
- ``worker_threads``: OpenMetrics rendering (the client library's encoder)
  runs on a pool of this many threads; the cached Prometheus text and
  ``/healthz`` are answered on the loop itself.

Keep-alive: HTTP/1.1 keeps the connection unless ``Connection: close``;
HTTP/1.0 closes it unless ``Connection: keep-alive``. Only ``GET`` and
``HEAD`` are served (``405`` otherwise); chunked request bodies get ``411``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http import HTTPStatus
from urllib.parse import urlsplit

log = logging.getLogger("dam_sidecar")

FD_RESERVE = 64  # descriptors kept for everything but client connections (probe files, /proc, NVML)
CAP_LOG_INTERVAL_SECONDS = 60.0


@dataclass(frozen=True)
class HttpLimits:
    """Bounds of the HTTP server (see the module docstring); defaults as in ``SidecarSettings``."""

    listen_backlog: int = 1024
    max_connections: int = 1024
    worker_threads: int = 4
    request_timeout_seconds: float = 5.0
    idle_timeout_seconds: float = 75.0
    write_timeout_seconds: float = 10.0
    max_header_bytes: int = 16384
    max_body_bytes: int = 65536


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # without the query
    version: str  # "HTTP/1.0" or "HTTP/1.1"
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


# A handler that answers on the loop thread (must be quick), or None when the request needs a worker thread.
FastHandler = Callable[[Request], Response | None]
SlowHandler = Callable[[Request], Response]


class _BadRequestError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Conn:
    __slots__ = ("busy", "task", "writer")

    def __init__(self, task: asyncio.Task[None], writer: asyncio.StreamWriter) -> None:
        self.task = task
        self.writer = writer
        self.busy = False  # True while a complete request is being answered


def listening_socket(host: str, port: int, backlog: int) -> socket.socket:
    """Bind and listen now, so a port in use is an ``OSError`` before anything is served."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # restart past TIME_WAIT; not SO_REUSEPORT
        sock.bind((host, port))
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def connection_cap(wanted: int) -> int:
    """``wanted``, lowered to fit the soft descriptor limit (an accept past it fails with EMFILE)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, soft - FD_RESERVE))


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


def _parse_head(head: bytes) -> Request:
    try:
        text = head.decode("iso-8859-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes any byte
        raise _BadRequestError(400, "undecodable request head") from None
    lines = text.split("\r\n")
    while lines and lines[0] == "":  # RFC 9112 2.2: ignore empty lines before the request line
        lines.pop(0)
    if not lines:
        raise _BadRequestError(400, "empty request")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        raise _BadRequestError(400, "malformed request line")
    method, target, version = parts
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        if version.startswith("HTTP/"):
            raise _BadRequestError(505, f"{version} is not supported; use HTTP/1.1")
        raise _BadRequestError(400, "malformed request line")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        if line[0] in " \t":
            raise _BadRequestError(400, "folded header lines are not accepted")
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise _BadRequestError(400, "malformed header line")
        key = name.lower()
        value = value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    if target.startswith(("http://", "https://")):
        target = urlsplit(target).path or "/"
    return Request(method, target.split("?", 1)[0], version, headers)


def _keep_alive(req: Request) -> bool:
    tokens = {t.strip().lower() for t in req.headers.get("connection", "").split(",")}
    if req.version == "HTTP/1.0":
        return "keep-alive" in tokens
    return "close" not in tokens


def _encode(resp: Response, keep_alive: bool, head_only: bool, extra: dict[str, str] | None = None) -> bytes:
    lines = [
        f"HTTP/1.1 {resp.status} {_reason(resp.status)}",
        f"Content-Type: {resp.content_type}",
        f"Content-Length: {len(resp.body)}",
        f"Connection: {'keep-alive' if keep_alive else 'close'}",
    ]
    lines += [f"{k}: {v}" for k, v in (extra or {}).items()]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + resp.body


class HttpServer:
    """Serves ``fast`` / ``slow``; ``serve_forever``, ``shutdown``, ``server_close`` as in socketserver.

    ``fast`` runs on the event loop and returns a response, or None to have
    ``slow`` run on a worker thread.
    """

    def __init__(self, sock: socket.socket, fast: FastHandler, slow: SlowHandler, limits: HttpLimits) -> None:
        self.socket = sock
        self.server_address: tuple[str, int] = sock.getsockname()[:2]
        self.limits = limits
        self.max_connections = connection_cap(limits.max_connections)
        self._fast = fast
        self._slow = slow
        self._executor = ThreadPoolExecutor(max_workers=limits.worker_threads, thread_name_prefix="dam-http")
        self._conns: dict[asyncio.Task[None], _Conn] = {}  # insertion order: oldest first
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._lock = threading.Lock()
        self._shutdown_requested = False
        self._running = False
        self._done = threading.Event()
        self._last_cap_log = -CAP_LOG_INTERVAL_SECONDS
        self._evicted = 0

    # --- socketserver-like interface ---------------------------------------------
    def serve_forever(self) -> None:
        """Serve until ``shutdown()`` is called (from another thread)."""
        with self._lock:
            if self._shutdown_requested:
                return
            self._running = True
        try:
            asyncio.run(self._main())
        finally:
            self._done.set()

    def shutdown(self) -> None:
        """Stop ``serve_forever`` and wait until it has returned (every connection closed)."""
        with self._lock:
            self._shutdown_requested = True
            loop, stop, running = self._loop, self._stop, self._running
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already closed
                loop.call_soon_threadsafe(stop.set)
        if running:
            self._done.wait()

    def server_close(self) -> None:
        self.socket.close()
        self._executor.shutdown(wait=True, cancel_futures=True)

    def connection_count(self) -> int:
        return len(self._conns)

    # --- the loop ----------------------------------------------------------------
    async def _main(self) -> None:
        stop = asyncio.Event()
        with self._lock:
            self._loop = asyncio.get_running_loop()
            self._stop = stop
            if self._shutdown_requested:
                return
        server = await asyncio.start_server(
            self._on_connection,
            sock=self.socket,
            backlog=self.limits.listen_backlog,  # asyncio listens again with this (its default is 100)
            limit=self.limits.max_header_bytes,  # readuntil raises LimitOverrunError past it
        )
        try:
            await stop.wait()
        finally:
            server.close()
            for conn in list(self._conns.values()):
                conn.writer.transport.abort()
                conn.task.cancel()
            await asyncio.gather(*(c.task for c in list(self._conns.values())), return_exceptions=True)
            with self._lock:
                self._loop = None

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        conn = _Conn(task, writer)
        self._conns[task] = conn
        self._make_room()
        try:
            await self._serve(conn, reader, writer)
        except (asyncio.CancelledError, ConnectionError, OSError):
            writer.transport.abort()
        except Exception as exc:  # never take the server down
            log.error("HTTP connection failed: %r", exc)
            writer.transport.abort()
        finally:
            self._conns.pop(task, None)
            if not writer.transport.is_closing():
                writer.close()

    def _make_room(self) -> None:
        """At the cap, close the oldest connections that are not being answered."""
        over = len(self._conns) - self.max_connections
        if over <= 0:
            return
        for conn in [c for c in self._conns.values() if not c.busy][:over]:
            self._conns.pop(conn.task, None)
            conn.writer.transport.abort()
            conn.task.cancel()
            self._evicted += 1
        now = time.monotonic()
        if now - self._last_cap_log >= CAP_LOG_INTERVAL_SECONDS:
            self._last_cap_log = now
            log.warning(
                "HTTP: %d connections open (DAM_HTTP_MAX_CONNECTIONS=%d): closed the oldest idle or slow "
                "ones, %d so far",
                len(self._conns),
                self.max_connections,
                self._evicted,
            )

    async def _serve(self, conn: _Conn, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        limits = self.limits
        first = True
        while True:
            conn.busy = False
            if first:
                deadline = asyncio.get_running_loop().time() + limits.request_timeout_seconds
                start = b""
            else:
                try:
                    start = await asyncio.wait_for(reader.readexactly(1), limits.idle_timeout_seconds)
                except (TimeoutError, asyncio.IncompleteReadError):
                    return  # idle too long, or the client closed: nothing to answer
                deadline = asyncio.get_running_loop().time() + limits.request_timeout_seconds
            first = False
            try:
                async with asyncio.timeout_at(deadline):
                    head = start + await reader.readuntil(b"\r\n\r\n")
                    req = _parse_head(head)
                    await self._read_body(req, reader)
            except TimeoutError:
                await self._send_error(
                    writer, 408, f"request not received within {limits.request_timeout_seconds:g} s"
                )
                return
            except asyncio.IncompleteReadError:
                return  # the client closed mid-request
            except asyncio.LimitOverrunError:
                await self._send_error(writer, 431, f"request head over {limits.max_header_bytes} bytes")
                return
            except _BadRequestError as exc:
                await self._send_error(writer, exc.status, str(exc))
                return
            conn.busy = True
            keep = _keep_alive(req)
            resp, extra = await self._respond(req)
            writer.write(_encode(resp, keep, req.method == "HEAD", extra))
            try:
                await asyncio.wait_for(writer.drain(), limits.write_timeout_seconds)
            except TimeoutError:
                writer.transport.abort()  # the client does not read: drop the buffered response
                return
            if not keep:
                return

    async def _read_body(self, req: Request, reader: asyncio.StreamReader) -> None:
        if "transfer-encoding" in req.headers:
            raise _BadRequestError(411, "chunked request bodies are not accepted; send Content-Length")
        raw = req.headers.get("content-length")
        if raw is None:
            return
        if not raw.isdigit():
            raise _BadRequestError(400, "malformed Content-Length")
        length = int(raw)
        if length > self.limits.max_body_bytes:
            raise _BadRequestError(413, f"request body over {self.limits.max_body_bytes} bytes")
        if length:
            await reader.readexactly(length)  # read and ignored: no endpoint takes a body

    async def _respond(self, req: Request) -> tuple[Response, dict[str, str] | None]:
        if req.method not in ("GET", "HEAD"):
            return Response(405, b"only GET and HEAD are served\n"), {"Allow": "GET, HEAD"}
        try:
            resp = self._fast(req)
            if resp is None:
                loop = asyncio.get_running_loop()
                resp = await loop.run_in_executor(self._executor, self._slow, req)
        except Exception as exc:  # never take the server down
            log.error("answering %s %s failed: %r", req.method, req.path, exc)
            resp = Response(500, b"internal error\n")
        return resp, None

    async def _send_error(self, writer: asyncio.StreamWriter, status: int, message: str) -> None:
        """A short error answer, best effort (the client may not read it), then the connection closes."""
        writer.write(_encode(Response(status, (message + "\n").encode()), False, False))
        with contextlib.suppress(TimeoutError, ConnectionError, OSError):
            await asyncio.wait_for(writer.drain(), min(1.0, self.limits.write_timeout_seconds))
