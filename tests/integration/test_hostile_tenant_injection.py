"""A hostile tenant and the pod webhook, for real (issue 25, parts 1 and 2): a user allowed only to
write DAMProfiles in their namespace (a Role and RoleBinding for a ServiceAccount on the real
kube-apiserver, its own token) tries to choose the code and the privileges of other users' Pods
through a profile: its own sidecar image (which would run beside the training container and copy
code onto its PYTHONPATH) and a shared process namespace.

The operator runs as a child process with exactly the chart's RBAC and settings (``install_chart``),
its webhook registered through the chart's MutatingWebhookConfiguration (by URL: no Service routing
on a control plane without nodes). Another user, who may create Pods, creates them after the
tenant's profiles; the Pods are read back as the API server stored them.

- Under the chart's defaults a profile naming an image of its own, or asking for a shared process
  namespace, is refused (SpecValid=False naming the field and the chart value, a Warning Event),
  and the pod-creator's Pods are admitted uninstrumented (never blocked), with no trace of the
  tenant's image, and reported so in the profile's status. A Pod of a valid profile gets the
  chart's image and no shared process namespace.
- Where the admin listed the image and allowed sharing, the same profile instruments its Pods with
  that image and a shared process namespace.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.kubecluster import ControlPlane
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

TENANT_IMAGE = "evil.example/miner:1"
NOTE = "not-injected:sidecar-not-allowed"  # injection.NOTE_SKIP_POLICY
REFUSED = "RefusedByClusterPolicy"  # status.REASON_REFUSED
OURS = ("dam-probe-install", "dam-sidecar")


def _profile(name: str, app: str, **sidecar: Any) -> str:
    spec: dict[str, Any] = {"selector": {"matchLabels": {"app": app}}, "evaluation": {"windowSeconds": 5}}
    if sidecar:
        spec["sidecar"] = sidecar
    return yaml.safe_dump(
        {
            "apiVersion": "dam.mlsys.dev/v1alpha1",
            "kind": "DAMProfile",
            "metadata": {"name": name},
            "spec": spec,
        }
    )


def _pod(name: str, app: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {"containers": [{"name": "train", "image": "python:3.11-slim", "command": ["python"]}]},
    }


def _user(cp: ControlPlane, ns: str, name: str, rule: dict[str, list[str]]) -> Path:
    """A ServiceAccount whose only rights are ``rule`` (a Role rule) in its own namespace."""
    kubeconfig = cp.service_account_kubeconfig(ns, name)
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}"
    cp.api(
        "POST",
        f"{rbac}/roles",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": name},
            "rules": [rule],
        },
    )
    cp.api(
        "POST",
        f"{rbac}/rolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}],
        },
    )
    return kubeconfig


class Cluster:
    """The chart's operator with its webhook, a DAMProfile-only tenant and a Pod creator."""

    def __init__(self, cp: ControlPlane, ns: str, chart: ChartInstall, op: OperatorProcess) -> None:
        self.cp, self.ns, self.chart, self.op = cp, ns, chart, op
        self.tenant = _user(
            cp,
            ns,
            "tenant",
            {
                "apiGroups": ["dam.mlsys.dev"],
                "resources": ["damprofiles"],
                "verbs": ["create", "get", "list", "watch", "update"],
            },
        )
        self.trainer = _user(
            cp, ns, "trainer", {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get"]}
        )
        for verb, resource in (("create", "pods"), ("patch", "pods"), ("create", "pods/exec")):
            can = cp.kubectl("-n", ns, "auth", "can-i", verb, resource, kubeconfig=self.tenant, check=False)
            assert can.stdout.strip() == "no", f"the tenant must not {verb} {resource}"

    def profile(self, manifest: str) -> None:
        self.cp.kubectl("apply", "-n", self.ns, "-f", "-", input=manifest, kubeconfig=self.tenant)

    def spec_valid(self, name: str) -> dict[str, Any]:
        def written() -> dict[str, Any] | None:
            self.op.assert_alive()
            return condition(profile_of(self.cp, self.ns, name), "SpecValid")

        return wait_for(written, 30, f"SpecValid on profile {name}")

    def create_pod(self, pod: dict[str, Any]) -> tuple[dict[str, Any], str]:
        """Created by the Pod creator; (the Pod as the server stored it, kubectl's warnings)."""
        done = self.cp.kubectl(
            "create", "-n", self.ns, "-f", "-", input=json.dumps(pod), kubeconfig=self.trainer
        )
        stored: dict[str, Any] = self.cp.api(
            "GET", f"/api/v1/namespaces/{self.ns}/pods/{pod['metadata']['name']}"
        )
        return stored, done.stderr


@pytest.fixture
def cluster_for(
    control_plane: ControlPlane, kube_namespace: str, system_namespace: str, tmp_path: Path
) -> Iterator[Any]:
    """``cluster_for(values)``: the chart installed with ``values`` and its operator started."""
    started: list[tuple[ChartInstall, OperatorProcess]] = []

    def start(values: dict[str, Any]) -> Cluster:
        cp, ns = control_plane, kube_namespace
        chart = install_chart(cp, system_namespace, {"operator": {"watchNamespace": ns}, **values})
        op = OperatorProcess(
            cp,
            tmp_path,
            namespace=ns,
            operator_namespace=chart.namespace,
            env=chart.env(),
            kubeconfig=chart.kubeconfig,
        )
        started.append((chart, op))
        chart.apply(chart.webhook_configuration(op.webhook_url))
        op.start()
        return Cluster(cp, ns, chart, op)

    try:
        yield start
    except AssertionError:
        for _, op in started:
            print(op.log())
        raise
    finally:
        for chart, op in started:
            op.close()
            chart.uninstall()


def _ours(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        c for key in ("initContainers", "containers") for c in pod["spec"].get(key, []) if c["name"] in OURS
    ]


@pytest.mark.slow
def test_a_tenants_image_and_shared_namespace_are_refused_and_never_reach_a_pod(cluster_for: Any) -> None:
    c: Cluster = cluster_for({})  # the chart's defaults
    env = c.chart.env()
    assert "DAM_SIDECAR_ALLOWED_IMAGES" not in env
    assert env["DAM_SIDECAR_ALLOW_SHARE_PROCESS_NAMESPACE"] == "false"
    admins = env["DAM_DEFAULT_SIDECAR_IMAGE"]

    c.profile(_profile("evil", "victim", image=TENANT_IMAGE))
    c.profile(_profile("shared", "peer", shareProcessNamespace=True))
    c.profile(_profile("plain", "plain"))
    for name, field, value in (
        ("evil", "spec.sidecar.image", "sidecar.allowedImages"),
        ("shared", "spec.sidecar.shareProcessNamespace", "sidecar.allowShareProcessNamespace"),
    ):
        cond = c.spec_valid(name)
        assert (cond["status"], cond["reason"]) == ("False", REFUSED), cond
        assert field in cond["message"] and value in cond["message"], cond["message"]
        events = wait_for(lambda name=name: events_for(c.cp, c.ns, name, REFUSED), 20, f"the Event of {name}")
        assert events[0]["type"] == "Warning" and field in events[0]["message"], events
    assert c.spec_valid("plain")["status"] == "True"

    # The Pod creator's Pods, after the tenant's profiles: admitted, never blocked.
    victim, warnings = c.create_pod(_pod("victim-0", "victim"))
    assert TENANT_IMAGE not in json.dumps(victim), dumps(victim)
    assert _ours(victim) == [] and "initContainers" not in victim["spec"], dumps(victim["spec"])
    assert victim["metadata"]["annotations"]["dam.mlsys.dev/injection-notes"] == NOTE
    assert "spec.sidecar.image" in warnings, warnings
    peer, _ = c.create_pod(_pod("peer-0", "peer"))
    assert _ours(peer) == [] and "shareProcessNamespace" not in peer["spec"], dumps(peer["spec"])
    plain, _ = c.create_pod(_pod("plain-0", "plain"))
    assert [x["image"] for x in _ours(plain)] == [admins, admins], dumps(plain["spec"])
    assert "shareProcessNamespace" not in plain["spec"], dumps(plain["spec"])

    # The tenant's own status says which Pods it did not instrument, and why.
    def reported(name: str, pod: str) -> dict[str, Any] | None:
        status = profile_of(c.cp, c.ns, name).get("status") or {}
        return status if (status.get("pods") or {}).get("notInstrumented") == [pod] else None

    for name, pod in (("evil", "victim-0"), ("shared", "peer-0")):
        status = wait_for(lambda name=name, pod=pod: reported(name, pod), 30, f"{pod} listed uninstrumented")
        assert status["pods"]["matched"] == 1 and status["pods"]["instrumented"] == 0, status["pods"]
        instrumented = next(x for x in status["conditions"] if x["type"] == "Instrumented")
        assert instrumented["status"] == "False" and "admitted without the sidecar" in instrumented["message"]
        valid = next(x for x in status["conditions"] if x["type"] == "SpecValid")
        assert valid["reason"] == REFUSED, valid  # still, window after window
    c.op.assert_alive()


@pytest.mark.slow
def test_an_image_the_admin_listed_and_a_namespace_share_it_allowed_reach_the_pods(cluster_for: Any) -> None:
    c: Cluster = cluster_for(
        {"sidecar": {"allowedImages": [TENANT_IMAGE], "allowShareProcessNamespace": True}}
    )
    c.profile(_profile("listed", "victim", image=TENANT_IMAGE, shareProcessNamespace=True))
    assert c.spec_valid("listed")["status"] == "True"
    pod, _ = c.create_pod(_pod("victim-0", "victim"))
    assert [x["image"] for x in _ours(pod)] == [TENANT_IMAGE, TENANT_IMAGE], dumps(pod["spec"])
    assert pod["spec"]["shareProcessNamespace"] is True
    c.op.assert_alive()
