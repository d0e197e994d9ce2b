"""`dam tune` end to end: real PyTorch training scripts, restarted with DataLoader overrides."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DAM = [sys.executable, "-m", "dam_operator.cli"]

# A map-style dataset whose __getitem__ sleeps (I/O or decode latency), loaded in the main
# process: the textbook input-bound job. It runs until it is stopped (at most a minute).
STARVED = textwrap.dedent(
    """
    import time, torch
    from torch.utils.data import DataLoader, Dataset

    class Slow(Dataset):
        def __len__(self):
            return 1_000_000
        def __getitem__(self, i):
            time.sleep(0.004)
            return torch.ones(8)

    if __name__ == "__main__":
        model = torch.nn.Linear(8, 1)
        deadline = time.monotonic() + 60
        for x in DataLoader(Slow(), batch_size=8, num_workers=0):
            model(x).sum().backward()
            if time.monotonic() > deadline:
                break
    """
)

# In-memory data and a model that keeps the CPU busy: the loader is not the limit.
COMPUTE = textwrap.dedent(
    """
    import time, torch
    from torch.utils.data import DataLoader, TensorDataset

    if __name__ == "__main__":
        torch.set_num_threads(1)
        data = TensorDataset(torch.randn(4096, 512))
        model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 512))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for (x,) in DataLoader(data, batch_size=64, num_workers=0):
                model(x).sum().backward()
                if time.monotonic() > deadline:
                    break
    """
)

FAST = ("--window", "3", "--warmup", "1", "--interval", "0.5")


def dam_tune(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``dam tune ARGS``; its last argument is the job's script. A ``dam tune`` killed at the
    timeout leaves its job running (the job has its own session): those processes are killed
    too, so that one overrun does not load the machine for the tests after it."""
    try:
        return subprocess.run(
            [*DAM, "tune", *args], capture_output=True, text=True, timeout=timeout, check=False, cwd=REPO
        )
    except subprocess.TimeoutExpired:
        for pid in processes_running(args[-1]):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        raise


def processes_running(marker: str) -> list[int]:
    """PIDs whose command line mentions ``marker`` (the test's own script path)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmdline = fh.read().decode("utf-8", "replace")
        except OSError:
            continue
        if marker in cmdline:
            pids.append(int(entry))
    return pids


def test_a_starved_map_style_loader_gets_more_workers_and_at_least_half_again_the_steps(
    tmp_path: Path,
) -> None:
    script = tmp_path / "starved_tune.py"
    script.write_text(STARVED)
    t0 = time.monotonic()
    proc = dam_tune("--json", "--budget", "75", *FAST, "--", sys.executable, str(script))
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)  # stdout carries only the result
    assert set(doc) == {"baseline", "trials", "best", "applied", "reason"}
    base, best = doc["baseline"], doc["best"]
    assert base["settings"] == {"num_workers": 0}
    assert base["dataWaitRatio"] > 0.5
    assert doc["applied"].get("num_workers", 0) >= 2, doc
    assert best["settings"]["num_workers"] == doc["applied"]["num_workers"]
    assert best["stepsPerSecond"] >= 1.5 * base["stepsPerSecond"], doc
    kept = [t for t in doc["trials"] if t["kept"]]
    assert kept and kept[-1]["settings"] == best["settings"]
    assert "standard error" in doc["reason"], "the reason says how the noise is judged"
    assert elapsed < 90, f"dam tune took {elapsed:.0f} s on a budget of 75 s"
    assert not processes_running(str(script)), "every run of the command is stopped"


def test_a_compute_bound_job_is_left_alone_and_the_reason_says_why(tmp_path: Path) -> None:
    script = tmp_path / "compute_tune.py"
    script.write_text(COMPUTE)
    proc = dam_tune("--budget", "60", *FAST, "--", sys.executable, str(script))
    assert proc.returncode == 0, proc.stderr
    assert "reason: nothing changed" in proc.stdout, proc.stdout
    assert "not input-bound" in proc.stdout
    assert "Paste into the training code" not in proc.stdout
    assert "baseline" in proc.stdout  # the table has the one run
    assert proc.stderr.count("dam tune: trial") == 0, "no trial runs for a job that is not input-bound"
    assert not processes_running(str(script))


def test_a_command_that_fails_is_reported_with_its_output(tmp_path: Path) -> None:
    script = tmp_path / "fails.py"
    script.write_text("import sys\nprint('boom: no data here', file=sys.stderr)\nsys.exit(3)\n")
    proc = dam_tune("--json", *FAST, "--", sys.executable, str(script))
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    assert doc["baseline"] is None and doc["trials"] == [] and doc["applied"] == {}
    assert "exit 3" in doc["reason"] and "boom: no data here" in doc["reason"]
