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
missing. Each line of ``Straggler.evidence`` is an ``Evidence`` record (its kind and the numbers
it states), one builder per sentence below. Pure: no I/O.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from dam_operator.diagnosis.axes import Kind
from dam_operator.diagnosis.evidence import Evidence, note, pct, thr
from dam_operator.diagnosis.levers import Axis
from dam_operator.diagnosis.model import Observation, RankFigures, RankId, Straggler, Thresholds

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


# --- one rank saves, the others wait ------------------------------------------------------------

SAVER_SHARE = 0.5
"""A rank saving less than this share of the heaviest saver's checkpoint time waits for it (the
pattern "rank 0 saves, the others wait at a barrier"); one saving more saves its own shard."""


@dataclass(frozen=True)
class SaveWait:
    """One rank saves while its peers wait for it in the collectives: their wait is the save's.

    A save blocks the saver's training thread, so it enters no collective meanwhile; a peer that
    reaches one waits there (a barrier, the next all-reduce) up to the length of the save. The
    waiters' exposed communication, up to the saver's checkpoint seconds, is checkpoint time.
    """

    saver: RankId
    saver_seconds: float
    """Seconds the saver's training thread blocked in checkpoint saves in the window."""
    waiters: tuple[RankId, ...]
    exposed_seconds: float
    """The waiters' median exposed communication in the window."""
    waited_seconds: float
    """The waiters' median exposed communication that the saves explain (each at most
    ``saver_seconds``)."""
    exposed_ratio: float | None
    """The skew-corrected exposed communication (``cross_rank``) with the wait for the saves taken
    out, where the least-waiting rank is a waiter; None where it is the saver (nothing to take out)."""

    def evidence(self) -> Evidence:
        """``rank 1 waits 19.8 s in collectives while rank 0 saves 18.0 s: 18.0 s of it …``"""
        n = len(self.waiters)
        who = self.waiters[0].describe() if n == 1 else f"the {n} other ranks"
        verb = "waits" if n == 1 else "wait (median)"
        text = (
            f"{who} {verb} {self.exposed_seconds:.1f} s in collectives while {self.saver.describe()} "
            f"saves {self.saver_seconds:.1f} s: {self.waited_seconds:.1f} s of that wait is the "
            "checkpoint's, not communication"
        )
        numbers = {
            "exposed_seconds": self.exposed_seconds,
            "waited_seconds": self.waited_seconds,
            "saver_checkpoint_seconds": self.saver_seconds,
        }
        return Evidence(Kind.CHECKPOINT, text, numbers | {"waiters": float(n)})


def save_wait(ranks: Mapping[RankId, Observation]) -> SaveWait | None:
    """The saver and its waiters, when one rank of a synchronous job saves and the others do not
    (less than ``SAVER_SHARE`` of its time) and wait in collectives; None otherwise."""
    if not is_synchronous(ranks):
        return None
    saving = sorted(
        ((o.checkpoint_seconds, k) for k, o in ranks.items() if o.checkpoint_seconds),
        key=lambda x: (-x[0], x[1].sort_key()),
    )
    if not saving:
        return None
    seconds, saver = saving[0]
    exposed: dict[RankId, float] = {}
    for key in sorted(ranks, key=RankId.sort_key):
        o = ranks[key]
        if (
            key != saver
            and (o.checkpoint_seconds or 0.0) < SAVER_SHARE * seconds
            and o.collective_exposed_seconds
        ):
            exposed[key] = o.collective_exposed_seconds
    if not exposed:
        return None
    # A waiter waits for the saves at most as long as they last.
    waiting = {k: min(v, seconds) for k, v in exposed.items()}
    return SaveWait(
        saver,
        seconds,
        tuple(waiting),
        statistics.median(exposed.values()),
        statistics.median(waiting.values()),
        _corrected_exposed(ranks, waiting),
    )


def _corrected_exposed(ranks: Mapping[RankId, Observation], waiting: Mapping[RankId, float]) -> float | None:
    """The least-waiting rank's exposed ratio less its wait for the saves (it is a waiter)."""
    late = cross_rank(ranks).least_waiting
    if late is None or late not in waiting:
        return None
    o = ranks[late]
    x, seconds = o.exposed_communication_ratio, o.collective_exposed_seconds
    if x is None or not seconds:
        return None
    return x * max(0.0, seconds - waiting[late]) / seconds


