"""The probe file: a versioned, fixed-size binary record guarded by a sequence lock.

One file per instrumented process, ``$DAM_PROBE_DIR/probe-<pid>.bin``,
little-endian. Layout version 2 (written now) is ``FILE_SIZE`` = 1024 bytes;
its first 512 bytes are laid out exactly as version 1 (512 bytes), which
readers still accept:

====== ====== ======= ==========================================================
offset size   type    field
====== ====== ======= ==========================================================
0      8      8s      magic ``b"DAMPROBE"``
8      4      u32     layout version (``VERSION`` = 2; 1 for older writers)
12     4      u32     file size in bytes (1024 for version 2, 512 for version 1)
16     8      u64     sequence: odd while the writer is mid-update
24     8      u64     pid of the training process
32     8      u64     start time, Unix ns
40     8      u64     steps (batches consumed), cumulative
48     8      u64     time blocked in ``next()`` on the loader, ns, cumulative
56     8      u64     time covered by steps (between successive batches), ns, cumulative
64     8      u64     last publish, Unix ns
72     8      u64     batch size of the latest batch (0 = unknown)
80     8      f64     model FLOPs per step declared by the user (0 = unknown)
88     4      u32     number of device UUIDs that follow (0..``MAX_DEVICES``)
92     4      u32     flags (bit 0: the writer closed the file cleanly;
                      bit 1: the three cgroup CPU fields at 96..120 are valid;
                      bit 2: the memory fields at 560..592 are valid (v2);
                      bit 3: the collective counters at 528..560 are valid (v2);
                      bit 4: the process figures at 592..632 are valid (v2);
                      bit 5: the run-queue delays at 632..648 are valid (v2);
                      bit 6: the DataLoader worker kills at 648..656 are valid (v2);
                      bit 7: the goodput accounting at 656..688 and 748 is valid (v2);
                      bit 8: the checkpoint counters at 688..728 are valid (v2);
                      bit 9: the measured FLOPs at 728..748 are valid (v2);
                      bit 10: why FLOPs are not counted, at 752..800, is valid (v2);
                      bit 11: the progress fields at 800..1024 are valid (v2);
                      bit 12: the DataLoader settings at 120..128 are valid (v2);
                      bit 13: the matmul precision at 524 is valid (v2))
96     8      u64     CFS throttled time of the process's own cgroup, ns, cumulative
                      as the kernel reports it (valid only with flag bit 1)
104    8      u64     CPU limit of that cgroup in millicores (0 = no limit)
112    8      u64     id of that cgroup: inode of its directory (0 = unknown)
120    2      u16     DataLoader settings of the latest loader iterated, as its iterator
                      holds them after any override (flag bit 12, v2): ``num_workers``
122    2      u16     ``prefetch_factor`` (0 = unknown, or None: no workers)
124    1      u8      ``pin_memory`` as the loader pins: set and an accelerator to pin for
                      (0 unknown, 1 off, 2 on)
125    1      u8      ``persistent_workers`` (0 unknown, 1 off, 2 on)
126    2      -       reserved, zero
128    8 x 48 8 x 48s device UUIDs, NUL-padded ASCII (``GPU-…``)
------ ------ ------- ---------------------------- version 2 only, from here ----
512    4      i32     distributed rank (-1 = unknown)
516    4      i32     local rank on the node (-1 = unknown)
520    4      i32     world size (-1 = unknown)
524    4      u32     the precision the counted step's matmul-class FLOPs ran in, the most
                      FLOPs' (flag bit 13): ``PRECISION_*``, 0 unknown (``dam_probe._goodput``)
528    8      u64     collectives completed, cumulative (flag bit 3)
536    8      u64     time in collectives, launch to completion, ns, cumulative
544    8      u64     exposed communication (the training thread waited), ns, cumulative
552    8      u64     bytes contributed to collectives, cumulative
560    8      u64     memory charged to the process's own cgroup, bytes (flag bit 2)
568    8      u64     memory limit of that cgroup, bytes (0 = no limit)
576    8      u64     OOM kills in that cgroup, cumulative as the kernel reports it
584    8      u64     id of that memory cgroup: inode of its directory (0 = unknown)
592    8      u64     CPU time of the process itself, ns, cumulative (flag bit 4)
600    8      u64     CPU time of its descendants (DataLoader workers), live and ended, ns
608    8      u64     resident memory of the process, bytes
616    8      u64     resident memory of its live descendants, bytes
624    4      u32     live descendants (workers)
628    4      u32     inode of the writer's PID namespace (0 = unknown)
632    8      u64     run-queue delay of the process's main thread: time runnable but
                      waiting for a CPU (``/proc/self/schedstat`` field 2), ns, cumulative
                      (flag bit 5)
640    8      u64     the same for its DataLoader workers (their main threads), live and
                      ended, ns, cumulative
648    4      u32     DataLoader workers that died under this process, cumulative: seen in
                      DataLoader's own error ("worker (pid N) is killed by signal: Killed",
                      "worker (pid(s) N) exited unexpectedly"), one per pid (flag bit 6)
652    4      u32     the signal that ended the latest of them (9 = SIGKILL, the OOM killer's;
                      0 = not known)
656    8      u64     process start, Unix ns (``/proc/self/stat`` start time; flag bit 7)
664    8      u64     startup: process start to the first batch asked for, ns
672    8      u64     productive step time: step time less data wait, exposed communication
                      and the checkpoint saves inside steps, ns, cumulative (never decreases)
680    8      u64     other badput: elapsed time (process start to the latest publish) less
                      productive time, startup, data wait, exposed communication and checkpoint
                      saves, ns, cumulative (never decreases)
688    8      u64     time the training thread blocked in checkpoint saves (``torch.save``,
                      ``torch.distributed.checkpoint.save``, the blocking part of ``async_save``),
                      ns, cumulative (flag bit 8)
696    8      u64     the part of it inside step time (between two batches), ns, cumulative
704    8      u64     checkpoint saves, cumulative
712    8      u64     end of the latest save, Unix ns (0 = no save yet)
720    8      u64     steps when it ended
728    8      f64     FLOPs of one training step counted by the probe (flag bit 9)
736    8      u64     wall time of the steps counted, with the counter on, ns
744    4      u32     steps counted (usually 1)
748    4      u32     FLOP counting state (flag bit 7): 0 pending, 1 measured, 2 declared by
                      the job (not counted), 3 turned off (``DAM_PROBE_FLOPS=0``), 4 not possible
                      (no torch, a compiled model, an error)
752    4      u32     why the FLOPs were not counted (flag bit 10): ``FLOPS_REASON_*``, 0 none
756    44     44s     its detail, NUL-padded ASCII (the op whose FLOP formula raised and the
                      exception's type, the higher-order op; empty when none)
800    8      u64     collectives the training thread entered (timed ones), cumulative: the
                      sequence number of the latest (flag bit 11)
808    8      u64     the latest batch delivered, Unix ns (0 = none yet)
816    8      u64     when the watchdog read the training thread's place, Unix ns (0 = not
                      read: no step overdue; ``dam_probe._watchdog``)
824    4      u32     that place: ``PLACE_*`` (0 = not read)
828    4      -       reserved, zero
832    40     40s     its detail, NUL-padded ASCII (``all_reduce #12``, ``worker 1 pid 77 dead``)
872    152    152s    the innermost frames of the training thread, ``file:line function``,
                      one a line, NUL-padded ASCII
====== ====== ======= ==========================================================

Seqlock protocol: the writer increments ``sequence`` to an odd value, writes
the payload, then increments it to the next even value. A reader reads the
sequence, the payload, and the sequence again; the read is valid only if both
sequences are equal and even. Readers retry a few times and otherwise report
the file as busy. Counters are cumulative, so a missed sample never loses time.

Unknown is never zero: a version-1 file, or a field whose flag bit is clear,
reads as ``None`` in ``ProbeRecord`` (rank, local rank, world size, the
collective counters, the memory fields, the process figures, the run-queue
delays, the goodput, checkpoint, measured-FLOP and DataLoader settings fields, the matmul
precision), whatever the bytes
hold. The cgroup CPU fields (offsets 96..120)
were reserved zero bytes before they were defined and carry their own flag
bit, so version-1 files may have them too.

Standard library only: this module is imported inside training processes.
"""

