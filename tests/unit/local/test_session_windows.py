"""``dam run``'s windows: the loader workers the window saw, and a window that grows for slow steps."""

from __future__ import annotations

from dam_contract import names
from dam_contract.snapshot import Sample, Snapshot
from dam_operator.diagnosis.model import Regime
from dam_operator.local.session import MAX_WINDOW_GROWTH, LocalSession


def snap(
    steps: float, wait_s: float, step_s: float, workers: float | None = None, saves: float | None = None
) -> Snapshot:
    samples = [
        Sample(names.STEPS_TOTAL, (), steps),
        Sample(names.DATALOADER_WAIT_SECONDS_TOTAL, (), wait_s),
        Sample(names.STEP_SECONDS_TOTAL, (), step_s),
        Sample(names.NVML_UP, (), 1.0),
        Sample(names.GPU_ATTRIBUTION, (("state", "probe"),), 1.0),
    ]
    if workers is not None:
        samples += [
            Sample(names.PROCESS_CPU_SECONDS_TOTAL, (("role", "main"),), 0.1 * steps),
            Sample(names.PROCESS_CPU_SECONDS_TOTAL, (("role", "worker"),), 0.01 * steps),
            Sample(names.PROCESSES, (("role", "main"),), 1.0),
            Sample(names.PROCESSES, (("role", "worker"),), workers),
        ]
    if saves is not None:
        samples.append(Sample(names.CHECKPOINTS_TOTAL, (), saves))
    return Snapshot(samples)


def test_the_final_verdict_keeps_the_workers_gone_by_the_last_snapshot() -> None:
    session = LocalSession(window_seconds=2.0)
    session.add(0.0, snap(0, 0, 0, workers=2))
    t = 0.0
    for i in range(1, 21):
        t += 0.5
        session.add(t, snap(10 * i, 0.49 * i, 0.5 * i, workers=2))
    session.add(t + 0.5, snap(200, 9.8, 10.0, workers=0))  # after the command exited
    v = session.final_verdict()
    assert v.metrics.worker_count == 2
    assert v.bottleneck.lever == "use-sequential-shards", v.bottleneck.evidence
    assert not any("no DataLoader workers" in e for e in v.bottleneck.evidence)


def slow_session(step_every: float) -> tuple[LocalSession, list[Regime]]:
    """A job that makes one step every ``step_every`` seconds, sampled each second, 10 s windows."""
    session = LocalSession(window_seconds=10.0)
    regimes: list[Regime] = []
    session.add(0.0, snap(0, 0, 0))
    for t in range(1, 80):
        steps = t // step_every
        session.add(float(t), snap(steps, 0.9 * steps * step_every, steps * step_every))
        if not session.warming_up():
            verdict = session.window_verdict()
            assert verdict is not None
            regimes.append(verdict.bottleneck.regime)
    return session, regimes


def test_slow_steps_grow_the_window_instead_of_dropping_the_verdict() -> None:
    session, regimes = slow_session(5.5)  # 0.18 steps/s: 1 or 2 steps in a 10 s window
    assert regimes and set(regimes) == {Regime.INPUT_BOUND}
    start = session.window_start()
    assert session.history[-1][0] - start[0] > 10.0, "the window grew past one window"


def test_the_window_grows_no_further_than_its_bound() -> None:
    session, _ = slow_session(100.0)  # no second step in the run
    assert session.history[-1][0] - session.window_start()[0] <= 10.0 * MAX_WINDOW_GROWTH + 1.0


def test_the_final_rate_leaves_out_the_teardown_after_the_last_step() -> None:
    """Issue 20 (acceptance): two gloo ranks under torchrun at 18.8 steps/s reported 14.7 — the
    final span ran on through 3 s of interpreter/gloo/torchrun teardown after the last step."""
    session = LocalSession(window_seconds=10.0)
    session.add(0.0, snap(0, 0, 0))
    for t in range(1, 21):  # 20 steps/s for 20 s
        session.add(float(t), snap(20 * t, 0.01 * t, 1.0 * t, workers=0))
    for t in range(21, 25):  # the command tears down: no step, the counters stay
        session.add(float(t), snap(400, 0.2, 20.0, workers=0))
    v = session.final_verdict()
    assert v.metrics.steps_per_second is not None
    assert abs(v.metrics.steps_per_second - 20.0) < 0.5, v.metrics.steps_per_second


def _stopped_after_20_seconds() -> LocalSession:
    """20 steps/s for 20 s, then 20 s without a step (5 s windows)."""
    session = LocalSession(window_seconds=5.0)
    session.add(0.0, snap(0, 0, 0))
    for t in range(1, 21):
        session.add(float(t), snap(20 * t, 0.01 * t, 1.0 * t))
    for t in range(21, 41):  # 20 s without a step
        session.add(float(t), snap(400, 0.2, 20.0))
    return session


def test_a_tail_longer_than_a_window_stays_in_the_final_verdict() -> None:
    """A job that stopped making progress for longer than a window (a hang, then interrupted or
    failed) is not trimmed away."""
    v = _stopped_after_20_seconds().final_verdict()
    assert v.metrics.steps_per_second is not None
    assert v.metrics.steps_per_second < 15.0, v.metrics.steps_per_second


def test_a_completed_command_s_tail_is_trimmed_however_long() -> None:
    """A command that exited 0 by itself finished its steps: 20 s of final save, evaluation or
    teardown after its last step are no part of its rate (the truth tier's job with a 6 s tail
    under 5 s windows; a kept 12 s tail halved its MFU)."""
    session = _stopped_after_20_seconds()
    v = session.final_verdict(completed=True)
    assert v.metrics.steps_per_second is not None
    assert abs(v.metrics.steps_per_second - 20.0) < 0.5, v.metrics.steps_per_second
    span = session.final_span(completed=True)
    assert span is not None and span[1][0] == 20.0, span and span[1][0]


def test_a_completed_command_s_last_save_after_its_last_step_stays_in_the_final_span() -> None:
    """The run's last work is its last step and the save (and its barrier) after it: a save
    counted after the last step keeps the span open until it is counted; the idle rest is cut."""
    session = LocalSession(window_seconds=5.0)
    session.add(0.0, snap(0, 0, 0))
    for t in range(1, 21):
        session.add(float(t), snap(20 * t, 0.01 * t, 1.0 * t))
    for t in range(21, 41):  # the last save is counted at 24 s, then 16 s of nothing
        session.add(float(t), snap(400, 0.2, 20.0, saves=1.0 if t >= 24 else 0.0))
    span = session.final_span(completed=True)
    assert span is not None and span[1][0] == 24.0, span and span[1][0]
