"""The sidecar exports the probe's goodput, badput by cause and FLOPs per step (docs/metrics.md)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import dam_probe
from dam_contract import names as n
from dam_contract.snapshot import Snapshot
from dam_probe import _checkpoint
from dam_probe._core import Probe
from dam_probe.layout import ProbeRecord, encode, probe_path
from dam_sidecar.collector import build_collector
from dam_sidecar.settings import SidecarSettings


def _scrape(directory: str) -> Snapshot:
    collector = build_collector(SidecarSettings(probe_dir=directory, port=0), use_nvml=False)
    try:
        collector.sample_now()
        return collector.snapshot()
    finally:
        collector.close()


def _value(snap: Snapshot, name: str, **labels: str) -> float:
    for s in snap.samples(name):
        if all(s.label(k) == v for k, v in labels.items()):
            return s.value
    raise AssertionError(f"{name}{labels} not exported: {sorted(snap.names())}")


def test_a_real_probe_s_goodput_and_badput_are_exported_by_cause(probe: Probe) -> None:
    save = _checkpoint.timed_save(lambda obj, path: time.sleep(0.05), probe)
    probe.goodput.checkpoints_on = True
    for i, _ in enumerate(dam_probe.instrument(list(range(12)))):
        time.sleep(0.002)
        if i == 5:
            save({}, "unused")
    time.sleep(0.05)
    probe.publish(time.perf_counter_ns())
    snap = _scrape(probe.directory)
    good = _value(snap, n.GOODPUT_SECONDS_TOTAL)
    causes = {c: _value(snap, n.BADPUT_SECONDS_TOTAL, cause=c) for c in n.BADPUT_CAUSES}
    assert set(causes) == {"startup", "data-wait", "communication", "checkpoint", "other"}
    assert causes["checkpoint"] >= 0.05
    assert causes["communication"] == 0.0
    assert causes["other"] >= 0.05
    assert causes["data-wait"] == pytest.approx(_value(snap, n.DATALOADER_WAIT_SECONDS_TOTAL))
    assert good >= 12 * 0.002
    assert _value(snap, n.CHECKPOINTS_TOTAL) == 1
    step = _value(snap, n.STEP_SECONDS_TOTAL)
    assert good + causes["data-wait"] + causes["checkpoint"] == pytest.approx(step, abs=1e-3)


def _record(pid: int, **extra: object) -> ProbeRecord:
    fields: dict[str, object] = {
        "pid": pid,
        "start_time_ns": 1,
        "steps": 10,
        "wait_ns": 2 * 10**9,
        "step_ns": 8 * 10**9,
        "last_update_ns": time.time_ns(),
        "batch_size": 4,
        "flops_per_step": 0.0,
        "closed": False,
    }
    fields.update(extra)
    return ProbeRecord(**fields)  # type: ignore[arg-type]


def test_measured_and_declared_flops_carry_their_source_and_unknown_goodput_is_absent(
    tmp_path: Path,
) -> None:
    directory = str(tmp_path)
    old = _record(os.getpid())  # a probe that knows no goodput (an older writer)
    with open(probe_path(directory, os.getpid()), "wb") as fh:
        fh.write(encode(old))
    snap = _scrape(directory)
    assert not snap.samples(n.GOODPUT_SECONDS_TOTAL) and not snap.samples(n.BADPUT_SECONDS_TOTAL)
    assert not snap.samples(n.MODEL_FLOPS_PER_STEP)

    measured = _record(
        os.getpid(),
        process_start_ns=1,
        startup_ns=3 * 10**9,
        productive_ns=5 * 10**9,
        other_ns=10**9,
        flops_state=1,
        measured_flops_per_step=2.5e9,
        flops_measured_ns=10**6,
        flops_measured_steps=1,
    )
    with open(probe_path(directory, os.getpid()), "wb") as fh:
        fh.write(encode(measured))
    snap = _scrape(directory)
    assert _value(snap, n.MODEL_FLOPS_PER_STEP, source="measured") == 2.5e9
    assert _value(snap, n.GOODPUT_SECONDS_TOTAL) == 5.0
    assert _value(snap, n.BADPUT_SECONDS_TOTAL, cause="startup") == 3.0
    # Saves not timed: unknown, so absent (not 0: a save outside the hooks would read as productive).
    assert not [s for s in snap.samples(n.BADPUT_SECONDS_TOTAL) if s.label("cause") == "checkpoint"]
    assert not snap.samples(n.CHECKPOINTS_TOTAL)

    declared = _record(
        os.getpid(),
        flops_per_step=4e9,
        **{
            k: v
            for k, v in measured.__dict__.items()
            if k
            in (
                "process_start_ns",
                "startup_ns",
                "productive_ns",
                "other_ns",
                "flops_state",
                "measured_flops_per_step",
                "flops_measured_ns",
                "flops_measured_steps",
            )
        },
    )
    with open(probe_path(directory, os.getpid()), "wb") as fh:
        fh.write(encode(declared))
    snap = _scrape(directory)
    assert _value(snap, n.MODEL_FLOPS_PER_STEP, source="declared") == 4e9


def _saves(steps: int, last_ns: int, last_steps: int, saves: int) -> dict[str, object]:
    return {
        "steps": steps,
        "checkpoint_ns": saves * 10**8,
        "checkpoint_step_ns": 0,
        "checkpoints": saves,
        "last_checkpoint_ns": last_ns,
        "last_checkpoint_steps": last_steps,
    }


def test_a_real_probe_s_progress_since_its_latest_save_is_exported(probe: Probe) -> None:
    save = _checkpoint.timed_save(lambda obj, path: None, probe)
    probe.goodput.checkpoints_on = True
    before = time.time()
    for i, _ in enumerate(dam_probe.instrument(list(range(12)))):
        if i == 4:
            save({}, "unused")
    probe.publish(time.perf_counter_ns())
    snap = _scrape(probe.directory)
    steps = _value(snap, n.STEPS_TOTAL)
    # The save ran in the fifth step (after 5 batches): every later batch is progress at risk.
    assert _value(snap, n.STEPS_SINCE_CHECKPOINT) == steps - 5
    assert before <= _value(snap, n.LAST_CHECKPOINT_TIMESTAMP_SECONDS) <= time.time()


def test_steps_since_checkpoint_count_every_step_without_a_save_and_the_latest_save_outlives_its_process(
    tmp_path: Path,
) -> None:
    directory = str(tmp_path)
    path = probe_path(directory, os.getpid())
    untimed = _record(os.getpid())  # saves not timed (torch never loaded): unknown, not zero
    with open(path, "wb") as fh:
        fh.write(encode(untimed))
    snap = _scrape(directory)
    assert not snap.samples(n.STEPS_SINCE_CHECKPOINT)
    assert not snap.samples(n.LAST_CHECKPOINT_TIMESTAMP_SECONDS)

    collector = build_collector(SidecarSettings(probe_dir=directory, port=0), use_nvml=False)
    try:
        with open(path, "wb") as fh:
            fh.write(encode(_record(os.getpid(), rank=3, **_saves(10, 55 * 10**9, 3, 2))))
        collector.sample_now()
        snap = collector.snapshot()
        assert _value(snap, n.STEPS_SINCE_CHECKPOINT, rank="3") == 7
        assert _value(snap, n.LAST_CHECKPOINT_TIMESTAMP_SECONDS, rank="3") == 55.0
        # The container restarted: a new process of rank 3 that saved nothing yet has all its
        # steps at risk; the rank's latest save is still the old process's.
        with open(path, "wb") as fh:
            fh.write(encode(_record(os.getpid(), rank=3, start_time_ns=2, **_saves(4, 0, 0, 0))))
        collector.sample_now()
        snap = collector.snapshot()
        assert _value(snap, n.STEPS_SINCE_CHECKPOINT, rank="3") == 4
        assert _value(snap, n.LAST_CHECKPOINT_TIMESTAMP_SECONDS, rank="3") == 55.0
    finally:
        collector.close()


def test_why_flops_are_not_counted_is_exported_while_they_are_unknown(tmp_path: Path) -> None:
    from dam_probe import layout

    codes = [
        getattr(layout, f"FLOPS_REASON_{r.upper().replace('-', '_')}") for r in n.FLOPS_UNAVAILABLE_REASONS
    ]
    assert codes == list(layout.FLOPS_REASONS)  # the label of code i is entry i - 1
    directory = str(tmp_path)
    failed = _record(
        os.getpid(),
        rank=3,
        process_start_ns=1,
        startup_ns=10**9,
        productive_ns=10**9,
        other_ns=0,
        flops_state=layout.FLOPS_UNAVAILABLE,
        flops_reason=layout.FLOPS_REASON_COUNTER_ERROR,
        flops_detail="dam_test.scaled.default: ValueError",
    )
    collector = build_collector(SidecarSettings(probe_dir=directory, port=0), use_nvml=False)
    try:
        with open(probe_path(directory, os.getpid()), "wb") as fh:
            fh.write(encode(failed))
        collector.sample_now()
        (sample,) = collector.snapshot().samples(n.MODEL_FLOPS_UNAVAILABLE)
        assert dict(sample.labels) == {
            "rank": "3",
            "reason": "counter-error",
            "detail": "dam_test.scaled.default: ValueError",
        }
        assert sample.value == 1.0
        # The same process declares its FLOPs later: the reason is no longer exported.
        declared = _record(os.getpid(), rank=3, flops_per_step=4e9)
        with open(probe_path(directory, os.getpid()), "wb") as fh:
            fh.write(encode(declared))
        collector.sample_now()
        snap = collector.snapshot()
        assert _value(snap, n.MODEL_FLOPS_PER_STEP, source="declared") == 4e9
        assert not snap.samples(n.MODEL_FLOPS_UNAVAILABLE)
    finally:
        collector.close()
