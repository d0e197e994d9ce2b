"""Whatever numbers arrive, the engine answers with a valid verdict or the input is rejected cleanly."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from dam_operator.diagnosis import levers
from dam_operator.diagnosis.engine import diagnose
from dam_operator.diagnosis.model import Hardware, Observation, Regime, Thresholds, Verdict
from dam_operator.diagnosis.window import aggregate, find_straggler

FLOAT_FIELDS = [
    "window_seconds",
    "steps",
    "steps_per_second",
    "data_wait_ratio",
    "mean_step_seconds",
    "gpu_utilization",
    "gpu_memory_busy",
    "sm_active",
    "sm_occupancy",
    "tensor_active",
    "dram_bandwidth_utilization",
    "main_cpu_cores",
    "worker_cpu_cores",
    "cpu_throttled_ratio",
    "cpu_limit_cores",
    "flops_per_step",
    "bytes_per_step",
]
INT_FIELDS = ["gpu_count", "worker_count", "batch_size"]

garbage_float = st.one_of(
    st.floats(min_value=0.0, max_value=1.0),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, 1.0, -1.0, 1e308, 5e-324, math.nan, math.inf]),
)
garbage_int = st.one_of(
    st.integers(min_value=0, max_value=16), st.integers(min_value=-(10**12), max_value=10**12)
)
model_name = st.sampled_from(["NVIDIA H100 80GB HBM3", "Tesla T4", "nonsense", "", "NVIDIA A100-SXM4-40GB"])

observation_dict = st.fixed_dictionaries(
    {},
    optional={
        **{name: garbage_float for name in FLOAT_FIELDS},
        **{name: garbage_int for name in INT_FIELDS},
        "gpu_model": model_name,
    },
)


def _valid_verdict(verdict: Verdict) -> None:
    b = verdict.bottleneck
    assert 0.0 <= b.confidence <= 1.0
    assert b.lever in levers.LEVERS
    assert b.lever not in b.avoid
    assert (b.regime is Regime.UNKNOWN) == (b.lever == "collect-more-evidence")
    status = verdict.to_status()
    assert Verdict.model_validate(status) == verdict


@settings(max_examples=200, deadline=None)
@given(observation_dict)
def test_any_observation_gives_a_valid_verdict_or_a_validation_error(fields: dict[str, Any]) -> None:
    try:
        obs = Observation(**fields)
    except ValidationError:
        return
    _valid_verdict(diagnose(obs))


ratio = st.floats(min_value=0.0, max_value=1.0)


@settings(max_examples=200, deadline=None)
@given(
    st.builds(
        Observation,
        steps=st.floats(min_value=0, max_value=1e9),
        window_seconds=st.floats(min_value=0, max_value=1e6),
        data_wait_ratio=st.none() | ratio,
        gpu_count=st.none() | st.integers(min_value=0, max_value=8),
        gpu_utilization=st.none() | ratio,
        sm_active=st.none() | ratio,
        tensor_active=st.none() | ratio,
        dram_bandwidth_utilization=st.none() | ratio,
        main_cpu_cores=st.none() | st.floats(min_value=0, max_value=64),
        cpu_throttled_ratio=st.none() | ratio,
        batch_size=st.none() | st.integers(min_value=0, max_value=4096),
        flops_per_step=st.none() | st.floats(min_value=0, max_value=1e18),
    ),
    st.builds(
        Thresholds,
        data_wait_suspect=ratio,
        gpu_util_starved=ratio,
        gpu_util_busy=ratio,
        dram_bandwidth_saturated=ratio,
    ),
    st.none()
    | st.builds(
        Hardware,
        peak_flops=st.floats(min_value=1e6, max_value=1e18),
        memory_bandwidth_bytes_per_second=st.floats(min_value=1e6, max_value=1e15),
    ),
)
def test_valid_inputs_with_any_thresholds_and_hardware_give_a_valid_verdict(
    obs: Observation, thresholds: Thresholds, hardware: Hardware | None
) -> None:
    _valid_verdict(diagnose(obs, thresholds, hardware))


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), observation_dict, max_size=4))
def test_aggregate_and_straggler_never_raise_on_valid_pods(pods_fields: dict[str, dict[str, Any]]) -> None:
    pods: dict[str, Observation] = {}
    for name, fields in pods_fields.items():
        try:
            pods[name] = Observation(**fields)
        except ValidationError:
            continue
    _valid_verdict(diagnose(aggregate(pods)))
    found = find_straggler(pods)
    assert found is None or found[0] in pods
