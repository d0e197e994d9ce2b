"""The sidecar's Prometheus collector: one sampling tick over a list of per-source collectors.

The per-source collectors (``dam_sidecar.collectors``: the probe files, NVML, the host's CPU and
cgroup, the sidecar's own health) each read their source in ``sample()`` and show it in
``collect()``. ``SidecarCollector`` refreshes the feeds they were handed (the probe files, read
once for the probe, GPU and host collectors), then runs every ``sample()``, once per tick (no
collector reads what another one sampled: their order is the order of /metrics only), then hands
the tick's record to its observers (the health collector), in a background loop (``start()``)
or on demand (``sample_now()``), and caches their families and the text rendered from them;
its own ``collect()`` and ``text()`` only read that cache, so /metrics costs a few hundred
microseconds whatever NVML does. ``snapshot()`` gives the same samples as a
``dam_contract.snapshot.Snapshot`` for in-process use (``dam run``'s local mode), built from the
cached families without rendering and parsing text::

    from dam_sidecar.collector import build_collector
    from dam_sidecar.settings import SidecarSettings

    collector = build_collector(SidecarSettings(probe_dir=d, interval_seconds=1.0))
    collector.sample_now()            # call periodically, e.g. once per second
    snap = collector.snapshot()       # dam_contract.snapshot.Snapshot
    ...
    collector.close()

A new source is one more collector in ``standard_collectors`` (see docs/CONTRIBUTING.md).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from dam_contract.snapshot import Sample, Snapshot
from dam_sidecar.attribution import Attributor
from dam_sidecar.collectors.base import Feed, SourceCollector, TickObserver, TickRecord
from dam_sidecar.collectors.gpu import GpuCollector
from dam_sidecar.collectors.health import HealthCollector
from dam_sidecar.collectors.host import HostCollector
from dam_sidecar.collectors.probe import ProbeCollector, ProbeFeed
from dam_sidecar.errors import ErrorLog
from dam_sidecar.exposition import Family, render
from dam_sidecar.samplers.cpu import CpuSampler, CpuSource, PublishedCpu
from dam_sidecar.samplers.nvml import NoNvml, NvmlSampler, NvmlSource, Watchdog
from dam_sidecar.samplers.probe import ProbeReader, ProbeSource
from dam_sidecar.settings import SidecarSettings

__all__ = ["SidecarCollector", "build_collector", "build_nvml", "snapshot_of", "standard_collectors"]

log = logging.getLogger("dam_sidecar")


class SidecarCollector(Collector):
    """A custom collector: one ``collect()`` over the cached families of the latest tick.

    Register it on your own registry (``make_server`` does; never the process-wide default).
    ``clock`` stamps each tick (``dam_snapshot_timestamp_seconds``), ``timer`` times its samplers.
    """

    def __init__(
        self,
        collectors: Sequence[SourceCollector],
        *,
        errors: ErrorLog,
        interval_seconds: float = 1.0,
        clock: Callable[[], float] = time.time,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.collectors = tuple(collectors)
        self.feeds = _feeds_of(self.collectors)
        self.observers: tuple[TickObserver, ...] = tuple(
            c for c in self.collectors if isinstance(c, TickObserver)
        )
        self.errors = errors
        self.interval_seconds = interval_seconds
        self.clock = clock
        self.timer = timer
        self._lock = threading.Lock()
        self._sample_lock = threading.Lock()
        self._latest = TickRecord()
        self._have_sample = False
        self._families_cache: list[Family] = []
        self._text_cache = b""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_tick_monotonic = time.monotonic()

    # --- sampling -----------------------------------------------------------------
    def sample_now(self) -> TickRecord:
        """Refresh every feed, then sample every collector, once each (never raises), hand the
        tick's record to the observers and cache the result."""
        with self._sample_lock:
            durations: list[tuple[str, float]] = []
            for f in self.feeds:  # first: every collector reads its feeds as this tick found them
                self._timed(f, f.refresh, f.fallback, durations)
            for c in self.collectors:
                self._timed(c, c.sample, c.fallback, durations)
            tick = TickRecord(tuple(durations), self.clock())
            for o in self.observers:
                o.observe(tick)
            families = list(self._families())
            text = render(families)  # once per tick; every scrape serves these bytes
            with self._lock:
                self._latest = tick
                self._have_sample = True
                self._families_cache = families
                self._text_cache = text
                self._last_tick_monotonic = time.monotonic()
            return tick

    def _timed(
        self,
        part: Feed | SourceCollector,
        read: Callable[[], None],
        fallback: Callable[[], None],
        durations: list[tuple[str, float]],
    ) -> None:
        """``read()``; where it raises, counted under the part's sampler and ``fallback()``; its
        duration kept where it has a sampler name."""
        name = part.sampler or type(part).__name__
        t0 = self.timer() if part.sampler else 0.0
        try:
            read()
        except Exception as exc:  # a sampler bug must never stop the exporter
            self.errors.record(name, "exception", f"sampler raised {exc!r}")
            log.debug("sampler %s raised", name, exc_info=True)
            fallback()
        if part.sampler:
            durations.append((part.sampler, self.timer() - t0))

    def _families(self) -> Iterator[Family]:
        for c in self.collectors:
            yield from c.collect()

    def latest(self) -> TickRecord:
        with self._lock:
            return self._latest

    def start(self) -> None:
        """Sample every ``interval_seconds`` in a daemon thread until ``close()``."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="dam-sampler", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        interval = self.interval_seconds
        next_at = time.monotonic()
        with self._lock:
            have = self._have_sample
        if have:  # sampled just before start(): keep the period between the first two samples
            next_at += interval
            self._stop.wait(interval)
        while not self._stop.is_set():
            self.sample_now()
            next_at += interval
            delay = next_at - time.monotonic()
            if delay < 0:  # fell behind (a slow sampler): do not burst to catch up
                next_at = time.monotonic()
                delay = 0
            self._stop.wait(delay)

    def healthy(self) -> bool:
        """The sampling loop ticked recently (within five intervals, at least 10 s)."""
        with self._lock:
            age = time.monotonic() - self._last_tick_monotonic
        return age < max(10.0, 5 * self.interval_seconds)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, 2 * self.interval_seconds))
            self._thread = None
        for c in self.collectors:
            try:
                c.close()
            except Exception as exc:
                log.warning("closing the %s collector failed: %r", c.sampler or type(c).__name__, exc)

    # --- exposition ---------------------------------------------------------------
    def families(self) -> list[Family]:
        """The families of the latest tick (before the first one: each collector's empty state)."""
        with self._lock:
            if self._have_sample:
                return list(self._families_cache)
        return list(self._families())

    def text(self) -> bytes:
        """The latest sample in the Prometheus text format (rendered once per sample)."""
        with self._lock:
            if self._have_sample:
                return self._text_cache
        return render(self._families())

    def snapshot(self) -> Snapshot:
        """The latest sample as a scrape of ``text()`` would parse it, without the text."""
        return snapshot_of(self.families(), self.latest().timestamp_seconds or None)

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        """The cached families of the latest sample (what ``text()`` renders)."""
        return [f.to_metric() for f in self.families()]


def snapshot_of(families: Iterable[Family], timestamp_seconds: float | None = None) -> Snapshot:
    """The ``Snapshot`` that parsing ``render(families)`` gives, built directly (a unit test pins
    that the two agree sample for sample): labels sorted, an empty optional label left out."""
    samples: list[Sample] = []
    for fam in families:
        names, optional = fam.label_names, fam.optional_labels
        for values, value in fam.samples:
            pairs = zip(names, values, strict=True)
            labels = tuple(sorted((k, v) for k, v in pairs if v != "" or not optional))
            samples.append(Sample(fam.name, labels, value))
    return Snapshot(samples, timestamp_seconds)


def standard_collectors(
    *,
    probe: ProbeSource,
    nvml: NvmlSource,
    cpu: CpuSource,
    errors: ErrorLog,
    attributor: Attributor,
    extra_pids: Iterable[int] = (),
    published: PublishedCpu | None = None,
) -> list[SourceCollector]:
    """The sidecar's collectors, in the order of /metrics. The probe files are one feed, read once a
    tick, handed to the three collectors that read them (the probe families, the GPU attribution,
    the host's pids and container fallbacks); the health collector observes the tick."""
    feed = ProbeFeed(probe)
    return [
        ProbeCollector(feed),
        GpuCollector(nvml, attributor, feed),
        HostCollector(cpu, feed, published, extra_pids),
        HealthCollector(errors),
    ]


def _feeds_of(collectors: Iterable[SourceCollector]) -> tuple[Feed, ...]:
    """The feeds the collectors were handed, each once, in the order first named."""
    seen: dict[int, Feed] = {}
    for c in collectors:
        for f in c.feeds:
            seen.setdefault(id(f), f)
    return tuple(seen.values())


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
    probe: ProbeReader | None = None,
) -> SidecarCollector:
    """The collector with the real samplers configured by ``settings``; not started, not registered.

    ``use_nvml=False`` never touches NVML (``dam_nvml_up`` reads 0). ``probe``: the probe reader
    to sample (``dam run`` keeps it to read every process's life at the end).
    """
    errors = errors or ErrorLog(settings.error_log_interval_seconds)
    if nvml is None:
        nvml = build_nvml(settings, errors) if use_nvml else NoNvml()
    collectors = standard_collectors(
        probe=probe
        or ProbeReader(
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
        extra_pids=settings.pids,
    )
    return SidecarCollector(collectors, errors=errors, interval_seconds=settings.interval_seconds)
