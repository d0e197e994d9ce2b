"""The real control plane (kube-apiserver + etcd built from source) and the real kubectl:
the CRD is accepted and served as written, invalid profiles are refused with the CRD's own
messages, RBAC decides, and Pods can be driven to Running without a kubelet.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.kubecluster import REPO, ApiError, ControlPlane, KubeBinaries
from tests.support.operator_harness import wait_established
from tests.support.procs import wait_for

CRD = REPO / "crds" / "damprofile.yaml"
EXAMPLE = REPO / "examples" / "damprofile.yaml"
CRD_NAME = "damprofiles.dam.mlsys.dev"


@pytest.fixture(scope="module")
def damprofile_crd(control_plane: ControlPlane) -> dict[str, Any]:
    """The CRD applied with kubectl and established; the server's copy of it."""
    control_plane.kubectl("apply", "-f", str(CRD))
    wait_established(control_plane, CRD_NAME)
    crd: dict[str, Any] = json.loads(control_plane.kubectl("get", "crd", CRD_NAME, "-o", "json").stdout)
    return crd


def profile(name: str, **spec: Any) -> str:
    body: dict[str, Any] = {"selector": {"matchLabels": {"app": "trainer"}}, **spec}
    doc = {
        "apiVersion": "dam.mlsys.dev/v1alpha1",
        "kind": "DAMProfile",
        "metadata": {"name": name},
        "spec": body,
    }
    return yaml.safe_dump(doc)


def test_kubectl_talks_to_the_pinned_server_release(control_plane: ControlPlane) -> None:
    version = json.loads(control_plane.kubectl("version", "-o", "json").stdout)
    server = version["serverVersion"]
    assert server["major"] == "1" and int(server["minor"]) >= 34
    assert re.fullmatch(rf"v1\.{server['minor']}\.[0-9]+", server["gitVersion"]), server


def test_the_crd_is_accepted_structural_and_established(damprofile_crd: dict[str, Any]) -> None:
    conditions = {c["type"]: c for c in damprofile_crd["status"]["conditions"]}
    assert conditions["Established"]["status"] == "True"
    assert conditions["NamesAccepted"]["status"] == "True"
    # A non-structural schema or a CEL rule over its cost budget shows up here.
    assert "NonStructuralSchema" not in conditions, conditions["NonStructuralSchema"]["message"]
    assert damprofile_crd["status"]["acceptedNames"]["shortNames"] == ["damp"]


def test_kubectl_get_shows_the_servers_printer_columns(
    control_plane: ControlPlane, damprofile_crd: dict[str, Any], kube_namespace: str
) -> None:
    control_plane.kubectl("apply", "-n", kube_namespace, "-f", str(EXAMPLE))

    plain = control_plane.kubectl("get", "damp", "-n", kube_namespace).stdout.splitlines()
    assert plain[0].split() == ["NAME", "AXIS", "REGIME", "LEVER", "CONFIDENCE", "GOODPUT", "AGE"]
    assert plain[1].split()[0] == "train-profile"
    wide = control_plane.kubectl("get", "damp", "-n", kube_namespace, "-o", "wide").stdout.splitlines()
    assert "REPORTING" in wide[0].split()  # priority-1 column: only in -o wide

    # The columns come from the server's Table, as the CRD declares them.
    table = control_plane.api(
        "GET",
        f"/apis/dam.mlsys.dev/v1alpha1/namespaces/{kube_namespace}/damprofiles",
        headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
    )
    assert table["kind"] == "Table"
    declared = damprofile_crd["spec"]["versions"][0]["additionalPrinterColumns"]
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name"] + [c["name"] for c in declared]


def test_kubectl_explain_describes_the_spec(
    control_plane: ControlPlane, damprofile_crd: dict[str, Any]
) -> None:
    # The OpenAPI document is published a moment after the CRD is established.
    def explained() -> str | None:
        done = control_plane.kubectl("explain", "damp.spec", check=False)
        return done.stdout if done.returncode == 0 else None

    text = wait_for(explained, 60, "kubectl explain damp.spec")
    assert "KIND:       DAMProfile" in text and "VERSION:    v1alpha1" in text, text
    fields = dict(re.findall(r"^  ([A-Za-z]+)\t(.*)$", text, flags=re.MULTILINE))
    assert fields["selector"] == "<Object> -required-"
    for field in ("sampling", "evaluation", "hardware", "thresholds", "sidecar", "source", "model"):
        assert fields[field] == "<Object>", text
    assert "What to diagnose and how." in text

    window = control_plane.kubectl("explain", "damp.spec.evaluation.windowSeconds").stdout
    assert "At least twice sampling.intervalSeconds" in " ".join(window.split())


