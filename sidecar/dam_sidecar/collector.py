"""The sidecar's Prometheus collector: the latest sample of every sampler, as metric families.

Sampling runs in a background loop (``start()``) or on demand (``sample_now()``);
``collect()`` only reads the cached results, so /metrics costs a few hundred
microseconds whatever NVML does. ``snapshot()`` gives the same data as a
``promtext.Snapshot`` for in-process use (``dam run``'s local mode)::

    from dam_sidecar.collector import build_collector
    from dam_sidecar.settings import SidecarSettings

    collector = build_collector(SidecarSettings(probe_dir=d, interval_seconds=1.0))
    collector.sample_now()            # call periodically, e.g. once per second
    snap = collector.snapshot()       # dam_sidecar.promtext.Snapshot
    ...
    collector.close()
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import TypeVar

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from dam_sidecar import names as n
from dam_sidecar.attribution import STATES, Attribution, Attributor
from dam_sidecar.catalog import BY_NAME
from dam_sidecar.errors import ErrorLog
from dam_sidecar.exposition import Family, render
from dam_sidecar.promtext import Snapshot, parse_snapshot
from dam_sidecar.samplers.cpu import CpuSample, CpuSampler, CpuSource, PublishedCpu, with_published
from dam_sidecar.samplers.nvml import NoNvml, NvmlSample, NvmlSampler, NvmlSource, Watchdog
from dam_sidecar.samplers.probe import ProbeReader, ProbeSample, ProbeSource, RankSample
from dam_sidecar.settings import SidecarSettings

log = logging.getLogger("dam_sidecar")

T = TypeVar("T")


@dataclass(frozen=True)
class ContainerCpu:
    """The training container's CFS throttling and limit, and where they come from this tick."""

    source: str = n.CPU_SOURCE_NONE
    throttled_seconds: float | None = None
    limit_cores: float | None = None


@dataclass(frozen=True)
class ContainerMemory:
    """The training container's memory cgroup figures, and where they come from this tick."""

    source: str = n.CPU_SOURCE_NONE
    usage_bytes: float | None = None
    limit_bytes: float | None = None
    oom_kills: float | None = None


@dataclass
class SourcedCounter:
    """One exported counter fed by whichever cumulative source is preferred each tick.

    Every source is itself monotonic (the CPU sampler's carried cgroup counter,
    the probe reader's per-cgroup high-water marks) but they start from
    different bases, so the exported value is the first value seen plus the
    increases of the source chosen at each tick: switching sources never makes
    it jump or go down; the tick of a switch adds only what the newly chosen
    source gained since the previous tick (nothing if it was absent then).
    """

    total: float | None = None
    last: dict[str, float] = field(default_factory=dict)

    def update(self, chosen: str | None, values: dict[str, float | None]) -> float | None:
        if chosen is not None and (value := values.get(chosen)) is not None:
            if self.total is None:
                self.total = value
            elif (prev := self.last.get(chosen)) is not None and value > prev:
                self.total += value - prev
        self.last = {k: v for k, v in values.items() if v is not None}
        return self.total


@dataclass(frozen=True)
class Tick:
    """One tick of every sampler."""

    probe: ProbeSample = field(default_factory=ProbeSample)
    nvml: NvmlSample = field(default_factory=lambda: NvmlSample(up=False))
    cpu: CpuSample = field(default_factory=CpuSample)
    attribution: Attribution = field(default_factory=lambda: Attribution("none", frozenset()))
    container_cpu: ContainerCpu = field(default_factory=ContainerCpu)
    container_memory: ContainerMemory = field(default_factory=ContainerMemory)
    durations: tuple[tuple[str, float], ...] = ()
    timestamp_seconds: float = 0.0


def _gauge(name: str, labels: Iterable[str] = ()) -> Family:
    return Family(name, "gauge", BY_NAME[name].help, tuple(labels))


def _counter(name: str, labels: Iterable[str] = ()) -> Family:
    return Family(name, "counter", BY_NAME[name].help, tuple(labels))


def _per_rank(name: str) -> Family:
    """A probe family labelled ``rank`` where the process has one, unlabelled where it has none."""
    spec = BY_NAME[name]
    return Family(name, spec.kind, spec.help, (n.RANK_LABEL,), optional_labels=True)


def _labelled(name: str, labels: tuple[str, ...]) -> Family:
    """A probe family with more labels; ``rank`` is left out where the process has none."""
    spec = BY_NAME[name]
    return Family(name, spec.kind, spec.help, labels, optional_labels=True)


