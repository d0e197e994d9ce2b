"""PyTorch Lightning under the real ``dam run`` / ``dam tune``: ``Trainer.fit`` iterates a torch
DataLoader that the user's ``LightningDataModule`` builds; the probe's hook on torch's
DataLoader iterator sees its batches with no code change (jobs/lightning_job.py)."""

from __future__ import annotations

import json
import re

import pytest

from tests.support.frameworks import PY, dam, explain, job, require, tail, verdict_of

RUN = ("--json", "--interval", "0.5", "--window", "3")


@pytest.fixture(autouse=True)
def _lightning() -> None:
    require("lightning")


def trained_steps(stderr: str) -> dict[int, int]:
    """Rank -> steps, from each rank's last line (the job's own count, independent of the probe)."""
    return {int(r): int(n) for n, r in re.findall(r"trained (\d+) steps on rank (\d+)", stderr)}


def test_a_lightning_job_whose_samples_are_slow_is_input_bound_and_told_to_add_workers() -> None:
    proc = dam("run", *RUN, "--", PY, job("lightning_job.py"), "--delay", "0.01", "--seconds", "5")
    doc = verdict_of(proc)
    b, m = doc["bottleneck"], doc["metrics"]
    assert b["axis"] == "Data", explain(doc, proc)
    assert b["regime"] == "input-bound", explain(doc, proc)
    assert b["lever"] == "increase-dataloader-workers", explain(doc, proc)
    assert m["dataWaitRatio"] > 0.5, explain(doc, proc)
    assert m["stepsPerSecond"] > 1, explain(doc, proc)
    assert trained_steps(proc.stderr)[0] > 10, tail(proc.stderr)


def test_a_lightning_job_with_cheap_samples_and_workers_is_not_data_bound() -> None:
    proc = dam(
        "run", *RUN, "--", PY, job("lightning_job.py"), "--compute", "--workers", "2", "--seconds", "5"
    )
    doc = verdict_of(proc)
    b, m = doc["bottleneck"], doc["metrics"]
    assert b["axis"] == "Machine", explain(doc, proc)  # a CPU-only machine: the CPU does the arithmetic
    assert b["regime"] != "input-bound", explain(doc, proc)
    assert m["dataWaitRatio"] < 0.1, explain(doc, proc)
    assert m["stepsPerSecond"] > 1, explain(doc, proc)
    assert m.get("workerCount") == 2, explain(doc, proc)  # Lightning's loader workers were seen


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


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_dam_tune_raises_num_workers_of_a_lightning_loader_and_measures_the_gain() -> None:
    # The overrides reach the DataLoader that the LightningDataModule builds (dam tune restarts
    # the job with DAM_LOADER_OVERRIDES; the probe rewrites DataLoader.__init__'s arguments).
    proc = dam(
        "tune",
        "--json",
        "--budget",
        "75",
        "--window",
        "3",
        "--warmup",
        "1",
        "--interval",
        "0.5",
        "--",
        PY,
        job("lightning_job.py"),
        "--delay",
        "0.004",
        "--seconds",
        "60",
        timeout=140,
    )
    assert proc.returncode == 0, tail(proc.stderr)
    doc = json.loads(proc.stdout)
    base, best = doc["baseline"], doc["best"]
    assert base["settings"] == {"num_workers": 0}, doc
    assert base["dataWaitRatio"] > 0.5, doc
    assert doc["applied"].get("num_workers", 0) >= 2, doc
    assert best["settings"]["num_workers"] == doc["applied"]["num_workers"], doc
    assert best["stepsPerSecond"] >= 1.5 * base["stepsPerSecond"], doc
