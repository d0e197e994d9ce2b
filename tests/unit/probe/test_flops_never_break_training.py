"""The FLOP counter cannot change or break the user's step (docs/probe.md, "FLOPs per step, measured").

Each job here trains the same seeded model twice on CPU, with the counter (it counts one step) and
with ``DAM_PROBE_FLOPS=0``: every loss and every final weight is bitwise equal, whatever the step
does under the counter. A step the counter cannot count (an op whose FLOP formula raises, a
higher-order op, a dispatch mode of the user's left open across a batch boundary) keeps training,
and the probe says why (``FLOPS_REASON_*``, the op), also in its file.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

import dam_probe
from dam_probe import _goodput
from dam_probe._core import Probe
from dam_probe.layout import (
    FLOPS_MEASURED,
    FLOPS_OFF,
    FLOPS_REASON_COUNTER_ERROR,
    FLOPS_REASON_HIGHER_ORDER_OP,
    FLOPS_REASON_MODE_STACK,
    FLOPS_REASON_OFF,
    FLOPS_UNAVAILABLE,
    probe_files,
    read_file,
)
from tests.unit.probe.conftest import python_env

torch = pytest.importorskip("torch")
from torch._C import DispatchKey  # noqa: E402
from torch._ops import HigherOrderOperator  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402
from torch.utils.flop_counter import register_flop_formula  # noqa: E402

STEPS = 20
COUNTED = _goodput.FLOPS_AFTER_STEPS  # the step the counter covers (1-based): the tenth


@torch.library.custom_op("dam_test::scaled", mutates_args=(), schema="(Tensor x) -> Tensor")  # type: ignore[misc]
def scaled(x: Any) -> Any:
    return x * 1.5


@scaled.register_fake  # type: ignore[misc]
def _(x: Any) -> Any:
    return torch.empty_like(x)


def _scaled_backward(ctx: Any, grad: Any) -> Any:
    return grad * 1.5


scaled.register_autograd(_scaled_backward)


@register_flop_formula(torch.ops.dam_test.scaled)  # type: ignore[misc]
def _broken_formula(*args: Any, **kwargs: Any) -> int:
    raise ValueError("this op's FLOP formula is broken")


Step = Callable[[Any, Any, Any, int], Any]  # (model, x, y, step number) -> loss


def _plain(model: Any, x: Any, y: Any, i: int) -> Any:
    return ((model(x) - y) ** 2).mean()


def _custom_op(model: Any, x: Any, y: Any, i: int) -> Any:
    return ((scaled(model(x)) - y) ** 2).mean()


def _gradient_penalty(model: Any, x: Any, y: Any, i: int) -> Any:
    """``torch.autograd.grad`` inside the step (FlopCounterMode's module tracker raises there)."""
    x = x.clone().requires_grad_(True)
    loss = ((model(x) - y) ** 2).mean()
    (g,) = torch.autograd.grad(loss, x, create_graph=True)
    return loss + 0.1 * g.pow(2).sum()


def _checkpointed(model: Any, x: Any, y: Any, i: int) -> Any:
    return ((checkpoint(model, x, use_reentrant=False) - y) ** 2).mean()


class Apply(HigherOrderOperator):  # type: ignore[misc]
    """A higher-order op (as ``torch.cond``, ``flex_attention`` are) that applies a function.

    Not ``torch.cond`` itself: in eager it compiles its branches with TorchDynamo, and a process
    that compiled is not counted at all (``_goodput._compiled``)."""

    def __init__(self) -> None:
        super().__init__("dam_test_apply")

    def __call__(self, fn: Any, x: Any) -> Any:
        return super().__call__(fn, x)


apply_hop = Apply()


@apply_hop.py_impl(DispatchKey.CompositeExplicitAutograd)  # type: ignore[misc]
def _apply_dense(fn: Any, x: Any) -> Any:
    return fn(x)


@apply_hop.py_impl(DispatchKey.Autograd)  # type: ignore[misc]
def _apply_autograd(fn: Any, x: Any) -> Any:
    with torch._C._AutoDispatchBelowAutograd():
        return apply_hop(fn, x)


def _higher_order_op(model: Any, x: Any, y: Any, i: int) -> Any:
    scale = apply_hop(lambda t: (t @ t.T).tanh().mean(), x)
    return ((model(x) - y) ** 2).mean() * (1 + scale)


class UserMode(TorchDispatchMode):  # type: ignore[misc]
    """A dispatch mode of the user's own: counts ops and passes them on."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0
        self.entered_at: int | None = None

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops += 1
        return func(*args, **(kwargs or {}))


USER_MODE = UserMode()


def _user_mode_inside(model: Any, x: Any, y: Any, i: int) -> Any:
    with UserMode():
        return ((model(x) - y) ** 2).mean()


def _user_mode_across_batches(model: Any, x: Any, y: Any, i: int) -> Any:
    """Enters a mode of its own in the counted step and leaves it two steps later."""
    if USER_MODE.entered_at is None and dam_probe.PROBE.goodput.flops.mode is not None:
        USER_MODE.entered_at = i
        USER_MODE.__enter__()
    loss = ((model(x) - y) ** 2).mean()
    if USER_MODE.entered_at is not None and i == USER_MODE.entered_at + 2:
        USER_MODE.__exit__(None, None, None)
    return loss


def test_the_counted_step_is_the_tenth(probe: Probe) -> None:
    probe.interval_ns = 0
    counting = []
    _train(lambda m, x, y, i: counting.append(probe.goodput.flops.mode is not None) or _plain(m, x, y, i))
    counted = [i for i, on in enumerate(counting, start=1) if on]
    assert counted == [COUNTED], counted  # one step, the tenth


def _train(step: Step) -> tuple[list[Any], list[Any]]:
    """The losses and the final weights of a seeded job of ``STEPS`` steps under the probe."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    data = [(torch.randn(6, 8), torch.randn(6, 4)) for _ in range(STEPS)]
    losses = []
    for i, (x, y) in enumerate(dam_probe.instrument(data), start=1):
        loss = step(model, x, y, i)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach().clone())
    return losses, [p.detach().clone() for p in model.parameters()]


