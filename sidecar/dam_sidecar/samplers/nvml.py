"""NVML sampler: per-GPU utilization, memory, power, clocks, throttle reasons, PCIe, NVLink, and GPM.

Interconnect byte counters (cumulative, kept monotonic here):

- NVLink: field values ``NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX`` (KiB of
  payload, cumulative), one per link (``scopeId`` = link index, links from
  ``NVML_FI_DEV_NVLINK_LINK_COUNT``), summed over the links. Some drivers
  answer every link with the GPU-wide total: when all links report the same
  non-zero value, it is taken once. No NVLink (count 0, NOT_SUPPORTED): absent.
- PCIe: field values ``NVML_FI_DEV_PCIE_COUNT_TX/RX_BYTES`` (exact cumulative
  bytes) where the driver has them; else the throughput NVML samples over
  20 ms (``nvmlDeviceGetPcieThroughput``, KB/s) multiplied by the time since the
  previous sample: an estimate that is only as good as that 20 ms window is
  typical of the interval.

``pynvml`` is imported lazily, inside the sampler, on its first sample (never at
module import). Every NVML call is guarded: ``NOT_SUPPORTED`` makes the series
absent (and the call is not repeated), a lost GPU drops that GPU's series, and
other errors are counted in ``dam_sampler_errors_total{sampler="nvml"}``.

MIG: a GPU in MIG mode (``nvmlDeviceGetMigMode``) is sampled as it is, and each of its MIG
devices (``nvmlDeviceGetMigDeviceHandleByIndex``) as a device of its own, under its ``MIG-`` UUID
(what a job's probe publishes on a slice) and its GPU's index and name, without GPM. Every device
says its share of the GPU (``slice_ratio``, ``dam_gpu_slice_ratio``): 1 for a whole GPU (MIG mode
off, or the GPU itself), a MIG device's GPU-instance slices (``nvmlDeviceGetAttributes``
``gpuInstanceSliceCount``) over the most the GPU has (the largest ``sliceCount`` of its
GPU-instance profiles, ``nvmlDeviceGetGpuInstanceProfileInfo``: 7 on an A100 or H100, 4 on an
A30); None where NVML cannot tell (a GPU without MIG answers ``NOT_SUPPORTED``: no error).

``Watchdog`` runs any ``NvmlSource`` in a daemon worker thread: an NVML call
that hangs (the driver lock is held elsewhere) makes the sample ``up=False,
stuck=True`` after ``timeout_seconds``, and /metrics keeps serving.
"""

from __future__ import annotations

import contextlib
import functools
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from dam_sidecar.errors import ErrorLog
from dam_sidecar.samplers.monotonic import Monotonic

SAMPLER = "nvml"

# GPM metric ids (nvml.h, NVML_GPM_METRIC_*), mapped to our metric names' suffixes.
GPM_SM_UTIL = 2
GPM_SM_OCCUPANCY = 3
GPM_ANY_TENSOR_UTIL = 5
GPM_DRAM_BW_UTIL = 10
GPM_FP32_UTIL = 12
GPM_FP16_UTIL = 13
GPM_METRICS: dict[int, str] = {
    GPM_SM_UTIL: "sm_active",
    GPM_SM_OCCUPANCY: "sm_occupancy",
    GPM_ANY_TENSOR_UTIL: "tensor_active",
    GPM_DRAM_BW_UTIL: "dram_bandwidth_utilization",
    GPM_FP16_UTIL: "fp16_active",
    GPM_FP32_UTIL: "fp32_active",
}

# Clock event ("throttle") reason bits (nvml.h nvmlClocksEventReason*), a bounded label set.
THROTTLE_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}

