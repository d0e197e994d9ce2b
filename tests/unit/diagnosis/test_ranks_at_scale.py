"""A job of 8,000 ranks (1,000 pods x 8): the straggler found, the worst ranks named, the rest counted.

The ranks are built with known figures and a few of them planted late or slow, so that what the
engine must name is known before it runs; the status it writes must stay far under the API
server's 1.5 MiB object limit whatever the rank count (here: under 64 KiB).
"""

from __future__ import annotations

import json
import random
import statistics

import pytest

from dam_operator.diagnosis.engine import diagnose
from dam_operator.diagnosis.model import Observation, RankId, Thresholds
from dam_operator.diagnosis.progress import RankPlace, StallSettings, judge
from dam_operator.diagnosis.ranks import MAX_RANK_FIGURES, _median_without, find_straggler
from dam_operator.diagnosis.window import aggregate

PODS, PER_POD = 1000, 8
STATUS_BOUND = 64 * 1024
STEP = 0.25  # seconds
WINDOW = 30.0


def _rank_id(global_rank: int) -> RankId:
    return RankId(f"train-{global_rank // PER_POD:04d}", global_rank)


def _rank(collective_ratio: float | None, wait: float, rate: float = 1 / STEP) -> Observation:
    steps = rate * WINDOW
    return Observation(
        window_seconds=WINDOW,
        steps=steps,
        steps_per_second=rate,
        mean_step_seconds=1 / rate,
        data_wait_ratio=wait,
        collective_seconds=None if collective_ratio is None else collective_ratio * WINDOW,
        collective_exposed_seconds=None if collective_ratio is None else collective_ratio * WINDOW / 2,
        collective_ratio=collective_ratio,
        exposed_communication_ratio=None if collective_ratio is None else collective_ratio / 2,
        gpu_utilization=0.97,
        gpu_count=1,
        ranks=1,
    )


def _status_bytes(ranks: dict[RankId, Observation]) -> tuple[dict[str, object], int]:
    job = aggregate({k.pod: o for k, o in ranks.items()}, ranks=ranks)
    status = diagnose(job, Thresholds(), None, ranks=ranks).to_status()
    return status, len(json.dumps(status, separators=(",", ":")).encode())


def test_a_synchronous_job_of_8000_ranks_names_its_8_latest_ranks_and_counts_the_rest() -> None:
    rng = random.Random(7)
    planted = rng.sample(range(PODS * PER_POD), MAX_RANK_FIGURES)
    ranks: dict[RankId, Observation] = {}
    for g in range(PODS * PER_POD):
        if g in planted:
            # The later it arrives, the less it waits in collectives: planted[0] is the latest.
            lateness = planted.index(g)
            ranks[_rank_id(g)] = _rank(0.01 + 0.002 * lateness, 0.30)
        else:
            ranks[_rank_id(g)] = _rank(0.30 + 0.04 * rng.random(), 0.02)
    status, size = _status_bytes(ranks)
    metrics = status["metrics"]
    assert isinstance(metrics, dict)
    listed = [(r["pod"], r["rank"]) for r in metrics["ranks"]]
    assert listed == [(_rank_id(g).pod, g) for g in planted]  # the latest first, in order
    assert metrics["rankCount"] == PODS * PER_POD  # the 7,992 not listed are counted
    straggler = status["bottleneck"]["straggler"]  # type: ignore[index]
    assert (straggler["pod"], straggler["rank"], straggler["cause"]) == (
        _rank_id(planted[0]).pod,
        planted[0],
        "Data",
    )
    assert size < STATUS_BOUND, size


def test_an_independent_job_of_8000_ranks_names_the_slow_one_against_the_median_of_the_others() -> None:
    rng = random.Random(11)
    rates = {g: 4.0 + 0.2 * rng.random() for g in range(PODS * PER_POD)}
    slow = 4321
    rates[slow] = 1.5
    ranks = {_rank_id(g): _rank(None, 0.02, rate) for g, rate in rates.items()}
    found = find_straggler(ranks, Thresholds())
    assert found is not None and (found.pod, found.rank) == (_rank_id(slow).pod, slow)
    others = statistics.median(r for g, r in rates.items() if g != slow)
    assert f"vs a median of {others:.2f} steps/s for the other 7999 ranks" in found.evidence[0]
    _, size = _status_bytes(ranks)
    assert size < STATUS_BOUND, size


@pytest.mark.parametrize("n", [2, 3, 4, 5, 10, 101])
def test_the_median_without_one_value_is_the_median_of_the_others(n: int) -> None:
    rng = random.Random(n)
    values = [round(rng.random(), 1) for _ in range(n)]  # ties too
    ordered = sorted(values)
    for i, v in enumerate(values):
        assert _median_without(ordered, v) == pytest.approx(statistics.median(values[:i] + values[i + 1 :]))
    assert _median_without([1.0], 1.0) is None


def test_a_stall_of_8000_ranks_names_the_one_that_never_reached_the_collective_and_counts_the_waiting() -> (
    None
):
    now_ns = 2_000_000_000 * 10**9
    last_ns = now_ns - 900 * 10**9  # no batch for 15 minutes
    behind = 6007
    places = [
        RankPlace(
            pod=_rank_id(g).pod,
            rank=g,
            steps=1000,
            step_seconds=250.0,
            last_batch_ns=last_ns,
            running=True,
            entered=41 if g == behind else 42,
            place="dataloader" if g == behind else "collective",
            detail="" if g == behind else "all_reduce #42",
        )
        for g in range(PODS * PER_POD)
    ]
    progress = judge(places, now_ns, StallSettings())
    assert progress.state == "Stalled"
    assert progress.culprit is not None and (progress.culprit.pod, progress.culprit.rank) == (
        _rank_id(behind).pod,
        behind,
    )
    assert progress.culprit.where == "dataloader"
    assert progress.waiting is not None and progress.waiting.ranks == PODS * PER_POD - 1  # a count, no list
    wire = progress.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert len(json.dumps(wire)) < 4096
