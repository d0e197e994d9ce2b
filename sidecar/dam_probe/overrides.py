"""Opt-in DataLoader overrides, applied by the automatic instrumentation (standard library only).

The contract (version 1) is one environment variable holding a JSON object::

    DAM_LOADER_OVERRIDES='{"version":1,"num_workers":4,"prefetch_factor":4,"persistent_workers":true}'

Settings (all optional besides ``version``): ``num_workers`` (int 0..256),
``prefetch_factor`` (int 1..64), ``persistent_workers`` (bool), ``pin_memory``
(bool) and ``allow_lower`` (bool, default false: an override only ever raises a
setting above the user's value; with ``allow_lower`` the values are set as
given, which is how a rollback lowers them again). Anything else (bad JSON, a
missing or unknown version, an unknown setting, a wrong type, a value out of
range) makes the whole variable ignored, with one line on stderr.

When torch's DataLoader module is imported under the probe, ``patch_dataloader``
wraps ``DataLoader.__init__`` (only when the variable is set): every new loader
gets the overrides, unless its arguments cannot take them (``plan_loader``
gives the reasons), and one line per call site says what changed or why
nothing did. The module never imports torch; it looks at
``sys.modules["torch"]`` only to recognise tensors and accelerators.

torchdata's ``StatefulDataLoader`` (a DataLoader subclass with its own ``__init__``
that never calls DataLoader's) is patched the same way when its module is imported
(``patch_stateful_dataloader``), except that its ``num_workers`` is never changed: the
count is part of its ``state_dict()``, and a mid-epoch checkpoint does not load into a
loader with another count (torchdata asserts it), so a job resumed after the change
would fail. Its other settings are applied as for a DataLoader.

``parse_overrides``, ``loader_override_env`` and ``plan_loader`` are pure, so
``dam tune`` and the operator build and check the same variable.
"""

from __future__ import annotations

import inspect
import json
import operator
import os
import pickle
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Final

from dam_probe._wrapper import dress

ENV_LOADER_OVERRIDES: Final = "DAM_LOADER_OVERRIDES"
OVERRIDES_VERSION: Final = 1
MAX_WORKERS: Final = 256
MAX_PREFETCH: Final = 64
MIN_SHM_BYTES: Final = 128 * 1024 * 1024  # below this /dev/shm is "tiny" (Docker's and k8s' 64 MiB default)
TORCH_PREFETCH_DEFAULT: Final = 2  # what torch uses when prefetch_factor is None and workers > 0
SPAWNING_METHODS: Final = frozenset({"spawn", "forkserver"})
MARK: Final = "_dam_probe_overrides"
TORCH_LOADER_MODULE: Final = "torch.utils.data.dataloader"
STATEFUL_MODULE: Final = "torchdata.stateful_dataloader.stateful_dataloader"
STATEFUL_CLASS: Final = "StatefulDataLoader"
STATEFUL_NUM_WORKERS: Final = (
    "num_workers not applied: a StatefulDataLoader keeps num_workers in its state_dict(), "
    "and a checkpoint taken with one count does not load into a loader with another"
)

# setting -> (type, minimum, maximum); bools have no range.
_INT_SETTINGS: Final = {"num_workers": (0, MAX_WORKERS), "prefetch_factor": (1, MAX_PREFETCH)}
_BOOL_SETTINGS: Final = ("persistent_workers", "pin_memory", "allow_lower")
SETTINGS: Final = (*_INT_SETTINGS, *_BOOL_SETTINGS)
_MAIN_GUARD = re.compile(r"""__name__\s*==\s*['"]__main__['"]|['"]__main__['"]\s*==\s*__name__""")


class OverrideError(ValueError):
    """The overrides variable (or the settings given to ``loader_override_env``) is invalid."""


@dataclass(frozen=True)
class LoaderOverrides:
    """Validated version-1 overrides; ``None`` = leave that setting as the user's code has it."""

    num_workers: int | None = None
    prefetch_factor: int | None = None
    persistent_workers: bool | None = None
    pin_memory: bool | None = None
    allow_lower: bool = False

    def settings(self) -> dict[str, int | bool]:
        """The settings that are given (no version): the input of ``loader_override_env``."""
        out: dict[str, int | bool] = {}
        for name in SETTINGS:
            value = getattr(self, name)
            if value is not None and not (name == "allow_lower" and value is False):
                out[name] = value
        return out


