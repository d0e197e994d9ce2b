"""What a failed fetch of one pod's counters says: ``SourceError`` with a short, bounded ``reason``
(one of ``metric_names.SCRAPE_ERROR_REASONS``, a metric label) and a message for people. The
sources (``adapters.sources``) raise it; the window step counts it; so it lives with the steps.
"""

from __future__ import annotations


class SourceError(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
