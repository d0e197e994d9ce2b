"""Verdicts for humans: a block of text (``dam evaluate``, ``dam run``) and a one-line summary."""

from __future__ import annotations

from dam_operator.diagnosis.goodput import Goodput
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


def _mfu_lines(verdict: Verdict) -> list[str]:
    """``mfu:        41.2% of 989 TFLOP/s per accelerator (H100 SXM bf16 dense)``: what MFU divided by."""
    m = verdict.metrics
    if m.mfu is None or m.peak_flops is None:
        return []
    basis = f" ({m.peak_basis})" if m.peak_basis else ""
    return [f"mfu:        {m.mfu:.1%} of {m.peak_flops / 1e12:.4g} TFLOP/s per accelerator{basis}"]


def render_text(verdict: Verdict) -> str:
    """Axis, regime, lever and its sentence, confidence, evidence, what to avoid, what is missing,
    the straggler and the worst ranks, MFU with the peak it divided by, the iron law."""
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
    lines.extend(_mfu_lines(verdict))
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


GOODPUT_BAR_WIDTH = 50
_LABELS = {
    "productive": ("█", "productive"),
    "startup": ("s", "startup"),
    "data_wait": ("d", "data wait"),
    "communication": ("c", "communication"),
    "checkpoint": ("k", "checkpoint"),
    "restart": ("r", "restart"),
    "other": ("·", "other"),
}


def render_goodput(g: Goodput, width: int = GOODPUT_BAR_WIDTH) -> str:
    """Where the time went, as one stacked bar and a line per cause::

    goodput:    62.0% of 41.2 s productive
      [███████████████████████████████ssssddddddkkkkkk·]
      █ productive  25.5 s  62.0%
      s startup      3.1 s   7.5%
      ...
    """
    total = g.elapsed_seconds
    parts = [("productive", g.productive_seconds), *g.badput_seconds.items()]
    lines = [f"goodput:    {g.ratio:.1%} of {total:.1f} s productive"]
    if total > 0:
        cells = [(key, round(width * v / total)) for key, v in parts]
        bar = "".join(_LABELS[key][0] * n for key, n in cells)[:width]
        lines.append(f"  [{bar.ljust(width)}]")
    for key, seconds in parts:
        if key != "productive" and seconds <= 0 and key in ("restart", "communication"):
            continue
        mark, label = _LABELS[key]
        share = seconds / total if total > 0 else 0.0
        lines.append(f"  {mark} {label:<14}{seconds:8.1f} s {share:6.1%}")
    if g.ratio_upper_bound:
        missing = [
            label
            for key, (_, label) in _LABELS.items()
            if key not in {"productive", "restart"} and getattr(g.badput_seconds, key, 0.0) is None
        ]
        lines.append(
            f"  an upper bound: {', '.join(m.strip() for m in missing)} not measured in every process"
        )
    if g.accelerator_seconds_lost:
        lines.append(f"  accelerator-seconds lost: {g.accelerator_seconds_lost:.1f}")
    return "\n".join(lines) + "\n"