# NVML return codes (nvml.h) we name; others read as "nvml_error".
_NOT_SUPPORTED = 3
_NO_PERMISSION = 4
_DRIVER_NOT_LOADED = 9
_TIMEOUT = 10
_LIBRARY_NOT_FOUND = 12
_FUNCTION_NOT_FOUND = 13
_GPU_IS_LOST = 15
_UNKNOWN = 999
_REASONS = {
    _NOT_SUPPORTED: "not_supported",
    _NO_PERMISSION: "no_permission",
    _DRIVER_NOT_LOADED: "driver_not_loaded",
    _TIMEOUT: "nvml_timeout",
    _LIBRARY_NOT_FOUND: "no_library",
    _FUNCTION_NOT_FOUND: "not_supported",
    _GPU_IS_LOST: "gpu_lost",
    _UNKNOWN: "unknown",
}
# PCIe throughput comes in KB/s; NVLink throughput counters in KiB.
_KIB = 1024
# Field value ids (nvml.h NVML_FI_*), used when pynvml lacks the names.
FI_NVLINK_LINK_COUNT = 91
FI_NVLINK_DATA_TX = 138
FI_NVLINK_DATA_RX = 139
FI_PCIE_COUNT_TX_BYTES = 197
FI_PCIE_COUNT_RX_BYTES = 198
# nvml.h NVML_GPU_INSTANCE_PROFILE_{8,7,6,4}_SLICE: the whole-GPU profiles, largest first.
_FULL_PROFILES = (
    ("NVML_GPU_INSTANCE_PROFILE_8_SLICE", 5),
    ("NVML_GPU_INSTANCE_PROFILE_7_SLICE", 4),
    ("NVML_GPU_INSTANCE_PROFILE_6_SLICE", 6),
    ("NVML_GPU_INSTANCE_PROFILE_4_SLICE", 3),
)
_MIG_ENABLE = 1  # nvml.h NVML_DEVICE_MIG_ENABLE
# nvmlValueType_t -> the member of the c_nvmlValue_t union that holds it.
_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


@dataclass(frozen=True)
class Reading:
    """One NVML call per GPU whose answer is one number: one ``GpuSample`` field.

    The sampler calls ``function(handle, *constants)`` (pynvml's constants by name), guarded
    under ``what`` (its name in error messages and in the calls found unsupported), and stores
    ``convert(answer)`` in ``field``. The simulated NVML (``dam_sidecar.fake_nvml``) answers every
    reading of this table from it: ``simulated`` unless a ``FakeGpu`` says otherwise, a constant
    with its ``nvml.h`` value.
    """

    what: str
    function: str
    field: str
    convert: Callable[[Any], float]
    simulated: float
    constants: tuple[tuple[str, int], ...] = ()


# The simple readings, in the order the sampler calls them (after utilisation and memory).
READINGS: tuple[Reading, ...] = (
    Reading("power", "nvmlDeviceGetPowerUsage", "power_watts", lambda mw: mw / 1000.0, 550_000),
    Reading(
        "sm_clock",
        "nvmlDeviceGetClockInfo",
        "sm_clock_hertz",
        lambda mhz: mhz * 1e6,
        1980,
        (("NVML_CLOCK_SM", 1),),
    ),
    Reading(
        "temperature",
        "nvmlDeviceGetTemperature",
        "temperature_celsius",
        float,
        61,
        (("NVML_TEMPERATURE_GPU", 0),),
    ),
)


@dataclass(frozen=True)
class GpuSample:
    index: int
    uuid: str
    name: str = ""
    utilization_ratio: float | None = None
    memory_busy_ratio: float | None = None
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    power_watts: float | None = None
    sm_clock_hertz: float | None = None
    temperature_celsius: float | None = None
    throttle_reasons: dict[str, bool] | None = None
    pcie_tx_bytes_per_second: float | None = None
    pcie_rx_bytes_per_second: float | None = None
    gpm: dict[str, float] = field(default_factory=dict)
    # Cumulative bytes (monotonic); None when the GPU or driver does not tell.
    nvlink_tx_bytes: float | None = None
    nvlink_rx_bytes: float | None = None
    pcie_tx_bytes: float | None = None
    pcie_rx_bytes: float | None = None
    # Its share of the physical GPU: 1 for a whole GPU, slices / the GPU's most for a MIG device.
    slice_ratio: float | None = None


@dataclass(frozen=True)
class NvmlSample:
    up: bool
    gpus: tuple[GpuSample, ...] = ()
    stuck: bool = False


class NvmlSource(Protocol):
    def sample(self) -> NvmlSample: ...

    def close(self) -> None: ...


class NoNvml:
    """For processes that must never touch NVML."""

    def sample(self) -> NvmlSample:
        return NvmlSample(up=False)

    def close(self) -> None:
        return None


def _import_pynvml() -> Any:
    import pynvml

    return pynvml


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class _LostError(Exception):
    """The GPU fell off the bus: skip it."""


