"""The FLOPs of one training step, counted once by the probe with torch's FLOP formulas."""

from __future__ import annotations

from typing import Any

import pytest

import dam_probe
from dam_probe import _goodput
from dam_probe._core import Probe
from dam_probe.layout import (
    FLOPS_DECLARED,
    FLOPS_MEASURED,
    FLOPS_OFF,
    FLOPS_REASON_COUNTER_ERROR,
    FLOPS_REASON_LOW_MEMORY,
    FLOPS_UNAVAILABLE,
    probe_files,
    read_file,
)

torch = pytest.importorskip("torch")

BATCH, IN, HIDDEN, OUT = 16, 32, 64, 8


def _train(steps: int) -> Any:
    model = torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, OUT))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [(torch.randn(BATCH, IN), torch.randn(BATCH, OUT)) for _ in range(steps)]
    for x, y in dam_probe.instrument(data):
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


def _exact_step_flops() -> int:
    """Forward 2·in·out per Linear and sample; backward twice that, but the first layer's input
    needs no gradient, so it computes only its weight gradient (2·in·out)."""
    first, second = IN * HIDDEN, HIDDEN * OUT
    return BATCH * (2 * first + 2 * second + 2 * first + 4 * second)


@pytest.fixture
def fast_probe(probe: Probe) -> Probe:
    probe.interval_ns = 0  # every batch takes the slow path: the count starts right after warm-up
    return probe


def test_the_flops_of_one_step_are_counted_once_after_warm_up(fast_probe: Probe) -> None:
    _train(40)
    f = fast_probe.goodput.flops
    assert f.state == FLOPS_MEASURED
    assert f.measured == _exact_step_flops()
    assert f.measured_steps == 1 and f.measured_ns > 0
    assert f.mode is None  # the counter was left
    fast_probe.close()
    (path,) = probe_files(fast_probe.directory)
    r = read_file(path)
    assert r.measured_flops_per_step == _exact_step_flops() and r.flops_state == FLOPS_MEASURED
    assert r.effective_flops_per_step == (_exact_step_flops(), "measured")


def test_no_count_before_warm_up(fast_probe: Probe) -> None:
    _train(_goodput.FLOPS_AFTER_STEPS - 1)
    assert fast_probe.goodput.flops.measured is None and fast_probe.goodput.flops.mode is None


def test_declared_flops_are_not_counted(fast_probe: Probe) -> None:
    fast_probe.set_flops_per_step(1e9)
    _train(30)
    assert fast_probe.goodput.flops.state == FLOPS_DECLARED
    assert fast_probe.goodput.flops.measured is None


def test_dam_probe_flops_0_turns_the_count_off(fast_probe: Probe, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DAM_PROBE_FLOPS", "0")
    _train(30)
    assert fast_probe.goodput.flops.state == FLOPS_OFF


def test_no_count_in_a_container_without_room_for_the_counter(
    fast_probe: Probe, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 200 MiB free under the limit: the counter's one-time ~150 MiB must not be what OOM-kills the job.
    limit = 2 << 30
    monkeypatch.setattr(
        type(fast_probe.memory), "read", lambda self, now_ns: (limit - (200 << 20), limit, 0, 1)
    )
    _train(30)
    assert fast_probe.goodput.flops.state == FLOPS_UNAVAILABLE
    assert fast_probe.goodput.flops.reason_figures() == (FLOPS_REASON_LOW_MEMORY, "")
    # With room (or no limit) the same job is counted.
    monkeypatch.setattr(type(fast_probe.memory), "read", lambda self, now_ns: (1 << 30, 0, 0, 1))
    fast_probe.goodput.flops.reset()
    _train(30)
    assert fast_probe.goodput.flops.state == FLOPS_MEASURED


def test_a_counter_that_cannot_start_never_breaks_training(
    fast_probe: Probe, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken() -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(_goodput, "_counting_mode", broken)
    model = _train(30)  # completes
    f = fast_probe.goodput.flops
    assert f.state == FLOPS_UNAVAILABLE and f.mode is None
    assert f.reason_figures() == (FLOPS_REASON_COUNTER_ERROR, "counter: RuntimeError")
    assert not torch.utils._python_dispatch._get_current_dispatch_mode_stack()  # nothing left pushed
    assert model(torch.randn(2, IN)).shape == (2, OUT)


def test_a_loader_that_runs_out_while_counting_leaves_the_counter(fast_probe: Probe) -> None:
    _train(_goodput.FLOPS_AFTER_STEPS)  # the count starts at the last batch; the loader ends
    f = fast_probe.goodput.flops
    assert f.mode is None and f.attempts == 1 and f.measured is None
    assert not torch.utils._python_dispatch._get_current_dispatch_mode_stack()
    _train(_goodput.FLOPS_AFTER_STEPS + 5)  # the next epoch counts
    assert f.state == FLOPS_MEASURED and f.measured == _exact_step_flops()