def _with_and_without(probe: Probe, monkeypatch: pytest.MonkeyPatch, step: Step) -> _goodput.FlopCount:
    """Trains without the counter, then with it; asserts the two are bitwise equal."""
    probe.interval_ns = 0  # every batch takes the slow path: the count starts right after warm-up
    monkeypatch.setenv("DAM_PROBE_FLOPS", "0")
    off_losses, off_weights = _train(step)
    assert probe.goodput.flops.state == FLOPS_OFF
    assert probe.goodput.flops.reason_figures() == (FLOPS_REASON_OFF, "")
    monkeypatch.delenv("DAM_PROBE_FLOPS")
    probe.goodput.flops.reset()
    losses, weights = _train(step)
    assert len(losses) == STEPS  # every step ran
    for a, b in zip(losses + weights, off_losses + off_weights, strict=True):
        assert torch.equal(a, b), (a, b)
    assert not _get_current_dispatch_mode_stack()  # nothing left pushed
    f = probe.goodput.flops
    assert f.mode is None
    return f


@pytest.mark.parametrize("step", [_plain, _gradient_penalty, _checkpointed, _user_mode_inside])
def test_a_step_the_counter_can_count_is_bitwise_the_same_and_counted(
    probe: Probe, monkeypatch: pytest.MonkeyPatch, step: Step
) -> None:
    f = _with_and_without(probe, monkeypatch, step)
    assert f.state == FLOPS_MEASURED and f.measured is not None and f.measured > 0
    assert f.reason_figures() is None


def test_checkpointing_counts_the_recomputed_forward(probe: Probe, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = _with_and_without(probe, monkeypatch, _plain).measured
    probe.goodput.flops.reset()
    recomputed = _with_and_without(probe, monkeypatch, _checkpointed).measured
    assert plain is not None and recomputed is not None
    # The backward runs the first Linear's forward again (2 x 6 x 8 x 16 FLOPs) for the Tanh's saved
    # output; the recomputation stops there (the second Linear's output is not saved for backward).
    assert recomputed - plain == 2 * 6 * 8 * 16


def test_an_op_whose_flop_formula_raises_runs_uncounted_and_stops_the_count(
    probe: Probe, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = _with_and_without(probe, monkeypatch, _custom_op)
    assert f.state == FLOPS_UNAVAILABLE and f.measured is None
    reason, detail = f.reason_figures() or (0, "")
    assert reason == FLOPS_REASON_COUNTER_ERROR
    assert detail == "dam_test.scaled.default: ValueError", detail
    probe.close()
    (path,) = probe_files(probe.directory)
    r = read_file(path)
    assert (r.flops_state, r.flops_reason, r.flops_detail) == (FLOPS_UNAVAILABLE, reason, detail)
    assert r.measured_flops_per_step is None


def test_a_higher_order_op_runs_uncounted_and_stops_the_count(
    probe: Probe, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = _with_and_without(probe, monkeypatch, _higher_order_op)
    assert f.state == FLOPS_UNAVAILABLE and f.measured is None
    assert f.reason_figures() == (FLOPS_REASON_HIGHER_ORDER_OP, "dam_test_apply")


def test_a_user_mode_left_open_across_batches_is_never_popped_by_the_counter(
    probe: Probe, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = _with_and_without(probe, monkeypatch, _user_mode_across_batches)
    assert USER_MODE.entered_at is not None and USER_MODE.ops > 0  # it saw the ops of its steps
    assert f.state == FLOPS_UNAVAILABLE and f.measured is None
    assert f.reason_figures() == (FLOPS_REASON_MODE_STACK, "")


FIRST_COUNT = """
import sys, time, torch
import dam_probe
dam_probe.PROBE.interval_ns = 0  # every batch on the slow path: the count starts at the tenth
model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
steps = []
for x in dam_probe.instrument([torch.randn(8, 32) for _ in range(20)]):
    t = time.process_time()
    model(x).sum().backward()
    steps.append(time.process_time() - t)
figures = dam_probe.PROBE.goodput.flops.figures()
print(figures[0] if figures else None, "torch._dynamo" in sys.modules, max(steps), sep="\\n")
"""


def test_the_first_count_in_a_process_imports_no_dynamo_and_costs_its_step_a_fraction_of_a_second(
    tmp_path: Any,
) -> None:
    """The first dispatch mode a process pushes imported ``torch._dynamo`` (PyTorch's default
    ``_should_skip_dynamo``): 2.3 s of CPU inside the counted step. The counter's mode opts out."""
    done = subprocess.run(
        [sys.executable, "-c", FIRST_COUNT],
        capture_output=True,
        text=True,
        timeout=120,
        env=python_env(DAM_PROBE_DIR=str(tmp_path)),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    flops, dynamo, slowest = done.stdout.split()
    # Forward: 8x32 @ 32x32 and 8x32 @ 32x4 (2 M N K each). Backward: both gradients of the second
    # layer, only the weight's of the first (the input needs none).
    forward = 2 * 8 * (32 * 32 + 32 * 4)
    assert float(flops) == forward + 2 * 8 * 32 * 32 + 2 * (2 * 8 * 32 * 4), flops
    assert dynamo == "False"
    assert float(slowest) < 1.0, slowest  # the counted step, with the import of the FLOP formulas
