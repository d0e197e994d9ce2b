"""Verdicts for humans: a block of text (``dam evaluate``, ``dam run``) and a one-line summary."""

from __future__ import annotations

from dam_operator.diagnosis.model import Verdict


def _axis(verdict: Verdict) -> str:
    b = verdict.bottleneck
    return f"{b.axis.value} (boundary {b.boundary.value})" if b.boundary else b.axis.value


def render_line(verdict: Verdict) -> str:
    """``Data · input-bound · increase-dataloader-workers · confidence 0.90``."""
    b = verdict.bottleneck
    parts = [_axis(verdict), b.regime.value, b.lever, f"confidence {b.confidence:.2f}"]
    if b.evidence:
        parts.append(b.evidence[0])
    return " · ".join(parts)


def render_text(verdict: Verdict) -> str:
    """Axis, regime, lever and its sentence, confidence, evidence, what to avoid, what is missing."""
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
