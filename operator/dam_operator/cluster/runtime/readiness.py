"""Readiness: the operator is Ready only while it can do its work.

Liveness (kopf's ``/healthz`` and the metrics server's ``/healthz``) says the process runs;
readiness (``/readyz`` on the metrics server) says it serves:

- **api**: the API server answered recently: any request or watch event of the last
  ``api_fresh_seconds``, else one ``GET /version`` now (no retries, ``timeout_seconds``);
- **pods**: the pod informer has listed the pods once (before that no profile can be
  evaluated and the webhook knows no pod);
- **webhook** (when it is on): the local webhook server answers a TLS handshake with a
  certificate that the ``caBundle`` registered in the MutatingWebhookConfiguration verifies
  for the name the API server calls (``WebhookLifecycle.serving_problem``).

A Deployment whose operator cannot reach the API server, or whose webhook never started
(empty ``caBundle``), is then not Available, instead of admitting every Pod uninstrumented
(``failurePolicy: Ignore``) with nothing red anywhere.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from dam_operator.cluster.adapters.kube import ApiError, KubeClient

API_FRESH_SECONDS = 15.0
"""An API answer this recent counts as reachable without a new request."""
CHECK_TIMEOUT_SECONDS = 3.0
"""Each check's own request or handshake (the chart's probe allows 5 s in all)."""
CACHE_SECONDS = 1.0
"""Probes arriving closer than this share one check."""


@dataclass(frozen=True)
class Check:
    name: str
    problem: str | None
    """None: fine; else why not, in a sentence."""

    @property
    def ok(self) -> bool:
        return self.problem is None


@dataclass(frozen=True)
class Report:
    checks: tuple[Check, ...]

    @property
    def ready(self) -> bool:
        return all(c.ok for c in self.checks)

    def text(self) -> str:
        lines = [f"{c.name}: {'ok' if c.ok else c.problem}" for c in self.checks]
        return ("ready\n" if self.ready else "not ready\n") + "".join(f"{line}\n" for line in lines)


WebhookProblem = Callable[[float], Awaitable[str | None]]


class Readiness:
    def __init__(
        self,
        kube: KubeClient,
        pods_listed: Callable[[], bool],
        webhook: WebhookProblem | None,
        *,
        api_fresh_seconds: float = API_FRESH_SECONDS,
        timeout_seconds: float = CHECK_TIMEOUT_SECONDS,
        cache_seconds: float = CACHE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kube = kube
        self._pods_listed = pods_listed
        self._webhook = webhook
        self._fresh = api_fresh_seconds
        self._timeout = timeout_seconds
        self._cache = cache_seconds
        self._clock = clock
        self._last: tuple[float, Report] | None = None
        self._lock = asyncio.Lock()

    async def _api(self) -> str | None:
        last = self._kube.last_success
        if last is not None and self._clock() - last <= self._fresh:
            return None
        try:
            await self._kube.ping(self._timeout)
        except ApiError as exc:
            return f"the API server does not answer ({exc})"
        except Exception as exc:  # e.g. no credentials: kopf.LoginError
            return f"the API server cannot be reached: {type(exc).__name__}: {exc}"
        return None

    async def check(self) -> Report:
        async with self._lock:
            if self._last is not None and self._clock() - self._last[0] < self._cache:
                return self._last[1]
            checks = [Check("api", await self._api())]
            checks.append(
                Check(
                    "pods", None if self._pods_listed() else "the pods are not listed yet (the watch retries)"
                )
            )
            if self._webhook is not None:
                checks.append(Check("webhook", await self._webhook(self._timeout)))
            report = Report(tuple(checks))
            self._last = (self._clock(), report)
            return report

    async def handle(self, _: web.Request) -> web.Response:
        """``GET /readyz``: 200 and "ready", else 503 and each check's problem."""
        report = await self.check()
        return web.Response(text=report.text(), status=200 if report.ready else 503)