from __future__ import annotations

import contextlib
import errno
import math
import mmap
import operator
import os
import stat
import struct
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

MAGIC: Final = b"DAMPROBE"
VERSION: Final = 2
FILE_SIZE: Final = 1024  # of the version written (2)
V1_FILE_SIZE: Final = 512
SIZES: Final = {1: V1_FILE_SIZE, 2: FILE_SIZE}  # every layout version this reader knows
MAX_DEVICES: Final = 8
UUID_BYTES: Final = 48
FLAG_CLOSED: Final = 1
FLAG_CGROUP: Final = 2  # the cgroup CPU fields are valid
FLAG_MEMORY: Final = 4  # the cgroup memory fields are valid (version 2)
FLAG_COLLECTIVES: Final = 8  # the collective counters are valid (version 2)
FLAG_PROCESS: Final = 16  # the process CPU / memory figures are valid (version 2)
FLAG_RUN_QUEUE: Final = 32  # the run-queue delays are valid (version 2)
FLAG_LOADER_KILLS: Final = 64  # the DataLoader worker kill fields are valid (version 2)
FLAG_GOODPUT: Final = 128  # the goodput accounting is valid (version 2)
FLAG_CHECKPOINTS: Final = 256  # the checkpoint counters are valid (version 2)
FLAG_FLOPS_MEASURED: Final = 512  # the measured FLOPs per step are valid (version 2)
FLAG_FLOPS_REASON: Final = 1024  # why the FLOPs were not counted is valid (version 2)
FLOPS_PENDING: Final = 0
FLOPS_MEASURED: Final = 1
FLOPS_DECLARED: Final = 2
FLOPS_OFF: Final = 3
FLOPS_UNAVAILABLE: Final = 4
FLOPS_STATES: Final = (FLOPS_PENDING, FLOPS_MEASURED, FLOPS_DECLARED, FLOPS_OFF, FLOPS_UNAVAILABLE)
# Why the probe did not count FLOPs (offset 752; the sidecar's dam_model_flops_unavailable{reason}).
FLOPS_REASON_OFF: Final = 1  # DAM_PROBE_FLOPS=0
FLOPS_REASON_NO_TORCH: Final = 2  # torch never loaded in the process
FLOPS_REASON_COMPILED: Final = 3  # torch.compile ran: the counter sees no op of a compiled region
FLOPS_REASON_LOW_MEMORY: Final = 4  # the container's memory limit leaves under 512 MiB free
FLOPS_REASON_COUNTER_ERROR: Final = 5  # the counter raised (an op's FLOP formula, entering the mode)
FLOPS_REASON_HIGHER_ORDER_OP: Final = 6  # a higher-order op ran: it runs uncounted
FLOPS_REASON_NO_FORMULA: Final = 7  # no op of the step has a FLOP formula (custom kernels only)
FLOPS_REASON_CUT_SHORT: Final = 8  # the loader ran out while counting, three times
FLOPS_REASON_MODE_STACK: Final = 9  # the step left another dispatch mode above the counter's
FLOPS_REASONS: Final = tuple(range(1, 10))
FLOPS_DETAIL_BYTES: Final = 44
FLAG_PROGRESS: Final = 2048  # the progress fields (watchdog) are valid (version 2)
FLAG_LOADER_SETTINGS: Final = 4096  # the DataLoader settings at 120..128 are valid (version 2)
# Where the training thread was when the watchdog read it (offset 824; status.progress.culprit.where).
PLACE_NONE: Final = 0
PLACE_COLLECTIVE: Final = 1
PLACE_DATALOADER: Final = 2
PLACE_CHECKPOINT: Final = 3
PLACE_BACKWARD: Final = 4
PLACE_OPTIMIZER: Final = 5
PLACE_USER_CODE: Final = 6
PLACE_NAMES: Final = {
    PLACE_COLLECTIVE: "collective",
    PLACE_DATALOADER: "dataloader",
    PLACE_CHECKPOINT: "checkpoint",
    PLACE_BACKWARD: "backward",
    PLACE_OPTIMIZER: "optimizer",
    PLACE_USER_CODE: "user-code",
}
PLACE_DETAIL_BYTES: Final = 40
PLACE_FRAMES_BYTES: Final = 152
FLAG_PRECISION: Final = 8192  # the matmul precision at 524 is valid (version 2)
# The precision of the counted step's matmul-class FLOPs (offset 524; the sidecar's
# dam_model_flops_precision{precision}): the dtype the most FLOPs ran in, fp32 on CUDA with TF32
# allowed read as tf32.
PRECISION_UNKNOWN: Final = 0
PRECISION_FP32: Final = 1
PRECISION_TF32: Final = 2
PRECISION_FP16: Final = 3
PRECISION_BF16: Final = 4
PRECISION_FP8: Final = 5
PRECISION_FP64: Final = 6
PRECISION_NAMES: Final = {
    PRECISION_FP32: "fp32",
    PRECISION_TF32: "tf32",
    PRECISION_FP16: "fp16",
    PRECISION_BF16: "bf16",
    PRECISION_FP8: "fp8",
    PRECISION_FP64: "fp64",
}
FILE_PREFIX: Final = "probe-"
FILE_SUFFIX: Final = ".bin"
UNKNOWN_RANK: Final = -1

