"""A hostile tenant, for real: a user allowed only to create DAMProfiles in their own namespace
(a Role and RoleBinding for a ServiceAccount on the real kube-apiserver, its own token) aims the
operator (run with exactly the chart's RBAC and settings) at

(a) a malicious Prometheus on 127.0.0.1 that answers ``/api/v1/query`` with 700 MB of JSON,
    generated on the fly: the operator reads its cap and no more, its RSS stays under the chart's
    memory limit while it reads, and the profile says why (Reporting=False, SourceAnswerTooLarge,
    naming the cap and the setting);
(b) the cloud metadata addresses, private addresses, the API server and its endpoints and the
    operator's own loopback: each profile is refused (SpecValid=False naming
    spec.source.prometheus.url, the rule and the chart value that allows it), and no request is
    sent (a listener on the loopback address counts zero connections);
(c) compression bombs: a gzip or deflate answer that inflates to 2 GB, from a sidecar and from a
    Prometheus, costs the operator its cap, not the answer (RSS sampled, under the chart's limit
    and under 500 MiB);
(d) with the chart's defaults, any Prometheus URL is refused naming the chart values, checked in
    a network namespace that has only loopback (the internal addresses are put on its ``lo``,
    each with a listener): nothing could leave even if the policy failed, and nothing arrives.

The chart's values name the malicious Prometheus only (allowedUrlPrefixes: the admin allows its
address as named); everything else stays closed.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from tests.support.bombs import bomb
from tests.support.kubecluster import ControlPlane
from tests.support.operator_harness import (
    OperatorProcess,
    condition,
    dumps,
    install_chart,
    profile_of,
    wait_for,
)
from tests.support.procs import Listener

MiB = 1024 * 1024
HUGE_BYTES = 700 * MiB
FIELD = "spec.source.prometheus.url"


class HugePrometheus:
    """Answers every POST with ``total`` bytes of valid Prometheus JSON, written chunk by chunk as it
    goes (HTTP/1.0, no Content-Length: the body ends when the connection does); never held whole."""

    def __init__(self, total: int, host: str = "127.0.0.1") -> None:
        self.total = total
        self.sent: list[int] = []  # bytes sent per answer
        series = [
            json.dumps(
                {
                    "metric": {
                        "__name__": "dam_steps_total",
                        "namespace": "x",
                        "pod": f"other-{i}",
                        "rank": str(i),
                    },
                    "value": [1000.0, str(i)],
                }
            )
            for i in range(300)
        ]
        self.chunk = (",".join(series) + ",").encode()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                sent = 0
                try:
                    self.wfile.write(b'{"status":"success","data":{"resultType":"vector","result":[')
                    while sent < owner.total:
                        self.wfile.write(owner.chunk)
                        sent += len(owner.chunk)
                    self.wfile.write(
                        b'{"metric":{"__name__":"dam_steps_total","pod":"x"},"value":[1,"1"]}]}}'
                    )
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the operator hung up: it stopped at its cap
                owner.sent.append(sent)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


class RssWatch:
    """Samples a process's RSS every 20 ms in a thread; ``peak`` is the highest seen."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                rss = self.proc.memory_info().rss
            except psutil.Error:
                return
            self.peak = max(self.peak, rss)
            self.samples += 1
            time.sleep(0.02)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _quantity_bytes(text: str) -> int:
    units = {"Ki": 1024, "Mi": MiB, "Gi": 1024 * MiB}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * factor)
    return int(float(text))


def _profile(name: str, url: str) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "dam.mlsys.dev/v1alpha1",
            "kind": "DAMProfile",
            "metadata": {"name": name},
            "spec": {
                "selector": {"matchLabels": {"app": "t"}},
                "evaluation": {"windowSeconds": 5, "hysteresisWindows": 1},
                # A tenant picks the longest timeout it may: the whole answer would have time to arrive.
                "source": {"prometheus": {"url": url, "timeoutSeconds": 60}},
            },
        }
    )


