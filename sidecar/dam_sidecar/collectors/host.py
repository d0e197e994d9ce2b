"""The host collector: CPU time, run-queue wait and memory of the training processes, and the
training container's cgroup (CFS throttling, CPU limit, memory, OOM kills).

The container figures come from the cgroup the sidecar reads itself, else from what the probe
read from inside the training container (``dam_container_cpu_source`` / ``..._memory_source``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from dam_contract import names as n
from dam_sidecar.collectors.base import Feed, counter, declared, fields, gauge
from dam_sidecar.collectors.probe import ProbeFeed
from dam_sidecar.exposition import Family
from dam_sidecar.samplers.cpu import CpuSample, CpuSource, PublishedCpu, with_probe_workers, with_published
from dam_sidecar.samplers.probe import ProbeSample

log = logging.getLogger("dam_sidecar")

# The figures that are one field of the ``HostReading`` (``cpu.*`` the sampler's, ``container_*``
# the chosen cgroup source's), from their declarations (dam_contract.names). The CPU counters come
# before ``dam_container_cpu_source`` and the CPU gauges after it, as /metrics has always had them.
_CPU_COUNTERS = tuple(m for m in declared("cpu") if m.kind == n.COUNTER)
_CPU_GAUGES = tuple(m for m in declared("cpu") if m.kind == n.GAUGE)
_MEMORY = declared("memory")


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
class HostReading:
    """One tick of the host collector."""

    cpu: CpuSample = field(default_factory=CpuSample)
    container_cpu: ContainerCpu = field(default_factory=ContainerCpu)
    container_memory: ContainerMemory = field(default_factory=ContainerMemory)


class HostCollector:
    """Reads /proc and the cgroup for the probe's live processes (from the probe feed it is handed)
    and ``extra_pids``."""

    sampler = "cpu"

    def __init__(
        self,
        source: CpuSource,
        probe: ProbeFeed,
        published: PublishedCpu | None = None,
        extra_pids: Iterable[int] = (),
    ) -> None:
        self.source = source
        self.probe = probe
        self.feeds: tuple[Feed, ...] = (probe,)
        self.published = published if published is not None else PublishedCpu()
        # The same figures of the trainers read here: their workers when /proc hides some.
        self._visible = PublishedCpu(own_namespace=self.published.own_namespace)
        self.extra_pids = tuple(extra_pids)
        self.latest = HostReading()
        self._throttled = SourcedCounter()
        self._oom_kills = SourcedCounter()
        self._sources_logged: dict[str, str] = {}  # what → the source last logged for it

    def sample(self) -> None:
        probe = self.probe.latest
        # A pid of another PID namespace (no shareProcessNamespace) is not read here: it may
        # name another process in this /proc. Its probe publishes its figures instead.
        foreign = self.published.foreign(probe.records)
        hidden = {r.pid for r in foreign}
        pids = sorted((set(probe.live_pids) - hidden) | set(self.extra_pids))
        visible = [r for r in probe.records if r.pid not in hidden]
        own = with_probe_workers(self.source.sample(pids), self._visible.sample(visible))
        self._update(with_published(own, self.published.sample(foreign)), probe)

    def fallback(self) -> None:
        self._update(self.latest.cpu, self.probe.latest)

    def close(self) -> None:
        return None

    def _update(self, cpu: CpuSample, probe: ProbeSample) -> None:
        self.latest = HostReading(cpu, self._container_cpu(cpu, probe), self._container_memory(cpu, probe))

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

    def collect(self) -> Iterator[Family]:
        yield from _cpu_families(self.latest)
        yield from _memory_families(self.latest)


def _by_role(fam: Family, main: float, worker: float | None) -> Family:
    """A ``role`` family: the training processes (``main``) and their DataLoader workers."""
    fam.add_metric([n.ROLE_MAIN], main)
    fam.add_metric([n.ROLE_WORKER], worker or 0.0)
    return fam


def _source(name: str, sources: tuple[str, ...], chosen: str) -> Family:
    """1 for the source the container figures come from this tick, 0 for the others."""
    fam = gauge(name, ("source",))
    for source in sources:
        fam.add_metric([source], 1.0 if source == chosen else 0.0)
    return fam


def _cpu_families(reading: HostReading) -> Iterator[Family]:
    c, container = reading.cpu, reading.container_cpu
    if c.main_cpu_seconds is not None:
        yield _by_role(
            counter(n.PROCESS_CPU_SECONDS_TOTAL, ("role",)), c.main_cpu_seconds, c.worker_cpu_seconds
        )
        yield _by_role(gauge(n.PROCESSES, ("role",)), float(c.main_processes), float(c.worker_processes))
    if c.main_wait_seconds is not None:
        waits = counter(n.PROCESS_CPU_WAIT_SECONDS_TOTAL, ("role",))
        yield _by_role(waits, c.main_wait_seconds, c.worker_wait_seconds)
    rows = (((), reading),)
    yield from fields(_CPU_COUNTERS, rows)
    yield _source(n.CONTAINER_CPU_SOURCE, n.CPU_SOURCES, container.source)
    yield from fields(_CPU_GAUGES, rows)


def _memory_families(reading: HostReading) -> Iterator[Family]:
    c = reading.cpu
    if c.main_rss_bytes is not None:
        rss = gauge(n.PROCESS_RESIDENT_MEMORY_BYTES, ("role",))
        yield _by_role(rss, c.main_rss_bytes, c.worker_rss_bytes)
    yield from fields(_MEMORY, (((), reading),))
    yield _source(n.CONTAINER_MEMORY_SOURCE, n.MEMORY_SOURCES, reading.container_memory.source)
