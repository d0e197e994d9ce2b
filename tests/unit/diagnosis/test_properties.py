"""Whatever numbers arrive, the engine answers with a valid verdict or the input is rejected cleanly.

The generators build mostly valid observations (every field in its legal range, extremes
included); one in eight carries one garbage value, which must be rejected by a
validation error naming that field. Invalid examples are counted (``event``; see
``--hypothesis-show-statistics``) and discarded with ``assume``, so Hypothesis's health
check fails the test if the generator ever drifts to mostly invalid inputs.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import assume, event, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from dam_operator.diagnosis import levers
from dam_operator.diagnosis.engine import diagnose
from dam_operator.diagnosis.hysteresis import Stabilizer
from dam_operator.diagnosis.model import Hardware, Observation, RankId, Regime, Thresholds, Verdict
from dam_operator.diagnosis.ranks import MAX_RANK_FIGURES
from dam_operator.diagnosis.window import aggregate, find_straggler

RATIO_FIELDS = [
    "data_wait_ratio",
    "gpu_utilization",
    "gpu_memory_busy",
    "sm_active",
    "sm_occupancy",
    "tensor_active",
    "dram_bandwidth_utilization",
    "cpu_throttled_ratio",
    "node_cpu_utilization",
    "exposed_communication_ratio",
    "gpu_memory_used_ratio",
    "container_memory_ratio",
]
NONNEG_FIELDS = [
    "window_seconds",
    "steps",
    "steps_per_second",
    "mean_step_seconds",
    "main_cpu_cores",
    "worker_cpu_cores",
    "cpu_limit_cores",
    "flops_per_step",
    "bytes_per_step",
    "collective_seconds",
    "collective_exposed_seconds",
    "collectives",
    "collective_bytes",
    "collective_ratio",
    "collective_skew",
    "nvlink_bytes_per_second",
    "pcie_bytes_per_second",
    "container_memory_limit_bytes",
    "oom_kills",
    "main_rss_bytes",
    "worker_rss_bytes",
    "sm_clock_hertz",
]
INT_LIMITS = {"gpu_count": 4096, "worker_count": 100_000, "batch_size": 10**9, "ranks": 10_000_000}

garbage_float = st.sampled_from([-1.0, -1e-9, math.nan, math.inf, -math.inf, 1.5]) | st.floats(
    max_value=-1e-12
)
garbage_int = st.integers(min_value=-(10**12), max_value=-1) | st.integers(min_value=10**10, max_value=10**12)
nonneg = st.floats(min_value=0.0, max_value=1e6) | st.floats(min_value=0.0, max_value=1e308)
ratio = st.floats(min_value=0.0, max_value=1.0)
model_name = st.sampled_from(["NVIDIA H100 80GB HBM3", "Tesla T4", "nonsense", "", "NVIDIA A100-SXM4-40GB"])

valid_fields = st.fixed_dictionaries(
    {},
    optional={
        **{name: ratio for name in RATIO_FIELDS},
        **{name: nonneg for name in NONNEG_FIELDS},
        **{name: st.integers(min_value=0, max_value=limit) for name, limit in INT_LIMITS.items()},
        "gpu_model": model_name,
        "oom_killed": st.booleans(),
        "gpu_slowdown_reasons": st.lists(
            st.sampled_from(["hw_slowdown", "sw_power_cap", "hw_thermal_slowdown"]), max_size=3
        ).map(tuple),
    },
)


@st.composite
def maybe_corrupted(draw: st.DrawFn) -> tuple[dict[str, Any], str | None]:
    """Valid fields; one time in eight one of them replaced by garbage (its name returned)."""
    fields = draw(valid_fields)
    if draw(st.integers(min_value=0, max_value=7)) != 0:
        return fields, None
    name = draw(st.sampled_from([*RATIO_FIELDS, *NONNEG_FIELDS, *INT_LIMITS]))
    fields[name] = draw(garbage_int if name in INT_LIMITS else garbage_float)
    return fields, name


def build(fields: dict[str, Any], corrupted: str | None) -> Observation:
    """The observation, or (for a corrupted one) a check that the error names the field, then discard."""
    try:
        obs = Observation(**fields)
    except ValidationError as exc:
        event("invalid observation (discarded)")
        assert corrupted is not None, exc
        assert {str(err["loc"][0]) for err in exc.errors()} == {corrupted}
        assume(False)
        raise  # unreachable: assume(False) stops the example
    event("valid observation")
    return obs


def _valid_verdict(verdict: Verdict) -> None:
    b = verdict.bottleneck
    assert 0.0 <= b.confidence <= 1.0
    assert b.lever in levers.LEVERS
    assert b.lever not in b.avoid
    assert (b.regime is Regime.UNKNOWN) == (b.lever == "collect-more-evidence")
    status = verdict.to_status()
    assert Verdict.model_validate(status) == verdict


@settings(max_examples=200, deadline=None)
@given(maybe_corrupted())
def test_any_observation_gives_a_valid_verdict_or_a_validation_error(
    drawn: tuple[dict[str, Any], str | None],
) -> None:
    obs = build(*drawn)
    _valid_verdict(diagnose(obs))


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
        exposed_communication_ratio=st.none() | ratio,
        collective_ratio=st.none() | st.floats(min_value=0, max_value=4),
        collective_skew=st.none() | st.floats(min_value=0, max_value=4),
        gpu_memory_used_ratio=st.none() | ratio,
        container_memory_ratio=st.none() | ratio,
        oom_kills=st.none() | st.floats(min_value=0, max_value=10),
        oom_killed=st.none() | st.booleans(),
    ),
    st.builds(
        Thresholds,
        data_wait_suspect=ratio,
        gpu_util_starved=ratio,
        gpu_util_busy=ratio,
        dram_bandwidth_saturated=ratio,
        communication_suspect=ratio,
        straggler_skew=ratio,
        gpu_memory_full=st.floats(min_value=0.51, max_value=1.0),
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
@given(st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), maybe_corrupted(), max_size=4))
def test_aggregate_and_straggler_never_raise_on_valid_pods(
    pods_drawn: dict[str, tuple[dict[str, Any], str | None]],
) -> None:
    pods = {name: build(*drawn) for name, drawn in pods_drawn.items()}
    _valid_verdict(diagnose(aggregate(pods)))
    found = find_straggler(pods)
    assert found is None or found[0] in pods


rank_id = st.builds(
    RankId, st.sampled_from(["", "a", "b"]), st.none() | st.integers(min_value=0, max_value=40)
)
rank_fields = st.fixed_dictionaries(
    {
        "steps": st.floats(min_value=0, max_value=1e6),
        "mean_step_seconds": st.floats(min_value=0, max_value=100),
    },
    optional={
        "window_seconds": st.floats(min_value=0, max_value=1e5),
        "steps_per_second": st.floats(min_value=0, max_value=1e4),
        "data_wait_ratio": ratio,
        "collective_seconds": st.floats(min_value=0, max_value=1e6),
        "exposed_communication_ratio": ratio,
        "collective_ratio": st.floats(min_value=0, max_value=4),
        "gpu_utilization": ratio,
        "sm_clock_hertz": st.floats(min_value=0, max_value=3e9),
        "cpu_throttled_ratio": ratio,
        "gpu_count": st.integers(min_value=0, max_value=8),
        "gpu_slowdown_reasons": st.lists(st.sampled_from(["hw_slowdown", "sw_power_cap"]), max_size=2).map(
            tuple
        ),
    },
).map(lambda f: Observation(**f))


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(rank_id, rank_fields, max_size=12), st.lists(st.booleans(), min_size=1, max_size=4))
def test_any_ranks_give_a_valid_verdict_a_straggler_among_them_and_few_figures(
    ranks: dict[RankId, Observation], keep: list[bool]
) -> None:
    pods = {f"{k.pod}/{k.rank}": o for k, o in ranks.items()}
    verdict = diagnose(aggregate(pods, ranks=ranks), ranks=ranks)
    _valid_verdict(verdict)
    s = verdict.bottleneck.straggler
    assert s is None or RankId(s.pod or "", s.rank) in ranks
    assert len(verdict.metrics.ranks or []) <= MAX_RANK_FIGURES
    # The stabilizer keeps the published straggler one of the job's ranks, window after window.
    stab = Stabilizer()
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    for i, k in enumerate(keep):
        window = {key: o for j, (key, o) in enumerate(ranks.items()) if k or j % 2}
        published = stab.update(
            diagnose(aggregate(pods, ranks=window), ranks=window), t0 + timedelta(minutes=i)
        )
        _valid_verdict(published)
        p = published.bottleneck.straggler
        assert p is None or RankId(p.pod or "", p.rank) in ranks
