"""The real control plane (etcd + kube-apiserver) the tests use: it lives in the project's dev tooling,
tools/node/dam_cluster/controlplane.py (``make cluster`` uses it too); this module keeps the tests'
import path."""

from dam_cluster.controlplane import (
    ADMIN_USER,
    BUILD_SCRIPT,
    HOW_TO_GET,
    REPO,
    SERVICE_CLUSTER_IP_RANGE,
    ApiError,
    ControlPlane,
    KubeBinaries,
    KubeBinariesMissingError,
    find_kube_binaries,
)

__all__ = [
    "ADMIN_USER",
    "BUILD_SCRIPT",
    "HOW_TO_GET",
    "REPO",
    "SERVICE_CLUSTER_IP_RANGE",
    "ApiError",
    "ControlPlane",
    "KubeBinaries",
    "KubeBinariesMissingError",
    "find_kube_binaries",
]
