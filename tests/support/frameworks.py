"""Helpers for the frameworks tier (tests/integration/frameworks): real Lightning, Hugging Face
``Trainer`` and torchdata jobs run under the real ``dam run`` / ``dam tune``.

The jobs are scripts in ``tests/integration/frameworks/jobs``: code written as a user of the
framework writes it, with no import of dam. The frameworks are pinned in the dev extras of
``pyproject.toml``; a missing one skips its tests with one line saying how to install it, and
fails them with ``CI=true``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
JOBS = REPO / "tests" / "integration" / "frameworks" / "jobs"
PY = sys.executable  # this venv's interpreter, with the frameworks
DAM = [PY, "-m", "dam_operator.cli"]
TORCHRUN = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]

# Nothing is fetched: the models are built from config objects, the data is synthetic. With these
# set, any attempt to reach the Hub raises at once instead of hanging on a network timeout.
OFFLINE = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def require(*modules: str) -> None:
    """Skips (fails with ``CI=true``) unless every module can be imported."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if not missing:
        return
    message = (
        f"FRAMEWORK NOT INSTALLED: {', '.join(missing)}; "
        "install the pinned versions with: .venv/bin/pip install -e '.[dev]'"
    )
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def job(name: str) -> str:
    path = JOBS / name
    assert path.is_file(), path
    return str(path)


def dam(
    subcommand: str, *args: str, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``dam SUBCOMMAND ARGS`` from the repository root, offline; output captured."""
    return subprocess.run(
        [*DAM, subcommand, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=REPO,
        env={**os.environ, **OFFLINE, **(env or {})},
    )


def tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.splitlines()[-lines:])


def verdict_of(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The JSON of ``dam run --json`` (stdout), after checking that the command succeeded."""
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{tail(proc.stderr)}"
    try:
        doc: dict[str, Any] = json.loads(proc.stdout)
    except ValueError as exc:
        raise AssertionError(f"no JSON verdict ({exc}): {proc.stdout!r}\n{tail(proc.stderr)}") from None
    assert doc["exitCode"] == 0, doc
    return doc


def explain(doc: dict[str, Any], proc: subprocess.CompletedProcess[str]) -> str:
    """What an assertion message shows: the verdict and the end of the job's output."""
    return f"{json.dumps(doc['bottleneck'], indent=1)}\nmetrics: {doc['metrics']}\n{tail(proc.stderr, 12)}"


RUN = ("--json", "--interval", "0.5", "--window", "3")
"""``dam run``'s options in this tier: the JSON verdict of short windows."""


def trained_steps(stderr: str) -> dict[int, int]:
    """Rank -> steps, from each rank's last line (the job's own count, independent of the probe)."""
    return {int(r): int(n) for n, r in re.findall(r"trained (\d+) steps on rank (\d+)", stderr)}


def dam_tune(*command: str, budget: int, timeout: float) -> dict[str, Any]:
    """``dam tune --json`` of ``command`` (short windows), after checking that it succeeded."""
    proc = dam(
        "tune",
        "--json",
        "--budget",
        str(budget),
        "--window",
        "3",
        "--warmup",
        "1",
        "--interval",
        "0.5",
        "--",
        *command,
        timeout=timeout,
    )
    assert proc.returncode == 0, tail(proc.stderr)
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def assert_input_bound(proc: subprocess.CompletedProcess[str]) -> None:
    """The job's verdict: input-bound, told to add DataLoader workers, with steps measured."""
    doc = verdict_of(proc)
    b, m = doc["bottleneck"], doc["metrics"]
    assert b["axis"] == "Data", explain(doc, proc)
    assert b["regime"] == "input-bound", explain(doc, proc)
    assert b["lever"] == "increase-dataloader-workers", explain(doc, proc)
    assert m["dataWaitRatio"] > 0.5, explain(doc, proc)
    assert m["stepsPerSecond"] > 1, explain(doc, proc)


def assert_not_data_bound_with_two_workers(proc: subprocess.CompletedProcess[str]) -> None:
    """A job with cheap samples and two loader workers on a CPU-only machine: Machine-bound, not
    data-bound, its two workers seen."""
    doc = verdict_of(proc)
    b, m = doc["bottleneck"], doc["metrics"]
    assert b["axis"] == "Machine", explain(doc, proc)  # a CPU-only machine: the CPU does the arithmetic
    assert b["regime"] != "input-bound", explain(doc, proc)
    assert m["dataWaitRatio"] < 0.1, explain(doc, proc)
    assert m["stepsPerSecond"] > 1, explain(doc, proc)
    assert m.get("workerCount") == 2, explain(doc, proc)


def assert_rank_one_is_a_data_straggler(proc: subprocess.CompletedProcess[str]) -> None:
    """Two ranks, rank 1's loader slow: rank 1 is named the straggler, for Data, and both trained."""
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
