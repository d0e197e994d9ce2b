"""The probe files' collector: steps, data wait, collectives, goodput and ranks of the training processes."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from dam_contract import names as n
from dam_sidecar.collectors.base import Feed, declared, fields, gauge, labelled, per_rank, rank_value, single
from dam_sidecar.exposition import Family
from dam_sidecar.samplers.probe import ProbeSample, ProbeSource, RankSample

_PER_RANK = declared("probe")
"""The probe families that are one figure of a rank's sample (``sample=`` in their declaration):
``totals.<key>`` for what the sidecar sums per rank from the probe's field table. Built first,
in declaration order."""


def badput_causes(r: RankSample) -> dict[str, float | None]:
    """A rank's ``dam_badput_seconds_total`` by cause; None: not measured (its series absent)."""
    return {
        n.CAUSE_STARTUP: r.startup_seconds,
        n.CAUSE_DATA_WAIT: r.wait_seconds,
        # Measured when the collectives are timed; a process without a distributed rank waited
        # on no peer (0). A ranked process whose collectives are not timed (DAM_PROBE_COLLECTIVES=0,
        # a failed patch): unknown, its series absent (its exposed time counts as productive).
        n.CAUSE_COMMUNICATION: (
            r.collective_exposed_seconds if r.collectives is not None else (0.0 if r.rank is None else None)
        ),
        # Measured when its saves are timed (torch.save, dcp, safetensors); otherwise unknown.
        n.CAUSE_CHECKPOINT: r.checkpoint_seconds,
        n.CAUSE_OTHER: r.other_seconds,
    }


class ProbeFeed:
    """The probe files, read once a tick for every collector that is handed this feed: the probe
    collector (its families), the GPU collector (the UUIDs the probes published) and the host
    collector (the probes' pids and their cgroup figures). Timed as the ``probe`` sampler."""

    sampler = "probe"

    def __init__(self, source: ProbeSource) -> None:
        self.source = source
        self.latest = ProbeSample()

    def refresh(self) -> None:
        self.latest = self.source.sample()

    def fallback(self) -> None:
        """The files could not be read this tick: the counters kept, no process counted live."""
        self.latest = replace(self.latest, up=False, live_pids=())


class ProbeCollector:
    """``dam_steps_total`` and the other probe families, per rank, from the probe feed."""

    sampler = ""  # the feed is timed (as "probe"), not this view of it

    def __init__(self, feed: ProbeFeed) -> None:
        self.feed = feed
        self.feeds: tuple[Feed, ...] = (feed,)
        self.latest = ProbeSample()

    def sample(self) -> None:
        self.latest = self.feed.latest

    def fallback(self) -> None:
        self.latest = self.feed.latest

    def close(self) -> None:
        return None

    def collect(self) -> Iterator[Family]:
        p = self.latest
        ranks = p.ranks or (  # a sample built without per-rank figures: its totals, unlabelled
            RankSample(
                rank=None,
                totals={"steps": p.steps, "wait_seconds": p.wait_seconds, "step_seconds": p.step_seconds},
                batch_size=p.batch_size,
                flops_per_step=p.flops_per_step,
                live=p.up,
            ),
        )
        yield from fields(_PER_RANK, (((rank_value(r.rank),), r) for r in ranks), optional_labels=True)
        yield single(n.PROBE_UP, 1.0 if p.up else 0.0)
        yield single(n.PROBE_PROCESSES, float(len(p.live_pids)))
        if p.loader_worker_kills is not None:  # absent until a probe that counts them published
            yield single(n.DATALOADER_WORKER_KILLS_TOTAL, p.loader_worker_kills, "counter")
        yield from _model(ranks)
        yield from _goodput(ranks)
        yield from _progress(ranks)
        yield from _loader_settings(ranks)
        if p.rank_info:
            info = gauge(n.PROCESS_RANK_INFO, ("rank", "local_rank", "world_size"))
            for i in p.rank_info:
                info.add_metric([str(i.rank), rank_value(i.local_rank), rank_value(i.world_size)], 1.0)
            yield info


