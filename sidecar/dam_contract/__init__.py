"""What the sidecar and the operator share: the contract between them, standard library only.

- ``names``: every ``dam_`` metric the sidecar exports, declared once (name, type, HELP, labels,
  source, the sample field it is read from: ``CATALOG``), bound to plain ``str`` constants the
  operator reads, and their label values (roles, badput causes, ...); the sidecar's collectors
  build their families from it and docs/metrics.md is generated from it;
- ``snapshot``: the parsed exposition (``Snapshot``, ``Sample``, ``CompactSnapshot``) and the
  strict Prometheus text reader that builds it (``parse``, ``parse_snapshot``, ``read_snapshot``).

``dam_sidecar`` writes what ``names`` says and ``dam_operator`` reads it back through
``snapshot``; neither owns the contract. It imports nothing outside the standard library
(import-linter), so the probe may use it too.
"""
