"""Operator at scale against a REAL Kubernetes API server: N profiles x M pods, fake sidecars on loopback.

    .venv/bin/python benchmarks/operator_scale.py [--profiles 5000] [--pods-per-profile 2]
        [--window-seconds 30] [--duration 90]

What it does:

1. starts etcd + kube-apiserver (``tests.support.kubecluster.ControlPlane``, the binaries of
   ``make kube-bin``), applies the CRD and the operator's ServiceAccount and RBAC from
   ``deploy/dam-operator.yaml`` (the chart, rendered);
2. starts ONE fake-sidecar HTTP server in a child process (``tests.support.fake_sidecar``):
   every pod gets its own loopback podIP (127.x.y.z), which tells the server which job's
   counters to serve (all jobs start input-starved);
3. creates N DAMProfiles and N x M pods through the API (concurrently, keep-alive), and plays
   the kubelet: each pod's status (Running, podIP) is written through ``pods/status``;
4. starts the real ``dam operator`` as a child process (its own RSS and CPU, read from
   /proc), authenticated as the chart's ServiceAccount (so the API server's RBAC and
   priority-and-fairness treat it as they would in a cluster), no webhook;
5. watches the DAMProfiles (one watch of this script: the lag and what each status write changed)
   until every profile says Data; then measures ``--duration`` seconds of steady state (nothing
   changes in the jobs): operator CPU and RSS, status writes per profile per window, what they
   changed, and the API requests of that time from the API server's own ``/metrics``
   (``apiserver_request_total`` by verb and resource; this script sends none meanwhile);
6. at time T switches every fake sidecar to compute-bound and records, per profile, when the
   watch first shows Machine: the lag p50/p99.

Prints the figures and PASS/FAIL against the targets: peak RSS <= 200 MiB, lag p99 <=
window + interval + 2 s (with ``hysteresisWindows: 1``; each extra confirmation window adds up
to one window), <= 1 status write per profile per window, and none in the steady state when
nothing but ``lastEvaluationTime`` would change.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools" / "node"))  # dam_cluster (tests.support.kubecluster imports it)

from tests.support.fake_sidecar import COMPUTE, FakeJob, ThreadedFakeSidecars, pod_ip  # noqa: E402
from tests.support.kubecluster import ControlPlane, find_kube_binaries  # noqa: E402
from tests.support.procs import free_port, stop_process, wait_for  # noqa: E402

RSS_TARGET_MIB = 200.0
NAMESPACE = "scale"
OPERATOR_NAMESPACE = "dam-system"
SERVICE_ACCOUNT = "dam-operator"
PROFILES_PATH = f"/apis/dam.mlsys.dev/v1alpha1/namespaces/{NAMESPACE}/damprofiles"
PODS_PATH = f"/api/v1/namespaces/{NAMESPACE}/pods"
RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
NOISE = 1e-6  # relative: a figure that moved less than this only moved by floating-point rounding
CLK_TCK = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------- the fake sidecars (child process)


def serve_sidecars(count: int) -> int:
    """Child process: ``count`` fake jobs on one port; commands on stdin, one answer line each."""
    with ThreadedFakeSidecars("0.0.0.0") as sidecars:
        for index in range(count):
            sidecars.add(pod_ip(index), FakeJob())
        print(f"port {sidecars.port}", flush=True)
        for line in sys.stdin:
            command = line.strip()
            if command == "compute":
                for job in sidecars.jobs.values():
                    job.switch(COMPUTE)
                print("ok", flush=True)
            elif command == "requests":
                print(sidecars.requests, flush=True)
            else:
                print(f"unknown command {command!r}", flush=True)
    return 0


class SidecarProcess:
    def __init__(self, count: int, log: Path) -> None:
        self._log = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve-sidecars", str(count)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        first = self._readline()
        if not first.startswith("port "):
            raise RuntimeError(f"the fake sidecars did not start: {first!r} (see {log})")
        self.port = int(first.split()[1])

    def _readline(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def command(self, command: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._readline()

    def stop(self) -> None:
        stop_process(self.proc)
        self._log.close()


# ---------------------------------------------------------------- objects


def _profile(i: int, port: int, window: float, interval: float, hysteresis: int) -> dict[str, Any]:
    return {
        "apiVersion": "dam.mlsys.dev/v1alpha1",
        "kind": "DAMProfile",
        "metadata": {"name": f"p{i:05d}"},
        "spec": {
            "selector": {"matchLabels": {"job": f"j{i:05d}"}},
            "sampling": {"intervalSeconds": interval},
            "evaluation": {"windowSeconds": window, "hysteresisWindows": hysteresis},
            "sidecar": {"port": port},
        },
    }


def _pod(i: int, k: int) -> dict[str, Any]:
    """A pod as the webhook would have left it: the native sidecar is already there."""
    sidecar = {"name": "dam-sidecar", "image": "dam:bench", "restartPolicy": "Always"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"p{i:05d}-{k}", "labels": {"job": f"j{i:05d}", "batch": str(i // 250)}},
        "spec": {"initContainers": [sidecar], "containers": [{"name": "train", "image": "python:3.11"}]},
    }


def _running_status(ip: str, now: str) -> dict[str, Any]:
    """What a kubelet writes for a started pod (the fields the operator reads, and a few more)."""

    def running(name: str, image: str) -> dict[str, Any]:
        return {
            "name": name,
            "image": image,
            "imageID": "",
            "ready": True,
            "started": True,
            "restartCount": 0,
            "state": {"running": {"startedAt": now}},
        }

    return {
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": now}
                for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "startTime": now,
            "containerStatuses": [running("train", "python:3.11")],
            "initContainerStatuses": [running("dam-sidecar", "dam:bench")],
        }
    }


def _operator_rbac() -> str:
    """The ServiceAccount and (Cluster)Roles(Bindings) of the rendered chart, as one YAML stream."""
    docs = yaml.safe_load_all((ROOT / "deploy" / "dam-operator.yaml").read_text())
    return yaml.safe_dump_all([d for d in docs if d and d.get("kind") in RBAC_KINDS])


# ---------------------------------------------------------------- API calls


async def _call(
    client: httpx.AsyncClient, method: str, path: str, body: Any, content_type: str = "application/json"
) -> None:
    """One write, retried on throttling, server errors and dropped connections."""
    for attempt in range(8):
        try:
            r = await client.request(method, path, json=body, headers={"Content-Type": content_type})
        except httpx.TransportError:
            await asyncio.sleep(0.5 * (attempt + 1))
            continue
        if r.status_code in (200, 201):
            return
        if r.status_code == 409 and method == "POST":
            return  # created by an earlier try whose answer was lost
        if r.status_code in (429, 500, 503, 504):
            await asyncio.sleep(float(r.headers.get("Retry-After", 0.5 * (attempt + 1))))
            continue
        raise RuntimeError(f"{method} {path} -> {r.status_code}: {r.text[:300]}")
    raise RuntimeError(f"{method} {path}: gave up after retries")


async def _bulk(jobs: list[Callable[[], Awaitable[None]]], concurrency: int) -> None:
    limit = asyncio.Semaphore(concurrency)

    async def one(job: Callable[[], Awaitable[None]]) -> None:
        async with limit:
            await job()

    await asyncio.gather(*(one(j) for j in jobs))


_LABEL = re.compile(r'(\w+)="([^"]*)"')


async def apiserver_requests(client: httpx.AsyncClient) -> Counter[tuple[str, str, str]]:
    """``apiserver_request_total`` summed by (verb, resource[/subresource], code class)."""
    text = (await client.get("/metrics")).text
    out: Counter[tuple[str, str, str]] = Counter()
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels_text, _, value = line.rpartition(" ")
        labels = dict(_LABEL.findall(labels_text))
        resource = labels.get("resource") or "(non-resource)"
        if labels.get("subresource"):
            resource += "/" + labels["subresource"]
        code = labels.get("code", "")
        out[(labels.get("verb", ""), resource, f"{code[:1]}xx" if code else "")] += int(float(value))
    return out


# ---------------------------------------------------------------- processes


def delay_buckets(metrics_text: str) -> dict[str, float]:
    """``dam_operator_evaluation_delay_seconds`` buckets (cumulative counts by ``le``)."""
    out: dict[str, float] = {}
    for m in re.finditer(
        r'^dam_operator_evaluation_delay_seconds_bucket\{le="([^"]+)"\} (\S+)$', metrics_text, re.M
    ):
        out[m.group(1)] = float(m.group(2))
    return out


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


def rss_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) in MiB: resident now and the peak."""
    found: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0]) / 1024
    return found["VmRSS"], found["VmHWM"]


