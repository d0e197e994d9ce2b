"""The NVML collector: the GPUs the job is attributed, their utilisation, memory, clocks, links and GPM."""

from __future__ import annotations

from collections.abc import Iterator

from dam_contract import names as n
from dam_sidecar.attribution import STATES, Attribution, Attributor
from dam_sidecar.collectors.base import Tick, counter, gauge, single
from dam_sidecar.exposition import Family
from dam_sidecar.samplers.nvml import GpuSample, NvmlSample, NvmlSource

_SIMPLE = (
    (n.GPU_UTILIZATION_RATIO, "utilization_ratio"),
    (n.GPU_MEMORY_BUSY_RATIO, "memory_busy_ratio"),
    (n.GPU_MEMORY_USED_BYTES, "memory_used_bytes"),
    (n.GPU_MEMORY_TOTAL_BYTES, "memory_total_bytes"),
    (n.GPU_POWER_WATTS, "power_watts"),
    (n.GPU_SM_CLOCK_HERTZ, "sm_clock_hertz"),
    (n.GPU_TEMPERATURE_CELSIUS, "temperature_celsius"),
    (n.GPU_PCIE_TX_BYTES_PER_SECOND, "pcie_tx_bytes_per_second"),
    (n.GPU_PCIE_RX_BYTES_PER_SECOND, "pcie_rx_bytes_per_second"),
)
_LINKS = (
    (n.GPU_PCIE_BYTES_TOTAL, ("pcie_tx_bytes", "pcie_rx_bytes")),
    (n.GPU_NVLINK_BYTES_TOTAL, ("nvlink_tx_bytes", "nvlink_rx_bytes")),
)
_GPM = {
    "sm_active": n.GPU_SM_ACTIVE_RATIO,
    "sm_occupancy": n.GPU_SM_OCCUPANCY_RATIO,
    "tensor_active": n.GPU_TENSOR_ACTIVE_RATIO,
    "dram_bandwidth_utilization": n.GPU_DRAM_BANDWIDTH_UTILIZATION_RATIO,
    "fp16_active": n.GPU_FP16_ACTIVE_RATIO,
    "fp32_active": n.GPU_FP32_ACTIVE_RATIO,
}


class GpuCollector:
    """NVML's figures for the GPUs attributed to the job (by the UUIDs the probes published this tick)."""

    sampler = "nvml"

    def __init__(self, source: NvmlSource, attributor: Attributor) -> None:
        self.source = source
        self.attributor = attributor
        self.latest = NvmlSample(up=False)
        self.attribution = Attribution("none", frozenset())

    def sample(self, tick: Tick) -> None:
        self._update(self.source.sample(), tick)

    def fallback(self, tick: Tick) -> None:
        self._update(NvmlSample(up=False), tick)

    def _update(self, sample: NvmlSample, tick: Tick) -> None:
        self.latest = sample
        self.attribution = self.attributor.decide(tick.probe.device_uuids)

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
        yield from _device(gpus)
        yield from _profiling(gpus)


def _device(gpus: list[GpuSample]) -> Iterator[Family]:
    """What every GPU reports: the gauges, the link counters and the throttle reasons."""
    for name, attr_name in _SIMPLE:
        fam = gauge(name, ("gpu", "uuid"))
        for g in gpus:
            value = getattr(g, attr_name)
            if value is not None:
                fam.add_metric([str(g.index), g.uuid], float(value))
        if fam.samples:
            yield fam
    for name, (tx_attr, rx_attr) in _LINKS:
        fam = counter(name, ("gpu", "uuid", "direction"))
        for g in gpus:
            for direction, attr_name in ((n.DIRECTION_TX, tx_attr), (n.DIRECTION_RX, rx_attr)):
                value = getattr(g, attr_name)
                if value is not None:
                    fam.add_metric([str(g.index), g.uuid, direction], float(value))
        if fam.samples:
            yield fam
    throttle = gauge(n.GPU_THROTTLE_REASON, ("gpu", "uuid", "reason"))
    for g in gpus:
        for reason, active in sorted((g.throttle_reasons or {}).items()):
            throttle.add_metric([str(g.index), g.uuid, reason], 1.0 if active else 0.0)
    if throttle.samples:
        yield throttle


def _profiling(gpus: list[GpuSample]) -> Iterator[Family]:
    """GPM (GPU Performance Monitoring) ratios, for the GPUs whose sampler read them."""
    for key, name in _GPM.items():
        fam = gauge(name, ("gpu", "uuid"))
        for g in gpus:
            if key in g.gpm:
                fam.add_metric([str(g.index), g.uuid], g.gpm[key])
        if fam.samples:
            yield fam
