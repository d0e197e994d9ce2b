"""torchdata's ``StatefulDataLoader`` under the real ``dam run`` / ``dam tune``.

Its iterators subclass torch's ``_BaseDataLoaderIter`` and inherit the probe's timed
``__next__``: its batches are measured as a DataLoader's. Its ``__init__`` is its own (it
never calls DataLoader's), so the DataLoader overrides reach it through a patch of its own
module, and they never change its ``num_workers``: the count is part of its ``state_dict()``
(jobs/stateful_loader_job.py).
"""

from __future__ import annotations

import re

import pytest

from tests.support.frameworks import (
    PY,
    RUN,
    assert_input_bound,
    dam,
    dam_tune,
    job,
    require,
    tail,
    verdict_of,
)


@pytest.fixture(autouse=True)
def _torchdata() -> None:
    require("torchdata")


def test_a_stateful_loader_whose_samples_are_slow_is_input_bound_and_told_to_add_workers() -> None:
    proc = dam("run", *RUN, "--", PY, job("stateful_loader_job.py"), "--delay", "0.01", "--seconds", "5")
    assert_input_bound(proc)


def test_the_overrides_reach_a_stateful_loader_but_leave_its_worker_count_as_its_checkpoints_need_it() -> (
    None
):
    overrides = '{"version":1,"num_workers":4,"prefetch_factor":4}'
    proc = dam(
        "run",
        *RUN,
        "--",
        PY,
        job("stateful_loader_job.py"),
        "--workers",
        "2",
        "--seconds",
        "2",
        env={"DAM_LOADER_OVERRIDES": overrides},
    )
    verdict_of(proc)
    said = [line for line in proc.stderr.splitlines() if line.startswith("dam-probe: StatefulDataLoader at")]
    assert len(said) == 1, tail(proc.stderr)
    assert re.search(
        r"stateful_loader_job\.py:\d+: prefetch_factor None → 4; num_workers not applied", said[0]
    )
    assert "keeps num_workers in its state_dict()" in said[0]
    assert re.search(r"trained \d+ steps with 2 workers, prefetch 4", proc.stderr), tail(proc.stderr)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_dam_tune_stops_at_a_stateful_loader_and_says_why_its_workers_stay() -> None:
    command = (PY, job("stateful_loader_job.py"), "--delay", "0.004", "--seconds", "60")
    doc = dam_tune(*command, budget=60, timeout=100)
    assert doc["baseline"]["dataWaitRatio"] > 0.5, doc
    assert doc["applied"] == {}, doc
    assert "could not set num_workers=1" in doc["reason"], doc
    assert "StatefulDataLoader keeps num_workers in its state_dict()" in doc["reason"], doc