# ---------------------------------------------------------------- the watch


def changed_paths(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Leaf paths that differ between two JSON values (lists of equal length element-wise)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for key in sorted(set(old) | set(new)):
            out += changed_paths(old.get(key), new.get(key), f"{prefix}.{key}" if prefix else key)
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        out = []
        for index, (a, b) in enumerate(zip(old, new, strict=True)):
            out += changed_paths(a, b, f"{prefix}[{index}]")
        return out
    return [] if old == new else [prefix]


def _leaf(doc: Any, path: str) -> Any:
    for part in re.findall(r"[^.\[\]]+", path):
        if isinstance(doc, list):
            doc = doc[int(part)] if part.isdigit() and int(part) < len(doc) else None
        elif isinstance(doc, dict):
            doc = doc.get(part)
        else:
            return None
    return doc


def classify(old: dict[str, Any], new: dict[str, Any]) -> tuple[str, list[str]]:
    """What a MODIFIED event changed in ``status``: a category and the changed leaf paths."""
    paths = [p for p in changed_paths(old, new) if p != "lastEvaluationTime"]
    if not paths:
        return ("no status change" if old == new else "lastEvaluationTime only"), []

    def number(v: Any) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool)

    pairs = [(_leaf(old, p), _leaf(new, p)) for p in paths]
    if all(number(a) and number(b) for a, b in pairs):
        if all(abs(a - b) <= NOISE * max(abs(a), abs(b), 1e-12) for a, b in pairs):
            return "figures, rounding noise only", paths
        return "figures only", paths
    return "verdict, conditions or pods", paths


