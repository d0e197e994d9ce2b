"""``dam evaluate`` refuses what it cannot judge, naming the file, the reason and the fix.

Part of the hostile-input test set (issue 17): empty snapshots, swapped or reset pairs
scraped from a live ``dam sidecar``, NaN / infinite / negative counters, garbage files
and huge ones. Exit status: 2 unusable input, 3 the pair cannot be compared, 4 a series
the verdict needs is NaN, infinite or negative.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from dam_contract import names as n
from dam_contract.snapshot import parse_snapshot
from dam_operator.cli import main as dam
from dam_operator.local.evaluate import (
    EXIT_INVALID_REQUIRED,
    EXIT_NOT_COMPARABLE,
    EXIT_UNUSABLE,
    EXIT_VERDICT,
)
from dam_probe.layout import ProbeRecord, encode, probe_path
from tests.support.procs import spawn
from tests.unit.diagnosis.snapshots import Job, snapshot_pair

STARVED = Job(
    wait_ratio=0.55, gpus=[{"util": 0.3, "sm": 0.2}], gpu_model="NVIDIA A100-SXM4-40GB", main_cpu_cores=0.5
)


@dataclass
class Outcome:
    rc: int
    out: str
    err: str

    def json(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.out)
        return data


def evaluate(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> Outcome:
    """``dam evaluate ARGV`` through the ``dam`` command line's entry point."""
    capsys.readouterr()
    rc = dam(["evaluate", *map(str, argv)])
    got = capsys.readouterr()
    return Outcome(rc, got.out, got.err)