def test_the_example_profile_is_accepted_and_defaulted_by_the_server(
    control_plane: ControlPlane, damprofile_crd: dict[str, Any], kube_namespace: str
) -> None:
    control_plane.kubectl("apply", "-n", kube_namespace, "-f", str(EXAMPLE))
    stored = json.loads(
        control_plane.kubectl("get", "damp", "train-profile", "-n", kube_namespace, "-o", "json").stdout
    )
    spec = stored["spec"]
    assert spec["selector"] == {"matchLabels": {"app": "trainer"}}
    assert spec["thresholds"] == {"dataWaitSuspect": 0.05}
    assert spec["sidecar"]["inject"] is True  # defaulted by the server, not in the file

    # A minimal profile gets every default from the schema.
    control_plane.kubectl("apply", "-n", kube_namespace, "-f", "-", input=profile("minimal"))
    minimal = control_plane.api(
        "GET", f"/apis/dam.mlsys.dev/v1alpha1/namespaces/{kube_namespace}/damprofiles/minimal"
    )["spec"]
    assert minimal["sampling"] == {"intervalSeconds": 1}
    assert minimal["evaluation"] == {
        "windowSeconds": 30,
        "hysteresisWindows": 2,
        "stallAfterSeconds": 300,
        "stallStepMultiple": 10,
    }
    assert minimal["sidecar"] == {"inject": True, "port": 9450, "shareProcessNamespace": False}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        pytest.param(
            {"sampling": {"intervalSeconds": 10}, "evaluation": {"windowSeconds": 15}},
            "evaluation.windowSeconds must be at least twice sampling.intervalSeconds",
            id="cel-window-vs-interval",
        ),
        pytest.param(
            {"thresholds": {"dataWaitFine": 0.5, "dataWaitSuspect": 0.2}},
            "dataWaitFine must be below dataWaitSuspect",
            id="cel-crossed-thresholds",
        ),
        pytest.param(
            {"selector": {"matchExpressions": [{"key": "app", "operator": "In"}], "matchLabels": {"a": "b"}}},
            "In and NotIn need a non-empty values list",
            id="cel-match-expression",
        ),
        pytest.param(
            {"evaluation": {"windowSeconds": 1}}, "should be greater than or equal to 5", id="minimum"
        ),
        pytest.param({"sidecar": {"port": "http"}}, 'Invalid value: "string"', id="type"),
        pytest.param(
            {"selector": {"matchLabels": {}}}, "should have at least 1 properties", id="empty-selector"
        ),
    ],
)
def test_an_invalid_profile_is_refused_with_the_crds_message(
    control_plane: ControlPlane, damprofile_crd: dict[str, Any], kube_namespace: str, spec: Any, message: str
) -> None:
    done = control_plane.kubectl(
        "apply", "-n", kube_namespace, "-f", "-", input=profile("bad", **spec), check=False
    )
    assert done.returncode != 0, done.stdout
    assert message in done.stderr, done.stderr
    assert "is invalid" in done.stderr
    absent = control_plane.kubectl("get", "damp", "bad", "-n", kube_namespace, check=False)
    assert absent.returncode != 0 and "NotFound" in absent.stderr