@dataclass
class ProfileWatch:
    """This script's one watch of the DAMProfiles: the current status of each, what writes changed."""

    client: httpx.AsyncClient
    status: dict[str, dict[str, Any]] = field(default_factory=dict)
    categories: Counter[str] = field(default_factory=Counter)
    paths: Counter[str] = field(default_factory=Counter)
    switch_at: float | None = None
    switched: dict[str, float] = field(default_factory=dict)
    reconnects: int = 0

    def axis(self, name: str) -> str | None:
        return ((self.status.get(name) or {}).get("bottleneck") or {}).get("axis")

    def count(self, axis: str) -> int:
        return sum(1 for name in self.status if self.axis(name) == axis)

    async def run(self) -> None:
        rv = await self._list()
        while True:
            try:
                params = {"watch": "1", "allowWatchBookmarks": "true", "resourceVersion": rv}
                async with self.client.stream("GET", PROFILES_PATH, params=params, timeout=None) as r:
                    async for line in r.aiter_lines():
                        if not line:
                            continue
                        event = json.loads(line)
                        obj = event.get("object") or {}
                        new_rv = (obj.get("metadata") or {}).get("resourceVersion")
                        if event.get("type") == "ERROR":
                            rv = await self._list()  # 410 Gone: start over from a list
                            break
                        if new_rv:
                            rv = new_rv
                        if event.get("type") in ("ADDED", "MODIFIED"):
                            self._seen(obj, time.monotonic(), event["type"] == "MODIFIED")
            except (httpx.TransportError, json.JSONDecodeError):
                await asyncio.sleep(0.5)
            self.reconnects += 1

    async def _list(self) -> str:
        answer = (await self.client.get(PROFILES_PATH, timeout=120)).json()
        for obj in answer.get("items", []):
            self._seen(obj, time.monotonic(), False)
        return str(answer["metadata"]["resourceVersion"])

    def _seen(self, obj: dict[str, Any], now: float, modified: bool) -> None:
        name = obj["metadata"]["name"]
        new = obj.get("status") or {}
        if modified:
            category, paths = classify(self.status.get(name) or {}, new)
            self.categories[category] += 1
            for path in paths:
                self.paths[re.sub(r"\[\d+\]", "[]", path)] += 1
        self.status[name] = new
        if self.switch_at is not None and name not in self.switched and self.axis(name) == "Machine":
            self.switched[name] = now - self.switch_at


# ---------------------------------------------------------------- the run


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def _wait(check: Callable[[], bool], timeout: float, what: str) -> float:
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(0.5)
    return time.monotonic() - start


@dataclass
class Snapshot:
    at: float
    requests: Counter[tuple[str, str, str]]
    operator_cpu: float
    apiserver_cpu: float
    etcd_cpu: float
    sidecars_cpu: float
    script_cpu: float
    categories: Counter[str]
    paths: Counter[str]
    scrapes: int


