"""The probe file format: encoding, decoding, rejection of bad files, directory reads."""

from __future__ import annotations

import functools
import math
import os
import struct
from dataclasses import replace
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
# The rest of a record from the field table itself (layout.FIELDS): each flag group all known or
# all unknown, each field drawn by its struct code and read back as the table reads it, so a field
# added to the table is in this round trip with no edit here.
_ASCII = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126))
_BY_CODE: dict[str, st.SearchStrategy[object]] = {
    "Q": U64,
    "I": st.integers(min_value=0, max_value=2**32 - 1),
    "i": st.integers(min_value=0, max_value=2**31 - 1),
    "H": st.integers(min_value=0, max_value=2**16 - 1),
    "B": st.one_of(st.none(), st.booleans()),
    "d": st.floats(min_value=0, allow_nan=False, allow_infinity=False),
}


def _drawn(f: layout.Field) -> st.SearchStrategy[object]:
    raw = _BY_CODE[f.code] if f.code in _BY_CODE else _ASCII.map(lambda text: text[: f.packer.size - 1])
    return raw.map(lambda value: f.get(f.packer.unpack(f.packer.pack(f.put(value)))[0]))


def _one(name: str, value: object) -> dict[str, object]:
    return {name: value}


def _whole(names: list[str], values: tuple[object, ...]) -> dict[str, object]:
    return dict(zip(names, values, strict=True))


def _merged(parts: tuple[dict[str, object], ...]) -> dict[str, object]:
    return {k: v for part in parts for k, v in part.items()}


def _table_fields() -> st.SearchStrategy[dict[str, object]]:
    groups: dict[int, list[layout.Field]] = {}
    for f in layout.FIELDS:
        groups.setdefault(f.flag, []).append(f)
    parts: list[st.SearchStrategy[dict[str, object]]] = []
    for flag, members in groups.items():
        if flag == 0:  # known one by one (the rank fields: -1 is unknown)
            parts += [st.one_of(st.none(), _drawn(f)).map(functools.partial(_one, f.name)) for f in members]
        else:  # a group is published whole or not at all
            whole = st.tuples(*(_drawn(f) for f in members)).map(
                functools.partial(_whole, [f.name for f in members])
            )
            parts.append(st.one_of(st.just({}), whole))
    return st.tuples(*parts).map(_merged)


RECORDS_ANY = st.builds(lambda record, extra: replace(record, **extra), RECORDS, _table_fields())


@settings(max_examples=150, deadline=None)
@given(record=RECORDS_ANY, seq=U64)
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
    with pytest.raises(ProbeFormatError, match=r"truncated: 100 bytes, expected 1024"):
        decode(image[:100])
    v1 = encode(replace(_record(), version=1))
    with pytest.raises(ProbeFormatError, match=r"truncated: 300 bytes, expected 512"):
        decode(v1[:300])


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
    with pytest.raises(
        ProbeFormatError, match=rf"unsupported layout version {layout.VERSION + 1}.*knows 1, 2"
    ):
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


# --- the cgroup fields (offsets 96..120, flag bit 1) ------------------------------------------


def test_cgroup_fields_sit_at_the_documented_offsets_with_flag_bit_1() -> None:
    rec = _record(cgroup_throttled_ns=2_500_000_000, cgroup_limit_millicores=1500, cgroup_id=77)
    image = encode(rec)
    assert struct.unpack_from("<QQQ", image, 96) == (2_500_000_000, 1500, 77)
    (flags,) = struct.unpack_from("<I", image, 92)
    assert flags & layout.FLAG_CGROUP and not flags & layout.FLAG_CLOSED
    assert image[120:128] == bytes(8)
    _, back = decode(image)
    assert back.cgroup_throttled_seconds == pytest.approx(2.5)
    assert back.cgroup_limit_cores == pytest.approx(1.5)


def test_a_record_without_cgroup_fields_leaves_the_reserved_bytes_zero_and_reads_as_unknown() -> None:
    image = encode(_record(closed=True))
    assert image[96:128] == bytes(32)
    _, back = decode(image)
    assert (back.cgroup_throttled_ns, back.cgroup_limit_millicores, back.cgroup_id) == (None, None, None)
    assert back.cgroup_throttled_seconds is None and back.cgroup_limit_cores is None
    assert back.closed


