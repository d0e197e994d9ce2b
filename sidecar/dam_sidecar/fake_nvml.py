# ruff: noqa: N802, N815
"""A pynvml-like module with simulated GPUs, for tests and the cost benchmark.

It is injected into the real ``NvmlSampler`` (``NvmlSampler(errors, load=lambda: FakeNvml(8))``)
so that the real code paths run; only the driver is simulated. Faults can be
switched on per instance: a missing library, unsupported calls, a lost GPU, a
hanging call, pre-Hopper GPUs without GPM. A ``FakeGpu`` with ``mig`` set is in MIG mode
(``mig_slices``: its MIG devices' GPU-instance slices; ``max_slices``: its largest profile's).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dam_sidecar.samplers.nvml import READINGS, Reading

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_GPM_METRICS_GET_VERSION = 1
NVML_GPM_METRIC_MAX = 477
NVML_FI_DEV_NVLINK_LINK_COUNT = 91
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
NVML_FI_DEV_PCIE_COUNT_TX_BYTES = 197
NVML_FI_DEV_PCIE_COUNT_RX_BYTES = 198
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
NVML_ERROR_NOT_FOUND = 6
NVML_DEVICE_MIG_ENABLE = 1
MIG_HANDLE_BASE = 1000  # a MIG device's handle: base + 100 x its GPU's index + its place


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class _Util:
    gpu: int
    memory: int


@dataclass
class _Mem:
    total: int
    used: int
    free: int


@dataclass
class _Support:
    isSupportedDevice: int


@dataclass
class _Metric:
    metricId: int = 0
    nvmlReturn: int = 0
    value: float = 0.0


@dataclass
class _Value:
    """pynvml's ``c_nvmlValue_t`` union: only the members the fake fills."""

    uiVal: int = 0
    ullVal: int = 0


@dataclass
class FieldValue:
    """pynvml's ``c_nvmlFieldValue_t``."""

    fieldId: int
    scopeId: int = 0
    nvmlReturn: int = NVML_SUCCESS
    valueType: int = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    value: _Value = field(default_factory=_Value)


class GpmMetricsGet:
    """pynvml's ``c_nvmlGpmMetricsGet_t``, as plain Python."""

    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: Any = None
        self.sample2: Any = None
        self.metrics = [_Metric() for _ in range(16)]


@dataclass
class _GpmSample:
    serial: int
    taken_at: int = -1
    handle: int = -1
    freed: bool = False


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    utilization: int = 90
    memory_busy: int = 40
    memory_total: int = 80 * 1024**3
    memory_used: int = 60 * 1024**3
    # What each simple reading (``READINGS`` of the sampler: power in mW, SM clock in MHz, ...)
    # answers, by its ``what``; one not named here answers its ``simulated`` value.
    readings: dict[str, float] = field(default_factory=dict)
    throttle_mask: int = 0x4
    pcie_kbps: int = 1_000_000
    gpm: bool = True
    gpm_percent: dict[int, float] = field(
        default_factory=lambda: {2: 85.0, 3: 40.0, 5: 70.0, 10: 30.0, 12: 5.0, 13: 1.0}
    )
    # NVLink: links (0 = none), KiB each link's TX/RX counter grows per read; the GPU-wide
    # variant answers every link with the same total. PCIe byte counters (field values 197/198):
    # None = the driver lacks them (the sampler then integrates pcie_kbps), else bytes per read.
    nvlink_links: int = 18
    nvlink_kib_per_read: tuple[int, int] = (4096, 2048)
    nvlink_gpu_wide: bool = False
    pcie_bytes_per_read: tuple[int, int] | None = (1 << 20, 1 << 19)
    reads: int = 0
    # MIG: None = the GPU has no MIG support (nvmlDeviceGetMigMode answers NOT_SUPPORTED), False =
    # MIG mode off, True = on, with one MIG device per entry of mig_slices (its GPU-instance
    # slices) out of max_slices (the GPU's largest profile: 7 on an A100 or H100).
    mig: bool | None = None
    mig_slices: tuple[int, ...] = ()
    max_slices: int = 7


@dataclass(frozen=True)
class _Attributes:
    gpuInstanceSliceCount: int
    multiprocessorCount: int


@dataclass(frozen=True)
class _ProfileInfo:
    sliceCount: int