@dataclass
class _Device:
    index: int
    handle: Any
    uuid: str
    name: str
    unsupported: set[str] = field(default_factory=set)
    gpm_samples: list[Any] = field(default_factory=list)  # [previous, current]
    gpm_primed: bool = False
    lost: bool = False
    nvlink_links: int | None = None  # None: not asked yet; 0: no NVLink
    pcie_fields: bool | None = None  # None: not asked yet; False: integrate the throughput samples
    last_sample_at: float | None = None
    counters: dict[str, Monotonic] = field(default_factory=dict)
    slice_ratio: float | None = None  # its share of the physical GPU (None: unknown)


Quiet = Callable[[str, Callable[[], Any]], Any]
"""``NvmlSampler._quiet``: one NVML call at start-up, None when it fails."""


def _mig_mode(nv: Any, quiet: Quiet, dev: _Device) -> bool | None:
    """Whether the GPU is in MIG mode; None when NVML cannot tell (no MIG support)."""
    if not hasattr(nv, "nvmlDeviceGetMigMode"):
        return None
    got = quiet(f"GPU {dev.index}: MIG mode", lambda: nv.nvmlDeviceGetMigMode(dev.handle))
    if got is None:
        return None
    return int(got[0]) == int(getattr(nv, "NVML_DEVICE_MIG_ENABLE", _MIG_ENABLE))


def _max_slices(nv: Any, dev: _Device) -> int | None:
    """The most GPU-instance slices the GPU has: its largest whole-GPU profile's."""
    found = []
    for name, value in _FULL_PROFILES:
        try:  # a profile the GPU lacks answers NOT_SUPPORTED or INVALID_ARGUMENT: not an error
            info = nv.nvmlDeviceGetGpuInstanceProfileInfo(dev.handle, getattr(nv, name, value))
            slices = int(info.sliceCount)
        except Exception:
            continue
        if slices > 0:
            found.append(slices)
    return max(found) if found else None


def _mig_devices(nv: Any, quiet: Quiet, gpu: _Device) -> list[_Device]:
    """The MIG devices of a GPU in MIG mode, each with its share of the GPU (no GPM)."""
    count = quiet(f"GPU {gpu.index}: MIG devices", lambda: nv.nvmlDeviceGetMaxMigDeviceCount(gpu.handle))
    full = _max_slices(nv, gpu)
    out = []
    for k in range(int(count or 0)):
        try:
            handle = nv.nvmlDeviceGetMigDeviceHandleByIndex(gpu.handle, k)
        except Exception:
            continue  # NOT_FOUND: no MIG device in that place
        uuid = quiet(f"GPU {gpu.index}: MIG device {k}", functools.partial(nv.nvmlDeviceGetUUID, handle))
        if uuid is None:
            continue
        attrs = quiet(
            f"GPU {gpu.index}: MIG device {k} attributes",
            functools.partial(nv.nvmlDeviceGetAttributes, handle),
        )
        slices = int(getattr(attrs, "gpuInstanceSliceCount", 0) or 0)
        ratio = slices / full if full and 0 < slices <= full else None
        out.append(
            _Device(index=gpu.index, handle=handle, uuid=_text(uuid), name=gpu.name, slice_ratio=ratio)
        )
    return out


