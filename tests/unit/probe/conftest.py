"""Helpers for the probe tests: fresh in-process probes and Python subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import dam_probe
from dam_probe._core import Probe
from dam_probe.layout import ProbeRecord

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def probe(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Probe]:
    """A fresh process probe publishing into ``tmp_path/probes`` (the global one is left alone)."""
    fresh = Probe()
    monkeypatch.setattr(dam_probe, "PROBE", fresh)
    monkeypatch.setenv("DAM_PROBE_DIR", str(tmp_path / "probes"))
    monkeypatch.delenv("DAM_PROBE_DISABLE", raising=False)
    yield fresh
    fresh.close()


def python_env(**extra: str) -> dict[str, str]:
    """The environment for a child Python: no inherited probe settings, quiet torch import."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAM_PROBE") and k != "PYTHONPATH"}
    env["PYTHONWARNINGS"] = "ignore"
    env.update(extra)
    return env


def run_python(code: str, env: dict[str, str], timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Runs ``code`` in a fresh interpreter of this venv (site enabled, so sitecustomize runs)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=str(REPO),
    )


def probe_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("dam-probe:")]


def small_record(**fields: object) -> ProbeRecord:
    """A record with small distinct numbers (pid 1, start 2, steps 3, wait 4, step 5, update 6), no
    batch size, FLOPs or devices; ``fields`` add to it or replace."""
    base: dict[str, object] = {
        "pid": 1,
        "start_time_ns": 2,
        "steps": 3,
        "wait_ns": 4,
        "step_ns": 5,
        "last_update_ns": 6,
        "batch_size": 0,
        "flops_per_step": 0.0,
        "closed": False,
    }
    return ProbeRecord(**{**base, **fields})  # type: ignore[arg-type]
