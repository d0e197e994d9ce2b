"""pytest plugin: a real one-node Kubernetes cluster (tests/support/nodecluster.py) for the session.

Registered in tests/conftest.py (``pytest_plugins``). Fixtures:
- ``node_cluster`` (session): a started :class:`tests.support.nodecluster.NodeCluster` with the
  project's image, the base (training) image and the pause image imported. Skips with one loud line,
  or fails with ``CI=true``, when a node cannot start here (not root, binaries or images not built:
  ``make kube-bin``, ``make image``, ``make system-deps``; ``make test`` runs all three first).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.support.nodecluster import (
    HOW_TO_GET,
    NodeCluster,
    NodeUnavailableError,
    find_images,
    find_node_binaries,
)


@pytest.fixture(scope="session")
def node_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeCluster]:
    try:
        binaries, images = find_node_binaries(), find_images()
        node = NodeCluster(binaries, tmp_path_factory.mktemp("node"), images)
        node.start()
    except (NodeUnavailableError, AssertionError, RuntimeError, OSError) as exc:
        # Missing parts, or a start that failed here (its log tail is in the message).
        message = f"NO REAL KUBERNETES NODE: {exc}; {HOW_TO_GET}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    try:
        yield node
    finally:
        node.stop()
