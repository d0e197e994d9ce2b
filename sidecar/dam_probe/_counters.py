"""The probe's counters, grouped by what changes them; each group zeroes itself in ``reset()``.

- ``StepCounters`` (``Probe.step``): the per-batch counters, changed by the hot loops
  (``dam_probe._loop`` and ``dam_probe._autohook.timed_next``) once per batch;
- ``CommCounters`` (``Probe.comm``): collectives, changed by ``dam_probe._comm`` under ``lock``;
- ``WorkerKills`` (``Probe.kills``): DataLoader workers that died, from DataLoader's own error;
- ``Devices`` (``Probe.devices``): the CUDA devices in use, refreshed on the publish path;
- ``LoaderSettings`` (``Probe.loader``): the settings of the latest DataLoader iterated, read on
  the slow path from its iterator;
- goodput (``Probe.goodput``, ``dam_probe._goodput.Accounting``) and the readers of the
  process's cgroup, CPU and memory, and run-queue delay (``dam_probe.cgroup``,
  ``dam_probe.process``, ``dam_probe.schedstat``), which have a ``reset()`` too.

A forked child (a DataLoader worker) starts from zero: ``Probe.after_fork_in_child`` calls the
``reset()`` of every group. A group is never replaced, only reset in place: the hot loops hold it
in a local alias (reading ``s.steps`` through an alias costs what ``p.steps`` cost on the probe
itself; ``p.step.steps`` would cost one more attribute lookup, about 20 ns a batch). What a group
keeps across a fork on purpose (configuration, not counts) is named in its ``KEPT_AFTER_FORK``;
tests/unit/probe/test_fork_reset.py fails for any other field that a reset leaves as it was.

Standard library only, like all of ``dam_probe``.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, ClassVar, Final

from dam_probe.layout import MAX_DEVICES

DEVICE_REFRESH_NS: Final = 10_000_000_000  # the CUDA device list is re-read every 10 s


class CounterGroup:
    """A group of counters, made zero and zeroed in place by ``reset()`` (after a fork); what it
    keeps across a fork on purpose is named in ``KEPT_AFTER_FORK``."""

    __slots__ = ()
    KEPT_AFTER_FORK: ClassVar[frozenset[str]] = frozenset()

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        raise NotImplementedError


class StepCounters(CounterGroup):
    """Batches delivered, time blocked in ``next()``, time covered by steps; the publish deadline."""

    __slots__ = (
        "batch_size",
        "closed_step_ns",
        "in_stream",
        "last_ns",
        "next_publish_ns",
        "steps",
        "stream_start_ns",
        "wait_ns",
    )

    def reset(self) -> None:
        self.steps = 0
        self.wait_ns = 0
        self.last_ns = 0  # perf_counter_ns of the latest delivery
        # Step time is not summed per batch: a run of batches without a pause (a
        # "stream") covers last_ns - stream_start_ns; finished streams add up here.
        self.closed_step_ns = 0
        self.stream_start_ns = 0
        self.in_stream = False
        self.next_publish_ns = 0  # 0: the next batch takes the slow path (opens file/stream)
        self.batch_size = 0  # of the latest batch that had one, read on the publish path

    @property
    def step_ns(self) -> int:
        """Time covered by steps so far, ns (cumulative)."""
        if self.in_stream:
            return self.closed_step_ns + (self.last_ns - self.stream_start_ns)
        return self.closed_step_ns


class CommCounters(CounterGroup):
    """Collectives: count, busy time, exposed time, bytes (cumulative); changed under ``lock``."""

    __slots__ = (
        "busy_since",
        "busy_until",
        "count",
        "entered",
        "exposed_ns",
        "inflight",
        "lock",
        "nbytes",
        "next_ns",
        "ns",
    )

    def reset(self) -> None:
        self.count = 0
        self.entered = 0  # timed collectives entered (the watchdog's sequence numbers)
        self.ns = 0  # the busy periods: time with at least one collective in flight
        self.exposed_ns = 0
        self.nbytes = 0
        self.inflight = 0  # collectives in flight now
        self.busy_since = 0  # start of the current busy period (perf_counter_ns)
        self.busy_until = 0  # end of the latest busy period counted
        self.next_ns = 0  # publish deadline of the collective path (perf_counter_ns)
        # A lock held by another thread at fork time would stay held in the child forever.
        self.lock = threading.Lock()

    def figures(self) -> tuple[int, int, int, int]:
        """``(count, ns, exposed ns, bytes)``, as ``ProbeWriter.publish`` takes them."""
        with self.lock:
            return self.count, self.ns, self.exposed_ns, self.nbytes


class WorkerKills(CounterGroup):
    """DataLoader workers that died, as DataLoader's own error says: their pids, the last signal."""

    __slots__ = ("last_signal", "pids")

    def reset(self) -> None:
        self.pids: set[int] = set()
        self.last_signal = 0

    def add(self, pid: int, signum: int) -> None:
        self.pids.add(pid)
        if signum:
            self.last_signal = signum

    def figures(self) -> tuple[int, int]:
        """``(count, last signal)``, as ``ProbeWriter.publish`` takes them."""
        return len(self.pids), self.last_signal


