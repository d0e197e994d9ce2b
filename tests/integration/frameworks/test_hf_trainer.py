"""Hugging Face ``transformers.Trainer`` under the real ``dam run``: the Trainer hands its
DataLoader to accelerate, whose ``DataLoaderShard`` wraps a torch DataLoader and iterates it (one
batch ahead); the probe's hook on torch's DataLoader iterator sees those batches with no code
change (jobs/hf_trainer_job.py: a tiny BERT built from its config, offline, synthetic tokens)."""

from __future__ import annotations

import pytest

from tests.support.frameworks import (
    PY,
    RUN,
    TORCHRUN,
    assert_input_bound,
    assert_not_data_bound_with_two_workers,
    assert_rank_one_is_a_data_straggler,
    dam,
    job,
    require,
    tail,
    trained_steps,
)


@pytest.fixture(autouse=True)
def _transformers() -> None:
    require("transformers", "accelerate")


def test_a_trainer_job_whose_samples_are_slow_is_input_bound_and_told_to_add_workers() -> None:
    proc = dam("run", *RUN, "--", PY, job("hf_trainer_job.py"), "--delay", "0.01", "--seconds", "5")
    assert_input_bound(proc)
    assert trained_steps(proc.stderr)[0] > 10, tail(proc.stderr)


def test_a_trainer_job_with_cheap_samples_and_workers_is_not_data_bound() -> None:
    proc = dam(
        "run", *RUN, "--", PY, job("hf_trainer_job.py"), "--compute", "--workers", "2", "--seconds", "5"
    )
    assert_not_data_bound_with_two_workers(proc)  # workerCount 2: the Trainer's dataloader_num_workers=2


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_trainer_ddp_under_torchrun_names_the_rank_with_the_slow_loader_as_a_data_straggler() -> None:
    # torchrun starts both ranks; the Trainer (accelerate) sets up gloo DDP and shards the data
    # with a DistributedSampler in each rank's DataLoaderShard. Rank 1's samples are slow.
    proc = dam(
        "run",
        *RUN,
        "--",
        *TORCHRUN,
        job("hf_trainer_job.py"),
        "--slow-rank",
        "1",
        "--delay",
        "0.01",
        "--seconds",
        "6",
    )
    assert_rank_one_is_a_data_straggler(proc)