def test_values_in_the_cgroup_bytes_are_ignored_while_flag_bit_1_is_clear() -> None:
    image = bytearray(encode(_record(cgroup_throttled_ns=5, cgroup_limit_millicores=2000, cgroup_id=3)))
    (flags,) = struct.unpack_from("<I", image, 92)
    struct.pack_into("<I", image, 92, flags & ~layout.FLAG_CGROUP)
    _, back = decode(bytes(image))
    assert back.cgroup_throttled_ns is None and back.cgroup_limit_cores is None


def test_an_old_format_file_written_before_the_cgroup_fields_reads_as_unknown(tmp_path: Path) -> None:
    # What the layout produced before offsets 96..120 were defined, byte by byte.
    old = bytearray(layout.V1_FILE_SIZE)
    struct.pack_into("<8sIIQ", old, 0, b"DAMPROBE", 1, layout.V1_FILE_SIZE, 4)
    struct.pack_into("<QQQQQQQdII", old, 24, 9, 1, 10, 20, 30, 40, 8, 0.0, 0, layout.FLAG_CLOSED)
    path = tmp_path / "probe-9.bin"
    path.write_bytes(bytes(old))
    rec = read_file(str(path))
    assert (rec.pid, rec.steps, rec.wait_ns, rec.step_ns, rec.closed) == (9, 10, 20, 30, True)
    assert rec.cgroup_throttled_ns is None and rec.cgroup_id is None and rec.cgroup_limit_cores is None


def test_no_limit_is_zero_millicores_and_reads_as_no_limit_cores() -> None:
    _, back = decode(encode(_record(cgroup_throttled_ns=0, cgroup_limit_millicores=0, cgroup_id=1)))
    assert back.cgroup_throttled_seconds == 0.0
    assert back.cgroup_limit_millicores == 0 and back.cgroup_limit_cores is None


def test_a_cgroup_limit_without_throttled_time_is_refused() -> None:
    with pytest.raises(ValueError, match="need cgroup_throttled_ns"):
        _record(cgroup_limit_millicores=1000)


def test_writer_publishes_the_cgroup_fields_and_clears_them_again(tmp_path: Path) -> None:
    path = str(tmp_path / "probe-42.bin")
    writer = ProbeWriter(path, pid=42, start_time_ns=5)
    try:
        assert read_file(path).cgroup_throttled_ns is None
        writer.publish(1, 2, 3, cgroup_throttled_ns=700, cgroup_limit_millicores=250, cgroup_id=9)
        known = read_file(path)
        writer.publish(2, 3, 4)
        unknown = read_file(path)
    finally:
        writer.close()
    assert (known.cgroup_throttled_ns, known.cgroup_limit_millicores, known.cgroup_id) == (700, 250, 9)
    assert unknown.steps == 2 and unknown.cgroup_throttled_ns is None and unknown.cgroup_id is None


# --- layout version 2: rank identity, collectives, memory (offsets 512..592) --------------------


def test_v2_fields_sit_at_the_documented_offsets_with_their_flag_bits() -> None:
    rec = _record(
        rank=3,
        local_rank=1,
        world_size=8,
        collectives=40,
        collective_ns=5_000,
        collective_exposed_ns=1_000,
        collective_bytes=4096,
        memory_usage_bytes=2**30,
        memory_limit_bytes=2**31,
        oom_kills=2,
        memory_cgroup_id=99,
    )
    image = encode(rec)
    assert len(image) == FILE_SIZE == 1024
    assert struct.unpack_from("<8sII", image, 0) == (b"DAMPROBE", 2, 1024)
    assert struct.unpack_from("<iiiI", image, 512) == (3, 1, 8, 0)
    assert struct.unpack_from("<QQQQ", image, 528) == (40, 5_000, 1_000, 4096)
    assert struct.unpack_from("<QQQQ", image, 560) == (2**30, 2**31, 2, 99)
    assert image[592:] == bytes(1024 - 592)
    (flags,) = struct.unpack_from("<I", image, 92)
    assert flags & layout.FLAG_MEMORY and flags & layout.FLAG_COLLECTIVES
    _, back = decode(image)
    assert back == rec
    assert back.collective_seconds == pytest.approx(5e-6)
    assert back.collective_exposed_seconds == pytest.approx(1e-6)


