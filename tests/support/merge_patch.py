"""A JSON merge patch (RFC 7386) applied in place, as the API server applies a status patch: the
in-memory API servers of the unit tests and benchmarks use it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def merge(target: dict[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """``target`` with ``patch`` merged in (a None value removes its key); returns ``target``."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(target.get(key), dict):
            merge(target[key], value)
        elif isinstance(value, Mapping):
            target[key] = merge({}, value)
        else:
            target[key] = value
    return target
