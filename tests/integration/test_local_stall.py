"""`dam run --stall-after S --on-stall {report,exit}` on jobs that stop making progress (issue 29).

Real PyTorch, nothing mocked in the jobs: two ranks under torchrun on gloo where rank 1 sleeps
before an ``all_reduce`` (the others wait in it), a DataLoader worker blocked for good, a
``torch.save`` into a FIFO nobody reads (it never returns), and a healthy job that pauses (a first
step that takes 20 s, as a compilation does, then a 20-second pass without batches). Every job is
started at once by the module's fixture, each under its own `dam run`, and each test waits for its
own: the module takes its longest job, not their sum.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_local_multirank import TORCHRUN

REPO = Path(__file__).resolve().parents[2]
DAM = [sys.executable, "-m", "dam_operator.cli", "run", "--interval", "0.5", "--window", "3"]

SKIPPED_COLLECTIVE = textwrap.dedent(
    """
    import os, sys, time, torch, torch.distributed as dist
    from torch.utils.data import DataLoader

    def stall_here():
        print(f"stalling at {time.time():.3f}", file=sys.stderr, flush=True)
        time.sleep(3600)  # rank 1 takes another code path: it never enters the next all_reduce

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.nn.Linear(16, 16)
    for step, x in enumerate(DataLoader(torch.randn(4000, 16), batch_size=8), start=1):
        model(x).sum().backward()
        if rank == 1 and step == 20:
            stall_here()
        t = torch.ones(4)
        dist.all_reduce(t)
        time.sleep(0.02)
    """
)

BLOCKED_WORKER = textwrap.dedent(
    """
    import sys, time, torch
    from torch.utils.data import DataLoader, Dataset

    class Blocks(Dataset):
        def __len__(self):
            return 100_000
        def __getitem__(self, i):
            if i == 40 * 4:  # batch 40's first sample: its worker blocks for good (a dead file system)
                print(f"stalling at {time.time():.3f}", file=sys.stderr, flush=True)
                time.sleep(3600)
            time.sleep(0.002)
            return torch.ones(8)

    if __name__ == "__main__":
        model = torch.nn.Linear(8, 1)
        for x in DataLoader(Blocks(), batch_size=4, num_workers=2):
            model(x).sum().backward()
    """
)

STUCK_SAVE = textwrap.dedent(
    """
    import os, sys, time, torch
    from torch.utils.data import DataLoader

    fifo = sys.argv[1]
    os.mkfifo(fifo)
    model = torch.nn.Linear(8, 8)
    for step, x in enumerate(DataLoader(torch.randn(4000, 8), batch_size=4), start=1):
        model(x).sum().backward()
        if step == 30:
            print(f"stalling at {time.time():.3f}", file=sys.stderr, flush=True)
            torch.save(model.state_dict(), fifo)  # a FIFO nobody reads: open() never returns
        time.sleep(0.01)
    """
)

PAUSES = textwrap.dedent(
    """
    import time, torch
    from torch.utils.data import DataLoader

    model = torch.nn.Linear(8, 8)
    data = DataLoader(torch.randn(160, 8), batch_size=4)
    for epoch in range(2):
        for step, x in enumerate(data):
            if epoch == 0 and step == 0:
                time.sleep(20)  # the first step compiles for 20 s
            model(x).sum().backward()
            time.sleep(0.02)
        if epoch == 0:
            deadline = time.monotonic() + 20  # a 20-second pass of work with no batch (validation)
            while time.monotonic() < deadline:
                model(torch.randn(64, 8)).sum()
                time.sleep(0.01)
    print("trained")
    """
)


@dataclass
class Job:
    proc: subprocess.Popen[str]
    started: float

    def result(self, timeout_s: float) -> tuple[int, dict[str, Any], str, float]:
        """(exit code, the JSON verdict, stderr, when it ended)."""
        out, err = self.proc.communicate(timeout=timeout_s)
        ended = time.time()
        return self.proc.returncode, json.loads(out), err, ended


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Job]]:
    tmp = tmp_path_factory.mktemp("stall")
    scripts = {
        "collective": SKIPPED_COLLECTIVE,
        "worker": BLOCKED_WORKER,
        "save": STUCK_SAVE,
        "pauses": PAUSES,
    }
    for name, source in scripts.items():
        (tmp / f"{name}.py").write_text(source)
    commands = {
        "collective": [*DAM, "--json", "--stall-after", "30", "--on-stall", "exit", "--", *TORCHRUN],
        "worker": [*DAM, "--json", "--stall-after", "10", "--on-stall", "exit", "--", sys.executable],
        "save": [*DAM, "--json", "--stall-after", "10", "--on-stall", "exit", "--", sys.executable],
        "pauses": [*DAM, "--json", "--", sys.executable],
        "pauses-15": [*DAM, "--json", "--stall-after", "15", "--", sys.executable],
    }
    extra = {"save": [str(tmp / "checkpoint.fifo")]}
    started: dict[str, Job] = {}
    for name, command in commands.items():
        script = tmp / f"{name.split('-')[0]}.py"
        proc = subprocess.Popen(
            [*command, str(script), *extra.get(name, [])],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        started[name] = Job(proc, time.time())
    try:
        yield started
    finally:
        for job in started.values():
            if job.proc.poll() is None:
                job.proc.kill()
                job.proc.communicate()


def _stall_start(stderr: str) -> float:
    match = re.search(r"stalling at ([0-9.]+)", stderr)
    assert match, stderr[-3000:]
    return float(match.group(1))


@pytest.mark.timeout(240)
def test_a_rank_that_skips_a_collective_is_named_with_its_frame_and_the_other_waits_in_it(
    jobs: dict[str, Job],
) -> None:
    code, doc, err, ended = jobs["collective"].result(200)
    assert code == 3, err[-3000:]
    progress = doc["progress"]
    assert progress["state"] == "Stalled", progress
    assert ended - _stall_start(err) <= 75, (ended, err[-2000:])  # named within 75 s, a 30 s floor
    assert progress["stalledSeconds"] >= 30, progress
    culprit = progress["culprit"]
    assert culprit["rank"] == 1 and culprit["where"] == "user-code", culprit
    lines = SKIPPED_COLLECTIVE.splitlines()
    line = next(i for i, text in enumerate(lines, start=1) if "time.sleep(3600)" in text)
    assert f"collective.py:{line} stall_here" in culprit["frames"], culprit
    waiting = progress["waiting"]
    # Rank 0 entered all_reduce #20 (its 20th timed collective) and waits there for rank 1.
    assert waiting == {"ranks": 1, "where": "collective", "detail": "all_reduce #20"}, waiting
    assert "rank 1 in user-code" in err and "waiting in collective all_reduce #20" in err, err[-2000:]


@pytest.mark.timeout(240)
def test_a_loader_worker_blocked_for_good_is_named_with_the_batch_it_owes(jobs: dict[str, Job]) -> None:
    code, doc, err, ended = jobs["worker"].result(200)
    assert code == 3, err[-3000:]
    progress = doc["progress"]
    assert progress["state"] == "Stalled" and ended - _stall_start(err) <= 45, (progress, err[-2000:])
    culprit = progress["culprit"]
    assert culprit["where"] == "dataloader", culprit
    # Batch 40 went to worker 0 (DataLoader hands batches out round robin); it is alive, blocked.
    assert re.fullmatch(r"worker 0 pid \d+ alive, batch 40", culprit["detail"]), culprit
    assert any("worker.py" in f for f in culprit["frames"]), culprit


@pytest.mark.timeout(240)
def test_a_save_that_never_returns_is_named_as_the_checkpoint(jobs: dict[str, Job]) -> None:
    code, doc, err, ended = jobs["save"].result(200)
    assert code == 3, err[-3000:]
    progress = doc["progress"]
    assert progress["state"] == "Stalled" and ended - _stall_start(err) <= 45, (progress, err[-2000:])
    assert progress["culprit"]["where"] == "checkpoint", progress
    assert any(f.startswith("save.py:") for f in progress["culprit"]["frames"]), progress


@pytest.mark.timeout(240)
def test_a_healthy_job_that_pauses_raises_no_alarm_with_the_defaults(jobs: dict[str, Job]) -> None:
    code, doc, err, _ = jobs["pauses"].result(200)
    assert code == 0 and "trained" in err, err[-3000:]
    assert doc["progress"]["state"] == "Progressing", doc["progress"]
    assert "stalled" not in err, err[-2000:]
    # The same job with a 15 s floor: the 20 s first step (no step finished yet) is no stall; the
    # 20 s pass without a batch is one, and its end is said too.
    code, doc, err, _ = jobs["pauses-15"].result(200)
    assert code == 0, err[-3000:]
    stalls = [line for line in err.splitlines() if re.match(r"dam: +\d+s  stalled", line)]
    assert len(stalls) == 1, err[-3000:]
    assert int(re.match(r"dam: +(\d+)s", stalls[0]).group(1)) > 35, stalls  # type: ignore[union-attr]
    assert "the stall ended" in err, err[-2000:]
    assert doc["progress"]["state"] == "Progressing", doc["progress"]