def test_unknown_v2_fields_are_minus_one_or_flagged_off_and_read_as_none() -> None:
    image = encode(_record())
    assert struct.unpack_from("<iii", image, 512) == (-1, -1, -1)
    (flags,) = struct.unpack_from("<I", image, 92)
    assert not flags & (layout.FLAG_MEMORY | layout.FLAG_COLLECTIVES)
    _, back = decode(image)
    assert (back.rank, back.local_rank, back.world_size) == (None, None, None)
    assert back.collectives is None and back.collective_ns is None and back.collective_seconds is None
    assert back.memory_usage_bytes is None and back.oom_kills is None


def test_values_in_the_v2_bytes_are_ignored_while_their_flag_bits_are_clear() -> None:
    image = bytearray(encode(_record(collectives=1, collective_ns=2, memory_usage_bytes=3, oom_kills=4)))
    (flags,) = struct.unpack_from("<I", image, 92)
    struct.pack_into("<I", image, 92, flags & ~(layout.FLAG_MEMORY | layout.FLAG_COLLECTIVES))
    _, back = decode(bytes(image))
    assert back.collectives is None and back.memory_usage_bytes is None and back.oom_kills is None


def test_a_version_1_file_still_reads_and_its_new_fields_are_unknown(tmp_path: Path) -> None:
    # A version-1 file as the previous probe wrote it, byte by byte: 512 bytes, version 1.
    old = bytearray(512)
    struct.pack_into("<8sIIQ", old, 0, b"DAMPROBE", 1, 512, 2)
    struct.pack_into("<QQQQQQQdIIQQQ", old, 24, 9, 1, 10, 20, 30, 40, 8, 0.0, 0, 2, 500, 1000, 7)
    path = tmp_path / "probe-9.bin"
    path.write_bytes(bytes(old))
    rec = read_file(str(path))
    assert rec.version == 1
    assert (rec.pid, rec.steps, rec.wait_ns, rec.step_ns, rec.batch_size) == (9, 10, 20, 30, 8)
    assert (rec.cgroup_throttled_ns, rec.cgroup_limit_millicores, rec.cgroup_id) == (500, 1000, 7)
    assert (rec.rank, rec.local_rank, rec.world_size) == (None, None, None)
    assert rec.collectives is None and rec.memory_usage_bytes is None
    # The fixture encoder writes the same bytes for a version-1 record.
    assert encode(replace(rec, last_update_ns=40), 2) == bytes(old)


def test_a_version_1_record_drops_the_version_2_fields_when_encoded() -> None:
    image = encode(_record(rank=2, collectives=5, collective_ns=1, version=1))
    assert len(image) == 512
    _, back = decode(image)
    assert back.version == 1 and back.rank is None and back.collectives is None


def test_a_version_2_file_cut_to_the_version_1_size_is_truncated_not_misread(tmp_path: Path) -> None:
    path = tmp_path / "probe-5.bin"
    path.write_bytes(encode(_record())[:512])
    with pytest.raises(ProbeFormatError, match="truncated: 512 bytes, expected 1024"):
        read_file(str(path))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"collective_ns": 1}, "need collectives"),
        ({"oom_kills": 1}, "need memory_usage_bytes"),
        ({"rank": -2}, "rank must be between"),
        ({"world_size": 2**31}, "world_size must be between"),
        ({"version": 3}, "unknown layout version"),
    ],
)
def test_inconsistent_v2_records_are_refused(fields: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _record(**fields)


def test_writer_publishes_rank_collectives_and_memory(tmp_path: Path) -> None:
    path = str(tmp_path / "probe-42.bin")
    writer = ProbeWriter(path, pid=42, start_time_ns=5)
    try:
        writer.publish(
            1, 2, 3, rank=0, local_rank=0, world_size=2, collectives=(4, 5, 6, 7), memory=(8, 0, 1, 9)
        )
        rec = read_file(path)
        writer.publish(2, 3, 4)
        cleared = read_file(path)
    finally:
        writer.close()
    assert (rec.rank, rec.local_rank, rec.world_size) == (0, 0, 2)
    assert (rec.collectives, rec.collective_ns, rec.collective_exposed_ns, rec.collective_bytes) == (
        4,
        5,
        6,
        7,
    )
    assert (rec.memory_usage_bytes, rec.memory_limit_bytes, rec.oom_kills, rec.memory_cgroup_id) == (
        8,
        0,
        1,
        9,
    )
    assert cleared.rank is None and cleared.collectives is None and cleared.memory_usage_bytes is None
    assert os.path.getsize(path) == 1024
