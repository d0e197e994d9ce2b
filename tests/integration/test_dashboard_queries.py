"""Every query of the Grafana dashboard returns data from a real Prometheus.

Prometheus (the Debian binary) scrapes, once a second on loopback:

- a live ``dam sidecar`` subprocess, fed by a probe file that a small "training"
  subprocess writes with ``dam_probe.layout.ProbeWriter`` (30 % of each step waiting on
  the loader; rank 0 of a one-rank job with collectives), with two simulated GPUs
  (``DAM_FAKE_GPUS``) whose UUIDs the probe publishes; the machine has no cgroup v2 CPU
  controller, so ``DAM_CGROUP_ROOT`` points at a small cgroup v2 tree whose ``cpu.stat``
  the writer advances (and whose memory files hold a usage, a limit and one OOM kill);
- the operator's metrics (``OperatorMetrics`` on its own registry) holding a verdict of
  the real diagnosis engine, served by ``prometheus_client``, and two profiles' goodput:
  accelerator-seconds by use that a thread advances at known rates (``GOODPUT_RATES``), and
  their progress (``PROGRESS``: one stalled, one progressing).

The target labels ``namespace``/``pod`` are set like the chart's PodMonitor and
ServiceMonitor (``honor_labels`` for the operator) would set them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, start_http_server

from dam_operator.cluster.runtime.opmetrics import OperatorMetrics
from dam_operator.cluster.steps import metric_names as mn
from dam_operator.diagnosis.engine import diagnose
from dam_operator.diagnosis.model import Observation, Verdict
from tests.support.procs import CHILD_DIES_WITH_PARENT, free_port, spawn, stop_process

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "charts" / "dam-operator" / "dashboards" / "dam.json"
PROMETHEUS = shutil.which("prometheus")
NAMESPACE, POD, PROFILE = "ml", "train-0", "resnet"
WAIT_SHARE = 0.30  # share of each step the writer spends "waiting on the loader"
SCRAPE_SECONDS = 1
RATE_INTERVAL = "5s"  # Grafana's $__rate_interval for a 1 s scrape: at least 4 scrapes
RANGE = "1m"  # Grafana's $__range: the dashboard's time range
DEADLINE_SECONDS = 60.0

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (Debian package `prometheus`)"),
]

# One judged action in the profile's status.actions (the actions panels read it).
_ACTION = {
    "id": 1,
    "lever": "increase-dataloader-workers",
    "setting": {"name": "num_workers", "before": "0", "after": "2"},
    "outcome": "improved",
    "before": {"stepsPerSecond": 4.0, "dataWaitRatio": 0.6},
    "after": {"stepsPerSecond": 7.0, "dataWaitRatio": 0.1},
}

# Accelerator-seconds per second by use of two profiles' jobs (their GPUs times their shares).
GOODPUT_RATES = {
    PROFILE: {"productive": 1.6, "data-wait": 0.4},
    "bert": {"productive": 0.5, "checkpoint": 0.5},
}

# The two profiles' progress (status.progress.state, stalledSeconds) as the operator observes it.
PROGRESS = {PROFILE: ("Stalled", 412.0), "bert": ("Progressing", 0.0)}

FAKE_UUIDS = tuple(f"GPU-fake-{i:04d}-0000-0000-000000000000" for i in range(2))

# The "training process": publishes cumulative counters like the probe does, has one
# DataLoader-like child process (role=worker), and advances the cgroup's throttled time.
# The worker dies with the writer (PR_SET_PDEATHSIG): the writer is stopped by SIGTERM (or killed
# with the test), which runs no ``finally``, and a sleeping worker would live on under init.
WORKER = CHILD_DIES_WITH_PARENT + "import time\nwhile True:\n    time.sleep(0.2)\n"
WRITER = textwrap.dedent(
    """
    import os, sys, time, subprocess
    from dam_probe.layout import ProbeWriter, probe_path

    probe_dir, cgroup_dir, wait_share, uuids = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4:]
    worker = subprocess.Popen([sys.executable, "-c", WORKER_CODE, str(os.getpid())])
    writer = ProbeWriter(probe_path(probe_dir, os.getpid()), os.getpid())
    steps = wait_ns = step_ns = throttled_us = 0
    try:
        while True:
            t0 = time.perf_counter_ns()
            sum(i * i for i in range(20000))  # a little real CPU for role=main
            time.sleep(0.05)
            dt = time.perf_counter_ns() - t0
            steps += 1
            step_ns += dt
            wait_ns += int(dt * wait_share)
            throttled_us += dt // 10_000  # 10 % of wall time throttled
            writer.publish(
                steps, wait_ns, step_ns, batch_size=64, flops_per_step=1e12, device_uuids=tuple(uuids),
                rank=0, local_rank=0, world_size=1,
                collectives=(2 * steps, step_ns // 5, step_ns // 20, 4096 * steps),
            )
            with open(os.path.join(cgroup_dir, "cpu.stat.tmp"), "w") as f:
                f.write(f"usage_usec {step_ns // 1000}\\nnr_periods {steps}\\nnr_throttled {steps // 10}\\n"
                        f"throttled_usec {throttled_us}\\n")
            os.replace(os.path.join(cgroup_dir, "cpu.stat.tmp"), os.path.join(cgroup_dir, "cpu.stat"))
    finally:
        worker.kill()
    """
).replace("WORKER_CODE", repr(WORKER))


def _input_bound_verdict() -> Verdict:
    """A verdict of the real engine for a starved GPU (what the sidecar above simulates)."""
    return diagnose(
        Observation(
            window_seconds=60,
            steps=600,
            data_wait_ratio=WAIT_SHARE,
            gpu_count=2,
            gpu_utilization=0.55,
            sm_active=0.40,
            tensor_active=0.20,
            dram_bandwidth_utilization=0.30,
            main_cpu_cores=0.6,
            worker_cpu_cores=3.5,
            worker_count=4,
            cpu_throttled_ratio=0.1,
            batch_size=64,
            flops_per_step=1e12,
            gpu_model="H100",
        )
    )


def _advance_goodput(metrics: OperatorMetrics, stop: threading.Event) -> None:
    """The operator's goodput counters, as its windows would advance them (0.2 s windows)."""
    totals = {profile: dict.fromkeys(mn.ACCELERATOR_USES, 0.0) for profile in GOODPUT_RATES}
    last = time.monotonic()
    while not stop.wait(0.2):
        now = time.monotonic()
        for profile, rates in GOODPUT_RATES.items():
            for use, rate in rates.items():
                totals[profile][use] += rate * (now - last)
            ratio = rates.get("productive", 0.0) / sum(rates.values())
            metrics.observe_goodput(NAMESPACE, profile, accelerator_seconds=totals[profile], ratio=ratio)
        last = now


@dataclass
class Stack:
    api: str
    verdict: Verdict


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    base = tmp_path_factory.mktemp("dashboard")
    probe_dir, cgroup_dir, storage = base / "probe", base / "cgroup", base / "tsdb"
    for d in (probe_dir, cgroup_dir, storage):
        d.mkdir()
    # A cgroup v2 tree: the training process's /proc/PID/cgroup reads "0::/" here.
    (cgroup_dir / "cgroup.controllers").write_text("cpu memory\n")
    (cgroup_dir / "cpu.max").write_text("200000 100000\n")
    (cgroup_dir / "cpu.stat").write_text("usage_usec 0\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\n")
    (cgroup_dir / "memory.current").write_text(f"{300 * 2**20}\n")
    (cgroup_dir / "memory.max").write_text(f"{2 * 2**30}\n")
    (cgroup_dir / "memory.events").write_text("low 0\nhigh 0\nmax 0\noom 1\noom_kill 1\n")

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "sidecar"), str(ROOT / "operator")])}
    procs: list[subprocess.Popen[bytes]] = []
    stops: list[Callable[[], None]] = []
    server = None
    try:
        procs.append(
            spawn(
                [sys.executable, "-c", WRITER, str(probe_dir), str(cgroup_dir), str(WAIT_SHARE), *FAKE_UUIDS],
                env=env,
            )
        )
        sidecar_port = free_port()
        procs.append(
            spawn(
                [
                    *(sys.executable, "-m", "dam_operator.cli", "sidecar", "--host", "127.0.0.1"),
                    *("--port", str(sidecar_port), "--probe-dir", str(probe_dir), "--interval", "0.5"),
                ],
                env={**env, "DAM_FAKE_GPUS": "2", "DAM_CGROUP_ROOT": str(cgroup_dir)},
            )
        )

        verdict = _input_bound_verdict()
        registry = CollectorRegistry()
        metrics = OperatorMetrics(registry)
        metrics.observe_verdict(NAMESPACE, PROFILE, verdict, timestamp_seconds=time.time())
        metrics.set_pods(NAMESPACE, PROFILE, matched=1, instrumented=1, reporting=1)
        metrics.observe_actions(NAMESPACE, PROFILE, [_ACTION])
        metrics.action("improved")
        metrics.set_profiles(1)
        metrics.evaluation(ok=True)
        metrics.evaluation(ok=False, reason="scrape")
        metrics.observe_verdict(NAMESPACE, "bert", verdict, timestamp_seconds=time.time())
        for profile, (state, stalled_seconds) in PROGRESS.items():
            metrics.observe_progress(NAMESPACE, profile, state, stalled_seconds)
        stop_goodput = threading.Event()
        goodput = threading.Thread(target=_advance_goodput, args=(metrics, stop_goodput), daemon=True)
        goodput.start()
        stops.append(stop_goodput.set)
        operator_port = free_port()
        server, _thread = start_http_server(operator_port, addr="127.0.0.1", registry=registry)

        config = {
            "global": {"scrape_interval": f"{SCRAPE_SECONDS}s", "evaluation_interval": f"{SCRAPE_SECONDS}s"},
            "scrape_configs": [
                {
                    "job_name": "dam-sidecar",
                    "static_configs": [
                        {
                            "targets": [f"127.0.0.1:{sidecar_port}"],
                            "labels": {"namespace": NAMESPACE, "pod": POD},
                        }
                    ],
                },
                {
                    "job_name": "dam-operator",
                    "honor_labels": True,
                    "static_configs": [
                        {
                            "targets": [f"127.0.0.1:{operator_port}"],
                            "labels": {"namespace": "dam-system", "pod": "dam-operator-0"},
                        }
                    ],
                },
            ],
        }
        config_file = base / "prometheus.yml"
        config_file.write_text(json.dumps(config))  # JSON is YAML
        prom_port = free_port()
        procs.append(
            spawn(
                [
                    str(PROMETHEUS),
                    f"--config.file={config_file}",
                    f"--storage.tsdb.path={storage}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                    "--log.level=warn",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
        )
        api = f"http://127.0.0.1:{prom_port}/api/v1"
        _wait_for_targets(api, procs)
        yield Stack(api=api, verdict=verdict)
    finally:
        for stop in stops:
            stop()
        if server is not None:
            server.shutdown()
            server.server_close()
        for proc in reversed(procs):
            stop_process(proc)


def _wait_for_targets(api: str, procs: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + DEADLINE_SECONDS
    last = "no answer"
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                err = proc.stderr.read().decode() if proc.stderr else ""
                pytest.fail(f"{proc.args!r} exited with {proc.returncode}: {err[-2000:]}")
        try:
            targets = httpx.get(f"{api}/targets", timeout=2).json()["data"]["activeTargets"]
            health = {t["labels"]["job"]: t["health"] for t in targets}
            last = repr(health)
            if health and all(h == "up" for h in health.values()) and len(health) == 2:
                return
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        time.sleep(0.5)
    pytest.fail(f"Prometheus targets did not come up: {last}")


# ------------------------------------------------------------------ the dashboard


def _dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def _panel_targets() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for panel in _dashboard()["panels"]:
        for target in panel.get("targets", []):
            out.append((f"{panel['title']} [{target['refId']}]", target))
    return out


def _variables() -> list[dict[str, Any]]:
    return [v for v in _dashboard()["templating"]["list"] if v["type"] == "query"]


def _substitute(expr: str, values: dict[str, str]) -> str:
    for name, value in values.items():
        expr = expr.replace(f"${name}", value)
    expr = expr.replace("$__rate_interval", RATE_INTERVAL).replace("$__range", RANGE)
    assert "$" not in expr, f"unsubstituted variable left in {expr!r}"
    return expr


def _grafana_regex_escape(value: str) -> str:
    """What Grafana puts in place of a multi-value variable inside a PromQL string literal."""
    return re.sub(r"[\\$^*{}\[\]'+?.()|]", lambda m: "\\\\" + m.group(0), value)


def _label_values(api: str, query: str, values: dict[str, str]) -> list[str]:
    """Grafana's ``label_values(selector, label)`` through Prometheus' label values API."""
    m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query.strip())
    assert m, f"unsupported variable query {query!r}"
    selector, label = _substitute(m.group(1), values), m.group(2)
    body = httpx.get(f"{api}/label/{label}/values", params={"match[]": selector}, timeout=5).json()
    assert body["status"] == "success", body
    result: list[str] = body["data"]
    return result


def _query(api: str, expr: str, instant: bool) -> list[dict[str, Any]]:
    if instant:
        response = httpx.get(f"{api}/query", params={"query": expr}, timeout=10)
    else:
        now = time.time()
        response = httpx.get(
            f"{api}/query_range",
            params={"query": expr, "start": now - 30, "end": now, "step": SCRAPE_SECONDS},
            timeout=10,
        )
    body = response.json()
    assert response.status_code == 200 and body["status"] == "success", f"{expr}: {body}"
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def _poll(api: str, expr: str, instant: bool) -> list[dict[str, Any]]:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while True:
        result = _query(api, expr, instant)
        if result or time.monotonic() > deadline:
            return result
        time.sleep(1.0)


@pytest.fixture(scope="module")
def variable_values(stack: Stack) -> dict[str, str]:
    """Each variable set to one of the values its own query offers (in dashboard order)."""
    chosen = {"namespace": NAMESPACE, "profile": PROFILE, "pod": POD}
    values: dict[str, str] = {}
    deadline = time.monotonic() + DEADLINE_SECONDS
    for variable in _variables():
        while True:
            offered = _label_values(stack.api, variable["query"]["query"], values)
            if chosen[variable["name"]] in offered or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        assert chosen[variable["name"]] in offered, f"${variable['name']} offers {offered}"
        values[variable["name"]] = _grafana_regex_escape(chosen[variable["name"]])
    return values


def test_dashboard_variables_offer_the_scraped_namespace_profile_and_pod(
    variable_values: dict[str, str],
) -> None:
    assert set(variable_values) == {v["name"] for v in _variables()} == {"namespace", "profile", "pod"}


@pytest.mark.parametrize(("name", "target"), _panel_targets(), ids=[n for n, _ in _panel_targets()])
def test_panel_query_returns_data(
    stack: Stack, variable_values: dict[str, str], name: str, target: dict[str, Any]
) -> None:
    expr = _substitute(target["expr"], variable_values)
    result = _poll(stack.api, expr, instant=bool(target.get("instant")))
    assert result, f"panel {name}: no data for {expr}"


def test_data_wait_panel_shows_the_share_of_step_time_spent_waiting(
    stack: Stack, variable_values: dict[str, str]
) -> None:
    (target,) = [t for n, t in _panel_targets() if n == "Data wait ratio [A]"]
    result = _poll(stack.api, _substitute(target["expr"], variable_values), instant=True)
    assert result, "no data wait ratio"
    value = float(result[0]["value"][1])
    assert value == pytest.approx(WAIT_SHARE, abs=0.05)
    assert result[0]["metric"] == {"namespace": NAMESPACE, "pod": POD}


def test_verdict_table_shows_the_engine_verdict(stack: Stack, variable_values: dict[str, str]) -> None:
    (target,) = [t for n, t in _panel_targets() if n == "Verdict per profile [A]"]
    result = _poll(stack.api, _substitute(target["expr"], variable_values), instant=True)
    assert len(result) == 1
    labels = result[0]["metric"]
    bottleneck = stack.verdict.bottleneck
    assert (labels["namespace"], labels["profile"]) == (NAMESPACE, PROFILE)
    assert (labels["axis"], labels["regime"]) == (bottleneck.axis.value, bottleneck.regime.value)


def test_gpu_panel_reports_only_the_gpus_the_probe_attributes(
    stack: Stack, variable_values: dict[str, str]
) -> None:
    (target,) = [t for n, t in _panel_targets() if n == "GPU utilization per GPU [A]"]
    result = _poll(stack.api, _substitute(target["expr"], variable_values), instant=True)
    assert sorted(r["metric"]["gpu"] for r in result) == ["0", "1"]
    uuids = _query(stack.api, f'count by (uuid) (dam_gpu_utilization_ratio{{pod="{POD}"}})', instant=True)
    assert sorted(r["metric"]["uuid"] for r in uuids) == sorted(FAKE_UUIDS)


def test_fleet_query_sums_accelerator_seconds_by_use_across_profiles(stack: Stack) -> None:
    """The fleet's accelerator-hours by cause in one PromQL sum, as docs/operator.md gives it."""
    expr = f"sum by (use) (rate({mn.PROFILE_ACCELERATOR_SECONDS_TOTAL}[10s]))"
    expected = {use: sum(r.get(use, 0.0) for r in GOODPUT_RATES.values()) for use in mn.ACCELERATOR_USES}
    deadline = time.monotonic() + DEADLINE_SECONDS

    def settled(by_use: dict[str, float]) -> bool:
        return set(by_use) == set(expected) and all(
            by_use[use] == pytest.approx(rate, rel=0.15, abs=0.01) for use, rate in expected.items()
        )

    while True:  # until the counters have 10 s of samples behind them (rate() ramps up before)
        by_use = {r["metric"]["use"]: float(r["value"][1]) for r in _query(stack.api, expr, instant=True)}
        if settled(by_use) or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    assert set(by_use) == set(mn.ACCELERATOR_USES), by_use
    for use, rate in expected.items():
        assert by_use[use] == pytest.approx(rate, rel=0.15, abs=0.01), (use, by_use)


def test_jobs_table_ranks_profiles_by_hours_lost_with_their_lever(
    stack: Stack, variable_values: dict[str, str]
) -> None:
    (target,) = [t for n, t in _panel_targets() if n == "Jobs that lose the most accelerator-hours [A]"]
    everyone = {**variable_values, "profile": ".*"}
    result = _poll(stack.api, _substitute(target["expr"], everyone), instant=True)
    rows = {r["metric"]["profile"]: r for r in result}
    assert set(rows) == set(GOODPUT_RATES), result
    lever = stack.verdict.bottleneck.lever
    assert all(r["metric"]["lever"] == lever for r in rows.values())
    # bert loses 0.5 accelerator-s/s, resnet 0.4: bert first.
    assert float(rows["bert"]["value"][1]) > float(rows[PROFILE]["value"][1]) > 0


def test_progress_table_shows_each_profiles_state_and_how_long_it_stalled(
    stack: Stack, variable_values: dict[str, str]
) -> None:
    everyone = {**variable_values, "profile": ".*"}
    (state_target,) = [t for n, t in _panel_targets() if n == "Progress per profile [A]"]
    (stalled_target,) = [t for n, t in _panel_targets() if n == "Progress per profile [B]"]
    states = _poll(stack.api, _substitute(state_target["expr"], everyone), instant=True)
    stalled = _poll(stack.api, _substitute(stalled_target["expr"], everyone), instant=True)
    assert {r["metric"]["profile"]: r["metric"]["state"] for r in states} == {
        profile: state for profile, (state, _) in PROGRESS.items()
    }
    assert {r["metric"]["profile"]: float(r["value"][1]) for r in stalled} == {
        profile: seconds for profile, (_, seconds) in PROGRESS.items()
    }
