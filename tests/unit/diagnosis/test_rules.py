"""The rules are small units a referee picks among; evidence lines are records.

Each rule judges a window alone (``rule.judge(ctx)``) and never asks another; ``regimes.RULES``
lists them by stage; the lines every verdict carries are added by kind, never by matching text.
"""

from __future__ import annotations

from typing import Any

from dam_operator.diagnosis import evidence as ev
from dam_operator.diagnosis.axes import Kind
from dam_operator.diagnosis.derived import derive
from dam_operator.diagnosis.engine import diagnose
from dam_operator.diagnosis.model import Bottleneck, Observation, Regime, Thresholds
from dam_operator.diagnosis.regimes import RULES
from dam_operator.diagnosis.rules import checkpoint, communication, data, decide, gpu, host
from dam_operator.diagnosis.rules.base import Context, Finding, Rule, Stage
from dam_operator.diagnosis.rules.context_lines import add_context_lines


def ctx(**fields: Any) -> Context:
    obs = Observation(**{"steps": 300.0, "window_seconds": 30.0, **fields})
    return Context(obs, Thresholds(), None, derive(obs, None))


FED = {"gpu_count": 1, "gpu_utilization": 0.97, "sm_active": 0.9, "data_wait_ratio": 0.01}
STARVED = {"gpu_count": 1, "gpu_utilization": 0.3, "data_wait_ratio": 0.01, "main_cpu_cores": 0.2}


def test_the_rules_are_asked_stage_by_stage() -> None:
    order = [
        "memory-capacity",
        "no-training-step",
        "too-few-steps",
        "communication-bound",
        "input-bound",
        "checkpoint-bound",
        "memory-bound",
        "small-kernels",
        "compute-bound",
        "busy-node",
        "gpu-starved",
        "cpu-only",
        "gpu-unmeasured",
    ]
    names = [r.name for r in RULES]
    # These keep their order (a new rule may come between them); names are unique.
    assert [n for n in names if n in order] == order
    assert len(set(names)) == len(names)
    # The last rule answers any window: the walk always ends with a finding.
    assert RULES[-1].judge(ctx()) is not None


def test_each_rule_judges_a_window_alone() -> None:
    fed = gpu.compute_bound(ctx(**FED))
    assert fed is not None and fed.regime is Regime.COMPUTE_BOUND
    assert gpu.compute_bound(ctx(**STARVED)) is None
    assert gpu.memory_bound(ctx(**FED)) is None
    starved = gpu.gpu_starved(ctx(**STARVED))
    assert starved is not None and (starved.regime, starved.lever) == (
        Regime.LATENCY_BOUND,
        "remove-host-syncs",
    )
    # A throttled cgroup's run-queue delay is the quota's, not a busy node's.
    assert host.busy_node(ctx(cpu_wait_ratio=0.5)) is not None
    assert host.busy_node(ctx(cpu_wait_ratio=0.5, cpu_throttled_ratio=0.5)) is None


def test_the_first_rule_that_answers_decides_and_an_aside_names_the_rest() -> None:
    window = ctx(data_wait_ratio=0.6, gpu_count=1, gpu_utilization=0.2, oom_killed=True)
    found = decide(window, RULES)
    assert found.regime is Regime.MEMORY_CAPACITY
    assert found.evidence[-1].sentence.startswith("apart from memory the window reads as input-bound")
    # A list without the memory rule reads the same window as the aside named it.
    assert decide(window, RULES[1:]).regime is Regime.INPUT_BOUND
    # An aside that finds nothing else says nothing.
    alone = decide(ctx(oom_killed=True), (RULES[0], Rule("nothing", gpu.gpu_unmeasured, Stage.LAST)))
    assert not any(e.sentence.startswith("apart from") for e in alone.evidence)


LOSSES = {"gpu_count": 1, "gpu_utilization": 0.3, "ranks": 2, "collective_skew": 0.0}


def test_the_referee_picks_the_largest_loss_and_no_rule_asks_another() -> None:
    # Saves 30 % of the window, data wait 50 % and exposed communication 40 % of the step (the
    # steps cover the whole window): each rule answers alone; the data wait is the largest loss.
    window = ctx(**LOSSES, data_wait_ratio=0.5, exposed_communication_ratio=0.4, checkpoint_ratio=0.3)
    alone = [checkpoint.checkpoint_bound(window), data.input_bound(window)]
    alone.append(communication.communication_bound(window))
    assert [f.regime if f else None for f in alone] == [
        Regime.CHECKPOINT_BOUND,
        Regime.INPUT_BOUND,
        Regime.COMMUNICATION_BOUND,
    ]
    assert [f.loss for f in alone if f] == [0.3, 0.5, 0.4]
    assert decide(window, RULES).regime is Regime.INPUT_BOUND
    saves = ctx(**LOSSES, data_wait_ratio=0.25, exposed_communication_ratio=0.2, checkpoint_ratio=0.3)
    assert decide(saves, RULES).regime is Regime.CHECKPOINT_BOUND
    # An equal loss: the saves over the data wait over the exposed communication.
    tie = ctx(**LOSSES, data_wait_ratio=0.3, exposed_communication_ratio=0.3, checkpoint_ratio=0.3)
    assert decide(tie, RULES).regime is Regime.CHECKPOINT_BOUND
    tie = ctx(**LOSSES, data_wait_ratio=0.3, exposed_communication_ratio=0.3)
    assert decide(tie, RULES).regime is Regime.INPUT_BOUND


def test_a_context_line_is_added_when_no_line_of_its_kind_is_there_whatever_the_text() -> None:
    window = ctx(**STARVED, cpu_throttled_ratio=0.4)
    words = ev.note("the operator read 'CPU-throttled' in a log line")  # the word, not the figure
    finding = Finding(Regime.LATENCY_BOUND, "remove-host-syncs", 0.5, evidence=[words])
    add_context_lines(window, finding)
    assert [e.kind for e in finding.evidence].count(Kind.CPU_THROTTLED) == 1
    said = Finding(
        Regime.LATENCY_BOUND, "remove-host-syncs", 0.5, evidence=[ev.cpu_throttled(window.obs, window.t)]
    )
    add_context_lines(window, said)
    assert [e.kind for e in said.evidence].count(Kind.CPU_THROTTLED) == 1


def test_a_throttled_input_bound_window_states_the_throttling_once() -> None:
    v = diagnose(Observation(steps=300, window_seconds=30, data_wait_ratio=0.5, cpu_throttled_ratio=0.4))
    kinds = [r.kind for r in v.bottleneck.records()]
    assert kinds.count(Kind.CPU_THROTTLED) == 1
    assert v.bottleneck.lever == "raise-cpu-limit"


def test_the_records_render_the_status_sentences_and_a_status_read_back_equals_the_verdict() -> None:
    v = diagnose(Observation(**{"steps": 300.0, "window_seconds": 30.0, **FED}))
    records = v.bottleneck.records()
    assert [r.sentence for r in records] == v.bottleneck.evidence
    assert records[0].kind is Kind.GPU_UTILIZATION and records[0].numbers == {"gpu_utilization": 0.97}
    rate = records[-1]
    assert rate.kind is Kind.RATE and rate.numbers == {
        "steps_per_second": 10.0,
        "steps": 300.0,
        "window_seconds": 30.0,
    }
    read_back = Bottleneck.model_validate(v.to_status()["bottleneck"])
    assert read_back == v.bottleneck
    assert {r.kind for r in read_back.records()} == {Kind.NOTE}  # text from a status: no numbers
