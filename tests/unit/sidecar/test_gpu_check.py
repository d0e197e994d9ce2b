"""The CPU-side parts of the GPU check: arguments, the plan, the verdict check, snapshot summaries, wheels."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest

from dam_sidecar.attribution import Attributor
from dam_sidecar.collector import SidecarCollector, standard_collectors
from dam_sidecar.errors import ErrorLog
from dam_sidecar.fake_nvml import FakeGpu, FakeNvml
from dam_sidecar.samplers.cpu import CpuSample
from dam_sidecar.samplers.nvml import READINGS, NvmlSampler
from dam_sidecar.samplers.probe import ProbeSample
from tests.support.procs import spawn

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
        standard_collectors(
            probe=probe,
            nvml=NvmlSampler(errors, load=lambda: fake),
            cpu=Cpu(),
            errors=errors,
            attributor=Attributor("none", None),
        ),
        errors=errors,
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
    before, after = snapshots(wait_share=0.7, utilization=20)
    (tmp_path / "b.prom").write_text(before)
    (tmp_path / "a.prom").write_text(after)
    verdict = gc.evaluate(
        tmp_path / "b.prom", tmp_path / "a.prom", [sys.executable, "-m", "dam_operator.cli"]
    )
    assert verdict["bottleneck"]["regime"] == "input-bound", verdict
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


# --- the rehearsal: the whole pipeline on the CPU --------------------------------------------
def _probe_dir(out: Path) -> str:
    m = re.search(r"probe_dir=(\S+)", (out / "sidecar.log").read_text())
    assert m, "the sidecar logged no probe_dir"
    return m.group(1)


def _processes_of(probe_dir: str) -> list[int]:
    """Live processes started by the check: the sidecar, the workload, its loader workers (by their env)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if f"DAM_PROBE_DIR={probe_dir}".encode() in env and state != "Z":
            found.append(int(proc.name))
    return found