_HEADER = struct.Struct("<8sII")  # magic, version, size
_SEQ = struct.Struct("<Q")
_PAYLOAD = struct.Struct("<QQQQQQQdII")  # pid .. flags (offset 24..96); the rest: FIELDS
_SEQ_OFFSET: Final = 16
_PAYLOAD_OFFSET: Final = 24
_DEVICES_OFFSET: Final = 128
_U16_MAX: Final = 2**16 - 1
_I32_MAX: Final = 2**31 - 1
_U32_MAX: Final = 2**32 - 1


class ProbeFormatError(ValueError):
    """The file is not a readable probe file (wrong magic, version, size, or torn)."""


class NotRegularFileError(ProbeFormatError):
    """A name in the probe directory is not a regular file (FIFO, socket, device, directory, link)."""


# Only regular files are read, and opening never blocks or follows a link: the probe directory is shared
# with the training container, so anything may lie there. The name is checked with lstat first, so a
# device is never opened (opening one can have side effects). Linux open(2), for a name swapped after that
# check: a FIFO opened O_RDONLY without O_NONBLOCK waits for a writer forever, with O_NONBLOCK it returns at
# once (and O_NONBLOCK is ignored for regular files); O_NOFOLLOW makes a symbolic link fail with ELOOP; a
# UNIX socket fails with ENXIO. What did open is checked again with fstat.
_OPEN_FLAGS: Final = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_KINDS: Final = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISLNK, "a symbolic link"),
)


def _not_regular(path: str, mode: int) -> NotRegularFileError:
    kind = next((name for test, name in _FILE_KINDS if test(mode)), "not a regular file")
    return NotRegularFileError(f"{path}: {kind}, not a probe file; skipped")


def open_regular(path: str) -> int:
    """A read-only descriptor of the regular file ``path``; never blocks, never follows a link.

    Raises ``NotRegularFileError`` (naming what the path is) for anything else,
    and ``OSError`` when the file cannot be opened.
    """
    mode = os.lstat(path).st_mode
    if not stat.S_ISREG(mode):
        raise _not_regular(path, mode)
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
            raise NotRegularFileError(f"{path}: replaced by something not a regular file; skipped") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise _not_regular(path, mode)
    return fd


@dataclass(frozen=True)
class ProbeRecord:
    """One consistent read of a probe file."""

    pid: int
    start_time_ns: int
    steps: int
    wait_ns: int
    step_ns: int
    last_update_ns: int
    batch_size: int
    flops_per_step: float
    closed: bool
    device_uuids: tuple[str, ...] = field(default_factory=tuple)
    # The training process's own cgroup (flag bit 1); all None when the writer did not know them.
    cgroup_throttled_ns: int | None = None
    cgroup_limit_millicores: int | None = None  # 0: no limit
    cgroup_id: int | None = None  # 0: unknown
    # Version 2. Distributed identity: None when unknown (and always in version-1 files).
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    # Version 2, flag bit 3: None when the writer did not instrument collectives.
    collectives: int | None = None
    collective_ns: int | None = None
    collective_exposed_ns: int | None = None
    collective_bytes: int | None = None
    # Version 2, flag bit 2: the process's own memory cgroup; all None when unknown.
    memory_usage_bytes: int | None = None
    memory_limit_bytes: int | None = None  # 0: no limit
    oom_kills: int | None = None
    memory_cgroup_id: int | None = None  # 0: unknown
    # Version 2, flag bit 4: the process's own CPU and memory figures (dam_probe.process), for a
    # reader that cannot see it in its /proc (another PID namespace); all None when unknown.
    process_cpu_ns: int | None = None
    worker_cpu_ns: int | None = None  # its descendants, live and ended
    process_rss_bytes: int | None = None
    worker_rss_bytes: int | None = None
    workers: int | None = None  # live descendants
    pid_namespace: int | None = None  # inode of the writer's PID namespace; 0: unknown
    # Version 2, flag bit 6: DataLoader workers that died (DataLoader's own error); None: not watched.
    loader_worker_kills: int | None = None
    loader_kill_signal: int | None = None  # of the latest; 0: not known
    # Version 2, flag bit 5: run-queue delay (dam_probe.schedstat); None: not read.
    run_queue_ns: int | None = None  # the process's main thread
    worker_run_queue_ns: int | None = None  # its DataLoader workers, live and ended
    # Version 2, flag bit 7: goodput accounting (dam_probe._goodput); None: not published.
    process_start_ns: int | None = None  # Unix ns
    startup_ns: int | None = None  # process start to the first batch asked for
    productive_ns: int | None = None
    other_ns: int | None = None
    flops_state: int | None = None  # FLOPS_* (pending, measured, declared, off, unavailable)
    # Version 2, flag bit 8: checkpoint saves; None: not instrumented (torch.save never wrapped).
    checkpoint_ns: int | None = None
    checkpoint_step_ns: int | None = None  # the part inside step time
    checkpoints: int | None = None
    last_checkpoint_ns: int | None = None  # Unix ns; 0: no save yet
    last_checkpoint_steps: int | None = None
    # Version 2, flag bit 9: FLOPs of one step counted by the probe; None: not measured.
    measured_flops_per_step: float | None = None
    flops_measured_ns: int | None = None  # wall time of the counted steps, counter on
    flops_measured_steps: int | None = None
    # Version 2, flag bit 10: why FLOPs were not counted (FLOPS_REASON_*), its detail; None: unknown.
    flops_reason: int | None = None
    flops_detail: str | None = None
    # Version 2, flag bit 11: progress (dam_probe._watchdog); None: not published.
    collectives_entered: int | None = None  # timed collectives the training thread entered
    last_batch_ns: int | None = None  # Unix ns of the latest batch delivered; 0: none yet
    place_read_ns: int | None = None  # Unix ns the watchdog read the place; 0: not read (no step overdue)
    place: int | None = None  # PLACE_*
    place_detail: str | None = None
    place_frames: str | None = None  # innermost first, one "file:line function" a line
    # Version 2, flag bit 12: the settings of the latest DataLoader iterated; None: not published.
    loader_num_workers: int | None = None
    loader_prefetch_factor: int | None = None  # None also when the loader has no workers
    loader_pin_memory: bool | None = None  # pins: set, and an accelerator to pin for
    loader_persistent_workers: bool | None = None
    # Version 2, flag bit 13: the counted step's matmul precision (PRECISION_*); None: unknown.
    matmul_precision: int | None = None
    version: int = VERSION  # the layout version the record was read from (or will be written as)

    def __post_init__(self) -> None:
        _check_groups(self)
        if self.measured_flops_per_step is not None and not (
            math.isfinite(self.measured_flops_per_step) and self.measured_flops_per_step >= 0
        ):
            raise ValueError(f"measured_flops_per_step must be finite, >= 0: {self.measured_flops_per_step}")
        _check_ranks(self)
        if self.version not in SIZES:
            raise ValueError(f"unknown layout version {self.version}")

    @property
    def wait_seconds(self) -> float:
        return self.wait_ns / 1e9

    @property
    def cgroup_throttled_seconds(self) -> float | None:
        """CFS throttled time of the process's cgroup, seconds; None when unknown."""
        return None if self.cgroup_throttled_ns is None else self.cgroup_throttled_ns / 1e9

    @property
    def cgroup_limit_cores(self) -> float | None:
        """CPU limit of the process's cgroup in cores; None when unknown or unlimited."""
        return self.cgroup_limit_millicores / 1000 if self.cgroup_limit_millicores else None

    @property
    def step_seconds(self) -> float:
        return self.step_ns / 1e9

    @property
    def effective_flops_per_step(self) -> tuple[float, str]:
        """``(FLOPs per step, source)``: declared by the job when it did, else measured by the
        probe; ``(0.0, "")`` when neither is known."""
        if self.flops_per_step > 0:
            return self.flops_per_step, "declared"
        if self.measured_flops_per_step is not None and self.measured_flops_per_step > 0:
            return self.measured_flops_per_step, "measured"
        return 0.0, ""

    @property
    def collective_seconds(self) -> float | None:
        return None if self.collective_ns is None else self.collective_ns / 1e9

    @property
    def collective_exposed_seconds(self) -> float | None:
        return None if self.collective_exposed_ns is None else self.collective_exposed_ns / 1e9


