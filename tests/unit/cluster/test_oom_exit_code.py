"""The OOM-killed container's exit code reaches the verdict: 137 (128 + SIGKILL) when the OOM killer
took the training process, another code (torch's worker error, then exit 1) when it took a child."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from dam_contract.snapshot import Snapshot
from dam_operator.cluster.steps import window_step as ws
from dam_operator.cluster.steps.registry import PodInfo
from dam_operator.diagnosis.engine import diagnose
from dam_operator.diagnosis.window import job_window

WHEN = dt.datetime(2026, 1, 1, 12, 0, 30, tzinfo=dt.UTC)


def _pod(exit_code: Any) -> PodInfo:
    terminated: dict[str, Any] = {"reason": "OOMKilled", "finishedAt": "2026-01-01T12:00:20Z"}
    if exit_code is not None:
        terminated["exitCode"] = exit_code
    body = {
        "metadata": {"namespace": "ns", "name": "p", "labels": {"app": "t"}},
        "status": {
            "phase": "Failed",
            "containerStatuses": [{"name": "train", "state": {"terminated": terminated}}],
        },
    }
    return PodInfo.from_body(body, instrumented=True)


@pytest.mark.parametrize(("code", "seen"), [(137, 137), (1, 1), (None, None), (-1, None), (True, None)])
def test_the_kubelets_exit_code_is_the_observations(code: Any, seen: int | None) -> None:
    assert ws.oom_exit_code(_pod(code)) == seen


@pytest.mark.parametrize(
    ("code", "first"),
    [(137, "the training process was OOM-killed"), (1, "a child of the training process was OOM-killed")],
)
def test_a_pod_oom_killed_before_a_window_is_judged_by_its_exit_code(code: int, first: str) -> None:
    pod = _pod(code)
    windows: dict[str, Any] = {}
    notes = ws._oom_windows(windows, [pod], {}, {}, WHEN, 30.0)
    assert f"exit code {code}" in notes[0]
    job = job_window(windows).job
    assert job.oom_killed is True and job.oom_exit_code == code
    assert diagnose(job).bottleneck.evidence[0].startswith(first)


def test_no_window_without_a_kill() -> None:
    pod = PodInfo("ns", "p", {"app": "t"}, phase="Failed", instrumented=True)
    windows: dict[str, Any] = {}
    assert ws._oom_windows(windows, [pod], {"p": Snapshot([])}, {}, WHEN, 30.0) == [] and not windows
