"""Automatic instrumentation of torch, installed without importing torch.

``install()`` puts a ``sys.meta_path`` finder in front of the import system.
It answers only for the modules of ``PATCHES`` (a table of module name → patch
function): it lets the regular finders locate the module, and wraps the loader
so that right after the module body has run, the patch function runs on the
module. Once every module of the table has been patched, the finder removes
itself (the import system is past ``sys.meta_path`` by then). A module of the
table that is already imported is patched at once.

- ``torch.utils.data.dataloader``: ``_BaseDataLoaderIter.__next__`` is
  replaced by a timed version. Every ``DataLoader`` iterator (single- and
  multi-process) inherits it, so any training loop is measured without code
  changes. A failure disables the probe. DataLoader's error for a dead worker ("worker
  (pid N) is killed by signal: Killed", raised in ``next()`` or, from PyTorch's SIGCHLD
  handler, wherever the main thread is: ``sys.excepthook``, and the handler's own check,
  ``signal_handling._error_if_any_worker_fails``, which sees it first even when the training code
  catches it) is counted in the probe file and published at once.
- ``torch.distributed.distributed_c10d`` and ``torch.nn.parallel.distributed``:
  collectives and DDP gradient buckets are timed (``dam_probe._comm``). A
  failure leaves torch untouched and prints one line; the probe stays on.
- ``torchdata.stateful_dataloader.stateful_dataloader``: the DataLoader overrides
  (``DAM_LOADER_OVERRIDES``) for ``StatefulDataLoader``, whose ``__init__`` never calls
  DataLoader's. Without the variable this entry counts as done from the start, so the
  finder's lifetime is what it is without it. (Its batches need nothing: its iterators
  subclass ``_BaseDataLoaderIter`` and inherit the timed ``__next__``.)
- ``torch.serialization`` and ``torch.distributed.checkpoint.state_dict_saver``: ``torch.save``,
  ``dcp.save``, ``dcp.async_save`` (its blocking part) and ``dcp.save_state_dict`` are timed as
  checkpoint badput (``dam_probe._checkpoint``; once per save, nothing per batch). A failure leaves
  them untouched. The second module loads only with ``torch.distributed.checkpoint``, so in most
  processes the finder stays in ``sys.meta_path``: one dictionary lookup per later import.
- ``safetensors.torch``: ``save_file`` and ``save_model`` (Hugging Face's format; ``transformers``'
  ``save_pretrained``) are timed the same way, so a save through them is checkpoint badput, not
  productive step time.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from time import perf_counter_ns
from types import ModuleType
from typing import Any, Final, cast

from dam_probe import _checkpoint, _comm
from dam_probe._core import PROBE, Probe
from dam_probe._wrapper import dress

TARGET: Final = "torch.utils.data.dataloader"
SIGNAL_HANDLING: Final = "torch.utils.data._utils.signal_handling"
WORKER_CHECK: Final = "_error_if_any_worker_fails"  # what torch's SIGCHLD handler calls
ITER_CLASS: Final = "_BaseDataLoaderIter"
MARK: Final = "_dam_probe_wrapped"
# dam_probe.overrides' STATEFUL_MODULE and ENV_LOADER_OVERRIDES, not imported from there: that
# module imports inspect, json and pickle, which every Python process would pay at start-up.
STATEFUL_MODULE: Final = "torchdata.stateful_dataloader.stateful_dataloader"
ENV_LOADER_OVERRIDES: Final = "DAM_LOADER_OVERRIDES"


def timed_next(orig: Callable[[Any], Any], p: Probe = PROBE) -> Callable[[Any], Any]:
    """A ``__next__`` that times ``orig`` into ``p`` (innermost measurement wins).

    The body repeats the few lines of ``dam_probe._loop`` on purpose: this is the
    per-batch hot path, and a shared helper call would add about 60 ns a batch. The step
    counters are read through ``s``, bound once here (``p.step`` is reset in place after a
    fork, never replaced): ``p.step.steps`` would cost one more attribute lookup per field.
    """
    clock = perf_counter_ns
    s = p.step

    def __next__(self: Any) -> Any:  # noqa: N807 (it becomes the class's __next__)
        s0 = s.steps
        t0 = clock()
        try:
            item = orig(self)
        except StopIteration:
            p.stop(t0)
            raise
        except (RuntimeError, ConnectionError, EOFError) as exc:
            # "DataLoader worker (pid N) is killed by signal: Killed.", or the pipe of a worker that
            # died mid-send, re-raised by DataLoader before the worker was reaped.
            p.worker_failed(exc, self)
            raise
        t1 = clock()
        if s.steps == s0:
            s.steps = s0 + 1
            s.wait_ns += t1 - t0
            s.last_ns = t1
            if t1 >= s.next_publish_ns:
                p.slow_path(t0, t1, item, self)
        return item

    dress(__next__, orig, MARK)
    return __next__


def counted_check(orig: Callable[[], Any], p: Probe = PROBE) -> Callable[[], Any]:
    """torch's SIGCHLD check (``_error_if_any_worker_fails``), counting the worker deaths its
    error names before it propagates: the count is in the file even when the training code
    catches the error and exits (``sys.exit(1)``, ``os._exit``) without ``sys.excepthook``."""

    def check() -> Any:
        try:
            return orig()
        except RuntimeError as exc:
            p.worker_failed(exc)
            raise

    dress(check, orig, MARK)
    return check


def patch_worker_check() -> bool:
    """Wraps torch's SIGCHLD check once (the handler looks it up in its module at each call);
    False when torch has none (another version): the other two places still count."""
    module = sys.modules.get(SIGNAL_HANDLING)
    orig = getattr(module, WORKER_CHECK, None)
    if module is None or not callable(orig):
        return False
    if not getattr(orig, MARK, False):
        setattr(module, WORKER_CHECK, counted_check(orig))
    return True


def patch_module(module: ModuleType) -> bool:
    """Wraps ``module._BaseDataLoaderIter.__next__`` once; True when it is (now) wrapped."""
    from dam_probe.overrides import patch_dataloader

    patch_dataloader(module)  # opt-in DataLoader overrides (DAM_LOADER_OVERRIDES); never raises
    with contextlib.suppress(Exception):
        patch_worker_check()
    cls = getattr(module, ITER_CLASS, None)
    if cls is None:
        raise RuntimeError(f"{module.__name__}.{ITER_CLASS} not found (unsupported torch version)")
    orig = cls.__dict__.get("__next__")
    if orig is None:
        raise RuntimeError(f"{module.__name__}.{ITER_CLASS}.__next__ not found (unsupported torch version)")
    if getattr(orig, MARK, False):
        return True
    cls.__next__ = timed_next(orig)
    return True


def _guarded_patch(module: ModuleType) -> None:
    try:
        patch_module(module)
    except Exception as exc:
        PROBE.disable(f"cannot instrument DataLoader: {exc}")


def _guarded_comm(patch: Callable[[ModuleType], object]) -> Callable[[ModuleType], None]:
    def guarded(module: ModuleType) -> None:
        try:
            patch(module)
        except Exception as exc:
            _comm.report(f"cannot instrument {module.__name__}: {exc}")

    return guarded


def _guarded_checkpoint(patch: Callable[[ModuleType, Probe], object]) -> Callable[[ModuleType], None]:
    def guarded(module: ModuleType) -> None:
        try:
            patch(module, PROBE)
        except Exception as exc:
            with contextlib.suppress(Exception):
                line = " ".join(f"{module.__name__}: {exc}".split())
                sys.stderr.write(f"dam-probe: checkpoint saves not timed: {line}\n")

    return guarded


def _stateful_overrides(module: ModuleType) -> None:
    from dam_probe.overrides import patch_stateful_dataloader

    patch_stateful_dataloader(module)  # never raises


# Module name -> what runs on it right after its body (each guarded: it never raises).
PATCHES: Final[dict[str, Callable[[ModuleType], None]]] = {
    TARGET: _guarded_patch,
    _comm.C10D: _guarded_comm(_comm.patch_c10d),
    _comm.DDP: _guarded_comm(_comm.patch_ddp),
    STATEFUL_MODULE: _stateful_overrides,
    _checkpoint.SERIALIZATION: _guarded_checkpoint(_checkpoint.patch_serialization),
    _checkpoint.DCP_SAVER: _guarded_checkpoint(_checkpoint.patch_dcp),
    _checkpoint.SAFETENSORS: _guarded_checkpoint(_checkpoint.patch_safetensors),
}
_done: set[str] = set()  # the modules of PATCHES patched in this process


def _run_patch(name: str, module: ModuleType) -> None:
    _done.add(name)
    if name in (_comm.C10D, _comm.DDP) and _comm.off_by_env():
        return  # DAM_PROBE_COLLECTIVES=0: torch.distributed and DDP stay untouched
    PATCHES[name](module)


class _PatchingLoader:
    """Runs the real loader, then patches the module and restores the real loader on it."""

    def __init__(self, inner: Any, name: str = TARGET) -> None:
        self._inner = inner
        self._name = name

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        create = getattr(self._inner, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        inner = self._inner
        # The module sees its real loader (inspect, linecache, importlib.resources).
        module.__loader__ = inner
        spec = getattr(module, "__spec__", None)
        if spec is not None:
            spec.loader = inner
        inner.exec_module(module)
        _run_patch(self._name, module)
        if _done >= set(PATCHES):
            uninstall()  # not while the import system walks sys.meta_path: only after the module ran

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class DataLoaderHook:
    """The ``sys.meta_path`` finder; answers for the modules of ``PATCHES`` only."""

    dam_probe_hook: Final = True

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname not in PATCHES or fullname in _done:
            return None
        try:
            spec = None
            for finder in list(sys.meta_path):
                if finder is self or getattr(finder, "dam_probe_hook", False):
                    continue
                find = getattr(finder, "find_spec", None)
                if find is None:
                    continue
                spec = cast("ModuleSpec | None", find(fullname, path, target))
                if spec is not None:
                    break
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return spec
            spec.loader = _PatchingLoader(spec.loader, fullname)  # type: ignore[assignment]
            return spec
        except Exception as exc:
            if fullname == TARGET:
                PROBE.disable(f"cannot instrument DataLoader: {exc}")
            elif fullname in (_comm.C10D, _comm.DDP):
                _comm.report(f"cannot instrument {fullname}: {exc}")
            return None


def _excepthook(previous: Callable[..., Any]) -> Callable[..., Any]:
    """``sys.excepthook`` that counts a DataLoader worker death first, then calls ``previous``.

    PyTorch's SIGCHLD handler raises "DataLoader worker (pid N) is killed by signal: Killed."
    wherever the main thread is when the worker dies, often outside ``next()`` (in the
    forward pass): the exception then reaches the top uncaught, and passes here before the
    interpreter's exit handlers publish the probe's last record.
    """

    def hook(exc_type: type[BaseException], exc: BaseException, tb: Any) -> Any:
        PROBE.worker_failed(exc)
        return previous(exc_type, exc, tb)

    setattr(hook, MARK, True)
    return hook


def install_excepthook() -> None:
    """Idempotent; keeps whatever hook was there before (called after ours)."""
    if not getattr(sys.excepthook, MARK, False):
        sys.excepthook = _excepthook(sys.excepthook)


def installed() -> bool:
    return any(getattr(f, "dam_probe_hook", False) for f in sys.meta_path)


def install() -> None:
    """Arranges for torch's DataLoader, collectives and DDP to be instrumented.

    Idempotent; never imports torch: the modules already imported are patched
    at once, the finder waits for the others.
    """
    install_excepthook()
    if not os.environ.get(ENV_LOADER_OVERRIDES, "").strip():
        _done.add(STATEFUL_MODULE)  # no overrides: nothing to do for torchdata's loader
    for name in PATCHES:
        module = sys.modules.get(name)
        if module is not None and name not in _done:
            _run_patch(name, module)
    if not _done >= set(PATCHES) and not installed():
        sys.meta_path.insert(0, DataLoaderHook())


def uninstall() -> None:
    """Removes the finder (the modules already patched stay patched)."""
    sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "dam_probe_hook", False)]
