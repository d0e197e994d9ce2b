"""Communication timing: ``torch.distributed`` collectives and DDP gradient buckets, without importing torch.

``dam_probe._autohook`` calls ``patch_c10d`` right after
``torch.distributed.distributed_c10d`` has been imported and ``patch_ddp`` right
after ``torch.nn.parallel.distributed``; both work on the module objects torch
hands over (duck typing; what else they need they take from ``sys.modules`` or
``importlib.import_module`` at that moment), so this module imports nothing
from torch and costs nothing in a process that never uses torch.distributed.

What is counted (``Probe.comm``, a ``CommCounters``: cumulative, published in the probe file):

- **collectives**: one per explicit collective call that returns, and one per
  DDP gradient bucket;
- **collective time**: launch to completion, including the wait for peers, as
  wall time during which at least one collective was in flight (collectives
  that overlap, like the buckets of one backward pass, count once, so it never
  exceeds the elapsed time). A synchronous call (``async_op=False``) is in
  flight during the call; an asynchronous one from the call until it is seen
  complete: when ``Work.wait()`` returns (or at the ``wait()`` call if it was
  already complete), else when a later timed collective or the next publish
  finds ``is_completed()`` (no callback runs on the communication thread, so a
  fully hidden collective that nobody waits on reads as in flight until then);
  a DDP step, from DDP's statistics, from its first bucket's launch to its last
  bucket's completion (with the hook: each bucket from its hand-over to the hook
  to its future's completion, the ``then`` callback Python hooks need anyway);
- **exposed communication**: time the training thread waited for
  communication that overlap did not hide. With DDP, from the end of the
  backward pass (with the hook: the hand-over of its last bucket,
  ``GradBucket.is_last()``) to the completion of the last bucket of that step;
  a synchronous collective counts whole; an asynchronous one counts the time
  spent in ``Work.wait()``. One cause per second of wall time (``exposed_here``): a wait
  counts only in the training thread (the thread that took the first batch), after its first
  batch (before it, the time is startup) and outside checkpoint saves (collectives inside
  ``dcp.save`` are the save's); a background thread's collectives (``async_save``'s writer)
  overlap the training and are no badput;
- **bytes**: the size of the tensors this process contributes (the reduced or
  broadcast tensor, the input of a gather, scatter or all-to-all; 0 for a
  barrier; a DDP bucket's flat buffer).

DDP: ``DistributedDataParallel.__init__`` is wrapped. By default (and unless
``DAM_PROBE_DDP_TIMING=hook``) the probe registers no comm hook: DDP keeps its
C++ all-reduce, and the probe reads the runtime statistics DDP's reducer
measures itself (``logger._get_ddp_logging_data().ints_map``), with the sample
rate set to 1 so that every iteration is recorded. DDP computes a step's
figures in the next synchronising forward (``_pre_forward``); a wrapper of
``_pre_forward`` reads them right after, once per synchronising forward, and
``count_step`` adds them once: collective time += ``backward_comm_time``
(first bucket launched to every bucket done: a span), exposed += that minus
``backward_compute_comm_overlap_time``, collectives += ``num_buckets_reduced``,
bytes += the gradients' size. A user's comm hook is timed by DDP like the
default; the collectives it issues are not counted again.

With ``DAM_PROBE_DDP_TIMING=hook``, or when the statistics are missing (an
older torch, DDP's Python reducer), a communication hook that does what
``ddp_comm_hooks.default_hooks.allreduce_hook`` does (divide the bucket by the
group size, all-reduce it asynchronously, hand back the first tensor) and times
it is registered on the reducer, unless DDP registered a hook itself. A reducer
accepts one hook only, so ``register_comm_hook`` and
``_register_builtin_comm_hook`` are wrapped too: the user's hook (or the Python
twin of a built-in one) replaces the default inside our hook, checked exactly
as DDP checks it, and is timed the same way; registering twice still raises
DDP's own error. Collectives issued from inside a user's hook are not counted
again (the bucket already is).

DDP's completion callbacks (hook mode) run on the communication library's threads and need
the GIL: when the training thread is busy in Python at that moment the
completion stamp is late by up to ``sys.getswitchinterval()`` (5 ms). During
the backward pass (where DDP buckets complete) the training thread is in C++
and holds no GIL. Explicit collectives use no callback at all.

Failures never reach the training loop: a patch that cannot be applied leaves
torch as it was and prints one ``dam-probe: collectives not timed: …`` line.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import os
import sys
import threading
from collections.abc import Callable, Mapping
from time import perf_counter_ns
from types import ModuleType
from typing import Any, Final

from dam_probe._core import PROBE, Probe
from dam_probe._wrapper import dress

ENV_COLLECTIVES: Final = "DAM_PROBE_COLLECTIVES"
C10D: Final = "torch.distributed.distributed_c10d"
DDP: Final = "torch.nn.parallel.distributed"
DEFAULT_HOOKS: Final = "torch.distributed.algorithms.ddp_comm_hooks.default_hooks"
MARK: Final = "_dam_probe_timed"
DDP_SLOT: Final = "_dam_probe_comm"
STATS_SLOT: Final = "_dam_probe_stats"
ENV_DDP_TIMING: Final = "DAM_PROBE_DDP_TIMING"

# Collectives of torch.distributed, with the parameter whose tensor(s) count as the bytes contributed.
COLLECTIVES: Final[dict[str, str | None]] = {
    "all_reduce": "tensor",
    "broadcast": "tensor",
    "reduce": "tensor",
    "all_reduce_coalesced": "tensors",
    "all_gather": "tensor",
    "all_gather_single": "input_tensor",
    "all_gather_into_tensor": "input_tensor",
    "all_gather_coalesced": "input_tensor_list",
    "_all_gather_base": "input_tensor",
    "reduce_scatter": "input_list",
    "reduce_scatter_single": "input",
    "reduce_scatter_tensor": "input",
    "_reduce_scatter_base": "input",
    "all_to_all": "input_tensor_list",
    "all_to_all_single": "input",
    "gather": "tensor",
    "scatter": "tensor",
    "barrier": None,
    "monitored_barrier": None,
}

_reported: list[str] = []
_OFF = frozenset({"0", "false", "no", "off"})


def off_by_env(environ: Mapping[str, str] | None = None) -> bool:
    """True when ``DAM_PROBE_COLLECTIVES`` turns the collective instrumentation off (0/false/no/off)."""
    env = os.environ if environ is None else environ
    return env.get(ENV_COLLECTIVES, "").strip().lower() in _OFF


def report(reason: str) -> None:
    """One stderr line the first time collectives cannot be timed; never raises."""
    if _reported:
        return
    _reported.append(reason)
    with contextlib.suppress(Exception):
        line = " ".join(str(reason).split()) or "unknown error"
        sys.stderr.write(f"dam-probe: collectives not timed: {line}\n")
        sys.stderr.flush()


_noted: list[str] = []


def note(line: str) -> None:
    """One stderr line, the first time only (which DDP timing a process uses); never raises."""
    if _noted:
        return
    _noted.append(line)
    with contextlib.suppress(Exception):
        sys.stderr.write(f"dam-probe: {line}\n")
        sys.stderr.flush()


def ddp_timing_by_env(environ: Mapping[str, str] | None = None) -> str:
    """How DDP models are timed: ``"stats"`` (DDP's runtime statistics, the default) or ``"hook"``.

    ``DAM_PROBE_DDP_TIMING=hook`` registers the probe's timing communication hook instead.
    """
    env = os.environ if environ is None else environ
    return "hook" if env.get(ENV_DDP_TIMING, "").strip().lower() == "hook" else "stats"


class _Local(threading.local):
    """Per thread: > 0 while inside a timed call, so nested collectives are not counted twice."""

    depth = 0


LOCAL: Final = _Local()
# Asynchronous works launched through a timed collective and not yet seen complete, by id():
# (work, bytes, probe). Work.wait() on one of them ends its flight and counts as exposed
# communication. The entry keeps the work alive (so its id is not reused meanwhile).
PENDING: Final[dict[int, tuple[Any, int, Probe]]] = {}
MAX_PENDING: Final = 256


def nbytes_of(value: object) -> int:
    """Bytes of a tensor-like (``.nbytes``) or of a list/tuple of them; 0 when unknown."""
    try:
        n = getattr(value, "nbytes", None)
        if n is not None:
            return int(n)
        if isinstance(value, (list, tuple)):
            return sum(nbytes_of(v) for v in value)
    except Exception:  # e.g. a sparse tensor has no nbytes
        pass
    return 0


def begin(p: Probe, t0: int) -> None:
    """A collective goes in flight at ``t0`` (call with ``p.comm.lock`` held)."""
    c = p.comm
    if c.inflight == 0:
        c.busy_since = t0 if t0 > c.busy_until else c.busy_until
    c.inflight += 1


def end(p: Probe, t1: int) -> None:
    """A collective begun with ``begin`` completes at ``t1`` (call with ``p.comm.lock`` held).

    Collective time grows by the busy periods (at least one collective in
    flight), so overlapping collectives count once.
    """
    c = p.comm
    c.inflight -= 1
    if c.inflight <= 0:
        c.inflight = 0
        start = c.busy_since if c.busy_since > c.busy_until else c.busy_until
        if t1 > start:
            c.ns += t1 - start
            c.busy_until = t1


def exposed_here(p: Probe) -> bool:
    """Whether the calling thread's wait for a collective now is communication badput: the
    training thread, after its first batch, outside a checkpoint save (see the module docstring)."""
    acc = p.goodput
    return bool(acc.train_thread) and not acc.ckpt_depth and threading.get_ident() == acc.train_thread


def _finish(key: int, t_done: int, exposed_ns: int = 0) -> None:
    """Ends the flight of the pending asynchronous collective ``key`` at ``t_done``."""
    entry = PENDING.pop(key, None)
    if entry is None:
        return
    _, nbytes, p = entry
    c = p.comm
    with c.lock:
        end(p, t_done)
        c.count += 1
        c.nbytes += nbytes
        c.exposed_ns += exposed_ns


def sweep(now_ns: int) -> None:
    """Ends, as of ``now_ns``, the flight of every pending asynchronous collective that is complete.

    Runs when a timed collective starts and when the probe publishes, so a work
    nobody waits on (``get_future().wait()``, fire and forget) is not in flight forever.
    """
    for key, (work, _, _) in list(PENDING.items()):
        try:
            done = bool(work.is_completed())
        except Exception:
            done = True
        if done:
            _finish(key, now_ns)


def _track_async(work: Any, t0: int, nbytes: int, p: Probe) -> None:
    """An asynchronous collective is in flight from ``t0`` until it is seen complete.

    No callback on the communication thread (it would need the GIL there): the
    flight ends when ``Work.wait()`` returns, or when ``sweep`` finds it complete.
    """
    with p.comm.lock:
        begin(p, t0)
    PENDING[id(work)] = (work, nbytes, p)
    if len(PENDING) > MAX_PENDING:
        sweep(t0)
        while len(PENDING) > MAX_PENDING:  # launched and never waited on: ended now, roughly
            _finish(next(iter(PENDING)), t0)


def timed_collective(orig: Callable[..., Any], position: int, keyword: str | None, p: Probe = PROBE) -> Any:
    """A collective that counts itself into ``p`` (see the module docstring)."""
    clock = perf_counter_ns
    local = LOCAL
    c = p.comm  # never replaced: a forked child resets it in place (its lock too)

    def collective(*args: Any, **kwargs: Any) -> Any:
        if local.depth:
            return orig(*args, **kwargs)
        local.depth = 1
        c.entered += 1
        seq = c.entered  # noqa: F841  (read from this frame by the watchdog: the collective's number)
        t0 = clock()
        if PENDING:
            sweep(t0)
        try:
            work = orig(*args, **kwargs)
        finally:
            local.depth = 0
        t1 = clock()
        if keyword is None:
            nbytes = 0
        elif keyword in kwargs:
            nbytes = nbytes_of(kwargs[keyword])
        else:
            nbytes = nbytes_of(args[position]) if position < len(args) else 0
        if work is None:  # synchronous: the caller waited for all of it (one lock, no helper call)
            exposed = t1 - t0 if exposed_here(p) else 0
            with c.lock:
                c.count += 1
                c.nbytes += nbytes
                c.exposed_ns += exposed
                start = t0 if t0 > c.busy_until else c.busy_until
                if c.inflight:  # inside a busy period: it is counted when that ends
                    c.busy_since = min(c.busy_since, start)
                elif t1 > start:
                    c.ns += t1 - start
                    c.busy_until = t1
        else:
            _track_async(work, t0, nbytes, p)
        if t1 >= c.next_ns:
            p.publish_comm(t1)
        return work

    dress(collective, orig, MARK)
    collective.__module__ = getattr(orig, "__module__", __name__)
    with contextlib.suppress(Exception):
        collective.__signature__ = inspect.signature(orig)  # type: ignore[attr-defined]
    return collective


def timed_wait(orig: Callable[..., Any], p: Probe = PROBE) -> Any:
    """``Work.wait`` that ends a timed asynchronous collective's flight and counts the wait as exposed.

    The flight ends when the wait returns, or at the call if the work was
    already complete (``is_completed()``); the time spent in ``wait`` is exposed.
    """
    clock = perf_counter_ns
    local = LOCAL

    def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        key = id(self)
        entry = PENDING.get(key)
        if local.depth or entry is None or entry[0] is not self:
            return orig(self, *args, **kwargs)
        t0 = clock()
        try:
            done_before = bool(self.is_completed())
        except Exception:
            done_before = False
        try:
            return orig(self, *args, **kwargs)
        finally:
            t1 = clock()
            _finish(key, t0 if done_before else t1, t1 - t0 if exposed_here(p) else 0)

    dress(wait, orig, MARK)
    return wait


def _parameter_position(fn: Callable[..., Any], name: str | None) -> int:
    if name is None:
        return 0
    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return 1 << 30
    return names.index(name) if name in names else 1 << 30


# The originals, for our own DDP hook (so that its all-reduce is not counted twice).
ORIGINALS: Final[dict[str, Callable[..., Any]]] = {}


def patch_c10d(module: ModuleType, p: Probe = PROBE) -> bool:
    """Wraps the collectives of ``torch.distributed.distributed_c10d`` (and ``Work.wait``) once.

    The package ``torch.distributed`` re-exports these functions with ``from
    .distributed_c10d import *`` after this module has run; if it already has,
    its attributes that are still the originals are replaced as well.
    """
    package = sys.modules.get("torch.distributed")
    patched = 0
    for name, keyword in COLLECTIVES.items():
        orig = getattr(module, name, None)
        if orig is None or not callable(orig):
            continue
        if getattr(orig, MARK, False):
            patched += 1
            continue
        wrapper = timed_collective(orig, _parameter_position(orig, keyword), keyword, p)
        ORIGINALS[name] = orig
        setattr(module, name, wrapper)
        if package is not None and getattr(package, name, None) is orig:
            setattr(package, name, wrapper)
        patched += 1
    if not patched:
        raise RuntimeError(f"{module.__name__}: no collective found (unsupported torch version)")
    work = getattr(module, "Work", None)
    wait = getattr(work, "wait", None) if work is not None else None
    if wait is not None and not getattr(wait, MARK, False):
        with contextlib.suppress(Exception):  # a Work class that cannot be patched: sweeps end the flights
            work.wait = timed_wait(wait, p)  # type: ignore[union-attr]
    p.comm_sweep = sweep
    os.register_at_fork(after_in_child=PENDING.clear)  # a forked child never waits on the parent's works
    p.comm_on = True
    return True


# --- DDP ---------------------------------------------------------------------------------------


class DdpComm:
    """Our hook's state on one DDP model: the inner hook, and the step being timed."""

    __slots__ = ("group", "handover_ns", "model", "pending", "user_hook", "user_state")

    def __init__(self, group: Any) -> None:
        self.group = group
        self.user_hook: Callable[..., Any] | None = None  # None: the default all-reduce
        self.user_state: object = None
        self.pending = 0  # buckets launched and not complete
        self.handover_ns = 0  # when the backward pass handed over its last bucket (0: not yet)


def _launched(comm: DdpComm, t0: int, is_last: bool, p: Probe) -> None:
    with p.comm.lock:
        begin(p, t0)
        comm.pending += 1
        if is_last:
            comm.handover_ns = t0


def _completed(comm: DdpComm, t1: int, nbytes: int, p: Probe, count: int = 1) -> None:
    c = p.comm
    with c.lock:
        end(p, t1)
        c.count += count
        c.nbytes += nbytes
        comm.pending -= 1
        if comm.pending <= 0:
            comm.pending = 0
            if comm.handover_ns:
                c.exposed_ns += max(0, t1 - comm.handover_ns)
                comm.handover_ns = 0


def make_ddp_hook(p: Probe = PROBE) -> Callable[[DdpComm, Any], Any]:
    """The communication hook registered on every DDP reducer (see the module docstring)."""
    clock = perf_counter_ns
    local = LOCAL
    all_reduce = ORIGINALS.get("all_reduce") or _all_reduce()

    def dam_probe_allreduce_hook(state: DdpComm, bucket: Any) -> Any:
        t0 = clock()
        try:
            buffer = bucket.buffer()
            is_last = bool(bucket.is_last())
        except AttributeError:  # not a GradBucket (DDP's compiled path passes (grad, param))
            return _inner(state, bucket)
        nbytes = nbytes_of(buffer)
        _launched(state, t0, is_last, p)
        try:
            if state.user_hook is None:
                group = state.group
                buffer.div_(group.size())
                fut = all_reduce(buffer, group=group, async_op=True).get_future()

                def first_tensor(f: Any) -> Any:
                    _completed(state, clock(), nbytes, p)
                    return f.value()[0]

                result = fut.then(first_tensor)
            else:
                local.depth += 1
                try:
                    result = state.user_hook(state.user_state, bucket)
                finally:
                    local.depth -= 1
                add_done_callback = getattr(result, "add_done_callback", None)
                if add_done_callback is not None:
                    add_done_callback(lambda _f: _completed(state, clock(), nbytes, p))
                else:  # not a future: DDP will refuse it; do not leave the step pending
                    _completed(state, clock(), nbytes, p)
        except BaseException:
            _completed(state, clock(), 0, p, count=0)
            raise
        if t0 >= p.comm.next_ns:
            p.publish_comm(t0)
        return result

    setattr(dam_probe_allreduce_hook, MARK, True)
    return dam_probe_allreduce_hook


def _inner(state: DdpComm, bucket: Any) -> Any:
    """The hook DDP would have run without us, untimed (for calls that do not pass a GradBucket)."""
    if state.user_hook is not None:
        return state.user_hook(state.user_state, bucket)
    hooks: Any = importlib.import_module(DEFAULT_HOOKS)
    return hooks.allreduce_hook(state.group, bucket)


def _all_reduce() -> Callable[..., Any]:
    dist: Any = sys.modules["torch.distributed"]
    return dist.all_reduce  # type: ignore[no-any-return]


def _attach(model: Any, hook: Callable[[DdpComm, Any], Any]) -> bool:
    """Registers our hook on a freshly built DDP model whose reducer has none yet; True when it did."""
    if getattr(model, DDP_SLOT, None) is not None or getattr(model, "_comm_hooks", None):
        return False  # DDP registered a hook itself (mixed precision, optimizer in backward): left alone
    reducer = getattr(model, "reducer", None)
    group = getattr(model, "process_group", None)
    if reducer is None or group is None:
        return False
    dist: Any = sys.modules["torch.distributed"]
    comm = DdpComm(group)
    dist._register_comm_hook(reducer, comm, hook)
    object.__setattr__(model, DDP_SLOT, comm)
    return True


class DdpStats:
    """A DDP model timed from DDP's runtime statistics: its logger, and the last step counted."""

    __slots__ = ("last_key", "logger", "nbytes")

    def __init__(self, logger: Any, nbytes: int) -> None:
        self.logger = logger
        self.nbytes = nbytes  # the gradients all-reduced per synchronising step (every bucket)
        self.last_key: tuple[int, int, int, int] = (0, 0, 0, 0)  # the step counted last


def attach_stats(model: Any) -> str | None:
    """Times ``model`` from DDP's runtime statistics; returns why it cannot (None: attached).

    Sets the runtime logging sample rate to 1 (every iteration is recorded, not
    one in 100) and keeps the model's logger; ``count_step`` adds each step's
    figures when the next forward has computed them.
    """
    if getattr(model, "_use_python_reducer", False):
        return "DDP's Python reducer (compiled autograd) records no runtime statistics"
    logger = getattr(model, "logger", None)
    get = getattr(logger, "_get_ddp_logging_data", None)
    set_rate = getattr(model, "_set_ddp_runtime_logging_sample_rate", None)
    if get is None or set_rate is None:
        return "this torch's DDP has no runtime logging statistics"
    ints = getattr(get(), "ints_map", None)
    if not isinstance(ints, Mapping) or not all(key in ints for key in STATS_KEYS):
        return f"DDP's runtime statistics lack {', '.join(STATS_KEYS)}"
    set_rate(1)
    object.__setattr__(model, STATS_SLOT, DdpStats(logger, int(ints["total_parameter_size_bytes"])))
    return None


# What a step's figures need (present from construction on; the timings appear after the first step).
STATS_KEYS: Final = ("iteration", "total_parameter_size_bytes")


def count_step(state: DdpStats, ints: Mapping[str, int], p: Probe) -> bool:
    """Adds the synchronising step that DDP's runtime statistics describe, once; True when it counted.

    ``ints`` is ``DDPLoggingData.ints_map`` right after DDP's forward computed
    the previous step's figures (ns): collective time += ``backward_comm_time``
    (first bucket launched to every bucket done), exposed += that minus
    ``backward_compute_comm_overlap_time`` (first bucket launched to the end of
    the backward pass), collectives += ``num_buckets_reduced``, bytes += the
    gradients' size. A step is counted once: a later read of the same figures
    (a forward without a backward re-measures the old events) is recognised by
    its timestamps and skipped, as is a step that reduced no bucket.
    """
    comm = ints.get("backward_comm_time", 0)
    buckets = ints.get("num_buckets_reduced", 0)
    if comm <= 0 or buckets <= 0:
        return False
    overlap = ints.get("backward_compute_comm_overlap_time", 0)
    key = (ints.get("backward_comm_time_start", 0), ints.get("backward_comm_time_end", 0), comm, overlap)
    if key == state.last_key:
        return False
    state.last_key = key
    c = p.comm
    with c.lock:
        c.count += buckets
        c.ns += comm
        c.exposed_ns += comm - overlap if comm > overlap else 0
        c.nbytes += state.nbytes
    return True


def uncounted(hook: Callable[..., Any]) -> Callable[..., Any]:
    """A DDP comm hook whose collectives are not counted as explicit ones (DDP's statistics count the bucket).

    ``functools.wraps``: DDP checks the hook's name and signature (through
    ``__wrapped__``) and logs its qualified name, as for the hook itself.
    """
    local = LOCAL

    @functools.wraps(hook)
    def hook_uncounted(state: object, bucket: Any) -> Any:
        local.depth += 1
        try:
            return hook(state, bucket)
        finally:
            local.depth -= 1

    return hook_uncounted


def _builtin_twin(comm_hook_type: object) -> Callable[..., Any] | None:
    """The Python hook that does what a built-in DDP hook does, or None when there is none."""
    name = getattr(comm_hook_type, "name", str(comm_hook_type).rsplit(".", 1)[-1])
    hooks: Any = importlib.import_module(DEFAULT_HOOKS)
    twin = {"ALLREDUCE": "allreduce_hook", "FP16_COMPRESS": "fp16_compress_hook"}.get(name)
    return getattr(hooks, twin) if twin else None


def patch_ddp(module: ModuleType, p: Probe = PROBE) -> bool:
    """Wraps ``DistributedDataParallel`` construction and hook registration once."""
    cls: Any = getattr(module, "DistributedDataParallel", None)
    if cls is None:
        raise RuntimeError(f"{module.__name__}.DistributedDataParallel not found (unsupported torch version)")
    init = cls.__dict__.get("__init__")
    register = cls.__dict__.get("register_comm_hook")
    builtin = cls.__dict__.get("_register_builtin_comm_hook")
    if init is None or register is None:
        raise RuntimeError(
            "DistributedDataParallel has no __init__ or register_comm_hook (unsupported torch)"
        )
    if getattr(init, MARK, False):
        return True
    mode = ddp_timing_by_env()
    pre_forward = cls.__dict__.get("_pre_forward") if mode == "stats" else None
    if mode == "stats" and pre_forward is None:
        mode = "hook"
        note("DDP timed by a communication hook (DistributedDataParallel has no _pre_forward)")
    register_comm_hook, register_builtin = _ddp_registrations(register, builtin, mode)
    _replace(
        cls,
        (
            ("__init__", _ddp_init(init, mode, make_ddp_hook(p)), init),
            ("register_comm_hook", register_comm_hook, register),
            ("_register_builtin_comm_hook", register_builtin, builtin),
            ("_pre_forward", _ddp_pre_forward(pre_forward, p), pre_forward),
        ),
    )
    p.comm_on = True
    return True


def _ddp_init(init: Callable[..., None], mode: str, hook: Callable[..., Any]) -> Callable[..., None]:
    """DDP's ``__init__``, then its timing: DDP's runtime statistics, else the communication hook."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807
        init(self, *args, **kwargs)
        why = "DAM_PROBE_DDP_TIMING=hook"
        if mode == "stats":
            try:
                why = attach_stats(self) or ""
            except Exception as exc:
                why = f"DDP's runtime statistics unusable: {exc}"
            if not why:
                note("DDP timed from DDP's runtime statistics")
                return
        try:
            attached = _attach(self, hook)
        except Exception as exc:
            report(f"cannot register the DDP communication hook: {exc}")
            return
        if attached:
            note(f"DDP timed by a communication hook ({why})")

    return __init__


def _ddp_pre_forward(pre_forward: Callable[..., Any] | None, p: Probe) -> Callable[..., Any]:
    """DDP's ``_pre_forward``, then the previous synchronising step counted from DDP's statistics."""
    clock = perf_counter_ns
    torch: Any = sys.modules.get("torch")
    grad_enabled: Callable[[], bool] = getattr(torch, "is_grad_enabled", None) or (lambda: True)

    def _pre_forward(self: Any, *inputs: Any, **kwargs: Any) -> Any:
        result = pre_forward(self, *inputs, **kwargs)  # type: ignore[misc]
        state = self.__dict__.get(STATS_SLOT)
        # DDP has just computed the previous synchronising step's figures (only when this forward
        # records grad and synchronises: the same condition DDP uses).
        if state is not None and self.require_backward_grad_sync and grad_enabled():
            try:
                counted = count_step(state, state.logger._get_ddp_logging_data().ints_map, p)
            except Exception as exc:
                self.__dict__.pop(STATS_SLOT, None)
                report(f"cannot read DDP's runtime statistics: {exc}")
                counted = False
            if counted:
                now = clock()
                if now >= p.comm.next_ns:
                    p.publish_comm(now)
        return result

    return _pre_forward


def _ddp_registrations(
    register: Callable[..., Any], builtin: Callable[..., Any] | None, mode: str
) -> tuple[Callable[..., None], Callable[..., None]]:
    """``register_comm_hook`` and ``_register_builtin_comm_hook``: a user's hook runs inside ours."""

    def register_comm_hook(self: Any, state: object, hook_fn: Callable[..., Any]) -> None:
        comm = getattr(self, DDP_SLOT, None)
        if comm is None and mode == "stats" and callable(hook_fn):
            # DDP's statistics time the buckets; the collectives the hook issues are not counted again.
            return register(self, state, uncounted(hook_fn))  # type: ignore[no-any-return]
        if comm is None or comm.user_hook is not None:
            # Not ours (or a second registration: the reducer raises DDP's own error).
            return register(self, state, hook_fn)  # type: ignore[no-any-return]
        self._check_comm_hook(hook_fn)
        if self.logger is not None:
            self.logger._set_comm_hook_name(hook_fn.__qualname__)
        self._comm_hooks.append((hook_fn, state))
        comm.user_hook, comm.user_state = hook_fn, state
        return None

    def _register_builtin_comm_hook(self: Any, comm_hook_type: object) -> None:
        comm = getattr(self, DDP_SLOT, None)
        twin = _builtin_twin(comm_hook_type) if comm is not None and comm.user_hook is None else None
        if comm is None or twin is None:
            return builtin(self, comm_hook_type)  # type: ignore[misc,no-any-return]
        if self.logger is not None:
            self.logger._set_comm_hook_name(str(comm_hook_type))
        comm.user_hook, comm.user_state = twin, comm.group
        return None

    return register_comm_hook, _register_builtin_comm_hook


def _replace(cls: Any, methods: tuple[tuple[str, Callable[..., Any], Any], ...]) -> None:
    """Puts each wrapper on ``cls`` in place of its original (absent originals are left alone)."""
    for name, fn, orig in methods:
        if orig is None:
            continue
        fn.__name__ = orig.__name__
        fn.__qualname__ = orig.__qualname__
        fn.__doc__ = orig.__doc__
        fn.__wrapped__ = orig  # type: ignore[attr-defined]
        setattr(fn, MARK, True)
        setattr(cls, name, fn)
