"""A hostile tenant, for real: a user allowed only to create DAMProfiles in their own namespace
(a Role and RoleBinding for a ServiceAccount on the real kube-apiserver, its own token) aims the
operator (run with exactly the chart's RBAC and settings) at

(a) a malicious Prometheus on 127.0.0.1 that answers ``/api/v1/query`` with 400 MB of JSON,
    generated on the fly: the operator reads its cap and no more, its RSS stays under the chart's
    memory limit while it reads, and the profile says why (Reporting=False, SourceAnswerTooLarge,
    naming the cap and the setting);
(b) the cloud metadata address, the API server and the operator's own loopback: each profile is
    refused (SpecValid=False naming spec.source.prometheus.url, the rule and the setting that
    allows it), and no request is sent (a listener on the loopback address counts zero connections).

The chart's values allow 127.0.0.1/32 only (the malicious Prometheus runs there; the API server,
on 127.0.0.1 too, stays refused: the API-server rule is not lifted by a network).
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

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
HUGE_BYTES = 400 * MiB
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
        {"operator": {"watchNamespace": ns, "prometheus": {"allowedNetworks": ["127.0.0.1/32"]}}},
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
    refused = {
        "metadata": ("http://169.254.169.254/latest/meta-data", "link-local"),
        "apiserver": (cp.url, "Kubernetes API server"),
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
            assert "DAM_PROMETHEUS_URL" in message or "DAM_PROMETHEUS_ALLOWED_NETWORKS" in message, message
        assert loopback_listener.connections == 0, "the operator connected to a refused address"
        op.assert_alive()
    finally:
        op.close()


def _sample(text: str, series: str) -> float:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{series} not in the operator's /metrics")