class Run:
    def __init__(self, args: argparse.Namespace, cp: ControlPlane, workdir: Path) -> None:
        self.args = args
        self.cp = cp
        self.workdir = workdir
        self.n, self.m = args.profiles, args.pods_per_profile
        self.figures: dict[str, Any] = {}
        self.operator: subprocess.Popen[bytes] | None = None
        self.rss_peak = 0.0
        self.rss_samples: list[float] = []
        self.phase_now = "start-up"
        self.rss_max_phase: tuple[float, str] = (0.0, "-")
        """The largest RSS sampled (every 2 s) and the phase it was sampled in."""

    def client(self, concurrency: int = 8) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.cp.url,
            verify=self.cp.ssl_context(),
            headers={"Authorization": f"Bearer {self.cp.admin_token}"},
            limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
            timeout=120,
        )

    async def apiserver_profile(self, api: httpx.AsyncClient) -> None:
        """A Go CPU profile of kube-apiserver over the first 20 s of the switch (``--profiling``
        is on by default; admin may read ``/debug/pprof``). Read it with ``go tool pprof -top``."""
        r = await api.get("/debug/pprof/profile", params={"seconds": "20"}, timeout=60)
        r.raise_for_status()
        self.args.apiserver_profile.write_bytes(r.content)
        print(f"kube-apiserver CPU profile of the switch: {self.args.apiserver_profile}", flush=True)

    # -- set-up

    def prepare(self) -> None:
        cp = self.cp
        cp.kubectl("apply", "-f", str(ROOT / "crds"))
        cp.kubectl("wait", "--for=condition=established", "--timeout=60s", "crd/damprofiles.dam.mlsys.dev")
        cp.create_namespace(OPERATOR_NAMESPACE)
        cp.create_namespace(NAMESPACE)
        cp.kubectl("apply", "-f", "-", input=_operator_rbac())

    async def create(self, api: httpx.AsyncClient, sidecar_port: int) -> None:
        a, n, m = self.args, self.n, self.m
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

        def profile(i: int) -> Callable[[], Awaitable[None]]:
            body = _profile(i, sidecar_port, a.window_seconds, a.interval_seconds, a.hysteresis)
            return lambda: _call(api, "POST", PROFILES_PATH, body)

        def pod(i: int, k: int) -> Callable[[], Awaitable[None]]:
            async def go() -> None:
                await _call(api, "POST", PODS_PATH, _pod(i, k))
                status = _running_status(pod_ip(i * m + k), now)
                path = f"{PODS_PATH}/p{i:05d}-{k}/status"
                await _call(api, "PATCH", path, status, "application/merge-patch+json")

            return go

        t0 = time.monotonic()
        await _bulk([profile(i) for i in range(n)], a.create_concurrency)
        t1 = time.monotonic()
        await _bulk([pod(i, k) for i in range(n) for k in range(m)], a.create_concurrency)
        t2 = time.monotonic()
        self.figures["create_profiles_s"] = t1 - t0
        self.figures["create_pods_s"] = t2 - t1
        print(
            f"created {n} profiles in {t1 - t0:.0f} s ({n / (t1 - t0):.0f}/s), {n * m} running pods "
            f"(create + status) in {t2 - t1:.0f} s ({n * m / (t2 - t1):.0f}/s)",
            flush=True,
        )

    def start_operator(self) -> None:
        a = self.args
        if a.as_admin:
            kubeconfig = self.cp.kubeconfig
        else:
            kubeconfig = self.cp.service_account_kubeconfig(
                OPERATOR_NAMESPACE, SERVICE_ACCOUNT, create=False, expiration_s=6 * 3600
            )
        self.metrics_port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "DAM_"))}
        env |= {
            "KUBECONFIG": str(kubeconfig),
            "DAM_OPERATOR_NAMESPACE": OPERATOR_NAMESPACE,
            "PYTHONUNBUFFERED": "1",
        }
        if a.evaluation_concurrency:
            env["DAM_EVALUATION_CONCURRENCY"] = str(a.evaluation_concurrency)
        # Cluster-wide, as the chart runs it (its ClusterRole has no namespaces list/watch, which
        # kopf wants for ``-n NS``: about two minutes of retries at start-up).
        cmd = [sys.executable, "-m", "dam_operator.cli", "operator", "--all-namespaces", "--standalone"]
        cmd += ["--no-webhook", "--metrics-port", str(self.metrics_port), "--liveness", ""]
        self.operator_log = self.workdir / "operator.log"
        with open(self.operator_log, "wb") as log:
            self.operator = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)

        def healthy() -> bool:
            assert self.operator is not None
            if self.operator.poll() is not None:
                raise RuntimeError(f"the operator exited:\n{self.operator_log.read_text()[-3000:]}")
            return httpx.get(f"http://127.0.0.1:{self.metrics_port}/healthz", timeout=2).status_code == 200

        wait_for(healthy, 60, "the operator's /healthz", interval=0.5)

    @property
    def operator_pid(self) -> int:
        assert self.operator is not None
        return self.operator.pid

    def operator_metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).text

    async def sample_rss(self) -> None:
        while True:
            with contextlib.suppress(OSError, KeyError):
                now, peak = rss_mib(self.operator_pid)
                self.rss_samples.append(now)
                self.rss_peak = max(self.rss_peak, peak)
                self.rss_max_phase = max(self.rss_max_phase, (now, self.phase_now))
            await asyncio.sleep(2.0)

    async def snapshot(
        self, api: httpx.AsyncClient, watch: ProfileWatch, sidecars: SidecarProcess
    ) -> Snapshot:
        etcd_pid, apiserver_pid = self.cp.pids()
        return Snapshot(
            at=time.monotonic(),
            requests=await apiserver_requests(api),
            operator_cpu=cpu_seconds(self.operator_pid),
            apiserver_cpu=cpu_seconds(apiserver_pid),
            etcd_cpu=cpu_seconds(etcd_pid),
            sidecars_cpu=cpu_seconds(sidecars.proc.pid),
            script_cpu=cpu_seconds(os.getpid()),
            categories=Counter(watch.categories),
            paths=Counter(watch.paths),
            scrapes=int(sidecars.command("requests")),
        )

    # -- the phases

    async def main(self, sidecars: SidecarProcess) -> dict[str, Any]:
        a, n, f = self.args, self.n, self.figures
        window = a.window_seconds
        async with self.client(a.create_concurrency) as api, self.client(2) as watch_client:
            await self.create(api, sidecars.port)
            watch = ProfileWatch(watch_client)
            watch_task = asyncio.create_task(watch.run())
            await _wait(lambda: len(watch.status) == n, 120, "the watch's first list")
            before_operator = await apiserver_requests(api)
            started = time.monotonic()
            self.start_operator()
            rss_task = asyncio.create_task(self.sample_rss())
            try:
                limit = 300 + 6 * window + n * 0.1
                await _wait(lambda: watch.count("Data") == n, limit, "every profile: Data")
                f["first_verdicts_s"] = time.monotonic() - started
                print(f"all {n} profiles said Data {f['first_verdicts_s']:.0f} s after the start", flush=True)
                f["startup_requests"] = (await apiserver_requests(api)) - before_operator

                # Running: one window to settle, then --duration seconds of jobs that do not change.
                self.phase_now = "running"
                await asyncio.sleep(window)
                s0 = await self.snapshot(api, watch, sidecars)
                await asyncio.sleep(a.duration)
                s1 = await self.snapshot(api, watch, sidecars)
                f["running"] = self.phase(s0, s1)
                f["rss_running_mib"] = self.rss_samples[-1] if self.rss_samples else float("nan")
                print(f"measured {a.duration:g} s of running jobs", flush=True)

                # The switch: every job becomes compute-bound at once.
                delays_before = delay_buckets(self.operator_metrics())
                self.phase_now = "switch"
                watch.switch_at = time.monotonic()
                assert sidecars.command("compute") == "ok"
                pprof = asyncio.create_task(self.apiserver_profile(api)) if a.apiserver_profile else None
                with contextlib.suppress(AssertionError):
                    await _wait(lambda: len(watch.switched) == n, 4 * window + 60, "every profile: Machine")
                s2 = await self.snapshot(api, watch, sidecars)
                f["switch"] = self.phase(s1, s2)
                if pprof is not None:
                    await pprof
                after = delay_buckets(self.operator_metrics())
                f["switch_delays"] = {le: after.get(le, 0.0) - delays_before.get(le, 0.0) for le in after}
                lags = list(watch.switched.values())
                f["lag_p90_s"] = _percentile(lags, 0.90)
                f["lag_p50_s"] = _percentile(lags, 0.50)
                f["lag_p99_s"] = _percentile(lags, 0.99)
                f["lag_max_s"] = max(lags, default=float("nan"))
                f["missing"] = n - len(lags)
                print(f"{len(lags)} of {n} profiles said Machine, p99 {f['lag_p99_s']:.1f} s", flush=True)

                # Quiet: the jobs end (their pods are deleted). Once every profile has settled
                # (no pods; the verdict Unknown after its hold), nothing changes any more.
                self.phase_now = "quiet"
                await self.delete_pods(api)

                def settled() -> bool:
                    # With no pod left a profile keeps its last verdict and says so (Reporting=False,
                    # NoActivePods): that, not Unknown, is the settled state.
                    return len(watch.status) == n and all(
                        (st.get("pods") or {}).get("matched") == 0
                        and any(
                            c.get("type") == "Reporting" and c.get("reason") == "NoActivePods"
                            for c in st.get("conditions") or ()
                        )
                        for st in watch.status.values()
                    )

                with contextlib.suppress(AssertionError):
                    await _wait(settled, 8 * window + 120, "every profile: no pods, NoActivePods")
                await asyncio.sleep(window)
                s3 = await self.snapshot(api, watch, sidecars)
                await asyncio.sleep(a.quiet_duration)
                s4 = await self.snapshot(api, watch, sidecars)
                f["quiet"] = self.phase(s3, s4)
                f["quiet_settled"] = settled()
                f["operator_metrics"] = self.operator_metrics()
                (self.workdir / "operator-metrics.txt").write_text(f["operator_metrics"])
                f["watch_reconnects"] = watch.reconnects
                f["rss_max_sampled"] = self.rss_max_phase
            finally:
                rss_task.cancel()
                watch_task.cancel()
                await asyncio.gather(rss_task, watch_task, return_exceptions=True)
                self.stop_operator()
        return f

    async def delete_pods(self, api: httpx.AsyncClient) -> None:
        """Every pod, by batches of 250 profiles' pods (deleting all at once outlasts the server's 60 s)."""
        options = {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0}

        def batch(b: int) -> Callable[[], Awaitable[None]]:
            async def go() -> None:
                for _ in range(5):
                    with contextlib.suppress(httpx.TransportError):
                        r = await api.request(
                            "DELETE", PODS_PATH, params={"labelSelector": f"batch={b}"}, json=options
                        )
                        if r.status_code == 200:
                            return
                    await asyncio.sleep(1.0)

            return go

        await _bulk([batch(b) for b in range((self.n + 249) // 250)], 4)

    def phase(self, s0: Snapshot, s1: Snapshot) -> dict[str, Any]:
        """What happened between two snapshots."""
        seconds = s1.at - s0.at
        requests = s1.requests - s0.requests
        writes = sum(v for (_, res, _), v in requests.items() if res == "damprofiles/status")
        categories = s1.categories - s0.categories
        return {
            "seconds": seconds,
            "windows": seconds / self.args.window_seconds,
            "operator_cpu_percent": 100 * (s1.operator_cpu - s0.operator_cpu) / seconds,
            "apiserver_cpu_percent": 100 * (s1.apiserver_cpu - s0.apiserver_cpu) / seconds,
            "etcd_cpu_percent": 100 * (s1.etcd_cpu - s0.etcd_cpu) / seconds,
            "sidecars_cpu_percent": 100 * (s1.sidecars_cpu - s0.sidecars_cpu) / seconds,
            "script_cpu_percent": 100 * (s1.script_cpu - s0.script_cpu) / seconds,
            "load_average": os.getloadavg()[0],
            "requests": requests,
            "status_writes": writes,
            "writes_per_profile_window": writes / (self.n * seconds / self.args.window_seconds),
            "categories": categories,
            "unchanged_writes": categories["lastEvaluationTime only"]
            + categories["figures, rounding noise only"]
            + categories["no status change"],
            "paths": s1.paths - s0.paths,
            "scrapes_per_second": (s1.scrapes - s0.scrapes) / seconds,
        }

    def stop_operator(self) -> None:
        if self.operator is not None:
            with contextlib.suppress(OSError, KeyError):
                self.rss_peak = max(self.rss_peak, rss_mib(self.operator_pid)[1])
            stop_process(self.operator, signal.SIGTERM)
            self.operator = None


# ---------------------------------------------------------------- report


OPERATOR_RESOURCES = {"damprofiles", "damprofiles/status", "pods", "events", "customresourcedefinitions"}
"""What the operator (no webhook) asks the API about; every other row is not its doing."""
NOT_THE_OPERATOR = {"serviceaccounts/token": "this script", "pods/status": "this script"}


def _table(requests: Counter[tuple[str, str, str]], per: float, unit: str) -> list[str]:
    rows = sorted(((v, k) for k, v in requests.items() if v > 0), reverse=True)
    return [
        f"    {verb:<7} {res:<30} {code:<4} {v:>8}   {v / per:9.3f} {unit}"
        + (
            f"   ({NOT_THE_OPERATOR.get(res, 'the API server itself')})"
            if res not in OPERATOR_RESOURCES
            else ""
        )
        for v, (verb, res, code) in rows
    ]


def _phase_lines(name: str, ph: dict[str, Any]) -> list[str]:
    changed = ", ".join(f"{k}: {v}" for k, v in ph["categories"].most_common()) or "-"
    top = ", ".join(f"{p} ({c})" for p, c in ph["paths"].most_common(6)) or "-"
    return [
        f"{name}: {ph['seconds']:.0f} s = {ph['windows']:.2f} windows",
        f"  CPU, % of one core            operator {ph['operator_cpu_percent']:.1f}, "
        f"kube-apiserver {ph['apiserver_cpu_percent']:.1f}, etcd {ph['etcd_cpu_percent']:.1f}, "
        f"fake sidecars {ph['sidecars_cpu_percent']:.1f}, this script {ph['script_cpu_percent']:.1f} "
        f"(load average {ph['load_average']:.1f})",
        f"  sidecar scrapes               {ph['scrapes_per_second']:.1f} /s",
        f"  status writes                 {ph['status_writes']} = {ph['writes_per_profile_window']:.3f} "
        "per profile per window",
        f"  what they changed (watch)     {changed}",
        f"  leaves changed                {top}",
        "  API requests (apiserver_request_total: verb, resource, code, count, rate):",
        *_table(ph["requests"], ph["seconds"], "/s"),
    ]


def _delay_line(buckets: dict[str, float]) -> str:
    """Share of the phase's evaluations that waited longer than 1 s and 5 s for a worker."""
    total = buckets.get("+Inf", 0.0)
    if not total:
        return "-"
    late = {le: 1 - buckets.get(le, 0.0) / total for le in ("1.0", "5.0")}
    return f"{late['1.0']:.1%} > 1 s, {late['5.0']:.1%} > 5 s of {total:.0f}"


def _api_server_line(n: int, window: float, switch: dict[str, Any]) -> str:
    """Whether the API server kept up with the switch's writes, and if not, the p99 lag no
    scheduling can beat: every profile's write falls due within one window, and a server that
    completes fewer than n / window a second lands the 99th percentile at about 0.99 n / its
    rate, or later (the target is out of reach where that is above it). The rate is measured
    over the whole switch, a little below the server's best, so the figure is approximate."""
    rate = switch["status_writes"] / switch["seconds"] if switch["seconds"] > 0 else 0.0
    due = n / window
    if rate <= 0 or rate >= 0.95 * due:
        return f"API server kept up           {rate:.0f} status writes/s in the switch ({due:.0f}/s due)"
    return (
        f"lag p99 the API server allows about {0.99 * n / rate:.1f} s = 0.99 x {n} writes / its {rate:.0f} "
        f"status writes/s in the switch ({due:.0f}/s due)"
    )


def report(args: argparse.Namespace, f: dict[str, Any], rss_peak: float) -> bool:
    n, m, w, i = args.profiles, args.pods_per_profile, args.window_seconds, args.interval_seconds
    target = w + i + 2.0
    running, quiet = f["running"], f["quiet"]
    rss_ok = rss_peak <= RSS_TARGET_MIB
    lag_ok = f["missing"] == 0 and f["lag_p99_s"] <= target
    writes_ok = running["writes_per_profile_window"] <= 1.05  # writes of a window straddle the ends
    quiet_ok = quiet["status_writes"] == 0 and running["unchanged_writes"] == 0 and f["quiet_settled"]
    ok = rss_ok and lag_ok and writes_ok and quiet_ok

    def verdict(ok: bool) -> str:
        return "PASS" if ok else "FAIL"

    counters = [
        line
        for line in f["operator_metrics"].splitlines()
        if line.startswith(("dam_operator_evaluation_errors_total", "dam_operator_evaluations_total"))
        and not line.endswith(" 0.0")
    ]
    lines = [
        "",
        f"profiles x pods               {n} x {m} (window {w:g} s, interval {i:g} s, "
        f"hysteresis {args.hysteresis}; operator as {'admin' if args.as_admin else 'its ServiceAccount'})",
        f"created                       profiles {f['create_profiles_s']:.0f} s, "
        f"pods {f['create_pods_s']:.0f} s",
        f"first verdicts after start    {f['first_verdicts_s']:.0f} s",
        f"operator CPU (running jobs)   {running['operator_cpu_percent']:.1f} % of one core",
        f"operator RSS                  {f['rss_running_mib']:.1f} MiB running, peak {rss_peak:.1f} MiB   "
        f"target <= {RSS_TARGET_MIB:.0f}   {verdict(rss_ok)}",
        f"largest RSS sampled           {f['rss_max_sampled'][0]:.1f} MiB, during {f['rss_max_sampled'][1]}",
        f"lag metrics->status p50, p90  {f['lag_p50_s']:.1f} s, {f['lag_p90_s']:.1f} s "
        f"(max {f['lag_max_s']:.1f} s)",
        f"evaluations started late      {_delay_line(f['switch_delays'])} (switch)",
        f"lag metrics->status p99       {f['lag_p99_s']:.1f} s   target <= {target:.1f}   {verdict(lag_ok)}"
        + (f" ({f['missing']} profiles never switched)" if f["missing"] else ""),
        _api_server_line(n, w, f["switch"]),
        f"status writes, running jobs   {running['writes_per_profile_window']:.3f} per profile per window   "
        f"target <= 1   {verdict(writes_ok)}",
        f"status writes, nothing changed  {quiet['status_writes']} in {quiet['windows']:.1f} windows "
        "(jobs gone), "
        f"{running['unchanged_writes']} while running (lastEvaluationTime or rounding noise only)   "
        f"target 0   {verdict(quiet_ok)}" + ("" if f["quiet_settled"] else " (profiles never settled)"),
        f"Prometheus source instead     {n / w:.1f} queries/s (one per profile per window)",
        "",
        *_phase_lines("running jobs (nothing changes in them)", running),
        "",
        *_phase_lines("switch until every profile said Machine", f["switch"]),
        "",
        *_phase_lines("quiet (pods deleted, every profile settled)", quiet),
        "",
        "API requests, operator start until every profile said Data:",
        *_table(f["startup_requests"], n, "per profile"),
        f"operator counters             {'; '.join(counters) or '-'}",
    ]
    if f["watch_reconnects"] > 1:
        lines.append(f"(this script's watch reconnected {f['watch_reconnects'] - 1} times)")
    if args.json:
        plain = {k: v for k, v in f.items() if isinstance(v, int | float | str) and k != "operator_metrics"}
        lines.append(json.dumps(plain | {"rss_peak_mib": rss_peak}))
    lines.append(verdict(ok))
    print("\n".join(lines))
    return ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profiles", type=int, default=5000)
    p.add_argument("--pods-per-profile", type=int, default=2)
    p.add_argument("--window-seconds", type=float, default=30.0, help="spec.evaluation.windowSeconds")
    p.add_argument("--interval-seconds", type=float, default=1.0, help="spec.sampling.intervalSeconds")
    p.add_argument("--hysteresis", type=int, default=1, help="spec.evaluation.hysteresisWindows")
    p.add_argument("--duration", type=float, help="seconds of running jobs measured (default: 3 windows)")
    p.add_argument("--quiet-duration", type=float, help="seconds of quiet measured (default: 2 windows)")
    p.add_argument("--create-concurrency", type=int, default=32, help="API writes in flight (creating)")
    p.add_argument(
        "--evaluation-concurrency", type=int, default=0, help="DAM_EVALUATION_CONCURRENCY (0: its default)"
    )
    p.add_argument(
        "--apiserver-profile", type=Path, help="write a Go CPU profile of kube-apiserver here (the switch)"
    )
    p.add_argument("--as-admin", action="store_true", help="operator as admin (not the ServiceAccount)")
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON too")
    p.add_argument("--serve-sidecars", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve_sidecars:
        return serve_sidecars(args.serve_sidecars)
    if args.duration is None:
        args.duration = 3 * args.window_seconds
    if args.quiet_duration is None:
        args.quiet_duration = 2 * args.window_seconds

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)  # so that the operator and the control plane are stopped

    signal.signal(signal.SIGTERM, stop)
    workdir = Path(tempfile.mkdtemp(prefix="dam-scale-"))
    print(f"work directory {workdir}", flush=True)
    sidecars = SidecarProcess(args.profiles * args.pods_per_profile, workdir / "sidecars.log")
    try:
        # A later flag wins (pflag): the test control plane turns profiling off.
        extra = ["--profiling=true"] if args.apiserver_profile else []
        with ControlPlane(find_kube_binaries(), workdir / "kube", extra_apiserver_args=extra) as cp:
            run = Run(args, cp, workdir)
            run.prepare()
            figures = asyncio.run(run.main(sidecars))
            ok = report(args, figures, run.rss_peak)
    finally:
        sidecars.stop()
        if not args.keep:
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
