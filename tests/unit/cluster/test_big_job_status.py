"""One profile of a 1,000-Pod x 8-rank job (8,000 ranks): every per-pod or per-rank list in its
status is capped, the worst named and the rest counted, and the status stays far under the API
server's 1.5 MiB object limit (here: under 64 KiB). Prometheus is asked for 64 pods a query.

The pods are ``tests.support.fake_sidecar.RankedJob``s (the shape of a real sidecar's exposition),
one rank of one pod planted late: what the window must name is known before it runs.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from typing import Any

import aiohttp
from aiohttp import web

from dam_contract import names
from dam_contract.snapshot import Sample, Snapshot, parse_snapshot
from dam_operator.cluster.adapters.sources import PODS_PER_QUERY, PodTarget, PrometheusSource
from dam_operator.cluster.steps import status as st
from dam_operator.cluster.steps.progress_step import MAX_RESTART_PODS_LISTED, progress_step
from dam_operator.cluster.steps.registry import PodInfo
from dam_operator.cluster.steps.spec import parse_spec
from dam_operator.cluster.steps.window_step import (
    ProfileState,
    WindowInputs,
    WindowSettings,
    decide_window,
    initial_step,
)
from dam_operator.diagnosis.hysteresis import Stabilizer
from tests.support.fake_sidecar import RankedJob, serve_handler

PODS, RANKS = 1000, 8
LATE_POD, LATE_RANK = 517, 3
STATUS_BOUND = 64 * 1024
T0 = 1_800_000_000.0


def _name(i: int) -> str:
    return f"train-{i:04d}"


def _pods() -> list[PodInfo]:
    started = "2027-01-15T07:00:00Z"
    return [
        PodInfo(
            "ns",
            _name(i),
            {"job": "big"},
            uid=f"u{i}",
            pod_ip="10.0.0.1",
            phase="Running",
            instrumented=True,
            started_at=started,
        )
        for i in range(PODS)
    ]


def _moved(snapshot: Snapshot, pod: int) -> Snapshot:
    """Pod 0's samples as pod ``pod`` exports them: its global ranks and its GPUs' uuids."""

    def label(k: str, v: str) -> tuple[str, str]:
        if k == names.RANK_LABEL:
            return k, str(int(v) + pod * RANKS)
        if k == "uuid":
            return k, v.replace("GPU-0-", f"GPU-{pod}-")
        return k, v

    samples = [
        Sample(s.name, tuple(label(k, v) for k, v in s.labels), s.value)
        for n in sorted(snapshot.names())
        for s in snapshot.samples(n)
    ]
    return Snapshot(samples, snapshot.timestamp_seconds)


def _scrapes(at: float, clock: list[float], jobs: dict[int, RankedJob]) -> dict[str, Snapshot]:
    clock[0] = at
    texts = {i: job.exposition() for i, job in jobs.items()}
    parsed = {i: parse_snapshot(text) for i, text in texts.items()}
    for snap in parsed.values():
        snap.timestamp_seconds = at
    return {_name(i): parsed[i] if i in parsed else _moved(parsed[0], i) for i in range(PODS)}


def _status_bytes(status: dict[str, Any]) -> int:
    return len(json.dumps(status, separators=(",", ":")).encode())


def test_a_window_of_1000_pods_by_8_ranks_names_the_late_rank_and_stays_under_64_kib() -> None:
    clock = [T0]
    # Pod 0 is the template of the ordinary pods (each gets its own ranks), the late pod is its own.
    jobs = {
        0: RankedJob(clock=lambda: clock[0], pod_index=0),
        LATE_POD: RankedJob(clock=lambda: clock[0], pod_index=LATE_POD, late_rank=LATE_RANK),
    }
    spec = parse_spec({"selector": {"matchLabels": {"job": "big"}}, "evaluation": {"hysteresisWindows": 1}})
    pods = _pods()
    first = initial_step(
        spec=spec,
        status={},
        generation=1,
        pods=pods,
        results=_scrapes(T0, clock, jobs),
        now=st.format_time(dt.datetime.fromtimestamp(T0, dt.UTC)),
        webhook_enabled=True,
    )
    status = first.patch["status"]
    result = decide_window(
        WindowInputs(
            spec=spec,
            status=status,
            generation=1,
            pods=pods,
            results=_scrapes(T0 + 30, clock, jobs),
            when=dt.datetime.fromtimestamp(T0 + 30, dt.UTC),
            settings=WindowSettings(webhook_enabled=True, max_baseline_seconds=90),
        ),
        ProfileState(stabilizer=Stabilizer(confirm_windows=1), baselines=first.baselines),
    )
    status = result.patch["status"]
    late = (_name(LATE_POD), LATE_POD * RANKS + LATE_RANK)
    straggler = status["bottleneck"]["straggler"]
    assert (straggler["pod"], straggler["rank"], straggler["cause"]) == (*late, "Data")
    ranks = status["metrics"]["ranks"]
    assert (ranks[0]["pod"], ranks[0]["rank"]) == late and len(ranks) == 8
    assert status["metrics"]["rankCount"] == PODS * RANKS
    assert status["pods"]["reporting"] == PODS
    assert _status_bytes(status) < STATUS_BOUND


def _stalled_pod(i: int, at: float) -> Snapshot:
    """Pod ``i``'s 8 ranks, none of which took a batch for 15 minutes, all in all_reduce #42."""
    samples = []
    for r in range(RANKS):
        labels = ((names.RANK_LABEL, str(i * RANKS + r)),)
        samples += [
            Sample(names.STEPS_TOTAL, labels, 1000.0),
            Sample(names.STEP_SECONDS_TOTAL, labels, 250.0),
            Sample(names.LAST_BATCH_TIMESTAMP_SECONDS, labels, at - 900),
            Sample(names.RANK_UP, labels, 1.0),
            Sample(names.COLLECTIVE_SEQUENCE, labels, 42.0),
        ]
    return Snapshot(samples, at)