def _validated(settings: Mapping[str, object]) -> LoaderOverrides:
    values: dict[str, Any] = {}
    for name, value in settings.items():
        if name in _INT_SETTINGS:
            lo, hi = _INT_SETTINGS[name]
            if isinstance(value, bool) or not isinstance(value, int):
                raise OverrideError(f"{name} must be an integer, got {value!r}")
            if not lo <= value <= hi:
                raise OverrideError(f"{name} must be between {lo} and {hi}, got {value}")
        elif name in _BOOL_SETTINGS:
            if not isinstance(value, bool):
                raise OverrideError(f"{name} must be true or false, got {value!r}")
        else:
            raise OverrideError(
                f"unknown setting {name!r} (version {OVERRIDES_VERSION} knows {', '.join(SETTINGS)})"
            )
        values[name] = value
    return LoaderOverrides(**values)


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise OverrideError(f"setting {key!r} given twice")
        out[key] = value
    return out


def parse_overrides(text: str) -> LoaderOverrides:
    """Parses the variable's value; raises ``OverrideError`` naming the problem."""
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates)
    except OverrideError:
        raise
    except ValueError as exc:
        raise OverrideError(f"not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise OverrideError(f"expected a JSON object, got {type(data).__name__}")
    if "version" not in data:
        raise OverrideError(f'no "version" (this probe reads version {OVERRIDES_VERSION})')
    version = data.pop("version")
    if isinstance(version, bool) or version != OVERRIDES_VERSION:
        raise OverrideError(f"unsupported version {version!r} (this probe reads version {OVERRIDES_VERSION})")
    return _validated(data)


def overrides_from_env(environ: Mapping[str, str] | None = None) -> LoaderOverrides | None:
    """The overrides the environment asks for; None when the variable is unset or blank.

    Raises ``OverrideError`` for an invalid value.
    """
    env = os.environ if environ is None else environ
    text = env.get(ENV_LOADER_OVERRIDES, "")
    if not text.strip():
        return None
    return parse_overrides(text)


def loader_override_env(settings: Mapping[str, int | bool]) -> dict[str, str]:
    """The environment (one variable) that makes the probe apply ``settings``.

    ``settings`` uses the names of ``SETTINGS`` (no version: it is added).
    Raises ``OverrideError`` for an unknown name, a wrong type or a value out of
    range, exactly as the probe would reject it.
    """
    if "version" in settings:
        raise OverrideError("give the settings only; loader_override_env adds the version")
    parsed = _validated(settings)
    payload: dict[str, int | bool] = {"version": OVERRIDES_VERSION, **parsed.settings()}
    return {ENV_LOADER_OVERRIDES: json.dumps(payload, separators=(",", ":"))}


@dataclass(frozen=True)
class WorkerEnvironment:
    """What the process can offer worker processes (``worker_environment`` reads it)."""

    cpus: int | None = None  # CPUs this process may run on (affinity), None = unknown
    shm_required: bool = True  # Linux: worker batches travel through /dev/shm
    shm_bytes: int | None = None  # size of /dev/shm, None = absent
    default_start_method: str = "fork"
    daemon: bool = False  # a daemonic process (a DataLoader worker) cannot have children
    accelerator: bool = False  # pinned memory is usable (CUDA/XPU/…, not MPS)


def is_iterable_dataset(dataset: object, iterable_cls: type | None = None) -> bool:
    """True for an iterable-style dataset: torch's class, or ``__iter__`` without ``__getitem__``."""
    if iterable_cls is not None and isinstance(dataset, iterable_cls):
        return True
    cls = type(dataset)
    return hasattr(cls, "__iter__") and not hasattr(cls, "__getitem__")


def start_method(context: object, default: str) -> str:
    """The start method a loader's workers use: its ``multiprocessing_context`` or the default."""
    if context is None:
        return default
    if isinstance(context, str):
        return context
    get = getattr(context, "get_start_method", None)
    if callable(get):
        try:
            return str(get())
        except Exception:
            return "unknown"
    return "unknown"


def _seeded_or_sequential(sampler: object) -> bool:
    """A sampler whose order does not draw from torch's RNG (by its shape: no torch import)."""
    name = type(sampler).__name__
    if name == "SequentialSampler":
        return True
    if name == "BatchSampler" or (hasattr(sampler, "batch_size") and hasattr(sampler, "sampler")):
        return _seeded_or_sequential(getattr(sampler, "sampler", None))
    # DistributedSampler: seeded from its own seed + epoch, not from the global RNG.
    return isinstance(getattr(sampler, "seed", None), int) and callable(getattr(sampler, "set_epoch", None))


def order_uses_rng(args: Mapping[str, object]) -> bool:
    """True when the loader's order may draw from torch's RNG: ``shuffle`` or an unknown sampler."""
    if args.get("shuffle"):
        return True
    for name in ("batch_sampler", "sampler"):
        sampler = args.get(name)
        if sampler is not None and not _seeded_or_sequential(sampler):
            return True
    return False


@dataclass(frozen=True)
class Plan:
    """What the overrides do to one loader: argument changes, notes, or a refusal."""

    changes: tuple[tuple[str, object, object], ...] = ()  # (argument, before, after)
    notes: tuple[str, ...] = ()  # settings not applied, and why
    refused: str | None = None  # the loader is left alone, because of this

    def updates(self) -> dict[str, object]:
        return {} if self.refused else {name: after for name, _, after in self.changes}

    def message(self) -> str:
        """The text logged after ``DataLoader at FILE:LINE: ``."""
        if self.refused:
            return f"overrides not applied: {self.refused}"
        changed = ", ".join(f"{n} {before!r} → {after!r}" for n, before, after in self.changes)
        notes = "; ".join(self.notes)
        if not changed:
            return f"overrides change nothing: {notes or 'the settings are already as asked'}"
        return f"{changed}; {notes}" if notes else changed


SpawnCheck = Callable[[str, Mapping[str, object]], str | None]


def _as_int(value: object) -> int:
    return operator.index(value)  # type: ignore[arg-type]


class _RefusedError(Exception):
    """A loader the overrides leave alone; ``args[0]`` says why (``Plan.refused``)."""


_NEEDS_WORKERS: Final = (
    ("prefetch_factor", None),
    ("persistent_workers", False),
    ("multiprocessing_context", None),
    ("timeout", 0),
)
_SPAWNED_ARGUMENTS: Final = ("dataset", "sampler", "batch_sampler", "collate_fn", "worker_init_fn")


def _user_workers(args: Mapping[str, object]) -> tuple[int, int | None]:
    """The loader's own ``num_workers`` and ``prefetch_factor``; refuses a loader torch would reject."""
    try:
        user_w = _as_int(args.get("num_workers", 0))
        user_pf = None if args.get("prefetch_factor") is None else _as_int(args.get("prefetch_factor"))
    except TypeError:
        raise _RefusedError("num_workers or prefetch_factor is not an integer") from None
    if user_w < 0 or (user_pf is not None and user_pf < 0):
        raise _RefusedError("the loader's own num_workers or prefetch_factor is negative")
    needs_workers = [name for name, unset in _NEEDS_WORKERS if args.get(name, unset) != unset]
    if user_w == 0 and needs_workers:
        # torch raises for these without workers: adding workers would hide the code's own error.
        raise _RefusedError(
            f"the loader sets {', '.join(needs_workers)} with num_workers=0, which torch rejects"
        )
    return user_w, user_pf


def _planned_workers(
    args: Mapping[str, object],
    o: LoaderOverrides,
    env: WorkerEnvironment,
    user_w: int,
    notes: list[str],
    *,
    num_workers_in_state: bool,
) -> int:
    """num_workers: raised (capped at the CPUs), kept, or lowered only with allow_lower."""
    if o.num_workers is None:
        return user_w
    if o.num_workers != user_w and num_workers_in_state:
        notes.append(STATEFUL_NUM_WORKERS)
        return user_w
    if "num_workers" not in args:
        notes.append("num_workers not applied: not an argument of this DataLoader")
        return user_w
    target = o.num_workers
    if target > user_w:
        if env.cpus is not None and env.cpus <= 1:
            raise _RefusedError("only 1 CPU available to this process: worker processes cannot help")
        if env.cpus is not None and target > env.cpus:
            notes.append(f"num_workers capped at {env.cpus} CPUs (override {target})")
            target = max(env.cpus, user_w)
        return target
    if target < user_w:
        if o.allow_lower:
            return target
        notes.append(f"num_workers stays {user_w} (override {target} is lower; allow_lower not set)")
    return user_w


def _check_first_workers(
    args: Mapping[str, object], env: WorkerEnvironment, iterable_cls: type | None, check: SpawnCheck
) -> None:
    """Refuses to start workers where the user's code had none, when they would change its results."""
    if env.daemon:
        raise _RefusedError("a daemonic process (a DataLoader worker) cannot start worker processes")
    if is_iterable_dataset(args.get("dataset"), iterable_cls):
        raise _RefusedError(
            "IterableDataset with num_workers=0: each worker would replay the whole "
            "stream unless the dataset shards by get_worker_info(), which cannot be checked"
        )
    if args.get("in_order", True) is False:
        raise _RefusedError("in_order=False: workers would deliver samples out of order")
    method = start_method(args.get("multiprocessing_context"), env.default_start_method)
    if method in SPAWNING_METHODS:
        problem = check(method, {n: args.get(n) for n in _SPAWNED_ARGUMENTS if args.get(n) is not None})
        if problem:
            raise _RefusedError(problem)
    elif method != "fork":
        raise _RefusedError(f"unknown multiprocessing start method {method!r}")


def _check_worker_change(
    args: Mapping[str, object],
    env: WorkerEnvironment,
    user_w: int,
    w: int,
    *,
    iterable_cls: type | None,
    check: SpawnCheck,
) -> None:
    """Refuses a change of num_workers (from or to 0) that the loader's other arguments forbid."""
    if user_w == 0 and w > 0:
        _check_first_workers(args, env, iterable_cls, check)
    forbids_none = args.get("multiprocessing_context") is not None or args.get("timeout", 0) != 0
    if user_w > 0 and w == 0 and forbids_none:
        raise _RefusedError(
            "cannot lower num_workers to 0: the loader sets multiprocessing_context or timeout"
        )


def _planned_prefetch(
    args: Mapping[str, object], o: LoaderOverrides, w: int, user_pf: int | None, notes: list[str]
) -> int | None:
    """prefetch_factor (batches in flight per worker); only valid with workers."""
    if w == 0:
        if o.prefetch_factor is not None:
            notes.append("prefetch_factor not applied: needs num_workers > 0")
        return None  # a rollback to 0 workers: torch accepts no prefetch_factor then
    if o.prefetch_factor is None or "prefetch_factor" not in args:
        return user_pf
    effective = TORCH_PREFETCH_DEFAULT if user_pf is None else user_pf
    if o.prefetch_factor > effective or (o.allow_lower and o.prefetch_factor != effective):
        return o.prefetch_factor
    if o.prefetch_factor < effective:
        notes.append(
            f"prefetch_factor stays {effective} (override {o.prefetch_factor} is lower; allow_lower not set)"
        )
    return user_pf


def _in_flight(workers: int, prefetch: int | None) -> int:
    return workers * (TORCH_PREFETCH_DEFAULT if prefetch is None else prefetch)


def _check_shm(env: WorkerEnvironment, before: int, after: int) -> None:
    """Refuses more batches in flight (``before`` -> ``after``) than /dev/shm can hold."""
    if after <= before or not env.shm_required:
        return
    if env.shm_bytes is None:
        raise _RefusedError("no /dev/shm: worker processes cannot hand batches over")
    if env.shm_bytes < MIN_SHM_BYTES:
        raise _RefusedError(
            f"/dev/shm is only {env.shm_bytes // (1024 * 1024)} MiB: more batches in flight "
            "could exhaust it (mount a larger one, e.g. an emptyDir with medium: Memory)"
        )


def _persistent_note(args: Mapping[str, object], wanted: bool, allow_lower: bool, w: int) -> str | None:
    """Why persistent_workers cannot become ``wanted``, or None.

    torch draws the workers' base seed from the RNG once per iterator, so with persistent
    workers the RNG gives one number fewer per epoch: a shuffle that draws from it changes
    from epoch 2 on.
    """
    if wanted and w == 0:
        return "persistent_workers not applied: needs num_workers > 0"
    if not wanted and not allow_lower:
        return "persistent_workers stays true (allow_lower not set)"
    if order_uses_rng(args):
        return (
            "persistent_workers not applied: the loader shuffles, and persistent workers "
            "would change the order of later epochs (torch draws one seed fewer per epoch)"
        )
    if wanted and callable(getattr(args.get("dataset"), "set_epoch", None)):
        return (
            "persistent_workers not applied: the dataset has set_epoch(), "
            "which persistent workers would not see"
        )
    return None


def _planned_persistent(args: Mapping[str, object], o: LoaderOverrides, w: int, notes: list[str]) -> bool:
    """persistent_workers: keep the workers across epochs; only valid with workers (else false)."""
    pw = bool(args.get("persistent_workers", False))
    wanted = o.persistent_workers
    if wanted is not None and wanted != pw and "persistent_workers" in args:
        note = _persistent_note(args, wanted, o.allow_lower, w)
        if note:
            notes.append(note)
        else:
            pw = wanted
    return pw if w > 0 else False


def _planned_pin_memory(
    args: Mapping[str, object], o: LoaderOverrides, env: WorkerEnvironment, notes: list[str]
) -> bool:
    """pin_memory: page-locked host buffers for faster copies to the accelerator."""
    user_pm = bool(args.get("pin_memory", False))
    if o.pin_memory is None or o.pin_memory == user_pm or "pin_memory" not in args:
        return user_pm
    if o.pin_memory and not env.accelerator:
        notes.append("pin_memory not applied: no accelerator to pin memory for")
    elif o.pin_memory or o.allow_lower:
        return o.pin_memory
    else:
        notes.append("pin_memory stays true (allow_lower not set)")
    return user_pm


def plan_loader(
    args: Mapping[str, object],
    overrides: LoaderOverrides,
    env: WorkerEnvironment,
    *,
    iterable_cls: type | None = None,
    spawn_check: SpawnCheck | None = None,
    num_workers_in_state: bool = False,
) -> Plan:
    """Decides what ``overrides`` change in a DataLoader built with ``args`` (defaults applied).

    Pure apart from ``spawn_check(method, objects)`` (default ``spawn_problem``), which is
    called only when workers are started where the user's code had none, with a spawning
    start method. A setting absent from ``args`` (an older torch) is not applied.
    ``num_workers_in_state`` (a StatefulDataLoader): the loader's checkpoints record its
    worker count, so ``num_workers`` is left as it is, with a note.

    The settings are decided in order (each may depend on the ones before it): num_workers,
    prefetch_factor, persistent_workers, pin_memory; a check that fails refuses the whole plan.
    """
    check = spawn_problem if spawn_check is None else spawn_check
    notes: list[str] = []
    try:
        user_w, user_pf = _user_workers(args)
        w = _planned_workers(args, overrides, env, user_w, notes, num_workers_in_state=num_workers_in_state)
        _check_worker_change(args, env, user_w, w, iterable_cls=iterable_cls, check=check)
        pf = _planned_prefetch(args, overrides, w, user_pf, notes)
        _check_shm(env, _in_flight(user_w, user_pf), _in_flight(w, pf))
    except _RefusedError as refusal:
        return Plan(refused=str(refusal))
    user_pw = bool(args.get("persistent_workers", False))
    user_pm = bool(args.get("pin_memory", False))
    pw = _planned_persistent(args, overrides, w, notes)
    pm = _planned_pin_memory(args, overrides, env, notes)
    changes = tuple(
        (name, before, after)
        for name, before, after in (
            ("num_workers", user_w, w),
            ("prefetch_factor", user_pf, pf),
            ("persistent_workers", user_pw, pw),
            ("pin_memory", user_pm, pm),
        )
        if after != before
    )
    return Plan(changes=changes, notes=tuple(notes))


# --- the spawn check: what spawn/forkserver workers need from the user's objects -------------


class _Sink:
    """A file that discards what is written: pickling is checked, not stored."""

    def write(self, data: bytes) -> int:
        return len(data)


def _tensor_types() -> tuple[type, ...]:
    kinds: list[type] = []
    torch = sys.modules.get("torch")
    for name in ("Tensor", "UntypedStorage", "TypedStorage"):
        cls = getattr(torch, name, None)
        if isinstance(cls, type):
            kinds.append(cls)
    ndarray = getattr(sys.modules.get("numpy"), "ndarray", None)
    if isinstance(ndarray, type):
        kinds.append(ndarray)
    return tuple(kinds)


class _CheckingPickler(pickle.Pickler):
    """Pickles into nothing; skips tensors and arrays (always picklable) and notes ``__main__`` objects."""

    def __init__(self, skip: tuple[type, ...]) -> None:
        super().__init__(_Sink(), protocol=pickle.HIGHEST_PROTOCOL)
        self.skip = skip
        self.uses_main = False

    def persistent_id(self, obj: Any) -> Any:
        if self.skip and isinstance(obj, self.skip):
            return 0
        module = getattr(obj, "__module__", None) if isinstance(obj, type) or callable(obj) else None
        if module == "__main__" or type(obj).__module__ == "__main__":
            self.uses_main = True
        return None


def main_module_problem(method: str, uses_main: bool) -> str | None:
    """Why spawned workers could not re-create ``__main__``'s objects, or None.

    Spawned workers re-run the main file (as ``__mp_main__``): without an
    ``if __name__ == "__main__":`` guard each one would run the training again.
    Without a main file (``python -c``, a notebook) they cannot import the
    classes and functions defined there.
    """
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not isinstance(path, str):
        if uses_main:
            return f"objects defined in __main__, which {method} workers cannot import (no main file)"
        return None
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            source = fh.read()
    except OSError as exc:
        return f"cannot read the main module to check its __main__ guard: {exc}"
    if not _MAIN_GUARD.search(source):
        return (
            f'{os.path.basename(path)} has no `if __name__ == "__main__":` guard, '
            f"and {method} workers re-run the main module"
        )
    return None


def spawn_problem(method: str, objects: Mapping[str, object]) -> str | None:
    """Why ``objects`` (the loader's arguments) cannot go to ``method`` workers, or None.

    Each object must pickle (a lambda, a local function or an open file does
    not); tensors and arrays are skipped, since they always do.
    """
    skip = _tensor_types()
    uses_main = False
    for name, obj in objects.items():
        pickler = _CheckingPickler(skip)
        try:
            pickler.dump(obj)
        except Exception as exc:
            detail = " ".join(str(exc).split())[:160]
            return f"{name} is not picklable, which {method} workers need: {type(exc).__name__}: {detail}"
        uses_main = uses_main or pickler.uses_main
    return main_module_problem(method, uses_main)


# --- the environment and the patch ---------------------------------------------------------


def _accelerator_pinnable() -> bool:
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        acc = getattr(torch, "accelerator", None)
        if acc is not None and callable(getattr(acc, "is_available", None)):
            if not acc.is_available():
                return False
            device = acc.current_accelerator()
            return getattr(device, "type", "") != "mps"
        cuda = getattr(torch, "cuda", None)
        return bool(cuda is not None and cuda.is_available())
    except Exception:
        return False


def worker_environment(*, need_accelerator: bool = False) -> WorkerEnvironment:
    """Reads the CPUs, /dev/shm, the default start method and (on request) the accelerator."""
    import multiprocessing

    try:
        cpus: int | None = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count()
    shm_required = sys.platform.startswith("linux")
    shm_bytes: int | None = None
    if shm_required:
        try:
            st = os.statvfs("/dev/shm")
            shm_bytes = st.f_frsize * st.f_blocks
        except OSError:
            shm_bytes = None
    # allow_none: asking without it would fix the start method for the rest of the process.
    method = multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]
    return WorkerEnvironment(
        cpus=cpus,
        shm_required=shm_required,
        shm_bytes=shm_bytes,
        default_start_method=method,
        daemon=bool(multiprocessing.current_process().daemon),
        accelerator=_accelerator_pinnable() if need_accelerator else False,
    )


