"""The real one-node cluster the node tier uses: it lives in the project's dev tooling,
tools/node/dam_cluster/node.py (``make cluster``); this module keeps the tests' import path."""

from dam_cluster.node import (
    HOW_TO_GET,
    NodeBinaries,
    NodeCluster,
    NodeUnavailableError,
    down,
    find_images,
    find_node_binaries,
    remove_stale_node,
)

__all__ = [
    "HOW_TO_GET",
    "NodeBinaries",
    "NodeCluster",
    "NodeUnavailableError",
    "down",
    "find_images",
    "find_node_binaries",
    "remove_stale_node",
]
