"""MIG: a GPU in MIG mode is sampled with its MIG devices, each saying its share of the GPU
(``dam_gpu_slice_ratio``); NVML that cannot tell leaves the share unknown, never an error."""

from __future__ import annotations

from dam_contract import names as n
from dam_sidecar.attribution import Attribution
from dam_sidecar.collectors.gpu import GpuCollector
from dam_sidecar.errors import ErrorLog
from dam_sidecar.fake_nvml import FakeGpu, FakeNvml
from dam_sidecar.samplers.nvml import NvmlSample, NvmlSampler


def _sample(fake: FakeNvml) -> tuple[NvmlSample, ErrorLog]:
    errors = ErrorLog()
    sampler = NvmlSampler(errors, load=lambda: fake)
    return sampler.sample(), errors


def test_a_3g_mig_device_of_a_7_slice_gpu_is_three_sevenths_of_it() -> None:
    fake = FakeNvml([FakeGpu(uuid="GPU-a100", name="NVIDIA A100-SXM4-80GB", mig=True, mig_slices=(3, 4))])
    sample, _ = _sample(fake)
    by_uuid = {g.uuid: g for g in sample.gpus}
    assert by_uuid["GPU-a100"].slice_ratio == 1.0  # the GPU itself
    migs = [g for g in sample.gpus if g.uuid.startswith("MIG-")]
    assert [g.slice_ratio for g in migs] == [3 / 7, 4 / 7]
    # Under its GPU's index and name (the peak table's model), its own UUID (what the probe publishes).
    assert {(g.index, g.name) for g in migs} == {(0, "NVIDIA A100-SXM4-80GB")}
    assert len({g.uuid for g in migs}) == 2
    assert migs[0].utilization_ratio is None and migs[0].memory_used_bytes is not None  # as the driver


def test_a_4_slice_gpu_divides_by_its_own_most() -> None:
    fake = FakeNvml([FakeGpu(uuid="GPU-a30", name="NVIDIA A30", mig=True, mig_slices=(2,), max_slices=4)])
    sample, _ = _sample(fake)
    assert [g.slice_ratio for g in sample.gpus if g.uuid.startswith("MIG-")] == [0.5]


def test_mig_mode_off_is_the_whole_gpu() -> None:
    sample, _ = _sample(FakeNvml([FakeGpu(uuid="GPU-h100", mig=False)]))
    assert [g.slice_ratio for g in sample.gpus] == [1.0]


def test_a_gpu_without_mig_support_leaves_the_share_unknown_without_an_error() -> None:
    sample, errors = _sample(FakeNvml([FakeGpu(uuid="GPU-l4", name="NVIDIA L4")]))  # NOT_SUPPORTED
    assert [g.slice_ratio for g in sample.gpus] == [None]
    assert sample.up and not errors.counts()


def test_unreadable_attributes_leave_the_slice_unknown_and_never_crash() -> None:
    fake = FakeNvml([FakeGpu(uuid="GPU-a100", mig=True, mig_slices=(3,))])
    fake.unsupported.add("nvmlDeviceGetAttributes")
    sample, _ = _sample(fake)
    (mig,) = [g for g in sample.gpus if g.uuid.startswith("MIG-")]
    assert mig.slice_ratio is None and sample.up


def test_the_slice_ratio_is_exported_for_the_job_s_mig_device_only() -> None:
    fake = FakeNvml([FakeGpu(uuid="GPU-a100", mig=True, mig_slices=(3, 4))])
    sample, _ = _sample(fake)
    mine = next(g.uuid for g in sample.gpus if g.uuid.startswith("MIG-"))
    collector = GpuCollector.__new__(GpuCollector)
    collector.latest, collector.attribution = sample, Attribution("probe", frozenset({mine}))
    families = {f.name: f for f in collector.collect()}
    assert families[n.GPU_SLICE_RATIO].samples == [(("0", mine), 3 / 7)]
