"""The node's `kubernetes` Service address and a tiny cluster DNS, inside a network namespace.

There is no kube-proxy on the test node, so nothing makes the `kubernetes` Service's ClusterIP
(10.0.0.1:443, what the kubelet puts in every container's KUBERNETES_SERVICE_HOST/PORT) lead
anywhere. This process owns that address: its listening sockets are made inside the relay network
namespace (the Pod network's gateway, see tests/support/nodecluster.py), and every connection is
relayed to the API server on 127.0.0.1 of the host's namespace: a socket stays in the namespace it
was created in, so one process holds sockets in both (setns(2) on the main thread, before any
other thread exists, then back).

Its DNS server (UDP and TCP, port 53 at --dns) answers A queries for the `kubernetes` Service's
names (kubernetes, kubernetes.default, kubernetes.default.svc, ....svc.cluster.local) with that
address, and NXDOMAIN for every other name: the node has no other cluster DNS, and no query ever
leaves the namespaces the node made.

Standard library only; runs as root (setns needs CAP_SYS_ADMIN).

    python3 tools/node/relay.py --netns /var/run/netns/dam-node-relay \
        --listen 10.0.0.1:443 --to 127.0.0.1:6443 --dns 10.0.0.10 --domain cluster.local
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import struct
from collections.abc import Awaitable, Callable

CLONE_NEWNET = 0x40000000


def _setns(fd: int) -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def sockets_in(netns: str, make: Callable[[], list[socket.socket]]) -> list[socket.socket]:
    """Run ``make`` with this thread in ``netns``; the sockets it makes stay there."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(netns, os.O_RDONLY)
    try:
        _setns(target)
        try:
            return make()
        finally:
            _setns(home)
    finally:
        os.close(target)
        os.close(home)


def _listen(host: str, port: int, kind: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, kind)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port))
    if kind == socket.SOCK_STREAM:
        s.listen(512)
    s.setblocking(False)
    return s


# --- TCP relay ------------------------------------------------------------------------------------


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        if writer.can_write_eof():
            with contextlib.suppress(OSError):
                writer.write_eof()


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def relay_handler(to_host: str, to_port: int) -> Handler:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(to_host, to_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        for w in (writer, up_writer):
            w.close()

    return handle


# --- DNS ------------------------------------------------------------------------------------------


def _names(domain: str) -> set[str]:
    base = ["kubernetes", "kubernetes.default", "kubernetes.default.svc"]
    return set(base) | {f"kubernetes.default.svc.{domain}"}


def dns_answer(query: bytes, names: set[str], address: str) -> bytes | None:
    """The answer to one DNS query message (RFC 1035), or None when it is not a query."""
    if len(query) < 12:
        return None
    ident, flags, qdcount = struct.unpack("!HHH", query[:6])
    if flags & 0x8000 or qdcount != 1:
        return None
    pos, labels = 12, []
    while pos < len(query) and query[pos] != 0:
        n = query[pos]
        labels.append(query[pos + 1 : pos + 1 + n].decode("ascii", "replace").lower())
        pos += 1 + n
    pos += 1
    if pos + 4 > len(query):
        return None
    qtype, qclass = struct.unpack("!HH", query[pos : pos + 4])
    question = query[12 : pos + 4]
    name = ".".join(labels)
    known = name in names
    answers = b""
    if known and qtype in (1, 255) and qclass == 1:  # A (or ANY), class IN
        answers = b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 30, 4) + socket.inet_aton(address)
    rcode = 0 if known else 3  # NOERROR (no AAAA records: an empty answer), else NXDOMAIN
    header = struct.pack("!HHHHHH", ident, 0x8400 | 0x0100 | rcode, 1, 1 if answers else 0, 0, 0)
    return header + question + answers


class _Dns(asyncio.DatagramProtocol):
    def __init__(self, names: set[str], address: str) -> None:
        self.names, self.address = names, address
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a datagram endpoint's transport

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        answer = dns_answer(data, self.names, self.address)
        if answer is not None and self.transport is not None:
            self.transport.sendto(answer, addr)


def dns_tcp_handler(names: set[str], address: str) -> Handler:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while size := await reader.readexactly(2):
                query = await reader.readexactly(struct.unpack("!H", size)[0])
                answer = dns_answer(query, names, address)
                if answer is None:
                    break
                writer.write(struct.pack("!H", len(answer)) + answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            writer.close()

    return handle


async def serve(args: argparse.Namespace, socks: list[socket.socket]) -> None:
    listen_host = args.listen.rpartition(":")[0]
    to_host, _, to_port = args.to.rpartition(":")
    loop = asyncio.get_running_loop()
    stop: asyncio.Future[None] = loop.create_future()

    def finish() -> None:
        if not stop.done():
            stop.set_result(None)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, finish)
    servers = [await asyncio.start_server(relay_handler(to_host, int(to_port)), sock=socks[0])]
    if args.dns:
        names = _names(args.domain)
        servers.append(await asyncio.start_server(dns_tcp_handler(names, listen_host), sock=socks[1]))
        await loop.create_datagram_endpoint(lambda: _Dns(names, listen_host), sock=socks[2])
    print(f"relay: {args.listen} -> {args.to}" + (f"; dns {args.dns}:53" if args.dns else ""), flush=True)
    await stop
    for server in servers:
        server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--netns", required=True, help="path of the network namespace (/var/run/netns/NAME)")
    parser.add_argument("--listen", required=True, help="HOST:PORT inside the namespace")
    parser.add_argument("--to", required=True, help="HOST:PORT in this process's namespace")
    parser.add_argument("--dns", default="", help="an address inside the namespace for DNS (port 53)")
    parser.add_argument("--domain", default="cluster.local")
    args = parser.parse_args()
    host, _, port = args.listen.rpartition(":")

    def make() -> list[socket.socket]:
        socks = [_listen(host, int(port), socket.SOCK_STREAM)]
        if args.dns:
            socks += [_listen(args.dns, 53, socket.SOCK_STREAM), _listen(args.dns, 53, socket.SOCK_DGRAM)]
        return socks

    socks = sockets_in(args.netns, make)
    asyncio.run(serve(args, socks))


if __name__ == "__main__":
    main()