class NvmlSampler:
    """The real NVML sampler. ``load`` returns a pynvml-like module (a fake one in tests)."""

    def __init__(
        self,
        errors: ErrorLog,
        load: Callable[[], Any] = _import_pynvml,
        retry_init_every: int = 30,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._errors = errors
        self._load = load
        self._clock = clock
        self._nv: Any = None
        self._devices: list[_Device] = []
        self._initialized = False
        self._failed_inits = 0
        self._retry_every = max(1, retry_init_every)
        self._ticks_since_failure = 0

    # --- lifecycle -------------------------------------------------------------
    def _reason(self, exc: BaseException) -> str:
        value = getattr(exc, "value", None)
        if isinstance(value, int):
            return _REASONS.get(value, "nvml_error")
        return "nvml_error"

    def _init(self) -> bool:
        try:
            nv = self._load()
        except ImportError as exc:
            self._errors.record(SAMPLER, "no_library", f"pynvml is not importable: {exc}")
            return False
        try:
            nv.nvmlInit()
        except Exception as exc:
            self._errors.record(SAMPLER, self._reason(exc), f"nvmlInit failed: {exc}")
            return False
        self._nv = nv
        self._initialized = True
        try:
            count = int(nv.nvmlDeviceGetCount())
        except Exception as exc:
            self._errors.record(SAMPLER, self._reason(exc), f"nvmlDeviceGetCount failed: {exc}")
            count = 0
        for i in range(count):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(i)
                uuid = _text(nv.nvmlDeviceGetUUID(handle))
            except Exception as exc:
                self._errors.record(SAMPLER, self._reason(exc), f"GPU {i}: cannot get a handle: {exc}")
                continue
            try:
                name = _text(nv.nvmlDeviceGetName(handle))
            except Exception:
                name = ""
            dev = _Device(index=i, handle=handle, uuid=uuid, name=name)
            mig = _mig_mode(self._nv, self._quiet, dev)
            dev.slice_ratio = None if mig is None else 1.0
            self._init_gpm(dev)
            self._devices.append(dev)
            if mig:
                self._devices.extend(_mig_devices(self._nv, self._quiet, dev))
        if count == 0:
            self._errors.record(SAMPLER, "no_gpus", "NVML sees no GPU")
        return True

    def _quiet(self, what: str, fn: Callable[[], Any]) -> Any:
        """One NVML call at start-up; None when it fails (``NOT_SUPPORTED``: silently)."""
        try:
            return fn()
        except Exception as exc:
            reason = self._reason(exc)
            if reason != "not_supported":
                self._errors.record(SAMPLER, reason, f"{what} failed: {exc}")
            return None

    def _init_gpm(self, dev: _Device) -> None:
        nv = self._nv
        try:
            support = nv.nvmlGpmQueryDeviceSupport(dev.handle)
            if not support.isSupportedDevice:
                return
            dev.gpm_samples = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
        except Exception as exc:
            # Pre-Hopper GPUs, old drivers: no GPM series, no error.
            if self._reason(exc) not in ("not_supported",):
                self._errors.record(SAMPLER, self._reason(exc), f"GPU {dev.index}: GPM unavailable: {exc}")
            self._free_gpm(dev)

    def _free_gpm(self, dev: _Device) -> None:
        for s in dev.gpm_samples:
            with contextlib.suppress(Exception):
                self._nv.nvmlGpmSampleFree(s)
        dev.gpm_samples = []

    def close(self) -> None:
        if not self._initialized:
            return
        for dev in self._devices:
            self._free_gpm(dev)
        with contextlib.suppress(Exception):
            self._nv.nvmlShutdown()
        self._initialized = False
        self._devices = []

    # --- sampling --------------------------------------------------------------
    def sample(self) -> NvmlSample:
        if not self._initialized:
            if self._failed_inits and self._ticks_since_failure < self._retry_every:
                self._ticks_since_failure += 1
                return NvmlSample(up=False)
            if not self._init():
                self._failed_inits += 1
                self._ticks_since_failure = 1
                return NvmlSample(up=False)
        gpus: list[GpuSample] = []
        for dev in self._devices:
            if dev.lost:
                continue
            try:
                gpus.append(self._sample_device(dev))
            except _LostError:
                dev.lost = True
                self._free_gpm(dev)
                self._errors.record(
                    SAMPLER, "gpu_lost", f"GPU {dev.index} ({dev.uuid}) is lost; its series are dropped"
                )
        return NvmlSample(up=True, gpus=tuple(gpus))

    def _call(self, dev: _Device, what: str, fn: Callable[[], Any]) -> Any:
        """One guarded NVML call; None when unsupported or failed."""
        if what in dev.unsupported:
            return None
        try:
            return fn()
        except Exception as exc:
            reason = self._reason(exc)
            if reason == "gpu_lost":
                raise _LostError() from exc
            if reason == "not_supported":
                dev.unsupported.add(what)
                self._errors.record(
                    SAMPLER, reason, f"GPU {dev.index}: {what} is not supported; series absent"
                )
            else:
                self._errors.record(SAMPLER, reason, f"GPU {dev.index}: {what} failed: {exc}")
            return None

    def _sample_device(self, dev: _Device) -> GpuSample:
        nv, h = self._nv, dev.handle
        util = self._call(dev, "utilization", lambda: nv.nvmlDeviceGetUtilizationRates(h))
        mem = self._call(dev, "memory", lambda: nv.nvmlDeviceGetMemoryInfo(h))
        readings = {r.field: self._read(dev, r) for r in READINGS}
        reasons_fn = (
            getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        mask = self._call(dev, "throttle_reasons", lambda: reasons_fn(h))
        tx = self._call(dev, "pcie_tx", lambda: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES))
        rx = self._call(dev, "pcie_rx", lambda: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_RX_BYTES))
        now = self._clock()
        elapsed = now - dev.last_sample_at if dev.last_sample_at is not None else 0.0
        dev.last_sample_at = now
        nvlink = self._nvlink(dev)
        pcie = self._pcie(dev, tx, rx, elapsed)
        return GpuSample(
            index=dev.index,
            uuid=dev.uuid,
            name=dev.name,
            utilization_ratio=_ratio(util.gpu) if util is not None else None,
            memory_busy_ratio=_ratio(util.memory) if util is not None else None,
            memory_used_bytes=float(mem.used) if mem is not None else None,
            memory_total_bytes=float(mem.total) if mem is not None else None,
            **readings,
            throttle_reasons=(
                {label: bool(int(mask) & bit) for bit, label in THROTTLE_REASONS.items()}
                if mask is not None
                else None
            ),
            pcie_tx_bytes_per_second=float(tx) * _KIB if tx is not None else None,
            pcie_rx_bytes_per_second=float(rx) * _KIB if rx is not None else None,
            gpm=self._sample_gpm(dev),
            nvlink_tx_bytes=nvlink[0] if nvlink else None,
            nvlink_rx_bytes=nvlink[1] if nvlink else None,
            pcie_tx_bytes=pcie[0] if pcie else None,
            pcie_rx_bytes=pcie[1] if pcie else None,
            slice_ratio=dev.slice_ratio,
        )

    def _read(self, dev: _Device, r: Reading) -> Any:
        """One reading of ``READINGS``: its field's value, None when unsupported or failed."""
        nv, h = self._nv, dev.handle
        got = self._call(
            dev, r.what, lambda: getattr(nv, r.function)(h, *(getattr(nv, name) for name, _ in r.constants))
        )
        return r.convert(got) if got is not None else None

    # --- interconnect byte counters ------------------------------------------------
    def _fields(self, dev: _Device, what: str, ids: list[tuple[int, int]]) -> list[float | None] | None:
        """One guarded nvmlDeviceGetFieldValues; a value per id (None where its own return is not 0)."""
        nv = self._nv
        got = self._call(dev, what, lambda: nv.nvmlDeviceGetFieldValues(dev.handle, ids))
        if got is None:
            return None
        out: list[float | None] = []
        for v in list(got)[: len(ids)]:
            member = _VALUE_MEMBERS.get(int(v.valueType))
            out.append(float(getattr(v.value, member)) if int(v.nvmlReturn) == 0 and member else None)
        return out

    def _counter(self, dev: _Device, name: str, value: float) -> float:
        return dev.counters.setdefault(name, Monotonic()).update(value)

    def _nvlink(self, dev: _Device) -> tuple[float, float] | None:
        nv = self._nv
        if dev.nvlink_links is None:
            count = self._fields(dev, "nvlink_count", [(getattr(nv, "NVML_FI_DEV_NVLINK_LINK_COUNT", 91), 0)])
            dev.nvlink_links = int(count[0] or 0) if count else 0
        if not dev.nvlink_links:
            return None
        tx_id = getattr(nv, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", FI_NVLINK_DATA_TX)
        rx_id = getattr(nv, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", FI_NVLINK_DATA_RX)
        links = range(dev.nvlink_links)
        values = self._fields(
            dev, "nvlink_throughput", [(tx_id, i) for i in links] + [(rx_id, i) for i in links]
        )
        if values is None:
            if "nvlink_throughput" in dev.unsupported:
                dev.nvlink_links = 0
            return None
        n = dev.nvlink_links
        out = []
        for per_link in (values[:n], values[n:]):
            known = [v for v in per_link if v is not None]
            if not known:
                return None
            # Every link answering the same non-zero total: the driver reports the GPU-wide count.
            same = len(known) > 1 and len(set(known)) == 1 and known[0] > 0
            out.append((known[0] if same else sum(known)) * _KIB)
        return self._counter(dev, "nvlink_tx", out[0]), self._counter(dev, "nvlink_rx", out[1])

    def _pcie(
        self, dev: _Device, tx_kbps: float | None, rx_kbps: float | None, elapsed: float
    ) -> tuple[float, float] | None:
        nv = self._nv
        if dev.pcie_fields is not False:
            ids = [
                (getattr(nv, "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", FI_PCIE_COUNT_TX_BYTES), 0),
                (getattr(nv, "NVML_FI_DEV_PCIE_COUNT_RX_BYTES", FI_PCIE_COUNT_RX_BYTES), 0),
            ]
            values = self._fields(dev, "pcie_count", ids)
            if values is not None and values[0] is not None and values[1] is not None:
                dev.pcie_fields = True
                return self._counter(dev, "pcie_tx", values[0]), self._counter(dev, "pcie_rx", values[1])
            if dev.pcie_fields is None:
                dev.pcie_fields = False  # this driver has no byte counters: integrate the throughput
            else:
                return None  # they worked before: a transient failure, try again next tick
        if tx_kbps is None or rx_kbps is None:
            return None
        tx = dev.counters.setdefault("pcie_tx", Monotonic())
        rx = dev.counters.setdefault("pcie_rx", Monotonic())
        return (
            tx.update((tx.last or 0.0) + float(tx_kbps) * _KIB * elapsed),
            rx.update((rx.last or 0.0) + float(rx_kbps) * _KIB * elapsed),
        )

    def _sample_gpm(self, dev: _Device) -> dict[str, float]:
        """Two GPM samples across the interval: take the current one, diff it with the previous one."""
        if not dev.gpm_samples:
            return {}
        nv = self._nv
        previous, current = dev.gpm_samples
        got = self._call(dev, "gpm_sample", lambda: nv.nvmlGpmSampleGet(dev.handle, current))
        if got is None:
            if "gpm_sample" in dev.unsupported:
                self._free_gpm(dev)
            return {}
        out: dict[str, float] = {}
        if dev.gpm_primed:
            mg = nv.c_nvmlGpmMetricsGet_t()
            mg.version = nv.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = len(GPM_METRICS)
            mg.sample1 = previous
            mg.sample2 = current
            ids = list(GPM_METRICS)
            for i, metric_id in enumerate(ids):
                mg.metrics[i].metricId = metric_id
            if self._call(dev, "gpm_metrics", lambda: nv.nvmlGpmMetricsGet(mg)) is not None:
                for i, metric_id in enumerate(ids):
                    m = mg.metrics[i]
                    if int(m.nvmlReturn) == 0:
                        out[GPM_METRICS[metric_id]] = _ratio(float(m.value))
        dev.gpm_samples = [current, previous]  # the current sample is the next tick's previous
        dev.gpm_primed = True
        return out


def _ratio(percent: float) -> float:
    return min(1.0, max(0.0, float(percent) / 100.0))


class Watchdog:
    """Runs ``inner.sample()`` in a daemon thread; a call over ``timeout_seconds`` means stuck.

    While the worker is stuck, samples return ``up=False, stuck=True`` at once
    (no second call is queued behind the hung one); when the call returns, the
    next tick samples normally again.
    """

    def __init__(self, inner: NvmlSource, timeout_seconds: float, errors: ErrorLog) -> None:
        self._inner = inner
        self._timeout = timeout_seconds
        self._errors = errors
        self._requests: queue.Queue[bool] = queue.Queue()
        self._results: queue.Queue[NvmlSample | BaseException] = queue.Queue()
        self._busy = False
        self._thread = threading.Thread(target=self._run, name="dam-nvml", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while self._requests.get():
            try:
                result: NvmlSample | BaseException = self._inner.sample()
            except BaseException as exc:
                result = exc
            self._results.put(result)
        with contextlib.suppress(Exception):
            self._inner.close()

    @property
    def stuck(self) -> bool:
        return self._busy

    def sample(self) -> NvmlSample:
        if self._busy:
            try:
                self._results.get_nowait()  # the hung call came back: drop its stale result
                self._busy = False
            except queue.Empty:
                self._errors.record(SAMPLER, "stuck", "an earlier NVML call has still not returned")
                return NvmlSample(up=False, stuck=True)
        self._busy = True
        self._requests.put(True)
        try:
            result = self._results.get(timeout=self._timeout)
        except queue.Empty:
            self._errors.record(
                SAMPLER, "timeout", f"NVML sample took longer than {self._timeout:g} s; marked stuck"
            )
            return NvmlSample(up=False, stuck=True)
        self._busy = False
        if isinstance(result, BaseException):
            self._errors.record(SAMPLER, "exception", f"NVML sampler failed: {result!r}")
            return NvmlSample(up=False)
        return result

    def close(self) -> None:
        """Ask the worker to shut NVML down; never waits on a hung call."""
        self._requests.put(False)
        if not self._busy:
            self._thread.join(timeout=self._timeout)
