"""Communication-bound (Machine, boundary Algorithm): the skew-corrected exposed communication,
the least-waiting rank's, above ``communication_suspect`` of the step."""

from __future__ import annotations

from dam_operator.diagnosis import evidence as ev
from dam_operator.diagnosis.axes import Kind
from dam_operator.diagnosis.evidence import Evidence
from dam_operator.diagnosis.levers import Regime
from dam_operator.diagnosis.model import Observation
from dam_operator.diagnosis.rules.base import Context, Finding
from dam_operator.diagnosis.rules.dominance import CONFIDENT_SCREENS, named_suspect, of_window

OVERLAP_HIDDEN_WELL = 0.5
"""Collective time more than this share hidden behind the backward pass: overlap already works."""


def _suspect(ctx: Context, x: float) -> bool:
    """The exposed communication crossed its screen but does not dominate the window."""
    return named_suspect(
        ctx,
        x,
        screen=ctx.t.communication_suspect,
        kind=Kind.COLLECTIVES,
        what="exposed communication",
        key="exposed_communication_ratio",
    )


def _traffic(o: Observation) -> list[Evidence]:
    out: list[Evidence] = []
    if o.collectives is not None and o.steps:
        text = f"{o.collectives / o.steps:.1f} collectives per step"
        numbers = {"collectives_per_step": o.collectives / o.steps}
        if o.collective_bytes is not None:
            text += f", {o.collective_bytes / o.steps / 1e6:.1f} MB per step"
            numbers["collective_bytes_per_step"] = o.collective_bytes / o.steps
        out.append(Evidence(Kind.COLLECTIVES, text, numbers))
    links: list[str] = []
    link_numbers: dict[str, float] = {}
    if o.nvlink_bytes_per_second is not None:
        links.append(f"NVLink {o.nvlink_bytes_per_second / 1e9:.2f} GB/s")
        link_numbers["nvlink_bytes_per_second"] = o.nvlink_bytes_per_second
    if o.pcie_bytes_per_second is not None:
        links.append(f"PCIe {o.pcie_bytes_per_second / 1e9:.2f} GB/s")
        link_numbers["pcie_bytes_per_second"] = o.pcie_bytes_per_second
    if links:
        out.append(Evidence(Kind.INTERCONNECT, "interconnect traffic: " + ", ".join(links), link_numbers))
        if not o.nvlink_bytes_per_second and (o.pcie_bytes_per_second or 0.0) > 0:
            out.append(ev.note("no NVLink traffic: the ranks talk over PCIe or the network"))
    return out


def communication_bound(ctx: Context) -> Finding | None:
    o, t = ctx.obs, ctx.t
    x = o.exposed_communication_ratio
    if x is None or x <= t.communication_suspect or _suspect(ctx, x):
        return None
    conf = 0.85 if x >= CONFIDENT_SCREENS * t.communication_suspect else 0.7
    seen = [ev.exposed_communication(o, t)]
    missing: list[str] = []
    if o.collective_skew is not None:
        seen.append(
            Evidence(
                Kind.COLLECTIVES,
                f"collective skew {ev.pct(o.collective_skew)} of the step: waiting for a late peer is not "
                "counted as communication",
                {"collective_skew": o.collective_skew},
            )
        )
    else:
        conf -= 0.1
        missing.append("collectiveSeconds from every rank (to correct for waiting on a late peer)")
    lever = "overlap-gradient-communication"
    c = o.collective_ratio
    if c is not None and c > 0:
        hidden = max(0.0, 1.0 - x / c)
        text = f"collectives take {ev.pct(c)} of the step time, {hidden:.0%} of it hidden by overlap"
        seen.append(Evidence(Kind.COLLECTIVES, text, {"collective_ratio": c, "hidden": hidden}))
        if hidden >= OVERLAP_HIDDEN_WELL:
            lever = "accumulate-gradients"
            seen.append(ev.note("overlap already hides most of it: synchronise less often"))
    seen.extend(_traffic(o))
    if (o.data_wait_ratio or 0.0) > t.data_wait_suspect:
        seen.append(ev.data_wait(o, t))
    return Finding(Regime.COMMUNICATION_BOUND, lever, conf, seen, missing, loss=of_window(ctx, x))