def evaluate_process(*argv: str | Path) -> Outcome:
    """``dam evaluate ARGV`` as its own process, as a shell runs it."""
    done = subprocess.run(
        [sys.executable, "-m", "dam_operator.cli", "evaluate", *map(str, argv)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return Outcome(done.returncode, done.stdout, done.stderr)


def pair(tmp_path: Path, job: Job = STARVED) -> tuple[Path, Path]:
    before, after = snapshot_pair(job)
    b, a = tmp_path / "before.prom", tmp_path / "after.prom"
    b.write_text(before)
    a.write_text(after)
    return b, a


def replace_line(path: Path, series: str, value: str) -> None:
    """Sets the value of the sample line of ``series`` (name and labels as written) in ``path``."""
    lines = path.read_text().splitlines()
    hits = [i for i, line in enumerate(lines) if line.rsplit(" ", 1)[0] == series]
    assert len(hits) == 1, f"{series} not in {path}"
    lines[hits[0]] = f"{series} {value}"
    path.write_text("\n".join(lines) + "\n")


def assert_one_clear_line(err: str, *fragments: str) -> None:
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    for fragment in fragments:
        assert fragment in err, err


# --- a live sidecar: real snapshots ---------------------------------------------------------


class LiveSidecar:
    """``dam sidecar`` on a probe directory whose probe file this test rewrites."""

    def __init__(self, tmp_path: Path) -> None:
        self.probe_dir = tmp_path / "probe"
        self.probe_dir.mkdir()
        self.staging = tmp_path / "staging"
        self.staging.mkdir()
        self.publish(steps=100, step_s=50.0, wait_s=25.0)
        self.start()

    def start(self) -> None:
        env = {**os.environ, "DAM_FAKE_GPUS": "1", "DAM_GPU_ATTRIBUTION_FALLBACK": "all"}
        args = ["--host", "127.0.0.1", "--port", "0", "--probe-dir", str(self.probe_dir), "--interval", "0.2"]
        self.proc = spawn(
            [sys.executable, "-m", "dam_sidecar.app", *args],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env=env,
            cwd=self.probe_dir.parent,
        )
        assert self.proc.stderr is not None
        deadline, log = time.monotonic() + 30, []
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            log.append(line)
            m = re.search(r"listening on http://[^:]+:(\d+)/metrics", line)
            if m:
                self.url = f"http://127.0.0.1:{m.group(1)}/metrics"
                return
        self.close()
        raise AssertionError("sidecar did not start:\n" + "".join(log))

    def publish(self, *, steps: int, step_s: float, wait_s: float, start_time_ns: int = 1_000) -> None:
        """The training process's probe file, replaced whole (the sidecar never sees half of one).

        The sidecar keeps its counters monotonic over training processes (a new process
        adds to them); only a new sidecar starts them from zero.
        """
        record = ProbeRecord(
            pid=os.getpid(),
            start_time_ns=start_time_ns,
            steps=steps,
            wait_ns=int(wait_s * 1e9),
            step_ns=int(step_s * 1e9),
            last_update_ns=10**19 - 1,
            batch_size=32,
            flops_per_step=0.0,
            closed=False,
        )
        staged = self.staging / "probe.tmp"
        staged.write_bytes(encode(record))
        os.replace(staged, probe_path(str(self.probe_dir), os.getpid()))

    def scrape_when(self, path: Path, steps: float, after_time: float = 0.0) -> float:
        """Writes the first scrape with ``steps`` steps sampled after ``after_time``; its sample time."""
        deadline = time.monotonic() + 30
        with httpx.Client() as client:
            while time.monotonic() < deadline:
                text = client.get(self.url).text
                snap = parse_snapshot(text)
                stamp = snap.series(n.SNAPSHOT_TIMESTAMP_SECONDS).get((), 0.0)
                if snap.series(n.STEPS_TOTAL).get(()) == steps and stamp > after_time:
                    path.write_text(text)
                    return stamp
                time.sleep(0.05)
        raise AssertionError(f"the sidecar never served {steps} steps")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        assert self.proc.stderr is not None
        self.proc.stderr.close()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """Real scrapes of one sidecar: ``before``, ``after`` (60 more steps), ``reset`` (a new process)."""
    tmp = tmp_path_factory.mktemp("live")
    sidecar = LiveSidecar(tmp)
    try:
        files = {k: tmp / f"{k}.prom" for k in ("before", "after", "reset")}
        t = sidecar.scrape_when(files["before"], 100)
        sidecar.publish(steps=160, step_s=80.0, wait_s=40.0)
        t = sidecar.scrape_when(files["after"], 160, after_time=t)
        # The pod restarted: a new sidecar, a new training process, counters from zero again.
        sidecar.close()
        sidecar.publish(steps=20, step_s=10.0, wait_s=5.0, start_time_ns=2_000)
        sidecar.start()
        sidecar.scrape_when(files["reset"], 20, after_time=t)
        yield files
    finally:
        sidecar.close()


def test_live_snapshots_in_order_give_a_verdict(live: dict[str, Path]) -> None:
    got = evaluate_process(live["before"], live["after"], "--json")
    assert got.rc == EXIT_VERDICT, got.err
    assert got.json()["metrics"]["dataWaitRatio"] == pytest.approx(0.5)


def test_swapped_live_snapshots_are_refused_as_after_older_than_before(live: dict[str, Path]) -> None:
    got = evaluate_process(live["after"], live["before"])
    assert got.rc == EXIT_NOT_COMPARABLE
    assert got.out == ""
    assert_one_clear_line(
        got.err, f"{live['before']}: AFTER is older than BEFORE {live['after']}", "swap the files?"
    )


def test_swapped_snapshots_without_timestamps_are_refused_because_counters_went_back(
    live: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stripped = {}
    for k in ("before", "after"):
        text = live[k].read_text()
        stripped[k] = tmp_path / f"{k}.prom"
        stripped[k].write_text(
            "".join(x for x in text.splitlines(keepends=True) if n.SNAPSHOT_TIMESTAMP_SECONDS not in x)
        )
    got = evaluate(capsys, stripped["after"], stripped["before"], "--json")
    assert got.rc == EXIT_NOT_COMPARABLE
    assert f"AFTER is older than BEFORE {stripped['after']} (counters went back" in got.err
    assert "swap the files?" in got.err
    assert got.json()["error"]["reason"] == "after-older-than-before"


def test_a_counter_reset_between_live_snapshots_is_refused_as_a_restart(
    live: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    got = evaluate(capsys, live["after"], live["reset"], "--json")
    assert got.rc == EXIT_NOT_COMPARABLE
    assert_one_clear_line(got.err, "counter was reset", f"{n.STEPS_TOTAL} went from 160 to 20", "restarted")
    error = got.json()["error"]
    assert error["reason"] == "counter-reset"
    assert error["file"] == str(live["reset"])
    assert error["exitCode"] == EXIT_NOT_COMPARABLE


def test_the_same_live_snapshot_twice_is_refused(
    live: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    got = evaluate(capsys, live["before"], live["before"])
    assert got.rc == EXIT_NOT_COMPARABLE
    assert_one_clear_line(got.err, "same sample", "later")


# --- empty and foreign snapshots ------------------------------------------------------------


@pytest.mark.parametrize(
    "content", ["", "\n\n", "# HELP dam_steps_total Steps.\n# TYPE dam_steps_total counter\n"]
)
@pytest.mark.parametrize("which", ["BEFORE", "AFTER"])
def test_an_empty_snapshot_is_refused_naming_the_file_and_how_to_take_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], which: str, content: str
) -> None:
    before, after = pair(tmp_path)
    empty = before if which == "BEFORE" else after
    empty.write_text(content)
    got = evaluate(capsys, before, after)
    assert got.rc == EXIT_UNUSABLE
    assert got.out == ""
    assert_one_clear_line(got.err, f"{empty}: {which} is empty", "curl -s http://POD:9450/metrics")


def test_a_snapshot_of_another_exporter_is_refused_naming_what_it_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before, after = pair(tmp_path)
    after.write_text('# TYPE node_cpu_seconds_total counter\nnode_cpu_seconds_total{cpu="0"} 12\nup 1\n')
    got = evaluate(capsys, before, after, "--json")
    assert got.rc == EXIT_UNUSABLE
    assert_one_clear_line(got.err, str(after), "no dam_ series", "node_cpu_seconds_total", "9450")
    assert got.json()["error"] == {
        "exitCode": EXIT_UNUSABLE,
        "reason": "no-dam-series",
        "file": str(after),
        "message": got.err.strip().removeprefix("dam evaluate: "),
    }


# --- NaN, infinite and negative values ------------------------------------------------------


@pytest.mark.parametrize(
    ("where", "value", "shown"),
    [
        (("before", n.STEPS_TOTAL), "NaN", "NaN"),
        (("after", n.STEP_SECONDS_TOTAL), "+Inf", "+Inf"),
        (("after", n.DATALOADER_WAIT_SECONDS_TOTAL), "-3", "negative (-3)"),
        (("before", n.SNAPSHOT_TIMESTAMP_SECONDS), "NaN", "NaN"),
    ],
)
def test_a_required_series_with_a_bad_value_refuses_the_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: tuple[str, str], value: str, shown: str
) -> None:
    which, series = where
    before, after = pair(tmp_path)
    bad = before if which == "before" else after
    replace_line(bad, series, value)
    got = evaluate(capsys, before, after, "--json")
    assert got.rc == EXIT_INVALID_REQUIRED
    assert_one_clear_line(got.err, f"{bad}: {series} is {shown}", "refused")
    assert got.json()["error"]["reason"] == "invalid-required-series"


def test_a_bad_timestamp_is_not_required_when_the_window_length_is_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before, after = pair(tmp_path)
    replace_line(before, n.SNAPSHOT_TIMESTAMP_SECONDS, "NaN")
    got = evaluate(capsys, before, after, "--json", "--elapsed-seconds", "60")
    assert got.rc == EXIT_VERDICT
    assert got.json()["inputProblems"][0]["series"] == n.SNAPSHOT_TIMESTAMP_SECONDS


def test_a_bad_optional_counter_is_ignored_in_both_snapshots_and_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before, after = pair(tmp_path)
    cpu = f'{n.PROCESS_CPU_SECONDS_TOTAL}{{role="main"}}'
    replace_line(before, cpu, "NaN")
    got = evaluate(capsys, before, after, "--json")
    assert got.rc == EXIT_VERDICT
    status = got.json()
    # Not counted from zero (AFTER's 1030 s would read as 17 cores): not there at all.
    assert "mainCpuCores" not in status["metrics"]
    assert status["bottleneck"]["regime"] == "input-bound"
    assert status["inputProblems"] == [
        {
            "file": str(before),
            "snapshot": "BEFORE",
            "series": cpu,
            "value": "NaN",
            "problem": "not finite",
            "action": "ignored in both snapshots",
        }
    ]
    assert f"warning: {before}: {cpu} is NaN: ignored in both snapshots" in got.err


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-0.5"])
def test_a_bad_gauge_is_ignored_and_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    before, after = pair(tmp_path, Job(wait_ratio=0.55, gpus=[{"util": 0.3}, {"util": 0.5}]))
    util = f'{n.GPU_UTILIZATION_RATIO}{{gpu="1"}}'
    replace_line(after, util, value)
    got = evaluate(capsys, before, after, "--json")
    assert got.rc == EXIT_VERDICT
    status = got.json()
    assert status["metrics"]["gpuUtilization"] == pytest.approx(0.3)  # GPU 1 left out, not averaged in
    (problem,) = status["inputProblems"]
    assert problem["series"] == util
    assert problem["snapshot"] == "AFTER"
    assert problem["action"] == "ignored"
    assert problem["problem"] == ("negative" if value.startswith("-") else "not finite")
    assert util in got.err


def test_text_output_warns_about_ignored_series_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before, after = pair(tmp_path)
    replace_line(after, f'{n.GPU_SM_ACTIVE_RATIO}{{gpu="0"}}', "NaN")
    got = evaluate(capsys, before, after)
    assert got.rc == EXIT_VERDICT
    assert "regime:     input-bound" in got.out
    assert f'{n.GPU_SM_ACTIVE_RATIO}{{gpu="0"}} is NaN: ignored' in got.err


# --- garbage ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "where", "what"),
    [
        ("dam_steps_total 12\nthis is { not prometheus\n", ":2:", "not a sample line"),
        ('dam_steps_total{rank="0" 12\n', ":1:", "malformed label set"),
        ("dam_steps_total 1_000\n", ":1:", "is not a number"),
        ("dam_steps_total 0x10\n", ":1:", "is not a number"),
        ("dam_steps_total\n", ":1:", "no value"),
        ("dam_steps_total 1\ndam_steps_total 2\n", ":2:", "duplicate series"),
        ("dam_steps_total " + "9" * 70_000 + "\n", ":1:", "line longer than"),
        ('dam_steps_total{a="' + " " * 60_000 + "\n", ":1:", "malformed label set"),
    ],
    ids=["words", "open-labels", "underscore", "hex", "no-value", "duplicate", "long-line", "blanks"],
)
def test_a_garbage_file_is_refused_naming_file_line_and_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, where: str, what: str
) -> None:
    before, after = pair(tmp_path)
    after.write_text(content)
    started = time.monotonic()
    got = evaluate(capsys, before, after)
    assert time.monotonic() - started < 30  # 60,000 blanks once took a backtracking grammar 88 s
    assert got.rc == EXIT_UNUSABLE
    assert_one_clear_line(got.err, f"{after}{where}", what)


