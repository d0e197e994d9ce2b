"""``dam evaluate BEFORE.prom AFTER.prom``: verdicts from snapshot files, clean errors on bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dam_operator.cli import main as dam
from dam_operator.local.evaluate import main
from tests.unit.diagnosis.snapshots import Job, snapshot_pair

H100 = "NVIDIA H100 80GB HBM3"

JOBS: dict[str, tuple[Job, str, str]] = {
    "starved": (
        Job(
            wait_ratio=0.55,
            gpus=[{"util": 0.3, "sm": 0.2}],
            gpu_model="NVIDIA A100-SXM4-40GB",
            main_cpu_cores=0.5,
        ),
        "input-bound",
        "Data",
    ),
    "memory-bound": (
        Job(wait_ratio=0.01, gpus=[{"util": 0.98, "sm": 0.7, "dram": 0.9}] * 2, gpu_model=H100),
        "memory-bound",
        "Data",
    ),
    "compute-bound": (
        Job(
            wait_ratio=0.002,
            gpus=[{"util": 0.99, "sm": 0.93, "tensor": 0.6, "dram": 0.35}],
            gpu_model=H100,
            flops_per_step=0.55 * 989e12 * 60.0 / 120.0,
        ),
        "compute-bound",
        "Machine",
    ),
    "latency-bound": (
        Job(wait_ratio=0.004, gpus=[{"util": 0.25}], main_cpu_cores=1.0, batch_size=1),
        "latency-bound",
        "Algorithm",
    ),
    "insufficient": (Job(steps=1.0, wait_ratio=0.6, gpus=[{"util": 0.2}]), "unknown", "Unknown"),
    "cpu-only starved": (Job(wait_ratio=0.4, nvml_up=True, main_cpu_cores=0.3), "input-bound", "Data"),
}


def write_pair(tmp_path: Path, job: Job) -> tuple[str, str]:
    before, after = snapshot_pair(job)
    b, a = tmp_path / "before.prom", tmp_path / "after.prom"
    b.write_text(before)
    a.write_text(after)
    return str(b), str(a)


def run_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, Any]:
    assert main(argv) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


@pytest.mark.parametrize(("job", "regime", "axis"), list(JOBS.values()), ids=list(JOBS))
def test_clear_cut_snapshots_give_the_right_regime_and_axis(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], job: Job, regime: str, axis: str
) -> None:
    status = run_json(capsys, [*write_pair(tmp_path, job), "--json"])
    assert status["bottleneck"]["regime"] == regime
    assert status["bottleneck"]["axis"] == axis
    assert set(status) == {"bottleneck", "metrics"}


def test_compute_bound_snapshot_reports_mfu_against_the_detected_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = run_json(capsys, [*write_pair(tmp_path, JOBS["compute-bound"][0]), "--json"])
    assert status["metrics"]["mfu"] == pytest.approx(0.55)
    assert status["bottleneck"]["lever"] == "faster-accelerator"


def test_peak_flops_option_overrides_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = write_pair(tmp_path, JOBS["compute-bound"][0])
    status = run_json(
        capsys, [*paths, "--json", "--peak-flops", str(989e12 * 2), "--memory-bandwidth", "1e12"]
    )
    assert status["metrics"]["mfu"] == pytest.approx(0.275)
    assert status["metrics"]["ridgePoint"] == pytest.approx(989e12 * 2 / 1e12)


def test_threshold_option_changes_the_outcome(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = write_pair(tmp_path, Job(wait_ratio=0.15, gpus=[{"util": 0.4}], main_cpu_cores=0.95))
    assert run_json(capsys, [*paths, "--json"])["bottleneck"]["regime"] == "input-bound"
    raised = run_json(capsys, [*paths, "--json", "--threshold", "dataWaitSuspect=0.25"])
    assert raised["bottleneck"]["regime"] == "latency-bound"


def test_human_output_names_axis_regime_lever_and_evidence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(list(write_pair(tmp_path, JOBS["starved"][0]))) == 0
    out = capsys.readouterr().out
    assert "axis:       Data" in out
    assert "regime:     input-bound" in out
    assert "lever:      increase-dataloader-workers" in out
    assert "data wait 55.0% of step time" in out
    assert "avoid:      faster-accelerator" in out


def test_snapshots_with_the_probes_goodput_carry_the_jobs_life_to_after(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    b, a = write_pair(tmp_path, JOBS["cpu-only starved"][0])
    for path, productive, lost in ((b, 10.0, 5.0), (a, 40.0, 20.0)):
        causes = {
            "startup": 5.0,
            "data-wait": lost - 5.0,
            "checkpoint": 0.0,
            "other": 0.0,
            "communication": 0.0,
        }
        lines = [f"dam_goodput_seconds_total {productive}"]
        lines += [f'dam_badput_seconds_total{{cause="{c}"}} {v}' for c, v in causes.items()]
        Path(path).write_text(Path(path).read_text() + "\n".join(lines) + "\n")
    status = run_json(capsys, [b, a, "--json"])
    goodput = status["goodput"]  # the job's life so far (cumulative counters), not the window
    assert goodput["elapsedSeconds"] == pytest.approx(60.0)
    assert goodput["ratio"] == pytest.approx(40.0 / 60.0)
    assert goodput["badputSeconds"]["dataWait"] == pytest.approx(15.0)
    assert goodput["acceleratorSecondsLost"] == 0.0  # NVML answers, no GPU is the job's
    assert main([b, a]) == 0
    out = capsys.readouterr().out
    assert "goodput:    66.7% of 60.0 s productive" in out
    assert "  d data wait" in out


def test_dam_cli_dispatches_to_evaluate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert dam(["evaluate", *write_pair(tmp_path, JOBS["starved"][0]), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["bottleneck"]["regime"] == "input-bound"


def test_garbage_file_exits_2_naming_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before, _ = write_pair(tmp_path, JOBS["starved"][0])
    bad = tmp_path / "garbage.prom"
    bad.write_text("# TYPE dam_steps_total counter\ndam_steps_total 12\nthis is { not prometheus\n")
    assert main([before, str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:3:" in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_binary_file_exits_2_with_a_clear_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before, _ = write_pair(tmp_path, JOBS["starved"][0])
    bad = tmp_path / "blob.prom"
    bad.write_bytes(b"\xff\xfe\x00garbage")
    assert main([before, str(bad)]) == 2
    assert "not UTF-8" in capsys.readouterr().err


def test_missing_file_exits_2_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before, _ = write_pair(tmp_path, JOBS["starved"][0])
    missing = tmp_path / "nope.prom"
    assert main([before, str(missing)]) == 2
    assert f"{missing}: no such file" in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra",
    [
        ["--peak-flops", "-5"],
        ["--elapsed-seconds", "nan"],
        ["--threshold", "noSuchThing=1"],
        ["--threshold", "x"],
    ],
)
def test_bad_options_exit_2_without_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str]
) -> None:
    assert main([*write_pair(tmp_path, JOBS["starved"][0]), *extra]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_missing_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "usage" in capsys.readouterr().err