def _rehearse(tmp_path: Path, *extra: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gpu_check.py"), "--rehearse", "--out", str(tmp_path), *extra],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


@pytest.mark.slow
def test_rehearsal_runs_all_four_workloads_under_the_real_sidecar_and_evaluate(tmp_path: Path) -> None:
    done = _rehearse(tmp_path, "--seconds", "3", "--warmup", "0.5")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [e["workload"] for e in summary] == [w.name for w in gc.WORKLOADS]
    for entry in summary:
        assert entry["ok"] and entry["problems"] == [], entry
        assert gc.verdict_problems(entry["verdict"]) == []
        before = (tmp_path / f"{entry['workload']}.before.prom").read_text()
        after = (tmp_path / f"{entry['workload']}.after.prom").read_text()
        assert gc.steps_total(after) > gc.steps_total(before) > 0
        assert "dam_gpu_utilization_ratio{" in after  # the simulated GPU, through the real sampler
    starved = summary[0]
    assert starved["cpu_verdict"]["bottleneck"]["regime"] == "input-bound"
    assert starved["cpu_verdict"]["metrics"]["dataWaitRatio"] > 0.5
    assert "4/4 checks passed" in done.stdout
    assert _processes_of(_probe_dir(tmp_path)) == []


def test_a_workload_that_never_steps_fails_the_check_and_is_stopped(tmp_path: Path) -> None:
    done = _rehearse(tmp_path, "--only", "launch-overhead", "--start-timeout", "0.5", timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "no step counted within 0.5 s" in done.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary[0]["ok"] is False
    assert _processes_of(_probe_dir(tmp_path)) == []


def test_sigterm_stops_the_sidecar_and_the_workload(tmp_path: Path) -> None:
    proc = spawn(
        [sys.executable, str(ROOT / "tools" / "gpu_check.py"), "--rehearse", "--out", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "input-starved.log").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)
        probe_dir = _probe_dir(tmp_path)
        pids = _processes_of(probe_dir)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert len(pids) >= 2  # the sidecar and the workload
    assert _processes_of(probe_dir) == []


def test_cpu_view_of_a_snapshot_drops_every_gpu_series_and_nothing_else() -> None:
    _, after = snapshots(wait_share=0.5)
    cpu = gc.without_gpu_series(after)
    assert "dam_gpu_" not in cpu
    kept = [line for line in after.splitlines() if "dam_gpu_" not in line]
    assert cpu.splitlines() == kept
    assert "dam_steps_total" in cpu and "dam_nvml_up" in cpu


def test_rehearsal_check_wants_a_well_formed_verdict_and_input_bound_without_the_fake() -> None:
    good = {
        "bottleneck": {"axis": "Machine", "regime": "compute-bound", "confidence": 0.8, "lever": "x"},
        "metrics": {},
    }
    ok, msg = gc.check_rehearsal(gc.BY_NAME["memory-bound"], good, None)
    assert ok and "valid verdict" in msg
    ok, msg = gc.check_rehearsal(gc.BY_NAME["memory-bound"], {"bottleneck": {"regime": "x"}}, None)
    assert not ok and "no known regime" in msg and "no metrics" in msg
    starved = gc.BY_NAME["input-starved"]
    assert not gc.check_rehearsal(starved, good, None)[0]
    assert not gc.check_rehearsal(starved, good, good)[0]
    input_bound = {**good, "bottleneck": {**good["bottleneck"], "regime": "input-bound"}}
    assert gc.check_rehearsal(starved, good, input_bound)[0]


def test_gpu_mode_without_nvml_exits_2_and_starts_nothing(tmp_path: Path) -> None:
    if importlib.util.find_spec("pynvml") is not None:
        import pynvml

        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError:
            pass
        else:
            pynvml.nvmlShutdown()
            pytest.skip("NVML works here")
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gpu_check.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and "--rehearse" in done.stderr
    assert not (tmp_path / "sidecar.log").exists()


def test_every_dam_name_the_check_reads_is_a_metric_the_sidecar_exports() -> None:
    from dam_contract import names

    exported = {v for v in vars(names).values() if isinstance(v, str) and v.startswith("dam_")}
    source = (ROOT / "tools" / "gpu_check.py").read_text()
    used = set(re.findall(r'"(dam_[a-z0-9_]+)"', source)) - {gc.GPU_PREFIX}
    assert used and used <= exported, used - exported


def test_a_window_shorter_than_two_sidecar_samples_is_refused() -> None:
    with pytest.raises(SystemExit):
        gc.parse_args(["--rehearse", "--seconds", "1"])
    assert gc.parse_args(["--rehearse"]).seconds < gc.parse_args([]).seconds


# --- the real NVML binding: what the sampler and the check call exists, with that shape --------
# (name, positional parameters the sampler passes); a pynvml upgrade that renames or reshapes one
# of these fails here instead of on the GPU machine.
PYNVML_CALLS = (
    ("nvmlInit", 0),
    ("nvmlShutdown", 0),
    ("nvmlDeviceGetCount", 0),
    ("nvmlDeviceGetHandleByIndex", 1),
    ("nvmlDeviceGetUUID", 1),
    ("nvmlDeviceGetName", 1),
    ("nvmlDeviceGetUtilizationRates", 1),
    ("nvmlDeviceGetMemoryInfo", 1),
    ("nvmlDeviceGetCurrentClocksEventReasons", 1),
    ("nvmlDeviceGetCurrentClocksThrottleReasons", 1),
    ("nvmlDeviceGetPcieThroughput", 2),
    ("nvmlGpmQueryDeviceSupport", 1),
    ("nvmlGpmSampleAlloc", 0),
    ("nvmlGpmSampleFree", 1),
    ("nvmlGpmSampleGet", 2),
    ("nvmlGpmMetricsGet", 1),
    ("nvmlDeviceGetFieldValues", 2),
    *((r.function, 1 + len(r.constants)) for r in READINGS),  # the handle, then its constants
)


def _pynvml() -> ModuleType:
    module: ModuleType = pytest.importorskip("pynvml")
    return module


def test_every_pynvml_function_the_sampler_calls_exists_with_that_arity() -> None:
    import inspect

    nv = _pynvml()
    for name, arity in PYNVML_CALLS:
        fn = getattr(nv, name, None)
        assert callable(fn), f"pynvml has no {name}"
        params = list(inspect.signature(fn).parameters.values())
        required = [p for p in params if p.default is inspect.Parameter.empty]
        assert len(required) <= arity <= len(params), f"{name}{inspect.signature(fn)} vs {arity} arguments"


def test_nvml_ids_constants_and_error_codes_match_the_installed_pynvml() -> None:
    from dam_sidecar.samplers import nvml

    nv = _pynvml()
    assert nvml.GPM_SM_UTIL == nv.NVML_GPM_METRIC_SM_UTIL
    assert nvml.GPM_SM_OCCUPANCY == nv.NVML_GPM_METRIC_SM_OCCUPANCY
    assert nvml.GPM_ANY_TENSOR_UTIL == nv.NVML_GPM_METRIC_ANY_TENSOR_UTIL
    assert nvml.GPM_DRAM_BW_UTIL == nv.NVML_GPM_METRIC_DRAM_BW_UTIL
    assert nvml.GPM_FP32_UTIL == nv.NVML_GPM_METRIC_FP32_UTIL
    assert nvml.GPM_FP16_UTIL == nv.NVML_GPM_METRIC_FP16_UTIL
    assert nvml.FI_NVLINK_LINK_COUNT == nv.NVML_FI_DEV_NVLINK_LINK_COUNT
    assert nvml.FI_NVLINK_DATA_TX == nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
    assert nvml.FI_NVLINK_DATA_RX == nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
    assert nvml.FI_PCIE_COUNT_TX_BYTES == nv.NVML_FI_DEV_PCIE_COUNT_TX_BYTES
    assert nvml.FI_PCIE_COUNT_RX_BYTES == nv.NVML_FI_DEV_PCIE_COUNT_RX_BYTES
    members = {name for name, _ in nv.c_nvmlValue_t._fields_}
    assert set(nvml._VALUE_MEMBERS.values()) <= members
    assert nvml._VALUE_MEMBERS[nv.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG] == "ullVal"
    assert nvml._VALUE_MEMBERS[nv.NVML_VALUE_TYPE_UNSIGNED_INT] == "uiVal"
    assert {"fieldId", "scopeId", "nvmlReturn", "valueType", "value"} <= {
        name for name, _ in nv.c_nvmlFieldValue_t._fields_
    }
    for r in nvml.READINGS:
        for name, value in r.constants:
            assert getattr(nv, name, None) == value, f"{r.what}: pynvml's {name} is not {value}"
    for name in (
        "NVML_PCIE_UTIL_TX_BYTES",
        "NVML_PCIE_UTIL_RX_BYTES",
        "NVML_GPM_METRICS_GET_VERSION",
    ):
        assert isinstance(getattr(nv, name, None), int), f"pynvml has no {name}"
    reasons = {
        "gpu_idle": "GpuIdle",
        "applications_clocks_setting": "ApplicationsClocksSetting",
        "sw_power_cap": "SwPowerCap",
        "hw_slowdown": "HwSlowdown",
        "sync_boost": "SyncBoost",
        "sw_thermal_slowdown": "SwThermalSlowdown",
        "hw_thermal_slowdown": "HwThermalSlowdown",
        "hw_power_brake_slowdown": "HwPowerBrakeSlowdown",
        "display_clock_setting": "DisplayClockSetting",
    }
    assert set(reasons) == set(nvml.THROTTLE_REASONS.values())
    for bit, label in nvml.THROTTLE_REASONS.items():
        assert getattr(nv, "nvmlClocksEventReason" + reasons[label]) == bit, label
    for code, name in (
        (nvml._NOT_SUPPORTED, "NVML_ERROR_NOT_SUPPORTED"),
        (nvml._NO_PERMISSION, "NVML_ERROR_NO_PERMISSION"),
        (nvml._DRIVER_NOT_LOADED, "NVML_ERROR_DRIVER_NOT_LOADED"),
        (nvml._TIMEOUT, "NVML_ERROR_TIMEOUT"),
        (nvml._LIBRARY_NOT_FOUND, "NVML_ERROR_LIBRARY_NOT_FOUND"),
        (nvml._FUNCTION_NOT_FOUND, "NVML_ERROR_FUNCTION_NOT_FOUND"),
        (nvml._GPU_IS_LOST, "NVML_ERROR_GPU_IS_LOST"),
        (nvml._UNKNOWN, "NVML_ERROR_UNKNOWN"),
    ):
        assert getattr(nv, name) == code, name
    assert nv.NVMLError(nvml._GPU_IS_LOST).value == nvml._GPU_IS_LOST  # the sampler reads .value


def test_the_gpm_request_the_sampler_builds_fits_the_real_ctypes_structure() -> None:
    """NvmlSampler._sample_gpm itself, run on pynvml's real ctypes types: only the two driver
    calls are replaced, by functions that check what the sampler hands them and answer like
    the driver does (values written back into the caller's structure)."""
    from types import SimpleNamespace

    from dam_sidecar.samplers import nvml

    nv = _pynvml()
    requests: list[object] = []

    def metrics_get(mg: object) -> int:
        assert isinstance(mg, nv.c_nvmlGpmMetricsGet_t)
        assert mg.version == nv.NVML_GPM_METRICS_GET_VERSION
        assert mg.numMetrics == len(nvml.GPM_METRICS)
        ids = [int(mg.metrics[i].metricId) for i in range(mg.numMetrics)]
        assert ids == list(nvml.GPM_METRICS)
        for i in range(mg.numMetrics):
            mg.metrics[i].value = 10.0 * (i + 1)
        mg.metrics[1].nvmlReturn = nvml._NOT_SUPPORTED
        requests.append(mg)
        return 0

    binding = SimpleNamespace(
        c_nvmlGpmMetricsGet_t=nv.c_nvmlGpmMetricsGet_t,
        NVML_GPM_METRICS_GET_VERSION=nv.NVML_GPM_METRICS_GET_VERSION,
        nvmlGpmSampleGet=lambda handle, sample: sample,  # pynvml returns the filled sample
        nvmlGpmMetricsGet=metrics_get,
    )
    sampler = NvmlSampler(ErrorLog())
    sampler._nv = binding
    dev = nvml._Device(index=0, handle=object(), uuid="GPU-x", name="H100")
    dev.gpm_samples = [nv.c_nvmlGpmSample_t(), nv.c_nvmlGpmSample_t()]
    assert sampler._sample_gpm(dev) == {}  # the first tick only primes
    got = sampler._sample_gpm(dev)
    assert len(requests) == 1
    names = list(nvml.GPM_METRICS.values())
    assert got == {name: (10.0 * (i + 1)) / 100.0 for i, name in enumerate(names) if i != 1}
    assert names[1] not in got  # NOT_SUPPORTED for that metric: absent, not zero


def test_the_fake_nvml_offers_nothing_that_the_real_pynvml_lacks() -> None:
    """The simulated GPUs of the rehearsal stand behind the same names as the real binding."""
    nv = _pynvml()
    fake = FakeNvml(1)
    public = {n for n in dir(fake) if n.startswith(("nvml", "NVML", "c_nvml"))}
    assert public and public <= set(dir(nv)), public - set(dir(nv))
