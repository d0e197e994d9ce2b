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
92     4      u32     flags (bit 0: the writer closed the file cleanly)
96     32     -       reserved, zero
128    8 x 48 8 x 48s device UUIDs, NUL-padded ASCII (``GPU-…``)
====== ====== ======= ==========================================================

Seqlock protocol: the writer increments ``sequence`` to an odd value, writes
the payload, then increments it to the next even value. A reader reads the
sequence, the payload, and the sequence again; the read is valid only if both
sequences are equal and even. Readers retry a few times and otherwise report
the file as busy. Counters are cumulative, so a missed sample never loses time.

Standard library only: this module is imported inside training processes.
"""

from __future__ import annotations

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
FILE_PREFIX: Final = "probe-"
FILE_SUFFIX: Final = ".bin"

_HEADER = struct.Struct("<8sII")  # magic, version, size
_SEQ = struct.Struct("<Q")
_PAYLOAD = struct.Struct("<QQQQQQQdII")  # pid .. flags (offset 24..96)
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

    @property
    def wait_seconds(self) -> float:
        return self.wait_ns / 1e9

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
        FLAG_CLOSED if record.closed else 0,
    )
    for i in range(MAX_DEVICES):
        raw = uuids[i].encode("ascii", "replace")[: UUID_BYTES - 1] if i < len(uuids) else b""
        off = _DEVICES_OFFSET + i * UUID_BYTES
        buf[off : off + UUID_BYTES] = raw.ljust(UUID_BYTES, b"\0")


def decode(data: bytes) -> tuple[int, ProbeRecord]:
    """Parse one file image; returns ``(sequence, record)``. Raises ProbeFormatError."""
    if len(data) < FILE_SIZE:
        raise ProbeFormatError(f"truncated: {len(data)} bytes, expected {FILE_SIZE}")
    magic, version, size = _HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise ProbeFormatError(f"bad magic {magic!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise ProbeFormatError(f"unsupported layout version {version}, this reader knows {VERSION}")
    if size != FILE_SIZE:
        raise ProbeFormatError(f"bad size field {size}, expected {FILE_SIZE}")
    (sequence,) = _SEQ.unpack_from(data, _SEQ_OFFSET)
    pid, start, steps, wait, step, last, batch, flops, n_dev, flags = _PAYLOAD.unpack_from(
        data, _PAYLOAD_OFFSET
    )
    if n_dev > MAX_DEVICES:
        raise ProbeFormatError(f"device count {n_dev} exceeds {MAX_DEVICES}")
    if flops != flops or flops < 0:  # NaN or negative
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
    )


def read_file(path: str, retries: int = 50) -> ProbeRecord:
    """One consistent read of the probe file at ``path`` under the seqlock.

    Raises ``OSError`` when the file cannot be read and ``ProbeFormatError`` when
    its content is not a valid probe record (or stays torn after ``retries``).
    """
    with open(path, "rb") as fh:
        for _ in range(max(1, retries)):
            fh.seek(0)
            data = fh.read(FILE_SIZE)
            seq1, record = decode(data)
            if seq1 % 2:
                time.sleep(0)
                continue
            fh.seek(_SEQ_OFFSET)
            seq2_raw = fh.read(_SEQ.size)
            if len(seq2_raw) == _SEQ.size and _SEQ.unpack(seq2_raw)[0] == seq1:
                return record
    raise ProbeFormatError(f"{path}: writer busy (torn read after {retries} tries)")


class ProbeWriter:
    """Publishes cumulative counters to a probe file through ``mmap``.

    Not thread-safe on its own: one writer per process, called from one thread
    at a time (the probe serialises calls).
    """

    def __init__(self, path: str, pid: int, start_time_ns: int | None = None) -> None:
        self.path = path
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, FILE_SIZE)
            self._mm = mmap.mmap(fd, FILE_SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self._seq = 0
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
        self._mm[:FILE_SIZE] = encode(self._base, 0)

    def publish(
        self,
        steps: int,
        wait_ns: int,
        step_ns: int,
        batch_size: int = 0,
        flops_per_step: float = 0.0,
        device_uuids: tuple[str, ...] = (),
        closed: bool = False,
    ) -> None:
        mm = self._mm
        self._seq += 1
        _SEQ.pack_into(mm, _SEQ_OFFSET, self._seq)
        _pack_payload(
            mm,
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
            ),
        )
        self._seq += 1
        _SEQ.pack_into(mm, _SEQ_OFFSET, self._seq)

    def close(self) -> None:
        try:
            self._mm.close()
        except (BufferError, ValueError):
            pass
