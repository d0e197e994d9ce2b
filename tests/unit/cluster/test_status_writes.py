"""The operator writes a profile's status only when something a reader can use changed.

A window that would change nothing but ``lastEvaluationTime`` (a steady job, a profile
with no pods) costs the API server no write and its watchers no event: at 5,000
profiles and a 30 s window that is 167 writes a second saved (docs/performance.md).
"""

from __future__ import annotations

import asyncio
from typing import Any

from dam_operator.cluster.steps import status as st
from dam_operator.diagnosis import evidence as ev
from dam_operator.diagnosis.model import Observation, RankId
from dam_operator.diagnosis.ranks import rank_figures
from tests.support.fake_sidecar import COMPUTE
from tests.unit.cluster.test_scheduler import World

T0 = "2025-01-01T00:00:00Z"
T1 = "2025-01-01T00:00:30Z"

PREVIOUS: dict[str, Any] = {
    "observedGeneration": 1,
    "lastEvaluationTime": T0,
    "pods": {"matched": 2, "instrumented": 2, "reporting": 2},
    "metrics": {"dataWaitRatio": 0.7, "stepsPerSecond": 8.0, "ranks": [{"pod": "a"}, {"pod": "b"}]},
    "conditions": [{"type": "Diagnosed", "status": "True", "message": "Data", "lastTransitionTime": T0}],
}


def _patch(**status: Any) -> dict[str, Any]:
    return {"status": {"lastEvaluationTime": T1, **status}}


def test_a_new_evaluation_time_alone_is_no_change() -> None:
    assert not st.changes_status(PREVIOUS, _patch())
    assert not st.changes_status(PREVIOUS, _patch(metrics={"dataWaitRatio": 0.7}, observedGeneration=1))


def test_figures_within_measurement_noise_are_no_change() -> None:
    noisy = {"dataWaitRatio": 0.7000000000000001, "stepsPerSecond": 7.999999999999999}
    assert not st.changes_status(PREVIOUS, _patch(metrics=noisy))
    jitter = {"dataWaitRatio": 0.7 * 1.009, "stepsPerSecond": 8.0 * 0.992}  # under 1 %
    assert not st.changes_status(PREVIOUS, _patch(metrics=jitter))
    near_zero = {"cpuThrottledRatio": 0.0}
    assert not st.changes_status(
        {**PREVIOUS, "metrics": {**PREVIOUS["metrics"], **near_zero}},
        _patch(metrics={"cpuThrottledRatio": 0.0004}),
    )


def test_the_goodput_handover_alone_is_no_change_and_rides_with_a_real_one() -> None:
    """The ledger's readings for the next owner change every window a pod reports: a write for
    them alone would be a write per profile per window (docs/damprofile.md, ``handover``)."""
    goodput = {"productiveSeconds": 600.0, "elapsedSeconds": 1000.0, "handover": '{"v":1,"pods":{}}'}
    previous = {**PREVIOUS, "goodput": goodput}
    later = {**goodput, "productiveSeconds": 600.5, "handover": '{"v":1,"pods":{"a":[]}}'}
    assert not st.changes_status(previous, _patch(goodput=later))
    older = {**PREVIOUS, "goodput": {k: v for k, v in goodput.items() if k != "handover"}}
    assert not st.changes_status(older, _patch(goodput=later))  # an older operator's status
    assert st.changes_status(previous, _patch(goodput={**later, "productiveSeconds": 700.0}))
    assert previous["goodput"]["handover"] == '{"v":1,"pods":{}}'  # the caller's status untouched


def test_a_figure_that_really_moved_is_a_change() -> None:
    assert st.changes_status(PREVIOUS, _patch(metrics={"stepsPerSecond": 8.0 * 1.011}))
    assert st.changes_status(PREVIOUS, _patch(metrics={"stepsPerSecond": 8.0 * 0.989}))
    assert st.changes_status(PREVIOUS, _patch(metrics={"dataWaitRatio": 0.0}))


def test_an_evidence_line_that_differs_only_in_its_sample_size_is_no_change() -> None:
    waiting = ev.note("70% of step time waiting")
    at_8 = ev.rate(8.0, 240, 30, each_rank=False)
    stretched_8 = ev.rate(8.0, 264, 33, each_rank=False)
    faster_8_8 = ev.rate(8.8, 264, 30, each_rank=False)
    reworded_wait = ev.note("71% of step time waiting")
    assert at_8.sentence == "8.00 steps/s (240 steps in 30 s)"
    before = {**PREVIOUS, "bottleneck": {"evidence": [waiting.sentence, at_8.sentence]}}

    def changes(*lines: ev.Evidence) -> bool:
        patch = _patch(bottleneck={"evidence": [r.sentence for r in lines]})
        return st.changes_status(before, patch, records=(waiting, at_8, *lines))

    assert not changes(waiting, stretched_8)
    assert changes(waiting, faster_8_8)
    assert changes(reworded_wait, at_8)
    # Without the records (the status read back after an operator restart) the text decides.
    assert st.changes_status(
        before, _patch(bottleneck={"evidence": [waiting.sentence, stretched_8.sentence]})
    )


def test_text_order_removal_and_addition_are_changes() -> None:
    message = [dict(PREVIOUS["conditions"][0], message="Machine")]
    assert st.changes_status(PREVIOUS, _patch(conditions=message))
    assert st.changes_status(PREVIOUS, _patch(metrics={"ranks": [{"pod": "b"}, {"pod": "a"}]}))
    assert st.changes_status(PREVIOUS, _patch(metrics={"stepsPerSecond": None}))
    assert st.changes_status(PREVIOUS, _patch(bottleneck={"axis": "Data"}))
    assert st.changes_status(None, _patch(pods={"matched": 0}))
    assert not st.changes_status({}, {"status": {"metrics": None}})


def test_ranks_that_are_the_same_after_rounding_keep_their_order() -> None:
    def ranks(wait_a: float, wait_b: float) -> list[str | None]:
        obs = {
            RankId("a", None): Observation(data_wait_ratio=wait_a, steps_per_second=4.0),
            RankId("b", None): Observation(data_wait_ratio=wait_b, steps_per_second=4.0),
        }
        return [f.pod for f in rank_figures(obs)]

    assert ranks(0.7, 0.7000000000000001) == ["a", "b"]
    assert ranks(0.7000000000000001, 0.7) == ["a", "b"]
    assert ranks(0.6, 0.7) == ["b", "a"]  # the higher data wait still comes first


def test_a_steady_job_is_written_once_then_not_until_it_changes() -> None:
    async def scenario() -> None:
        async with World() as w:
            await w.evaluator.initialize(w.entry)
            first = await w.window()
            assert first["bottleneck"]["axis"] == "Data"
            writes = w.api.patches
            # Windows a fraction of a millisecond apart (the figures differ in their last bits),
            # and windows an operator under load stretched or shortened by seconds.
            for seconds in (30.0004, 29.9997, 30.0, 30.0011, 33.0, 27.5):
                assert await w.window(seconds) == first
            assert w.api.patches == writes
            for job in w.jobs.values():
                job.switch(COMPUTE)
            changed = await w.window()
            assert w.api.patches == writes + 1
            assert changed["lastEvaluationTime"] > first["lastEvaluationTime"]
            assert changed["metrics"]["dataWaitRatio"] < first["metrics"]["dataWaitRatio"]

    asyncio.run(scenario())
