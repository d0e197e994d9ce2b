"""The collector: cached samples as metric families, GPU attribution, snapshots, the exposition."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import REGISTRY, CollectorRegistry

from dam_contract import names as n
from dam_contract.snapshot import labels_of, parse, parse_snapshot
from dam_sidecar.attribution import Attributor, visible_uuids
from dam_sidecar.collector import SidecarCollector, build_collector, standard_collectors
from dam_sidecar.errors import ErrorLog
from dam_sidecar.fake_nvml import FakeGpu, FakeNvml
from dam_sidecar.samplers.cpu import CpuSample
from dam_sidecar.samplers.nvml import NvmlSampler
from dam_sidecar.samplers.probe import ProbeSample, RankInfo, RankSample
from dam_sidecar.settings import SidecarSettings

from .conftest import write_probe

UUIDS = [f"GPU-{i}" for i in range(4)]


class StubProbe:
    def __init__(self, sample: ProbeSample) -> None:
        self.value = sample
        self.calls = 0
        self.error: Exception | None = None  # raised by sample() when set

    def sample(self) -> ProbeSample:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return self.value


class StubCpu:
    def __init__(self) -> None:
        self.pids: list[int] = []

    def sample(self, pids: Iterable[int]) -> CpuSample:
        self.pids = list(pids)
        return CpuSample(
            main_cpu_seconds=12.5,
            worker_cpu_seconds=30.0,
            main_processes=1,
            worker_processes=4,
            throttled_seconds=1.5,
            limit_cores=4.0,
        )


def make(
    probe: ProbeSample,
    fallback: str = "visible_devices",
    visible: str | None = None,
    gpus: int = 4,
    interval_seconds: float = 1.0,
) -> tuple[SidecarCollector, StubProbe, ErrorLog]:
    errors = ErrorLog()
    fake = FakeNvml([FakeGpu(uuid=u, utilization=50 + i) for i, u in enumerate(UUIDS[:gpus])])
    stub = StubProbe(probe)
    c = SidecarCollector(
        standard_collectors(
            probe=stub,
            nvml=NvmlSampler(errors, load=lambda: fake),
            cpu=StubCpu(),
            errors=errors,
            attributor=Attributor(fallback, visible),  # type: ignore[arg-type]
        ),
        errors=errors,
        interval_seconds=interval_seconds,
    )
    return c, stub, errors


LIVE = ProbeSample(steps=10, wait_seconds=2.0, step_seconds=8.0, up=True, live_pids=(7,), batch_size=32)


def test_only_gpus_published_by_the_probe_are_reported() -> None:
    c, _, _ = make(replace(LIVE, device_uuids=("GPU-1", "GPU-3")))
    c.sample_now()
    snap = c.snapshot()
    assert {s.label("uuid") for s in snap.samples(n.GPU_UTILIZATION_RATIO)} == {"GPU-1", "GPU-3"}
    assert snap.series(n.GPU_ATTRIBUTION)[labels_of({"state": "probe"})] == 1.0


def test_visible_devices_uuids_are_the_fallback_when_no_probe_publishes_uuids() -> None:
    c, _, _ = make(LIVE, visible="GPU-2")
    c.sample_now()
    snap = c.snapshot()
    assert {s.label("uuid") for s in snap.samples(n.GPU_UTILIZATION_RATIO)} == {"GPU-2"}
    assert snap.series(n.GPU_ATTRIBUTION)[labels_of({"state": "visible_devices"})] == 1.0


@pytest.mark.parametrize("visible", [None, "all", "0,1", ""])
def test_no_gpu_is_reported_when_the_job_cannot_be_attributed(visible: str | None) -> None:
    c, _, _ = make(LIVE, visible=visible)
    c.sample_now()
    snap = c.snapshot()
    assert snap.samples(n.GPU_UTILIZATION_RATIO) == []
    assert snap.series(n.GPU_ATTRIBUTION)[labels_of({"state": "none"})] == 1.0
    assert snap.series(n.NVML_UP)[()] == 1.0


def test_fallback_all_reports_every_gpu_on_a_single_tenant_node() -> None:
    c, _, _ = make(LIVE, fallback="all")
    c.sample_now()
    assert len(c.snapshot().samples(n.GPU_UTILIZATION_RATIO)) == 4


def test_visible_uuid_parsing_accepts_only_uuids() -> None:
    assert visible_uuids("GPU-a, MIG-b") == frozenset({"GPU-a", "MIG-b"})
    assert visible_uuids("GPU-a,1") == frozenset()


def test_snapshot_carries_probe_cpu_gpu_and_sidecar_series() -> None:
    c, _, _ = make(replace(LIVE, device_uuids=("GPU-0",)))
    c.sample_now()
    c.sample_now()  # the second tick has GPM
    snap = c.snapshot()
    assert snap.series(n.STEPS_TOTAL)[()] == 10
    assert snap.series(n.DATALOADER_WAIT_SECONDS_TOTAL)[()] == 2.0
    assert snap.series(n.PROBE_UP)[()] == 1.0
    assert snap.series(n.BATCH_SIZE)[()] == 32
    assert snap.series(n.PROCESS_CPU_SECONDS_TOTAL)[labels_of({"role": "worker"})] == 30.0
    assert snap.series(n.PROCESSES)[labels_of({"role": "worker"})] == 4.0
    assert snap.series(n.CONTAINER_CPU_THROTTLED_SECONDS_TOTAL)[()] == 1.5
    assert snap.series(n.GPU_SM_ACTIVE_RATIO)[labels_of({"gpu": "0", "uuid": "GPU-0"})] == pytest.approx(0.85)
    assert (
        snap.series(n.GPU_THROTTLE_REASON)[labels_of({"gpu": "0", "uuid": "GPU-0", "reason": "sw_power_cap"})]
        == 1.0
    )
    assert snap.samples(n.SNAPSHOT_TIMESTAMP_SECONDS)[0].value > 0
    assert snap.timestamp_seconds is not None


def test_collect_reads_the_cache_and_never_runs_a_sampler() -> None:
    c, stub, _ = make(LIVE)
    c.sample_now()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(c)
    for _ in range(10):
        generate_latest(registry)
        c.text()
        c.snapshot()
    assert stub.calls == 1


def test_a_sampler_that_raises_is_counted_keeps_its_counters_and_the_others_still_report() -> None:
    c, stub, _ = make(LIVE)
    c.sample_now()
    stub.error = RuntimeError("boom")
    c.sample_now()
    snap = c.snapshot()
    assert snap.series(n.PROBE_UP)[()] == 0.0
    assert snap.series(n.STEPS_TOTAL)[()] == 10  # not reset to 0
    assert snap.series(n.NVML_UP)[()] == 1.0
    assert snap.series(n.SAMPLER_ERRORS_TOTAL)[labels_of({"sampler": "probe", "reason": "exception"})] == 1


def test_background_loop_samples_at_the_interval_and_stops() -> None:
    c, stub, _ = make(LIVE, interval_seconds=0.05)
    c.start()
    time.sleep(0.5)
    c.close()
    calls = stub.calls
    assert 4 <= calls <= 15
    time.sleep(0.15)
    assert stub.calls == calls
    assert c.healthy()


def test_build_collector_needs_no_http_and_no_default_registry(tmp_path: Path) -> None:
    before = set(REGISTRY._names_to_collectors)
    write_probe(tmp_path, pid=1, steps=5, wait_ns=10**9, step_ns=2 * 10**9)  # pid 1 is alive here
    settings = SidecarSettings(probe_dir=str(tmp_path), fake_gpus=2, gpu_attribution_fallback="all")
    c = build_collector(settings)
    try:
        c.sample_now()
        snap = c.snapshot()
    finally:
        c.close()
    assert snap.series(n.STEPS_TOTAL)[()] == 5
    assert len(snap.samples(n.GPU_UTILIZATION_RATIO)) == 2
    assert set(REGISTRY._names_to_collectors) == before


def test_exposition_passes_promtool_check_metrics() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package 'prometheus')")
    c, _, errors = make(replace(LIVE, device_uuids=tuple(UUIDS)))
    errors.record("probe", "truncated", "x")
    c.sample_now()
    c.sample_now()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(c)
    text = generate_latest(registry)
    done = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()


def test_fast_renderer_matches_the_client_library_sample_for_sample() -> None:
    c, _, errors = make(replace(LIVE, device_uuids=tuple(UUIDS)))
    errors.record("nvml", "not_supported", 'a "quoted"\nmessage')
    c.sample_now()
    c.sample_now()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(c)
    ours = parse(c.text().decode(), "ours")
    theirs = parse(generate_latest(registry).decode(), "prometheus_client")
    assert sorted(ours, key=repr) == sorted(theirs, key=repr)
    assert len(ours) > 100


def test_the_local_snapshot_is_what_parsing_the_served_text_gives_sample_for_sample() -> None:
    ranks = (
        RankSample(rank=None, totals={"steps": 3, "wait_seconds": 0.5, "step_seconds": 1.0}, live=True),
        RankSample(
            rank=1,
            totals={"steps": 7, "collectives": 4, "collective_seconds": 0.25, "productive_seconds": 2.0},
            live=True,
        ),
    )
    probe = replace(LIVE, device_uuids=tuple(UUIDS), ranks=ranks, rank_info=(RankInfo(1, None, 2),))
    c, _, errors = make(probe)
    errors.record("nvml", "not_supported", 'a "quoted"\nmessage with a \\ backslash')
    c.sample_now()
    c.sample_now()
    direct, parsed = c.snapshot(), parse_snapshot(c.text().decode(), "served")
    assert direct.names() == parsed.names()
    for name in parsed.names():
        assert sorted(direct.samples(name), key=repr) == sorted(parsed.samples(name), key=repr), name
    assert len(direct) == len(parsed) > 100
    assert direct.timestamp_seconds == c.latest().timestamp_seconds > 0
    assert direct.series(n.STEPS_TOTAL) == {(): 3.0, (("rank", "1"),): 7.0}


def test_promtool_accepts_the_fast_renderer_output() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package 'prometheus')")
    c, _, _ = make(replace(LIVE, device_uuids=tuple(UUIDS)))
    c.sample_now()
    c.sample_now()
    done = subprocess.run(
        [promtool, "check", "metrics"], input=c.text(), capture_output=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
