"""``dam sidecar`` as a process: /metrics in both formats, /healthz, flags over env, clean shutdown."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from dam_contract import names as n
from dam_contract.snapshot import parse_snapshot
from dam_probe import lastwords
from dam_sidecar.app import build_parser, http_limits, settings_from_args
from dam_sidecar.httpserver import HttpLimits
from dam_sidecar.settings import SidecarSettings
from tests.support.procs import spawn

from .conftest import write_probe


class Sidecar:
    def __init__(self, proc: subprocess.Popen[str], port: int, log: list[str]) -> None:
        self.proc = proc
        self.port = port
        self.log = log

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def start_sidecar(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> Sidecar:
    full_env = {**os.environ, "DAM_FAKE_GPUS": "2", "DAM_GPU_ATTRIBUTION_FALLBACK": "all", **(env or {})}
    proc = spawn(
        [sys.executable, "-m", "dam_sidecar.app", "--host", "127.0.0.1", "--port", "0", *args],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=full_env,
        cwd=tmp_path,
    )
    assert proc.stderr is not None
    log: list[str] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        log.append(line)
        m = re.search(r"listening on http://[^:]+:(\d+)/metrics", line)
        if m:
            return Sidecar(proc, int(m.group(1)), log)
    proc.kill()
    proc.wait()
    proc.stderr.close()
    raise AssertionError("sidecar did not start:\n" + "".join(log))


def stop(sc: Sidecar) -> tuple[int, str]:
    sc.proc.send_signal(signal.SIGTERM)
    try:
        rc = sc.proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        sc.proc.kill()
        sc.proc.wait()
        rc = -9
    assert sc.proc.stderr is not None
    rest = sc.proc.stderr.read()
    sc.proc.stderr.close()
    return rc, "".join(sc.log) + rest


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[Sidecar]:
    probe_dir = tmp_path / "probe"
    probe_dir.mkdir()
    write_probe(probe_dir, pid=os.getpid(), steps=42, wait_ns=3 * 10**9, step_ns=6 * 10**9)
    sc = start_sidecar(tmp_path, "--probe-dir", str(probe_dir), "--interval", "0.2")
    try:
        yield sc
    finally:
        if sc.proc.poll() is None:
            stop(sc)


def test_metrics_endpoint_serves_the_probe_counters_and_fake_gpus(sidecar: Sidecar) -> None:
    with httpx.Client() as client:
        r = client.get(sidecar.url + "/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    snap = parse_snapshot(r.text)
    assert snap.series(n.STEPS_TOTAL)[()] == 42
    assert snap.series(n.PROBE_UP)[()] == 1.0
    assert len(snap.samples(n.GPU_UTILIZATION_RATIO)) == 2
    assert snap.samples(n.PROCESS_CPU_SECONDS_TOTAL)


def test_openmetrics_is_served_when_the_accept_header_asks(sidecar: Sidecar) -> None:
    with httpx.Client() as client:
        r = client.get(
            sidecar.url + "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
        )
    assert r.headers["content-type"].startswith("application/openmetrics-text")
    assert r.text.rstrip().endswith("# EOF")
    assert "dam_steps_total 42.0" in r.text


def test_healthz_and_unknown_paths(sidecar: Sidecar) -> None:
    with httpx.Client() as client:
        assert client.get(sidecar.url + "/healthz").status_code == 200
        assert client.get(sidecar.url + "/nope").status_code == 404


def test_live_metrics_pass_promtool_check_metrics(sidecar: Sidecar) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package 'prometheus')")
    time.sleep(0.5)  # a few ticks: GPM series appear from the second one
    with httpx.Client() as client:
        body = client.get(sidecar.url + "/metrics").content
    assert b"dam_gpu_sm_active_ratio" in body
    done = subprocess.run(
        [promtool, "check", "metrics"], input=body, capture_output=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()


def test_sigterm_stops_the_sidecar_with_exit_code_zero(sidecar: Sidecar) -> None:
    rc, log = stop(sidecar)
    assert rc == 0, log
    assert "stopped" in log


def test_flags_override_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DAM_PORT", "1234")
    monkeypatch.setenv("DAM_PROBE_DIR", "/from/env")
    monkeypatch.setenv("DAM_INTERVAL_SECONDS", "5")
    s = settings_from_args(build_parser().parse_args(["--port", "9999", "--interval", "0.5"]))
    assert (s.port, s.interval_seconds, s.probe_dir) == (9999, 0.5, "/from/env")


def test_pids_setting_accepts_a_comma_separated_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DAM_PIDS", "12, 34")
    s = settings_from_args(build_parser().parse_args([]))
    assert s.pids == [12, 34]


def test_invalid_setting_is_a_clear_error_not_a_traceback(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dam_sidecar.app", "--interval", "-1"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 2
    assert "interval_seconds" in done.stderr and "Traceback" not in done.stderr


def test_port_in_use_is_a_clear_error(sidecar: Sidecar, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dam_sidecar.app", "--host", "127.0.0.1", "--port", str(sidecar.port)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        cwd=tmp_path,
        env={**os.environ, "DAM_FAKE_GPUS": "1"},
    )
    assert done.returncode == 1
    assert "cannot listen" in done.stderr and "Traceback" not in done.stderr


def test_every_http_setting_reaches_the_server_and_the_defaults_agree() -> None:
    assert http_limits(SidecarSettings()) == HttpLimits()  # HttpLimits' defaults are the settings'
    changed = SidecarSettings(
        http_listen_backlog=7,
        http_max_connections=8,
        http_worker_threads=2,
        http_request_timeout_seconds=1.5,
        http_idle_timeout_seconds=2.5,
        http_write_timeout_seconds=3.5,
        http_max_header_bytes=2048,
        http_max_body_bytes=10,
    )
    assert http_limits(changed) == HttpLimits(7, 8, 2, 1.5, 2.5, 3.5, 2048, 10)


def _goodput_record(probe_dir: Path, *, closed: bool) -> dict[str, int]:
    """A rank-0 process's file with goodput and checkpoint figures (its last publish 2 s ago)."""
    now = time.time_ns()
    fields = {
        "pid": os.getpid(),
        "steps": 40,
        "wait_ns": 3_000_000_000,
        "step_ns": 9_000_000_000,
        "last_update_ns": now - 2 * 10**9,
        "closed": closed,
        "rank": 0,
        "local_rank": 0,
        "world_size": 2,
        "collectives": 80,
        "collective_ns": 2_000_000_000,
        "collective_exposed_ns": 1_500_000_000,
        "collective_bytes": 1024,
        "process_start_ns": now - 30 * 10**9,
        "startup_ns": 12_000_000_000,
        "productive_ns": 4_000_000_000,
        "other_ns": 7_000_000_000,
        "flops_state": 0,
        "checkpoint_ns": 2_500_000_000,
        "checkpoint_step_ns": 0,
        "checkpoints": 2,
        "last_checkpoint_ns": now - 5 * 10**9,
        "last_checkpoint_steps": 33,
    }
    write_probe(probe_dir, **fields)
    return fields