def _check_ranks(record: ProbeRecord) -> None:
    for name in ("rank", "local_rank", "world_size"):
        value = getattr(record, name)
        if value is not None and not 0 <= value <= _I32_MAX:
            raise ValueError(f"{name} must be between 0 and {_I32_MAX}, got {value}")


def probe_path(directory: str, pid: int) -> str:
    return os.path.join(directory, f"{FILE_PREFIX}{pid}{FILE_SUFFIX}")


def encode(record: ProbeRecord, sequence: int = 0) -> bytes:
    """The full file image of ``record`` in its ``version`` (used by tests and fixtures).

    A version-1 image drops the version-2 fields.
    """
    size = SIZES[record.version]
    buf = bytearray(size)
    _HEADER.pack_into(buf, 0, MAGIC, record.version, size)
    _SEQ.pack_into(buf, _SEQ_OFFSET, sequence)
    _pack_payload(buf, record)
    return bytes(buf)


def _rank_field(value: int | None) -> int:
    return UNKNOWN_RANK if value is None else value


def _pack_payload(buf: bytearray | mmap.mmap, record: ProbeRecord) -> None:
    """The version-1 fields, then (version 2) the rest: what ``encode`` and the writer publish."""
    uuids = record.device_uuids[:MAX_DEVICES]
    _PAYLOAD.pack_into(
        buf,
        _PAYLOAD_OFFSET,
        record.pid,
        record.start_time_ns,
        record.steps,
        record.wait_ns,
        record.step_ns,
        record.last_update_ns,
        record.batch_size,
        float(record.flops_per_step),
        len(uuids),
        _flags(record),
    )
    for i in range(MAX_DEVICES):
        raw = uuids[i].encode("ascii", "replace")[: UUID_BYTES - 1] if i < len(uuids) else b""
        off = _DEVICES_OFFSET + i * UUID_BYTES
        buf[off : off + UUID_BYTES] = raw.ljust(UUID_BYTES, b"\0")
    _pack_fields(buf, record)


def _switch_field(value: bool | None) -> int:
    """A setting that is on or off, as one byte: 0 unknown, 1 off, 2 on."""
    return 0 if value is None else 2 if value else 1


def _switch_or_none(raw: int) -> bool | None:
    return {1: False, 2: True}.get(raw)


def _rank_or_none(value: int) -> int | None:
    return value if value >= 0 else None


def decode(data: bytes) -> tuple[int, ProbeRecord]:
    """Parse one file image (layout version 1 or 2) into ``(sequence, record)``; raises ProbeFormatError."""
    version = _check_header(data)
    (sequence,) = _SEQ.unpack_from(data, _SEQ_OFFSET)
    (pid, start, steps, wait, step, last, batch, flops, n_dev, flags) = _PAYLOAD.unpack_from(
        data, _PAYLOAD_OFFSET
    )
    if n_dev > MAX_DEVICES:
        raise ProbeFormatError(f"device count {n_dev} exceeds {MAX_DEVICES}")
    if math.isnan(flops) or flops < 0:
        raise ProbeFormatError(f"invalid flops_per_step {flops}")
    uuids = []
    for i in range(n_dev):
        off = _DEVICES_OFFSET + i * UUID_BYTES
        raw = bytes(data[off : off + UUID_BYTES]).split(b"\0", 1)[0]
        uuids.append(raw.decode("ascii", "replace"))
    return sequence, ProbeRecord(
        pid=pid,
        start_time_ns=start,
        steps=steps,
        wait_ns=wait,
        step_ns=step,
        last_update_ns=last,
        batch_size=batch,
        flops_per_step=flops,
        closed=bool(flags & FLAG_CLOSED),
        device_uuids=tuple(uuids),
        version=version,
        **_unpack_fields(data, version, flags),
    )


