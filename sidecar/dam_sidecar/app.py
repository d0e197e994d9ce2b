"""``dam sidecar``: serve /metrics and /healthz next to a training container.

    dam sidecar [--port 9450] [--interval S] [--probe-dir D] [--host H]

Flags override the ``DAM_*`` environment (``SidecarSettings``). SIGTERM or
SIGINT stops it cleanly (exit 0), after writing each rank's goodput figures to its
termination-message file (``dam_sidecar.farewell``). ``build_collector`` (re-exported here) gives
the same collector without HTTP, for ``dam run``'s local mode.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys
import threading
from types import FrameType
from typing import Any

from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry
from pydantic import ValidationError

from dam_sidecar import farewell
from dam_sidecar.collector import SidecarCollector, build_collector
from dam_sidecar.collectors.probe import ProbeFeed
from dam_sidecar.envcheck import known_variables, unknown_variables
from dam_sidecar.httpserver import HttpLimits, HttpServer, Request, Response, listening_socket
from dam_sidecar.settings import SidecarSettings

__all__ = ["build_collector", "build_parser", "http_limits", "main", "make_server", "settings_from_args"]

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


class _Endpoints:
    """``/metrics`` (cached Prometheus text, or OpenMetrics rendered on a worker) and ``/healthz``."""

    def __init__(self, registry: CollectorRegistry, collector: SidecarCollector) -> None:
        self.registry = registry
        self.collector = collector
        # OpenMetrics bodies, rendered once per sample: content type -> (the sample's text, body). The
        # collector swaps its text and families together, so the text object identifies the sample.
        self._rendered: dict[str, tuple[bytes, bytes]] = {}
        self._render_lock = threading.Lock()

    def fast(self, req: Request) -> Response | None:
        """Answers on the event loop: cached bytes only. None: OpenMetrics, rendered by ``slow``."""
        if req.path == "/metrics":
            _, content_type = choose_encoder(req.headers.get("accept", ""))
            if not content_type.startswith("text/plain"):
                return None
            try:
                return Response(200, self.collector.text(), content_type)  # rendered once per sample
            except Exception as exc:  # never take the server down
                log.error("rendering /metrics failed: %r", exc)
                return Response(500, b"rendering failed\n")
        if req.path == "/healthz":
            if self.collector.healthy():
                return Response(200, b"ok\n")
            return Response(503, b"sampling loop stalled\n")
        return Response(404, b"not found: try /metrics or /healthz\n")

    def slow(self, req: Request) -> Response:
        encoder, content_type = choose_encoder(req.headers.get("accept", ""))
        try:
            with self._render_lock:  # one render per sample and format, however many scrapers wait
                sample = self.collector.text()
                cached = self._rendered.get(content_type)
                if cached is not None and cached[0] is sample:
                    return Response(200, cached[1], content_type)
                body = encoder(self.registry)
                self._rendered[content_type] = (sample, body)
            return Response(200, body, content_type)
        except Exception as exc:  # never take the server down
            log.error("rendering /metrics failed: %r", exc)
            return Response(500, b"rendering failed\n")


def http_limits(settings: SidecarSettings) -> HttpLimits:
    """The server's bounds: every ``HttpLimits`` field from its setting, ``http_<field>``."""
    return HttpLimits(**{f.name: getattr(settings, f"http_{f.name}") for f in dataclasses.fields(HttpLimits)})


def make_server(
    host: str, port: int, collector: SidecarCollector, limits: HttpLimits | None = None
) -> HttpServer:
    """An HTTP server for ``collector`` on its own registry (not the process-wide default one).

    It is bound and listening on return (a port in use raises ``OSError`` here);
    ``serve_forever()`` in a thread serves it, ``shutdown()`` then
    ``server_close()`` stops it.
    """
    limits = limits or HttpLimits()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    endpoints = _Endpoints(registry, collector)
    sock = listening_socket(host, port, limits.listen_backlog)
    return HttpServer(sock, endpoints.fast, endpoints.slow, limits)


def say_last_words(collector: SidecarCollector, path: str) -> int:
    """One more sample of the probe files, then each rank's goodput figures into the
    termination-message file at ``path`` (``dam_sidecar.farewell``); the ranks written."""
    if not path:
        return 0
    collector.sample_now()
    feed = next((f for f in collector.feeds if isinstance(f, ProbeFeed)), None)
    return 0 if feed is None else farewell.say(path, feed.latest.ranks)


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
        server = make_server(settings.host, settings.port, collector, http_limits(settings))
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
    serving = threading.Thread(target=server.serve_forever, name="dam-http-loop", daemon=True)
    serving.start()
    host, port = server.server_address[:2]
    log.info(
        "listening on http://%s:%s/metrics probe_dir=%s interval=%gs max_connections=%d "
        "request_timeout=%gs idle_timeout=%gs",
        host,
        port,
        settings.probe_dir,
        settings.interval_seconds,
        server.max_connections,
        settings.http_request_timeout_seconds,
        settings.http_idle_timeout_seconds,
    )
    while not stop.wait(1.0):
        pass
    log.info("stopping")
    server.shutdown()
    server.server_close()
    said = say_last_words(collector, settings.termination_message_path)
    if said:
        log.info("wrote %d ranks' goodput figures to %s", said, settings.termination_message_path)
    collector.close()
    log.info("stopped")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
