"""Hugging Face ``transformers.Trainer`` under the real ``dam run``: the Trainer hands its
DataLoader to accelerate, whose ``DataLoaderShard`` wraps a torch DataLoader and iterates it (one
batch ahead); the probe's hook on torch's DataLoader iterator sees those batches with no code
change (jobs/hf_trainer_job.py: a tiny BERT built from its config, offline, synthetic tokens)."""

from __future__ import annotations

import re

import pytest

from tests.support.frameworks import PY, TORCHRUN, dam, explain, job, require, tail, verdict_of

RUN = ("--json", "--interval", "0.5", "--window", "3")


@pytest.fixture(autouse=True)
def _transformers() -> None:
    require("transformers", "accelerate")


def trained_steps(stderr: str) -> dict[int, int]:
    """Rank -> steps, from each rank's last line (the job's own count, independent of the probe)."""
    return {int(r): int(n) for n, r in re.findall(r"trained (\d+) steps on rank (\d+)", stderr)}


def test_a_trainer_job_whose_samples_are_slow_is_input_bound_and_told_to_add_workers() -> None:
    proc = dam("run", *RUN, "--", PY, job("hf_trainer_job.py"), "--delay", "0.01", "--seconds", "5")
    doc = verdict_of(proc)
    b, m = doc["bottleneck"], doc["metrics"]
    assert b["axis"] == "Data", explain(doc, proc)
    assert b["regime"] == "input-bound", explain(doc, proc)
    assert b["lever"] == "increase-dataloader-workers", explain(doc, proc)
    assert m["dataWaitRatio"] > 0.5, explain(doc, proc)
    assert m["stepsPerSecond"] > 1, explain(doc, proc)
    assert trained_steps(proc.stderr)[0] > 10, tail(proc.stderr)


def test_a_trainer_job_with_cheap_samples_and_workers_is_not_data_bound() -> None:
    proc = dam(
        "run", *RUN, "--", PY, job("hf_trainer_job.py"), "--compute", "--workers", "2", "--seconds", "5"
    )
    doc = verdict_of(proc)
    b, m = doc["bottleneck"], doc["metrics"]
    assert b["axis"] == "Machine", explain(doc, proc)  # a CPU-only machine: the CPU does the arithmetic
    assert b["regime"] != "input-bound", explain(doc, proc)
    assert m["dataWaitRatio"] < 0.1, explain(doc, proc)
    assert m["stepsPerSecond"] > 1, explain(doc, proc)
    assert m.get("workerCount") == 2, explain(doc, proc)  # the Trainer's dataloader_num_workers=2


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
    doc = verdict_of(proc)
    ranks = {r["rank"]: r for r in doc.get("ranks", [])}
    assert set(ranks) == {0, 1}, explain(doc, proc)
    assert ranks[1]["dataWaitRatio"] > ranks[0]["dataWaitRatio"] + 0.2, doc["ranks"]
    straggler = doc["bottleneck"].get("straggler")
    assert straggler is not None, explain(doc, proc)
    assert straggler["rank"] == 1, straggler
    assert straggler["cause"] == "Data", straggler
    assert straggler["evidence"], straggler
    assert doc["bottleneck"]["axis"] == "Data", explain(doc, proc)
    assert set(trained_steps(proc.stderr)) == {0, 1}, tail(proc.stderr)