_said: set[str] = set()


def _say(line: str) -> None:
    """One line on stderr, once per distinct text; never raises."""
    if line in _said:
        return
    _said.add(line)
    try:
        sys.stderr.write(f"dam-probe: {' '.join(line.split())}\n")
        sys.stderr.flush()
    except Exception:
        pass


def _call_site(loader: object, skip_dirs: tuple[str, ...]) -> str:
    """``file:line`` of the user's code that builds ``loader`` (past subclass ``__init__``s)."""
    frame = sys._getframe(1)
    here = os.path.abspath(__file__)
    while frame is not None:
        filename = frame.f_code.co_filename
        path = os.path.abspath(filename)
        inside = path == here or any(path.startswith(d) for d in skip_dirs)
        if not inside and not (frame.f_code.co_name == "__init__" and frame.f_locals.get("self") is loader):
            try:
                rel = os.path.relpath(path)
                shown = filename if rel.startswith("..") else rel
            except ValueError:
                shown = filename
            return f"{shown}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return "<unknown>"


def _torch_dir(module: ModuleType) -> tuple[str, ...]:
    path = getattr(module, "__file__", None)
    if not isinstance(path, str):
        return ()
    # .../torch/utils/data/dataloader.py -> .../torch/
    top = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(path)))))
    return (top + os.sep,)


