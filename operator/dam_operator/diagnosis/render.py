"""Verdicts for humans: a block of text (``dam evaluate``, ``dam run``) and a one-line summary."""

from __future__ import annotations

from dam_operator.diagnosis.model import Verdict


def _axis(verdict: Verdict) -> str:
    b = verdict.bottleneck
    return f"{b.axis.value} (boundary {b.boundary.value})" if b.boundary else b.axis.value


def _fig(value: float | int | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def render_line(verdict: Verdict) -> str:
    """``Data · input-bound · increase-dataloader-workers · confidence 0.90``."""
    b = verdict.bottleneck
    parts = [_axis(verdict), b.regime.value, b.lever, f"confidence {b.confidence:.2f}"]
    if b.evidence:
        parts.append(b.evidence[0])
    return " · ".join(parts)


def render_text(verdict: Verdict) -> str:
    """Axis, regime, lever and its sentence, confidence, evidence, what to avoid, what is missing,
    the straggler and the worst ranks."""
    b = verdict.bottleneck
    lines = [
        f"axis:       {_axis(verdict)}",
        f"regime:     {b.regime.value}",
        f"lever:      {b.lever}",
        f"            {b.lever_detail}",
        f"confidence: {b.confidence:.2f}",
    ]
    if b.since:
        lines.append(f"since:      {b.since}")
    if b.evidence:
        lines.append("evidence:")
        lines.extend(f"  - {e}" for e in b.evidence)
    if b.avoid:
        lines.append("avoid:      " + ", ".join(b.avoid))
    if b.missing:
        lines.append("missing:")
        lines.extend(f"  - {m}" for m in b.missing)
    s = b.straggler
    if s is not None:
        who = f"rank {s.rank}" if s.rank is not None else ""
        if s.pod:
            who = f"{who} (pod {s.pod})" if who else f"pod {s.pod}"
        lines.append(f"straggler:  {who or 'a process'} · cause {s.cause.value}")
        lines.extend(f"  - {e}" for e in s.evidence)
    ranks = verdict.metrics.ranks
    if ranks:
        total = verdict.metrics.rank_count or len(ranks)
        shown = f" (worst {len(ranks)} of {total})" if total > len(ranks) else ""
        lines.append(f"ranks:{shown}")
        lines.append("  rank  pod                   steps/s   wait  collective  exposed")
        for r in ranks:
            lines.append(
                f"  {_fig(r.rank, 'd'):>4}  {(r.pod or '-')[:20]:<20}  {_fig(r.steps_per_second, '.2f'):>7}"
                f"  {_fig(r.data_wait_ratio, '.1%'):>5}  {_fig(r.collective_ratio, '.1%'):>10}"
                f"  {_fig(r.exposed_ratio, '.1%'):>7}"
            )
    iron = verdict.metrics.iron_law
    if iron is not None and iron.step_seconds is not None:
        terms = [f"step {iron.step_seconds * 1000:.1f} ms"]
        for label, value in (
            ("data", iron.data_seconds),
            ("compute", iron.compute_seconds),
            ("latency", iron.latency_seconds),
        ):
            if value is not None:
                terms.append(f"{label} {value * 1000:.1f} ms")
        lines.append("iron law:   " + ", ".join(terms))
    return "\n".join(lines) + "\n"