def test_rbac_refuses_a_service_account_without_bindings(
    control_plane: ControlPlane, kube_namespace: str
) -> None:
    kubeconfig = control_plane.service_account_kubeconfig(kube_namespace, "nobody")
    who = json.loads(control_plane.kubectl("auth", "whoami", "-o", "json", kubeconfig=kubeconfig).stdout)
    assert who["status"]["userInfo"]["username"] == f"system:serviceaccount:{kube_namespace}:nobody"

    refused = control_plane.kubectl("get", "pods", "-n", kube_namespace, kubeconfig=kubeconfig, check=False)
    assert refused.returncode != 0
    assert "Forbidden" in refused.stderr and 'cannot list resource "pods"' in refused.stderr, refused.stderr

    # Bound to a Role that allows it, the same token may list Pods, and still not Secrets.
    ns = kube_namespace
    control_plane.kubectl(
        "create", "role", "pod-reader", "-n", ns, "--verb=get,list,watch", "--resource=pods"
    )
    control_plane.kubectl(
        "create",
        "rolebinding",
        "nobody-reads-pods",
        "-n",
        ns,
        "--role=pod-reader",
        f"--serviceaccount={ns}:nobody",
    )
    wait_for(
        lambda: (
            control_plane.kubectl("get", "pods", "-n", ns, kubeconfig=kubeconfig, check=False).returncode == 0
        ),
        30,
        "the RoleBinding to take effect",
    )
    secrets = control_plane.kubectl("get", "secrets", "-n", ns, kubeconfig=kubeconfig, check=False)
    assert secrets.returncode != 0 and "Forbidden" in secrets.stderr


def test_a_pod_is_admitted_and_marked_running_without_a_kubelet(
    control_plane: ControlPlane, kube_namespace: str
) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "trainer-0", "labels": {"app": "trainer"}},
        "spec": {
            "initContainers": [{"name": "helper", "image": "busybox", "restartPolicy": "Always"}],
            "containers": [{"name": "train", "image": "python:3.11"}],
        },
    }
    control_plane.kubectl("apply", "-n", kube_namespace, "-f", "-", input=json.dumps(pod))
    created = control_plane.api("GET", f"/api/v1/namespaces/{kube_namespace}/pods/trainer-0")
    # The ServiceAccount admission plugin ran: the token volume is mounted into every container.
    assert created["spec"]["serviceAccountName"] == "default"
    assert any(v["name"].startswith("kube-api-access-") for v in created["spec"]["volumes"])
    assert created["status"]["phase"] == "Pending"

    running = control_plane.mark_pod_running(kube_namespace, "trainer-0")
    assert running["status"]["phase"] == "Running"
    assert running["status"]["podIP"] == "127.0.0.1"
    row = control_plane.kubectl(
        "get", "pod", "trainer-0", "-n", kube_namespace, "--no-headers"
    ).stdout.split()
    assert row[1:3] == ["2/2", "Running"]

    with pytest.raises(ApiError) as refused:  # a kubelet may not move a Pod back
        control_plane.api(
            "PATCH",
            f"/api/v1/namespaces/{kube_namespace}/pods/trainer-0/status",
            {"status": {"podIP": "not-an-ip"}},
            content_type="application/merge-patch+json",
        )
    assert refused.value.status == 422


@pytest.mark.slow
def test_restarts_keep_the_data_and_stop_leaves_no_process(
    kube_binaries: KubeBinaries, tmp_path: Path
) -> None:
    cp = ControlPlane(kube_binaries, tmp_path / "kube")
    cp.start()
    try:
        cp.kubectl("create", "configmap", "kept", "--from-literal=k=v")
        cp.restart_etcd()
        cp.restart_apiserver()
        assert cp.api("GET", "/api/v1/namespaces/default/configmaps/kept")["data"] == {"k": "v"}
        pids = cp.pids()
    finally:
        cp.stop()
    assert not cp.running
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    leftover = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True, check=False)
    assert leftover.stdout.strip() == ""


def test_delete_namespace_removes_it_with_its_objects_despite_finalizers(control_plane: ControlPlane) -> None:
    ns = control_plane.create_namespace(control_plane.namespace_name_for("cleanup"))
    held = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "held", "finalizers": ["dam.mlsys.dev/test"]},
    }
    control_plane.api("POST", f"/api/v1/namespaces/{ns}/configmaps", held)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }
    control_plane.api("POST", f"/api/v1/namespaces/{ns}/pods", pod)
    control_plane.mark_pod_running(ns, "p")

    control_plane.delete_namespace(ns)

    assert control_plane.api("GET", f"/api/v1/namespaces/{ns}", ok=(404,))["reason"] == "NotFound"
    for kind in ("configmaps", "pods", "serviceaccounts"):
        left = control_plane.api("GET", f"/api/v1/{kind}?fieldSelector=metadata.namespace%3D{ns}")["items"]
        assert left == [], (kind, left)
