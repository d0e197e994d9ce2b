"""Issue 28's ground truth on a real node: the status' goodput by cause and MFU against what the
job itself measured (workloads/truth.py logs where each of its seconds went), for a two-Pod job
whose rank-1 Pod is deleted mid-run and for the same work as one Pod of torchrun's two ranks. The
checks only: test_node_scenarios.py runs them after the verdict tests and before the faults (which
would disturb the jobs).

The truth is the job's: its processes' starts (/proc), first batches, per step the data wait, the
compute, the all_reduce, rank 0's save and the barrier rank 1 waits in meanwhile, and each
process's end. In the status' units (seconds *of the job*: each process's seconds summed, divided
by the job's 2 processes):

- startup: the first attempt's container start (its PID 1's: the process itself, or torchrun's
  launcher) to its first batch;
- restart: from each rank's end in the first attempt to its replacement's first batch (down time
  and the new process's startup), plus the productive time of the steps redone (after rank 0's
  last save);
- dataWait; checkpoint: rank 0's saves and rank 1's wait for them at the barrier after each
  (one cause per second: both ranks lost the save); communication: the all_reduces and rank 0's
  barrier waits; productive: each step's time from its batch's arrival to asking for the next, less
  its collectives and save (what was not waiting), of the steps that were not redone.

Each within 10 % or 1 s of the truth. MFU: the job's analytic FLOPs a step (truth.py's formula,
equal to what PyTorch's FlopCounterMode counts) × its steps a second in the window ÷ the declared
peak, within 15 %, and the same per step rate for both layouts.

Nothing here races the jobs: the deletion is driven by the job's own progress (conftest's
``delete_truth_rank``), and the figures are read after the Jobs completed.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.node_jobs import dump, pods_of

from .conftest import TRUTH_PEAK_FLOPS, Launched


@dataclass
class Process:
    rank: int
    start: float
    container: float
    first: float | None = None
    end: float | None = None
    resumed_from: int = 0
    flops: float = 0.0
    steps: list[dict[str, Any]] = field(default_factory=list)


def _processes(shared: Path) -> list[Process]:
    """Every process truth.py ran, from its truth file (one a process), by start."""
    out = []
    for path in sorted(shared.glob("truth-*.jsonl")):
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        head = records[0]
        proc = Process(
            int(head["rank"]), float(head["at"]), float(head["container"]), flops=float(head["flops"])
        )
        for r in records[1:]:
            if r["kind"] == "first":
                proc.first = float(r["at"])
            elif r["kind"] == "resume":
                proc.resumed_from = int(r["step"])
            elif r["kind"] == "step":
                proc.steps.append(r)
            elif r["kind"] == "exit":
                proc.end = float(r["at"])  # SIGTERM, the peer's failure, or done after the tail
        out.append(proc)
    return sorted(out, key=lambda p: p.start)


def _truth(processes: list[Process], world: int = 2) -> dict[str, float]:
    """The job's seconds by use, in the status' units (see the module docstring)."""
    by_rank: dict[int, list[Process]] = {}
    for p in processes:
        by_rank.setdefault(p.rank, []).append(p)
    seconds = dict.fromkeys(
        ("startup", "restart", "dataWait", "checkpoint", "communication", "productive"), 0.0
    )
    for attempts in by_rank.values():
        first = attempts[0]
        assert first.first is not None, first
        seconds["startup"] += first.first - first.container  # the container's start to the first batch
        for old, new in itertools.pairwise(attempts):
            assert old.end is not None and new.first is not None, (old, new)
            seconds["restart"] += new.first - old.end
            redone = [
                v for s, v in zip(old.steps, _productive(old), strict=True) if s["step"] > new.resumed_from
            ]
            seconds["restart"] += sum(redone)
            seconds["productive"] -= sum(redone)
        for p in attempts:
            for s, productive in zip(p.steps, _productive(p), strict=True):
                seconds["dataWait"] += s["data"]
                # The barrier after a save: the rank that did not save waited for it there.
                behind = s["barrier"] if s["save"] == 0 else 0.0
                seconds["checkpoint"] += s["save"] + behind
                seconds["communication"] += s["reduce"] + s["barrier"] - behind
                seconds["productive"] += productive
    return {k: v / world for k, v in seconds.items()}


def _productive(p: Process) -> list[float]:
    """Each step's productive seconds as the job sees them: from its batch's arrival to asking for
    the next, less its all_reduce, save and barrier (the forward, backward, copies, the optimizer,
    its own logging: what was not waiting); the last step's: its compute."""
    out = []
    for s, after in itertools.zip_longest(p.steps, p.steps[1:]):
        if after is None:
            out.append(s["compute"])
        else:
            out.append(max(0.0, after["asked"] - s["got"] - s["reduce"] - s["save"] - s["barrier"]))
    return out


