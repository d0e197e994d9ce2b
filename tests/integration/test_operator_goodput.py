"""Goodput on a real control plane: two profiles' jobs (fake sidecars serving the probe's goodput
series and one GPU each), the real ``dam operator`` (a child process) writing ``status.goodput``;
``kubectl get damp`` shows it; the operator's ``dam_profile_accelerator_seconds_total{use}`` sums
over the fleet; a container restart (reported through ``pods/status`` as a kubelet would) adds
restart badput, the progress since the last checkpoint moved from productive time; after an
operator restart the totals continue without counting anything twice.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dam_contract.snapshot import parse_snapshot
from dam_operator.cluster.steps import metric_names as mn
from tests.support.fake_sidecar import FakeJob, FakeSidecars, Regime, ThreadedFakeSidecars
from tests.support.kubecluster import ControlPlane
from tests.support.operator_harness import (
    OperatorProcess,
    damprofile,
    dumps,
    log_on_failure,
    profile_of,
    wait_for,
)

pytestmark = pytest.mark.slow

WINDOW = 5
MERGE = "application/merge-patch+json"
PROFILES = {"alpha": "127.0.0.2", "beta": "127.0.0.3"}
# 2 steps/s, 40 % of it waiting on data: 0.3 productive seconds a step, as the fake's first 100 steps.
STEADY = Regime(steps_per_second=2.0, data_wait_ratio=0.4, gpu_util=0.4, sm_active=0.3, dram=0.1, tensor=0.05)


def _profile(name: str, port: int) -> str:
    return yaml.safe_dump(damprofile(name, {"app": name}, port=port, window_seconds=WINDOW))


def _pod(name: str, app: str) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": app}},
            "spec": {"containers": [{"name": "train", "image": "python:3.11-slim", "command": ["python"]}]},
        }
    )


def _iso(seconds_ago: float) -> str:
    at = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=seconds_ago)
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture
def sidecars() -> Iterator[FakeSidecars]:
    with ThreadedFakeSidecars("0.0.0.0") as sidecars:
        yield sidecars


def _fleet(text: str) -> dict[str, dict[str, float]]:
    """``dam_profile_accelerator_seconds_total`` by profile and use, as the operator exports it."""
    out: dict[str, dict[str, float]] = {}
    for s in parse_snapshot(text, "operator").samples(mn.PROFILE_ACCELERATOR_SECONDS_TOTAL):
        labels = dict(s.labels)
        out.setdefault(labels["profile"], {})[labels["use"]] = s.value
    return out


def test_status_goodput_the_goodput_column_the_fleet_sum_restarts_and_an_operator_restart(
    control_plane: ControlPlane,
    kube_namespace: str,
    system_namespace: str,
    sidecars: FakeSidecars,
    tmp_path: Path,
) -> None:
    cp, ns = control_plane, kube_namespace
    jobs = {name: sidecars.add(ip, FakeJob(goodput=True)) for name, ip in PROFILES.items()}
    jobs["alpha"].regime = STEADY
    op = OperatorProcess(cp, tmp_path, namespace=ns, operator_namespace=system_namespace).start()

    def goodput(name: str) -> dict[str, Any]:
        return dict((profile_of(cp, ns, name).get("status") or {}).get("goodput") or {})

    with log_on_failure(op):
        for name, ip in PROFILES.items():
            cp.kubectl("apply", "-n", ns, "-f", "-", input=_profile(name, sidecars.port))
            cp.kubectl("apply", "-n", ns, "-f", "-", input=_pod(f"{name}-0", name))
            cp.mark_pod_running(ns, f"{name}-0", pod_ip=ip)
        for name in PROFILES:
            wait_for(lambda n=name: goodput(n).get("acceleratorSecondsLost"), 60, f"{name}'s status.goodput")

        # The job's whole life so far counts, from the first window: the fake started with 50 s of
        # steps (20 s of them waiting on data) after a 5 s start.
        first = goodput("alpha")
        assert first["elapsedSeconds"] >= 55.0, dumps(first)
        assert first["badputSeconds"]["startup"] == pytest.approx(5.0)
        assert first["badputSeconds"]["dataWait"] >= 20.0
        assert 0 < first["ratio"] < 1
        assert first["productiveSeconds"] == pytest.approx(first["ratio"] * first["elapsedSeconds"], rel=0.01)
        assert first["accelerators"] == 1  # the fake's one GPU
        assert first["acceleratorSecondsLost"] == pytest.approx(
            first["elapsedSeconds"] - first["productiveSeconds"], rel=0.02
        )

        # The server's Table: GOODPUT between CONFIDENCE and AGE, with the ratio.
        rows = cp.kubectl("get", "damp", "-n", ns).stdout.splitlines()
        assert rows[0].split() == ["NAME", "AXIS", "REGIME", "LEVER", "CONFIDENCE", "GOODPUT", "AGE"], rows
        shown = {r.split()[0]: float(r.split()[5]) for r in rows[1:]}
        assert set(shown) == set(PROFILES) and all(0 < v < 1 for v in shown.values()), rows

        # One sum by (use) over the fleet: both profiles, every use.
        fleet = _fleet(op.metrics())
        assert set(fleet) == set(PROFILES), fleet
        assert all(set(uses) == set(mn.ACCELERATOR_USES) for uses in fleet.values()), fleet
        total = {use: sum(f[use] for f in fleet.values()) for use in mn.ACCELERATOR_USES}
        assert total["data-wait"] > max(f["data-wait"] for f in fleet.values()) > 0
        for name, uses in fleet.items():  # each profile's series add up to its status (same process)
            lost = sum(v for use, v in uses.items() if use != mn.USE_PRODUCTIVE)
            assert lost >= goodput(name)["acceleratorSecondsLost"] * 0.98, (name, uses, goodput(name))

        # Its latest save was 40 steps ago: 40 x 0.3 s of productive time that a restart redoes.
        job = jobs["alpha"]
        job.steps_since_checkpoint, job.last_checkpoint_at = 40.0, time.time() - 20
        seen = job.scrapes
        wait_for(lambda: job.scrapes > seen or None, 30, "a scrape with the progress since the save")
        pre = goodput("alpha")

        # A container restart: it failed 30 s ago, the kubelet started it again 10 s ago, and the
        # new process (fresh counters) took 3 s to its first batch.
        pod = cp.api("GET", f"/api/v1/namespaces/{ns}/pods/alpha-0")
        statuses = pod["status"]["containerStatuses"]
        for cs in statuses:
            if cs["name"] == "train":
                cs["restartCount"] = 1
                cs["lastState"] = {
                    "terminated": {
                        "exitCode": 1,
                        "reason": "Error",
                        "startedAt": _iso(120),
                        "finishedAt": _iso(30),
                    }
                }
                cs["state"] = {"running": {"startedAt": _iso(10)}}
        cp.api(
            "PATCH",
            f"/api/v1/namespaces/{ns}/pods/alpha-0/status",
            {"status": {"containerStatuses": statuses}},
            content_type=MERGE,
        )
        time.sleep(1.0)  # the operator's pod watch has it before the next scrape
        job.advance()
        job.steps, job.step_seconds, job.wait_seconds, job.startup_seconds = 10.0, 7.0, 2.0, 3.0
        job.steps_since_checkpoint = 10.0  # the new process saved nothing yet

        def counted() -> dict[str, Any] | None:
            g = goodput("alpha")
            return g if g.get("restarts") == 1 else None

        restarted = wait_for(counted, 30, "the restart counted")
        # 20 s down (the kubelet's times, to the second), 3 s to the first batch, and the 12 s of
        # productive time since the last save, taken from productive: it went down.
        assert 21.5 + 12 <= restarted["badputSeconds"]["restart"] <= 25.0 + 12, dumps(restarted)
        assert restarted["badputSeconds"]["startup"] == pytest.approx(5.0)  # the first process's only
        assert restarted["elapsedSeconds"] > first["elapsedSeconds"] + 20.0
        assert restarted["productiveSeconds"] < pre["productiveSeconds"] - 2.0, (pre, restarted)
        moved = wait_for(
            lambda: (f := _fleet(op.metrics()).get("alpha", {})).get("restart", 0) >= 33.5 and f,
            30,
            "counter",
        )
        assert moved["productive"] > 0, moved

        # The operator restarts: the totals continue from the status, running processes are not
        # counted twice, and the counter starts again from 0.
        before = goodput("beta")
        stopped = time.monotonic()
        op.stop()
        op.start()

        def continued() -> dict[str, Any] | None:
            g = goodput("beta")
            return g if g["elapsedSeconds"] > before["elapsedSeconds"] + 2 else None

        later = wait_for(continued, 60, "beta's goodput after the operator restart")
        grown = later["elapsedSeconds"] - before["elapsedSeconds"]
        assert grown <= time.monotonic() - stopped + 2 * WINDOW, (before, later)
        fleet = wait_for(lambda: _fleet(op.metrics()) or None, 30, "the counters after the restart")
        lost_since = sum(v for use, v in fleet.get("beta", {}).items() if use != mn.USE_PRODUCTIVE)
        assert lost_since < before["acceleratorSecondsLost"], (fleet, before)
        op.assert_alive()
