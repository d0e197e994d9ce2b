"""The checkpoint save wrappers: the time the training thread blocks in a save, for the accounting.

``torch.save`` (``torch.serialization.save``), ``torch.distributed.checkpoint``'s ``save``,
``async_save`` (its blocking part: the staging before it returns) and ``save_state_dict``, and
``safetensors.torch``'s ``save_file`` and ``save_model`` are wrapped right after their module's
body ran (``dam_probe._autohook``'s import hook, ``PATCHES``), and so are ``os.fsync`` and
``os.fdatasync`` (a flush right after a save is that save's: ``Accounting.flushes_save``). A
wrapper counts the training thread's calls only, once when nested (``dcp.save`` calling
``torch.save``), and adds them to ``dam_probe._goodput.Accounting`` (``checkpoint_done``); while
it blocks, the watchdog reads its place as ``checkpoint`` (its frame: ``save`` in this file).

Every function takes the probe it counts for: ``_autohook`` passes ``dam_probe._core.PROBE``, a
test its own. Cost: nothing on the per-batch path (a wrapper runs once per save). Standard
library only.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Callable
from time import perf_counter_ns
from types import ModuleType
from typing import Any, Final

from dam_probe._core import Probe
from dam_probe.layout import PLACE_CHECKPOINT

MARK: Final = "_dam_probe_checkpoint"
SERIALIZATION: Final = "torch.serialization"
DCP_SAVER: Final = "torch.distributed.checkpoint.state_dict_saver"
DCP_PACKAGE: Final = "torch.distributed.checkpoint"
DCP_FUNCTIONS: Final = ("save", "async_save", "save_state_dict")
SAFETENSORS: Final = "safetensors.torch"
SAFETENSORS_FUNCTIONS: Final = ("save_file", "save_model")
"""Hugging Face's format (``transformers``' ``save_pretrained`` writes through ``save_file``):
``save_model`` calls ``save_file``, counted once (nested)."""


def timed_save(orig: Callable[..., Any], p: Probe) -> Callable[..., Any]:
    """A save function that counts the time the training thread blocks in it (once when nested:
    ``dcp.save`` calling ``torch.save``); calls from other threads (``async_save``'s writer) pass."""
    acc = p.goodput
    clock = perf_counter_ns
    ident = threading.get_ident
    probe = p
    what = f"{getattr(orig, '__module__', '') or ''}.{getattr(orig, '__name__', 'save')}".lstrip(".")

    @functools.wraps(orig)
    def save(*args: Any, **kwargs: Any) -> Any:
        if acc.ckpt_depth or ident() != acc.train_thread:
            return orig(*args, **kwargs)
        acc.ckpt_depth = 1
        t0 = clock()  # the announce's publish blocks the training thread for the save too
        # A save can block in C++ holding the GIL (torch.save opening a file on a dead file system):
        # its place is published on entry, as the watchdog's thread could not read it then.
        if probe.writer is not None:
            probe.watchdog.announce(probe, PLACE_CHECKPOINT, what)
        try:
            return orig(*args, **kwargs)
        finally:
            acc.ckpt_depth = 0
            probe.watchdog.left()
            acc.checkpoint_done(probe, t0, clock())

    setattr(save, MARK, True)
    return save


FLUSHES: Final = ("fsync", "fdatasync")
"""``os`` functions whose call right after a save is that save's (``Accounting.flushes_save``)."""


def timed_flush(orig: Callable[..., Any], p: Probe) -> Callable[..., Any]:
    """An ``os.fsync`` that adds its time to the latest save's when it flushes that save
    (``Accounting.flushes_save``); any other call passes untouched."""
    acc, probe, clock = p.goodput, p, perf_counter_ns

    @functools.wraps(orig)
    def flush(*args: Any, **kwargs: Any) -> Any:
        if not acc.flushes_save(probe):
            return orig(*args, **kwargs)
        t0 = clock()
        try:
            return orig(*args, **kwargs)
        finally:
            acc.checkpoint_done(probe, t0, clock(), flush=True)

    setattr(flush, MARK, True)
    return flush


def patch_flushes(p: Probe) -> None:
    """Wraps ``os.fsync`` and ``os.fdatasync`` (``timed_flush``), once."""
    for name in FLUSHES:
        orig = getattr(os, name, None)
        if orig is not None and callable(orig) and not getattr(orig, MARK, False):
            setattr(os, name, timed_flush(orig, p))


def _wrap(module: ModuleType, name: str, p: Probe) -> Callable[..., Any] | None:
    """Replaces ``module.name`` by its timed version; returns the original (None: absent or done)."""
    orig = module.__dict__.get(name)
    if orig is None or not callable(orig) or getattr(orig, MARK, False):
        return None
    setattr(module, name, timed_save(orig, p))
    return orig  # type: ignore[no-any-return]


def _rebind(holder: Any, name: str, orig: object, module: ModuleType) -> None:
    """A module that already copied the original (``torch.save``) gets the wrapper too."""
    if holder is not None and holder.__dict__.get(name) is orig:
        setattr(holder, name, getattr(module, name))


def patch_serialization(module: ModuleType, p: Probe) -> bool:
    """Wraps ``torch.serialization.save``. Run right after that module's body: ``torch/__init__``
    binds ``torch.save`` afterwards (``from torch.serialization import load, save``), so it binds
    the wrapper; an already bound ``torch.save`` is rebound."""
    orig = _wrap(module, "save", p)
    if orig is not None:
        _rebind(sys.modules.get("torch"), "save", orig, module)
    patch_flushes(p)
    p.goodput.checkpoints_on = True
    return True


def patch_dcp(module: ModuleType, p: Probe) -> bool:
    """Wraps ``save``, ``async_save`` and ``save_state_dict`` of
    ``torch.distributed.checkpoint.state_dict_saver``; the package re-exports them
    (``from .state_dict_saver import async_save, save, save_state_dict``) after this body ran."""
    for name in DCP_FUNCTIONS:
        orig = _wrap(module, name, p)
        if orig is not None:
            _rebind(sys.modules.get(DCP_PACKAGE), name, orig, module)
    p.goodput.checkpoints_on = True
    return True


def patch_safetensors(module: ModuleType, p: Probe) -> bool:
    """Wraps ``save_file`` and ``save_model`` of ``safetensors.torch``, right after its body ran:
    a later ``from safetensors.torch import save_file`` binds the wrapper."""
    for name in SAFETENSORS_FUNCTIONS:
        _wrap(module, name, p)
    p.goodput.checkpoints_on = True
    return True
