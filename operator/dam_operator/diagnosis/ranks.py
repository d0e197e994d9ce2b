"""The ranks of one job: skew-corrected communication, the straggler and its cause, per-rank figures.

A synchronous data-parallel job runs every rank at the slowest rank's pace: step rates are
equal, so they cannot name the rank that holds the job back. Collective time can. Every
rank enters each collective and leaves it together; a rank that arrives early waits inside
the collective for the late one. So, per step:

* the rank that waits **least** in collectives arrives **last**: it is the straggler when
  the skew — (max − min collective seconds per step) / step time — exceeds
  ``thresholds.straggler_skew``;
* that least-waiting rank's *exposed* communication is the real cost of communicating; the
  other ranks' extra exposed time is waiting for the late peer, not moving bytes.

Independent (non-synchronous) processes — pods or ranks without collectives — keep the
step-rate test: a process well below the others' median step rate, or one that waits for
data far more than they do, is the straggler.

The cause of a straggler is judged from its own signals against its peers': its data wait
(→ Data), its GPU clocks, slowdown reasons or utilization (→ Machine), its container's CPU
throttling or a saturated node (→ Machine, the host); otherwise Unknown, naming what is
missing. Pure: no I/O.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from dam_operator.diagnosis.model import Axis, Observation, RankFigures, RankId, Straggler, Thresholds

STRAGGLER_RATE_RATIO = 0.75
"""Independent processes: one slower than this fraction of the others' median step rate is a straggler."""
STRAGGLER_WAIT_GAP = 0.10
"""Independent processes: one waiting for data this much more (absolute) than the others, and twice
as much, is a straggler."""
DATA_SHARE_OF_GAP = 0.5
"""A late rank's extra data wait (vs its peers, seconds per step) explaining this share of the
collective gap makes the cause Data."""
CLOCK_RATIO = 0.90
"""A rank whose SM clock is below this fraction of its peers' median runs on a slowed GPU."""
UTIL_GAP = 0.10
"""A rank whose GPU is this much busier (absolute) than its peers' median computes while they wait."""
THROTTLE_GAP = 0.05
"""A rank's container throttled this much more (absolute) than its peers' median, above the screen."""
NODE_CPU_BUSY = 0.90
"""A rank on a node whose CPUs are this busy, while its peers' are not, competes for host CPU."""
MAX_RANK_FIGURES = 8
"""``status.metrics.ranks`` lists at most this many ranks (the worst)."""


def _pct(x: float) -> str:
    return f"{x:.1%}"


def _thr(x: float) -> str:
    return f"{x:.0%}" if round(x * 100, 6) == round(x * 100) else f"{x:.1%}"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def step_seconds(o: Observation) -> float | None:
    """Mean step time of an observation (from the step-seconds counter, else window / steps)."""
    if o.mean_step_seconds is not None and o.mean_step_seconds > 0:
        return o.mean_step_seconds
    if o.steps and o.window_seconds:
        return o.window_seconds / o.steps
    return None


def collective_per_step(o: Observation) -> float | None:
    """Seconds spent in collectives per step (waiting for peers included); None when unknown."""
    if o.collective_seconds is None or not o.steps:
        return None
    return o.collective_seconds / o.steps


