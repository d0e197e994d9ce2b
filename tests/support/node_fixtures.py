"""pytest plugin: a real one-node Kubernetes cluster (tests/support/nodecluster.py) for the session.

Registered in tests/conftest.py (``pytest_plugins``). Fixtures:
- ``node_cluster`` (session): a started :class:`tests.support.nodecluster.NodeCluster` with the
  project's image, the base (training) image and the pause image imported. Skips with one loud line,
  or fails with ``CI=true``, when a node cannot start here (not root, binaries or images not built:
  ``make kube-bin``, ``make image``, ``make system-deps``; ``make test`` runs all three first).
  Its teardown is ``make cluster-down``'s (``NodeCluster.stop``: :func:`dam_cluster.node.down`), and
  it fails when the machine's listing (:mod:`dam_cluster.footprint`) has something after it that it
  did not have before the start.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from dam_cluster import footprint
from tests.support.nodecluster import (
    HOW_TO_GET,
    NodeCluster,
    NodeUnavailableError,
    find_images,
    find_node_binaries,
    remove_stale_node,
)


@pytest.fixture(scope="session")
def node_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeCluster]:
    try:
        binaries, images = find_node_binaries(), find_images()
        workdir = tmp_path_factory.mktemp("node")
        # What a killed run left (its sysctls, chains, state file) is removed before the listing the
        # teardown is held to: not this session's to leave behind, nor to be blamed for.
        remove_stale_node()
        before = footprint.snapshot(workdirs=[str(workdir)])
        node = NodeCluster(binaries, workdir, images)
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
        left = footprint.added(before, footprint.snapshot(workdirs=[str(workdir)]))
        assert not left, "the node's teardown left these behind:\n" + "\n".join(left)
