"""Local mode's window bookkeeping and the command's environment (pure parts of `dam run`)."""

from __future__ import annotations

import pytest

from dam_contract import names
from dam_contract.snapshot import Sample, Snapshot
from dam_operator.diagnosis.model import Regime
from dam_operator.local.child import child_environment
from dam_operator.local.session import MAX_ANCHORS, MAX_WINDOW_GROWTH, LocalSession


def snap(steps: float, wait_s: float, step_s: float) -> Snapshot:
    return Snapshot(
        [
            Sample(names.STEPS_TOTAL, (), steps),
            Sample(names.DATALOADER_WAIT_SECONDS_TOTAL, (), wait_s),
            Sample(names.STEP_SECONDS_TOTAL, (), step_s),
        ]
    )


def test_pythonpath_puts_the_probe_first_and_keeps_the_users_value() -> None:
    env = child_environment({"PYTHONPATH": "/user/lib", "DAM_PROBE_DISABLE": "1"}, "/inject", "/probe")
    assert env["PYTHONPATH"].split(":") == ["/inject", "/user/lib"]
    assert env["DAM_PROBE_DIR"] == "/probe"
    assert "DAM_PROBE_DISABLE" not in env


def test_pythonpath_without_a_previous_value_is_only_the_probe() -> None:
    assert child_environment({}, "/inject", "/probe")["PYTHONPATH"] == "/inject"


def test_final_verdict_skips_startup_before_the_first_batch_and_the_warmup() -> None:
    session = LocalSession(window_seconds=5.0)
    session.add(0.0, snap(0, 0, 0))  # interpreter start-up: no batch yet
    session.add(1.0, snap(1, 0.9, 0.9))  # warm-up: a slow first batch (workers starting)
    t, steps, wait, step = 1.0, 1.0, 0.9, 0.9
    for _ in range(40):  # steady state: 1 % data wait
        t += 0.5
        steps += 10
        wait += 0.005
        step += 0.5
        session.add(t, snap(steps, wait, step))
    final = session.final_verdict()
    assert final.metrics.data_wait_ratio is not None
    assert final.metrics.data_wait_ratio < 0.05, "the warm-up batch must not dominate the final verdict"
    assert final.bottleneck.regime is not Regime.INPUT_BOUND


def test_starved_run_is_input_bound_in_window_and_final_verdicts() -> None:
    session = LocalSession(window_seconds=2.0)
    t = steps = wait = step = 0.0
    session.add(t, snap(steps, wait, step))
    verdicts = []
    for _ in range(20):
        t += 0.5
        steps += 5
        wait += 0.4
        step += 0.5
        session.add(t, snap(steps, wait, step))
        v = session.window_verdict()
        if v is not None:
            verdicts.append(v)
    assert verdicts[-1].bottleneck.regime is Regime.INPUT_BOUND
    assert session.final_verdict().bottleneck.regime is Regime.INPUT_BOUND


def test_memory_stays_bounded_over_a_long_run() -> None:
    session = LocalSession(window_seconds=3.0)
    for i in range(5000):
        session.add(float(i), snap(i + 1, i * 0.1, float(i)))
    assert len(session.anchors) <= MAX_ANCHORS
    assert len(session.history) <= 3 * MAX_WINDOW_GROWTH + 2  # the longest window a slow job grows to
    assert session.anchors[0][0] == 0.0, "the first batch is always kept"


def test_a_run_without_snapshots_is_unknown() -> None:
    assert LocalSession(window_seconds=2.0).final_verdict().bottleneck.regime is Regime.UNKNOWN


def test_a_run_that_trained_within_one_interval_is_still_diagnosed() -> None:
    # Imports take three intervals; all ten batches happen between two snapshots.
    session = LocalSession(window_seconds=10.0)
    for t in (0.0, 1.0, 2.0):
        session.add(t, snap(0, 0, 0))
    session.add(3.0, snap(10, 0.9, 0.95))
    session.add(3.9, snap(10, 0.9, 0.95))  # after the command exited
    final = session.final_verdict()
    assert final.bottleneck.regime is Regime.INPUT_BOUND
    assert final.metrics.data_wait_ratio is not None and final.metrics.data_wait_ratio > 0.9