def _median(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median(known) if known else None


@dataclass(frozen=True)
class CrossRank:
    """How the ranks of a synchronous job meet at the collectives."""

    ranks: int
    """Ranks with collective figures."""
    least_waiting: RankId | None
    """The rank that waits least in collectives: the one that arrives last."""
    most_waiting: RankId | None
    step_seconds: float | None
    """Median step time of those ranks."""
    min_collective_per_step: float | None
    max_collective_per_step: float | None
    skew: float | None
    """(max − min collective seconds per step) / step time; None below two ranks."""
    exposed_ratio: float | None
    """The least-waiting rank's exposed communication / its step time (skew-corrected)."""


def cross_rank(ranks: Mapping[RankId, Observation]) -> CrossRank:
    """Skew and skew-corrected exposed communication of the ranks that report collectives."""
    timed: list[tuple[float, float, RankId, Observation]] = []
    for key in sorted(ranks, key=RankId.sort_key):
        o = ranks[key]
        c, s = collective_per_step(o), step_seconds(o)
        if c is not None and s is not None:
            exposed = o.exposed_communication_ratio
            timed.append((c, 2.0 if exposed is None else exposed, key, o))
    exposed_known = [
        o.exposed_communication_ratio for o in ranks.values() if o.exposed_communication_ratio is not None
    ]
    if not timed:
        return CrossRank(0, None, None, None, None, None, None, min(exposed_known, default=None))
    least = min(timed, key=lambda x: (x[0], x[1]))
    most = max(timed, key=lambda x: x[0])
    step = _median(step_seconds(o) for *_, o in timed)
    skew = None
    if len(timed) >= 2 and step:
        skew = (most[0] - least[0]) / step
    exposed_ratio = least[3].exposed_communication_ratio
    if exposed_ratio is None:
        exposed_ratio = min(exposed_known, default=None)
    return CrossRank(
        ranks=len(timed),
        least_waiting=least[2],
        most_waiting=most[2] if len(timed) >= 2 else None,
        step_seconds=step,
        min_collective_per_step=least[0],
        max_collective_per_step=most[0],
        skew=skew,
        exposed_ratio=exposed_ratio,
    )


def job_rate(ranks: Mapping[RankId, Observation]) -> tuple[float, float | None] | None:
    """The job's rate and steps for two or more ranks of one job: the median rank's figures.

    Every rank counts every step of a synchronous job, so the sum over ranks would be the rate
    times the world size. The ranks advance together; their counters differ only by when each
    probe last published before the scrape (up to a step either way). The median is that common
    rate, robust to one rank caught early or late — the minimum or maximum of several noisy
    readings would lean low or high. Processes without a rank (``rank`` None) are not ranks of
    one job: None then, and the caller keeps the sum (independent processes add up).
    """
    ranked = [o for k, o in ranks.items() if k.rank is not None]
    if len(ranked) < 2 or len(ranked) != len(ranks):
        return None
    rate = _median(o.steps_per_second for o in ranked)
    if rate is None:
        return None
    return rate, _median(o.steps for o in ranked)


def is_synchronous(ranks: Mapping[RankId, Observation]) -> bool:
    """Two or more ranks report collective time, and some of it is above zero."""
    timed = [o.collective_seconds for o in ranks.values() if collective_per_step(o) is not None]
    return len(timed) >= 2 and any(c for c in timed)


# --- the cause ------------------------------------------------------------------------------


def _cause(
    o: Observation, peers: list[Observation], t: Thresholds, gap_seconds: float | None
) -> tuple[Axis, list[str]]:
    """The straggler's cause from its own signals against its peers'; sentences with numbers.

    ``gap_seconds`` is the collective gap per step (synchronous jobs), None for independent ones.
    """
    ev: list[str] = []
    missing: list[str] = []

    # Data: its own loader.
    w = o.data_wait_ratio
    peer_w = _median(p.data_wait_ratio for p in peers)
    step = step_seconds(o)
    throttled = o.cpu_throttled_ratio is not None and o.cpu_throttled_ratio > t.cpu_throttled_suspect
    throttle_note = (
        f"its container is CPU-throttled {_pct(o.cpu_throttled_ratio or 0.0)} of the window: "
        "the host CPU quota starves its loader"
    )
    if w is not None and peer_w is not None:
        extra = w - peer_w
        if gap_seconds is not None and step is not None:
            explains = extra > 0 and extra * step >= DATA_SHARE_OF_GAP * gap_seconds
            detail = f": {_ms(extra * step)} per step of the {_ms(gap_seconds)} gap" if explains else ""
        else:
            explains = extra >= STRAGGLER_WAIT_GAP and w >= 2 * peer_w
            detail = ""
        if explains:
            ev.append(
                f"its data wait is {_pct(w)} of its step time vs a median of {_pct(peer_w)} "
                f"for its peers{detail}"
            )
            if throttled:
                ev.append(throttle_note)
            return Axis.DATA, ev
    elif w is None:
        missing.append("its data wait (dataWaitRatio)")
    elif w > t.data_wait_suspect:
        ev.append(
            f"its data wait is {_pct(w)} of its step time (screen > {_thr(t.data_wait_suspect)}); "
            "its peers' is not measured"
        )
        return Axis.DATA, ev

    # Machine: its GPU.
    gpu_known = False
    if o.gpu_slowdown_reasons is not None:
        gpu_known = True
        peer_reasons = [
            set(p.gpu_slowdown_reasons or ()) for p in peers if p.gpu_slowdown_reasons is not None
        ]
        own = set(o.gpu_slowdown_reasons)
        common = set.intersection(*peer_reasons) if peer_reasons else set()
        if own - common:
            ev.append(
                "its GPU clocks are held down ("
                + ", ".join(sorted(own - common))
                + ") while its peers' are not"
            )
            return Axis.MACHINE, ev
    peer_clock = _median(p.sm_clock_hertz for p in peers)
    if o.sm_clock_hertz is not None:
        gpu_known = True
        if peer_clock and o.sm_clock_hertz < CLOCK_RATIO * peer_clock:
            ev.append(
                f"its SM clock is {o.sm_clock_hertz / 1e6:.0f} MHz vs a median of {peer_clock / 1e6:.0f} MHz "
                "for its peers: a slowed GPU"
            )
            return Axis.MACHINE, ev
    peer_util = _median(p.gpu_utilization for p in peers)
    if o.gpu_utilization is not None:
        gpu_known = True
        if peer_util is not None and o.gpu_utilization >= peer_util + UTIL_GAP:
            ev.append(
                f"its GPU is busy {_pct(o.gpu_utilization)} vs a median of {_pct(peer_util)} for its peers: "
                "it computes while they wait (a slower GPU, or more work on it)"
            )
            return Axis.MACHINE, ev
    if not gpu_known and o.gpu_count != 0:
        missing.append("its GPU utilization, clocks and slowdown reasons")

    # Machine: its host.
    if o.cpu_throttled_ratio is not None:
        peer_throttle = _median(p.cpu_throttled_ratio for p in peers)
        if throttled and (peer_throttle is None or o.cpu_throttled_ratio >= peer_throttle + THROTTLE_GAP):
            peers_text = "" if peer_throttle is None else f" (its peers' median {_pct(peer_throttle)})"
            ev.append(
                f"its container is CPU-throttled {_pct(o.cpu_throttled_ratio)} of the window{peers_text}, "
                f"screen > {_thr(t.cpu_throttled_suspect)}: the host CPU holds it back"
            )
            return Axis.MACHINE, ev
    else:
        missing.append("its container CPU throttling")
    wait = o.cpu_wait_ratio
    peer_wait = _median(p.cpu_wait_ratio for p in peers)
    if (
        wait is not None
        and wait >= t.cpu_wait_suspect
        and (peer_wait is None or wait >= peer_wait + UTIL_GAP)
    ):
        peers_text = "" if peer_wait is None else f" vs a median of {_pct(peer_wait)} for its peers"
        ev.append(
            f"it waited for a CPU {_pct(wait)} of the window{peers_text} (run-queue delay): "
            "a busy node holds it back"
        )
        return Axis.MACHINE, ev
    node = o.node_cpu_utilization
    peer_node = _median(p.node_cpu_utilization for p in peers)
    if node is not None and node >= NODE_CPU_BUSY and (peer_node is None or peer_node < NODE_CPU_BUSY):
        ev.append(f"its node's CPUs are {node:.0%} busy: the host CPU holds it back")
        return Axis.MACHINE, ev

    text = "cause unknown: its data wait, GPU and host CPU look like its peers'"
    if missing:
        text += "; not measured: " + ", ".join(missing)
    ev.append(text)
    return Axis.UNKNOWN, ev


# --- the straggler --------------------------------------------------------------------------


def _synchronous_straggler(ranks: Mapping[RankId, Observation], t: Thresholds) -> Straggler | None:
    timed = {k: o for k, o in ranks.items() if collective_per_step(o) is not None and step_seconds(o)}
    cr = cross_rank(timed)
    if cr.skew is None or cr.skew <= t.straggler_skew or cr.least_waiting is None or cr.most_waiting is None:
        return None
    assert cr.min_collective_per_step is not None and cr.max_collective_per_step is not None
    assert cr.step_seconds is not None
    late = cr.least_waiting
    gap = cr.max_collective_per_step - cr.min_collective_per_step
    ev = [
        f"{late.describe()} arrives last at the collectives: it waits "
        f"{_ms(cr.min_collective_per_step)} per step in them vs {_ms(cr.max_collective_per_step)} "
        f"for {cr.most_waiting.describe()} "
        f"(skew {_pct(cr.skew)} of the {_ms(cr.step_seconds)} step, threshold > {_thr(t.straggler_skew)})"
    ]
    # Ranks that arrive about as late as it: a pod-wide cause when they share its pod.
    close = [
        k
        for k, o in timed.items()
        if k != late and (collective_per_step(o) or 0.0) - cr.min_collective_per_step <= 0.25 * gap
    ]
    if close:
        pods = {k.pod for k in close}
        where = f" of pod {late.pod}" if pods == {late.pod} and late.pod else ""
        ev.append(f"{len(close)} other rank{'s' if len(close) > 1 else ''}{where} arrive about as late")
    peers = [o for k, o in timed.items() if k != late and k not in close] or [
        o for k, o in timed.items() if k != late
    ]
    cause, cause_ev = _cause(timed[late], peers, t, gap)
    return Straggler(pod=late.pod or None, rank=late.rank, cause=cause, evidence=ev + cause_ev)


def _independent_straggler(ranks: Mapping[RankId, Observation], t: Thresholds) -> Straggler | None:
    if len(ranks) < 2:
        return None
    ranked = any(k.rank is not None for k in ranks)
    noun = "rank" if ranked else "pod"
    worst: tuple[float, RankId, str, bool] | None = None
    for key in sorted(ranks, key=RankId.sort_key):
        obs = ranks[key]
        others = [o for k, o in ranks.items() if k != key]
        n = len(others)
        plural = noun if n == 1 else f"{n} {noun}s"
        rates = [o.steps_per_second for o in others if o.steps_per_second is not None]
        if obs.steps_per_second is not None and rates:
            median = statistics.median(rates)
            if median > 0 and obs.steps_per_second < STRAGGLER_RATE_RATIO * median:
                score = 1.0 - obs.steps_per_second / median
                text = (
                    f"{key.describe()} runs {obs.steps_per_second:.2f} steps/s vs a median of {median:.2f} "
                    f"steps/s for the other {plural}"
                )
                if worst is None or score > worst[0]:
                    worst = (score, key, text, False)
        waits = [o.data_wait_ratio for o in others if o.data_wait_ratio is not None]
        if obs.data_wait_ratio is not None and waits:
            median_wait = statistics.median(waits)
            gap = obs.data_wait_ratio - median_wait
            if gap >= STRAGGLER_WAIT_GAP and obs.data_wait_ratio >= 2 * median_wait:
                text = (
                    f"{key.describe()} waits for data {obs.data_wait_ratio:.1%} of its step time "
                    f"vs a median of {median_wait:.1%} for the other {plural}"
                )
                if worst is None or gap > worst[0]:
                    worst = (gap, key, text, True)
    if worst is None:
        return None
    _, key, text, by_wait = worst
    peers = [o for k, o in ranks.items() if k != key]
    cause_ev: list[str] = []
    if by_wait:
        cause = Axis.DATA
    else:
        cause, cause_ev = _cause(ranks[key], peers, t, None)
    return Straggler(pod=key.pod or None, rank=key.rank, cause=cause, evidence=[text, *cause_ev])


STRAGGLER_PREFIX = "straggler ("


def straggler_sentence(straggler: Straggler) -> str:
    """The bottleneck's evidence line for a straggler: its cause and its first figure."""
    first = straggler.evidence[0] if straggler.evidence else ""
    return f"{STRAGGLER_PREFIX}{straggler.cause.value}): {first}"


def find_straggler(
    ranks: Mapping[RankId, Observation], thresholds: Thresholds | None = None
) -> Straggler | None:
    """The rank (or pod) that holds the job back, with its cause; None when none stands out.

    Synchronous jobs (two or more ranks report collective time): the least-waiting rank when
    the collective skew exceeds ``thresholds.straggler_skew``. Otherwise (independent pods or
    ranks): the step-rate and data-wait test.
    """
    t = thresholds or Thresholds()
    if is_synchronous(ranks):
        return _synchronous_straggler(ranks, t)
    return _independent_straggler(ranks, t)


# --- per-rank figures -----------------------------------------------------------------------


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def rank_figures(ranks: Mapping[RankId, Observation], limit: int = MAX_RANK_FIGURES) -> list[RankFigures]:
    """At most ``limit`` ranks, the worst first: the latest at the collectives (least collective
    time per step), then the highest data wait, then the slowest. Ranks are compared on the
    figures as published (rounded), and ranks that look the same there keep their (pod, rank)
    order: the table does not reorder from one window to the next on rounding noise."""

    def lateness(key: RankId) -> tuple[float, float, float, tuple[str, int]]:
        o = ranks[key]
        c = collective_per_step(o)
        s = step_seconds(o)
        c_ratio = _round(c / s) if c is not None and s else None
        steps = _round(o.steps_per_second)
        return (
            math.inf if c_ratio is None else c_ratio,
            -(_round(o.data_wait_ratio) or 0.0),
            math.inf if steps is None else steps,
            key.sort_key(),
        )

    out: list[RankFigures] = []
    for key in sorted(ranks, key=lateness)[: max(0, limit)]:
        o = ranks[key]
        out.append(
            RankFigures(
                rank=key.rank,
                pod=key.pod or None,
                steps_per_second=_round(o.steps_per_second),
                data_wait_ratio=_round(o.data_wait_ratio),
                collective_ratio=_round(o.collective_ratio),
                exposed_ratio=_round(o.exposed_communication_ratio),
            )
        )
    return out
