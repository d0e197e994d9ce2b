"""`dam run` goodput end to end: a real PyTorch job that declares nothing measures its own truth.

The job starts slowly (a sleep before the loop), waits on its loader (a dataset that sleeps per
sample) and saves synchronous checkpoints with ``torch.save`` every few steps; it writes the time
it spent in each to a file. ``dam run --json --peak-flops P`` must report each within 30 %, a
goodput ratio, the FLOPs of one step within 15 % of the MLP's known count, and an MFU that is
those FLOPs times the steps per second over P.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DAM = [sys.executable, "-m", "dam_operator.cli"]
PEAK = 1e12
BATCH = 16
WIDTHS = (128, 512, 512, 512, 16)

JOB = textwrap.dedent(
    """
    import json, sys, time
    T0 = time.time()  # the job's own start (the interpreter started a few ms before)
    time.sleep(SLEEP)  # a slow start: configuration, downloads, ...
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Samples(Dataset):
        def __len__(self): return 10_000
        def __getitem__(self, i):
            time.sleep(SAMPLE_SLEEP)
            return torch.randn(WIDTHS[0]), torch.randn(WIDTHS[-1])

    layers = []
    for a, b in zip(WIDTHS, WIDTHS[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    state = torch.randn(CKPT_FLOATS)  # what a checkpoint writes besides the weights
    truth = {"wait": 0.0, "checkpoint": 0.0, "saves": 0}
    it = iter(DataLoader(Samples(), batch_size=BATCH, num_workers=0))
    for step in range(STEPS):
        t = time.time()
        if step == 0:
            truth["startup"] = t - T0
        x, y = next(it)
        truth["wait"] += time.time() - t
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % EVERY == EVERY - 1:
            t = time.time()
            torch.save({"model": model.state_dict(), "state": state}, sys.argv[2])
            truth["checkpoint"] += time.time() - t
            truth["saves"] += 1
    with open(sys.argv[1], "w") as fh:
        json.dump(truth, fh)
    """
)


def _linear_flops() -> int:
    """The known count: 2·in·out per Linear and sample forward, three times that with the backward."""
    return 3 * 2 * BATCH * sum(a * b for a, b in itertools.pairwise(WIDTHS))


def _run(tmp_path: Path, **settings: object) -> tuple[dict[str, object], dict[str, float]]:
    header = "".join(f"{k} = {v!r}\n" for k, v in {"WIDTHS": WIDTHS, "BATCH": BATCH, **settings}.items())
    code = header + JOB
    script = tmp_path / "job.py"
    script.write_text(code)
    truth_file, ckpt = tmp_path / "truth.json", tmp_path / "ckpt.pt"
    proc = subprocess.run(
        [
            *DAM,
            *("run", "--json", "--peak-flops", str(PEAK), "--interval", "0.5", "--window", "3", "--"),
            *(sys.executable, str(script), str(truth_file), str(ckpt)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), json.loads(truth_file.read_text())


def test_a_job_that_declares_nothing_gets_its_badput_flops_and_mfu_measured(tmp_path: Path) -> None:
    doc, truth = _run(tmp_path, SLEEP=2.0, SAMPLE_SLEEP=0.0015, CKPT_FLOATS=4_000_000, EVERY=8, STEPS=120)
    goodput = doc["goodput"]
    assert isinstance(goodput, dict)
    bad = goodput["badputSeconds"]
    assert set(bad) == {"startup", "dataWait", "communication", "checkpoint", "restart", "other"}
    for key, measured in (("startup", "startup"), ("wait", "dataWait"), ("checkpoint", "checkpoint")):
        assert bad[measured] == pytest.approx(truth[key], rel=0.30), (measured, bad, truth)
    assert 0.0 < goodput["ratio"] < 1.0
    assert goodput["productiveSeconds"] == pytest.approx(goodput["ratio"] * goodput["elapsedSeconds"])
    assert goodput["acceleratorSecondsLost"] == 0.0  # a CPU-only job has no accelerator to lose
    metrics = doc["metrics"]
    assert isinstance(metrics, dict)
    assert metrics["flopsPerStepSource"] == "measured"
    assert metrics["flopsPerStep"] == pytest.approx(_linear_flops(), rel=0.15)
    assert metrics["mfu"] == pytest.approx(
        metrics["flopsPerStep"] * metrics["stepsPerSecond"] / PEAK, rel=1e-6
    )


def test_a_job_whose_checkpoints_dominate_is_checkpoint_bound(tmp_path: Path) -> None:
    doc, truth = _run(tmp_path, SLEEP=0.0, SAMPLE_SLEEP=0.0, CKPT_FLOATS=25_000_000, EVERY=20, STEPS=400)
    bottleneck = doc["bottleneck"]
    assert isinstance(bottleneck, dict)
    assert bottleneck["regime"] == "checkpoint-bound", bottleneck
    assert (bottleneck["axis"], bottleneck["boundary"], bottleneck["lever"]) == (
        "Machine",
        "Data",
        "async-checkpoint",
    )
    assert {"faster-accelerator", "more-loader-workers"} <= set(bottleneck["avoid"])
    goodput = doc["goodput"]
    assert isinstance(goodput, dict)
    assert goodput["badputSeconds"]["checkpoint"] == pytest.approx(truth["checkpoint"], rel=0.30)
