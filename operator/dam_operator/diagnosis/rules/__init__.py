"""The decision rules, in the order the engine asks them (``RULES``).

Each rule is one regime or screen, a pure function of the window (``base.Context``) that answers
with a ``base.Finding`` or passes (None); the first that answers decides. The thresholds are in
``docs/method.md``. Adding one: docs/CONTRIBUTING.md, "Add a regime or a screen".
"""

from __future__ import annotations

from dam_operator.diagnosis.evidence import note
from dam_operator.diagnosis.levers import Regime
from dam_operator.diagnosis.rules import checkpoint, data, evidence_screen, gpu, host, memory
from dam_operator.diagnosis.rules.base import Context, Finding, Rule

RULES: tuple[Rule, ...] = (
    # 1. First, over everything: a job being killed for memory is not input-bound. It outranks the
    #    rest, which is still walked and named ("apart from memory the window reads as ...").
    Rule("memory-capacity", memory.memory_capacity, aside="apart from memory"),
    # 2. Before any regime: with no training step, or too few, every figure below is noise.
    Rule("no-training-step", evidence_screen.no_step),
    Rule("too-few-steps", evidence_screen.too_few_steps),
    # 3. Checkpoint saves before Data and communication, but it steps aside itself when the data
    #    wait or the exposed communication is the larger loss (the largest loss is cut first).
    Rule("checkpoint-bound", checkpoint.checkpoint_bound),
    # 4. Data and communication together: when both screens fire, the larger share of the step
    #    wins. Before the GPU rules: an idle GPU is their consequence, not their cause.
    Rule("input-or-communication", data.input_or_communication),
    # 5. A fed GPU (utilization at or above the starved line): memory-, latency- or compute-bound.
    #    Before the busy node: a GPU kept busy is not held back by the host.
    Rule("gpu-fed", gpu.gpu_fed),
    # 6. A busy node: the host's run queue, before the GPU-starved rule, which would otherwise
    #    read the host's wait as launch overhead.
    Rule("busy-node", host.busy_node),
    # 7. A starved GPU with no data wait: launch, Python or host-sync overhead.
    Rule("gpu-starved", gpu.gpu_starved),
    # 8. No GPU counters at all: the CPU does the work (or overhead dominates).
    Rule("cpu-only", host.cpu_only),
    # 9. Last, always answers: a GPU is there but its utilization is not measured.
    Rule("gpu-unmeasured", gpu.gpu_unmeasured),
)


def _first(rules: tuple[Rule, ...], ctx: Context) -> Finding:
    for i, rule in enumerate(rules):
        found = rule.judge(ctx)
        if found is None:
            continue
        if rule.aside is not None:
            rest = _first(rules[i + 1 :], ctx)
            if rest.regime is not Regime.UNKNOWN:
                found.evidence.append(
                    note(f"{rule.aside} the window reads as {rest.regime.value} (lever {rest.lever})")
                )
        return found
    raise AssertionError("the last rule always answers")  # pragma: no cover


def decide(ctx: Context, rules: tuple[Rule, ...] = RULES) -> Finding:
    """The first answer of ``rules`` for the window (the last rule always answers), with the
    suspects the rules named on the way (a screen crossed whose term did not dominate)."""
    found = _first(rules, ctx)
    for suspect in ctx.suspects:
        if all(e.sentence != suspect.sentence for e in found.evidence):
            found.evidence.append(suspect)
    return found