def test_a_binary_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before, after = pair(tmp_path)
    after.write_bytes(b"dam_steps_total 1\n\xff\xfe\x00garbage")
    got = evaluate(capsys, before, after)
    assert got.rc == EXIT_UNUSABLE
    assert_one_clear_line(got.err, str(after), "not UTF-8")


# --- huge snapshots --------------------------------------------------------------------------


def test_series_the_diagnosis_does_not_read_are_not_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before, after = pair(tmp_path)
    plain = evaluate(capsys, before, after, "--json")
    with open(after, "a", encoding="utf-8") as fh:
        for i in range(100_000):
            fh.write(f'http_requests_total{{path="/api/v1/items/{i:07d}",code="200"}} {i}\n')
    size = after.stat().st_size
    tracemalloc.start()
    try:
        padded = evaluate(capsys, before, after, "--json")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert padded.rc == EXIT_VERDICT, padded.err
    assert padded.json() == plain.json()
    # The file is ~6 MB; holding it, or its 100,000 series, takes more than that.
    assert peak < size / 4, (peak, size)


def test_more_dam_series_than_the_cap_are_refused_naming_the_cap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before, after = pair(tmp_path)
    with open(after, "a", encoding="utf-8") as fh:
        for i in range(5_000):
            fh.write(f'{n.GPU_UTILIZATION_RATIO}{{gpu="{i + 10}"}} 0.5\n')
    got = evaluate(capsys, before, after, "--max-series", "1000", "--json")
    assert got.rc == EXIT_UNUSABLE
    assert_one_clear_line(got.err, str(after), "more than 1000 dam_ series", "--max-series")
    assert got.json()["error"]["reason"] == "too-many-series"
    # Under a higher cap the same file is judged.
    assert evaluate(capsys, before, after, "--max-series", "10000").rc == EXIT_VERDICT