def _ascii_field(raw: bytes) -> str:
    """A NUL-padded text field, printable ASCII only (anything else, e.g. a torn write, is ``?``)."""
    text = raw.split(b"\0", 1)[0].decode("ascii", "replace")
    return "".join(c if " " <= c <= "~" else "?" for c in text)


def _text_field(raw: bytes) -> str:
    """``_ascii_field`` that keeps its line breaks (the frames field: one frame a line)."""
    return "\n".join(_ascii_field(line) for line in raw.split(b"\0", 1)[0].split(b"\n"))


# The field table: every field after the version-1 core (pid .. flags, the device UUIDs), one row each.
# It drives the writer (``_pack_fields``), the reader (``_unpack_fields``), ``ProbeRecord``'s validation
# and the flag bits (``_GROUPS``), and ``ProbeWriter.publish``'s tuples (``_TUPLE_NAMES``). A field is
# read back only from a layout at least as new as its ``version`` and, when it has one, with its ``flag``
# bit set; otherwise it is None. ``kind``: counter (cumulative), gauge, or info (an identity, a state, text).
def _u(bits: int) -> Callable[[Any], int]:
    top = 2**bits - 1
    return lambda value: min(value or 0, top)


def _q(value: Any) -> int:
    return value or 0  # type: ignore[no-any-return]


def _text(size: int) -> Callable[[Any], bytes]:
    return lambda value: (value or "").encode("ascii", "replace")[:size]


def _keep(raw: Any) -> Any:
    return raw


def _one_of(known: Iterable[int], otherwise: int) -> Callable[[Any], int]:
    values = frozenset(known)
    return lambda raw: raw if raw in values else otherwise


def _measured(raw: Any) -> float:
    if not math.isfinite(raw) or raw < 0:
        raise ProbeFormatError(f"invalid measured FLOPs per step {raw}")
    return float(raw)


@dataclass(frozen=True)
class Field:
    """One ``ProbeRecord`` field in the file: its struct code at its offset, under a flag bit."""

    name: str
    code: str
    offset: int
    version: int  # the layout version that introduced it
    flag: int  # the flag bit that marks it valid; 0: always, from its version
    unit: str  # "ns", "bytes", "count", "millicores", "flops", "" (an id, a state, text)
    kind: str = "gauge"  # "counter" | "gauge" | "info"
    put: Callable[[Any], Any] = _q  # record value (None = unknown) -> raw
    get: Callable[[Any], Any] = _keep  # raw -> record value
    summed: bool = False
    """A cumulative figure of the process's own work that adds up over the processes of a rank:
    the sidecar carries it across their lives (``RANK_TOTALS``; its ``RankSample.totals``, and a
    family declared with ``sample="totals.<total_key>"`` exports it per rank)."""
    packer: struct.Struct = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "packer", struct.Struct("<" + self.code))


