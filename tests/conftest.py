"""Shared pytest configuration: GPU tests are skipped where no GPU is present."""

from __future__ import annotations

import shutil

import pytest

# The real control plane (kube-apiserver + etcd built from source): fixtures control_plane,
# kube_namespace, kube_binaries.
# A real one-node cluster (kubelet + containerd running the project's image): fixture node_cluster.
pytest_plugins = ["tests.support.kube_fixtures", "tests.support.node_fixtures"]


def _has_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (none on this machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
