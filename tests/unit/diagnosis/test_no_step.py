"""A window without a training step says so, says how to instrument a custom loop, and keeps
true statements about what was sampled."""

from __future__ import annotations

from dam_operator.diagnosis.engine import diagnose
from dam_operator.diagnosis.model import Observation, Regime


def test_no_step_with_cpu_sampled_says_no_dataloader_was_iterated_and_what_was_sampled() -> None:
    b = diagnose(Observation(steps=0, window_seconds=5.0, main_cpu_cores=0.98, gpu_count=0)).bottleneck
    assert b.regime is Regime.UNKNOWN
    text = " ".join(b.evidence)
    assert "no training step was seen" in text and "no DataLoader was iterated" in text
    assert "the main process used 0.98 CPU cores" in text
    assert "no CPU figures" not in text, "the CPU was sampled"
    assert any("dam_probe.instrument(" in m and "docs/probe.md" in m for m in b.missing), b.missing


def test_no_step_and_nothing_sampled_says_why_nothing_was() -> None:
    b = diagnose(Observation()).bottleneck
    text = " ".join(b.evidence)
    assert "no training step was seen" in text
    assert "nothing else was sampled" in text


def test_a_few_steps_still_say_how_many() -> None:
    b = diagnose(Observation(steps=2, main_cpu_cores=1.0)).bottleneck
    assert b.evidence[0] == "only 2 steps in the window (need at least 3)"


def test_a_pod_still_starting_says_its_first_step_is_to_come_and_asks_for_no_code_change() -> None:
    # What a sidecar reports while its Pod's trainer imports torch: the probe's step counter at 0,
    # no probe file yet (so no main process, no data wait), the node and container sampled.
    obs = Observation(steps=0, window_seconds=30.0, node_cpu_utilization=0.4, container_memory_ratio=0.1)
    b = diagnose(obs).bottleneck
    assert b.regime is Regime.UNKNOWN
    text = " ".join(b.evidence)
    assert "the job has not reached its first step yet (it is starting" in text, text
    assert "no DataLoader was iterated" not in text and "custom" not in text, text
    assert "node CPU 40.0% busy" in text, text
    assert not any("dam_probe.instrument" in m for m in b.missing), b.missing
    assert any("first window after the job's first batch" in m for m in b.missing), b.missing
