"""Test helpers for admission webhooks: a self-signed certificate and an HTTPS server in a thread."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import ssl
import tempfile
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class Certificate:
    cert_pem: bytes
    key_pem: bytes

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        with tempfile.TemporaryDirectory() as tmp:
            cert, key = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
            cert.write_bytes(self.cert_pem)
            key.write_bytes(self.key_pem)
            context.load_cert_chain(cert, key)
        return context


def self_signed(hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> Certificate:
    """A self-signed server certificate (its own CA) for the given DNS names / IP addresses."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])])
    alt: list[x509.GeneralName] = []
    for host in hosts:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            alt.append(x509.DNSName(host))
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return Certificate(
        cert_pem=cert.public_bytes(serialization.Encoding.PEM),
        key_pem=key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@contextmanager
def https_server(
    routes: dict[str, Handler], certificate: Certificate, host: str = "127.0.0.1"
) -> Iterator[int]:
    """Serve POST `routes` over HTTPS on a free port in a background thread; yield the port."""
    ready = threading.Event()
    state: dict[str, object] = {}

    async def main() -> None:
        app = web.Application()
        for path, handler in routes.items():
            app.router.add_post(path, handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, 0, ssl_context=certificate.ssl_context())
        await site.start()
        stop = asyncio.Event()
        state["port"] = runner.addresses[0][1]
        state["stop"] = stop
        state["loop"] = asyncio.get_running_loop()
        ready.set()
        try:
            await stop.wait()
        finally:
            await runner.cleanup()
            await asyncio.sleep(0.1)  # let TLS connections finish closing (aiohttp's graceful shutdown)

    thread = threading.Thread(target=lambda: asyncio.run(main()), daemon=True, name="https-webhook")
    thread.start()
    if not ready.wait(10):
        raise RuntimeError("the HTTPS test server did not start")
    try:
        yield int(state["port"])  # type: ignore[call-overload]
    finally:
        loop = state["loop"]
        stop = state["stop"]
        assert isinstance(loop, asyncio.AbstractEventLoop) and isinstance(stop, asyncio.Event)
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