_C = "counter"
_I = "info"
FIELDS: Final = (
    Field("cgroup_throttled_ns", "Q", 96, 1, FLAG_CGROUP, "ns", _C),
    Field("cgroup_limit_millicores", "Q", 104, 1, FLAG_CGROUP, "millicores"),
    Field("cgroup_id", "Q", 112, 1, FLAG_CGROUP, "", _I),
    Field("loader_num_workers", "H", 120, 2, FLAG_LOADER_SETTINGS, "count", put=_u(16)),
    Field(
        "loader_prefetch_factor",
        "H",
        122,
        2,
        FLAG_LOADER_SETTINGS,
        "count",
        put=_u(16),
        get=lambda r: r or None,
    ),
    Field("loader_pin_memory", "B", 124, 2, FLAG_LOADER_SETTINGS, "", _I, _switch_field, _switch_or_none),
    Field(
        "loader_persistent_workers", "B", 125, 2, FLAG_LOADER_SETTINGS, "", _I, _switch_field, _switch_or_none
    ),
    Field("rank", "i", 512, 2, 0, "", _I, _rank_field, _rank_or_none),
    Field("local_rank", "i", 516, 2, 0, "", _I, _rank_field, _rank_or_none),
    Field("world_size", "i", 520, 2, 0, "", _I, _rank_field, _rank_or_none),
    Field("matmul_precision", "I", 524, 2, FLAG_PRECISION, "", _I, _u(32), _one_of(PRECISION_NAMES, 0)),
    Field("collectives", "Q", 528, 2, FLAG_COLLECTIVES, "count", _C, summed=True),
    Field("collective_ns", "Q", 536, 2, FLAG_COLLECTIVES, "ns", _C, summed=True),
    Field("collective_exposed_ns", "Q", 544, 2, FLAG_COLLECTIVES, "ns", _C, summed=True),
    Field("collective_bytes", "Q", 552, 2, FLAG_COLLECTIVES, "bytes", _C, summed=True),
    Field("memory_usage_bytes", "Q", 560, 2, FLAG_MEMORY, "bytes"),
    Field("memory_limit_bytes", "Q", 568, 2, FLAG_MEMORY, "bytes"),
    Field("oom_kills", "Q", 576, 2, FLAG_MEMORY, "count", _C),
    Field("memory_cgroup_id", "Q", 584, 2, FLAG_MEMORY, "", _I),
    Field("process_cpu_ns", "Q", 592, 2, FLAG_PROCESS, "ns", _C),
    Field("worker_cpu_ns", "Q", 600, 2, FLAG_PROCESS, "ns", _C),
    Field("process_rss_bytes", "Q", 608, 2, FLAG_PROCESS, "bytes"),
    Field("worker_rss_bytes", "Q", 616, 2, FLAG_PROCESS, "bytes"),
    Field("workers", "I", 624, 2, FLAG_PROCESS, "count", put=_u(32)),
    Field("pid_namespace", "I", 628, 2, FLAG_PROCESS, "", _I, lambda v: (v or 0) & _U32_MAX),
    Field("run_queue_ns", "Q", 632, 2, FLAG_RUN_QUEUE, "ns", _C),
    Field("worker_run_queue_ns", "Q", 640, 2, FLAG_RUN_QUEUE, "ns", _C),
    Field("loader_worker_kills", "I", 648, 2, FLAG_LOADER_KILLS, "count", _C, _u(32)),
    Field("loader_kill_signal", "I", 652, 2, FLAG_LOADER_KILLS, "", _I, _u(32)),
    Field("process_start_ns", "Q", 656, 2, FLAG_GOODPUT, "ns", _I),
    Field("startup_ns", "Q", 664, 2, FLAG_GOODPUT, "ns", summed=True),
    Field("productive_ns", "Q", 672, 2, FLAG_GOODPUT, "ns", _C, summed=True),
    Field("other_ns", "Q", 680, 2, FLAG_GOODPUT, "ns", _C, summed=True),
    Field("checkpoint_ns", "Q", 688, 2, FLAG_CHECKPOINTS, "ns", _C, summed=True),
    Field("checkpoint_step_ns", "Q", 696, 2, FLAG_CHECKPOINTS, "ns", _C),
    Field("checkpoints", "Q", 704, 2, FLAG_CHECKPOINTS, "count", _C, summed=True),
    Field("last_checkpoint_ns", "Q", 712, 2, FLAG_CHECKPOINTS, "ns", _I),
    Field("last_checkpoint_steps", "Q", 720, 2, FLAG_CHECKPOINTS, "count", _I),
    Field(
        "measured_flops_per_step",
        "d",
        728,
        2,
        FLAG_FLOPS_MEASURED,
        "flops",
        put=lambda v: float(v or 0.0),
        get=_measured,
    ),
    Field("flops_measured_ns", "Q", 736, 2, FLAG_FLOPS_MEASURED, "ns"),
    Field("flops_measured_steps", "I", 744, 2, FLAG_FLOPS_MEASURED, "count", put=_u(32)),
    Field("flops_state", "I", 748, 2, FLAG_GOODPUT, "", _I, _u(32), _one_of(FLOPS_STATES, FLOPS_UNAVAILABLE)),
    Field("flops_reason", "I", 752, 2, FLAG_FLOPS_REASON, "", _I, _u(32)),
    Field(
        "flops_detail",
        f"{FLOPS_DETAIL_BYTES}s",
        756,
        2,
        FLAG_FLOPS_REASON,
        "",
        _I,
        _text(FLOPS_DETAIL_BYTES),
        _ascii_field,
    ),
    Field("collectives_entered", "Q", 800, 2, FLAG_PROGRESS, "count", _C),
    Field("last_batch_ns", "Q", 808, 2, FLAG_PROGRESS, "ns", _I),
    Field("place_read_ns", "Q", 816, 2, FLAG_PROGRESS, "ns", _I),
    Field("place", "I", 824, 2, FLAG_PROGRESS, "", _I, _u(32), _one_of(PLACE_NAMES, PLACE_NONE)),
    Field(
        "place_detail",
        f"{PLACE_DETAIL_BYTES}s",
        832,
        2,
        FLAG_PROGRESS,
        "",
        _I,
        _text(PLACE_DETAIL_BYTES),
        _ascii_field,
    ),
    Field(
        "place_frames",
        f"{PLACE_FRAMES_BYTES}s",
        872,
        2,
        FLAG_PROGRESS,
        "",
        _I,
        _text(PLACE_FRAMES_BYTES),
        _text_field,
    ),
)
_FIELDS_OF: Final = {v: tuple(f for f in FIELDS if f.version <= v) for v in SIZES}


def total_key(name: str, unit: str) -> str:
    """The key of a summed field in ``RankSample.totals``: its name in base units (``wait_ns``
    is ``wait_seconds``, in seconds); a count keeps its name."""
    return f"{name.removesuffix('_ns')}_seconds" if unit == "ns" else name


RANK_TOTALS: Final = (
    ("steps", "count"),
    ("wait_ns", "ns"),
    ("step_ns", "ns"),
    *((f.name, f.unit) for f in FIELDS if f.summed),
)
"""``(field, unit)`` of every figure summed per rank: the version-1 core's steps and times, then
each field of the table marked ``summed``, in table order."""


def _runs(fields: tuple[Field, ...]) -> tuple[tuple[int, struct.Struct, tuple[Field, ...]], ...]:
    """A layout version's fields as runs of adjacent ones, each one ``struct`` (offset, struct,
    fields), so the writer packs and the reader unpacks a run in one call; nothing between runs
    (the device UUIDs, reserved bytes) is touched. The table is read once, at import."""
    groups: list[list[Field]] = []
    for f in sorted(fields, key=lambda f: f.offset):
        end = groups[-1][-1].offset + groups[-1][-1].packer.size if groups else f.offset
        if f.offset < end:
            raise ValueError(f"probe field {f.name} at {f.offset} overlaps {groups[-1][-1].name}")
        if f.offset == end and groups:
            groups[-1].append(f)
        else:
            groups.append([f])
    return tuple((g[0].offset, struct.Struct("<" + "".join(f.code for f in g)), tuple(g)) for g in groups)


_RUNS_OF: Final = {v: _runs(fs) for v, fs in _FIELDS_OF.items()}


@dataclass(frozen=True)
class _Group:
    """Fields known together: ``needs`` (the rest only with the first) or all-or-none; the first's
    flag bit marks the group valid in the file."""

    flag: int
    names: tuple[str, ...]
    together: bool
    message: str
    version: int
    """The layout version that introduced the group: its flag bit is set only from that version."""


def _group(flag: int, together: bool, message: str, anchor: str | None = None) -> _Group:
    fields = [f for f in FIELDS if f.flag == flag]
    names = tuple(f.name for f in fields)
    if anchor is not None:
        names = (anchor, *(n for n in names if n != anchor))
    return _Group(flag, names, together, message, min(f.version for f in fields))