def _rank_value(rank: int | None) -> str:
    return "" if rank is None else str(rank)


class SidecarCollector(Collector):
    """A custom collector: one ``collect()`` over cached samples. Register it on your own registry."""

    def __init__(
        self,
        *,
        probe: ProbeSource,
        nvml: NvmlSource,
        cpu: CpuSource,
        errors: ErrorLog,
        attributor: Attributor,
        interval_seconds: float = 1.0,
        extra_pids: Iterable[int] = (),
        clock: Callable[[], float] = time.time,
        published: PublishedCpu | None = None,
    ) -> None:
        self.errors = errors
        self._published = published if published is not None else PublishedCpu()
        self._probe = probe
        self._nvml = nvml
        self._cpu = cpu
        self._attributor = attributor
        self._extra_pids = tuple(extra_pids)
        self._interval = interval_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._sample_lock = threading.Lock()
        self._latest = Tick()
        self._have_sample = False
        self._families_cache: list[Family] = []
        self._text_cache = b""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_tick_monotonic = time.monotonic()
        self._throttled = SourcedCounter()
        self._oom_kills = SourcedCounter()
        self._sources_logged: dict[str, str] = {}  # what → the source last logged for it

    # --- sampling -----------------------------------------------------------------
    def sample_now(self) -> Tick:
        """Run every sampler once (never raises) and cache the result for ``collect()``."""
        with self._sample_lock:
            durations: list[tuple[str, float]] = []
            t0 = time.perf_counter()
            previous = self.latest()
            # A sampler that raises keeps its previous counters (never a counter reset), marked down.
            probe = self._guard("probe", self._probe.sample, replace(previous.probe, up=False, live_pids=()))
            t1 = time.perf_counter()
            nvml = self._guard("nvml", self._nvml.sample, NvmlSample(up=False))
            t2 = time.perf_counter()
            # A pid of another PID namespace (no shareProcessNamespace) is not read here: it may
            # name another process in this /proc. Its probe publishes its figures instead.
            foreign = self._published.foreign(probe.records)
            hidden = {r.pid for r in foreign}
            pids = sorted((set(probe.live_pids) - hidden) | set(self._extra_pids))
            cpu = self._guard(
                "cpu",
                lambda: with_published(self._cpu.sample(pids), self._published.sample(foreign)),
                previous.cpu,
            )
            t3 = time.perf_counter()
            durations = [("probe", t1 - t0), ("nvml", t2 - t1), ("cpu", t3 - t2)]
            attribution = self._attributor.decide(probe.device_uuids)
            container_cpu = self._container_cpu(cpu, probe)
            container_memory = self._container_memory(cpu, probe)
            sample = Tick(
                probe=probe,
                nvml=nvml,
                cpu=cpu,
                attribution=attribution,
                container_cpu=container_cpu,
                container_memory=container_memory,
                durations=tuple(durations),
                timestamp_seconds=self._clock(),
            )
            families = list(self._families(sample))
            text = render(families)
            with self._lock:
                self._latest = sample
                self._have_sample = True
                self._families_cache = families
                self._text_cache = text
                self._last_tick_monotonic = time.monotonic()
            return sample

    def _container_cpu(self, cpu: CpuSample, probe: ProbeSample) -> ContainerCpu:
        """Prefer the cgroup the sidecar read itself; else what the probe read from inside the container."""
        own, from_probe = cpu.throttled_seconds, probe.cgroup_throttled_seconds
        source = self._source("CPU throttling and limit", own, from_probe)
        limits = {n.CPU_SOURCE_CGROUP: cpu.limit_cores, n.CPU_SOURCE_PROBE: probe.cgroup_limit_cores}
        limit = limits.get(source)
        throttled = self._throttled.update(
            None if source == n.CPU_SOURCE_NONE else source,
            {n.CPU_SOURCE_CGROUP: own, n.CPU_SOURCE_PROBE: from_probe},
        )
        return ContainerCpu(source, throttled, limit)

    def _container_memory(self, cpu: CpuSample, probe: ProbeSample) -> ContainerMemory:
        """Prefer the memory cgroup the sidecar read itself; else what the probe read inside the container."""
        source = self._source("memory", cpu.memory_usage_bytes, probe.oom_kills)
        usage, limit = {
            n.CPU_SOURCE_CGROUP: (cpu.memory_usage_bytes, cpu.memory_limit_bytes),
            n.CPU_SOURCE_PROBE: (probe.memory_usage_bytes, probe.memory_limit_bytes),
        }.get(source, (None, None))
        kills = self._oom_kills.update(
            None if source == n.CPU_SOURCE_NONE else source,
            {n.CPU_SOURCE_CGROUP: cpu.oom_kills, n.CPU_SOURCE_PROBE: probe.oom_kills},
        )
        return ContainerMemory(source, usage, limit, kills)

    def _source(self, what: str, own: object, from_probe: object) -> str:
        """The container figures' source: the sidecar's own cgroup read (``own`` known), else the
        probe's (``from_probe`` known), else none; logs once each time it changes to a known one."""
        if own is not None:
            source = n.CPU_SOURCE_CGROUP
        elif from_probe is not None:
            source = n.CPU_SOURCE_PROBE
        else:
            return n.CPU_SOURCE_NONE
        if self._sources_logged.get(what) != source:
            self._sources_logged[what] = source
            log.info(
                "container %s: %s",
                what,
                "read from the training container's cgroup"
                if source == n.CPU_SOURCE_CGROUP
                else "published by the probe (the training container's cgroup is not visible here)",
            )
        return source

    def _guard(self, sampler: str, fn: Callable[[], T], fallback: T) -> T:
        try:
            return fn()
        except Exception as exc:  # a sampler bug must never stop the exporter
            self.errors.record(sampler, "exception", f"sampler raised {exc!r}")
            log.debug("sampler %s raised", sampler, exc_info=True)
            return fallback

    def latest(self) -> Tick:
        with self._lock:
            return self._latest

    def start(self) -> None:
        """Sample every ``interval_seconds`` in a daemon thread until ``close()``."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="dam-sampler", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        next_at = time.monotonic()
        with self._lock:
            have = self._have_sample
        if have:  # sampled just before start(): keep the period between the first two samples
            next_at += self._interval
            self._stop.wait(self._interval)
        while not self._stop.is_set():
            self.sample_now()
            next_at += self._interval
            delay = next_at - time.monotonic()
            if delay < 0:  # fell behind (a slow sampler): do not burst to catch up
                next_at = time.monotonic()
                delay = 0
            self._stop.wait(delay)

    def healthy(self) -> bool:
        """The sampling loop ticked recently (within five intervals, at least 10 s)."""
        with self._lock:
            age = time.monotonic() - self._last_tick_monotonic
        return age < max(10.0, 5 * self._interval)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, 2 * self._interval))
            self._thread = None
        try:
            self._nvml.close()
        except Exception as exc:
            log.warning("closing NVML failed: %r", exc)

    # --- exposition ---------------------------------------------------------------
    def text(self) -> bytes:
        """The latest sample in the Prometheus text format (rendered once per sample)."""
        with self._lock:
            if self._have_sample:
                return self._text_cache
        return render(self._families(Tick()))

    def snapshot(self) -> Snapshot:
        """The latest sample in the exposition format, parsed (what a scrape would see)."""
        return parse_snapshot(
            self.text().decode("utf-8"), "<sidecar>", self.latest().timestamp_seconds or None
        )

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        """The cached families of the latest sample (what ``text()`` renders)."""
        with self._lock:
            families = list(self._families_cache) if self._have_sample else None
        if families is None:
            families = list(self._families(Tick()))
        return [f.to_metric() for f in families]

    def _families(self, s: Tick) -> Iterator[Family]:
        have = s.timestamp_seconds > 0
        yield from self._probe_families(s.probe)
        yield from self._gpu_families(s.nvml, s.attribution)
        yield from self._cpu_families(s.cpu, s.container_cpu)
        yield from self._memory_families(s.cpu, s.container_memory)
        errors = _counter(n.SAMPLER_ERRORS_TOTAL, ("sampler", "reason"))
        for (sampler, reason), count in sorted(self.errors.counts().items()):
            errors.add_metric([sampler, reason], count)
        yield errors
        durations = _gauge(n.SAMPLER_DURATION_SECONDS, ("sampler",))
        for sampler, seconds in s.durations:
            durations.add_metric([sampler], seconds)
        yield durations
        if have:
            ts = _gauge(n.SNAPSHOT_TIMESTAMP_SECONDS)
            ts.add_metric([], s.timestamp_seconds)
            yield ts

    def _probe_families(self, p: ProbeSample) -> Iterator[Family]:
        ranks = p.ranks or (  # a sample built without per-rank figures: its totals, unlabelled
            RankSample(
                rank=None,
                steps=p.steps,
                wait_seconds=p.wait_seconds,
                step_seconds=p.step_seconds,
                batch_size=p.batch_size,
                flops_per_step=p.flops_per_step,
                live=p.up,
            ),
        )
        for name, attr in (
            (n.STEPS_TOTAL, "steps"),
            (n.DATALOADER_WAIT_SECONDS_TOTAL, "wait_seconds"),
            (n.STEP_SECONDS_TOTAL, "step_seconds"),
        ):
            c = _per_rank(name)
            for r in ranks:
                c.add_metric([_rank_value(r.rank)], float(getattr(r, attr)))
            yield c
        for name, attr in (
            (n.COLLECTIVES_TOTAL, "collectives"),
            (n.COLLECTIVE_SECONDS_TOTAL, "collective_seconds"),
            (n.COLLECTIVE_EXPOSED_SECONDS_TOTAL, "collective_exposed_seconds"),
            (n.COLLECTIVE_BYTES_TOTAL, "collective_bytes"),
        ):
            c = _per_rank(name)
            for r in ranks:
                if r.collectives is not None:  # absent for ranks whose probe does not time collectives
                    c.add_metric([_rank_value(r.rank)], float(getattr(r, attr)))
            if c.samples:
                yield c
        for name, value in ((n.PROBE_UP, 1.0 if p.up else 0.0), (n.PROBE_PROCESSES, float(len(p.live_pids)))):
            g = _gauge(name)
            g.add_metric([], value)
            yield g
        if p.loader_worker_kills is not None:  # absent until a probe that counts them published
            k = _counter(n.DATALOADER_WORKER_KILLS_TOTAL)
            k.add_metric([], p.loader_worker_kills)
            yield k
        g = _per_rank(n.BATCH_SIZE)
        for r in ranks:
            if r.live and r.batch_size > 0:
                g.add_metric([_rank_value(r.rank)], float(r.batch_size))
        if g.samples:
            yield g
        flops = _labelled(n.MODEL_FLOPS_PER_STEP, (n.RANK_LABEL, n.SOURCE_LABEL))
        for r in ranks:
            if r.flops_per_step > 0:  # kept after the process ended: the model's FLOPs do not change
                source = r.flops_per_step_source or n.FLOPS_DECLARED
                flops.add_metric([_rank_value(r.rank), source], float(r.flops_per_step))
        if flops.samples:
            yield flops
        yield from self._goodput_families(ranks)
        if p.rank_info:
            info = _gauge(n.PROCESS_RANK_INFO, ("rank", "local_rank", "world_size"))
            for i in p.rank_info:
                info.add_metric([str(i.rank), _rank_value(i.local_rank), _rank_value(i.world_size)], 1.0)
            yield info

    def _goodput_families(self, ranks: tuple[RankSample, ...]) -> Iterator[Family]:
        """Goodput and badput by cause, for the ranks whose probes account for them."""
        # What a restart would redo (the operator's restart badput): unknown ranks stay absent.
        for name, attr in (
            (n.LAST_CHECKPOINT_TIMESTAMP_SECONDS, "last_checkpoint_seconds"),
            (n.STEPS_SINCE_CHECKPOINT, "steps_since_checkpoint"),
        ):
            g = _per_rank(name)
            for r in ranks:
                if (value := getattr(r, attr)) is not None:
                    g.add_metric([_rank_value(r.rank)], float(value))
            if g.samples:
                yield g
        known = [r for r in ranks if r.productive_seconds is not None]
        if not known:
            return
        good = _per_rank(n.GOODPUT_SECONDS_TOTAL)
        bad = _labelled(n.BADPUT_SECONDS_TOTAL, (n.CAUSE_LABEL, n.RANK_LABEL))
        saves = _per_rank(n.CHECKPOINTS_TOTAL)
        for r in known:
            rank = _rank_value(r.rank)
            good.add_metric([rank], r.productive_seconds or 0.0)
            causes = {
                n.CAUSE_STARTUP: r.startup_seconds,
                n.CAUSE_DATA_WAIT: r.wait_seconds,
                # Without timed collectives (no torch.distributed) nothing waited on a peer.
                n.CAUSE_COMMUNICATION: r.collective_exposed_seconds if r.collectives is not None else 0.0,
                # Without timed saves (torch never loaded) nothing was saved with torch.
                n.CAUSE_CHECKPOINT: r.checkpoint_seconds or 0.0,
                n.CAUSE_OTHER: r.other_seconds,
            }
            for cause in n.BADPUT_CAUSES:
                bad.add_metric([cause, rank], float(causes[cause]))
            if r.checkpoint_seconds is not None:
                saves.add_metric([rank], float(r.checkpoints))
        yield good
        yield bad
        if saves.samples:
            yield saves

    def _gpu_families(self, s: NvmlSample, attribution: Attribution) -> Iterator[Family]:
        up = _gauge(n.NVML_UP)
        up.add_metric([], 1.0 if s.up else 0.0)
        yield up
        attr = _gauge(n.GPU_ATTRIBUTION, ("state",))
        for state in STATES:
            attr.add_metric([state], 1.0 if state == attribution.state else 0.0)
        yield attr
        gpus = [g for g in s.gpus if attribution.admits(g.uuid)]
        if not gpus:
            return
        info = _gauge(n.GPU_INFO, ("gpu", "uuid", "name"))
        for g in gpus:
            info.add_metric([str(g.index), g.uuid, g.name], 1.0)
        yield info
        simple: list[tuple[str, str]] = [
            (n.GPU_UTILIZATION_RATIO, "utilization_ratio"),
            (n.GPU_MEMORY_BUSY_RATIO, "memory_busy_ratio"),
            (n.GPU_MEMORY_USED_BYTES, "memory_used_bytes"),
            (n.GPU_MEMORY_TOTAL_BYTES, "memory_total_bytes"),
            (n.GPU_POWER_WATTS, "power_watts"),
            (n.GPU_SM_CLOCK_HERTZ, "sm_clock_hertz"),
            (n.GPU_TEMPERATURE_CELSIUS, "temperature_celsius"),
            (n.GPU_PCIE_TX_BYTES_PER_SECOND, "pcie_tx_bytes_per_second"),
            (n.GPU_PCIE_RX_BYTES_PER_SECOND, "pcie_rx_bytes_per_second"),
        ]
        for name, attr_name in simple:
            fam = _gauge(name, ("gpu", "uuid"))
            for g in gpus:
                value = getattr(g, attr_name)
                if value is not None:
                    fam.add_metric([str(g.index), g.uuid], float(value))
            if fam.samples:
                yield fam
        for name, (tx_attr, rx_attr) in (
            (n.GPU_PCIE_BYTES_TOTAL, ("pcie_tx_bytes", "pcie_rx_bytes")),
            (n.GPU_NVLINK_BYTES_TOTAL, ("nvlink_tx_bytes", "nvlink_rx_bytes")),
        ):
            fam = _counter(name, ("gpu", "uuid", "direction"))
            for g in gpus:
                for direction, attr_name in ((n.DIRECTION_TX, tx_attr), (n.DIRECTION_RX, rx_attr)):
                    value = getattr(g, attr_name)
                    if value is not None:
                        fam.add_metric([str(g.index), g.uuid, direction], float(value))
            if fam.samples:
                yield fam
        throttle = _gauge(n.GPU_THROTTLE_REASON, ("gpu", "uuid", "reason"))
        for g in gpus:
            for reason, active in sorted((g.throttle_reasons or {}).items()):
                throttle.add_metric([str(g.index), g.uuid, reason], 1.0 if active else 0.0)
        if throttle.samples:
            yield throttle
        gpm_names = {
            "sm_active": n.GPU_SM_ACTIVE_RATIO,
            "sm_occupancy": n.GPU_SM_OCCUPANCY_RATIO,
            "tensor_active": n.GPU_TENSOR_ACTIVE_RATIO,
            "dram_bandwidth_utilization": n.GPU_DRAM_BANDWIDTH_UTILIZATION_RATIO,
            "fp16_active": n.GPU_FP16_ACTIVE_RATIO,
            "fp32_active": n.GPU_FP32_ACTIVE_RATIO,
        }
        for key, name in gpm_names.items():
            fam = _gauge(name, ("gpu", "uuid"))
            for g in gpus:
                if key in g.gpm:
                    fam.add_metric([str(g.index), g.uuid], g.gpm[key])
            if fam.samples:
                yield fam

    def _cpu_families(self, c: CpuSample, container: ContainerCpu) -> Iterator[Family]:
        if c.main_cpu_seconds is not None:
            fam = _counter(n.PROCESS_CPU_SECONDS_TOTAL, ("role",))
            fam.add_metric([n.ROLE_MAIN], c.main_cpu_seconds)
            fam.add_metric([n.ROLE_WORKER], c.worker_cpu_seconds or 0.0)
            yield fam
            procs = _gauge(n.PROCESSES, ("role",))
            procs.add_metric([n.ROLE_MAIN], float(c.main_processes))
            procs.add_metric([n.ROLE_WORKER], float(c.worker_processes))
            yield procs
        if c.main_wait_seconds is not None:
            waits = _counter(n.PROCESS_CPU_WAIT_SECONDS_TOTAL, ("role",))
            waits.add_metric([n.ROLE_MAIN], c.main_wait_seconds)
            waits.add_metric([n.ROLE_WORKER], c.worker_wait_seconds or 0.0)
            yield waits
        if container.throttled_seconds is not None:
            t = _counter(n.CONTAINER_CPU_THROTTLED_SECONDS_TOTAL)
            t.add_metric([], container.throttled_seconds)
            yield t
        sources = _gauge(n.CONTAINER_CPU_SOURCE, ("source",))
        for source in n.CPU_SOURCES:
            sources.add_metric([source], 1.0 if source == container.source else 0.0)
        yield sources
        for name, value in (
            (n.CONTAINER_CPU_LIMIT_CORES, container.limit_cores),
            (n.NODE_CPU_UTILIZATION_RATIO, c.node_utilization_ratio),
        ):
            if value is not None:
                g = _gauge(name)
                g.add_metric([], value)
                yield g

    def _memory_families(self, c: CpuSample, container: ContainerMemory) -> Iterator[Family]:
        if c.main_rss_bytes is not None:
            rss = _gauge(n.PROCESS_RESIDENT_MEMORY_BYTES, ("role",))
            rss.add_metric([n.ROLE_MAIN], c.main_rss_bytes)
            rss.add_metric([n.ROLE_WORKER], c.worker_rss_bytes or 0.0)
            yield rss
        for name, value in (
            (n.CONTAINER_MEMORY_USAGE_BYTES, container.usage_bytes),
            (n.CONTAINER_MEMORY_LIMIT_BYTES, container.limit_bytes),
        ):
            if value is not None:
                g = _gauge(name)
                g.add_metric([], value)
                yield g
        if container.oom_kills is not None:
            k = _counter(n.CONTAINER_OOM_KILLS_TOTAL)
            k.add_metric([], container.oom_kills)
            yield k
        sources = _gauge(n.CONTAINER_MEMORY_SOURCE, ("source",))
        for source in n.MEMORY_SOURCES:
            sources.add_metric([source], 1.0 if source == container.source else 0.0)
        yield sources


def build_nvml(settings: SidecarSettings, errors: ErrorLog) -> NvmlSource:
    """The NVML sampler behind its watchdog (simulated GPUs when ``fake_gpus`` > 0)."""
    if settings.fake_gpus > 0:
        from dam_sidecar.fake_nvml import FakeNvml

        count = settings.fake_gpus
        inner = NvmlSampler(errors, load=lambda: FakeNvml(count))
    else:
        inner = NvmlSampler(errors)
    return Watchdog(inner, settings.nvml_timeout_seconds, errors)


def build_collector(
    settings: SidecarSettings,
    nvml: NvmlSource | None = None,
    errors: ErrorLog | None = None,
    use_nvml: bool = True,
) -> SidecarCollector:
    """The collector with the real samplers configured by ``settings``; not started, not registered.

    ``use_nvml=False`` never touches NVML (``dam_nvml_up`` reads 0).
    """
    errors = errors or ErrorLog(settings.error_log_interval_seconds)
    if nvml is None:
        nvml = build_nvml(settings, errors) if use_nvml else NoNvml()
    return SidecarCollector(
        probe=ProbeReader(
            settings.probe_dir,
            errors,
            proc_root=settings.proc_root,
            stale_seconds=settings.probe_stale_seconds,
        ),
        nvml=nvml,
        cpu=CpuSampler(
            errors,
            proc_root=settings.proc_root,
            cgroup_root=settings.cgroup_root,
            clock_ticks_per_second=settings.clock_ticks_per_second,
        ),
        errors=errors,
        attributor=Attributor(settings.gpu_attribution_fallback, settings.visible_devices),
        interval_seconds=settings.interval_seconds,
        extra_pids=settings.pids,
    )
