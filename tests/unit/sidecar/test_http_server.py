"""The sidecar's HTTP server on loopback: keep-alive, timeouts, limits, the connection cap, shutdown.

The real server (``dam_sidecar.httpserver.HttpServer``) runs in a thread of
this process with small limits; clients are plain sockets, so each test sees
exactly the bytes the server sends and when it closes.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from dam_sidecar.httpserver import HttpLimits, HttpServer, Request, Response, listening_socket

BODY = b"dam_steps_total 42.0\n"


@contextmanager
def serving(**limits: float) -> Iterator[HttpServer]:
    slow_calls: list[str] = []

    def fast(req: Request) -> Response | None:
        if req.path == "/metrics":
            return Response(200, BODY)
        if req.path == "/slow":
            return None  # rendered on a worker thread
        return Response(404, b"not found\n")

    def slow(req: Request) -> Response:
        slow_calls.append(threading.current_thread().name)
        return Response(200, b"rendered on " + threading.current_thread().name.encode())

    lim = HttpLimits(**limits)  # type: ignore[arg-type]
    server = HttpServer(listening_socket("127.0.0.1", 0, lim.listen_backlog), fast, slow, lim)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        t.join(5)
        assert not t.is_alive()


def connect(server: HttpServer) -> socket.socket:
    s = socket.create_connection(server.server_address, timeout=5)
    return s


def read_response(s: socket.socket) -> tuple[bytes, dict[str, str], bytes]:
    """(status line, headers, body) of one response; the socket stays open."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        assert chunk, f"closed before a full head: {buf!r}"
        buf += chunk
    head, body = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    length = int(headers["content-length"])
    while len(body) < length:
        chunk = s.recv(65536)
        assert chunk
        body += chunk
    return lines[0].encode(), headers, body[:length]


def closed_by_server(s: socket.socket, within: float) -> bool:
    s.settimeout(within)
    try:
        while s.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return True


def test_a_kept_alive_connection_serves_several_requests() -> None:
    with serving() as server, connect(server) as s:
        for _ in range(3):
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            status, headers, body = read_response(s)
            assert status == b"HTTP/1.1 200 OK" and body == BODY
            assert headers["connection"] == "keep-alive"


def test_http_1_0_and_connection_close_end_the_connection_after_the_answer() -> None:
    with serving() as server:
        for request in (
            b"GET /metrics HTTP/1.0\r\n\r\n",
            b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n",
        ):
            with connect(server) as s:
                s.sendall(request)
                _, headers, body = read_response(s)
                assert body == BODY and headers["connection"] == "close"
                assert closed_by_server(s, within=2)


def test_a_connection_that_sends_nothing_gets_408_after_the_request_timeout() -> None:
    with serving(request_timeout_seconds=0.5) as server, connect(server) as s:
        start = time.monotonic()
        status, _, body = read_response(s)
        assert status.startswith(b"HTTP/1.1 408")
        assert b"0.5 s" in body
        assert 0.4 < time.monotonic() - start < 3
        assert closed_by_server(s, within=2)


def test_a_request_trickled_byte_by_byte_is_cut_off_at_the_request_timeout() -> None:
    with serving(request_timeout_seconds=0.6) as server, connect(server) as s:
        start = time.monotonic()
        s.sendall(b"GET /metrics HTTP/1.1\r\n")
        for _ in range(40):  # one header byte every 0.05 s: never a complete head in time
            try:
                s.sendall(b"X")
            except (BrokenPipeError, ConnectionResetError):
                break
            time.sleep(0.05)
        assert closed_by_server(s, within=3)
        assert time.monotonic() - start < 3


def test_an_idle_kept_alive_connection_is_closed_after_the_idle_timeout() -> None:
    with serving(idle_timeout_seconds=0.5, request_timeout_seconds=5) as server, connect(server) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
        read_response(s)
        start = time.monotonic()
        assert closed_by_server(s, within=3)
        assert 0.4 < time.monotonic() - start < 3


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", b"405"),
        (b"GET /metrics HTTP/1.1\r\nContent-Length: 999999\r\n\r\n", b"413"),
        (b"GET /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", b"411"),
        (b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n", b"431"),
        (b"GET /metrics HTTP/2.0\r\n\r\n", b"505"),
        (b"NONSENSE\r\n\r\n", b"400"),
        (b"GET /metrics HTTP/1.1\r\n folded\r\n\r\n", b"400"),
        (b"GET /nope HTTP/1.1\r\n\r\n", b"404"),
    ],
    ids=["post", "big_body", "chunked", "big_head", "http2", "garbage", "folded", "unknown_path"],
)
def test_bad_requests_get_a_clear_status(request_bytes: bytes, status: bytes) -> None:
    with serving(max_header_bytes=16384, max_body_bytes=1024) as server, connect(server) as s:
        s.sendall(request_bytes)
        line, _, _ = read_response(s)
        assert line.split(b" ")[1] == status, line


