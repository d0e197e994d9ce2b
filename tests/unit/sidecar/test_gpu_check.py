"""The CPU-side parts of the GPU check: arguments, the plan, the verdict check, snapshot summaries, wheels."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest

from dam_sidecar.attribution import Attributor
from dam_sidecar.collector import SidecarCollector
from dam_sidecar.errors import ErrorLog
from dam_sidecar.fake_nvml import FakeGpu, FakeNvml
from dam_sidecar.samplers.cpu import CpuSample
from dam_sidecar.samplers.nvml import NvmlSampler
from dam_sidecar.samplers.probe import ProbeSample

ROOT = Path(__file__).resolve().parents[3]


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "tools" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


gc = load()


class Probe:
    def __init__(self) -> None:
        self.value = ProbeSample(up=True, live_pids=(1,), device_uuids=("GPU-0",), batch_size=64)

    def sample(self) -> ProbeSample:
        return self.value


class Cpu:
    def sample(self, pids: object) -> CpuSample:
        return CpuSample(main_cpu_seconds=1.0, worker_cpu_seconds=0.0)


def snapshots(wait_share: float, utilization: int = 95) -> tuple[str, str]:
    """Two scrapes of the real collector (fake GPU), 20 s and 400 steps apart."""
    t = [1000.0]
    probe = Probe()
    fake = FakeNvml([FakeGpu(uuid="GPU-0", utilization=utilization)])
    errors = ErrorLog()
    c = SidecarCollector(
        probe=probe,
        nvml=NvmlSampler(errors, load=lambda: fake),
        cpu=Cpu(),
        errors=errors,
        attributor=Attributor("none", None),
        clock=lambda: t[0],
    )
    c.sample_now()
    before = c.text().decode()
    t[0] += 20.0
    probe.value = replace(probe.value, steps=400, wait_seconds=20.0 * wait_share, step_seconds=20.0)
    c.sample_now()
    return before, c.text().decode()


def test_defaults_run_all_four_workloads_in_a_few_minutes() -> None:
    args = gc.parse_args([])
    assert [w.name for w in gc.selected(args)] == [w.name for w in gc.WORKLOADS]
    assert {w.expected_regime for w in gc.WORKLOADS} == {
        "input-bound",
        "memory-bound",
        "compute-bound",
        "latency-bound",
    }
    minutes = float(gc.plan(args).rsplit("about ", 1)[1].split(" min")[0])
    assert minutes < 6


def test_only_selects_workloads_and_bad_values_are_refused() -> None:
    args = gc.parse_args(["--only", "compute-bound", "--seconds", "5"])
    assert [w.name for w in gc.selected(args)] == ["compute-bound"]
    with pytest.raises(SystemExit):
        gc.parse_args(["--only", "nope"])
    with pytest.raises(SystemExit):
        gc.parse_args(["--seconds", "0"])


def test_dry_run_prints_the_plan_and_touches_no_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert gc.main(["--dry-run", "--only", "memory-bound"]) == 0
    out = capsys.readouterr().out
    assert "memory-bound" in out and "compute-bound" not in out


def test_right_regime_passes_and_a_wrong_one_fails_with_the_evidence() -> None:
    w = gc.BY_NAME["compute-bound"]
    ok, msg = gc.check_verdict(
        w, {"bottleneck": {"axis": "Machine", "regime": "compute-bound", "confidence": 0.8}}
    )
    assert ok and "0.80" in msg
    bad = {"bottleneck": {"axis": "Data", "regime": "input-bound", "evidence": ["data wait 40 %"]}}
    ok, msg = gc.check_verdict(w, bad)
    assert not ok and "expected compute-bound" in msg and "data wait 40 %" in msg
    ok, msg = gc.check_verdict(w, {"metrics": {}})
    assert not ok and "no bottleneck" in msg


def test_summary_of_collector_snapshots_shows_wait_ratio_and_gpm() -> None:
    before, after = snapshots(wait_share=0.6)
    lines, problems = gc.summarize(before, after)
    text = "\n".join(lines)
    assert problems == []
    assert "data wait ratio 0.600" in text
    assert "steps/s 20.00" in text
    assert "sm_active_ratio=" in text and "attribution probe" in text


def test_summary_flags_missing_steps_and_gpu_data() -> None:
    before, _ = snapshots(wait_share=0.1)
    _, problems = gc.summarize(before, before.replace("dam_nvml_up 1.0", "dam_nvml_up 0.0"))
    assert any("no steps" in p for p in problems)
    assert any("dam_nvml_up" in p for p in problems)


def test_evaluate_runs_the_dam_command_and_reads_its_json(tmp_path: Path) -> None:
    fake_dam = tmp_path / "dam.py"
    fake_dam.write_text(
        "import json, sys\n"
        "assert sys.argv[1] == 'evaluate' and sys.argv[-1] == '--json'\n"
        "print(json.dumps({'bottleneck': {'axis': 'Data', 'regime': 'input-bound'}, 'metrics': {}}))\n"
    )
    (tmp_path / "a.prom").write_text("")
    result = gc.evaluate(tmp_path / "a.prom", tmp_path / "a.prom", [sys.executable, str(fake_dam)])
    assert result["bottleneck"]["regime"] == "input-bound"
    broken = tmp_path / "broken.py"
    broken.write_text("import sys\nsys.stderr.write('boom')\nsys.exit(2)\n")
    with pytest.raises(RuntimeError, match="boom"):
        gc.evaluate(tmp_path / "a.prom", tmp_path / "a.prom", [sys.executable, str(broken)])


def test_real_dam_evaluate_accepts_the_sidecar_snapshots(tmp_path: Path) -> None:
    if importlib.util.find_spec("dam_operator.evaluate") is None:
        pytest.skip("dam_operator.evaluate is not there yet")
    before, after = snapshots(wait_share=0.7, utilization=20)
    (tmp_path / "b.prom").write_text(before)
    (tmp_path / "a.prom").write_text(after)
    verdict = gc.evaluate(
        tmp_path / "b.prom", tmp_path / "a.prom", [sys.executable, "-m", "dam_operator.cli"]
    )
    assert verdict["bottleneck"]["regime"] in {
        "input-bound",
        "memory-bound",
        "compute-bound",
        "latency-bound",
        "unknown",
    }
    ok, _ = gc.check_verdict(gc.BY_NAME["input-starved"], verdict)
    assert ok, verdict  # 70 % of the step waiting on data with the GPU at 20 %: input-bound


def test_prepare_wheels_help_and_dry_run_name_cp312_manylinux_and_the_project_wheel() -> None:
    script = str(ROOT / "tools" / "prepare-wheels.sh")
    helped = subprocess.run(
        ["bash", script, "--help"], capture_output=True, text=True, timeout=30, check=False
    )
    assert helped.returncode == 0 and "prepare-wheels" in helped.stdout
    dry = subprocess.run(
        ["bash", script, "--dry-run"], capture_output=True, text=True, timeout=30, check=False
    )
    assert dry.returncode == 0, dry.stderr
    assert "--abi cp312" in dry.stdout and "manylinux2014_x86_64" in dry.stdout
    assert "wheel --no-deps" in dry.stdout
    assert "pydantic-settings" in dry.stdout and "nvidia-ml-py" not in dry.stdout
    wrong = subprocess.run(
        ["bash", script, "--bogus"], capture_output=True, text=True, timeout=30, check=False
    )
    assert wrong.returncode == 2


def test_gpu_check_shell_wrapper_dry_run_needs_no_wheels() -> None:
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", str(ROOT / "tools" / "gpu-check.sh"), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert "launch-overhead" in done.stdout
