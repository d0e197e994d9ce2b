"""Warn about ``DAM_…`` environment variables that nothing reads (a typo is otherwise silent).

Every process of this project reads its settings from ``DAM_``-prefixed variables with
pydantic-settings, which ignores unknown names by design (one environment is often shared
by the sidecar, the probe and the operator). ``unknown_variables`` lists the names that no
component knows, each with the closest known name, so that a process can log one warning
at start-up: ``DAM_INTERVAL_SECOND is not a setting (did you mean DAM_INTERVAL_SECONDS?)``.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

from pydantic_settings import BaseSettings

PREFIX = "DAM_"

PROBE_VARIABLES = (
    "DAM_PROBE_DIR",
    "DAM_PROBE_DISABLE",
    "DAM_PROBE_CGROUP_ROOT",
    "DAM_LOADER_OVERRIDES",
)
"""Read by the in-process probe (standard library only, no settings class)."""


def known_variables(*settings: type[BaseSettings]) -> set[str]:
    """The environment names of every field of ``settings`` (upper case), plus the probe's."""
    names = set(PROBE_VARIABLES)
    for cls in settings:
        prefix = str(cls.model_config.get("env_prefix") or "")
        names.update(f"{prefix}{field}".upper() for field in cls.model_fields)
    return names


def unknown_variables(environ: Mapping[str, str], known: Iterable[str]) -> list[str]:
    """One sentence per ``DAM_`` variable in ``environ`` that is not in ``known``, sorted."""
    known_set = {k.upper() for k in known}
    out = []
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(PREFIX) or upper in known_set:
            continue
        close = difflib.get_close_matches(upper, sorted(known_set), n=1, cutoff=0.75)
        hint = f" (did you mean {close[0]}?)" if close else ""
        out.append(f"{name} is not a setting of any dam component and is ignored{hint}")
    return out