@pytest.mark.parametrize("closed", [False, True], ids=["running-when-stopped", "ended-before-the-stop"])
def test_sigterm_writes_each_ranks_goodput_figures_to_the_termination_message_as_it_exports_them(
    tmp_path: Path, closed: bool
) -> None:
    """``dam_sidecar.farewell``: what the operator reads from the Pod's last body is what its
    scrapes read, taken at the rank's last publish, whether the process still ran or ended."""
    probe_dir = tmp_path / "probe"
    probe_dir.mkdir()
    fields = _goodput_record(probe_dir, closed=closed)
    message = tmp_path / "termination-log"
    message.write_text("")  # the kubelet's empty file
    sc = start_sidecar(
        tmp_path,
        "--probe-dir",
        str(probe_dir),
        "--interval",
        "0.2",
        env={"DAM_TERMINATION_MESSAGE_PATH": str(message)},
    )
    try:
        with httpx.Client() as client:
            snap = parse_snapshot(client.get(sc.url + "/metrics").text)
    finally:
        rc, log = stop(sc)
    assert rc == 0, log
    (words,) = lastwords.parse(message.read_text())
    t = words.totals
    assert t is not None and words.rank == 0 and words.steps == 40
    bad = {s.label("cause"): s.value for s in snap.samples(n.BADPUT_SECONDS_TOTAL)}
    assert t.productive_ms == round(1000 * snap.series(n.GOODPUT_SECONDS_TOTAL)[(("rank", "0"),)]) == 4_000
    assert (t.startup_ms, t.data_wait_ms, t.communication_ms, t.checkpoint_ms, t.other_ms) == tuple(
        round(1000 * bad[c]) for c in ("startup", "data-wait", "communication", "checkpoint", "other")
    )
    assert abs(t.at_ms - fields["last_update_ns"] / 1e6) <= 1  # when the figures were taken
    assert t.steps_since_checkpoint == 40 - 33
    assert "wrote 1 ranks' goodput figures" in log


def test_without_the_kubelets_file_the_sidecar_writes_nothing_and_stops_cleanly(tmp_path: Path) -> None:
    probe_dir = tmp_path / "probe"
    probe_dir.mkdir()
    _goodput_record(probe_dir, closed=False)
    missing = tmp_path / "none"
    sc = start_sidecar(
        tmp_path, "--probe-dir", str(probe_dir), env={"DAM_TERMINATION_MESSAGE_PATH": str(missing)}
    )
    rc, log = stop(sc)
    assert rc == 0 and not missing.exists(), log