# --- the straggler's sentences: one record each ----------------------------------------------


def _data_wait_vs_peers(w: float, peer_w: float, detail: str) -> Evidence:
    text = f"its data wait is {pct(w)} of its step time vs a median of {pct(peer_w)} for its peers{detail}"
    return Evidence(Kind.DATA_WAIT, text, {"data_wait_ratio": w, "peer_data_wait_ratio": peer_w})


def _data_wait_unpaired(w: float, t: Thresholds) -> Evidence:
    text = (
        f"its data wait is {pct(w)} of its step time (screen > {thr(t.data_wait_suspect)}); "
        "its peers' is not measured"
    )
    return Evidence(Kind.DATA_WAIT, text, {"data_wait_ratio": w})


def _loader_quota(throttled: float) -> Evidence:
    text = (
        f"its container is CPU-throttled {pct(throttled)} of the window: "
        "the host CPU quota starves its loader"
    )
    return Evidence(Kind.CPU_THROTTLED, text, {"cpu_throttled_ratio": throttled})


def _clocks_held(reasons: set[str]) -> Evidence:
    text = "its GPU clocks are held down (" + ", ".join(sorted(reasons)) + ") while its peers' are not"
    return Evidence(Kind.GPU_SLOWDOWN, text)


def _slow_clock(hertz: float, peer_hertz: float) -> Evidence:
    text = (
        f"its SM clock is {hertz / 1e6:.0f} MHz vs a median of {peer_hertz / 1e6:.0f} MHz "
        "for its peers: a slowed GPU"
    )
    return Evidence(Kind.SM_CLOCK, text, {"sm_clock_hertz": hertz, "peer_sm_clock_hertz": peer_hertz})


def _busier_gpu(u: float, peer_u: float) -> Evidence:
    text = (
        f"its GPU is busy {pct(u)} vs a median of {pct(peer_u)} for its peers: "
        "it computes while they wait (a slower GPU, or more work on it)"
    )
    return Evidence(Kind.GPU_UTILIZATION, text, {"gpu_utilization": u, "peer_gpu_utilization": peer_u})


def _host_quota(throttled: float, peer: float | None, t: Thresholds) -> Evidence:
    peers_text = "" if peer is None else f" (its peers' median {pct(peer)})"
    text = (
        f"its container is CPU-throttled {pct(throttled)} of the window{peers_text}, "
        f"screen > {thr(t.cpu_throttled_suspect)}: the host CPU holds it back"
    )
    numbers = {"cpu_throttled_ratio": throttled} | (
        {} if peer is None else {"peer_cpu_throttled_ratio": peer}
    )
    return Evidence(Kind.CPU_THROTTLED, text, numbers)


def _run_queue(wait: float, peer: float | None) -> Evidence:
    peers_text = "" if peer is None else f" vs a median of {pct(peer)} for its peers"
    text = (
        f"it waited for a CPU {pct(wait)} of the window{peers_text} (run-queue delay): "
        "a busy node holds it back"
    )
    numbers = {"cpu_wait_ratio": wait} | ({} if peer is None else {"peer_cpu_wait_ratio": peer})
    return Evidence(Kind.CPU_WAIT, text, numbers)


def _busy_node(node: float) -> Evidence:
    text = f"its node's CPUs are {node:.0%} busy: the host CPU holds it back"
    return Evidence(Kind.NODE_CPU, text, {"node_cpu_utilization": node})


def _cause_unknown(missing: list[str]) -> Evidence:
    text = "cause unknown: its data wait, GPU and host CPU look like its peers'"
    if missing:
        text += "; not measured: " + ", ".join(missing)
    return note(text)


# --- the cause ------------------------------------------------------------------------------


def _throttled(o: Observation, t: Thresholds) -> bool:
    return o.cpu_throttled_ratio is not None and o.cpu_throttled_ratio > t.cpu_throttled_suspect