class FakeNvml:
    """Module-like object exposing the subset of pynvml the sampler calls.

    Besides the calls written out below, it answers every reading of the sampler's ``READINGS``
    table (its function and constants, set per instance) from the ``FakeGpu``.
    """

    NVMLError = NVMLError
    c_nvmlGpmMetricsGet_t = GpmMetricsGet
    NVML_PCIE_UTIL_TX_BYTES = NVML_PCIE_UTIL_TX_BYTES
    NVML_PCIE_UTIL_RX_BYTES = NVML_PCIE_UTIL_RX_BYTES
    NVML_GPM_METRICS_GET_VERSION = NVML_GPM_METRICS_GET_VERSION
    NVML_DEVICE_MIG_ENABLE = NVML_DEVICE_MIG_ENABLE

    def __init__(self, gpus: int | list[FakeGpu] = 1, *, library_missing: bool = False) -> None:
        if isinstance(gpus, int):
            gpus = [FakeGpu(uuid=f"GPU-fake-{i:04d}-0000-0000-000000000000") for i in range(gpus)]
        self.gpus = gpus
        self.library_missing = library_missing
        self.unsupported: set[str] = set()
        self.lost: set[int] = set()
        self.hang: threading.Event | None = None  # set: calls return; clear: calls block
        self.init_calls = 0
        self.shutdown_calls = 0
        self.calls = 0
        self._serial = itertools.count()
        self._clock = 0
        self.allocated: list[_GpmSample] = []
        self.metrics_get_pairs: list[tuple[int, int]] = []
        by_call: dict[str, dict[tuple[int, ...], Reading]] = {}
        for r in READINGS:
            by_call.setdefault(r.function, {})[tuple(value for _, value in r.constants)] = r
            for name, value in r.constants:
                setattr(self, name, value)
        for function, readings in by_call.items():
            setattr(self, function, self._reader(function, readings))

    # --- plumbing ---------------------------------------------------------------
    def _enter(self, fn: str, handle: int | None = None) -> FakeGpu | None:
        self.calls += 1
        if self.hang is not None:
            self.hang.wait()
        if fn in self.unsupported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if handle is None:
            return None
        if handle >= MIG_HANDLE_BASE:  # a MIG device answers from its GPU
            handle = (handle - MIG_HANDLE_BASE) // 100
        if handle in self.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return self.gpus[handle]

    def _gpu(self, fn: str, handle: int) -> FakeGpu:
        gpu = self._enter(fn, handle)
        assert gpu is not None
        return gpu

    def _reader(self, function: str, readings: dict[tuple[int, ...], Reading]) -> Callable[..., float]:
        """The pynvml call ``function``: the reading its constants name, from the GPU's values."""

        def read(handle: int, *constants: int) -> float:
            gpu = self._gpu(function, handle)
            r = readings.get(constants)
            if r is None:  # a constant no reading of the table passes
                raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
            return gpu.readings.get(r.what, r.simulated)

        return read

    # --- pynvml API ---------------------------------------------------------------
    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.library_missing:
            raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
        self._enter("nvmlInit")

    def nvmlShutdown(self) -> None:
        self.shutdown_calls += 1

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._enter("nvmlDeviceGetHandleByIndex")
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        gpu = self._gpu("nvmlDeviceGetUUID", handle)
        if handle >= MIG_HANDLE_BASE:
            return f"MIG-{gpu.uuid.removeprefix('GPU-')[:8]}-{handle % 100:04d}-0000-0000-000000000000"
        return gpu.uuid

    # --- MIG ----------------------------------------------------------------------
    def nvmlDeviceGetMigMode(self, handle: int) -> list[int]:
        gpu = self._gpu("nvmlDeviceGetMigMode", handle)
        if gpu.mig is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return [int(gpu.mig), int(gpu.mig)]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: int) -> int:
        return self._gpu("nvmlDeviceGetMaxMigDeviceCount", handle).max_slices

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: int, index: int) -> int:
        gpu = self._gpu("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        if not gpu.mig or index >= len(gpu.mig_slices):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return MIG_HANDLE_BASE + 100 * handle + index

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: int, profile: int) -> _ProfileInfo:
        gpu = self._gpu("nvmlDeviceGetGpuInstanceProfileInfo", handle)
        slices = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7, 5: 8, 6: 6}.get(profile)
        if slices is None or slices > gpu.max_slices:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return _ProfileInfo(sliceCount=slices)

    def nvmlDeviceGetAttributes(self, handle: int) -> _Attributes:
        gpu = self._gpu("nvmlDeviceGetAttributes", handle)
        slices = gpu.mig_slices[handle % 100] if handle >= MIG_HANDLE_BASE else gpu.max_slices
        return _Attributes(gpuInstanceSliceCount=slices, multiprocessorCount=slices * 16)

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return self._gpu("nvmlDeviceGetName", handle).name.encode()

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> _Util:
        g = self._gpu("nvmlDeviceGetUtilizationRates", handle)
        if handle >= MIG_HANDLE_BASE:  # as the real driver: no utilization for a MIG device
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return _Util(gpu=g.utilization, memory=g.memory_busy)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> _Mem:
        g = self._gpu("nvmlDeviceGetMemoryInfo", handle)
        return _Mem(total=g.memory_total, used=g.memory_used, free=g.memory_total - g.memory_used)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: int) -> int:
        return self._gpu("nvmlDeviceGetCurrentClocksEventReasons", handle).throttle_mask

    def nvmlDeviceGetPcieThroughput(self, handle: int, counter: int) -> int:
        return self._gpu("nvmlDeviceGetPcieThroughput", handle).pcie_kbps

    def nvmlDeviceGetFieldValues(self, handle: int, field_ids: list[Any]) -> list[FieldValue]:
        g = self._gpu("nvmlDeviceGetFieldValues", handle)
        g.reads += 1
        out = []
        for item in field_ids:
            fid, scope = item if isinstance(item, tuple) else (item, 0)
            fv = FieldValue(fieldId=fid, scopeId=scope)
            if fid == NVML_FI_DEV_NVLINK_LINK_COUNT:
                fv.valueType, fv.value.uiVal = NVML_VALUE_TYPE_UNSIGNED_INT, g.nvlink_links
            elif fid in (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX):
                if scope >= g.nvlink_links:
                    fv.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
                else:
                    per_link = g.nvlink_kib_per_read[0 if fid == NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX else 1]
                    if g.nvlink_gpu_wide:  # every link answers with the GPU's total
                        fv.value.ullVal = per_link * g.reads * g.nvlink_links
                    else:  # link i carries i KiB more than link 0, so the links differ
                        fv.value.ullVal = per_link * g.reads + scope
            elif fid in (NVML_FI_DEV_PCIE_COUNT_TX_BYTES, NVML_FI_DEV_PCIE_COUNT_RX_BYTES):
                if g.pcie_bytes_per_read is None:
                    fv.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
                else:
                    fv.value.ullVal = g.pcie_bytes_per_read[fid - NVML_FI_DEV_PCIE_COUNT_TX_BYTES] * g.reads
            else:
                fv.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
            out.append(fv)
        return out

    def nvmlGpmQueryDeviceSupport(self, handle: int) -> _Support:
        return _Support(isSupportedDevice=int(self._gpu("nvmlGpmQueryDeviceSupport", handle).gpm))

    def nvmlGpmSampleAlloc(self) -> _GpmSample:
        self._enter("nvmlGpmSampleAlloc")
        s = _GpmSample(serial=next(self._serial))
        self.allocated.append(s)
        return s

    def nvmlGpmSampleFree(self, sample: _GpmSample) -> None:
        sample.freed = True

    def nvmlGpmSampleGet(self, handle: int, sample: _GpmSample) -> _GpmSample:
        self._gpu("nvmlGpmSampleGet", handle)
        if sample.freed:
            raise NVMLError(NVML_ERROR_UNKNOWN)
        self._clock += 1
        sample.taken_at = self._clock
        sample.handle = handle
        return sample

    def nvmlGpmMetricsGet(self, mg: GpmMetricsGet) -> GpmMetricsGet:
        self._enter("nvmlGpmMetricsGet")
        s1, s2 = mg.sample1, mg.sample2
        if mg.version != NVML_GPM_METRICS_GET_VERSION or s1.freed or s2.freed:
            raise NVMLError(NVML_ERROR_UNKNOWN)
        if not (0 <= s1.taken_at < s2.taken_at) or s1.handle != s2.handle:
            raise NVMLError(NVML_ERROR_UNKNOWN)  # the real API wants an older then a newer sample
        self.metrics_get_pairs.append((s1.serial, s2.serial))
        table = self.gpus[s2.handle].gpm_percent
        for i in range(mg.numMetrics):
            m = mg.metrics[i]
            if m.metricId in table:
                m.value = table[m.metricId]
                m.nvmlReturn = NVML_SUCCESS
            else:
                m.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
        return mg
