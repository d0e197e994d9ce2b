"""The real NVML sampler driven by a fake pynvml module: values, GPM, and every fault."""

from __future__ import annotations

import threading
import time

import pytest

from dam_sidecar.errors import ErrorLog
from dam_sidecar.fake_nvml import FakeGpu, FakeNvml
from dam_sidecar.samplers.nvml import NvmlSampler, Watchdog


def make(fake: FakeNvml) -> tuple[NvmlSampler, ErrorLog]:
    errors = ErrorLog()
    return NvmlSampler(errors, load=lambda: fake), errors


def test_values_are_converted_to_base_units_and_ratios() -> None:
    fake = FakeNvml(
        [
            FakeGpu(
                uuid="GPU-x",
                utilization=87,
                memory_busy=12,
                readings={"power": 312_500, "sm_clock": 1755, "temperature": 74},
            )
        ]
    )
    s, _ = make(fake)
    g = s.sample().gpus[0]
    assert g.utilization_ratio == pytest.approx(0.87)
    assert g.memory_busy_ratio == pytest.approx(0.12)
    assert g.power_watts == pytest.approx(312.5)
    assert g.sm_clock_hertz == pytest.approx(1.755e9)
    assert g.temperature_celsius == 74.0
    assert g.pcie_tx_bytes_per_second == pytest.approx(1_000_000 * 1024)
    assert g.uuid == "GPU-x" and g.name.startswith("NVIDIA")


def test_nvml_is_initialised_once_per_process() -> None:
    fake = FakeNvml(2)
    s, _ = make(fake)
    for _ in range(5):
        assert s.sample().up
    assert fake.init_calls == 1
    s.close()
    assert fake.shutdown_calls == 1


def test_throttle_reason_bitmask_becomes_a_bounded_label_set() -> None:
    fake = FakeNvml([FakeGpu(uuid="GPU-x", throttle_mask=0x4 | 0x40 | 0x10000)])
    s, _ = make(fake)
    reasons = s.sample().gpus[0].throttle_reasons
    assert reasons is not None
    assert {k for k, v in reasons.items() if v} == {"sw_power_cap", "hw_thermal_slowdown"}
    assert len(reasons) == 9  # an unknown bit adds no label


def test_gpm_needs_two_samples_and_reports_percent_as_ratio() -> None:
    fake = FakeNvml([FakeGpu(uuid="GPU-x", gpm_percent={2: 85.0, 5: 70.0, 10: 30.0, 3: 40.0})])
    s, _ = make(fake)
    assert s.sample().gpus[0].gpm == {}  # the first tick only takes the first sample
    gpm = s.sample().gpus[0].gpm
    assert gpm["sm_active"] == pytest.approx(0.85)
    assert gpm["tensor_active"] == pytest.approx(0.70)
    assert gpm["dram_bandwidth_utilization"] == pytest.approx(0.30)
    assert gpm["sm_occupancy"] == pytest.approx(0.40)
    assert "fp16_active" not in gpm  # that metric's per-metric return was NOT_SUPPORTED


def test_gpm_alternates_its_two_samples_and_frees_them_on_close() -> None:
    fake = FakeNvml(1)
    s, _ = make(fake)
    for _ in range(4):
        s.sample()
    pairs = fake.metrics_get_pairs
    assert len(pairs) == 3
    assert pairs[0] == (pairs[1][1], pairs[1][0])  # the newer sample becomes the older one
    assert len(fake.allocated) == 2
    s.close()
    assert all(x.freed for x in fake.allocated)


def test_pre_hopper_gpu_simply_lacks_gpm_series() -> None:
    fake = FakeNvml([FakeGpu(uuid="GPU-a100", gpm=False)])
    s, errors = make(fake)
    s.sample()
    g = s.sample().gpus[0]
    assert g.gpm == {} and g.utilization_ratio is not None
    assert errors.counts() == {}


def test_not_supported_call_makes_only_that_series_absent_and_is_not_retried() -> None:
    fake = FakeNvml(1)
    fake.unsupported.add("nvmlDeviceGetPowerUsage")
    s, errors = make(fake)
    for _ in range(3):
        g = s.sample().gpus[0]
        assert g.power_watts is None and g.utilization_ratio is not None
    assert errors.count("nvml", "not_supported") == 1


def test_missing_library_reads_nvml_down_and_retries_rarely() -> None:
    fake = FakeNvml(1, library_missing=True)
    s = NvmlSampler(ErrorLog(), load=lambda: fake, retry_init_every=10)
    results = [s.sample() for _ in range(12)]
    assert not any(r.up for r in results)
    assert fake.init_calls == 2


def test_pynvml_not_importable_reads_nvml_down() -> None:
    def load() -> object:
        raise ImportError("No module named 'pynvml'")

    errors = ErrorLog()
    assert not NvmlSampler(errors, load=load).sample().up
    assert errors.count("nvml", "no_library") == 1


def test_zero_gpus_is_up_with_no_gpu_series() -> None:
    s, errors = make(FakeNvml(0))
    r = s.sample()
    assert r.up and r.gpus == ()
    assert errors.count("nvml", "no_gpus") == 1


def test_lost_gpu_drops_its_series_and_keeps_the_others() -> None:
    fake = FakeNvml(2)
    s, errors = make(fake)
    s.sample()
    fake.lost.add(0)
    for _ in range(3):
        r = s.sample()
        assert r.up and [g.index for g in r.gpus] == [1]
    assert errors.count("nvml", "gpu_lost") == 1


def test_hanging_call_marks_nvml_stuck_within_the_timeout_and_recovers() -> None:
    fake = FakeNvml(1)
    errors = ErrorLog()
    w = Watchdog(NvmlSampler(errors, load=lambda: fake), timeout_seconds=0.2, errors=errors)
    try:
        assert w.sample().up
        fake.hang = threading.Event()
        t0 = time.monotonic()
        r = w.sample()
        assert time.monotonic() - t0 < 1.0
        assert not r.up and r.stuck
        r2 = w.sample()  # the worker is still inside the hung call: answered at once
        assert not r2.up and r2.stuck
        assert errors.count("nvml", "timeout") == 1
        fake.hang.set()
        fake.hang = None
        deadline = time.monotonic() + 5
        while not w.sample().up:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        if fake.hang is not None:
            fake.hang.set()
        w.close()