def _data_cause(
    o: Observation, peers: list[Observation], t: Thresholds, gap_seconds: float | None, missing: list[str]
) -> list[Evidence] | None:
    """Data: its own loader waits more than its peers' (enough to explain the collective gap, for a
    synchronous job), or above the screen where its peers' wait is not measured."""
    w = o.data_wait_ratio
    peer_w = _median(p.data_wait_ratio for p in peers)
    if w is None:
        missing.append("its data wait (dataWaitRatio)")
        return None
    if peer_w is None:
        return [_data_wait_unpaired(w, t)] if w > t.data_wait_suspect else None
    extra = w - peer_w
    step = step_seconds(o)
    if gap_seconds is not None and step is not None:
        explains = extra > 0 and extra * step >= DATA_SHARE_OF_GAP * gap_seconds
        detail = f": {_ms(extra * step)} per step of the {_ms(gap_seconds)} gap" if explains else ""
    else:
        explains = extra >= STRAGGLER_WAIT_GAP and w >= 2 * peer_w
        detail = ""
    if not explains:
        return None
    records = [_data_wait_vs_peers(w, peer_w, detail)]
    if _throttled(o, t):
        records.append(_loader_quota(o.cpu_throttled_ratio or 0.0))
    return records


def _gpu_cause(o: Observation, peers: list[Observation], missing: list[str]) -> Evidence | None:
    """Machine, its GPU: slowdown reasons its peers do not share, a slower SM clock, a busier GPU."""
    if o.gpu_slowdown_reasons is not None:
        peer_reasons = [set(p.gpu_slowdown_reasons) for p in peers if p.gpu_slowdown_reasons is not None]
        common = set.intersection(*peer_reasons) if peer_reasons else set()
        own = set(o.gpu_slowdown_reasons) - common
        if own:
            return _clocks_held(own)
    peer_clock = _median(p.sm_clock_hertz for p in peers)
    if o.sm_clock_hertz is not None and peer_clock and o.sm_clock_hertz < CLOCK_RATIO * peer_clock:
        return _slow_clock(o.sm_clock_hertz, peer_clock)
    peer_util = _median(p.gpu_utilization for p in peers)
    u = o.gpu_utilization
    if u is not None and peer_util is not None and u >= peer_util + UTIL_GAP:
        return _busier_gpu(u, peer_util)
    gpu_known = any(x is not None for x in (o.gpu_slowdown_reasons, o.sm_clock_hertz, u))
    if not gpu_known and o.gpu_count != 0:
        missing.append("its GPU utilization, clocks and slowdown reasons")
    return None


def _host_cause(
    o: Observation, peers: list[Observation], t: Thresholds, missing: list[str]
) -> Evidence | None:
    """Machine, its host: its container throttled more than its peers', its process waiting for a
    CPU, or its node's CPUs busy while its peers' are not."""
    throttled = o.cpu_throttled_ratio
    if throttled is None:
        missing.append("its container CPU throttling")
    else:
        peer_throttle = _median(p.cpu_throttled_ratio for p in peers)
        if _throttled(o, t) and (peer_throttle is None or throttled >= peer_throttle + THROTTLE_GAP):
            return _host_quota(throttled, peer_throttle, t)
    wait = o.cpu_wait_ratio
    peer_wait = _median(p.cpu_wait_ratio for p in peers)
    if (
        wait is not None
        and wait >= t.cpu_wait_suspect
        and (peer_wait is None or wait >= peer_wait + UTIL_GAP)
    ):
        return _run_queue(wait, peer_wait)
    node = o.node_cpu_utilization
    peer_node = _median(p.node_cpu_utilization for p in peers)
    if node is not None and node >= NODE_CPU_BUSY and (peer_node is None or peer_node < NODE_CPU_BUSY):
        return _busy_node(node)
    return None


def _saves_per_step(o: Observation) -> float | None:
    """Seconds per step the process's training thread blocked in checkpoint saves (0 when it
    times saves and made none)."""
    if o.checkpoint_seconds is None or not o.steps:
        return None
    return o.checkpoint_seconds / o.steps


