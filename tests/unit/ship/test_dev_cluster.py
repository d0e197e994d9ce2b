"""The dev cluster's tooling without a cluster: what ``make cluster-down`` removes of the trees the
kubelet and containerd write into (tools/node/dam_cluster/node.py ``_remove_new``), and the pins of
``make tools`` (tools/kube-tools/build.sh). The node itself:
tests/integration/node/test_cluster_lifecycle.py."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from dam_cluster.node import _remove_new, _tree

ROOT = Path(__file__).resolve().parents[3]
KUBE_TOOLS = ROOT / "tools" / "kube-tools"


def _populate(root: Path, paths: list[str]) -> None:
    for rel in paths:
        path = root / rel
        if rel.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("x")


def test_removing_what_a_node_made_keeps_what_was_there_before(tmp_path: Path) -> None:
    root = tmp_path / "kubelet"
    _populate(root, ["pods/", "pki/old.crt", "device-plugins/"])
    before = _tree(root)
    _populate(root, ["pki/kubelet.crt", "pki/kubelet.key", "device-plugins/kubelet.sock", "new/deep/file"])
    os.symlink("/nonexistent", root / "link")

    assert _remove_new(root, before) == []

    assert _tree(root) == before == ["device-plugins", "pki", "pki/old.crt", "pods"]


def test_removing_what_a_node_made_removes_a_tree_that_was_not_there(tmp_path: Path) -> None:
    root = tmp_path / "containerd"
    _populate(root, ["s/0123abcd", "runc/k8s.io/"])

    assert _remove_new(root, None) == []

    assert not root.exists()
    assert _remove_new(root, None) == []  # twice: nothing to do


def _pin(go_mod: Path, module: str) -> str:
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)} (v\S+)", go_mod.read_text(), re.MULTILINE)
    assert match, f"{go_mod} does not require {module}"
    return match.group(1)


def test_make_tools_pins_helm_3_and_the_crictl_and_kubectl_of_the_clusters_release() -> None:
    kubernetes = _pin(ROOT / "tools" / "kube-bin" / "node" / "go.mod", "k8s.io/kubernetes")
    assert kubernetes == _pin(ROOT / "tools" / "kube-bin" / "kube-apiserver" / "go.mod", "k8s.io/kubernetes")
    # kubectl of the cluster's release: no version-skew warning on any call.
    assert _pin(KUBE_TOOLS / "kubectl" / "go.mod", "k8s.io/kubernetes") == kubernetes
    helm = _pin(KUBE_TOOLS / "helm" / "go.mod", "helm.sh/helm/v3")
    crictl = _pin(KUBE_TOOLS / "crictl" / "go.mod", "sigs.k8s.io/cri-tools")
    assert re.fullmatch(r"v3\.\d+\.\d+", helm), helm
    # cri-tools' minor follows the Kubernetes minor it speaks CRI with.
    assert crictl.split(".")[:2] == kubernetes.split(".")[:2], (crictl, kubernetes)
    for module in ("kubectl", "helm", "crictl"):
        assert (KUBE_TOOLS / module / "go.sum").stat().st_size > 0


def test_make_tools_without_a_build_names_what_is_missing_and_how_to_get_it(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(KUBE_TOOLS / "build.sh"), "--no-build"],
        env={**os.environ, "DAM_TOOLS_CACHE": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 3, done.stderr
    assert done.stdout == ""
    assert "kubectl helm crictl not built yet" in done.stderr and "make tools" in done.stderr, done.stderr


def test_make_cluster_runs_the_dev_cluster_from_tools_not_from_the_tests() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "tests.support" not in makefile
    assert "python -m dam_cluster" in makefile
    assert re.search(r"^cluster: .*\btools\b", makefile, re.MULTILINE), "make cluster builds make tools first"
