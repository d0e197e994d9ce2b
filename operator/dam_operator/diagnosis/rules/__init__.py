"""The referee: which rule's finding is the verdict (``decide``).

Each rule is one regime or screen, a pure function of the window (``base.Context``) that reads
the observation and answers with a ``base.Finding`` or passes (None); no rule asks another. The
rules, each with its ``base.Stage``, are listed with their regimes in ``regimes.REGIMES``
(``regimes.RULES`` in stage order). The referee asks the stages in order; the first stage with a
finding decides: the largest loss among its findings (``Finding.loss``, a share of the window's
wall time; an equal loss goes to the rule asked last), or, in a stage whose rules weigh no loss,
the first rule that answers. The thresholds are in
``docs/method.md``. Adding one: docs/CONTRIBUTING.md, "Add a regime or a screen".
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import groupby

from dam_operator.diagnosis.axes import Regime
from dam_operator.diagnosis.evidence import note
from dam_operator.diagnosis.rules.base import Context, Finding, Rule


def _weight(found: tuple[int, Finding]) -> tuple[float, int]:
    """The largest loss; of equal losses the rule asked last (a stage whose rules weigh no loss:
    the first that answers)."""
    i, f = found
    return (f.loss, i) if f.loss is not None else (0.0, -i)


def _referee(rules: Sequence[Rule], ctx: Context) -> Finding:
    stages = [
        list(stage) for _, stage in groupby(sorted(rules, key=lambda r: r.stage), key=lambda r: r.stage)
    ]
    for n, stage in enumerate(stages):
        found = [(i, f) for i, rule in enumerate(stage) if (f := rule.judge(ctx)) is not None]
        if not found:
            continue
        i, verdict = max(found, key=_weight)
        aside = stage[i].aside
        if aside is not None:
            rest = _referee([r for later in stages[n + 1 :] for r in later], ctx)
            if rest.regime is not Regime.UNKNOWN:
                verdict.evidence.append(
                    note(f"{aside} the window reads as {rest.regime.value} (lever {rest.lever})")
                )
        return verdict
    raise AssertionError("the last rule always answers")  # pragma: no cover


def decide(ctx: Context, rules: Sequence[Rule]) -> Finding:
    """The referee's pick among the answers of ``rules`` for the window (the last stage always
    answers), with the suspects the rules named on the way (a screen crossed whose term did not
    dominate)."""
    found = _referee(rules, ctx)
    for suspect in ctx.suspects:
        if all(e.sentence != suspect.sentence for e in found.evidence):
            found.evidence.append(suspect)
    return found