def _checkpoint_cause(o: Observation, peers: list[Observation], gap_seconds: float | None) -> Evidence | None:
    """Machine (I/O): a synchronous job's late rank saves checkpoints its peers do not (rank 0
    saves, the others wait in the next collective), enough to explain half the collective gap."""
    own = _saves_per_step(o)
    if own is None or gap_seconds is None or gap_seconds <= 0:
        return None
    peer = _median(_saves_per_step(p) for p in peers) or 0.0
    extra = own - peer
    if extra <= 0 or extra < DATA_SHARE_OF_GAP * gap_seconds:
        return None
    peer_total = _median(p.checkpoint_seconds for p in peers) or 0.0
    text = (
        f"its checkpoint saves block it {_ms(extra)} per step of the {_ms(gap_seconds)} gap "
        f"({o.checkpoint_seconds or 0.0:.1f} s in the window vs a median of {peer_total:.1f} s for its "
        "peers): they wait in the collectives while it saves"
    )
    numbers = {"checkpoint_seconds_per_step": own, "peer_checkpoint_seconds_per_step": peer}
    return Evidence(Kind.CHECKPOINT, text, numbers)


def _cause(
    o: Observation, peers: list[Observation], t: Thresholds, gap_seconds: float | None
) -> tuple[Axis, list[Evidence]]:
    """The straggler's cause from its own signals against its peers'; records with the numbers.

    Its own checkpoint saves first (Machine, I/O: the others wait while it saves), then Data (its
    loader), then the Machine (its GPU, then its host); otherwise Unknown, naming what is not
    measured. ``gap_seconds`` is the collective gap per step (synchronous jobs), None for
    independent ones.
    """
    missing: list[str] = []
    saves = _checkpoint_cause(o, peers, gap_seconds)
    if saves is not None:
        return Axis.MACHINE, [saves]
    data = _data_cause(o, peers, t, gap_seconds, missing)
    if data is not None:
        return Axis.DATA, data
    machine = _gpu_cause(o, peers, missing) or _host_cause(o, peers, t, missing)
    if machine is not None:
        return Axis.MACHINE, [machine]
    return Axis.UNKNOWN, [_cause_unknown(missing)]


# --- the straggler --------------------------------------------------------------------------


def _arrives_last(late: RankId, most: RankId, cr: CrossRank, t: Thresholds) -> Evidence:
    assert cr.min_collective_per_step is not None and cr.max_collective_per_step is not None
    assert cr.step_seconds is not None and cr.skew is not None
    text = (
        f"{late.describe()} arrives last at the collectives: it waits "
        f"{_ms(cr.min_collective_per_step)} per step in them vs {_ms(cr.max_collective_per_step)} "
        f"for {most.describe()} "
        f"(skew {pct(cr.skew)} of the {_ms(cr.step_seconds)} step, threshold > {thr(t.straggler_skew)})"
    )
    numbers = {
        "collective_skew": cr.skew,
        "min_collective_seconds_per_step": cr.min_collective_per_step,
        "max_collective_seconds_per_step": cr.max_collective_per_step,
        "step_seconds": cr.step_seconds,
    }
    return Evidence(Kind.COLLECTIVE_SKEW, text, numbers)


def _late_too(late: RankId, close: list[RankId]) -> Evidence:
    pods = {k.pod for k in close}
    where = f" of pod {late.pod}" if pods == {late.pod} and late.pod else ""
    text = f"{len(close)} other rank{'s' if len(close) > 1 else ''}{where} arrive about as late"
    return Evidence(Kind.LATE_RANKS, text, {"ranks": len(close)})


def _synchronous_straggler(ranks: Mapping[RankId, Observation], t: Thresholds) -> Straggler | None:
    timed = {k: o for k, o in ranks.items() if collective_per_step(o) is not None and step_seconds(o)}
    cr = cross_rank(timed)
    if cr.skew is None or cr.skew <= t.straggler_skew or cr.least_waiting is None or cr.most_waiting is None:
        return None
    assert cr.min_collective_per_step is not None and cr.max_collective_per_step is not None
    late = cr.least_waiting
    gap = cr.max_collective_per_step - cr.min_collective_per_step
    records = [_arrives_last(late, cr.most_waiting, cr, t)]
    # Ranks that arrive about as late as it: a pod-wide cause when they share its pod.
    close = [
        k
        for k, o in timed.items()
        if k != late and (collective_per_step(o) or 0.0) - cr.min_collective_per_step <= 0.25 * gap
    ]
    if close:
        records.append(_late_too(late, close))
    peers = [o for k, o in timed.items() if k != late and k not in close] or [
        o for k, o in timed.items() if k != late
    ]
    cause, cause_records = _cause(timed[late], peers, t, gap)
    return Straggler.of([*records, *cause_records], pod=late.pod or None, rank=late.rank, cause=cause)


