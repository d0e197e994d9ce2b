"""Very slow steps: a window with fewer than ``minSteps`` steps keeps its baseline, so the next window
reaches back over it and holds enough steps for a verdict (up to ``max_baseline_seconds``)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from dam_contract import names
from dam_contract.snapshot import Sample, Snapshot
from dam_operator.cluster.steps.registry import PodInfo
from dam_operator.cluster.steps.spec import parse_spec
from dam_operator.cluster.steps.window_step import ProfileState, WindowInputs, WindowSettings, decide_window
from dam_operator.diagnosis.hysteresis import Stabilizer
from dam_operator.diagnosis.model import Regime

WHEN = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)
SPEC = parse_spec({"selector": {"matchLabels": {"app": "t"}}, "evaluation": {"windowSeconds": 30}})
POD = PodInfo("ns", "p", {"app": "t"}, pod_ip="10.0.0.1", phase="Running", instrumented=True)
RATE = 0.07  # steps per second: 2 steps in a 30 s window


def scrape(t: float) -> Snapshot:
    steps = float(int(t * RATE))
    step_s = steps / RATE
    return Snapshot(
        [
            Sample(names.STEPS_TOTAL, (), steps),
            Sample(names.STEP_SECONDS_TOTAL, (), step_s),
            Sample(names.DATALOADER_WAIT_SECONDS_TOTAL, (), 0.9 * step_s),
            Sample(names.NVML_UP, (), 1.0),
            Sample(names.GPU_ATTRIBUTION, (("state", "probe"),), 1.0),
            Sample(names.SNAPSHOT_TIMESTAMP_SECONDS, (), 1e9 + t),
        ],
        timestamp_seconds=1e9 + t,
    )


def step(baselines: dict[str, Snapshot], t: float, stabilizer: Stabilizer, max_baseline: float) -> Any:
    return decide_window(
        WindowInputs(
            spec=SPEC,
            status={},
            generation=1,
            pods=[POD],
            results={"p": scrape(t)},
            when=WHEN + dt.timedelta(seconds=t),
            settings=WindowSettings(webhook_enabled=True, max_baseline_seconds=max_baseline),
        ),
        ProfileState(stabilizer=stabilizer, baselines=baselines),
    )


def test_a_window_with_too_few_steps_grows_into_the_next_and_the_verdict_holds() -> None:
    stabilizer = Stabilizer()
    baselines: dict[str, Snapshot] = {"p": scrape(0.0)}
    regimes = []
    starts = []
    for t in (30.0, 60.0, 90.0, 120.0, 150.0, 180.0):
        result = step(baselines, t, stabilizer, max_baseline=90.0)
        regimes.append(result.verdict.bottleneck.regime)
        baselines = result.baselines
        starts.append(baselines["p"].timestamp_seconds - 1e9)
    assert starts[0] == 0.0, "2 steps in the first window: its baseline is kept"
    assert regimes[1] is Regime.INPUT_BOUND, "the second window reaches back 60 s: 4 steps"
    assert all(r is Regime.INPUT_BOUND for r in regimes[1:]), regimes


def test_the_window_grows_no_further_than_max_baseline_seconds() -> None:
    result = step({"p": scrape(0.0)}, 30.0, Stabilizer(), max_baseline=45.0)
    assert result.baselines["p"].timestamp_seconds == 1e9 + 30.0, "a 60 s window would exceed 45 s"
