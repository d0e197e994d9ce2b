"""The metric catalog, kept at its old import path: every metric is declared in ``dam_contract.names``.

``CATALOG`` (every ``MetricSpec``, in declaration order) and ``BY_NAME`` are that module's; the
collectors build their families from it and ``tools/gen_metrics_doc.py`` writes docs/metrics.md
from it.
"""

from __future__ import annotations

from dam_contract.names import BY_NAME, CATALOG, MetricSpec

__all__ = ["BY_NAME", "CATALOG", "MetricSpec"]