_GROUPS: Final = (
    _group(FLAG_CGROUP, False, "cgroup_limit_millicores and cgroup_id need cgroup_throttled_ns"),
    _group(
        FLAG_COLLECTIVES, False, "collective_ns, collective_exposed_ns and collective_bytes need collectives"
    ),
    _group(FLAG_MEMORY, False, "memory_limit_bytes, oom_kills and memory_cgroup_id need memory_usage_bytes"),
    _group(
        FLAG_PROCESS, False, "worker_cpu_ns, the RSS fields, workers and pid_namespace need process_cpu_ns"
    ),
    _group(FLAG_LOADER_KILLS, False, "loader_kill_signal needs loader_worker_kills"),
    _group(FLAG_RUN_QUEUE, False, "worker_run_queue_ns needs run_queue_ns"),
    _group(
        FLAG_GOODPUT,
        True,
        "process_start_ns, startup_ns, productive_ns, other_ns, flops_state go together",
        "productive_ns",
    ),
    _group(FLAG_CHECKPOINTS, True, "the five checkpoint fields go together"),
    _group(
        FLAG_FLOPS_MEASURED,
        True,
        "measured_flops_per_step, flops_measured_ns, flops_measured_steps go together",
    ),
    _group(FLAG_FLOPS_REASON, True, "flops_reason and flops_detail go together"),
    _group(FLAG_PROGRESS, True, "the six progress fields go together"),
    _group(FLAG_LOADER_SETTINGS, False, "the DataLoader settings need loader_num_workers"),
    _group(FLAG_PRECISION, False, "matmul_precision"),
)
# ``ProbeWriter.publish``'s tuples: each is its group's fields in table order.
_PUBLISHED: Final = {
    "collectives": FLAG_COLLECTIVES,
    "memory": FLAG_MEMORY,
    "process": FLAG_PROCESS,
    "loader_kills": FLAG_LOADER_KILLS,
    "run_queue": FLAG_RUN_QUEUE,
    "goodput": FLAG_GOODPUT,
    "checkpoints": FLAG_CHECKPOINTS,
    "measured_flops": FLAG_FLOPS_MEASURED,
    "flops_reason": FLAG_FLOPS_REASON,
    "progress": FLAG_PROGRESS,
    "loader_settings": FLAG_LOADER_SETTINGS,
}
_TUPLE_NAMES: Final = {arg: tuple(f.name for f in FIELDS if f.flag == bit) for arg, bit in _PUBLISHED.items()}


def _published(**groups: tuple[Any, ...] | None) -> dict[str, Any]:
    """``ProbeWriter.publish``'s tuples (by their argument names) as ``ProbeRecord`` fields."""
    out: dict[str, Any] = {}
    for arg, values in groups.items():
        if values is not None:
            out.update(zip(_TUPLE_NAMES[arg], values, strict=True))
    return out


_GROUP_VALUES: Final = tuple((g, operator.attrgetter(*g.names)) for g in _GROUPS)


def _check_groups(record: ProbeRecord) -> None:
    for group, read in _GROUP_VALUES:
        values = read(record) if len(group.names) > 1 else (read(record),)
        if group.together:
            if any(v is None for v in values) and any(v is not None for v in values):
                raise ValueError(group.message)
        elif values[0] is None and any(v is not None for v in values[1:]):
            raise ValueError(group.message)


def _flags(record: ProbeRecord) -> int:
    flags = FLAG_CLOSED if record.closed else 0
    for group in _GROUPS:
        if record.version >= group.version and getattr(record, group.names[0]) is not None:
            flags |= group.flag
    return flags


def _pack_fields(buf: bytearray | mmap.mmap, record: ProbeRecord) -> None:
    for offset, packer, fields in _RUNS_OF[record.version]:
        packer.pack_into(buf, offset, *[f.put(getattr(record, f.name)) for f in fields])