def ranked_snap(t: float) -> Snapshot:
    """Two DDP ranks at 30 ms a step: rank 1 waits 20 ms a step for data, rank 0 waits for rank 1
    in the all-reduce. ``dam_probe_up`` is the pod's gauge, without a rank."""
    steps = t / 0.03
    samples = [Sample(names.PROBE_UP, (), 1.0)]
    for rank, wait, collective in ((0, 0.0005, 0.022), (1, 0.020, 0.002)):
        labels = ((names.RANK_LABEL, str(rank)),)
        samples += [
            Sample(names.STEPS_TOTAL, labels, steps),
            Sample(names.STEP_SECONDS_TOTAL, labels, t),
            Sample(names.DATALOADER_WAIT_SECONDS_TOTAL, labels, wait * steps),
            Sample(names.COLLECTIVE_SECONDS_TOTAL, labels, collective * steps),
            Sample(names.COLLECTIVE_EXPOSED_SECONDS_TOTAL, labels, collective * steps),
            Sample(names.COLLECTIVES_TOTAL, labels, steps),
        ]
    return Snapshot(samples)


def test_a_multi_rank_run_is_judged_as_one_job_with_its_straggler_and_each_ranks_figures() -> None:
    session = LocalSession(window_seconds=2.0)
    session.add(0.0, ranked_snap(0.0))
    for i in range(1, 21):
        session.add(i * 0.5, ranked_snap(i * 0.5))
    final = session.final_verdict()
    straggler = final.bottleneck.straggler
    assert straggler is not None and straggler.rank == 1
    assert straggler.cause.value == "Data"
    figures = session.final_ranks()
    assert [f.rank for f in figures] == [0, 1], "one entry per rank, in rank order, none for the pod's gauge"
    assert figures[1].data_wait_ratio is not None and figures[1].data_wait_ratio > 0.5
    assert session.steps == pytest.approx(10.0 / 0.03), "progress counts a job's steps once, not per rank"


def test_a_single_process_run_lists_no_ranks() -> None:
    session = LocalSession(window_seconds=2.0)
    for i in range(10):
        session.add(i * 0.5, snap(i * 5, i * 0.4, i * 0.5))
    assert session.final_ranks() == []


def test_dam_run_gpu_model_alone_gets_peak_and_bandwidth_from_the_gpu_table() -> None:
    """`dam run --gpu-model "NVIDIA H100 80GB HBM3"` with the probe's declared FLOPs per step:
    the table fills in peak FLOP/s and bandwidth, so the verdict has MFU and the ridge point."""
    from dam_operator.diagnosis.model import Hardware
    from dam_operator.local.run import _hardware, _parse_args

    args = _parse_args(["--gpu-model", "NVIDIA H100 80GB HBM3", "--", "python", "train.py"])
    hardware = _hardware(args)
    assert hardware == Hardware(gpu_model="NVIDIA H100 80GB HBM3")
    session = LocalSession(window_seconds=2.0, hardware=hardware)
    t = steps = wait = step = 0.0
    for _ in range(12):
        session.add(
            t,
            Snapshot(
                [
                    Sample(names.STEPS_TOTAL, (), steps),
                    Sample(names.DATALOADER_WAIT_SECONDS_TOTAL, (), wait),
                    Sample(names.STEP_SECONDS_TOTAL, (), step),
                    Sample(names.MODEL_FLOPS_PER_STEP, (), 1e13),
                    Sample(names.GPU_UTILIZATION_RATIO, (("gpu", "0"),), 0.9),
                ]
            ),
        )
        t += 0.5
        steps += 5
        wait += 0.01
        step += 0.5
    metrics = session.final_verdict().metrics
    assert metrics.ridge_point is not None and metrics.ridge_point > 100
    assert metrics.mfu is not None and 0 < metrics.mfu < 1
