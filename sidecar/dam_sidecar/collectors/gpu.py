"""The NVML collector: the GPUs the job is attributed, their utilisation, memory, clocks, links and GPM."""

from __future__ import annotations

from collections.abc import Iterator

from dam_contract import names as n
from dam_sidecar.attribution import STATES, Attribution, Attributor
from dam_sidecar.collectors.base import Feed, declared, fields, gauge, single
from dam_sidecar.collectors.probe import ProbeFeed
from dam_sidecar.exposition import Family
from dam_sidecar.samplers.nvml import GpuSample, NvmlSample, NvmlSource

# Every NVML and GPM figure that is one GpuSample field, from its declaration (dam_contract.names).
_NVML = declared("nvml")
_GPM = declared("gpm")


class GpuCollector:
    """NVML's figures for the GPUs attributed to the job (by the UUIDs the probes published this
    tick, read from the probe feed it is handed)."""

    sampler = "nvml"

    def __init__(self, source: NvmlSource, attributor: Attributor, probe: ProbeFeed) -> None:
        self.source = source
        self.attributor = attributor
        self.probe = probe
        self.feeds: tuple[Feed, ...] = (probe,)
        self.latest = NvmlSample(up=False)
        self.attribution = Attribution("none", frozenset())

    def sample(self) -> None:
        self._update(self.source.sample())

    def fallback(self) -> None:
        self._update(NvmlSample(up=False))

    def _update(self, sample: NvmlSample) -> None:
        self.latest = sample
        self.attribution = self.attributor.decide(self.probe.latest.device_uuids)

    def close(self) -> None:
        self.source.close()

    def collect(self) -> Iterator[Family]:
        s, attribution = self.latest, self.attribution
        yield single(n.NVML_UP, 1.0 if s.up else 0.0)
        attr = gauge(n.GPU_ATTRIBUTION, ("state",))
        for state in STATES:
            attr.add_metric([state], 1.0 if state == attribution.state else 0.0)
        yield attr
        gpus = [g for g in s.gpus if attribution.admits(g.uuid)]
        if not gpus:
            return
        info = gauge(n.GPU_INFO, ("gpu", "uuid", "name"))
        for g in gpus:
            info.add_metric([str(g.index), g.uuid, g.name], 1.0)
        yield info
        rows = [((str(g.index), g.uuid), g) for g in gpus]
        yield from fields(_NVML, rows)
        yield from _throttle(gpus)
        yield from fields(_GPM, rows)  # GPU Performance Monitoring, for the GPUs whose sampler read it


def _throttle(gpus: list[GpuSample]) -> Iterator[Family]:
    """One series per GPU and clock event reason: 1 while the clock is held down for it."""
    throttle = gauge(n.GPU_THROTTLE_REASON, ("gpu", "uuid", "reason"))
    for g in gpus:
        for reason, active in sorted((g.throttle_reasons or {}).items()):
            throttle.add_metric([str(g.index), g.uuid, reason], 1.0 if active else 0.0)
    if throttle.samples:
        yield throttle
