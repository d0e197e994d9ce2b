"""Goodput in the cluster: the pods' cumulative counters summed into the job's life so far, restarts
counted from the kubelet's container status, the operator's accelerator-seconds counter by use."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from prometheus_client import CollectorRegistry

from dam_contract import names
from dam_contract.snapshot import Sample, Snapshot, parse_snapshot
from dam_operator.cluster.runtime.opmetrics import OperatorMetrics
from dam_operator.cluster.steps import metric_names as mn
from dam_operator.cluster.steps import status as st
from dam_operator.cluster.steps.goodput import (
    MAX_HANDOVER_CHARS,
    MAX_HANDOVER_PROCESSES,
    PROBE_CAUSES,
    STATUS_KEYS,
    GoodputLedger,
    job_steps_since_checkpoint,
    read_pod,
)
from dam_operator.cluster.steps.registry import PodInfo, RestartRecord, restart_record
from dam_operator.cluster.steps.spec import parse_spec
from dam_operator.cluster.steps.window_step import ProfileState, WindowInputs, WindowSettings, decide_window
from dam_operator.diagnosis.hysteresis import Stabilizer

ROOT = Path(__file__).resolve().parents[3]
T0 = 1_800_000_000.0  # Unix seconds: a scrape time


def _iso(t: float) -> str:
    return st.format_time(dt.datetime.fromtimestamp(t, dt.UTC))


def _pod(
    name: str,
    *,
    uid: str = "",
    restart: RestartRecord | None = None,
    phase: str = "Running",
    owner: str | None = None,
) -> PodInfo:
    return PodInfo(
        "ns",
        name,
        {"app": "t"},
        uid=uid or f"uid-{name}",
        pod_ip="10.0.0.1",
        phase=phase,
        instrumented=True,
        restart=restart,
        owner=owner,
    )


def _snap(
    at: float,
    processes: Mapping[str, Mapping[str, float | None]],
    *,
    gpus: int | None = 1,
    nvml: bool = True,
) -> Snapshot:
    """A sidecar's scrape: per process (rank label, "" without) its productive seconds and badput by
    cause, and, where given, its ``steps``, ``since`` (steps since its latest checkpoint) and ``up``
    (``dam_rank_up``: 0 once its processes ended)."""
    samples = []
    for rank, figures in processes.items():
        labels = ((names.RANK_LABEL, rank),) if rank else ()
        samples.append(Sample(names.GOODPUT_SECONDS_TOTAL, labels, figures.get("productive", 0.0)))
        for name, key in (
            (names.STEPS_TOTAL, "steps"),
            (names.STEPS_SINCE_CHECKPOINT, "since"),
            (names.RANK_UP, "up"),
            (names.PROCESS_RESTARTS_TOTAL, "restarts"),
            (names.PROCESS_RESTART_GAP_SECONDS_TOTAL, "gap"),
        ):
            if key in figures:
                samples.append(Sample(name, labels, figures[key]))
        if "world" in figures:
            info = (*labels, ("local_rank", "0"), ("world_size", str(int(figures["world"] or 0))))
            samples.append(Sample(names.PROCESS_RANK_INFO, info, 1.0))
        for cause in PROBE_CAUSES:
            if figures.get(cause, 0.0) is not None:  # None: not measured, the series absent
                samples.append(
                    Sample(names.BADPUT_SECONDS_TOTAL, (("cause", cause), *labels), figures.get(cause, 0.0))
                )
    for i in range(gpus or 0):
        samples.append(Sample(names.GPU_INFO, (("gpu", str(i)), ("uuid", f"GPU-{i}"), ("name", "H100")), 1))
    if nvml:
        samples.append(Sample(names.NVML_UP, (), 1.0 if gpus is not None else 0.0))
    return Snapshot(samples, at)


def test_the_operators_uses_are_productive_the_probes_causes_restart_and_stalled() -> None:
    """Each second the probe reports under a cause, a restart's downtime and a stalled window's
    ``other``, reach the status under that cause and the exported counter under that use, times the
    job's 2 GPUs: every figure differs, so a cause routed to another key, dropped or counted twice
    shows."""
    ledger = GoodputLedger()
    before = RestartRecord(count=0, finished_at=None, started_at=None, terminated_at=None)
    first = {
        "productive": 61,
        "startup": 3,
        "data-wait": 5,
        "communication": 7,
        "checkpoint": 11,
        "other": 13,
    }
    ledger.update(pods=[_pod("a", restart=before)], answered={"a": _snap(T0, {"": first}, gpus=2)})
    # Down from T0+37 to T0+54 (the new container's start, and its process's: 6 s before T0+60);
    # the new process took 2 s to its first batch.
    after = RestartRecord(count=1, finished_at=_iso(T0 + 37), started_at=_iso(T0 + 54), terminated_at=None)
    ledger.update(
        pods=[_pod("a", restart=after)],
        answered={"a": _snap(T0 + 60, {"": {"productive": 4, "startup": 2}}, gpus=2)},
        now=T0 + 60,
    )
    # Stalled since T0+65 (after that update): the 17 s of other that came since are the stall's.
    ledger.update(
        pods=[_pod("a", restart=after)],
        answered={"a": _snap(T0 + 90, {"": {"productive": 4, "startup": 2, "other": 17}}, gpus=2)},
        stalled_since=T0 + 65,
        now=T0 + 90,
    )
    out = ledger.status()
    assert out is not None
    seconds = {
        "startup": 3,
        "data-wait": 5,
        "communication": 7,
        "checkpoint": 11,
        "other": 13,
        "restart": 19,
        "stalled": 17,
    }
    assert out["badputSeconds"] == {STATUS_KEYS[use]: pytest.approx(v) for use, v in seconds.items()}
    assert out["productiveSeconds"] == pytest.approx(65.0)
    assert out["acceleratorSecondsLost"] == pytest.approx(2 * sum(seconds.values()))
    expected = {use: 2.0 * v for use, v in {**seconds, "productive": 65}.items()}
    assert ledger.accelerator_seconds == pytest.approx(expected)

    registry = CollectorRegistry()
    OperatorMetrics(registry).observe_goodput(
        "ns", "p", accelerator_seconds=ledger.accelerator_seconds, ratio=out["ratio"]
    )
    exported = {use: v for (_, _, use), v in _series(registry, mn.PROFILE_ACCELERATOR_SECONDS_TOTAL).items()}
    assert (
        set(exported)
        == set(mn.ACCELERATOR_USES)
        == {mn.USE_PRODUCTIVE, *names.BADPUT_CAUSES, mn.USE_RESTART, mn.USE_STALLED}
    )
    assert exported == pytest.approx(expected)


def test_the_job_is_the_mean_of_its_ranks_and_accelerator_seconds_are_badput_times_gpus() -> None:
    ledger = GoodputLedger()
    pods = [_pod("a"), _pod("b")]
    ledger.update(
        pods=pods,
        answered={
            "a": _snap(T0, {"0": {"productive": 80, "startup": 10, "data-wait": 10}}, gpus=2),
            "b": _snap(T0, {"1": {"productive": 60, "startup": 10, "data-wait": 30}}, gpus=2),
        },
    )
    out = ledger.status()
    assert out is not None
    # Each rank lived 100 s: the job's elapsed is 100 s, not 200.
    assert out["elapsedSeconds"] == pytest.approx(100.0)
    assert out["productiveSeconds"] == pytest.approx(70.0)
    assert out["ratio"] == pytest.approx(0.70)
    assert out["badputSeconds"] == {
        "startup": 10.0,
        "dataWait": 20.0,
        "communication": 0.0,
        "checkpoint": 0.0,
        "restart": 0.0,
        "other": 0.0,
        "stalled": 0.0,
    }
    # Rank 0 lost 20 s on 2 GPUs, rank 1 40 s on 2 GPUs.
    assert out["acceleratorSecondsLost"] == pytest.approx(120.0)
    assert out["accelerators"] == 4
    assert ledger.accelerator_seconds["productive"] == pytest.approx(280.0)


def test_later_windows_add_only_what_each_process_did_since_its_last_scrape() -> None:
    ledger = GoodputLedger()
    pods = [_pod("a")]
    ledger.update(pods=pods, answered={"a": _snap(T0, {"": {"productive": 50, "startup": 10}})})
    ledger.update(
        pods=pods, answered={"a": _snap(T0 + 30, {"": {"productive": 70, "startup": 10, "other": 10}})}
    )
    ledger.update(pods=pods, answered={})  # a missed scrape adds nothing
    out = ledger.status()
    assert out is not None
    assert out["elapsedSeconds"] == pytest.approx(90.0)
    assert out["productiveSeconds"] == pytest.approx(70.0)
    assert out["badputSeconds"]["other"] == pytest.approx(10.0)


def test_a_series_that_went_down_is_a_new_process_counted_whole() -> None:
    ledger = GoodputLedger()
    pods = [_pod("a")]
    ledger.update(pods=pods, answered={"a": _snap(T0, {"": {"productive": 100, "startup": 5}})})
    ledger.update(pods=pods, answered={"a": _snap(T0 + 60, {"": {"productive": 20, "startup": 5}})})
    out = ledger.status()
    assert out is not None
    assert out["productiveSeconds"] == pytest.approx(120.0)
    assert out["badputSeconds"]["startup"] == pytest.approx(10.0)


def test_a_container_restart_adds_its_downtime_and_the_new_processs_startup_as_restart() -> None:
    ledger = GoodputLedger()
    before = RestartRecord(count=0, finished_at=None, started_at=None, terminated_at=None)
    ledger.update(
        pods=[_pod("a", restart=before)], answered={"a": _snap(T0, {"": {"productive": 100, "startup": 5}})}
    )
    # It died at T0+10, the kubelet started it again at T0+40; the new process took 8 s to its first batch.
    after = RestartRecord(count=1, finished_at=_iso(T0 + 10), started_at=_iso(T0 + 40), terminated_at=None)
    ledger.update(
        pods=[_pod("a", restart=after)],
        answered={"a": _snap(T0 + 60, {"": {"productive": 12, "startup": 8}})},
    )
    out = ledger.status()
    assert out is not None
    assert out["badputSeconds"]["restart"] == pytest.approx(30.0 + 8.0)
    assert out["badputSeconds"]["startup"] == pytest.approx(5.0)  # the first process's only
    assert out["productiveSeconds"] == pytest.approx(112.0)
    assert out["restarts"] == 1
    assert out["acceleratorSecondsLost"] == pytest.approx(5.0 + 38.0)
    # The new process's startup goes on counting as restart until its first batch, and no further.
    ledger.update(
        pods=[_pod("a", restart=after)],
        answered={"a": _snap(T0 + 90, {"": {"productive": 40, "startup": 8}})},
    )
    out = ledger.status()
    assert out is not None
    assert out["badputSeconds"]["restart"] == pytest.approx(38.0)
    assert out["productiveSeconds"] == pytest.approx(140.0)


def test_a_restart_whose_old_probe_file_is_still_summed_in_counts_no_time_twice() -> None:
    """The sidecar still reads the dead process's file: the pod's sum does not go down."""
    ledger = GoodputLedger()
    before = RestartRecord(count=0, finished_at=None, started_at=None, terminated_at=None)
    ledger.update(
        pods=[_pod("a", restart=before)], answered={"a": _snap(T0, {"": {"productive": 100, "startup": 5}})}
    )
    after = RestartRecord(count=1, finished_at=_iso(T0 + 10), started_at=_iso(T0 + 20), terminated_at=None)
    ledger.update(
        pods=[_pod("a", restart=after)],
        answered={"a": _snap(T0 + 60, {"": {"productive": 100 + 30, "startup": 5 + 4}})},
    )
    out = ledger.status()
    assert out is not None
    assert out["productiveSeconds"] == pytest.approx(130.0)
    assert out["badputSeconds"]["restart"] == pytest.approx(10.0 + 4.0)
    assert out["badputSeconds"]["startup"] == pytest.approx(5.0)


def test_a_container_restart_moves_the_progress_since_the_last_checkpoint_from_productive_to_restart() -> (
    None
):
    ledger = GoodputLedger()
    before = RestartRecord(count=0, finished_at=None, started_at=None, terminated_at=None)
    # 200 steps in 100 productive seconds (0.5 s a step); the latest save was 40 steps ago.
    ledger.update(
        pods=[_pod("a", restart=before)],
        answered={"a": _snap(T0, {"0": {"productive": 100, "startup": 5, "steps": 200, "since": 40}})},
    )
    assert ledger.accelerator_seconds["productive"] == pytest.approx(100.0)
    after = RestartRecord(count=1, finished_at=_iso(T0 + 10), started_at=_iso(T0 + 40), terminated_at=None)
    ledger.update(
        pods=[_pod("a", restart=after)],
        answered={"a": _snap(T0 + 60, {"0": {"productive": 12, "startup": 8, "steps": 24, "since": 24}})},
    )
    out = ledger.status()
    assert out is not None
    # 30 s down, 8 s to the first batch, and the 40 steps x 0.5 s the new process redoes.
    assert out["badputSeconds"]["restart"] == pytest.approx(30.0 + 8.0 + 20.0)
    assert out["productiveSeconds"] == pytest.approx(100.0 + 12.0 - 20.0)
    assert out["elapsedSeconds"] == pytest.approx(100 + 5 + 12 + 30 + 8)  # moved, not added
    assert out["acceleratorSecondsLost"] == pytest.approx(5.0 + 58.0)
    # The productive counter never goes down: 12 s gained, 20 s owed; it holds, then pays the rest.
    assert ledger.accelerator_seconds["productive"] == pytest.approx(100.0)
    assert ledger.accelerator_seconds["restart"] == pytest.approx(58.0)
    ledger.update(
        pods=[_pod("a", restart=after)],
        answered={"a": _snap(T0 + 90, {"0": {"productive": 40, "startup": 8, "steps": 80, "since": 80}})},
    )
    assert ledger.accelerator_seconds["productive"] == pytest.approx(100.0 + 28.0 - 8.0)
    out = ledger.status()
    assert out is not None
    assert out["productiveSeconds"] == pytest.approx(120.0)
    assert out["badputSeconds"]["restart"] == pytest.approx(58.0)


def test_a_process_that_never_saved_loses_all_its_productive_time_at_a_restart() -> None:
    ledger = GoodputLedger()
    before = RestartRecord(count=0, finished_at=None, started_at=None, terminated_at=None)
    ledger.update(
        pods=[_pod("a", restart=before)],
        answered={"a": _snap(T0, {"": {"productive": 100, "startup": 5, "steps": 200, "since": 200}})},
    )
    after = RestartRecord(count=1, finished_at=_iso(T0 + 10), started_at=_iso(T0 + 40), terminated_at=None)
    ledger.update(
        pods=[_pod("a", restart=after)],
        answered={"a": _snap(T0 + 60, {"": {"productive": 12, "startup": 8, "steps": 24, "since": 24}})},
    )
    out = ledger.status()
    assert out is not None
    assert out["badputSeconds"]["restart"] == pytest.approx(30.0 + 8.0 + 100.0)
    assert out["productiveSeconds"] == pytest.approx(12.0)
    assert out["ratio"] == pytest.approx(12.0 / 155.0, abs=1e-4)


def test_a_scrape_that_no_longer_tells_keeps_the_last_figure_and_a_second_restart_counts_only_its_own() -> (
    None
):
    ledger = GoodputLedger()
    zero = RestartRecord(count=0, finished_at=None, started_at=None, terminated_at=None)
    ledger.update(
        pods=[_pod("a", restart=zero)],
        answered={"a": _snap(T0, {"0": {"productive": 100, "steps": 200, "since": 40}})},
    )
    # The process died; its file was folded: the scrape still has the carried counters, no gauge.
    ledger.update(pods=[_pod("a", restart=zero)], answered={"a": _snap(T0 + 30, {"0": {"productive": 100}})})
    one = RestartRecord(count=1, finished_at=_iso(T0 + 10), started_at=_iso(T0 + 40), terminated_at=None)
    ledger.update(
        pods=[_pod("a", restart=one)],
        answered={"a": _snap(T0 + 60, {"0": {"productive": 110, "steps": 220}})},
    )
    out = ledger.status()
    assert out is not None
    assert out["badputSeconds"]["restart"] == pytest.approx(30.0 + 20.0)
    # The new process told nothing yet: a second restart adds its downtime only, not the first's progress.
    two = RestartRecord(count=2, finished_at=_iso(T0 + 70), started_at=_iso(T0 + 80), terminated_at=None)
    ledger.update(
        pods=[_pod("a", restart=two)],
        answered={"a": _snap(T0 + 90, {"0": {"productive": 115, "steps": 230}})},
    )
    out = ledger.status()
    assert out is not None
    assert out["badputSeconds"]["restart"] == pytest.approx(50.0 + 10.0)
    assert out["restarts"] == 2


def test_progress_at_risk_is_its_steps_since_the_save_times_productive_seconds_per_step_at_most_all() -> None:
    reading = read_pod(
        _snap(
            T0,
            {
                "0": {"productive": 100, "steps": 200, "since": 40},
                "1": {"productive": 100, "steps": 200, "since": 900},  # more than it did: all of it
                "2": {"productive": 100, "steps": 200, "since": float("nan")},  # garbage: unknown
                "3": {"productive": 100, "steps": 200},  # no gauge (an older sidecar): unknown
            },
        )
    )
    assert reading is not None
    assert reading.at_risk == {"0": pytest.approx(20.0), "1": pytest.approx(100.0)}


def _replace_failed_w1(ledger: GoodputLedger) -> None:
    """w-1 (rank 1) failed at T0+5; the Job controller made w-1b, whose rank-1 process started at
    T0+65 (60 s after the failure) and has been running 15 s, 5 of them before its first batch."""
    failed = _pod(
        "w-1",
        phase="Failed",
        restart=RestartRecord(count=0, finished_at=None, started_at=None, terminated_at=_iso(T0 + 5)),
    )
    ledger.update(
        pods=[_pod("w-0"), _pod("w-1b")],
        finished=[failed],
        answered={
            "w-0": _snap(T0 + 80, {"0": {"productive": 100, "startup": 10, "communication": 70}}),
            "w-1b": _snap(T0 + 80, {"1": {"productive": 10, "startup": 5}}),
        },
    )


def test_a_failed_pods_replacement_taking_its_rank_adds_the_gap_as_restart() -> None:
    ledger = GoodputLedger()
    ledger.update(
        pods=[_pod("w-0"), _pod("w-1")],
        answered={
            "w-0": _snap(T0, {"0": {"productive": 90, "startup": 10}}),
            "w-1": _snap(T0, {"1": {"productive": 90, "startup": 10}}),
        },
    )
    _replace_failed_w1(ledger)
    out = ledger.status()
    assert out is not None
    assert out["restarts"] == 1
    # Process-seconds over the job's 2 processes: from w-1's last scrape (T0; what it did until its
    # end at T0+5 was never counted) to its replacement's start (T0+65), plus 5 s of startup.
    assert out["badputSeconds"]["restart"] == pytest.approx(70.0 / 2)
    assert out["badputSeconds"]["startup"] == pytest.approx(10.0)
    assert out["acceleratorSecondsLost"] == pytest.approx(10 + 10 + 70 + 70)


def test_a_failed_pods_replacement_redoes_the_progress_since_its_last_checkpoint() -> None:
    ledger = GoodputLedger()
    ledger.update(
        pods=[_pod("w-0"), _pod("w-1")],
        answered={
            "w-0": _snap(T0, {"0": {"productive": 90, "startup": 10, "steps": 90, "since": 0}}),
            "w-1": _snap(T0, {"1": {"productive": 90, "startup": 10, "steps": 90, "since": 30}}),
        },
    )
    _replace_failed_w1(ledger)
    out = ledger.status()
    assert out is not None
    # The 30 steps of 1 s rank 1 did after its last save are redone: (65 + 5 + 30) over 2 processes.
    assert out["badputSeconds"]["restart"] == pytest.approx(100.0 / 2)
    assert out["productiveSeconds"] == pytest.approx(90.0 + (10 + 10 - 30) / 2)
    assert ledger.accelerator_seconds["productive"] == pytest.approx(180.0)  # held, never down
    assert ledger.owed_productive == pytest.approx(10.0)


def _w1_deleted_and_replaced(ledger: GoodputLedger, *, up: float) -> None:
    """w-0 and w-1 (ranks 0 and 1) scraped at T0 (w-1's processes up or not), then w-1 gone from
    the pods (deleted: never seen Failed or Succeeded) and w-1b taking rank 1, its process started
    at T0+40 (``_snap``'s start: its time less its seconds), 5 s of them before its first batch."""
    ledger.update(
        pods=[_pod("w-0"), _pod("w-1")],
        answered={
            "w-0": _snap(T0, {"0": {"productive": 90, "startup": 10, "steps": 90, "since": 20}}),
            "w-1": _snap(T0, {"1": {"productive": 90, "startup": 10, "steps": 90, "since": 90, "up": up}}),
        },
    )
    ledger.update(
        pods=[_pod("w-0"), _pod("w-1b")],
        answered={
            "w-0": _snap(T0 + 60, {"0": {"productive": 100, "startup": 10, "communication": 50}}),
            "w-1b": _snap(T0 + 60, {"1": {"productive": 15, "startup": 5}}),
        },
    )


def test_a_pod_deleted_while_it_ran_is_replaced_by_the_pod_taking_its_rank_from_its_last_scrape() -> None:
    """Issue 28: one Pod of a 2-Pod job deleted mid-run (kubectl delete, an eviction) is never seen
    Failed; the Pod that takes its rank restarts it. From its last scrape (T0) to the new process's
    start (T0+40), plus its 5 s of startup, plus the 20 steps of 1 s since the job's checkpoint
    (rank 0's save: rank 1 never saved), over the job's 2 processes."""
    ledger = GoodputLedger()
    _w1_deleted_and_replaced(ledger, up=1.0)
    out = ledger.status()
    assert out is not None
    assert out["restarts"] == 1
    assert out["badputSeconds"]["restart"] == pytest.approx((40 + 5 + 20) / 2)
    assert out["badputSeconds"]["startup"] == pytest.approx(10.0)
    assert out["productiveSeconds"] == pytest.approx(90.0 + (10 + 15 - 20) / 2)


def test_a_pod_gone_after_its_processes_ended_is_no_restart_for_the_next_pod_of_its_rank() -> None:
    """A Pod whose ranks had all ended (``dam_rank_up`` 0) and that vanished before the operator saw
    it Succeeded (a short ``ttlSecondsAfterFinished``): the next Pod of its rank is a new run."""
    ledger = GoodputLedger()
    _w1_deleted_and_replaced(ledger, up=0.0)
    out = ledger.status()
    assert out is not None
    assert out["restarts"] == 0
    assert out["badputSeconds"]["restart"] == pytest.approx(0.0)
    assert out["badputSeconds"]["startup"] == pytest.approx(10.0 + 5 / 2)


def test_a_deleted_pods_rank_taken_by_a_pod_of_another_job_is_a_new_run_not_a_restart() -> None:
    """The vacated place belongs to the deleted Pod's controller: the next Job of the same profile
    (another owner uid) starts a new run, hours later or not."""
    ledger = GoodputLedger()
    ledger.update(
        pods=[_pod("a", owner="job-1")],
        answered={"a": _snap(T0, {"0": {"productive": 90, "startup": 10, "up": 1.0}})},
    )
    ledger.update(
        pods=[_pod("b", owner="job-2")],
        answered={"b": _snap(T0 + 600, {"0": {"productive": 10, "startup": 5}})},
    )
    out = ledger.status()
    assert out is not None
    assert (out["restarts"], out["badputSeconds"]["restart"]) == (0, 0.0)
    assert out["badputSeconds"]["startup"] == pytest.approx(15.0)


def test_a_pod_of_the_same_job_taking_a_deleted_pods_rank_restarts_it() -> None:
    ledger = GoodputLedger()
    ledger.update(
        pods=[_pod("a", owner="job-1")],
        answered={
            "a": _snap(T0, {"0": {"productive": 90, "startup": 10, "steps": 90, "since": 90, "up": 1.0}})
        },
    )
    ledger.update(
        pods=[_pod("a2", owner="job-1")],
        answered={"a2": _snap(T0 + 60, {"0": {"productive": 10, "startup": 5}})},
    )
    out = ledger.status()
    assert out is not None
    # Down from a's last scrape (T0) to a2's process start (T0+45), 5 s of startup, and a's 90 s
    # of productive time: it never saved.
    assert out["restarts"] == 1
    assert out["badputSeconds"]["restart"] == pytest.approx(45 + 5 + 90)
    assert out["productiveSeconds"] == pytest.approx(10.0)


def test_a_failed_pod_scraped_after_its_trainer_ended_restarts_from_its_end_not_its_scrape() -> None:
    """The sidecar answered once more after the trainer failed (its last scrape after
    ``finishedAt``): the downtime starts at the end the kubelet recorded."""
    ledger = GoodputLedger()
    ledger.update(
        pods=[_pod("w-1")],
        answered={"w-1": _snap(T0 + 8, {"1": {"productive": 90, "startup": 10, "since": 0}})},
    )
    failed = _pod(
        "w-1",
        phase="Failed",
        restart=RestartRecord(count=0, finished_at=None, started_at=None, terminated_at=_iso(T0 + 5)),
    )
    ledger.update(
        pods=[_pod("w-1b")],
        finished=[failed],
        answered={"w-1b": _snap(T0 + 80, {"1": {"productive": 10, "startup": 5}})},
    )
    out = ledger.status()
    assert out is not None
    assert out["badputSeconds"]["restart"] == pytest.approx((80 - 15 - 5) + 5)


def test_the_time_from_the_containers_start_to_the_training_process_is_startup() -> None:
    """An entrypoint that installs packages for 30 s before it runs python: the probe's startup
    starts at the process; the container started 30 s before it (``state.running.startedAt``)."""
    ledger = GoodputLedger()
    record = RestartRecord(0, None, None, None, running_since=_iso(T0 - 30))
    # At T0+20 the process has lived 20 s (its figures add up): it started at T0.
    ledger.update(
        pods=[_pod("a", restart=record)],
        answered={"a": _snap(T0 + 20, {"": {"productive": 15, "startup": 5}})},
    )
    out = ledger.status()
    assert out is not None
    assert out["badputSeconds"]["startup"] == pytest.approx(30 + 5)
    assert out["elapsedSeconds"] == pytest.approx(50.0)


def test_a_restarted_container_adds_its_start_to_the_new_process_to_the_restart() -> None:
    ledger = GoodputLedger()
    before = RestartRecord(0, None, None, None, running_since=_iso(T0 - 20))
    ledger.update(
        pods=[_pod("a", restart=before)], answered={"a": _snap(T0, {"": {"productive": 15, "startup": 5}})}
    )
    # Ended at T0+5, the new container started at T0+15, its process at T0+25 (10 s old at T0+35).
    after = RestartRecord(1, _iso(T0 + 5), _iso(T0 + 15), None, running_since=_iso(T0 + 15))
    ledger.update(
        pods=[_pod("a", restart=after)], answered={"a": _snap(T0 + 35, {"": {"productive": 7, "startup": 3}})}
    )
    out = ledger.status()
    assert out is not None
    assert out["badputSeconds"]["restart"] == pytest.approx(10 + 10 + 3)
    assert out["badputSeconds"]["startup"] == pytest.approx(5.0)


def test_torchrun_restarting_its_ranks_inside_the_container_costs_the_gap_startup_and_lost_progress() -> None:
    """No container restart (the kubelet sees none): the sidecar counted rank 0's and rank 1's
    processes replaced, 6 s each from the old one's last publish to the new one's start; the new
    ones took 4 s to their first batch; the job's checkpoint (rank 0's save) was 10 steps of 1 s
    before. One restart (torchrun restarts its ranks together), 6 + 4 + 10 s a process."""
    ledger = GoodputLedger()
    first = {"productive": 50, "startup": 5, "steps": 50}
    ledger.update(
        pods=[_pod("a")],
        answered={"a": _snap(T0, {"0": first | {"since": 10}, "1": first | {"since": 50}})},
    )
    later = {"productive": 55, "startup": 9, "steps": 55, "restarts": 1, "gap": 6}
    ledger.update(pods=[_pod("a")], answered={"a": _snap(T0 + 30, {"0": later, "1": later})})
    out = ledger.status()
    assert out is not None
    assert out["restarts"] == 1
    assert out["badputSeconds"]["restart"] == pytest.approx(6 + 4 + 10)
    assert out["badputSeconds"]["startup"] == pytest.approx(5.0)
    assert out["productiveSeconds"] == pytest.approx(50 + 5 - 10)


def test_a_container_restart_the_sidecar_also_sees_as_a_new_process_of_the_rank_counts_once() -> None:
    """The kubelet restarted the training container (restartCount 1); the native sidecar, which
    lived on, counts the new process of rank 0 a restart too, a window later: not again."""
    ledger = GoodputLedger()
    before = RestartRecord(0, None, None, None)
    ledger.update(
        pods=[_pod("a", restart=before)], answered={"a": _snap(T0, {"0": {"productive": 50, "startup": 5}})}
    )
    after = RestartRecord(1, _iso(T0 + 5), _iso(T0 + 15), None, running_since=_iso(T0 + 15))
    ledger.update(
        pods=[_pod("a", restart=after)],
        answered={"a": _snap(T0 + 20, {"0": {"productive": 50, "startup": 10}})},
    )
    ledger.update(
        pods=[_pod("a", restart=after)],
        answered={"a": _snap(T0 + 40, {"0": {"productive": 65, "startup": 10, "restarts": 1, "gap": 10}})},
    )
    out = ledger.status()
    assert out is not None
    assert out["restarts"] == 1
    assert out["badputSeconds"]["restart"] == pytest.approx(10 + 5)  # down 10 s, 5 s to its first batch


def test_a_ranks_wait_behind_rank_0s_save_in_another_pod_is_checkpoint_not_communication() -> None:
    """Rank 0 (pod a) saved 8 s in the window; rank 1 (pod b) waited 9 s in collectives, 8 of
    them behind the save: checkpoint 8 s a process, communication 1 s over the two."""
    ledger = GoodputLedger()
    zero = {"productive": 10, "startup": 2, "checkpoint": 0, "communication": 0}
    ledger.update(
        pods=[_pod("a"), _pod("b")], answered={"a": _snap(T0, {"0": zero}), "b": _snap(T0, {"1": zero})}
    )
    ledger.update(
        pods=[_pod("a"), _pod("b")],
        answered={
            "a": _snap(T0 + 30, {"0": zero | {"productive": 30, "checkpoint": 8}}),
            "b": _snap(T0 + 30, {"1": zero | {"productive": 29, "communication": 9}}),
        },
    )
    out = ledger.status()
    assert out is not None
    assert out["badputSeconds"]["checkpoint"] == pytest.approx(8.0)
    assert out["badputSeconds"]["communication"] == pytest.approx(0.5)


def test_ranks_whose_pods_first_report_in_different_windows_count_in_the_jobs_seconds() -> None:
    """On a busy node rank 0's Pod reached its first batch (after 180 s of start-up) a window
    before rank 1's: its whole figures came while it was the only pod reporting. The job has 2
    ranks (``world_size``): its start-up is the ranks' mean, 180 s, not 180 + 90."""
    ledger = GoodputLedger()
    rank = {"productive": 2, "startup": 180, "world": 2}
    ledger.update(pods=[_pod("a"), _pod("b")], answered={"a": _snap(T0, {"0": rank})})
    ledger.update(
        pods=[_pod("a"), _pod("b")],
        answered={"a": _snap(T0 + 10, {"0": rank | {"productive": 12}}), "b": _snap(T0 + 10, {"1": rank})},
    )
    out = ledger.status()
    assert out is not None
    assert out["badputSeconds"]["startup"] == pytest.approx(180.0)
    assert out["productiveSeconds"] == pytest.approx((12 + 2) / 2)


def test_a_new_pod_without_a_failed_predecessor_is_no_restart() -> None:
    ledger = GoodputLedger()
    ledger.update(pods=[_pod("a")], answered={"a": _snap(T0, {"0": {"productive": 10, "startup": 5}})})
    ledger.update(
        pods=[_pod("a"), _pod("b")],
        finished=[_pod("gone", phase="Succeeded")],
        answered={
            "a": _snap(T0 + 15, {"0": {"productive": 25, "startup": 5}}),
            "b": _snap(T0 + 15, {"1": {"productive": 10, "startup": 5}}),
        },
    )
    out = ledger.status()
    assert out is not None
    assert out["restarts"] == 0 and out["badputSeconds"]["restart"] == 0


def test_after_an_operator_restart_the_status_resumes_and_running_processes_are_not_counted_twice() -> None:
    first = GoodputLedger()
    pods = [_pod("a")]
    first.update(
        pods=pods, answered={"a": _snap(T0, {"": {"productive": 600, "startup": 30, "data-wait": 70}})}
    )
    written = {"goodput": first.status(), "lastEvaluationTime": _iso(T0)}
    # An older operator's status: the totals without the pods' readings.
    older = {**written, "goodput": {k: v for k, v in written["goodput"].items() if k != "handover"}}

    resumed = GoodputLedger.resume(older)
    # The same process, 20 s later (the operator's downtime), then 30 s more.
    resumed.update(
        pods=pods, answered={"a": _snap(T0 + 20, {"": {"productive": 615, "startup": 30, "data-wait": 75}})}
    )
    resumed.update(
        pods=pods, answered={"a": _snap(T0 + 50, {"": {"productive": 640, "startup": 30, "data-wait": 80}})}
    )
    out = resumed.status()
    assert out is not None
    assert out["productiveSeconds"] == pytest.approx(600 + 25)  # the 20 s down are lost, nothing doubles
    assert out["badputSeconds"]["dataWait"] == pytest.approx(70 + 5)
    # The counter starts at 0 with this operator process: only what it counted.
    assert resumed.accelerator_seconds["productive"] == pytest.approx(25.0)
    assert out["acceleratorSecondsLost"] == pytest.approx(100.0 + 5.0)

    # A process that started after the status was written counts whole.
    late = GoodputLedger.resume(older)
    late.update(pods=[_pod("b")], answered={"b": _snap(T0 + 100, {"": {"productive": 40, "startup": 10}})})
    assert late.status()["productiveSeconds"] == pytest.approx(640.0)  # type: ignore[index]


def test_a_resumed_ledger_goes_on_from_the_handover_as_if_its_owner_had_not_changed() -> None:
    def scrapes(t: float, a: float, b: float) -> dict[str, Snapshot]:
        return {
            "a": _snap(t, {"0": {"productive": a, "startup": 30, "data-wait": a / 4}}),
            "b": _snap(t, {"1": {"productive": b, "startup": 20, "data-wait": b / 2}}),
        }

    pods = [_pod("a"), _pod("b")]
    stayed, moved = GoodputLedger(), GoodputLedger()
    for ledger in (stayed, moved):
        ledger.update(pods=pods, answered=scrapes(T0, 600, 500))
    written = {"goodput": moved.status(), "lastEvaluationTime": _iso(T0)}
    assert isinstance(written["goodput"]["handover"], str)  # type: ignore[index]
    # Its owner is SIGKILLed; another replica takes the profile over from the status, 25 s later.
    moved = GoodputLedger.resume(json.loads(json.dumps(written)))  # through the API server's JSON
    for t, a, b in ((T0 + 25, 620, 510), (T0 + 35, 628, 514)):
        stayed.update(pods=pods, answered=scrapes(t, a, b))
        moved.update(pods=pods, answered=scrapes(t, a, b))
    out, truth = moved.status(), stayed.status()
    assert out is not None and truth is not None
    for key in ("productiveSeconds", "elapsedSeconds", "restarts"):
        assert out[key] == pytest.approx(truth[key], abs=0.1), key
    assert out["badputSeconds"] == pytest.approx(truth["badputSeconds"], abs=0.1)
    # The job's own figures: each process's productive seconds, over the job's 2 processes.
    assert out["productiveSeconds"] == pytest.approx((628 + 514) / 2, abs=0.1)


def test_a_handover_that_does_not_parse_or_names_another_pod_is_a_baseline_never_an_error() -> None:
    first = GoodputLedger()
    first.update(pods=[_pod("a")], answered={"a": _snap(T0, {"": {"productive": 600, "startup": 30}})})
    good = first.status()
    assert good is not None
    row = json.loads(good["handover"])
    for broken in (
        "{",
        json.dumps({"v": 99, "pods": row["pods"]}),
        json.dumps({"v": 1, "pods": {"a": ["uid-a", "x"]}}),
        json.dumps(
            {"v": 1, "pods": {"a": [*row["pods"]["a"][:-1], {"": ["no dict", 1, False, 0, 0, 0, 0]}]}}
        ),
        12,
        None,
    ):
        resumed = GoodputLedger.resume(
            {"goodput": {**good, "handover": broken}, "lastEvaluationTime": _iso(T0)}
        )
        resumed.update(
            pods=[_pod("a")], answered={"a": _snap(T0 + 20, {"": {"productive": 615, "startup": 30}})}
        )
        assert resumed.status()["productiveSeconds"] == pytest.approx(600.0), broken  # type: ignore[index]
    # A pod of the same name but another uid (recreated in between) is not the handover's pod.
    resumed = GoodputLedger.resume(good and {"goodput": good, "lastEvaluationTime": _iso(T0)})
    resumed.update(
        pods=[_pod("a", uid="uid-new")],
        answered={"a": _snap(T0 + 20, {"": {"productive": 5, "startup": 3}})},
    )
    assert resumed.status()["productiveSeconds"] == pytest.approx(605.0)  # type: ignore[index]


def test_the_handover_is_bounded_whatever_the_job_size() -> None:
    ledger = GoodputLedger()
    ranks = {str(r): {"productive": 100.0 + r, "startup": 30.0, "data-wait": 5.0} for r in range(8)}
    pods = [_pod(f"p{i:04d}") for i in range(1000)]
    ledger.update(pods=pods, answered={p.name: _snap(T0, ranks) for p in pods})
    out = ledger.status()
    assert out is not None
    carried = json.loads(out["handover"])["pods"]
    assert len(carried) == MAX_HANDOVER_PROCESSES // 8
    assert len(out["handover"]) < 40_000


def test_a_cpu_only_job_loses_zero_accelerator_seconds_and_unknown_gpus_are_not_zero() -> None:
    cpu = GoodputLedger()
    cpu.update(pods=[_pod("a")], answered={"a": _snap(T0, {"": {"productive": 50, "data-wait": 50}}, gpus=0)})
    out = cpu.status()
    assert out is not None
    assert out["ratio"] == pytest.approx(0.5)
    assert out["acceleratorSecondsLost"] == 0.0 and out["accelerators"] == 0

    unknown = GoodputLedger()
    unknown.update(pods=[_pod("a")], answered={"a": _snap(T0, {"": {"productive": 50}}, gpus=None)})
    out = unknown.status()
    assert out is not None
    assert "acceleratorSecondsLost" not in out and "accelerators" not in out


def test_a_pod_without_goodput_series_reports_no_goodput() -> None:
    ledger = GoodputLedger()
    old = parse_snapshot(f"{names.STEPS_TOTAL} 10\n{names.STEP_SECONDS_TOTAL} 5\n", timestamp_seconds=T0)
    ledger.update(pods=[_pod("a")], answered={"a": old})
    assert read_pod(old) is None
    assert ledger.status() is None


def test_garbage_values_are_dropped_not_counted() -> None:
    text = (
        f'{names.GOODPUT_SECONDS_TOTAL} NaN\n{names.GOODPUT_SECONDS_TOTAL}{{rank="1"}} 30\n'
        f'{names.BADPUT_SECONDS_TOTAL}{{rank="1",cause="startup"}} -4\n'
        f'{names.BADPUT_SECONDS_TOTAL}{{rank="1",cause="made-up"}} 99\n'
        f'{names.BADPUT_SECONDS_TOTAL}{{rank="1",cause="other"}} 10\n'
    )
    reading = read_pod(parse_snapshot(text, timestamp_seconds=T0))
    assert reading is not None
    assert reading.processes == {"1": {"productive": 30.0, **dict.fromkeys(PROBE_CAUSES, 0.0), "other": 10.0}}


def test_restart_record_reads_the_training_containers_not_the_sidecar() -> None:
    status: dict[str, Any] = {
        "containerStatuses": [
            {
                "name": "train",
                "restartCount": 2,
                "lastState": {"terminated": {"exitCode": 1, "finishedAt": "2026-11-30T12:00:10Z"}},
                "state": {"running": {"startedAt": "2026-11-30T12:00:40Z"}},
            },
            {
                "name": "dam-sidecar",
                "restartCount": 5,
                "lastState": {"terminated": {"exitCode": 1, "finishedAt": "2026-11-30T13:00:00Z"}},
                "state": {"running": {"startedAt": "2026-11-30T13:00:01Z"}},
            },
        ]
    }
    record = restart_record(status)
    assert record == RestartRecord(
        2, "2026-11-30T12:00:10Z", "2026-11-30T12:00:40Z", None, "2026-11-30T12:00:40Z"
    )
    pod = PodInfo.from_body({"metadata": {"name": "p", "namespace": "ns"}, "status": status}, True)
    assert pod.restart == record
    failed = restart_record(
        {
            "containerStatuses": [
                {"name": "train", "state": {"terminated": {"finishedAt": "2026-11-30T12:05:00Z"}}}
            ]
        }
    )
    assert failed.terminated_at == "2026-11-30T12:05:00Z" and failed.count == 0


def test_the_window_step_writes_status_goodput_and_removes_keys_gone_from_it() -> None:
    spec = parse_spec({"selector": {"matchLabels": {"app": "t"}}, "evaluation": {"windowSeconds": 30}})
    ledger = GoodputLedger()
    previous = {"goodput": {"ratio": 0.1, "stale": 1}}
    result = decide_window(
        WindowInputs(
            spec=spec,
            status=previous,
            generation=1,
            pods=[_pod("a")],
            results={"a": _snap(T0, {"": {"productive": 90, "startup": 10}})},
            when=dt.datetime.fromtimestamp(T0, dt.UTC),
            settings=WindowSettings(webhook_enabled=True, max_baseline_seconds=600.0),
        ),
        ProfileState(stabilizer=Stabilizer(confirm_windows=1), baselines={}, goodput=ledger),
    )
    goodput = result.patch["status"]["goodput"]
    assert goodput["ratio"] == pytest.approx(0.9)
    assert goodput["stale"] is None
    assert st.changes_status(previous, result.patch)


def test_the_status_it_writes_is_valid_against_the_crd() -> None:
    crd = yaml.safe_load((ROOT / "crds" / "damprofile.yaml").read_text())
    version = crd["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]
    ledger = GoodputLedger()
    ledger.update(pods=[_pod("a")], answered={"a": _snap(T0, {"0": {"productive": 90, "checkpoint": 10}})})
    goodput = ledger.status()
    assert goodput is not None
    assert set(goodput["badputSeconds"]) == set(STATUS_KEYS.values())
    assert set(goodput) <= set(schema["properties"]["status"]["properties"]["goodput"]["properties"])
    handover = schema["properties"]["status"]["properties"]["goodput"]["properties"]["handover"]
    assert handover["maxLength"] == MAX_HANDOVER_CHARS
    doc = {
        "apiVersion": "dam.mlsys.dev/v1alpha1",
        "kind": "DAMProfile",
        "metadata": {"name": "p"},
        "spec": {"selector": {"matchLabels": {"app": "t"}}},
        "status": {"goodput": goodput},
    }
    assert list(jsonschema.Draft4Validator(schema).iter_errors(doc)) == []
    columns = [
        (c["name"], c["jsonPath"]) for c in version["additionalPrinterColumns"] if not c.get("priority")
    ]
    assert columns == [
        ("Axis", ".status.bottleneck.axis"),
        ("Regime", ".status.bottleneck.regime"),
        ("Lever", ".status.bottleneck.lever"),
        ("Confidence", ".status.bottleneck.confidence"),
        ("Goodput", ".status.goodput.ratio"),
        ("Age", ".metadata.creationTimestamp"),
    ]


def _series(registry: CollectorRegistry, name: str) -> dict[tuple[str, str, str], float]:
    out = {}
    for family in registry.collect():
        for s in family.samples:
            if s.name == name:
                out[(s.labels["namespace"], s.labels["profile"], s.labels.get("use", ""))] = s.value
    return out


def test_accelerator_seconds_are_a_counter_by_use_summed_over_the_fleet_and_gone_with_the_profile() -> None:
    registry = CollectorRegistry()
    metrics = OperatorMetrics(registry)
    for profile, lost in (("a", 30.0), ("b", 50.0)):
        ledger = GoodputLedger()
        ledger.update(
            pods=[_pod(profile)],
            answered={profile: _snap(T0, {"": {"productive": 100 - lost, "data-wait": lost}}, gpus=2)},
        )
        metrics.observe_goodput(
            "ns", profile, accelerator_seconds=ledger.accelerator_seconds, ratio=ledger.status()["ratio"]
        )
    series = _series(registry, mn.PROFILE_ACCELERATOR_SECONDS_TOTAL)
    assert {use for _, _, use in series} == set(mn.ACCELERATOR_USES)
    fleet = {use: sum(v for (_, _, u), v in series.items() if u == use) for use in mn.ACCELERATOR_USES}
    assert fleet["data-wait"] == pytest.approx(2 * 30 + 2 * 50)
    assert fleet["productive"] == pytest.approx(2 * 70 + 2 * 50)
    assert _series(registry, mn.PROFILE_GOODPUT_RATIO)[("ns", "a", "")] == pytest.approx(0.7)

    # Never down while the operator lives, even when handed less.
    metrics.observe_goodput("ns", "a", accelerator_seconds={"data-wait": 1.0}, ratio=0.7)
    assert _series(registry, mn.PROFILE_ACCELERATOR_SECONDS_TOTAL)[("ns", "a", "data-wait")] == pytest.approx(
        60
    )

    metrics.forget_profile("ns", "a")
    assert {p for _, p, _ in _series(registry, mn.PROFILE_ACCELERATOR_SECONDS_TOTAL)} == {"b"}
    assert set(_series(registry, mn.PROFILE_GOODPUT_RATIO)) == {("ns", "b", "")}


def test_a_restart_redoes_only_the_steps_since_the_jobs_newest_checkpoint_when_only_rank_0_saves() -> None:
    # Two pods, one rank each, 0.5 productive seconds a step. Rank 0 saved 5 steps ago; rank 1 never
    # saves (its own figure is every step it took). Rank 1's container restarts: it resumes, like
    # rank 0 would, from rank 0's checkpoint, so 5 steps of its work are redone, not all 200.
    ledger = GoodputLedger()
    zero = RestartRecord(count=0, finished_at=None, started_at=None, terminated_at=None)
    ledger.update(
        pods=[_pod("r0", restart=zero), _pod("r1", restart=zero)],
        answered={
            "r0": _snap(T0, {"0": {"productive": 100, "startup": 1, "steps": 200, "since": 5}}),
            "r1": _snap(T0, {"1": {"productive": 100, "startup": 1, "steps": 200, "since": 200}}),
        },
    )
    one = RestartRecord(count=1, finished_at=_iso(T0 + 2), started_at=_iso(T0 + 4), terminated_at=None)
    ledger.update(
        pods=[_pod("r0", restart=zero), _pod("r1", restart=one)],
        answered={
            "r0": _snap(T0 + 6, {"0": {"productive": 103, "startup": 1, "steps": 206, "since": 1}}),
            "r1": _snap(T0 + 6, {"1": {"productive": 1, "startup": 1, "steps": 2, "since": 2}}),
        },
    )
    out = ledger.status()
    assert out is not None
    # Rank 1: 2 s down + 1 s to its first batch + 5 steps x 0.5 s redone; halved over the 2 ranks.
    assert out["badputSeconds"]["restart"] == pytest.approx((2.0 + 1.0 + 2.5) / 2, abs=0.05)
    assert out["productiveSeconds"] == pytest.approx((103.0 + 100.0 + 1.0 - 2.5) / 2, abs=0.05)
    assert out["ratio"] > 0.9  # was 0.505 when rank 1's every step counted as lost


def test_the_jobs_checkpoint_is_the_oldest_latest_save_of_the_processes_that_saved() -> None:
    r0 = read_pod(_snap(T0, {"0": {"productive": 100, "steps": 200, "since": 5}}))
    r1 = read_pod(_snap(T0, {"1": {"productive": 100, "steps": 200, "since": 200}, "2": {"productive": 1}}))
    r3 = read_pod(_snap(T0, {"3": {"productive": 100, "steps": 200, "since": 12}}))
    assert r0 is not None and r1 is not None and r3 is not None
    # Rank 0 saves for all, rank 1 never saved: rank 0's save is the job's.
    assert job_steps_since_checkpoint({"a": r0, "b": r1}) == 5
    # Every rank saves its shard: a checkpoint is whole once all wrote it, the older one.
    assert job_steps_since_checkpoint({"a": r0, "c": r3}) == 12
    # Nobody saved: no job figure, each keeps its own (every step).
    assert job_steps_since_checkpoint({"b": r1}) is None
    assert job_steps_since_checkpoint({}) is None
    # Counted from the job's save: 5 steps x 0.5 s; a process with no gauge stays unknown.
    assert r1.with_job_checkpoint(5).at_risk == {"1": pytest.approx(2.5)}
    assert r0.with_job_checkpoint(12).at_risk == {"0": pytest.approx(6.0)}


def test_a_stall_found_after_its_threshold_takes_the_other_time_counted_since_it_began() -> None:
    """The judge names a stall only after its threshold: the ``other`` the earlier windows counted
    since the stall's last step moves to ``stalled`` at its first stalled window (no more than was
    counted as other), and a window after it ended counts other again."""
    ledger = GoodputLedger()
    pods = [_pod("a")]
    ledger.update(pods=pods, answered={"a": _snap(T0, {"": {"productive": 50, "other": 2}})}, now=T0)
    # The job's last step at T0+5; at T0+35 other grew by 30 s, not yet known as a stall.
    ledger.update(
        pods=pods, answered={"a": _snap(T0 + 35, {"": {"productive": 55, "other": 32}})}, now=T0 + 35
    )
    ledger.update(
        pods=pods,
        answered={"a": _snap(T0 + 65, {"": {"productive": 55, "other": 62}})},
        stalled_since=T0 + 5,
        now=T0 + 65,
    )
    out = ledger.status()
    assert out is not None
    # 30 s of this window, and of the 32 s of other before it the 30 s since T0+5.
    assert out["badputSeconds"]["stalled"] == pytest.approx(60.0)
    assert out["badputSeconds"]["other"] == pytest.approx(2.0)
    # Resumed: other is other again.
    ledger.update(
        pods=pods, answered={"a": _snap(T0 + 95, {"": {"productive": 80, "other": 67}})}, now=T0 + 95
    )
    out = ledger.status()
    assert out is not None
    assert out["badputSeconds"]["stalled"] == pytest.approx(60.0)
    assert out["badputSeconds"]["other"] == pytest.approx(7.0)
    assert out["elapsedSeconds"] == pytest.approx(80.0 + 67.0)


def test_a_cause_a_rank_could_not_measure_is_absent_for_the_jobs_life_and_the_ratio_an_upper_bound() -> None:
    """Rank 1's collectives are not timed: communication is absent from status.goodput (not 0),
    ``measured`` says which causes are, ``ratioUpperBound`` is true, and the operator exports no
    accelerator-seconds series for it; it stays so after a resume from the status."""
    ledger = GoodputLedger()
    pods = [_pod("a"), _pod("b")]
    answered = {
        "a": _snap(T0, {"0": {"productive": 60, "communication": 8, "other": 2}}),
        "b": _snap(T0, {"1": {"productive": 68, "communication": None, "other": 2}}),
    }
    ledger.update(pods=pods, answered=answered, now=T0)
    out = ledger.status()
    assert out is not None
    assert "communication" not in out["badputSeconds"]
    assert out["measured"] == ["startup", "dataWait", "checkpoint", "restart", "other", "stalled"]
    assert out["ratioUpperBound"] is True
    registry = CollectorRegistry()
    OperatorMetrics(registry).observe_goodput(
        "ns",
        "p",
        accelerator_seconds=ledger.accelerator_seconds,
        ratio=out["ratio"],
        uses=ledger.measured_uses(),
    )
    exported = {use for (_, _, use) in _series(registry, mn.PROFILE_ACCELERATOR_SECONDS_TOTAL)}
    assert "communication" not in exported and "productive" in exported
    resumed = GoodputLedger.resume({"goodput": out})
    resumed.update(pods=pods, answered={"a": answered["a"]}, now=T0 + 30)
    again = resumed.status()
    assert again is not None and "communication" not in again["badputSeconds"] and again["ratioUpperBound"]


def test_every_cause_measured_gives_no_upper_bound() -> None:
    ledger = GoodputLedger()
    ledger.update(pods=[_pod("a")], answered={"a": _snap(T0, {"0": {"productive": 60, "communication": 8}})})
    out = ledger.status()
    assert out is not None and "ratioUpperBound" not in out and "communication" in out["badputSeconds"]


def test_pods_the_operator_deleted_for_a_stall_are_restarted_by_their_replacements() -> None:
    """onStall Restart: the deleted Pods vanish (never seen Failed); the Pods that take their ranks
    are their replacements: deletion to the new processes' first batch is restart, not startup."""
    ledger = GoodputLedger()
    old = [_pod("s-0"), _pod("s-1")]
    answered = {
        "s-0": _snap(T0, {"0": {"productive": 90, "startup": 10}}),
        "s-1": _snap(T0, {"1": {"productive": 90, "startup": 10}}),
    }
    ledger.update(pods=old, answered=answered, now=T0)
    ledger.pods_deleted(old, ["s-0", "s-1"], T0 + 5)
    ledger.update(pods=[], answered={}, now=T0 + 15)  # gone
    # New processes started 20 s after the deletion and took 4 s to their first batch.
    new = [
        _pod("s-0b", restart=RestartRecord(0, None, _iso(T0 + 25), None)),
        _pod("s-1b", restart=RestartRecord(0, None, _iso(T0 + 25), None)),
    ]
    ledger.update(
        pods=new,
        answered={
            "s-0b": _snap(T0 + 40, {"0": {"productive": 11, "startup": 4}}),
            "s-1b": _snap(T0 + 40, {"1": {"productive": 11, "startup": 4}}),
        },
        now=T0 + 40,
    )
    out = ledger.status()
    assert out is not None
    assert out["restarts"] == 2
    assert out["badputSeconds"]["restart"] == pytest.approx(20.0 + 4.0)
    assert out["badputSeconds"]["startup"] == pytest.approx(10.0)
