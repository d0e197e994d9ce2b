"""The probe file: a versioned, fixed-size binary record guarded by a sequence lock.

One file per instrumented process, ``$DAM_PROBE_DIR/probe-<pid>.bin``, exactly
``FILE_SIZE`` bytes, little-endian:

====== ====== ======= ==========================================================
offset size   type    field
====== ====== ======= ==========================================================
0      8      8s      magic ``b"DAMPROBE"``
8      4      u32     layout version (``VERSION``)
12     4      u32     file size in bytes (``FILE_SIZE``)
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
                      bit 1: the three cgroup fields below are valid)
96     8      u64     CFS throttled time of the process's own cgroup, ns, cumulative
                      as the kernel reports it (valid only with flag bit 1)
104    8      u64     CPU limit of that cgroup in millicores (0 = no limit)
112    8      u64     id of that cgroup: inode of its directory (0 = unknown)
120    8      -       reserved, zero
128    8 x 48 8 x 48s device UUIDs, NUL-padded ASCII (``GPU-…``)
====== ====== ======= ==========================================================

Seqlock protocol: the writer increments ``sequence`` to an odd value, writes
the payload, then increments it to the next even value. A reader reads the
sequence, the payload, and the sequence again; the read is valid only if both
sequences are equal and even. Readers retry a few times and otherwise report
the file as busy. Counters are cumulative, so a missed sample never loses time.

The cgroup fields (offsets 96..120) were reserved zero bytes before they were
defined; a file written without them has flag bit 1 clear and reads as
"unknown" (``None`` in ``ProbeRecord``), so the layout version stays 1.

Standard library only: this module is imported inside training processes.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import struct
import time
from dataclasses import dataclass, field
from typing import Final

MAGIC: Final = b"DAMPROBE"
VERSION: Final = 1
FILE_SIZE: Final = 512
MAX_DEVICES: Final = 8
UUID_BYTES: Final = 48
FLAG_CLOSED: Final = 1
FLAG_CGROUP: Final = 2  # the cgroup fields are valid
FILE_PREFIX: Final = "probe-"
FILE_SUFFIX: Final = ".bin"

_HEADER = struct.Struct("<8sII")  # magic, version, size
_SEQ = struct.Struct("<Q")
_PAYLOAD = struct.Struct("<QQQQQQQdIIQQQ")  # pid .. cgroup id (offset 24..120)
_SEQ_OFFSET: Final = 16
_PAYLOAD_OFFSET: Final = 24
_DEVICES_OFFSET: Final = 128


class ProbeFormatError(ValueError):
    """The file is not a readable probe file (wrong magic, version, size, or torn)."""


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

    def __post_init__(self) -> None:
        known = self.cgroup_throttled_ns is not None
        if not known and (self.cgroup_limit_millicores is not None or self.cgroup_id is not None):
            raise ValueError("cgroup_limit_millicores and cgroup_id need cgroup_throttled_ns")

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


def probe_path(directory: str, pid: int) -> str:
    return os.path.join(directory, f"{FILE_PREFIX}{pid}{FILE_SUFFIX}")


def encode(record: ProbeRecord, sequence: int = 0) -> bytes:
    """The full file image of ``record`` (used by tests and fixtures)."""
    buf = bytearray(FILE_SIZE)
    _HEADER.pack_into(buf, 0, MAGIC, VERSION, FILE_SIZE)
    _SEQ.pack_into(buf, _SEQ_OFFSET, sequence)
    _pack_payload(buf, record)
    return bytes(buf)


def _pack_payload(buf: bytearray | mmap.mmap, record: ProbeRecord) -> None:
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
        (FLAG_CLOSED if record.closed else 0) | (0 if record.cgroup_throttled_ns is None else FLAG_CGROUP),
        record.cgroup_throttled_ns or 0,
        record.cgroup_limit_millicores or 0,
        record.cgroup_id or 0,
    )
    for i in range(MAX_DEVICES):
        raw = uuids[i].encode("ascii", "replace")[: UUID_BYTES - 1] if i < len(uuids) else b""
        off = _DEVICES_OFFSET + i * UUID_BYTES
        buf[off : off + UUID_BYTES] = raw.ljust(UUID_BYTES, b"\0")


def decode(data: bytes) -> tuple[int, ProbeRecord]:
    """Parse one file image; returns ``(sequence, record)``. Raises ProbeFormatError."""
    _check_header(data)
    (sequence,) = _SEQ.unpack_from(data, _SEQ_OFFSET)
    (pid, start, steps, wait, step, last, batch, flops, n_dev, flags, throttled, limit, cgroup_id) = (
        _PAYLOAD.unpack_from(data, _PAYLOAD_OFFSET)
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
    cgroup = bool(flags & FLAG_CGROUP)  # clear in files written before the cgroup fields existed
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
        cgroup_throttled_ns=throttled if cgroup else None,
        cgroup_limit_millicores=limit if cgroup else None,
        cgroup_id=cgroup_id if cgroup else None,
    )


def _check_header(data: bytes) -> None:
    if len(data) < FILE_SIZE:
        raise ProbeFormatError(f"truncated: {len(data)} bytes, expected {FILE_SIZE}")
    magic, version, size = _HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise ProbeFormatError(f"bad magic {magic!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise ProbeFormatError(f"unsupported layout version {version}, this reader knows {VERSION}")
    if size != FILE_SIZE:
        raise ProbeFormatError(f"bad size field {size}, expected {FILE_SIZE}")


def read_file(path: str, retries: int = 50) -> ProbeRecord:
    """One consistent read of the probe file at ``path`` under the seqlock.

    Raises ``OSError`` when the file cannot be read and ``ProbeFormatError`` when
    its content is not a valid probe record (or stays torn after ``retries``).

    The sequence is read on its own before and after the image: a single copy
    of the whole image is not ordered byte by byte (the kernel copies with
    fast string moves), so the sequence inside it cannot vouch for the rest.
    The payload is only validated once the reads agree, so a record caught
    mid-update is retried instead of being reported as corrupt.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        for _ in range(max(1, retries)):
            before = os.pread(fd, _SEQ.size, _SEQ_OFFSET)
            data = os.pread(fd, FILE_SIZE, 0)
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
    ) -> None:
        # The payload is packed into a scratch image first, so the odd (busy)
        # window covers one memory copy only.
        scratch = self._scratch
        _pack_payload(
            scratch,
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
                cgroup_limit_millicores=cgroup_limit_millicores if cgroup_throttled_ns is not None else None,
                cgroup_id=cgroup_id if cgroup_throttled_ns is not None else None,
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
