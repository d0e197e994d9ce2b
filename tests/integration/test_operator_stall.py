"""A two-pod job that stops making progress on a real control plane: the operator says who holds it
and where, and restarts it (issue 29).

Two real ``torch.distributed`` ranks (gloo, CPU) run here, one per "pod", each under the probe with
its own probe directory and its own real ``dam sidecar`` on a loopback address of its own
(127.0.0.2-3, the pod IPs reported through ``pods/status``; no kubelet). After ``STEADY_SECONDS`` of
steps rank 1 sleeps for ten minutes in a function of the script, before the step's explicit
``dist.all_reduce``; rank 0 enters that all-reduce and waits in it. The real ``dam operator`` (a
child process, admin rights, no webhook, ``DAM_STALL_RESTART_ENABLED=true``) must judge the job
Stalled (``status.progress`` naming rank 1's pod and the sleep's line, rank 0 waiting in the
collective), set the ``Progressing`` condition False (``kubectl wait``), post one ``JobStalled``
Event, export the stall in its metrics, count it as ``stalled`` badput and, with ``onStall:
Restart``, delete both Pods once the stall has lasted ``stallAfterSeconds`` +
``restartGraceSeconds``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from dam_contract.snapshot import parse_snapshot
from dam_operator.cluster.steps import metric_names as mn
from tests.support.kubecluster import ControlPlane
from tests.support.operator_harness import (
    OperatorProcess,
    condition,
    damprofile,
    dumps,
    ensure_crds,
    events_for,
    free_port,
    operator_namespace,
    profile_of,
    start_rank,
    wait_for,
)
from tests.support.procs import stop_process

pytestmark = pytest.mark.slow

RANKS = 2
STALLER = 1
PROFILE = "stall-job"
STEADY_SECONDS = 20.0
"""Steps before rank 1 stops: the operator has seen the job progress, with a step rate."""
STALL_AFTER = 10.0
RESTART_GRACE = 5.0
WINDOW = 5.0
DETECT_WITHIN = STALL_AFTER + 2 * WINDOW + 25.0
"""Seconds from the stall's start to ``Stalled`` in the status: the threshold, two windows, slack."""
RESTART_WITHIN = STALL_AFTER + RESTART_GRACE + 2 * WINDOW + 25.0

TRAIN = textwrap.dedent(
    """
    import sys, time, torch, torch.distributed as dist
    from torch.utils.data import DataLoader

    def stall_here(step):
        print(f"stalling at {time.time():.3f} step {step}", file=sys.stderr, flush=True)
        time.sleep(600)  # rank 1 stops here: it never enters this step's all_reduce

    if __name__ == "__main__":
        steady, staller = float(sys.argv[1]), int(sys.argv[2])
        dist.init_process_group("gloo")
        torch.set_num_threads(1)
        rank = dist.get_rank()
        model = torch.nn.Linear(16, 16)
        first = None
        for step, x in enumerate(DataLoader(torch.randn(200_000, 16), batch_size=8), start=1):
            first = first or time.time()
            model(x).sum().backward()
            if rank == staller and time.time() - first >= steady:
                stall_here(step)
            t = torch.ones(4)
            dist.all_reduce(t)
            time.sleep(0.02)
    """
)
SLEEP_LINE = next(i for i, text in enumerate(TRAIN.splitlines(), start=1) if "time.sleep(600)" in text)


def _pod(name: str, rank: int, port: int) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "stall", "rank": str(rank)}},
        "spec": {
            "containers": [
                {"name": "train", "image": "registry.example.com/train:1"},
                # Added by hand (the webhook is off here): counts as instrumented, is scraped.
                {
                    "name": "dam-sidecar",
                    "image": "ghcr.io/mlsys/dam-operator:test",
                    "ports": [{"name": "dam-metrics", "containerPort": port}],
                },
            ]
        },
    }


def _seconds_left(deadline: float) -> int:
    return max(1, math.ceil(deadline - time.time()))


def _unix(rfc3339: str) -> float:
    return dt.datetime.fromisoformat(rfc3339).timestamp()


