"""pytest plugin: a real Kubernetes control plane (etcd + kube-apiserver) for the whole session.

Registered in tests/conftest.py (``pytest_plugins``). Fixtures:
- ``kube_binaries`` (session): the built kube-apiserver/etcd and a kubectl; skips, or fails with
  ``CI=true``, when they are not built (``make kube-bin``).
- ``control_plane`` (session): a started :class:`tests.support.kubecluster.ControlPlane`.
- ``kube_namespace`` (function): a fresh namespace (with its ``default`` ServiceAccount) for one test,
  deleted afterwards.
- ``system_namespace`` (function): the CRDs applied and a fresh namespace for the operator itself
  (its certificate Secret), deleted afterwards.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.support.kubecluster import (
    HOW_TO_GET,
    ControlPlane,
    KubeBinaries,
    KubeBinariesMissingError,
    find_kube_binaries,
)
from tests.support.operator_harness import ensure_crds, operator_namespace


@pytest.fixture(scope="session")
def kube_binaries() -> KubeBinaries:
    try:
        return find_kube_binaries()
    except KubeBinariesMissingError as exc:
        message = f"NO REAL KUBERNETES CONTROL PLANE: {exc}"
    if "make kube-bin" not in message:
        message += f"; {HOW_TO_GET}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def control_plane(
    kube_binaries: KubeBinaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    cp = ControlPlane(kube_binaries, tmp_path_factory.mktemp("kube"))
    cp.start()
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture
def kube_namespace(control_plane: ControlPlane, request: pytest.FixtureRequest) -> Iterator[str]:
    name = control_plane.create_namespace(control_plane.namespace_name_for(request.node.name))
    try:
        yield name
    finally:
        if control_plane.running:
            control_plane.delete_namespace(name)


@pytest.fixture
def system_namespace(control_plane: ControlPlane) -> Iterator[str]:
    ensure_crds(control_plane)
    with operator_namespace(control_plane) as name:
        yield name