def _tenant_kubeconfig(cp: ControlPlane, ns: str) -> Path:
    """A ServiceAccount whose only rights are DAMProfiles in its own namespace."""
    kubeconfig = cp.service_account_kubeconfig(ns, "tenant")
    cp.api(
        "POST",
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "damprofile-writer"},
            "rules": [
                {
                    "apiGroups": ["dam.mlsys.dev"],
                    "resources": ["damprofiles"],
                    "verbs": ["create", "get", "list", "watch", "update", "delete"],
                }
            ],
        },
    )
    cp.api(
        "POST",
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "tenant-writes-damprofiles"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "damprofile-writer"},
            "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": ns}],
        },
    )
    return kubeconfig


POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "trainer-0", "labels": {"app": "t"}},
    "spec": {
        "containers": [
            {"name": "train", "image": "python:3.11-slim", "command": ["python"]},
            {"name": "dam-sidecar", "image": "ghcr.io/mlsys/dam-operator:test", "args": ["sidecar"]},
        ]
    },
}


@pytest.fixture
def attacker() -> Iterator[tuple[HugePrometheus, Listener]]:
    """The malicious Prometheus (127.0.0.1) and a listener on a loopback address the operator must
    never reach (127.0.0.3)."""
    server, listener = HugePrometheus(HUGE_BYTES), Listener("127.0.0.3")
    try:
        yield server, listener
    finally:
        server.close()
        listener.close()