def _final_status(launched: Launched, scenario: str, after: float) -> dict[str, Any]:
    """The profile's latest status with goodput, once a window after ``after`` (Unix s) passed
    with no change of it (the Jobs ended; their last scrapes are in)."""
    history = launched.history.setdefault(launched.ns(scenario), [])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with_goodput = [s for s in history if s.get("goodput")]
        if with_goodput and time.time() > after + 25:
            return with_goodput[-1]
        time.sleep(1)
    raise AssertionError(f"{scenario}: no goodput in the status history: {history[-1:]}")


def _job_done(launched: Launched, scenario: str) -> float:
    ns = launched.ns(scenario)
    launched.node.kubectl(
        "-n", ns, "wait", "--for=condition=Complete", "job/truth", "--timeout=480s", timeout_s=490
    )
    return time.time()


def _close(measured: float, truth: float, what: str, status: dict[str, Any], t: dict[str, float]) -> None:
    tolerance = max(0.10 * abs(truth), 1.0)
    assert abs(measured - truth) <= tolerance, (
        f"{what}: status {measured:.2f} s, the job's own {truth:.2f} s (tolerance {tolerance:.2f});"
        f" truth {json.dumps({k: round(v, 2) for k, v in t.items()})};"
        f" goodput {json.dumps(status['goodput'])}"
    )


def _report(scenario: str, goodput: dict[str, Any], truth: dict[str, float]) -> None:
    """The figures side by side (shown with ``pytest -rP``; docs/testing.md quotes them)."""
    measured = {**goodput["badputSeconds"], "productive": goodput["productiveSeconds"]}
    print(f"{scenario}: status / the job's own, s: " + ", ".join(
        f"{k} {measured[k]:.2f} / {v:.2f}" for k, v in truth.items() if k in measured
    ))  # fmt: skip


def _rate(processes: list[Process], end: float, window: float) -> float:
    """Rank 0's steps a second in (end - window, end], from its own step times."""
    steps = [s for p in processes if p.rank == 0 for s in p.steps if end - window < s["at"] <= end]
    return len(steps) / window


def _mfu_ratios(
    launched: Launched, scenario: str, processes: list[Process]
) -> tuple[list[float], list[float]]:
    """Per window with an MFU: the status' MFU over the job's own (analytic FLOPs × its rate ÷
    the peak), and the status' MFU per step a second (FLOPs a step ÷ peak, whatever the rate)."""
    from dam_operator.cluster.steps.goodput import parse_time

    flops = processes[0].flops
    # Windows that the job's steps filled (a window it started or ended in, or restarted in,
    # holds its start-up or tail: its rate is the product's over some other span).
    spans = [(p.steps[0]["got"], p.steps[-1]["at"]) for p in processes if p.rank == 0 and p.steps]
    against_truth, per_rate = [], []
    for status in launched.history.get(launched.ns(scenario), []):
        metrics = status.get("metrics") or {}
        at = parse_time(status.get("lastEvaluationTime"))
        if metrics.get("mfu") is None or not metrics.get("stepsPerSecond") or at is None:
            continue
        if not any(begin + 1.0 <= at - WINDOW_SECONDS and at <= end for begin, end in spans):
            continue
        own = _rate(processes, at, WINDOW_SECONDS)
        if own > 0:
            against_truth.append(metrics["mfu"] / (flops * own / TRUTH_PEAK_FLOPS))
        per_rate.append(metrics["mfu"] / metrics["stepsPerSecond"])
    return against_truth, per_rate


