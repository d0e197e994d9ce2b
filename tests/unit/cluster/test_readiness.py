"""Readiness without a cluster: an API server that does not answer, pods not listed, the webhook."""

from __future__ import annotations

import asyncio
import socket

import kopf

from dam_operator.cluster.adapters.kube import KubeClient
from dam_operator.cluster.runtime.readiness import Readiness


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens there once closed


def _client(port: int) -> KubeClient:
    return KubeClient(lambda: kopf.ConnectionInfo(server=f"http://127.0.0.1:{port}"), retries=0)


def test_an_api_server_that_refuses_connections_makes_the_operator_not_ready() -> None:
    async def scenario() -> None:
        kube = _client(_closed_port())
        try:
            report = await Readiness(kube, lambda: True, None).check()
        finally:
            await kube.close()
        assert not report.ready
        (api, pods) = report.checks
        assert api.name == "api" and api.problem is not None and "does not answer" in api.problem
        assert pods.ok
        assert report.text().startswith("not ready\napi: the API server does not answer")

    asyncio.run(scenario())


def test_a_recent_api_answer_counts_without_a_new_request_and_unlisted_pods_are_not_ready() -> None:
    async def scenario() -> None:
        kube = _client(_closed_port())
        clock = [100.0]
        kube.last_success = 95.0  # an answer 5 s ago
        try:
            readiness = Readiness(kube, lambda: False, None, api_fresh_seconds=15.0, clock=lambda: clock[0])
            report = await readiness.check()
            assert [c.name for c in report.checks if c.ok] == ["api"]
            assert not report.ready and "pods are not listed yet" in report.text()
            assert kube.requests == 0
            clock[0] = 200.0  # 105 s since the last answer: it asks, and the port is closed
            report = await readiness.check()
            assert kube.requests == 1 and not report.checks[0].ok
        finally:
            await kube.close()

    asyncio.run(scenario())


def test_the_webhook_check_decides_when_the_webhook_is_on() -> None:
    async def scenario() -> None:
        kube = _client(_closed_port())
        kube.last_success = 0.0
        problems: list[str | None] = ["the pod webhook is not serving yet", None]

        async def webhook(_: float) -> str | None:
            return problems.pop(0)

        clock = [1.0]
        try:
            readiness = Readiness(kube, lambda: True, webhook, clock=lambda: clock[0], cache_seconds=1.0)
            first = await readiness.check()
            assert not first.ready and "webhook: the pod webhook is not serving yet" in first.text()
            assert await readiness.check() is first  # within the cache: one check for both probes
            clock[0] = 2.5
            assert (await readiness.check()).ready
        finally:
            await kube.close()

    asyncio.run(scenario())
