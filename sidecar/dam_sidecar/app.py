"""``dam sidecar``: serve /metrics and /healthz next to a training container.

    dam sidecar [--port 9450] [--interval S] [--probe-dir D] [--host H]

Flags override the ``DAM_*`` environment (``SidecarSettings``). SIGTERM or
SIGINT stops it cleanly (exit 0). ``build_collector`` (re-exported here) gives
the same collector without HTTP, for ``dam run``'s local mode.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any

from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry
from pydantic import ValidationError

from dam_sidecar.collector import SidecarCollector, build_collector
from dam_sidecar.envcheck import known_variables, unknown_variables
from dam_sidecar.settings import SidecarSettings

__all__ = ["build_collector", "build_parser", "main", "make_server", "settings_from_args"]

log = logging.getLogger("dam_sidecar")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dam sidecar",
        description="Serve the DAM metrics (probe files, NVML, CPU) on /metrics; flags override DAM_*.",
    )
    p.add_argument("--port", type=int, help="listen port (DAM_PORT, default 9450; 0 picks a free port)")
    p.add_argument("--host", help="listen address (DAM_HOST, default 0.0.0.0)")
    p.add_argument(
        "--interval", type=float, help="sampling period in seconds (DAM_INTERVAL_SECONDS, default 1)"
    )
    p.add_argument("--probe-dir", help="directory of the probe files (DAM_PROBE_DIR)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


def settings_from_args(args: argparse.Namespace) -> SidecarSettings:
    overrides: dict[str, Any] = {}
    if args.port is not None:
        overrides["port"] = args.port
    if args.host is not None:
        overrides["host"] = args.host
    if args.interval is not None:
        overrides["interval_seconds"] = args.interval
    if args.probe_dir is not None:
        overrides["probe_dir"] = args.probe_dir
    return SidecarSettings(**overrides)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms delayed-ACK stall

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            try:
                if content_type.startswith("text/plain"):
                    body = self.server.collector.text()  # rendered once per sample
                else:
                    body = encoder(self.server.registry)
            except Exception as exc:  # never take the server down
                log.error("rendering /metrics failed: %r", exc)
                self._reply(500, b"rendering failed\n", "text/plain; charset=utf-8")
                return
            self._reply(200, body, content_type)
        elif path == "/healthz":
            if self.server.collector.healthy():
                self._reply(200, b"ok\n", "text/plain; charset=utf-8")
            else:
                self._reply(503, b"sampling loop stalled\n", "text/plain; charset=utf-8")
        else:
            self._reply(404, b"not found: try /metrics or /healthz\n", "text/plain; charset=utf-8")

    def _reply(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return  # one log line per request would drown the useful ones


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self, address: tuple[str, int], registry: CollectorRegistry, collector: SidecarCollector
    ) -> None:
        self.registry = registry
        self.collector = collector
        super().__init__(address, _Handler)


def make_server(host: str, port: int, collector: SidecarCollector) -> _Server:
    """An HTTP server for ``collector`` on its own registry (not the process-wide default one)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return _Server((host, port), registry, collector)


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    try:
        settings = settings_from_args(args)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'settings'}: {e['msg']}" for e in exc.errors()
        )
        sys.stderr.write(f"dam sidecar: invalid settings (DAM_* variables or flags): {problems}\n")
        return 2
    for warning in unknown_variables(os.environ, known_variables(SidecarSettings)):
        log.warning("%s", warning)
    collector = build_collector(settings)
    try:
        server = make_server(settings.host, settings.port, collector)
    except OSError as exc:
        sys.stderr.write(
            f"dam sidecar: cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}\n"
        )
        collector.close()
        return 1
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    collector.sample_now()
    collector.start()
    serving = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.5}, daemon=True)
    serving.start()
    host, port = server.server_address[:2]
    log.info(
        "listening on http://%s:%s/metrics probe_dir=%s interval=%gs",
        host,
        port,
        settings.probe_dir,
        settings.interval_seconds,
    )
    while not stop.wait(1.0):
        pass
    log.info("stopping")
    server.shutdown()
    server.server_close()
    collector.close()
    log.info("stopped")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
