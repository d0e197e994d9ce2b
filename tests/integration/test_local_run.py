"""`dam run` end to end: real PyTorch training under the automatic instrumentation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DAM = [sys.executable, "-m", "dam_operator.cli"]


def dam_run(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*DAM, "run", *args], capture_output=True, text=True, timeout=timeout, check=False, cwd=REPO
    )


STARVED = textwrap.dedent(
    """
    import time, torch
    from torch.utils.data import DataLoader, Dataset

    class Slow(Dataset):
        def __len__(self): return 10_000
        def __getitem__(self, i):
            time.sleep(0.004)
            return torch.ones(8)

    model = torch.nn.Linear(8, 1)
    deadline = time.monotonic() + 5
    for x in DataLoader(Slow(), batch_size=8, num_workers=0):
        model(x).sum().backward()
        if time.monotonic() > deadline:
            break
    print("trained")
    """
)


def test_starved_loader_is_diagnosed_data_input_bound(tmp_path: Path) -> None:
    script = tmp_path / "starved.py"
    script.write_text(STARVED)
    proc = dam_run("--json", "--interval", "0.5", "--window", "2", "--", sys.executable, str(script))
    assert proc.returncode == 0, proc.stderr
    verdict = json.loads(proc.stdout)  # stdout carries only the verdict
    assert verdict["bottleneck"]["axis"] == "Data"
    assert verdict["bottleneck"]["regime"] == "input-bound"
    assert verdict["metrics"]["dataWaitRatio"] > 0.5
    assert verdict["exitCode"] == 0
    assert "trained" in proc.stderr  # the command's own stdout went to stderr


def test_compute_heavy_job_with_fast_loader_is_not_input_bound() -> None:
    proc = dam_run(
        "--json",
        "--interval",
        "0.5",
        "--window",
        "2",
        "--",
        sys.executable,
        str(REPO / "examples" / "train.py"),
        "--scenario",
        "compute",
        "--seconds",
        "5",
    )
    assert proc.returncode == 0, proc.stderr
    verdict = json.loads(proc.stdout)
    assert verdict["bottleneck"]["regime"] != "input-bound"
    assert verdict["metrics"]["dataWaitRatio"] < 0.1


def test_exit_code_of_the_command_is_returned_and_no_steps_gives_unknown(tmp_path: Path) -> None:
    proc = dam_run("--json", "--interval", "0.2", "--", sys.executable, "-c", "import sys; sys.exit(3)")
    assert proc.returncode == 3
    verdict = json.loads(proc.stdout)
    assert verdict["bottleneck"]["regime"] == "unknown"
    assert verdict["bottleneck"]["missing"], "an unknown verdict names what is missing"


def test_human_verdict_is_printed_without_json() -> None:
    proc = dam_run("--interval", "0.2", "--", sys.executable, "-c", "print('hello')")
    assert proc.returncode == 0
    assert "hello" in proc.stdout
    assert "regime:" in proc.stdout and "axis:" in proc.stdout


def test_missing_command_is_exit_127_with_a_clear_message() -> None:
    proc = dam_run("--", "definitely-not-a-command-xyz")
    assert proc.returncode == 127
    assert "cannot start 'definitely-not-a-command-xyz'" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "no command given"),
        (("--interval", "0", "--", "true"), "--interval must be between"),
        (("--window", "0.01", "--", "true"), "--window must be between"),
        (("--peak-flops", "-1", "--", "true"), "--peak-flops must be a positive number"),
    ],
)
def test_bad_options_exit_2_naming_the_option(args: tuple[str, ...], message: str) -> None:
    proc = dam_run(*args)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_existing_pythonpath_is_kept_for_the_command(tmp_path: Path) -> None:
    marker = tmp_path / "lib"
    marker.mkdir()
    (marker / "user_marker_mod.py").write_text("VALUE = 42\n")
    env = dict(os.environ, PYTHONPATH=str(marker))
    proc = subprocess.run(
        [
            *DAM,
            "run",
            "--",
            sys.executable,
            "-c",
            "import user_marker_mod, sys; sys.exit(user_marker_mod.VALUE - 42)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr


def test_live_verdict_lines_are_printed_while_the_command_runs() -> None:
    proc = dam_run(
        "--live",
        "always",
        "--interval",
        "0.2",
        "--window",
        "0.4",
        "--",
        sys.executable,
        "-c",
        "import time; time.sleep(2.5)",
    )
    assert proc.returncode == 0, proc.stderr
    live = [line for line in proc.stderr.splitlines() if line.startswith("dam: ")]
    assert len(live) >= 2, proc.stderr
    assert all("unknown" in line.lower() for line in live), "no training loop: the live verdict is unknown"


def test_ctrl_c_is_forwarded_to_the_command_and_the_verdict_still_printed() -> None:
    import signal
    import time

    proc = subprocess.Popen(
        [
            *DAM,
            "run",
            "--json",
            "--interval",
            "0.2",
            "--",
            sys.executable,
            "-c",
            "import time; time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    time.sleep(3)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err  # the child died of SIGINT: 128 + 2, as a shell reports it
    verdict = json.loads(out)
    assert verdict["exitCode"] == 130
    assert verdict["bottleneck"]["regime"] == "unknown"
