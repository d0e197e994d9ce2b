# dam-probe sitecustomize: automatic DataLoader instrumentation.
"""dam-probe's ``sitecustomize``: instruments every torch DataLoader in this interpreter.

Python imports ``sitecustomize`` at start-up from the first ``sys.path`` entry
that has one; with this file's directory on ``PYTHONPATH`` that is this file.
It then:

1. when ``DAM_PROBE_DIR`` is set and ``DAM_PROBE_DISABLE`` is not, installs
   ``dam_probe._autohook`` (a ``sys.meta_path`` finder that patches
   ``torch.utils.data.dataloader._BaseDataLoaderIter.__next__`` right after
   torch loads that module; torch itself is never imported here);
2. always runs the ``sitecustomize`` that Python would otherwise have found
   further down ``sys.path`` (the distribution's or the image's), once.

Running it twice is harmless. It never raises: an error prints one line.
"""

from __future__ import annotations

import os
import sys
import types

_STATE_MODULE = "_dam_probe_site"
_DISABLE_VALUES = ("1", "true", "yes", "on")


def _dam_probe_state() -> types.ModuleType:
    state = sys.modules.get(_STATE_MODULE)
    if state is None:
        state = types.ModuleType(_STATE_MODULE)
        setattr(state, "visited_dirs", set())  # noqa: B010 (a plain module, no declared attributes)
        setattr(state, "chained_origins", set())  # noqa: B010
        sys.modules[_STATE_MODULE] = state
    return state


def _dam_probe_realpath(entry: str) -> str:
    try:
        return os.path.realpath(entry or os.getcwd())
    except (OSError, ValueError):
        return entry


def _dam_probe_instrument() -> None:
    if os.environ.get("DAM_PROBE_DISABLE", "").strip().lower() in _DISABLE_VALUES:
        return
    if not os.environ.get("DAM_PROBE_DIR", "").strip():
        return
    try:
        from dam_probe import _autohook

        _autohook.install()
    except Exception as exc:
        sys.stderr.write(f"dam-probe: disabled: cannot install automatic instrumentation: {exc}\n")


def _dam_probe_chain(state: types.ModuleType) -> None:
    """Executes the next ``sitecustomize`` on ``sys.path`` (not ours), at most once per file."""
    try:
        import importlib.util
        from importlib.machinery import PathFinder

        visited: set[str] = getattr(state, "visited_dirs")  # noqa: B009
        search = [p for p in sys.path if isinstance(p, str) and _dam_probe_realpath(p) not in visited]
        spec = PathFinder.find_spec("sitecustomize", search)
        if spec is None or spec.loader is None:
            return
        origin = _dam_probe_realpath(spec.origin or "")
        chained: set[str] = getattr(state, "chained_origins")  # noqa: B009
        if origin in chained:
            return
        chained.add(origin)
        module = importlib.util.module_from_spec(spec)
        ours = sys.modules.get("sitecustomize")
        sys.modules["sitecustomize"] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            if ours is not None:
                sys.modules["sitecustomize"] = ours
            raise
        # ``import sitecustomize`` now gives the chained module, as it would without us.
    except Exception as exc:
        sys.stderr.write(f"dam-probe: error in the chained sitecustomize: {type(exc).__name__}: {exc}\n")


def _dam_probe_main() -> None:
    state = _dam_probe_state()
    here = os.path.dirname(os.path.abspath(__file__))
    visited: set[str] = getattr(state, "visited_dirs")  # noqa: B009
    visited.add(_dam_probe_realpath(here))
    _dam_probe_instrument()
    _dam_probe_chain(state)


_dam_probe_main()
