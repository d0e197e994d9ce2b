"""RBAC for real: the operator holds exactly the (Cluster)Roles ``charts/dam-operator`` renders
(applied to a real API server, a ServiceAccount token from the TokenRequest API), and

- in single-namespace mode it starts at once, diagnoses a job and posts its Events, and the server
  refused none of its requests (the recording proxy between them saw no 401/403);
- a verb missing from the chart is noticed: the same check fails;
- it is refused what it must not do: Secrets outside its own certificate Secret, writing Pods,
  other webhook configurations, other namespaces when it serves one.

The operator's verbs are not listed anywhere in the tests: the real server decides.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.fake_sidecar import FakeJob, FakeSidecars, ThreadedFakeSidecars
from tests.support.faultproxy import FaultProxy, Record, refused, verb_and_resource
from tests.support.kubecluster import ApiError, ControlPlane
from tests.support.operator_harness import (
    ChartInstall,
    OperatorProcess,
    condition,
    dumps,
    events_for,
    install_chart,
    profile_of,
    wait_for,
)


def profile(name: str, port: int) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "dam.mlsys.dev/v1alpha1",
            "kind": "DAMProfile",
            "metadata": {"name": name},
            "spec": {
                "selector": {"matchLabels": {"app": "t"}},
                "evaluation": {"windowSeconds": 5, "hysteresisWindows": 1},
                "sidecar": {"port": port},
            },
        }
    )


POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "trainer-0", "labels": {"app": "t"}},
    "spec": {"containers": [{"name": "train", "image": "python:3.11-slim", "command": ["python"]}]},
}


def assert_never_refused(records: list[Record]) -> None:
    bad = refused(records)
    assert not bad, "the API server refused the operator (a verb missing from the chart?): " + ", ".join(
        f"{r.method} {r.path} -> {r.status} {verb_and_resource(r)}" for r in bad
    )


@pytest.fixture
def sidecars() -> Iterator[FakeSidecars]:
    with ThreadedFakeSidecars("127.0.0.1") as sidecars:
        yield sidecars


def run_operator(
    cp: ControlPlane, chart: ChartInstall, proxy: FaultProxy, tmp_path: Path, namespace: str | None, **kw: Any
) -> OperatorProcess:
    kubeconfig = proxy.kubeconfig(chart.kubeconfig, tmp_path / "operator.kubeconfig")
    return OperatorProcess(
        cp,
        tmp_path,
        namespace=namespace,
        operator_namespace=chart.namespace,
        kubeconfig=kubeconfig,
        env={**chart.env(), **kw.pop("env", {})},
        **kw,
    )


@pytest.mark.slow
def test_single_namespace_install_serves_its_namespace_with_the_charts_rbac(
    control_plane: ControlPlane,
    kube_namespace: str,
    system_namespace: str,
    sidecars: FakeSidecars,
    tmp_path: Path,
) -> None:
    cp, ns = control_plane, kube_namespace
    chart = install_chart(cp, system_namespace, {"operator": {"watchNamespace": ns}})
    assert chart.env()["DAM_NAMESPACE"] == ns
    sidecars.add("127.0.0.1", FakeJob())
    with FaultProxy(cp.url, cp.ssl_context()) as proxy:
        op = run_operator(cp, chart, proxy, tmp_path, ns)
        try:
            chart.apply(chart.webhook_configuration(op.webhook_url))
            started = time.monotonic()
            op.start()
            cp.kubectl("apply", "-n", ns, "-f", "-", input=profile("p", sidecars.port))
            # kopf needs to follow the namespace it serves; without that right it retries the
            # forbidden namespace list for about a minute before it watches anything.
            wait_for(lambda: condition(profile_of(cp, ns, "p"), "SpecValid"), 20, "the first status")
            assert time.monotonic() - started < 30

            cp.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(POD))
            pod = cp.api("GET", f"/api/v1/namespaces/{ns}/pods/trainer-0")
            assert any(c["name"] == "dam-sidecar" for c in pod["spec"].get("initContainers", [])), dumps(pod)
            cp.mark_pod_running(ns, "trainer-0")

            def data() -> bool:
                st = profile_of(cp, ns, "p").get("status") or {}
                return (st.get("bottleneck") or {}).get("axis") == "Data"

            wait_for(data, 40, "the Data verdict")
            wait_for(lambda: events_for(cp, ns, "p", "BottleneckChanged"), 20, "the BottleneckChanged Event")
            op.assert_alive()
            assert_never_refused(proxy.snapshot())
            used = {v for r in proxy.snapshot() if (v := verb_and_resource(r))}
            assert ("list", "", "namespaces") in used and (
                "patch",
                "dam.mlsys.dev",
                "damprofiles/status",
            ) in used
            # kopf runs only event handlers: nothing writes the DAMProfile object itself.
            object_verbs = {v[0] for v in used if v[1:] == ("dam.mlsys.dev", "damprofiles")}
            assert object_verbs == {"list", "watch"}, object_verbs
        except AssertionError:
            print(op.log())
            raise
        finally:
            op.close()
            chart.uninstall()


def test_a_verb_missing_from_the_chart_fails_the_check(
    control_plane: ControlPlane, kube_namespace: str, system_namespace: str, tmp_path: Path
) -> None:
    cp, ns = control_plane, kube_namespace
    chart = install_chart(cp, system_namespace, without={("dam.mlsys.dev", "damprofiles/status"): {"patch"}})
    with FaultProxy(cp.url, cp.ssl_context()) as proxy:
        op = run_operator(
            cp, chart, proxy, tmp_path, None, webhook=False, env={"DAM_WEBHOOK_ENABLED": "false"}
        )
        try:
            op.start()
            cp.kubectl("apply", "-n", ns, "-f", "-", input=profile("p", 9450))

            def status_refused() -> list[Record]:
                return [r for r in refused(proxy.snapshot()) if r.path.endswith("/p/status")]

            wait_for(status_refused, 30, "the refused status write")
            with pytest.raises(AssertionError, match=r"damprofiles/status"):
                assert_never_refused(proxy.snapshot())
            assert "status" not in profile_of(cp, ns, "p")
            op.assert_alive()  # refused writes are survived, not fatal
        finally:
            op.close()
            chart.uninstall()


def test_the_operator_is_refused_what_it_must_not_do(
    control_plane: ControlPlane, kube_namespace: str, system_namespace: str
) -> None:
    cp, ns = control_plane, kube_namespace
    chart = install_chart(cp, system_namespace)  # cluster-wide, the chart's default
    try:
        token = cp.service_account_token(system_namespace, chart.service_account)
        cp.api(
            "POST", f"/api/v1/namespaces/{ns}/secrets", {"metadata": {"name": "db"}, "stringData": {"k": "v"}}
        )
        cp.api(
            "POST",
            f"/api/v1/namespaces/{system_namespace}/secrets",
            {"metadata": {"name": "other"}, "stringData": {"k": "v"}},
        )
        cp.api("POST", f"/api/v1/namespaces/{ns}/pods", POD)
        pod = f"/api/v1/namespaces/{ns}/pods/trainer-0"
        merge = "application/merge-patch+json"
        forbidden: list[tuple[str, str, Any, str]] = [
            ("GET", f"/api/v1/namespaces/{ns}/secrets/db", None, "a Secret in a training namespace"),
            ("GET", f"/api/v1/namespaces/{ns}/secrets", None, "Secrets of a training namespace"),
            ("GET", "/api/v1/secrets", None, "Secrets of every namespace"),
            (
                "GET",
                f"/api/v1/namespaces/{system_namespace}/secrets/other",
                None,
                "another Secret beside its own",
            ),
            ("POST", f"/api/v1/namespaces/{ns}/pods", {**POD, "metadata": {"name": "x"}}, "creating a Pod"),
            ("PATCH", pod, {"metadata": {"labels": {"x": "y"}}}, "patching a Pod"),
            ("DELETE", pod, None, "deleting a Pod"),
            ("PATCH", f"{pod}/status", {"status": {"phase": "Failed"}}, "writing a Pod's status"),
            ("POST", f"{pod}/eviction", {"apiVersion": "policy/v1", "kind": "Eviction"}, "evicting a Pod"),
            ("GET", f"{pod}/log", None, "reading a Pod's log"),
            ("PATCH", f"{pod}/resize", {"spec": {}}, "resizing a Pod (the chart's rbac.podResize is off)"),
            (
                "POST",
                "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
                {"metadata": {"name": "evil"}, "webhooks": []},
                "creating a webhook configuration",
            ),
            (
                "POST",
                "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
                {
                    "metadata": {"name": "escalate"},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "ClusterRole",
                        "name": "admin",
                    },
                    "subjects": [{"kind": "User", "name": chart.username}],
                },
                "granting itself more",
            ),
        ]
        for method, path, body, what in forbidden:
            with pytest.raises(ApiError) as caught:
                cp.api(
                    method,
                    path,
                    body,
                    token=token,
                    content_type=merge if method == "PATCH" else "application/json",
                )
            assert caught.value.status == 403, f"{what}: {caught.value}"
            assert "forbidden" in caught.value.message, what
        # What it needs, it may: its own certificate Secret, pods (read-only), DAMProfile status.
        assert cp.api("GET", f"/api/v1/namespaces/{ns}/pods", token=token)["items"]
        secret = f"/api/v1/namespaces/{system_namespace}/secrets/{chart.env()['DAM_CERT_SECRET_NAME']}"
        with pytest.raises(ApiError) as missing:
            cp.api("GET", secret, token=token)
        assert missing.value.status == 404  # allowed, and not there yet
    finally:
        chart.uninstall()