@pytest.mark.slow
def test_a_tenant_can_neither_exhaust_the_operators_memory_nor_aim_it_at_internal_addresses(
    control_plane: ControlPlane,
    kube_namespace: str,
    system_namespace: str,
    attacker: tuple[HugePrometheus, Listener],
    tmp_path: Path,
) -> None:
    cp, ns = control_plane, kube_namespace
    huge_prometheus, loopback_listener = attacker
    chart = install_chart(
        cp,
        system_namespace,
        {
            "operator": {
                "watchNamespace": ns,
                "prometheus": {"allowedUrlPrefixes": [huge_prometheus.url + "/"]},
            }
        },
    )
    (deployment,) = chart.of_kind("Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    limit = _quantity_bytes(container["resources"]["limits"]["memory"])
    cap = int(chart.env()["DAM_PROMETHEUS_MAX_ANSWER_BYTES"])

    tenant = _tenant_kubeconfig(cp, ns)
    denied = cp.kubectl("-n", ns, "auth", "can-i", "create", "pods", kubeconfig=tenant, check=False)
    assert denied.stdout.strip() == "no", "the tenant must only be able to write DAMProfiles"

    cp.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(POD))
    cp.mark_pod_running(ns, "trainer-0")

    op = OperatorProcess(
        cp,
        tmp_path,
        namespace=ns,
        operator_namespace=chart.namespace,
        kubeconfig=chart.kubeconfig,
        webhook=False,
        env=chart.env(),
    )
    api_endpoint = _api_server_endpoint(cp)
    refused = {
        "metadata": ("http://169.254.169.254/latest/meta-data", "metadata"),
        "metadata-v4compat": ("http://[::169.254.169.254]/latest/meta-data", "metadata"),
        "metadata-azure": ("http://168.63.129.16/", "metadata"),
        "metadata-alibaba": ("http://100.100.100.200/latest/meta-data", "metadata"),
        "metadata-aws-v6": ("http://[fd00:ec2::254]/latest/meta-data", "metadata"),
        "private": ("http://10.1.2.3:9090/", "private"),
        "apiserver": (cp.url, "Kubernetes API server"),
        "apiserver-endpoint": (f"https://{api_endpoint}/", "Kubernetes API server"),
        "loopback": (f"http://127.0.0.3:{loopback_listener.port}/", "loopback"),
        "localhost": (f"http://localhost:{loopback_listener.port}/", "loopback"),
    }
    try:
        op.start()
        rss = RssWatch(op.pid)
        try:
            started_rss = psutil.Process(op.pid).memory_info().rss
            cp.kubectl(
                "apply", "-n", ns, "-f", "-", input=_profile("huge", huge_prometheus.url), kubeconfig=tenant
            )
            for name, (url, _) in refused.items():
                cp.kubectl("apply", "-n", ns, "-f", "-", input=_profile(name, url), kubeconfig=tenant)

            def too_large() -> dict[str, Any] | None:
                op.assert_alive()
                cond = condition(profile_of(cp, ns, "huge"), "Reporting")
                return cond if cond and cond.get("reason") == "SourceAnswerTooLarge" else None

            reporting = wait_for(too_large, 90, "Reporting=False SourceAnswerTooLarge on the huge profile")
            # Two more windows: the operator asks again every window, and each time stops at its cap.
            answers = len(huge_prometheus.sent)
            wait_for(lambda: len(huge_prometheus.sent) >= answers + 2, 30, "two more answers")
            op.assert_alive()
        finally:
            rss.close()

        assert reporting["status"] == "False"
        message = reporting["message"]
        assert "16 MiB" in message and "DAM_PROMETHEUS_MAX_ANSWER_BYTES" in message, message
        assert "operator.prometheus.maxAnswerBytes" in message, message
        assert rss.samples > 50, "the RSS was not sampled while the operator read"
        print(
            f"700 MB answer: operator RSS at start {started_rss / MiB:.0f} MiB, peak "
            f"{rss.peak / MiB:.0f} MiB ({rss.samples} samples), limit {limit / MiB:.0f} MiB, "
            f"answers sent {huge_prometheus.sent}"
        )
        assert rss.peak < 500 * MiB, f"the operator's RSS peaked at {rss.peak / MiB:.0f} MiB"
        assert rss.peak < limit, (
            f"the operator's RSS peaked at {rss.peak / MiB:.0f} MiB, over its limit of {limit / MiB:.0f} MiB"
        )
        # Well under it, in fact: the cap and a little, not the answer.
        assert rss.peak - started_rss < 4 * cap + 64 * MiB, (
            f"RSS grew by {(rss.peak - started_rss) / MiB:.0f} MiB reading answers capped at "
            f"{cap / MiB:.0f} MiB"
        )
        assert max(huge_prometheus.sent) < HUGE_BYTES / 4, "the operator read far past its cap"
        too_large_total = _sample(
            op.metrics(), 'dam_operator_source_body_too_large_total{source="prometheus"}'
        )
        assert too_large_total >= 3, too_large_total

        for name, (_url, rule) in refused.items():

            def invalid(name: str = name) -> dict[str, Any] | None:
                cond = condition(profile_of(cp, ns, name), "SpecValid")
                return cond if cond and cond.get("status") == "False" else None

            cond = wait_for(invalid, 30, f"SpecValid=False on profile {name}")
            message = str(cond.get("message"))
            assert FIELD in message and rule in message, (name, dumps(profile_of(cp, ns, name)))
            assert "operator.prometheus.allowedUrlPrefixes" in message, message
        assert loopback_listener.connections == 0, "the operator connected to a refused address"
        op.assert_alive()
    finally:
        op.close()


def _sample(text: str, series: str) -> float:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{series} not in the operator's /metrics")


def _api_server_endpoint(cp: ControlPlane) -> str:
    """host:port of the first endpoint of the ``default/kubernetes`` EndpointSlice, else of its
    Service's ClusterIP: this control plane advertises 127.0.0.1, for which the API server writes
    no endpoints (what the operator reads, ``clusteraddrs.py``: both)."""
    slices = cp.api(
        "GET",
        "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices"
        "?labelSelector=kubernetes.io/service-name=kubernetes",
    )
    for item in slices["items"]:
        for endpoint in item.get("endpoints") or []:
            return f"{endpoint['addresses'][0]}:{item['ports'][0]['port']}"
    spec = cp.api("GET", "/api/v1/namespaces/default/services/kubernetes")["spec"]
    return f"{spec['clusterIP']}:{spec['ports'][0]['port']}"