LoaderFigures = tuple[int, int | None, bool | None, bool | None]
"""``(num_workers, prefetch_factor, pin_memory, persistent_workers)``; None: not known."""


def _optional_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _optional_bool(value: object) -> bool | None:
    return value if isinstance(value, bool) else None


def loader_settings_of(iterator: object) -> LoaderFigures | None:
    """The settings a DataLoader iterator runs with (torch's ``_BaseDataLoaderIter`` copies them
    from its loader, after any override): None for another iterator. ``pin_memory`` is whether it
    pins (the loader's setting and an accelerator to pin for); ``prefetch_factor`` is None
    without workers. Reads attributes only: never calls into torch."""
    workers = _optional_int(getattr(iterator, "_num_workers", None))
    if workers is None:
        return None
    return (
        workers,
        _optional_int(getattr(iterator, "_prefetch_factor", None)) or None,
        _optional_bool(getattr(iterator, "_pin_memory", None)),
        _optional_bool(getattr(iterator, "_persistent_workers", None)),
    )


class LoaderSettings(CounterGroup):
    """The settings of the latest DataLoader iterated (``loader_settings_of``), read on the slow
    path: what an override made of the loader, whether or not its workers are alive right now
    (non-persistent workers are gone between epochs). No reference to the iterator is kept."""

    __slots__ = ("figures",)

    def reset(self) -> None:
        self.figures: LoaderFigures | None = None

    def record(self, iterator: object) -> None:
        """Takes the settings of ``iterator`` when it is a DataLoader's; never raises."""
        try:
            found = loader_settings_of(iterator)
        except Exception:
            return
        if found is not None:
            self.figures = found


def _format_uuid(raw: object) -> str:
    text = str(raw).strip()
    if text.startswith(("GPU-", "MIG-")):
        return text
    return f"GPU-{text}"


def cuda_device_uuids() -> tuple[str, ...] | None:
    """UUIDs of the CUDA devices this process uses; None when CUDA is not in use.

    Never imports torch: only looks at ``sys.modules``. A device counts as used
    when the caching allocator has reserved memory on it; without any, the
    current device. Reading the allocator's statistics creates no CUDA context.
    """
    torch: Any = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        cuda = torch.cuda
        if not cuda.is_initialized():
            return None
        used = [i for i in range(int(cuda.device_count())) if int(cuda.memory_reserved(i)) > 0]
        if not used:
            used = [int(cuda.current_device())]
        return tuple(_format_uuid(cuda.get_device_properties(i).uuid) for i in used[:MAX_DEVICES])
    except Exception:
        return None


class Devices(CounterGroup):
    """The CUDA devices this process uses, re-read at most every ``DEVICE_REFRESH_NS``."""

    __slots__ = ("next_refresh_ns", "uuids")

    def reset(self) -> None:
        self.uuids: tuple[str, ...] = ()
        self.next_refresh_ns = 0

    def refresh(self, now_ns: int) -> tuple[str, ...]:
        """The UUIDs, re-read when due or while none is known (publish path only)."""
        if now_ns >= self.next_refresh_ns or not self.uuids:
            uuids = cuda_device_uuids()
            if uuids is not None:
                self.uuids = uuids
                self.next_refresh_ns = now_ns + DEVICE_REFRESH_NS
        return self.uuids
