"""What the sidecar and the operator share: the contract between them, standard library only.

- ``names``: the ``dam_`` metric names, their label values (roles, badput causes, ...), the
  families the sidecar exports and the operator reads (docs/metrics.md is generated from them);
- ``snapshot``: the parsed exposition (``Snapshot``, ``Sample``, ``CompactSnapshot``) and the
  strict Prometheus text reader that builds it (``parse``, ``parse_snapshot``, ``read_snapshot``).

``dam_sidecar`` writes what ``names`` says and ``dam_operator`` reads it back through
``snapshot``; neither owns the contract. It imports nothing outside the standard library
(import-linter), so the probe may use it too.
"""
