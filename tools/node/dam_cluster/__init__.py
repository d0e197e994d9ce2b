"""The project's dev cluster: a real Kubernetes control plane (:mod:`dam_cluster.controlplane`) and a
real one-node cluster (:mod:`dam_cluster.node`) on this machine, for ``make cluster`` and the tests.

Dev tooling, not the product: no ``dam_*`` package imports it (import-linter's contract in
pyproject.toml). ``python -m dam_cluster up|down|status|footprint`` (tools/node on ``PYTHONPATH``;
the Makefile sets it); the tests reach it through ``tests/support``.
"""