def _profile_series(text: str, name: str, namespace: str) -> dict[str, float]:
    """``name``'s samples of this profile, by their ``state`` label (empty for an unlabelled one)."""
    return {
        s.label("state"): s.value
        for s in parse_snapshot(text, "operator").samples(name)
        if s.label("namespace") == namespace and s.label("profile") == PROFILE
    }


def test_the_operator_names_the_rank_that_stalls_a_two_pod_job_and_restarts_its_pods(
    control_plane: ControlPlane, kube_namespace: str, tmp_path: Path
) -> None:
    cp, ns = control_plane, kube_namespace
    ensure_crds(cp)
    port, master_port = free_port(), free_port()
    trainers: list[subprocess.Popen[bytes]] = []
    sidecars: list[subprocess.Popen[bytes]] = []
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    pod_names = [f"trainer-{rank}" for rank in range(RANKS)]
    culprit_pod = pod_names[STALLER]

    def running() -> None:
        for p in (*trainers, *sidecars):
            if p.poll() is not None:
                raise AssertionError(f"a pod process exited early (rc {p.returncode})")

    with operator_namespace(cp) as system_ns:
        op = OperatorProcess(
            cp,
            tmp_path,
            namespace=ns,
            operator_namespace=system_ns,
            webhook=False,
            env={"DAM_STALL_RESTART_ENABLED": "true"},
        )
        try:
            op.start()
            profile = damprofile(
                PROFILE,
                {"app": "stall"},
                port=port,
                window_seconds=WINDOW,
                hysteresis_windows=None,
                inject=False,
                evaluation={"stallAfterSeconds": STALL_AFTER, "stallStepMultiple": 10},
                actions={"onStall": "Restart", "restartGraceSeconds": RESTART_GRACE},
            )
            cp.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(profile))
            for rank, name in enumerate(pod_names):
                ip = f"127.0.0.{rank + 2}"
                started = start_rank(
                    tmp_path,
                    rank=rank,
                    world_size=RANKS,
                    master_port=master_port,
                    command=[sys.executable, str(script), str(STEADY_SECONDS), str(STALLER)],
                    host=ip,
                    sidecar_port=port,
                    log_name=name,
                )
                trainers.append(started.trainer)
                sidecars.append(started.sidecar)
                cp.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(_pod(name, rank, port)))
                cp.mark_pod_running(ns, name, pod_ip=ip)

            # The job progresses first (rank 1 stops only after STEADY_SECONDS of steps).
            cp.kubectl(
                *("wait", "-n", ns, "--for=condition=Progressing=True", f"damp/{PROFILE}"),
                "--timeout=90s",
                timeout_s=100,
            )

            def stall_start() -> tuple[float, int] | None:
                running()
                text = (tmp_path / f"{culprit_pod}.log").read_text(errors="replace")
                found = re.search(r"stalling at ([0-9.]+) step (\d+)", text)
                return (float(found.group(1)), int(found.group(2))) if found else None

            began, step = wait_for(stall_start, 90, "rank 1 to stop before its all_reduce", interval=0.5)

            # The documented way to wait for a stall: the condition turns False (reason Stalled).
            detect_by = began + DETECT_WITHIN
            cp.kubectl(
                *("wait", "-n", ns, "--for=condition=Progressing=False", f"damp/{PROFILE}"),
                f"--timeout={_seconds_left(detect_by)}s",
                timeout_s=_seconds_left(detect_by) + 10,
            )
            assert time.time() <= detect_by + 1, (time.time() - began, "seconds from the stall to Stalled")
            print(f"Stalled {time.time() - began:.1f} s after the stall began")
            obj = profile_of(cp, ns, PROFILE)
            status = obj["status"]
            progress = status["progress"]
            running()  # the ranks still sleep and wait: nothing ended on its own
            assert progress["state"] == "Stalled", dumps(status)
            progressing = condition(obj, "Progressing")
            assert progressing is not None, dumps(status)
            assert (progressing["status"], progressing["reason"]) == ("False", "Stalled"), progressing
            assert progress["stalledSeconds"] >= STALL_AFTER, dumps(progress)
            # The stall began with the job's latest batch, just before rank 1 said it stops (the
            # operator reads batch times through 1-second samples).
            assert abs(_unix(progress["since"]) - began) <= 3.0, (began, dumps(progress))
            culprit = progress["culprit"]
            named = (culprit["pod"], culprit["rank"], culprit["where"])
            assert named == (culprit_pod, STALLER, "user-code"), dumps(progress)
            assert culprit["frames"][0] == f"{script.name}:{SLEEP_LINE} stall_here", dumps(culprit)
            waiting = progress["waiting"]
            assert (waiting["ranks"], waiting["where"]) == (1, "collective"), dumps(progress)
            # Rank 0 entered this step's all_reduce (its step-th timed collective) and waits there.
            assert waiting["detail"] == f"all_reduce #{step}", (step, dumps(waiting))
            assert f"rank {STALLER} in user-code" in progressing["message"], progressing

            metrics = op.metrics()
            stalled_seconds = _profile_series(metrics, mn.PROFILE_STALLED_SECONDS, ns)
            assert len(stalled_seconds) == 1 and next(iter(stalled_seconds.values())) > 0, stalled_seconds
            states = _profile_series(metrics, mn.PROFILE_PROGRESS_STATE, ns)
            assert states.get("Stalled") == 1.0, states
            assert sum(states.values()) == 1.0, states

            # onStall Restart: both Pods are deleted once the stall lasted the threshold + the grace.
            def restarted() -> dict[str, Any] | None:
                record = ((profile_of(cp, ns, PROFILE).get("status") or {}).get("progress") or {}).get(
                    "restart"
                )
                return record if isinstance(record, dict) else None

            record = wait_for(
                restarted,
                _seconds_left(began + RESTART_WITHIN),
                "status.progress.restart",
                interval=0.5,
            )
            print(f"restart recorded {time.time() - began:.1f} s after the stall began")
            status = profile_of(cp, ns, PROFILE)["status"]
            assert record["outcome"] == "pending", dumps(status["progress"])
            assert record["pods"] == pod_names, dumps(record)
            assert record["stallSince"] == progress["since"], dumps(status["progress"])
            assert record["stalledSeconds"] >= STALL_AFTER + RESTART_GRACE, dumps(record)
            # Pods no kubelet ever ran (no nodeName) are removed by the API server at once.
            wait_for(
                lambda: not cp.api("GET", f"/api/v1/namespaces/{ns}/pods")["items"],
                15,
                "the operator to delete the stalled job's pods",
            )
            restarts = wait_for(
                lambda: events_for(cp, ns, PROFILE, "StalledJobRestarted"), 20, "a StalledJobRestarted Event"
            )
            assert len(restarts) == 1, restarts
            assert restarts[0]["type"] == "Warning", restarts
            assert all(name in restarts[0]["message"] for name in pod_names), restarts

            def stalled_badput() -> float | None:
                goodput = (profile_of(cp, ns, PROFILE).get("status") or {}).get("goodput") or {}
                seconds = (goodput.get("badputSeconds") or {}).get("stalled")
                return float(seconds) if isinstance(seconds, int | float) and seconds > 0 else None

            # The ledger counts the stall as badput (the time since the job's latest batch).
            assert wait_for(stalled_badput, 20, "status.goodput.badputSeconds.stalled > 0") > 0

            # One JobStalled Event for the one stall, read after the restart: none was posted again.
            stalls = events_for(cp, ns, PROFILE, "JobStalled")
            assert len(stalls) == 1, stalls
            assert (stalls[0]["type"], stalls[0].get("count", 1)) == ("Warning", 1), stalls
            assert f"rank {STALLER} in user-code" in stalls[0]["message"], stalls
            op.assert_alive()
        except AssertionError:
            for path in sorted(tmp_path.glob("trainer-*.log")):
                print(f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}")
            with contextlib.suppress(Exception):
                print(dumps(profile_of(cp, ns, PROFILE).get("status")))
            print(op.log())
            raise
        finally:
            for p in trainers:  # asleep or inside gloo's all_reduce: SIGKILL, nothing to flush
                stop_process(p, signal.SIGKILL)
            for p in sidecars:
                stop_process(p)
            op.close()
