"""Throughput of the stand-in: status patches per second with N objects and a few watchers.

    .venv/bin/python -m tests.support.standin.bench [--objects 500] [--watchers 4] [--seconds 10]

The stand-in runs in its own process (as in the scale benchmark); this process drives merge
patches to `.../status` over keep-alive connections and counts the events the watchers receive.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from . import StandIn

CRD = Path(__file__).resolve().parents[3] / "crds" / "damprofile.yaml"
GROUP, VERSION, PLURAL = "dam.mlsys.dev", "v1alpha1", "damprofiles"
FALLBACK_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"{PLURAL}.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {"plural": PLURAL, "singular": "damprofile", "kind": "DAMProfile", "shortNames": ["damp"]},
        "versions": [
            {
                "name": VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                        },
                    }
                },
            }
        ],
    },
}


async def _watch(
    session: aiohttp.ClientSession, url: str, since: str, counter: list[int], stop: asyncio.Event
) -> None:
    async with session.get(
        url,
        params={"watch": "true", "resourceVersion": since},
        timeout=aiohttp.ClientTimeout(total=None),
    ) as response:
        async for _line in response.content:
            counter[0] += 1
            if stop.is_set():
                return


async def _drive(
    base: str, objects: int, watchers: int, seconds: float, *, concurrency: int, server: psutil.Process
) -> dict[str, float]:
    prefix = f"{base}/apis/{GROUP}/{VERSION}/namespaces/default/{PLURAL}"
    connector = aiohttp.TCPConnector(limit=concurrency + watchers + 4)
    async with aiohttp.ClientSession(connector=connector) as session:
        for i in range(objects):
            body = {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "DAMProfile",
                "metadata": {"name": f"p{i}"},
                "spec": {"selector": {"matchLabels": {"app": f"job{i}"}}},
            }
            async with session.post(prefix, json=body) as response:
                assert response.status == 201, await response.text()
            for j in range(2):
                pod = {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": f"job{i}-{j}", "labels": {"app": f"job{i}"}},
                    "spec": {"containers": [{"name": "train", "image": "python:3.11"}]},
                }
                async with session.post(f"{base}/api/v1/namespaces/default/pods", json=pod) as response:
                    assert response.status == 201, await response.text()
        async with session.get(f"{base}/apis/{GROUP}/{VERSION}/{PLURAL}") as response:
            since = (await response.json())["metadata"]["resourceVersion"]
        counters = [[0] for _ in range(watchers)]
        stop = asyncio.Event()
        tasks = [
            asyncio.create_task(_watch(session, f"{base}/apis/{GROUP}/{VERSION}/{PLURAL}", since, c, stop))
            for c in counters
        ]
        await asyncio.sleep(0.5)
        base_events = sum(c[0] for c in counters)
        done = [0]
        deadline = time.monotonic() + seconds

        async def worker(offset: int) -> None:
            i = offset
            headers = {"Content-Type": "application/merge-patch+json"}
            while time.monotonic() < deadline:
                name = f"p{i % objects}"
                patch = {
                    "status": {
                        "bottleneck": {"axis": "Data", "confidence": (i % 100) / 100},
                        "lastEvaluationTime": f"t{i}",
                    }
                }
                async with session.patch(
                    f"{prefix}/{name}/status", data=json.dumps(patch), headers=headers
                ) as response:
                    assert response.status == 200, await response.text()
                    await response.read()
                done[0] += 1
                i += concurrency

        server.cpu_percent(None)
        started = time.monotonic()
        await asyncio.gather(*(worker(k) for k in range(concurrency)))
        elapsed = time.monotonic() - started
        cpu = server.cpu_percent(None)
        await asyncio.sleep(0.5)
        stop.set()
        events = sum(c[0] for c in counters) - base_events
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {
        "patches_per_second": done[0] / elapsed,
        "patches": done[0],
        "seconds": elapsed,
        "watch_events_delivered": events,
        "server_cpu_percent": cpu,
        "server_rss_mib": server.memory_info().rss / 2**20,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--objects", type=int, default=500)
    parser.add_argument("--watchers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args(argv)
    with StandIn.running(subprocess=True) as api:
        if CRD.exists():
            api.kubectl("apply", "-f", str(CRD), check=True)
        else:
            api.create("customresourcedefinitions", FALLBACK_CRD)
        server = next(
            p for p in psutil.Process().children(recursive=True) if "standin" in " ".join(p.cmdline())
        )
        result = asyncio.run(
            _drive(
                api.url,
                args.objects,
                args.watchers,
                args.seconds,
                concurrency=args.concurrency,
                server=server,
            )
        )
    print(
        f"stand-in: {args.objects} DAMProfiles + {2 * args.objects} pods, {args.watchers} watchers, "
        f"{args.concurrency} concurrent patchers"
    )
    print(
        f"  status patches/s: {result['patches_per_second']:.0f} "
        f"({result['patches']} in {result['seconds']:.1f} s)"
    )
    print(
        f"  watch events delivered: {result['watch_events_delivered']} "
        f"(expected {args.watchers * result['patches']})"
    )
    print(f"  server CPU: {result['server_cpu_percent']:.0f} %, RSS {result['server_rss_mib']:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
