"""The probe file format: encoding, decoding, rejection of bad files, directory reads."""

from __future__ import annotations

import math
import os
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dam_probe import layout
from dam_probe.layout import (
    FILE_SIZE,
    MAX_DEVICES,
    ProbeFormatError,
    ProbeRecord,
    ProbeWriter,
    decode,
    encode,
    probe_files,
    read_all,
    read_file,
)

U64 = st.integers(min_value=0, max_value=2**64 - 1)
UUID = st.text(alphabet="0123456789abcdef-", min_size=1, max_size=40).map(lambda s: f"GPU-{s}")


def _record(**overrides: object) -> ProbeRecord:
    base: dict[str, object] = {
        "pid": 1234,
        "start_time_ns": 1_700_000_000_000_000_000,
        "steps": 10,
        "wait_ns": 2_000_000,
        "step_ns": 9_000_000,
        "last_update_ns": 1_700_000_001_000_000_000,
        "batch_size": 32,
        "flops_per_step": 1.5e12,
        "closed": False,
        "device_uuids": ("GPU-11111111-2222-3333-4444-555555555555",),
    }
    base.update(overrides)
    return ProbeRecord(**base)  # type: ignore[arg-type]


RECORDS = st.builds(
    ProbeRecord,
    pid=U64,
    start_time_ns=U64,
    steps=U64,
    wait_ns=U64,
    step_ns=U64,
    last_update_ns=U64,
    batch_size=U64,
    flops_per_step=st.floats(min_value=0, allow_nan=False, allow_infinity=False),
    closed=st.booleans(),
    device_uuids=st.lists(UUID, max_size=MAX_DEVICES).map(tuple),
)


@settings(max_examples=150, deadline=None)
@given(record=RECORDS, seq=U64)
def test_every_record_survives_an_encode_decode_round_trip(record: ProbeRecord, seq: int) -> None:
    image = encode(record, seq)
    assert len(image) == FILE_SIZE
    assert decode(image) == (seq, record)


def test_device_uuids_beyond_the_limit_are_dropped_not_corrupting_the_file() -> None:
    uuids = tuple(f"GPU-{i}" for i in range(MAX_DEVICES + 3))
    _, back = decode(encode(_record(device_uuids=uuids)))
    assert back.device_uuids == uuids[:MAX_DEVICES]


def test_truncated_file_is_rejected_with_its_length() -> None:
    image = encode(_record())
    with pytest.raises(ProbeFormatError, match=r"truncated: 100 bytes, expected 512"):
        decode(image[:100])


def test_garbage_is_rejected_as_bad_magic() -> None:
    with pytest.raises(ProbeFormatError, match="bad magic"):
        decode(os.urandom(FILE_SIZE))


def test_wrong_magic_is_rejected_naming_the_expected_magic() -> None:
    image = bytearray(encode(_record()))
    image[:8] = b"NOTAPROB"
    with pytest.raises(ProbeFormatError, match=r"bad magic b'NOTAPROB', expected b'DAMPROBE'"):
        decode(bytes(image))


def test_wrong_version_is_rejected_naming_both_versions() -> None:
    image = bytearray(encode(_record()))
    struct.pack_into("<I", image, 8, layout.VERSION + 1)
    with pytest.raises(ProbeFormatError, match=rf"unsupported layout version {layout.VERSION + 1}.*knows 1"):
        decode(bytes(image))


def test_wrong_size_field_is_rejected() -> None:
    image = bytearray(encode(_record()))
    struct.pack_into("<I", image, 12, 4096)
    with pytest.raises(ProbeFormatError, match="bad size field 4096"):
        decode(bytes(image))


def test_device_count_above_the_maximum_is_rejected() -> None:
    image = bytearray(encode(_record()))
    struct.pack_into("<I", image, 88, MAX_DEVICES + 1)
    with pytest.raises(ProbeFormatError, match="device count 9 exceeds 8"):
        decode(bytes(image))


@pytest.mark.parametrize("flops", [math.nan, -1.0])
def test_invalid_flops_are_rejected(flops: float) -> None:
    image = bytearray(encode(_record()))
    struct.pack_into("<d", image, 80, flops)
    with pytest.raises(ProbeFormatError, match="invalid flops_per_step"):
        decode(bytes(image))


def test_writer_publishes_what_read_file_returns(tmp_path: Path) -> None:
    path = str(tmp_path / "probe-42.bin")
    writer = ProbeWriter(path, pid=42, start_time_ns=5)
    try:
        first = read_file(path)
        assert (first.pid, first.start_time_ns, first.steps, first.closed) == (42, 5, 0, False)
        writer.publish(7, 70, 700, batch_size=3, flops_per_step=2.0, device_uuids=("GPU-a",), closed=True)
        rec = read_file(path)
    finally:
        writer.close()
    assert (rec.steps, rec.wait_ns, rec.step_ns, rec.batch_size) == (7, 70, 700, 3)
    assert (rec.flops_per_step, rec.device_uuids, rec.closed) == (2.0, ("GPU-a",), True)
    assert rec.last_update_ns >= first.last_update_ns
    assert os.path.getsize(path) == FILE_SIZE
    assert sorted(os.listdir(tmp_path)) == ["probe-42.bin"]  # no temporary file left behind


def test_record_stuck_mid_update_reads_as_busy_not_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "probe-1.bin"
    path.write_bytes(encode(_record(), sequence=7))  # odd sequence: the writer never finished
    with pytest.raises(ProbeFormatError, match="writer busy"):
        read_file(str(path), retries=3)


def test_missing_file_raises_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_file(str(tmp_path / "probe-9.bin"))


def test_probe_files_lists_only_probe_files_ordered_by_pid(tmp_path: Path) -> None:
    for name in ["probe-100.bin", "probe-9.bin", "probe-x.bin", "other.bin", ".probe-5.bin.5.tmp"]:
        (tmp_path / name).write_bytes(b"")
    assert probe_files(str(tmp_path)) == [str(tmp_path / "probe-9.bin"), str(tmp_path / "probe-100.bin")]
    assert probe_files(str(tmp_path / "missing")) == []


def test_read_all_returns_good_records_and_collects_each_bad_file(tmp_path: Path) -> None:
    good = _record(pid=3)
    (tmp_path / "probe-3.bin").write_bytes(encode(good))
    (tmp_path / "probe-4.bin").write_bytes(b"DAMPROBE")
    (tmp_path / "probe-5.bin").write_bytes(os.urandom(FILE_SIZE))
    scan = read_all(str(tmp_path))
    assert scan.records == {str(tmp_path / "probe-3.bin"): good}
    assert set(scan.errors) == {str(tmp_path / "probe-4.bin"), str(tmp_path / "probe-5.bin")}
    assert "truncated" in str(scan.errors[str(tmp_path / "probe-4.bin")])
    assert "bad magic" in str(scan.errors[str(tmp_path / "probe-5.bin")])


def test_read_all_of_a_missing_directory_reports_the_directory(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope")
    scan = read_all(missing)
    assert scan.records == {}
    assert isinstance(scan.errors[missing], FileNotFoundError)
