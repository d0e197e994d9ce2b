"""Goodput and badput by cause, checkpoint saves, and the FLOPs of one step: the probe's accounting.

Where a process's wall time goes, from its start to the latest publish (``elapsed``):

- ``startup``: process start (``/proc/self/stat`` start time) to the first batch asked for;
- ``data wait``: time blocked in ``next()`` on the loader (the probe's wait counter);
- ``communication``: exposed communication (``dam_probe._comm``), when collectives are timed;
- ``checkpoint``: time the training thread blocked in ``torch.save``,
  ``torch.distributed.checkpoint.save`` and the blocking part of ``async_save`` (the staging it
  does before it returns; the write in its background thread is not counted), and in
  ``os.fsync``/``os.fdatasync`` after a save and before the next batch (the flush that makes
  the save durable: ``torch.save(obj, fh); os.fsync(fh.fileno())``; part of that save, not a
  save of its own; an fsync with a batch since the latest save is the step's own);
- ``productive``: step time less the data wait, the exposed communication and the checkpoint
  saves that happened inside steps (a save between two batches of a loop is part of the step
  time the probe covers; a save after the loop ended is not);
- ``other``: what is left (evaluation outside the loader loop, time between epochs, the end).

Both ``productive`` and ``other`` are published as high-water marks, so every published figure is
a counter that never decreases (a collective timed outside the loop, or a publish in the middle
of a step, would otherwise make one of them dip for a moment). Their sum may exceed the elapsed
time by at most about one step.

Cost: nothing on the per-batch path. The accounting runs on the probe's slow path (at most ten
times a second, at a batch boundary) and in the save wrappers (once per checkpoint;
``dam_probe._checkpoint``, which call ``checkpoint_done``).

The FLOPs of one training step are counted once, when the job declared none
(``dam_probe.set_flops_per_step``): after ``FLOPS_AFTER_STEPS`` batches, at a batch boundary,
a counting dispatch mode is entered, and it is left at the next batch boundary (the probe forces
its slow path there), in the training thread only. The mode (``_counting_mode``) cannot change or
break the user's step: it runs every op exactly as it would run without it (the op first, with the
mode off the stack, as ``TorchDispatchMode`` does), and only then counts it with PyTorch's own FLOP
formulas (``torch.utils.flop_counter.flop_registry``, what ``FlopCounterMode`` counts with). An
error while counting leaves that op's result as it is, stops the count and records why
(``FLOPS_REASON_*``, with the op and the exception's type); a higher-order op runs uncounted and
stops the count the same way. ``FlopCounterMode`` itself is not used: its module tracker's hooks
run in the user's forward and backward (they raise under ``torch.autograd.grad``, PyTorch 2.13:
"A leaf node was passed to _will_engine_execute_node"), it decomposes ops it has no formula for,
and its ``torch.cond`` handler runs both branches.

The same count says which precision the step's matmuls ran in (what MFU divides by, docs/method.md):
every op with a FLOP formula is a matmul-class op (``mm``, ``addmm``, ``bmm``, ``baddbmm``,
``_scaled_mm``, the convolutions, the attention kernels), and its FLOPs are added to the precision
of its first tensor argument: bf16, fp16, fp64, any float8 dtype as fp8, and fp32 — read as tf32
on CUDA when TF32 is allowed there (``torch.backends.cuda.matmul.allow_tf32`` or
``torch.get_float32_matmul_precision() != "highest"`` for matmuls, ``torch.backends.cudnn.allow_tf32``
for convolutions). The precision of the most FLOPs is published (``PRECISION_*``, layout offset
524); autocast's casts happen before the mode sees an op, so an autocast step reads as its
autocast dtype.

Standard library only: torch is looked up in ``sys.modules``; ``torch.utils.flop_counter`` is
imported only when torch is already loaded.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import threading
import time
from time import perf_counter_ns
from typing import Any, ClassVar, Final, Protocol

from dam_probe import lastwords
from dam_probe._counters import CounterGroup, StepCounters
from dam_probe.cgroup import MemoryReader
from dam_probe.layout import (
    FLOPS_DECLARED,
    FLOPS_DETAIL_BYTES,
    FLOPS_MEASURED,
    FLOPS_OFF,
    FLOPS_PENDING,
    FLOPS_REASON_COMPILED,
    FLOPS_REASON_COUNTER_ERROR,
    FLOPS_REASON_CUT_SHORT,
    FLOPS_REASON_HIGHER_ORDER_OP,
    FLOPS_REASON_LOW_MEMORY,
    FLOPS_REASON_MODE_STACK,
    FLOPS_REASON_NO_FORMULA,
    FLOPS_REASON_NO_TORCH,
    FLOPS_REASON_OFF,
    FLOPS_UNAVAILABLE,
    PRECISION_BF16,
    PRECISION_FP8,
    PRECISION_FP16,
    PRECISION_FP32,
    PRECISION_FP64,
    PRECISION_TF32,
    PRECISION_UNKNOWN,
)


class Probe(Protocol):
    """What the accounting reads of its probe (``dam_probe._core.Probe``, which holds it as
    ``goodput``): passed in, never imported, as ``_core`` imports this module."""

    @property
    def step(self) -> StepCounters: ...
    @property
    def flops_per_step(self) -> float: ...
    @property
    def disabled(self) -> bool: ...
    @property
    def memory(self) -> MemoryReader: ...


ENV_FLOPS: Final = "DAM_PROBE_FLOPS"  # 0/false/no/off: never count FLOPs
FLOPS_AFTER_STEPS: Final = 10
"""The FLOP count starts at the first slow path after this many batches (warm-up: lazy
initialisation, autotuning and the first optimizer step are behind)."""
FLOPS_MAX_ATTEMPTS: Final = 3
FLOPS_MIN_HEADROOM_BYTES: Final = 512 << 20
"""No count when the container's memory limit leaves less than this free: importing PyTorch's
FLOP counter and its first use cost about 150 MiB of host memory once (with the CUDA build most of
it is the Triton modules it imports), which must never be what OOM-kills a tight container."""
"""A count cut short (the loader ran out before the next batch) is retried this often."""
_OFF: Final = frozenset({"0", "false", "no", "off"})
_IMPORTED_NS: Final = time.time_ns()  # fallback process start: when the probe was imported
_MAX_AGE_NS: Final = 10 * 365 * 86400 * 10**9


def process_start_unix_ns(stat_path: str = "/proc/self/stat") -> int:
    """This process's start, Unix ns: its start time in ``/proc/self/stat`` (field 22, clock ticks
    since boot) against ``CLOCK_BOOTTIME`` (the clock that field counts on, proc(5)). Falls back to
    when the probe was imported (``sitecustomize`` imports it as the interpreter starts)."""
    try:
        with open(stat_path, "rb") as fh:
            data = fh.read()
        fields = data[data.rindex(b")") + 2 :].split()  # after "pid (comm)": field 3 is index 0
        start_ticks = int(fields[19])
        ticks = os.sysconf("SC_CLK_TCK")
        age_ns = time.clock_gettime_ns(time.CLOCK_BOOTTIME) - start_ticks * 1_000_000_000 // ticks
        if 0 <= age_ns < _MAX_AGE_NS:
            return time.time_ns() - age_ns
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    return _IMPORTED_NS


def flops_off_by_env(environ: dict[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get(ENV_FLOPS, "").strip().lower() in _OFF


def _compiled() -> bool:
    """True when ``torch.compile`` (TorchDynamo) compiled a graph in this process: the counter sees
    no op inside a compiled region (Inductor's fused kernels), so the count would be wrong."""
    dynamo: Any = sys.modules.get("torch._dynamo")
    if dynamo is None:
        return False
    try:
        return bool(dynamo.utils.counters["stats"]["unique_graphs"])
    except Exception:
        return True  # cannot tell: do not count


def _tight_memory(p: Probe) -> bool:
    """Whether the process's memory cgroup has a limit with less than the counter's cost free."""
    memory = p.memory.read(perf_counter_ns())  # the clock the probe's readers are cached on
    if memory is None:
        return False
    usage, limit = memory[0], memory[1]
    return limit > 0 and limit - usage < FLOPS_MIN_HEADROOM_BYTES


_MODE_CLASS: Any = None
"""The counting dispatch mode's class, built once the job's torch is loaded (``_counting_mode``)."""


def _detail(text: str) -> str:
    return text.encode("ascii", "replace").decode("ascii")[:FLOPS_DETAIL_BYTES]


_CONVOLUTIONS: Final = frozenset({"convolution", "_convolution", "convolution_backward"})
"""The ops whose fp32 runs as TF32 under ``torch.backends.cudnn.allow_tf32`` (the others: matmul's)."""


def _dtype_codes(torch: Any) -> dict[Any, int]:
    """``PRECISION_*`` of each floating dtype of the job's torch (every float8 variant it has)."""
    codes = {
        torch.float32: PRECISION_FP32,
        torch.float16: PRECISION_FP16,
        torch.bfloat16: PRECISION_BF16,
        torch.float64: PRECISION_FP64,
    }
    for name in dir(torch):
        if name.startswith("float8_") and isinstance(dtype := getattr(torch, name), torch.dtype):
            codes[dtype] = PRECISION_FP8
    return codes


def _tf32(torch: Any, op_name: str) -> bool:
    """Whether fp32 on CUDA runs as TF32 for this op, by the job's settings as the op ran."""
    if op_name in _CONVOLUTIONS:
        return bool(torch.backends.cudnn.allow_tf32)
    return bool(torch.backends.cuda.matmul.allow_tf32) or torch.get_float32_matmul_precision() != "highest"


def _precision_of(torch: Any, codes: dict[Any, int], func: Any, args: Any) -> int:
    """The precision an op with a FLOP formula ran in: its first tensor argument's dtype."""
    tensor = next((a for a in args if isinstance(a, torch.Tensor)), None)
    if tensor is None:
        return PRECISION_UNKNOWN
    code = codes.get(tensor.dtype, PRECISION_UNKNOWN)
    if (
        code == PRECISION_FP32
        and tensor.device.type == "cuda"
        and _tf32(torch, func._overloadpacket.__name__)
    ):
        return PRECISION_TF32
    return code


def _counting_mode() -> Any:
    """A new counting mode: a ``TorchDispatchMode`` that runs each op as it is, then counts it.

    Built on first use from the job's own torch (already in ``sys.modules``): the probe never
    imports torch itself. ``failure`` is ``(FLOPS_REASON_*, detail)`` once counting stopped;
    ``by_precision`` the FLOPs by ``PRECISION_*``."""
    global _MODE_CLASS
    if _MODE_CLASS is None:
        torch: Any = sys.modules["torch"]
        dispatch: Any = importlib.import_module("torch.utils._python_dispatch")
        registry: Any = importlib.import_module("torch.utils.flop_counter").flop_registry
        higher_order: Any = importlib.import_module("torch._ops").HigherOrderOperator
        codes = _dtype_codes(torch)

        class CountingMode(dispatch.TorchDispatchMode):  # type: ignore[misc]
            # Higher-order ops come to __torch_dispatch__ (with the mode popped) instead of raising
            # "no rule registered for HigherOrderOperator" (torch._ops.HigherOrderOperator.dispatch).
            supports_higher_order_operators = True

            @classmethod
            def _should_skip_dynamo(cls) -> bool:
                # TorchDispatchMode.__init_subclass__ wraps __torch_dispatch__ in
                # torch._disable_dynamo when this says True (its default, PyTorch 2.13), and that
                # wrapper imports torch._dynamo on the mode's first op: 2.3 s of CPU measured here,
                # paid inside the counted step (a starved loader's 2 s window read 45 % data wait
                # instead of 97 %), or, counted off the training thread first, held the exit of a
                # CPU-starved job for 13 s. False: no wrapper, no import (the first count costs
                # 0.16 s). The wrapper only keeps Dynamo from tracing into this method; nothing
                # compiles here (the count never starts in a process that compiled, _compiled).
                return False

            def __init__(self) -> None:
                super().__init__()
                self.total = 0
                self.by_precision: dict[int, int] = {}
                self.failure: tuple[int, str] | None = None

            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                # The user's op, first and once, as without the counter: this mode is off the
                # stack here, so the op runs its own kernels; its errors are the user's own.
                out = func(*args, **(kwargs or {}))
                if self.failure is None:
                    try:
                        if isinstance(func, higher_order):
                            self.failure = (FLOPS_REASON_HIGHER_ORDER_OP, _detail(str(func.name())))
                        else:
                            formula = registry.get(func._overloadpacket)
                            if formula is not None:
                                flops = int(formula(*args, **(kwargs or {}), out_val=out))
                                self.total += flops
                                code = _precision_of(torch, codes, func, args)
                                self.by_precision[code] = self.by_precision.get(code, 0) + flops
                    except Exception as exc:  # the count's error, never the step's
                        self.failure = (FLOPS_REASON_COUNTER_ERROR, _detail(f"{func}: {type(exc).__name__}"))
                return out

        _MODE_CLASS = CountingMode
    return _MODE_CLASS()


def dominant_precision(by_precision: dict[int, int]) -> int | None:
    """The ``PRECISION_*`` of the most FLOPs; None when those are of no known precision."""
    known = {code: flops for code, flops in by_precision.items() if flops > 0}
    if not known:
        return None
    code = max(known, key=lambda c: (known[c], -c))
    return None if code == PRECISION_UNKNOWN else code


def _on_top(mode: Any) -> bool:
    """Whether ``mode`` is the innermost dispatch mode (leaving it pops the innermost one)."""
    dispatch: Any = sys.modules.get("torch.utils._python_dispatch")
    return dispatch is not None and dispatch._get_current_dispatch_mode() is mode


class FlopCount(CounterGroup):
    """The one-time FLOP count of a training step (see the module docstring)."""

    __slots__ = (
        "attempts",
        "measured",
        "measured_ns",
        "measured_steps",
        "mode",
        "precision",
        "reason",
        "start_ns",
        "start_steps",
        "state",
        "thread",
    )

    def __init__(self) -> None:
        self.mode: Any = None  # the counting mode (``_counting_mode``) while it is entered
        super().__init__()

    def reset(self) -> None:
        """Not counted yet (a forked child: the mode pushed in the forking thread, now the child's
        only thread, is left first)."""
        self._leave()
        self.state = FLOPS_PENDING
        self.reason: tuple[int, str] | None = None  # why not counted: (FLOPS_REASON_*, detail)
        self.thread = 0
        self.start_steps = 0
        self.start_ns = 0
        self.attempts = 0
        self.measured: float | None = None
        self.precision: int | None = None  # PRECISION_* of the counted step's most FLOPs
        self.measured_ns = 0
        self.measured_steps = 0

    def figures(self) -> tuple[float, int, int] | None:
        if self.measured is None:
            return None
        return self.measured, self.measured_ns, self.measured_steps

    def reason_figures(self) -> tuple[int, str] | None:
        """``(FLOPS_REASON_*, detail)`` once the probe knows it will not count; None otherwise."""
        return self.reason

    def at_batch(self, p: Probe) -> None:
        """On the slow path, after the publish, in the thread that takes the batches. Never raises."""
        try:
            if self.mode is not None:
                self._finish(p)
            elif self.state == FLOPS_PENDING:
                self._maybe_start(p)
        except Exception as exc:
            self._give_up((FLOPS_REASON_COUNTER_ERROR, _detail(f"counter: {type(exc).__name__}")))

    def _unavailable(self, reason: int, detail: str = "") -> None:
        self.state = FLOPS_UNAVAILABLE
        self.reason = (reason, detail)

    def _maybe_start(self, p: Probe) -> None:
        if p.flops_per_step > 0:
            self.state = FLOPS_DECLARED
            return
        if p.step.steps < FLOPS_AFTER_STEPS:
            return
        if flops_off_by_env():
            self.state = FLOPS_OFF
            self.reason = (FLOPS_REASON_OFF, "")
            return
        if sys.modules.get("torch") is None:
            self._unavailable(FLOPS_REASON_NO_TORCH)
            return
        if _compiled():
            self._unavailable(FLOPS_REASON_COMPILED)
            return
        if _tight_memory(p):
            self._unavailable(FLOPS_REASON_LOW_MEMORY)
            return
        mode = _counting_mode()
        mode.__enter__()
        self.mode = mode
        self.thread = threading.get_ident()
        self.start_steps = p.step.steps
        self.start_ns = perf_counter_ns()
        p.step.next_publish_ns = 0  # the next batch takes the slow path and ends the count

    def _finish(self, p: Probe) -> None:
        if threading.get_ident() != self.thread:
            return
        steps = p.step.steps - self.start_steps
        if steps <= 0:
            p.step.next_publish_ns = 0
            return
        mode = self.mode
        if not _on_top(mode):
            # The step left a mode of its own above the counter's (entered in the step, left in a
            # later one): leaving ours now would pop the user's. Ours stays, counting nothing, and
            # is left at the first batch boundary where it is the innermost again.
            if mode.failure is None:
                mode.failure = (FLOPS_REASON_MODE_STACK, "")
            self.state = FLOPS_UNAVAILABLE
            self.reason = mode.failure
            return
        self.mode = None
        mode.__exit__(None, None, None)
        if mode.failure is not None:
            self._unavailable(*mode.failure)
        elif mode.total > 0:
            self.measured = float(mode.total) / steps
            self.precision = dominant_precision(mode.by_precision)
            self.measured_ns = perf_counter_ns() - self.start_ns
            self.measured_steps = steps
            self.state = FLOPS_MEASURED
        else:
            self._unavailable(FLOPS_REASON_NO_FORMULA)

    def cut_short(self) -> None:
        """The loader ran out while counting (training thread): leave the mode, retry later."""
        if self.mode is None or threading.get_ident() != self.thread:
            return
        if not _on_top(self.mode):
            return  # a mode of the user's is above ours: left at a later boundary (``_finish``)
        self.attempts += 1
        self._leave()
        if self.attempts >= FLOPS_MAX_ATTEMPTS:
            self._unavailable(FLOPS_REASON_CUT_SHORT)

    def _leave(self) -> None:
        mode, self.mode = self.mode, None
        if mode is not None and _on_top(mode):
            with contextlib.suppress(Exception):
                mode.__exit__(None, None, None)

    def _give_up(self, reason: tuple[int, str]) -> None:
        if self.mode is not None and threading.get_ident() == self.thread:
            self._leave()
        self.mode = None
        self._unavailable(*reason)


class Accounting(CounterGroup):
    """Goodput counters of one process (held by ``Probe.goodput``)."""

    __slots__ = (
        "checkpoints_on",
        "ckpt_count",
        "ckpt_depth",
        "ckpt_ns",
        "ckpt_step_ns",
        "first_batch",
        "flops",
        "last_ckpt_ns",
        "last_ckpt_steps",
        "other_hw",
        "pending",
        "process_start_ns",
        "productive_hw",
        "published",
        "startup_ns",
        "train_thread",
    )

    KEPT_AFTER_FORK: ClassVar[frozenset[str]] = frozenset({"checkpoints_on"})  # the wrappers stay

    def __init__(self) -> None:
        self.checkpoints_on = False  # a save function is wrapped (flag bit 8 of the file)
        self.flops = FlopCount()
        super().__init__()

    def reset(self) -> None:
        """Zero (a new process: a forked child keeps the wrappers, ``checkpoints_on``)."""
        self.flops.reset()
        self.first_batch = False
        self.process_start_ns = 0
        self.startup_ns = 0
        self.train_thread = 0  # the thread that took the first batch
        self.ckpt_depth = 0
        self.ckpt_ns = 0
        self.ckpt_step_ns = 0
        self.ckpt_count = 0
        self.last_ckpt_ns = 0
        self.last_ckpt_steps = 0
        # Saves inside the current stream of batches not yet covered by its step time:
        # (end perf_counter_ns, duration ns). A save is covered once a later batch arrives.
        self.pending: list[tuple[int, int]] = []
        self.productive_hw = 0
        self.other_hw = 0
        # (Unix ns, wait ns, exposed ns) of the latest publish with goodput: its figures are the
        # last words' totals (``dam_probe.lastwords.Totals``) when it is the closing one.
        self.published: tuple[int, int, int] | None = None

    # -- the training thread --------------------------------------------------------------

    def before_publish(self, p: Probe, t0_ns: int) -> None:
        """Slow path, before the publish: the first batch ends start-up; covered saves move into
        the step time. Never raises."""
        try:
            if not self.first_batch:
                self.first_batch = True
                self.train_thread = threading.get_ident()
                start = process_start_unix_ns()
                asked_unix = time.time_ns() - (perf_counter_ns() - t0_ns)
                self.process_start_ns = start
                self.startup_ns = max(0, asked_unix - start)
            if self.pending:
                self._cover(p.step.last_ns)
        except Exception:
            pass

    def after_publish(self, p: Probe) -> None:
        self.flops.at_batch(p)

    def stream_closed(self, t_ns: int) -> None:
        """The loader ran out at ``t_ns`` (training thread): saves before it were inside steps."""
        if self.pending:
            self._cover(t_ns)
            self.pending = []
        self.flops.cut_short()

    def _cover(self, until_ns: int) -> None:
        keep = []
        for end, dt in self.pending:
            if end <= until_ns:
                self.ckpt_step_ns += dt
            else:
                keep.append((end, dt))
        self.pending = keep

    def flushes_save(self, p: Probe) -> bool:
        """Whether an fsync now is the latest save's flush: in the training thread, outside a
        save, after a save with no batch since."""
        return (
            not self.ckpt_depth
            and self.ckpt_count > 0
            and p.step.steps == self.last_ckpt_steps
            and threading.get_ident() == self.train_thread
        )

    def checkpoint_done(self, p: Probe, t0_ns: int, t1_ns: int, *, flush: bool = False) -> None:
        """A save in the training thread blocked it from ``t0_ns`` to ``t1_ns`` (``flush``: the
        latest save's fsync, its time added to that save's). Never raises."""
        try:
            dt = max(0, t1_ns - t0_ns)
            self.ckpt_ns += dt
            if not flush:
                self.ckpt_count += 1
                self.last_ckpt_ns = time.time_ns()
                self.last_ckpt_steps = p.step.steps
            if p.step.in_stream and t0_ns >= p.step.stream_start_ns:
                self.pending.append((t1_ns, dt))
            if not p.disabled:
                p.step.next_publish_ns = 0  # the next batch publishes: the save is on file at once
        except Exception:
            pass

    # -- publishing (under the probe's publish lock) ----------------------------------------

    def figures(
        self, p: Probe, wait_ns: int, step_ns: int, exposed_ns: int
    ) -> tuple[
        tuple[int, int, int, int, int] | None,
        tuple[int, int, int, int, int] | None,
        tuple[float, int, int] | None,
    ]:
        """``(goodput, checkpoints, measured FLOPs)`` for ``ProbeWriter.publish``; None where unknown."""
        checkpoints = (
            (self.ckpt_ns, self.ckpt_step_ns, self.ckpt_count, self.last_ckpt_ns, self.last_ckpt_steps)
            if self.checkpoints_on
            else None
        )
        flops = self.flops.figures()
        if not self.first_batch:
            return None, checkpoints, flops
        productive = max(0, step_ns - wait_ns - exposed_ns - self.ckpt_step_ns)
        self.productive_hw = max(self.productive_hw, productive)
        now = time.time_ns()
        self.published = (now, wait_ns, exposed_ns)
        elapsed = max(0, now - self.process_start_ns)
        lost = self.startup_ns + wait_ns + exposed_ns + self.ckpt_ns
        self.other_hw = max(self.other_hw, elapsed - self.productive_hw - lost)
        state = self.flops.state
        if state == FLOPS_PENDING and p.flops_per_step > 0:
            state = FLOPS_DECLARED
        goodput = (self.process_start_ns, self.startup_ns, self.productive_hw, self.other_hw, state)
        return goodput, checkpoints, flops

    def totals(self, steps: int, timed_collectives: bool) -> lastwords.Totals | None:
        """The latest publish's figures as the process's exit totals (``lastwords.Totals``); None
        before its first batch. ``timed_collectives``: its exposed time is measured (else unknown,
        as for the sidecar, whose series is then absent)."""
        if self.published is None:
            return None
        at_ns, wait_ns, exposed_ns = self.published
        saved = self.last_ckpt_steps if self.ckpt_count else 0
        return lastwords.Totals(
            at_ms=at_ns // 1_000_000,
            productive_ms=self.productive_hw // 1_000_000,
            startup_ms=self.startup_ns // 1_000_000,
            data_wait_ms=wait_ns // 1_000_000,
            other_ms=self.other_hw // 1_000_000,
            communication_ms=exposed_ns // 1_000_000 if timed_collectives else None,
            checkpoint_ms=self.ckpt_ns // 1_000_000 if self.checkpoints_on else None,
            steps_since_checkpoint=max(0, steps - saved) if self.checkpoints_on else None,
        )