def _model(ranks: tuple[RankSample, ...]) -> Iterator[Family]:
    """The batch size of the live ranks and the FLOPs per step of every rank that published them."""
    g = per_rank(n.BATCH_SIZE)
    for r in ranks:
        if r.live and r.batch_size > 0:
            g.add_metric([rank_value(r.rank)], float(r.batch_size))
    if g.samples:
        yield g
    flops = labelled(n.MODEL_FLOPS_PER_STEP, (n.RANK_LABEL, n.SOURCE_LABEL))
    for r in ranks:
        if r.flops_per_step > 0:  # kept after the process ended: the model's FLOPs do not change
            source = r.flops_per_step_source or n.FLOPS_DECLARED
            flops.add_metric([rank_value(r.rank), source], float(r.flops_per_step))
    if flops.samples:
        yield flops
    precision = labelled(n.MODEL_FLOPS_PRECISION, (n.RANK_LABEL, n.PRECISION_LABEL))
    for r in ranks:
        if r.flops_per_step > 0 and r.flops_precision and r.flops_precision <= len(n.PRECISIONS):
            precision.add_metric([rank_value(r.rank), n.PRECISIONS[r.flops_precision - 1]], 1.0)
    if precision.samples:
        yield precision
    unavailable = labelled(n.MODEL_FLOPS_UNAVAILABLE, (n.RANK_LABEL, n.REASON_LABEL, n.DETAIL_LABEL))
    for r in ranks:
        if r.flops_unavailable is not None and 1 <= r.flops_unavailable[0] <= len(
            n.FLOPS_UNAVAILABLE_REASONS
        ):
            code, detail = r.flops_unavailable
            reason = n.FLOPS_UNAVAILABLE_REASONS[code - 1]
            unavailable.add_metric([rank_value(r.rank), reason, detail], 1.0)
    if unavailable.samples:
        yield unavailable


def _goodput(ranks: tuple[RankSample, ...]) -> Iterator[Family]:
    """Goodput and badput by cause, for the ranks whose probes account for them."""
    # What a restart would redo (the operator's restart badput): unknown ranks stay absent.
    for name, attr in (
        (n.LAST_CHECKPOINT_TIMESTAMP_SECONDS, "last_checkpoint_seconds"),
        (n.STEPS_SINCE_CHECKPOINT, "steps_since_checkpoint"),
    ):
        g = per_rank(name)
        for r in ranks:
            if (value := getattr(r, attr)) is not None:
                g.add_metric([rank_value(r.rank)], float(value))
        if g.samples:
            yield g
    known = [r for r in ranks if r.productive_seconds is not None]
    if not known:
        return
    good = per_rank(n.GOODPUT_SECONDS_TOTAL)
    bad = labelled(n.BADPUT_SECONDS_TOTAL, (n.CAUSE_LABEL, n.RANK_LABEL))
    saves = per_rank(n.CHECKPOINTS_TOTAL)
    for r in known:
        rank = rank_value(r.rank)
        good.add_metric([rank], r.productive_seconds or 0.0)
        causes = badput_causes(r)
        for cause in n.BADPUT_CAUSES:
            if (value := causes[cause]) is not None:
                bad.add_metric([cause, rank], float(value))
        if r.checkpoint_seconds is not None:
            saves.add_metric([rank], float(r.checkpoints))
    yield good
    yield bad
    if saves.samples:
        yield saves
    restarts = per_rank(n.PROCESS_RESTARTS_TOTAL)
    gaps = per_rank(n.PROCESS_RESTART_GAP_SECONDS_TOTAL)
    for r in known:
        if r.rank is not None:
            restarts.add_metric([rank_value(r.rank)], float(r.restarts))
            gaps.add_metric([rank_value(r.rank)], r.restart_gap_seconds)
    if restarts.samples:
        yield restarts
        yield gaps


def _progress(ranks: tuple[RankSample, ...]) -> Iterator[Family]:
    """Each rank's latest batch, collectives entered, liveness and, while its step is overdue,
    where its training thread is: what the operator's stall judge lines up across ranks."""
    last = per_rank(n.LAST_BATCH_TIMESTAMP_SECONDS)
    sequence = per_rank(n.COLLECTIVE_SEQUENCE)
    up = per_rank(n.RANK_UP)
    place = labelled(n.TRAINING_PLACE_INFO, (n.RANK_LABEL, "where", n.DETAIL_LABEL, "frames"))
    for r in ranks:
        if r.last_batch_seconds is None:
            continue  # no batch yet: nothing to line up (and no series for a process without steps)
        rank = rank_value(r.rank)
        last.add_metric([rank], r.last_batch_seconds)
        up.add_metric([rank], 1.0 if r.live else 0.0)
        if r.live and r.collective_sequence is not None:
            sequence.add_metric([rank], float(r.collective_sequence))
        if r.live and r.place is not None:
            place.add_metric([rank, r.place.where, r.place.detail, "\n".join(r.place.frames)], 1.0)
    for family in (last, sequence, up, place):
        if family.samples:
            yield family


_LOADER_GAUGES = (
    (n.DATALOADER_NUM_WORKERS, "num_workers"),
    (n.DATALOADER_PREFETCH_FACTOR, "prefetch_factor"),
    (n.DATALOADER_PIN_MEMORY, "pin_memory"),
    (n.DATALOADER_PERSISTENT_WORKERS, "persistent_workers"),
)


def _loader_settings(ranks: tuple[RankSample, ...]) -> Iterator[Family]:
    """The DataLoader settings of each live rank's latest loader (what Apply checks took effect)."""
    for name, attr in _LOADER_GAUGES:
        g = per_rank(name)
        for r in ranks:
            value = getattr(r.loader, attr) if r.live and r.loader is not None else None
            if value is not None:
                g.add_metric([rank_value(r.rank)], float(value))
        if g.samples:
            yield g
