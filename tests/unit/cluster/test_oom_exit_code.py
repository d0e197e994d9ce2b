"""The OOM-killed container's exit code reaches the verdict: 137 (128 + SIGKILL) when the OOM killer
took the training process, another code (torch's worker error, then exit 1) when it took a child."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from dam_contract import names
from dam_contract.snapshot import Sample, Snapshot
from dam_operator.cluster.steps import window_step as ws
from dam_operator.cluster.steps.registry import PodInfo
from dam_operator.diagnosis.engine import diagnose
from dam_operator.diagnosis.window import job_window
from dam_probe.lastwords import LastWords

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


def _pod_said(message: Any, exit_code: int = 1) -> PodInfo:
    """A pod whose training container the OOM killer ended, with its termination message."""
    terminated: dict[str, Any] = {
        "reason": "OOMKilled",
        "finishedAt": "2026-01-01T12:00:20Z",
        "exitCode": exit_code,
        "message": message,
    }
    body = {
        "metadata": {"namespace": "ns", "name": "p", "labels": {"app": "t"}},
        "status": {
            "phase": "Failed",
            "containerStatuses": [{"name": "train", "state": {"terminated": terminated}}],
        },
    }
    return PodInfo.from_body(body, instrumented=True)


def _judged(pod: PodInfo, baselines: dict[str, Snapshot] | None = None) -> Any:
    windows: dict[str, Any] = {}
    ws._oom_windows(windows, [pod], baselines or {}, {}, WHEN, 30.0)
    job = job_window(windows).job
    return job, diagnose(job).bottleneck


def test_a_loader_killed_before_any_scrape_gets_the_loader_lever_from_the_probes_last_words() -> None:
    """Issue 28 item 8: the kernel took a worker a second after start; no scrape ever answered.
    The probe's line in the termination message says the loader ran 2 workers and one was killed."""
    pod = _pod_said(LastWords(pid=30, rank=0, loader_workers=2, worker_kills=1, kill_signal=9).line())
    job, verdict = _judged(pod)
    assert (job.loader_num_workers, job.loader_worker_kills) == (2, 1)
    assert verdict.lever == "reduce-loader-memory"
    evidence = " ".join(verdict.evidence)
    assert "the OOM killer took the loader, not the training process" in evidence
    assert not any(e.startswith("the training process was OOM-killed") for e in verdict.evidence)


def test_a_child_killed_with_nothing_known_of_the_loader_suspects_it_with_less_confidence() -> None:
    _, said_verdict = _judged(_pod_said(LastWords(pid=30, loader_workers=2).line()))
    unsaid, unsaid_verdict = _judged(_pod_said("the user's own message"))
    assert unsaid.loader_num_workers is None
    assert unsaid_verdict.lever == said_verdict.lever == "reduce-loader-memory"
    assert unsaid_verdict.confidence < said_verdict.confidence
    assert any("loaderNumWorkers" in m for m in unsaid_verdict.missing)


def test_a_child_killed_where_the_probe_said_no_workers_ran_is_not_the_loaders() -> None:
    _, verdict = _judged(_pod_said(LastWords(pid=30, loader_workers=0, steps=40).line()))
    assert verdict.lever != "reduce-loader-memory"


@pytest.mark.parametrize("message", [None, 7, "dam-probe/1 pid=x workers=2", "\x00" * 5000])
def test_a_garbage_termination_message_reads_as_none(message: Any) -> None:
    pod = _pod_said(message)
    assert pod.oom is not None and pod.oom.last_words == () and pod.oom.exit_code == 1


def test_a_kill_the_scrape_counted_is_not_counted_again_from_the_last_words() -> None:
    kills = names.DATALOADER_WORKER_KILLS_TOTAL
    pod = _pod_said(LastWords(pid=30, loader_workers=2, worker_kills=1, kill_signal=9).line())
    scraped = Snapshot([Sample(kills, (), 1.0), Sample(names.DATALOADER_NUM_WORKERS, (), 4.0)], 10.0)
    merged = ws.with_last_words(scraped, pod)
    assert merged.series(kills) == {(): 1.0}
    assert merged.series(names.DATALOADER_NUM_WORKERS) == {(): 4.0}  # the scrape's own reading
    later = ws.with_last_words(Snapshot([Sample(kills, (), 0.0)], 10.0), pod)
    assert later.series(kills) == {(): 1.0}  # said after the last scrape: the larger count
    assert later.series(names.DATALOADER_NUM_WORKERS) == {(): 2.0}