def _overriding_init(
    orig: Callable[..., None],
    module: ModuleType,
    overrides: LoaderOverrides,
    *,
    kind: str = "DataLoader",
    num_workers_in_state: bool = False,
    torch_module: ModuleType | None = None,
) -> Any:
    sig = inspect.signature(orig)
    # torch's DataLoader module (``module`` itself unless told): the call site is looked for
    # past torch's directories, and IterableDataset is torch's.
    torch_module = module if torch_module is None else torch_module
    skip_dirs = _torch_dir(torch_module)
    iterable_cls = getattr(torch_module, "IterableDataset", None)
    if not isinstance(iterable_cls, type):
        iterable_cls = None

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807 (it becomes DataLoader.__init__)
        try:
            full = sig.bind(self, *args, **kwargs)
        except TypeError:
            full = None  # arguments that do not fit: torch raises the user's own error below
        if full is not None:
            try:
                full.apply_defaults()
                env = worker_environment(need_accelerator=bool(overrides.pin_memory))
                plan = plan_loader(
                    full.arguments,
                    overrides,
                    env,
                    iterable_cls=iterable_cls,
                    num_workers_in_state=num_workers_in_state,
                )
                site = _call_site(self, skip_dirs)
            except Exception as exc:
                _say(f"DataLoader overrides not applied: {type(exc).__name__}: {exc}")
                plan, site = Plan(), ""
            updates = plan.updates()
            if updates:
                bound = sig.bind(self, *args, **kwargs)
                bound.arguments.update(updates)
                try:
                    orig(*bound.args, **bound.kwargs)
                except Exception as exc:
                    # Never break a loader that works without the overrides: build it as written.
                    why = f"{type(exc).__name__}: {exc}"
                    _say(f"{kind} at {site}: overrides not applied: torch refused them: {why}")
                else:
                    _say(f"{kind} at {site}: {plan.message()}")
                    return
            elif site:
                _say(f"{kind} at {site}: {plan.message()}")
        orig(self, *args, **kwargs)

    dress(__init__, orig, MARK, overrides)
    return __init__