WINDOW_SECONDS = 10.0
"""The scenarios' profiles' windowSeconds (tests/support/node_jobs.profile)."""


@contextlib.contextmanager
def explained(launched: Launched, scenario: str) -> Iterator[None]:
    """On a failure: the namespace (test_node_scenarios' dump), the deletion, and what each of the
    job's processes logged, summed."""
    try:
        yield
    except BaseException:
        dump(launched.node, launched.ns(scenario))
        print(f"deletion: {launched.deletion}")
        for p in _processes(launched.rendezvous / scenario):
            sums = {
                k: round(sum(s[k] for s in p.steps), 2)
                for k in ("data", "compute", "reduce", "save", "barrier")
            }
            print(f"rank {p.rank} start {p.start:.1f} first {p.first} end {p.end} from {p.resumed_from}: "
                  f"{len(p.steps)} steps {sums}")  # fmt: skip
        raise


def check_two_pods(scenarios: Launched) -> None:
    """The two-Pod job, one deleted mid-run (``test_two_pods_one_deleted_mid_run_...``)."""
    done = _job_done(scenarios, "truth")
    assert "error" not in scenarios.deletion and scenarios.deletion.get("pod"), scenarios.deletion
    status = _final_status(scenarios, "truth", done)
    processes = _processes(scenarios.rendezvous / "truth")
    assert sorted(p.rank for p in processes) == [0, 0, 1, 1], [(p.rank, p.start) for p in processes]
    truth = _truth(processes)
    goodput = status["goodput"]
    _report("truth", goodput, truth)
    assert goodput["restarts"] == 2, goodput  # both ranks: rank 1 deleted, rank 0 failed with it
    for key in ("startup", "restart", "dataWait", "checkpoint", "communication"):
        _close(goodput["badputSeconds"][key], truth[key], key, status, truth)
    _close(goodput["productiveSeconds"], truth["productive"], "productive", status, truth)
    against_truth, _ = _mfu_ratios(scenarios, "truth", processes)
    assert len(against_truth) >= 2, scenarios.history.get(scenarios.ns("truth"), [])[-1:]
    assert statistics.median(against_truth) == pytest.approx(1.0, abs=0.15), against_truth
    (replacement,) = [
        p
        for p in pods_of(scenarios.node, scenarios.ns("truth"), "truth")
        if p["metadata"]["annotations"].get("batch.kubernetes.io/job-completion-index") == "1"
        and p["status"]["phase"] == "Succeeded"
    ]
    assert replacement["metadata"]["name"] != scenarios.deletion["pod"]


def check_one_pod(scenarios: Launched) -> None:
    """torchrun's two ranks in one Pod (``test_one_pod_of_torchrun_ranks_...``)."""
    done = _job_done(scenarios, "truth-1pod")
    status = _final_status(scenarios, "truth-1pod", done)
    processes = _processes(scenarios.rendezvous / "truth-1pod")
    assert sorted(p.rank for p in processes) == [0, 1], [(p.rank, p.start) for p in processes]
    truth = _truth(processes)
    goodput = status["goodput"]
    _report("truth-1pod", goodput, truth)
    assert goodput["restarts"] == 0, goodput
    for key in ("startup", "dataWait", "checkpoint", "communication"):
        _close(goodput["badputSeconds"][key], truth[key], key, status, truth)
    _close(goodput["productiveSeconds"], truth["productive"], "productive", status, truth)
    against_truth, per_rate = _mfu_ratios(scenarios, "truth-1pod", processes)
    assert against_truth, scenarios.history.get(scenarios.ns("truth-1pod"), [])[-1:]
    assert statistics.median(against_truth) == pytest.approx(1.0, abs=0.15), against_truth
    _, two_pods = _mfu_ratios(scenarios, "truth", _processes(scenarios.rendezvous / "truth"))
    assert two_pods, "the two-Pod layout had no MFU"
    assert statistics.median(per_rate) == pytest.approx(statistics.median(two_pods), rel=0.15), (
        per_rate,
        two_pods,
    )