# ---------------------------------------------------------------- (c) compression bombs

GB = 1024 * MiB
BOMB_BYTES = 2 * GB


class BombServer:
    """Answers ``GET /metrics`` and ``POST /api/v1/query`` with a ``encoding`` stream that inflates
    to 2 GB (tests/support/bombs.py: about 2 MB sent), counting the answers."""

    def __init__(self, encoding: str, prefix: bytes, host: str = "127.0.0.1") -> None:
        self.answers = 0
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _bomb(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Encoding", encoding)
                self.end_headers()
                try:
                    for piece in bomb(encoding, prefix, BOMB_BYTES):
                        self.wfile.write(piece)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the operator hung up at its cap
                owner.answers += 1

            def do_GET(self) -> None:
                self._bomb()

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._bomb()

            def log_message(self, *_: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


def _pod(name: str, app: str) -> dict[str, Any]:
    pod: dict[str, Any] = json.loads(json.dumps(POD))
    pod["metadata"] = {"name": name, "labels": {"app": app}}
    return pod


def _bomb_profile(name: str, app: str, *, url: str | None = None, sidecar_port: int | None = None) -> str:
    spec: dict[str, Any] = {
        "selector": {"matchLabels": {"app": app}},
        "evaluation": {"windowSeconds": 5, "hysteresisWindows": 1},
    }
    if url is not None:
        spec["source"] = {"prometheus": {"url": url, "timeoutSeconds": 60}}
    if sidecar_port is not None:
        spec["sidecar"] = {"port": sidecar_port}
    return yaml.safe_dump(
        {
            "apiVersion": "dam.mlsys.dev/v1alpha1",
            "kind": "DAMProfile",
            "metadata": {"name": name},
            "spec": spec,
        }
    )


@pytest.mark.slow
def test_compression_bombs_of_2_gb_leave_the_operators_memory_within_its_limit(
    control_plane: ControlPlane, kube_namespace: str, system_namespace: str, tmp_path: Path
) -> None:
    """A sidecar (gzip) and two Prometheus (gzip, deflate) answer 2 GB in about 2 MB each: the
    operator decompresses them itself, a piece at a time, and gives each up at its cap."""
    cp, ns = control_plane, kube_namespace
    servers = {
        "scrape-gzip": BombServer("gzip", b"# bomb\\n"),
        "prom-gzip": BombServer("gzip", b'{"status":"success","data":{"resultType":"vector","result":['),
        "prom-deflate": BombServer(
            "deflate", b'{"status":"success","data":{"resultType":"vector","result":['
        ),
    }
    try:
        prefixes = [servers["prom-gzip"].url + "/", servers["prom-deflate"].url + "/"]
        chart = install_chart(
            cp,
            system_namespace,
            {"operator": {"watchNamespace": ns, "prometheus": {"allowedUrlPrefixes": prefixes}}},
        )
        (deployment,) = chart.of_kind("Deployment")
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        limit = _quantity_bytes(container["resources"]["limits"]["memory"])
        tenant = _tenant_kubeconfig(cp, ns)
        for name in servers:
            cp.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(_pod(f"trainer-{name}", name)))
            cp.mark_pod_running(ns, f"trainer-{name}")
        op = OperatorProcess(
            cp,
            tmp_path,
            namespace=ns,
            operator_namespace=chart.namespace,
            kubeconfig=chart.kubeconfig,
            webhook=False,
            env=chart.env(),
        )
        try:
            op.start()
            started_rss = psutil.Process(op.pid).memory_info().rss
            rss = RssWatch(op.pid)
            try:
                cp.kubectl(
                    "apply",
                    "-n",
                    ns,
                    "-f",
                    "-",
                    kubeconfig=tenant,
                    input=_bomb_profile(
                        "scrape-gzip", "scrape-gzip", sidecar_port=servers["scrape-gzip"].port
                    ),
                )
                for name in ("prom-gzip", "prom-deflate"):
                    cp.kubectl(
                        "apply",
                        "-n",
                        ns,
                        "-f",
                        "-",
                        kubeconfig=tenant,
                        input=_bomb_profile(name, name, url=servers[name].url),
                    )

                def too_large(name: str) -> dict[str, Any] | None:
                    op.assert_alive()
                    cond = condition(profile_of(cp, ns, name), "Reporting")
                    return (
                        cond
                        if cond and cond.get("status") == "False" and "cap" in str(cond.get("message"))
                        else None
                    )

                conds: dict[str, dict[str, Any]] = {}
                for name in servers:
                    conds[name] = wait_for(
                        functools.partial(too_large, name), 90, f"Reporting=False at the cap on {name}"
                    )
                answers = {name: s.answers for name, s in servers.items()}
                wait_for(
                    lambda: all(s.answers >= answers[n] + 2 for n, s in servers.items()),
                    60,
                    "two more answers each",
                )
                op.assert_alive()
            finally:
                rss.close()
            for name in ("prom-gzip", "prom-deflate"):
                assert conds[name].get("reason") == "SourceAnswerTooLarge", conds[name]
            assert "DAM_SCRAPE_MAX_BYTES" in str(conds["scrape-gzip"].get("message")), conds["scrape-gzip"]
            metrics = op.metrics()
            assert _sample(metrics, 'dam_operator_source_body_too_large_total{source="scrape"}') >= 3
            assert _sample(metrics, 'dam_operator_source_body_too_large_total{source="prometheus"}') >= 6
            counts = {n: s.answers for n, s in servers.items()}
            figures = (
                f"2 GB bombs: operator RSS at start {started_rss / MiB:.0f} MiB, peak {rss.peak / MiB:.0f} "
                f"MiB ({rss.samples} samples), limit {limit / MiB:.0f} MiB, answers {counts}"
            )
            print(figures)
            (tmp_path / "figures.txt").write_text(figures)
            assert rss.samples > 50, "the RSS was not sampled while the operator read"
            assert rss.peak < min(limit, 500 * MiB), figures
        finally:
            op.close()
    finally:
        for server in servers.values():
            server.close()


# ---------------------------------------------------------------- (d) closed by default, in a netns

NETNS_ENV = "DAM_TEST_INSIDE_LOOPBACK_ONLY_NETNS"
NETNS_FILE = "netns_hostile_tenant.py"
"""The check run inside the namespace: a file pytest collects only when named (not test_*.py), so
an ordinary run neither runs nor skips it."""
# Internal addresses put on the namespace's lo, each with a listener: a connection would arrive here.
NETNS_ADDRESSES = (
    "10.1.2.3",
    "169.254.169.254",
    "168.63.129.16",
    "100.100.100.200",
    "192.0.0.192",
    "fd00:ec2::254",
)


@pytest.mark.slow
def test_with_the_charts_defaults_internal_urls_are_refused_with_zero_connections_in_a_loopback_only_netns(
    tmp_path: Path,
) -> None:
    """Runs the test below in a new network namespace (``unshare -n``, we are root) whose only
    interface is ``lo``, holding the internal addresses: the control plane, the operator and the
    listeners all live there, so nothing could leave the machine even if the policy failed."""
    setup = "; ".join(
        ["ip link set lo up"] + [f"ip addr add {a}/{128 if ':' in a else 32} dev lo" for a in NETNS_ADDRESSES]
    )
    cmd = [
        "unshare",
        "-n",
        "sh",
        "-c",
        f"{setup} && exec {sys.executable} -m pytest -q -p no:cacheprovider "
        f"'{Path(__file__).with_name(NETNS_FILE)}'",
    ]
    result = subprocess.run(
        cmd,
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, NETNS_ENV: "1"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0 and "1 passed" in out, out[-6000:]


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host