def patch_dataloader(
    module: ModuleType,
    environ: Mapping[str, str] | None = None,
    *,
    class_name: str = "DataLoader",
    num_workers_in_state: bool = False,
    torch_module: ModuleType | None = None,
) -> bool:
    """Applies the overrides of ``environ`` to every ``module.<class_name>`` built from now on.

    Does nothing (False) when the variable is unset, blank or invalid (one line on
    stderr says why it is ignored), or in a daemonic process (a DataLoader
    worker). Idempotent; never raises.
    """
    try:
        import multiprocessing

        if multiprocessing.current_process().daemon:
            return False
        try:
            overrides = overrides_from_env(environ)
        except OverrideError as exc:
            _say(f"ignoring {ENV_LOADER_OVERRIDES}: {exc}")
            return False
        if overrides is None:
            return False
        cls = getattr(module, class_name, None)
        orig = None if cls is None else cls.__dict__.get("__init__")
        if orig is None:
            _say(f"ignoring {ENV_LOADER_OVERRIDES}: {module.__name__}.{class_name}.__init__ not found")
            return False
        if getattr(orig, MARK, None) is not None:
            return True
        new_init = _overriding_init(
            orig,
            module,
            overrides,
            kind=class_name,
            num_workers_in_state=num_workers_in_state,
            torch_module=torch_module,
        )
        setattr(cls, "__init__", new_init)  # noqa: B010
        return True
    except Exception as exc:
        _say(f"ignoring {ENV_LOADER_OVERRIDES}: {type(exc).__name__}: {exc}")
        return False


def patch_stateful_dataloader(module: ModuleType, environ: Mapping[str, str] | None = None) -> bool:
    """``patch_dataloader`` for torchdata's ``StatefulDataLoader`` (``module`` = ``STATEFUL_MODULE``).

    Its ``__init__`` is its own (it never calls DataLoader's), so DataLoader's patch does
    not reach it; its ``num_workers`` stays as the code has it (``STATEFUL_NUM_WORKERS``).
    """
    return patch_dataloader(
        module,
        environ,
        class_name=STATEFUL_CLASS,
        num_workers_in_state=True,
        # torchdata imports torch's DataLoader module before it defines its class.
        torch_module=sys.modules.get(TORCH_LOADER_MODULE, module),
    )