def _unpack_fields(data: bytes, version: int, flags: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for offset, packer, fields in _RUNS_OF[version]:
        for f, raw in zip(fields, packer.unpack_from(data, offset), strict=True):
            if not f.flag or flags & f.flag:
                out[f.name] = f.get(raw)
    return out


def _check_header(data: bytes) -> int:
    """Validates the header; returns the layout version (its file size is ``SIZES[version]``)."""
    if len(data) < _HEADER.size:
        raise ProbeFormatError(f"truncated: {len(data)} bytes, expected {FILE_SIZE}")
    magic, version, size = _HEADER.unpack_from(data, 0)
    expected = SIZES.get(version)
    if len(data) < (expected or V1_FILE_SIZE):
        raise ProbeFormatError(f"truncated: {len(data)} bytes, expected {expected or FILE_SIZE}")
    if magic != MAGIC:
        raise ProbeFormatError(f"bad magic {magic!r}, expected {MAGIC!r}")
    if expected is None:
        known = ", ".join(str(v) for v in sorted(SIZES))
        raise ProbeFormatError(f"unsupported layout version {version}, this reader knows {known}")
    if size != expected:
        raise ProbeFormatError(f"bad size field {size}, expected {expected}")
    return int(version)


def read_file(path: str, retries: int = 50) -> ProbeRecord:
    """One consistent read of the probe file at ``path`` under the seqlock.

    Raises ``OSError`` when the file cannot be read and ``ProbeFormatError`` when
    its content is not a valid probe record (or stays torn after ``retries``).

    The sequence is read on its own before and after the image: a single copy
    of the whole image is not ordered byte by byte (the kernel copies with
    fast string moves), so the sequence inside it cannot vouch for the rest.
    The payload is only validated once the reads agree, so a record caught
    mid-update is retried instead of being reported as corrupt.

    Only a regular file is read (``open_regular``: a FIFO, socket, device,
    directory or symbolic link raises ``NotRegularFileError`` at once), and
    never more than ``FILE_SIZE`` bytes of it, however large it is.
    """
    fd = open_regular(path)
    try:
        for _ in range(max(1, retries)):
            before = os.pread(fd, _SEQ.size, _SEQ_OFFSET)
            data = os.pread(fd, FILE_SIZE, 0)  # the largest layout; a version-1 file gives 512 bytes
            _check_header(data)
            after = os.pread(fd, _SEQ.size, _SEQ_OFFSET)
            if before == after == data[_SEQ_OFFSET : _SEQ_OFFSET + _SEQ.size] and not before[0] & 1:
                return decode(data)[1]
            time.sleep(0)
    finally:
        os.close(fd)
    raise ProbeFormatError(f"{path}: writer busy (torn read after {retries} tries)")


def probe_files(directory: str) -> list[str]:
    """The probe files in ``directory`` (``probe-<pid>.bin``), ordered by pid; [] if it is missing."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    found: list[tuple[int, str]] = []
    for name in names:
        if name.startswith(FILE_PREFIX) and name.endswith(FILE_SUFFIX):
            middle = name[len(FILE_PREFIX) : -len(FILE_SUFFIX)]
            if middle.isdigit() and middle.isascii():
                found.append((int(middle), os.path.join(directory, name)))
    return [path for _, path in sorted(found)]


@dataclass(frozen=True)
class ProbeScan:
    """The result of reading every probe file of a directory.

    ``records`` maps each readable file to its consistent record; ``errors``
    maps each file (or the directory itself) that could not be read to the
    ``ProbeFormatError`` or ``OSError`` raised. Files that vanish between the
    listing and the read (the process ended) are in neither.
    """

    records: dict[str, ProbeRecord] = field(default_factory=dict)
    errors: dict[str, ProbeFormatError | OSError] = field(default_factory=dict)


def read_all(directory: str, retries: int = 50) -> ProbeScan:
    """Reads every probe file in ``directory``; one bad file never hides the others."""
    scan = ProbeScan()
    if not os.path.isdir(directory):
        scan.errors[directory] = FileNotFoundError(2, "probe directory does not exist", directory)
        return scan
    for path in probe_files(directory):
        try:
            scan.records[path] = read_file(path, retries)
        except FileNotFoundError:
            continue
        except (ProbeFormatError, OSError) as exc:
            scan.errors[path] = exc
    return scan


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


class ProbeWriter:
    """Publishes cumulative counters to a probe file through ``mmap``.

    Not thread-safe on its own: one writer per process, called from one thread
    at a time (the probe serialises calls).
    """

    def __init__(self, path: str, pid: int, start_time_ns: int | None = None) -> None:
        self.path = path
        # Built under a name readers ignore, then renamed into place: a reader
        # never sees a half-created (empty or headerless) probe file.
        tmp = os.path.join(os.path.dirname(path) or ".", f".{os.path.basename(path)}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, FILE_SIZE)
            self._mm = mmap.mmap(fd, FILE_SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            _unlink_quietly(tmp)
            raise
        os.close(fd)
        self._seq = 0
        self._scratch = bytearray(FILE_SIZE)
        self._scratch_view = memoryview(self._scratch)[_PAYLOAD_OFFSET:FILE_SIZE]
        self._base = ProbeRecord(
            pid=pid,
            start_time_ns=start_time_ns if start_time_ns is not None else time.time_ns(),
            steps=0,
            wait_ns=0,
            step_ns=0,
            last_update_ns=time.time_ns(),
            batch_size=0,
            flops_per_step=0.0,
            closed=False,
        )
        try:
            self._mm[:FILE_SIZE] = encode(self._base, 0)
            os.replace(tmp, path)
        except BaseException:
            self.close()
            _unlink_quietly(tmp)
            raise

    def publish(
        self,
        steps: int,
        wait_ns: int,
        step_ns: int,
        *,
        batch_size: int = 0,
        flops_per_step: float = 0.0,
        device_uuids: tuple[str, ...] = (),
        closed: bool = False,
        cgroup_throttled_ns: int | None = None,
        cgroup_limit_millicores: int | None = None,
        cgroup_id: int | None = None,
        rank: int | None = None,
        local_rank: int | None = None,
        world_size: int | None = None,
        collectives: tuple[int, int, int, int] | None = None,
        memory: tuple[int, int, int, int] | None = None,
        process: tuple[int, int, int, int, int, int] | None = None,
        loader_kills: tuple[int, int] | None = None,
        run_queue: tuple[int, int] | None = None,
        goodput: tuple[int, int, int, int, int] | None = None,
        checkpoints: tuple[int, int, int, int, int] | None = None,
        measured_flops: tuple[float, int, int] | None = None,
        flops_reason: tuple[int, str] | None = None,
        progress: tuple[int, int, int, int, str, str] | None = None,
        loader_settings: tuple[int, int | None, bool | None, bool | None] | None = None,
        matmul_precision: int | None = None,
    ) -> None:
        """Publishes one update; each tuple is its ``ProbeRecord`` fields in order (``collectives``:
        count, ns, exposed ns, bytes; ``memory``: usage, limit (0 = none), OOM kills, cgroup id;
        ``process``, ``loader_kills``, ``run_queue``, ``goodput`` (its last: the FLOP counting
        state), ``checkpoints``, ``measured_flops``, ``flops_reason``, ``progress``,
        ``loader_settings`` (num_workers, prefetch_factor, pin_memory, persistent_workers), the
        same way: the table in the module docstring); None = unknown."""
        # The payload is packed into a scratch image first, so the odd (busy) window covers one copy.
        known = cgroup_throttled_ns is not None
        published = _published(
            collectives=collectives,
            memory=memory,
            process=process,
            loader_kills=loader_kills,
            run_queue=run_queue,
            goodput=goodput,
            checkpoints=checkpoints,
            measured_flops=measured_flops,
            flops_reason=flops_reason,
            progress=progress,
            loader_settings=loader_settings,
        )
        _pack_payload(
            self._scratch,
            ProbeRecord(
                pid=self._base.pid,
                start_time_ns=self._base.start_time_ns,
                steps=steps,
                wait_ns=wait_ns,
                step_ns=step_ns,
                last_update_ns=time.time_ns(),
                batch_size=batch_size,
                flops_per_step=flops_per_step,
                closed=closed,
                device_uuids=device_uuids,
                cgroup_throttled_ns=cgroup_throttled_ns,
                cgroup_limit_millicores=cgroup_limit_millicores if known else None,
                cgroup_id=cgroup_id if known else None,
                rank=rank,
                local_rank=local_rank,
                world_size=world_size,
                matmul_precision=matmul_precision,
                **published,
            ),
        )
        mm = self._mm
        self._seq += 1
        _SEQ.pack_into(mm, _SEQ_OFFSET, self._seq)
        mm[_PAYLOAD_OFFSET:FILE_SIZE] = self._scratch_view
        self._seq += 1
        _SEQ.pack_into(mm, _SEQ_OFFSET, self._seq)

    def close(self) -> None:
        with contextlib.suppress(BufferError, ValueError):
            self._mm.close()
        with contextlib.suppress(BufferError, ValueError):
            self._scratch_view.release()
