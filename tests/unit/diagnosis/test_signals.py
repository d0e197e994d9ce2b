"""The signal table: every figure of a window once, each status key and metric a real one."""

from __future__ import annotations

import re

import pytest

from dam_contract import names
from dam_contract.snapshot import parse_snapshot
from dam_operator.diagnosis.engine import diagnose
from dam_operator.diagnosis.extractors import Combine, Gauge, Scrapes
from dam_operator.diagnosis.model import Observation, WindowMetrics
from dam_operator.diagnosis.signals import (
    SIGNALS,
    STATUS_SIGNALS,
    Agg,
    Signal,
    Unit,
    combine,
    extract,
    status_values,
)
from dam_sidecar.catalog import CATALOG
from tests.unit.diagnosis.snapshots import Job, snapshot_pair


def test_every_observation_field_is_one_signal() -> None:
    table = [s.name for s in SIGNALS]
    assert sorted(table) == sorted(Observation.model_fields), "an Observation field without its table entry"
    assert len(table) == len(set(table)), "a field with two entries"


def test_status_metrics_are_the_signals_and_the_derived_figures() -> None:
    keys = [s.status for s in SIGNALS if s.status is not None]
    assert len(keys) == len(set(keys)), "two signals write one status key"
    assert list(STATUS_SIGNALS) == keys
    derived = {f.alias or n for n, f in WindowMetrics.model_fields.items() if not f.exclude}
    assert not set(keys) & derived, "a signal's status key that WindowMetrics also derives"
    assert WindowMetrics.status_keys() == (*keys, *[k for k in WindowMetrics.status_keys() if k in derived])
    assert set(WindowMetrics.status_keys()) == set(keys) | derived
    assert all(s.description for s in SIGNALS if s.status is not None), "a status key without description"


def test_a_status_key_needs_its_description() -> None:
    with pytest.raises(ValueError, match="needs its description"):
        Signal("x", Unit.RATIO, None, Agg.MAX, "x")


def _every_shown_signal() -> Observation:
    """An observation with every signal the status shows set (a valid value of its type)."""
    values: dict[str, object] = {}
    for sig in STATUS_SIGNALS.values():
        integer = "int" in str(Observation.model_fields[sig.name].annotation)
        choices = re.findall(r"Literal\[['\"]([^'\"]+)", str(Observation.model_fields[sig.name].annotation))
        text = choices[0] if choices else "measured"
        values[sig.name] = text if sig.unit is Unit.TEXT else (3 if integer else 0.5)
    return Observation.model_validate(values)


def test_every_shown_signal_reaches_the_status_under_its_key() -> None:
    obs = _every_shown_signal()
    metrics = diagnose(obs).to_status()["metrics"]
    for key, sig in STATUS_SIGNALS.items():
        assert metrics[key] == getattr(obs, sig.name), key
    assert list(metrics)[: len(STATUS_SIGNALS)] == list(STATUS_SIGNALS), "the shown signals in table order"


def test_window_metrics_take_a_shown_signal_by_name_or_key() -> None:
    by_name = WindowMetrics(data_wait_ratio=0.4, mfu=0.3)
    assert by_name.shown.data_wait_ratio == 0.4
    assert by_name == WindowMetrics(dataWaitRatio=0.4, mfu=0.3)
    assert by_name.model_dump(by_alias=True, exclude_none=True) == {"dataWaitRatio": 0.4, "mfu": 0.3}
    assert by_name.model_dump(exclude_none=True) == {"data_wait_ratio": 0.4, "mfu": 0.3}
    with pytest.raises(ValueError, match="extra"):
        WindowMetrics(gpu_model="H100")  # an observation field the status does not show


def test_every_metric_a_signal_reads_is_one_the_sidecar_exports() -> None:
    exported = {m.name for m in CATALOG}
    read = {metric for s in SIGNALS for metric in s.metrics}
    assert read <= exported, sorted(read - exported)
    assert {names.DATALOADER_WAIT_SECONDS_TOTAL, names.GPU_UTILIZATION_RATIO} <= read


def test_a_first_gauge_reads_one_pod_wide_series() -> None:
    with pytest.raises(ValueError, match="one pod-wide series"):
        Gauge((names.GPU_UTILIZATION_RATIO,), Combine.FIRST, gpus=True)


def test_a_window_reads_every_signal_the_job_exported_into_the_status() -> None:
    job = Job(
        seconds=60.0,
        steps=120.0,
        wait_ratio=0.4,
        gpus=[{"util": 0.5, "sm": 0.3}, {"util": 0.7, "sm": 0.5}],
        main_cpu_cores=1.0,
        worker_cpu_cores=3.0,
        throttled_ratio=0.2,
    )
    before, after = (parse_snapshot(t) for t in snapshot_pair(job))
    fields = extract(Scrapes(before, after))
    assert fields["data_wait_ratio"] == pytest.approx(0.4)
    assert fields["gpu_utilization"] == pytest.approx(0.6)
    assert fields["gpu_count"] == 2
    assert fields["worker_cpu_cores"] == pytest.approx(3.0)
    metrics = diagnose(Observation(**{k: v for k, v in fields.items() if v is not None})).to_status()[
        "metrics"
    ]
    assert metrics["dataWaitRatio"] == pytest.approx(0.4)
    assert metrics["smActive"] == pytest.approx(0.4)
    assert metrics["cpuThrottledRatio"] == pytest.approx(0.2)


def test_pods_combine_as_their_signal_says() -> None:
    a = Observation(steps=100, mean_step_seconds=0.1, data_wait_ratio=0.2, gpu_count=1, gpu_utilization=0.2)
    b = Observation(steps=100, mean_step_seconds=0.3, data_wait_ratio=0.6, gpu_count=3, gpu_utilization=0.6)
    job = combine([a, b])
    assert job["steps"] == 200  # Agg.SUM
    assert job["data_wait_ratio"] == pytest.approx((0.2 * 10 + 0.6 * 30) / 40)  # step time: 10 s and 30 s
    assert job["gpu_utilization"] == pytest.approx((0.2 * 1 + 0.6 * 3) / 4)  # GPU-weighted
    assert job["gpu_count"] == 4
    means = {s.name for s in SIGNALS if s.aggregate in (Agg.MEAN, Agg.GPU_MEAN, Agg.STEP_TIME_MEAN)}
    assert {"data_wait_ratio", "gpu_utilization", "cpu_throttled_ratio"} <= means


def test_a_source_without_its_figure_is_not_in_the_status() -> None:
    assert status_values(Observation(flops_per_step_source="measured"))["flopsPerStepSource"] is None
    shown = status_values(Observation(flops_per_step=1e12, flops_per_step_source="measured"))
    assert shown["flopsPerStepSource"] == "measured"
