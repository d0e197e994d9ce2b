"""PyTorch Lightning under the real ``dam run`` / ``dam tune``: ``Trainer.fit`` iterates a torch
DataLoader that the user's ``LightningDataModule`` builds; the probe's hook on torch's
DataLoader iterator sees its batches with no code change (jobs/lightning_job.py)."""

from __future__ import annotations

import pytest

from tests.support.frameworks import (
    PY,
    RUN,
    assert_input_bound,
    assert_not_data_bound_with_two_workers,
    assert_rank_one_is_a_data_straggler,
    dam,
    dam_tune,
    job,
    require,
    tail,
    trained_steps,
)


@pytest.fixture(autouse=True)
def _lightning() -> None:
    require("lightning")


def test_a_lightning_job_whose_samples_are_slow_is_input_bound_and_told_to_add_workers() -> None:
    proc = dam("run", *RUN, "--", PY, job("lightning_job.py"), "--delay", "0.01", "--seconds", "5")
    assert_input_bound(proc)
    assert trained_steps(proc.stderr)[0] > 10, tail(proc.stderr)


def test_a_lightning_job_with_cheap_samples_and_workers_is_not_data_bound() -> None:
    proc = dam(
        "run", *RUN, "--", PY, job("lightning_job.py"), "--compute", "--workers", "2", "--seconds", "5"
    )
    assert_not_data_bound_with_two_workers(proc)  # workerCount 2: Lightning's loader workers were seen


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_lightning_ddp_on_two_gloo_ranks_names_the_rank_with_the_slow_loader_as_a_data_straggler() -> None:
    # Lightning's own launcher: this process is rank 0 and starts rank 1 as a child (the same
    # script, LOCAL_RANK=1), which inherits the probe through PYTHONPATH. Rank 1's loader is slow.
    proc = dam(
        "run",
        *RUN,
        "--",
        PY,
        job("lightning_job.py"),
        "--devices",
        "2",
        "--slow-rank",
        "1",
        "--delay",
        "0.01",
        "--seconds",
        "6",
    )
    assert_rank_one_is_a_data_straggler(proc)


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_dam_tune_raises_num_workers_of_a_lightning_loader_and_measures_the_gain() -> None:
    # The overrides reach the DataLoader that the LightningDataModule builds (dam tune restarts
    # the job with DAM_LOADER_OVERRIDES; the probe rewrites DataLoader.__init__'s arguments).
    doc = dam_tune(PY, job("lightning_job.py"), "--delay", "0.004", "--seconds", "60", budget=75, timeout=140)
    base, best = doc["baseline"], doc["best"]
    assert base["settings"] == {"num_workers": 0}, doc
    assert base["dataWaitRatio"] > 0.5, doc
    assert doc["applied"].get("num_workers", 0) >= 2, doc
    assert best["settings"]["num_workers"] == doc["applied"]["num_workers"], doc
    assert best["stepsPerSecond"] >= 1.5 * base["stepsPerSecond"], doc
