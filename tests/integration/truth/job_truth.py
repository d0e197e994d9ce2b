"""The truth the workload logged (``workloads/truth_job.py``), read back into the goodput's causes.

Every second of a rank's life has one cause, by the job's own clock:

- ``startup``: the first attempt's start to its first batch;
- ``dataWait``: the time each step blocked in ``next()`` on its loader;
- ``communication``: the time each step spent in its gradient all-reduce;
- ``checkpoint``: each save round, from the rank reaching it to the end of the barrier that
  follows (rank 0 saves for both; rank 1 waits in the barrier behind the save);
- ``restart``: the kill to the next attempt's first batch, plus the compute of the steps after
  the checkpoint the next attempt resumed from (redone, so not productive after all);
- ``productive``: every step's compute (forward, backward, update) less what the restart redid.

The job's figure is the mean over its ranks (``status.goodput``'s unit), as is the MFU's rate.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class RankTruth:
    startup: float
    data_wait: float
    communication: float
    checkpoint: float
    restart: float
    productive: float
    steps: int
    """Steps the rank took, the redone ones included."""
    first_batch: float
    last_step: float
    flops: int


CAUSES = ("startup", "data_wait", "communication", "checkpoint", "restart", "productive")
STATUS_KEYS = {"data_wait": "dataWait"}


def events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def rank_truth(log: list[dict[str, Any]], kill_wall: float) -> RankTruth:
    by = lambda ev, attempt=None: [  # noqa: E731
        e for e in log if e["ev"] == ev and (attempt is None or e["attempt"] == attempt)
    ]
    starts, firsts = by("start"), by("first_batch")
    steps = by("step")
    resumed = max(e["step"] for e in by("resume"))  # the step the last attempt resumed from
    redone = [e for e in by("step", 0) if e["step"] > resumed]
    restart = sum(f["wall"] for f in firsts[1:]) - kill_wall * (len(firsts) - 1)
    lost = sum(e["compute"] for e in redone)
    return RankTruth(
        startup=firsts[0]["wall"] - starts[0]["wall"],
        data_wait=sum(e["wait"] for e in steps),
        communication=sum(e["comm"] for e in steps),
        checkpoint=sum(e["end"] - e["start"] for e in by("save")),
        restart=restart + lost,
        productive=sum(e["compute"] for e in steps) - lost,
        steps=len(steps),
        first_batch=firsts[0]["wall"],
        last_step=max(e["end"] for e in steps),
        flops=starts[0]["flops"],
    )


def job_truth(out: Path, ranks: int = 2) -> tuple[dict[str, float], list[RankTruth]]:
    logs = [events(out / f"truth-{r}.jsonl") for r in range(ranks)]
    kills = [e["wall"] for log in logs for e in log if e["ev"] == "kill"]
    assert len(kills) == 1, f"one kill, found {kills}"
    truths = [rank_truth(log, kills[0]) for log in logs]
    mean = {c: statistics.fmean(getattr(t, c) for t in truths) for c in CAUSES}
    return mean, truths


def steps_per_second(truths: list[RankTruth], log: list[dict[str, Any]], warmup_seconds: float) -> float:
    """The job's rate over the span ``dam run``'s final verdict covers (docs/testing.md): from its
    first batch plus the warm-up that verdict skips (``warmup_seconds``, at most a fifth of the
    training) to its last step; the saves and the restart inside. ``log``: rank 0's events."""
    first = min(t.first_batch for t in truths)
    last = max(t.last_step for t in truths)
    start = first + min(warmup_seconds, 0.2 * (last - first))
    steps = [e for e in log if e["ev"] == "step" and e["end"] >= start]
    return len(steps) / (last - start)