def test_a_restart_of_1000_stalled_pods_deletes_them_all_and_names_64_of_them() -> None:
    spec = parse_spec(
        {
            "selector": {"matchLabels": {"job": "big"}},
            "actions": {"onStall": "Restart", "restartGraceSeconds": 0},
        }
    )
    step = progress_step(
        spec=spec,
        status={},
        answered={_name(i): _stalled_pod(i, T0) for i in range(PODS)},
        pods=_pods(),
        generation=1,
        when=dt.datetime.fromtimestamp(T0, dt.UTC),
        restart_allowed=True,
    )
    assert step.state == "Stalled"
    assert step.delete_pods == [_name(i) for i in range(PODS)]  # every pod is deleted
    assert step.progress is not None
    restart = step.progress["restart"]
    assert restart["pods"] == [_name(i) for i in range(MAX_RESTART_PODS_LISTED)]
    assert restart["podCount"] == PODS
    assert _status_bytes(step.progress) < 8 * 1024


def test_8000_pods_without_the_sidecar_are_counted_and_50_named() -> None:
    missing = [f"pod-{i:05d}" for i in range(8000)]
    pods = st.pods_status(8000, 0, 0, missing)
    assert pods["notInstrumented"] == sorted(missing)[: st.MAX_NOT_INSTRUMENTED_LISTED]
    assert pods["matched"] - pods["instrumented"] == 8000
    condition = st.instrumented_condition(8000, missing, 1)
    assert condition["message"].startswith("8000 of 8000 matched pods have no DAM sidecar")
    assert len(condition["message"]) <= st.MAX_MESSAGE
    assert _status_bytes({"pods": pods, "conditions": [condition]}) < 8 * 1024


def test_prometheus_is_asked_for_at_most_64_pods_a_query_and_every_pod_is_answered() -> None:
    asked: list[list[str]] = []

    async def api(request: web.Request) -> web.Response:
        query = str((await request.post())["query"])
        pods = query.split('pod=~"', 1)[1].rstrip('"}').replace("\\\\", "").split("|")
        asked.append(pods)
        result = [
            {"metric": {"__name__": names.STEPS_TOTAL, "namespace": "ns", "pod": p}, "value": [T0, "1"]}
            for p in pods
        ]
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": result}})

    async def scenario() -> dict[str, Any]:
        async with serve_handler(api, "/api/v1/query") as port, aiohttp.ClientSession() as session:
            source = PrometheusSource(session, f"http://127.0.0.1:{port}")
            targets = [PodTarget("ns", _name(i), "", 0) for i in range(130)]
            return await source.fetch_all(targets, asyncio.Semaphore(4))

    got = asyncio.run(scenario())
    assert sorted(len(a) for a in asked) == [2, PODS_PER_QUERY, PODS_PER_QUERY]
    assert sorted(p for a in asked for p in a) == [_name(i) for i in range(130)]
    assert all(isinstance(got[_name(i)], Snapshot) for i in range(130))