def _slower(key: RankId, rate: float, median: float, others: str) -> Evidence:
    text = (
        f"{key.describe()} runs {rate:.2f} steps/s vs a median of {median:.2f} steps/s for the other {others}"
    )
    return Evidence(Kind.STEP_RATE, text, {"steps_per_second": rate, "peer_steps_per_second": median})


def _waits_more(key: RankId, wait: float, median: float, others: str) -> Evidence:
    text = (
        f"{key.describe()} waits for data {wait:.1%} of its step time "
        f"vs a median of {median:.1%} for the other {others}"
    )
    return Evidence(Kind.DATA_WAIT, text, {"data_wait_ratio": wait, "peer_data_wait_ratio": median})


def _median_without(ordered: list[float], value: float) -> float | None:
    """The median of ``ordered`` (sorted) with one ``value`` taken out: what ``statistics.median``
    of the others gives, in O(log n) (``value`` must be in ``ordered``); None when nothing is left."""
    n = len(ordered) - 1
    if n <= 0:
        return None
    at = bisect.bisect_left(ordered, value)

    def nth(j: int) -> float:  # the j-th of the others
        return ordered[j] if j < at else ordered[j + 1]

    if n % 2:
        return nth(n // 2)
    return (nth(n // 2 - 1) + nth(n // 2)) / 2


@dataclass(frozen=True)
class _Peers:
    """The independent processes' step rates and data waits, sorted: each process's peers'
    medians without a pass over the others per process (8,000 ranks: 64 million reads else)."""

    rates: list[float]
    waits: list[float]
    count: int

    @classmethod
    def of(cls, ranks: Mapping[RankId, Observation]) -> _Peers:
        rates = sorted(o.steps_per_second for o in ranks.values() if o.steps_per_second is not None)
        waits = sorted(o.data_wait_ratio for o in ranks.values() if o.data_wait_ratio is not None)
        return cls(rates, waits, len(ranks))


def _stands_out(key: RankId, obs: Observation, peers: _Peers, noun: str) -> list[tuple[float, Evidence]]:
    """How far ``key`` stands out from the other independent processes: (score, record) for a step
    rate well below their median (score: the shortfall) and for a data wait well above theirs
    (score: the gap), in that order."""
    n = peers.count - 1
    plural = noun if n == 1 else f"{n} {noun}s"
    out: list[tuple[float, Evidence]] = []
    rate = obs.steps_per_second
    median = None if rate is None else _median_without(peers.rates, rate)
    if rate is not None and median is not None and median > 0 and rate < STRAGGLER_RATE_RATIO * median:
        out.append((1.0 - rate / median, _slower(key, rate, median, plural)))
    wait = obs.data_wait_ratio
    median_wait = None if wait is None else _median_without(peers.waits, wait)
    if wait is not None and median_wait is not None:
        gap = wait - median_wait
        if gap >= STRAGGLER_WAIT_GAP and wait >= 2 * median_wait:
            out.append((gap, _waits_more(key, wait, median_wait, plural)))
    return out


def _independent_straggler(ranks: Mapping[RankId, Observation], t: Thresholds) -> Straggler | None:
    if len(ranks) < 2:
        return None
    noun = "rank" if any(k.rank is not None for k in ranks) else "pod"
    worst: tuple[float, RankId, Evidence] | None = None
    peers = _Peers.of(ranks)
    for key in sorted(ranks, key=RankId.sort_key):
        for score, record in _stands_out(key, ranks[key], peers, noun):
            if worst is None or score > worst[0]:
                worst = (score, key, record)
    if worst is None:
        return None
    _, key, record = worst
    if record.kind is Kind.DATA_WAIT:  # its own loader: the wait is the cause
        return Straggler.of([record], pod=key.pod or None, rank=key.rank, cause=Axis.DATA)
    others = [o for k, o in ranks.items() if k != key]
    cause, cause_records = _cause(ranks[key], others, t, None)
    return Straggler.of([record, *cause_records], pod=key.pod or None, rank=key.rank, cause=cause)


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
