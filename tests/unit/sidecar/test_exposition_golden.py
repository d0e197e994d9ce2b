"""The /metrics text of fixed samples, byte for byte: HELP and TYPE lines, family order, labels.

The collectors derive their families from the metric declarations (``dam_contract.names``); these
golden files pin that the text they write does not change when the declarations or the collectors
are reshaped. A new metric whose sample field these fixed samples leave unset stays absent here.
After a deliberate change of the exposition, rewrite the files with
``DAM_UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/sidecar/test_exposition_golden.py``.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable
from pathlib import Path

import pytest

from dam_sidecar.attribution import Attributor
from dam_sidecar.collector import SidecarCollector, standard_collectors
from dam_sidecar.errors import ErrorLog
from dam_sidecar.exposition import render
from dam_sidecar.samplers.cpu import CpuSample, PublishedCpu
from dam_sidecar.samplers.nvml import GpuSample, NvmlSample
from dam_sidecar.samplers.probe import ProbeSample, RankInfo, RankSample

GOLDEN = Path(__file__).parent / "golden"


class Fixed:
    """A source that answers the same sample every time (probe and NVML shapes)."""

    def __init__(self, value: object) -> None:
        self.value = value

    def sample(self, pids: Iterable[int] = ()) -> object:
        return self.value

    def close(self) -> None:
        return None


RANKS = (
    RankSample(
        rank=0,
        totals={
            "steps": 120,
            "wait_seconds": 3.5,
            "step_seconds": 60.25,
            "collectives": 480,
            "collective_seconds": 7.5,
            "collective_exposed_seconds": 1.25,
            "collective_bytes": 1 << 30,
            "productive_seconds": 50.0,
            "startup_seconds": 4.0,
            "other_seconds": 0.5,
            "checkpoint_seconds": 2.0,
            "checkpoints": 2,
        },
        batch_size=32,
        flops_per_step=1.5e12,
        live=True,
        flops_per_step_source="measured",
        steps_since_checkpoint=20,
        last_checkpoint_seconds=1_700_000_000.5,
    ),
    RankSample(
        rank=1, totals={"steps": 118, "wait_seconds": 4.0, "step_seconds": 60.0}, batch_size=32, live=True
    ),
    RankSample(rank=None, totals={"steps": 5, "wait_seconds": 0.25, "step_seconds": 1.0}, flops_per_step=2e9),
)

FULL_PROBE = ProbeSample(
    steps=243,
    wait_seconds=7.75,
    step_seconds=121.25,
    up=True,
    live_pids=(101, 102),
    device_uuids=("GPU-a", "GPU-b"),
    batch_size=32,
    files=3,
    ranks=RANKS,
    rank_info=(RankInfo(0, 0, 2), RankInfo(1, None, None)),
    loader_worker_kills=1.0,
    oom_kills=3.0,  # the sidecar's own cgroup read wins over these
    cgroup_throttled_seconds=9.0,
)

FULL_GPUS = NvmlSample(
    up=True,
    gpus=(
        GpuSample(
            index=0,
            uuid="GPU-a",
            name="NVIDIA H100 80GB HBM3",
            utilization_ratio=0.97,
            memory_busy_ratio=0.41,
            memory_used_bytes=6.4e10,
            memory_total_bytes=8.5e10,
            power_watts=612.5,
            sm_clock_hertz=1.98e9,
            temperature_celsius=71.0,
            throttle_reasons={"sw_power_cap": True, "gpu_idle": False},
            pcie_tx_bytes_per_second=1.5e9,
            pcie_rx_bytes_per_second=2.5e9,
            gpm={
                "sm_active": 0.8,
                "sm_occupancy": 0.45,
                "tensor_active": 0.6,
                "dram_bandwidth_utilization": 0.5,
                "fp16_active": 0.01,
                "fp32_active": 0.02,
            },
            nvlink_tx_bytes=1e12,
            nvlink_rx_bytes=2e12,
            pcie_tx_bytes=3e10,
            pcie_rx_bytes=4e10,
        ),
        GpuSample(
            index=1, uuid="GPU-b", name="H100", utilization_ratio=0.5, pcie_tx_bytes=6.0, pcie_rx_bytes=7.0
        ),
        GpuSample(index=2, uuid="GPU-not-ours", utilization_ratio=0.1),  # not attributed: absent
    ),
)

FULL_CPU = CpuSample(
    main_cpu_seconds=12.5,
    worker_cpu_seconds=30.0,
    main_processes=2,
    worker_processes=8,
    throttled_seconds=1.5,
    limit_cores=4.0,
    node_utilization_ratio=0.35,
    main_rss_bytes=2.5e9,
    worker_rss_bytes=8e9,
    memory_usage_bytes=1.2e10,
    memory_limit_bytes=3.2e10,
    oom_kills=1.0,
    main_wait_seconds=0.75,
    worker_wait_seconds=2.25,
)

# The training container's cgroup is not visible: the probe's own reads stand in; NVML is down.
PROBE_SOURCED = ProbeSample(
    steps=10,
    wait_seconds=1.0,
    step_seconds=5.0,
    up=True,
    live_pids=(7,),
    cgroup_throttled_seconds=0.5,
    cgroup_limit_cores=2.0,
    memory_usage_bytes=1e9,
    memory_limit_bytes=4e9,
    oom_kills=0.0,
)

SCENARIOS: dict[str, tuple[ProbeSample, NvmlSample, CpuSample]] = {
    "full": (FULL_PROBE, FULL_GPUS, FULL_CPU),
    "probe-sourced": (PROBE_SOURCED, NvmlSample(up=False), CpuSample(main_cpu_seconds=1.0)),
    "empty": (ProbeSample(), NvmlSample(up=False), CpuSample()),
}


def exposition(probe: ProbeSample, nvml: NvmlSample, cpu: CpuSample) -> bytes:
    """One tick of the standard collectors over fixed samples, with fixed durations and clock."""
    errors = ErrorLog()
    errors.record("nvml", "not_supported", "GPU 1: power is not supported; series absent")
    errors.record("cpu", "proc_parse", "/proc/1/stat: bad")
    collectors = standard_collectors(
        probe=Fixed(probe),  # type: ignore[arg-type]
        nvml=Fixed(nvml),  # type: ignore[arg-type]
        cpu=Fixed(cpu),  # type: ignore[arg-type]
        errors=errors,
        attributor=Attributor("visible_devices", None),
        published=PublishedCpu(own_namespace=0),
    )
    timer = itertools.cycle((0.0, 0.001)).__next__  # every timed sampler took 1 ms
    sidecar = SidecarCollector(collectors, errors=errors, clock=lambda: 1_700_000_100.25, timer=timer)
    sidecar.sample_now()
    assert sidecar.text() == render(f for c in collectors for f in c.collect())
    return sidecar.text()


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_the_exposition_of_fixed_samples_is_the_golden_text(scenario: str) -> None:
    text = exposition(*SCENARIOS[scenario])
    path = GOLDEN / f"{scenario}.prom"
    if os.environ.get("DAM_UPDATE_GOLDEN") == "1":
        path.write_bytes(text)
    assert text == path.read_bytes(), f"the exposition of {scenario!r} changed"
