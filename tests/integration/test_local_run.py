"""`dam run` end to end: real PyTorch training under the automatic instrumentation."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.support.procs import spawn

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


# A starved loop without torch (fast to start): the explicit probe API around a slow generator,
# printing a line of its own now and then, like a training script's log.
CHATTY_STARVED = textwrap.dedent(
    """
    import time, dam_probe

    def batches():
        while True:
            time.sleep(0.02)
            yield 1

    deadline = time.monotonic() + 4
    for i, _ in enumerate(dam_probe.instrument(batches())):
        time.sleep(0.002)
        if i % 30 == 0:
            print(f"step {i} loss 0.5", flush=True)
        if time.monotonic() > deadline:
            break
    """
)


def render_terminal(raw: str) -> list[str]:
    """What a terminal shows for ``raw``: carriage return, newline and erase-to-end-of-line."""
    lines, col, i = [""], 0, 0
    while i < len(raw):
        if raw.startswith("\x1b[K", i):
            lines[-1] = lines[-1][:col]
            i += 3
            continue
        c = raw[i]
        if c == "\r":
            col = 0
        elif c == "\n":
            lines.append("")
            col = 0
        else:
            line = lines[-1].ljust(col)
            lines[-1] = line[:col] + c + line[col + 1 :]
            col += 1
        i += 1
    return lines


def dam_run_on_a_terminal(*args: str, timeout: float = 60) -> tuple[int, str]:
    """Runs ``dam run`` with stdout and stderr on a pseudo-terminal; returns its exit code and output."""
    import pty
    import select

    master, slave = pty.openpty()
    proc = spawn([*DAM, "run", *args], stdout=slave, stderr=slave, cwd=REPO)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the other end is closed
                break
            if not chunk:
                break
            chunks.append(chunk)
        elif proc.poll() is not None:
            break
    os.close(master)
    code = proc.wait(timeout=10)
    return code, b"".join(chunks).decode("utf-8", "replace")


def test_on_a_terminal_one_status_line_is_redrawn_in_place_above_which_the_commands_lines_stay_whole(
    tmp_path: Path,
) -> None:
    script = tmp_path / "chatty.py"
    script.write_text(CHATTY_STARVED)
    code, raw = dam_run_on_a_terminal("--interval", "0.2", "--window", "1", "--", sys.executable, str(script))
    assert code == 0, raw
    # Every status draw starts with carriage return + erase, and never ends a line (no scrolling).
    draws = raw.split("\r\x1b[K")
    status = [d for d in draws if d.startswith("dam: ")]
    assert any("warming up:" in d and "steps so far" in d for d in status), raw
    assert any("input-bound" in d for d in status), raw
    assert not re.search(r"\x1b\[Kdam: [^\r\x1b]*\n", raw), "a status line ended with a newline: it scrolled"
    screen = render_terminal(raw)
    logged = [line for line in screen if "step " in line and "loss" in line]
    assert len(logged) >= 5, screen
    assert all(re.fullmatch(r"step \d+ loss 0\.5", line) for line in logged), logged
    assert not any(line.startswith("dam: ") for line in screen), "the status line is removed at the end"
    assert any(line.startswith("regime:     input-bound") for line in screen), screen


def test_off_a_terminal_a_line_is_printed_only_when_the_verdict_changes(tmp_path: Path) -> None:
    script = tmp_path / "chatty.py"
    script.write_text(CHATTY_STARVED)
    proc = dam_run("--interval", "0.2", "--window", "1", "--", sys.executable, str(script))
    assert proc.returncode == 0, proc.stderr
    assert "\x1b[K" not in proc.stderr and "\r" not in proc.stderr
    live = [line for line in proc.stderr.splitlines() if line.startswith("dam: ")]
    assert live, proc.stderr
    assert "input-bound" in live[0]
    assert not any("warming up" in line or "waiting for" in line for line in live)
    regimes = [re.search(r"·\s*([a-z-]+-bound|unknown)\s*·", line) for line in live]
    keys = [m.group(1) if m else line for m, line in zip(regimes, live, strict=True)]
    assert all(a != b for a, b in itertools.pairwise(keys)), live
    assert len(live) <= 2, "a steady job prints its verdict once"


def test_live_output_can_be_turned_off(tmp_path: Path) -> None:
    script = tmp_path / "chatty.py"
    script.write_text(CHATTY_STARVED)
    proc = dam_run("--live", "never", "--interval", "0.2", "--window", "1", "--", sys.executable, str(script))
    assert proc.returncode == 0, proc.stderr
    assert not [line for line in proc.stderr.splitlines() if line.startswith("dam: ")]


def test_ctrl_c_is_forwarded_to_the_command_and_the_verdict_still_printed() -> None:
    import signal

    proc = spawn(
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
