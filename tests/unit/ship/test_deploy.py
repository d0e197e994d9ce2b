"""deploy/: the static manifests are the chart's render, current, and consistent."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

pytest.importorskip("helm_python", reason="helm-python-sdk (the Helm engine) is not installed")

from tests.support.kubecluster import ControlPlane

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"


def _render_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dam_deploy_render", DEPLOY / "render.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def rendered() -> dict[str, str]:
    files: dict[str, str] = _render_module().render_files()
    return files


def _objects(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def test_static_manifests_are_the_current_chart_render(rendered: dict[str, str]) -> None:
    for name, text in rendered.items():
        path = DEPLOY / name
        assert path.exists(), f"deploy/{name} missing: run .venv/bin/python deploy/render.py"
        assert path.read_text() == text, f"deploy/{name} is stale: run .venv/bin/python deploy/render.py"


def test_rbac_file_holds_exactly_the_rbac_objects_of_the_full_manifest(rendered: dict[str, str]) -> None:
    full = _objects(rendered["dam-operator.yaml"])
    rbac = _objects(rendered["rbac.yaml"])
    kinds = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
    assert rbac == [o for o in full if o["kind"] in kinds]
    assert {o["kind"] for o in rbac} == kinds


def test_full_manifest_installs_namespace_and_crd_before_what_needs_them(rendered: dict[str, str]) -> None:
    kinds = [o["kind"] for o in _objects(rendered["dam-operator.yaml"])]
    assert kinds[0] == "Namespace"
    assert kinds.index("CustomResourceDefinition") < kinds.index("Deployment")
    assert kinds.index("ServiceAccount") < kinds.index("Deployment")
    crd = next(o for o in _objects(rendered["dam-operator.yaml"]) if o["kind"] == "CustomResourceDefinition")
    assert crd == yaml.safe_load((ROOT / "crds" / "damprofile.yaml").read_text())


def test_static_manifests_do_not_claim_to_be_a_helm_release(rendered: dict[str, str]) -> None:
    for text in rendered.values():
        for obj in _objects(text):
            labels = obj["metadata"].get("labels", {})
            assert "helm.sh/chart" not in labels
            assert labels.get("app.kubernetes.io/managed-by") != "Helm"


def test_kubectl_applies_the_static_install_and_an_example_profile(
    control_plane: ControlPlane, kube_namespace: str
) -> None:
    """The real kubectl and a real API server (tests/support/kubecluster.py; skipped without
    the binaries, see docs/testing.md)."""
    cp, manifest = control_plane, str(DEPLOY / "dam-operator.yaml")
    expected = _objects((DEPLOY / "dam-operator.yaml").read_text())
    try:
        applied = cp.kubectl("apply", "--server-side", "-f", manifest)
        assert applied.stdout.count("serverside-applied") == len(expected), applied.stdout
        kinds = "deploy,svc,sa,mutatingwebhookconfiguration"
        listed = cp.kubectl("get", kinds, "-n", "dam-system", "-o", "name")
        for name in (
            "deployment.apps/dam-operator",
            "service/dam-operator-webhook",
            "serviceaccount/dam-operator",
            "mutatingwebhookconfiguration.admissionregistration.k8s.io/dam-operator",
        ):
            assert name in listed.stdout
        cp.kubectl("wait", "--for=condition=Established", "crd/damprofiles.dam.mlsys.dev", "--timeout=60s")
        cp.kubectl("apply", "-n", kube_namespace, "-f", str(ROOT / "examples" / "damprofile.yaml"))
        got = cp.kubectl("get", "damp", "-n", kube_namespace, "-o", "name")
        assert got.stdout.strip() == "damprofile.dam.mlsys.dev/train-profile"
    finally:
        # The CRD stays (other tests use it); the rest would outlive the test: a webhook
        # configuration whose Service nobody serves, cluster-wide RBAC, the dam-system namespace.
        kinds = "mutatingwebhookconfiguration,clusterrole,clusterrolebinding"
        cp.kubectl("delete", kinds, "-l", "app.kubernetes.io/instance=dam-operator", "--ignore-not-found")
        if cp.running:
            cp.delete_namespace("dam-system")