def test_a_small_body_is_read_and_ignored_and_the_connection_goes_on() -> None:
    with serving() as server, connect(server) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello")
        assert read_response(s)[2] == BODY
        s.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
        assert read_response(s)[2] == BODY


def test_head_answers_headers_only() -> None:
    with serving() as server, connect(server) as s:
        s.sendall(b"HEAD /metrics HTTP/1.1\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        assert data.startswith(b"HTTP/1.1 200 OK") and data.endswith(b"\r\n\r\n")
        assert f"Content-Length: {len(BODY)}".encode() in data


def test_slow_answers_run_on_the_bounded_worker_pool() -> None:
    with serving(worker_threads=2) as server:
        names = set()
        for _ in range(10):
            with connect(server) as s:
                s.sendall(b"GET /slow HTTP/1.1\r\nConnection: close\r\n\r\n")
                names.add(read_response(s)[2])
        assert 1 <= len(names) <= 2 and all(n.startswith(b"rendered on dam-http") for n in names)


def test_at_the_connection_cap_the_oldest_idle_connections_make_room_for_a_scrape() -> None:
    with serving(max_connections=20, request_timeout_seconds=30) as server:
        idle = [connect(server) for _ in range(20)]
        try:
            time.sleep(0.3)
            with connect(server) as s:  # the 21st: served, and the oldest idle one closed
                s.sendall(b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n")
                assert read_response(s)[2] == BODY
            assert closed_by_server(idle[0], within=2)
            assert server.connection_count() <= 20
        finally:
            for c in idle:
                c.close()


def test_a_client_that_never_reads_is_dropped_after_the_write_timeout_and_others_are_served() -> None:
    big = b"x" * (32 * 2**20)  # more than the socket buffers hold

    def answer(req: Request) -> Response:
        return Response(200, big if req.path == "/big" else BODY)

    lim = HttpLimits(write_timeout_seconds=0.5)
    server = HttpServer(listening_socket("127.0.0.1", 0, 16), answer, answer, lim)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        stuck = socket.create_connection(server.server_address)
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stuck.sendall(b"GET /big HTTP/1.1\r\n\r\n")  # and never reads
        with connect(server) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n")
            assert read_response(s)[2] == BODY
        deadline = time.monotonic() + 5
        while server.connection_count() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.connection_count() == 0  # the stuck one was dropped
        stuck.close()
    finally:
        server.shutdown()
        server.server_close()
        t.join(5)


def test_shutdown_closes_open_connections_and_returns() -> None:
    with serving(request_timeout_seconds=60) as server:
        held = [connect(server) for _ in range(5)]
        time.sleep(0.2)
    try:
        for c in held:
            assert closed_by_server(c, within=2)
    finally:
        for c in held:
            c.close()


def test_a_port_in_use_is_an_error_before_serving() -> None:
    with serving() as server, pytest.raises(OSError):
        listening_socket("127.0.0.1", server.server_address[1], 16)


def test_shutdown_before_serving_does_not_hang() -> None:
    lim = HttpLimits()
    server = HttpServer(
        listening_socket("127.0.0.1", 0, 16), lambda r: None, lambda r: Response(200, b""), lim
    )
    port = server.server_address[1]
    server.shutdown()
    t0 = time.monotonic()
    loop = threading.Thread(target=server.serve_forever, daemon=True)
    loop.start()
    loop.join(5.0)
    assert not loop.is_alive(), "serve_forever after shutdown kept serving"
    assert time.monotonic() - t0 < 2.0  # at once, not after a poll timeout
    server.server_close()
    with pytest.raises(OSError):  # closed: nothing listens on the port any more
        socket.create_connection(("127.0.0.1", port), timeout=2.0).close()
