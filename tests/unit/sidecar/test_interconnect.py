"""NVLink and PCIe byte counters from NVML field values (fake pynvml), and GPU memory."""

from __future__ import annotations

import pytest

from dam_contract import names as n
from dam_sidecar.errors import ErrorLog
from dam_sidecar.fake_nvml import FakeGpu, FakeNvml
from dam_sidecar.samplers.nvml import NvmlSampler

KIB = 1024


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(gpu: FakeGpu) -> tuple[NvmlSampler, FakeNvml, ErrorLog, Clock]:
    errors, fake, clock = ErrorLog(), FakeNvml([gpu]), Clock()
    return NvmlSampler(errors, load=lambda: fake, clock=clock), fake, errors, clock


def test_nvlink_bytes_are_the_per_link_kib_counters_summed_over_the_links() -> None:
    s, _, _, _ = make(FakeGpu(uuid="GPU-a", nvlink_links=4, nvlink_kib_per_read=(100, 10)))
    first = s.sample().gpus[0]
    second = s.sample().gpus[0]
    # Link i reads i KiB more than link 0; every read advances each link by 100 KiB (tx) / 10 KiB (rx).
    assert first.nvlink_tx_bytes is not None and second.nvlink_tx_bytes is not None
    assert second.nvlink_tx_bytes - first.nvlink_tx_bytes == pytest.approx(4 * 100 * 2 * KIB)
    assert first.nvlink_rx_bytes is not None and second.nvlink_rx_bytes is not None
    assert second.nvlink_rx_bytes - first.nvlink_rx_bytes == pytest.approx(4 * 10 * 2 * KIB)


def test_a_driver_that_answers_every_link_with_the_gpu_total_is_not_counted_once_per_link() -> None:
    s, _, _, _ = make(
        FakeGpu(uuid="GPU-a", nvlink_links=18, nvlink_kib_per_read=(100, 10), nvlink_gpu_wide=True)
    )
    a = s.sample().gpus[0].nvlink_tx_bytes
    b = s.sample().gpus[0].nvlink_tx_bytes
    assert a is not None and b is not None
    # Two reads a tick (NVLink, PCIe), each advancing the GPU total by 18 links x 100 KiB: taken once.
    assert b - a == pytest.approx(2 * 18 * 100 * KIB)


def test_a_gpu_without_nvlink_has_no_nvlink_series_and_no_error() -> None:
    s, _, errors, _ = make(FakeGpu(uuid="GPU-a", nvlink_links=0))
    g = s.sample().gpus[0]
    assert g.nvlink_tx_bytes is None and g.nvlink_rx_bytes is None
    assert errors.counts() == {}


def test_field_values_not_supported_make_the_interconnect_series_absent_not_an_error_each_tick() -> None:
    s, fake, errors, _ = make(FakeGpu(uuid="GPU-a", pcie_kbps=0))
    fake.unsupported.add("nvmlDeviceGetFieldValues")
    s.sample()
    after_one = errors.count("nvml", "not_supported")
    for _ in range(3):
        g = s.sample().gpus[0]
    assert g.nvlink_tx_bytes is None
    assert g.pcie_tx_bytes == 0.0  # integrated from the throughput samples instead (0 KB/s here)
    assert after_one == 2  # NVLink and PCIe counters, once each, then not asked again
    assert errors.count("nvml", "not_supported") == after_one
    assert "nvmlDeviceGetFieldValues" in fake.unsupported


def test_pcie_bytes_come_from_the_byte_counters_when_the_driver_has_them() -> None:
    s, _, _, _ = make(FakeGpu(uuid="GPU-a", pcie_bytes_per_read=(1000, 500)))
    a = s.sample().gpus[0]
    b = s.sample().gpus[0]
    assert a.pcie_tx_bytes is not None and b.pcie_tx_bytes is not None and b.pcie_tx_bytes > a.pcie_tx_bytes
    assert a.pcie_rx_bytes is not None and b.pcie_rx_bytes is not None
    assert (b.pcie_rx_bytes - a.pcie_rx_bytes) * 2 == pytest.approx(b.pcie_tx_bytes - a.pcie_tx_bytes)


def test_without_byte_counters_pcie_bytes_integrate_the_throughput_over_the_interval() -> None:
    s, _, _, clock = make(FakeGpu(uuid="GPU-a", pcie_bytes_per_read=None, pcie_kbps=2000))
    assert s.sample().gpus[0].pcie_tx_bytes == 0.0  # nothing to integrate over yet
    clock.now += 1.5
    g = s.sample().gpus[0]
    assert g.pcie_tx_bytes == pytest.approx(2000 * KIB * 1.5)
    assert g.pcie_rx_bytes == pytest.approx(2000 * KIB * 1.5)
    clock.now += 0.5
    assert s.sample().gpus[0].pcie_tx_bytes == pytest.approx(2000 * KIB * 2.0)


def test_a_hardware_counter_that_goes_back_is_carried_over_not_exported_lower() -> None:
    s, fake, _, _ = make(FakeGpu(uuid="GPU-a", nvlink_links=2))
    s.sample()
    high = s.sample().gpus[0].nvlink_tx_bytes
    fake.gpus[0].reads = 0  # the driver reloaded: counters from zero
    after = s.sample().gpus[0].nvlink_tx_bytes
    assert high is not None and after is not None and after >= high


def test_the_collector_exports_interconnect_counters_and_gpu_memory_with_direction_labels() -> None:
    from dam_sidecar.attribution import Attributor
    from dam_sidecar.collector import SidecarCollector, standard_collectors
    from dam_sidecar.samplers.cpu import CpuSample
    from dam_sidecar.samplers.probe import ProbeSample

    class Probe:
        def sample(self) -> ProbeSample:
            return ProbeSample()

    class Cpu:
        def sample(self, pids: object) -> CpuSample:
            return CpuSample()

    errors = ErrorLog()
    fake = FakeNvml([FakeGpu(uuid="GPU-a", nvlink_links=2), FakeGpu(uuid="GPU-b", nvlink_links=0)])
    c = SidecarCollector(
        standard_collectors(
            probe=Probe(),
            nvml=NvmlSampler(errors, load=lambda: fake),
            cpu=Cpu(),
            errors=errors,
            attributor=Attributor("all", None),
        ),
        errors=errors,
    )
    c.sample_now()
    snap = c.snapshot()
    nvlink = {(s.label("gpu"), s.label("direction")) for s in snap.samples(n.GPU_NVLINK_BYTES_TOTAL)}
    assert nvlink == {("0", "tx"), ("0", "rx")}  # GPU 1 has no NVLink: absent, not zero
    pcie = {(s.label("gpu"), s.label("direction")) for s in snap.samples(n.GPU_PCIE_BYTES_TOTAL)}
    assert pcie == {("0", "tx"), ("0", "rx"), ("1", "tx"), ("1", "rx")}
    assert {s.value for s in snap.samples(n.GPU_MEMORY_TOTAL_BYTES)} == {80 * 1024**3}
    assert {s.value for s in snap.samples(n.GPU_MEMORY_USED_BYTES)} == {60 * 1024**3}
