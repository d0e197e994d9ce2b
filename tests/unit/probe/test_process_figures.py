"""The probe publishes its process's CPU time and memory and its workers' (flag bit 4, 592..632).

A Pod that keeps ``shareProcessNamespace: false`` gives the sidecar no view of the training
processes, so the probe reads ``/proc/self`` and its children itself (``dam_probe.process``).
"""

from __future__ import annotations

import json
import os
import struct
import time
from pathlib import Path

import pytest

from dam_probe import layout
from dam_probe.layout import FLAG_PROCESS, ProbeRecord, decode, encode, probe_files, read_file
from dam_probe.process import REFRESH_NS, RETRY_NS, ProcessReader, pid_namespace

from .conftest import python_env, run_python, small_record

TICK_NS = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def _stat(  # noqa: PLR0917 (the fields of /proc/<pid>/stat, in their order)
    pid: int, ppid: int, state: str, utime: int, stime: int, cutime: int = 0, cstime: int = 0
) -> str:
    # Fields 1..22; the command name holds a space and a parenthesis, as real ones may.
    rest = [state, str(ppid)] + ["0"] * 9 + [str(utime), str(stime), str(cutime), str(cstime)] + ["0"] * 7
    return f"{pid} (py thon) x) " + " ".join(rest) + "\n"


def _proc(root: Path, pid: int, stat: str, rss_pages: int, children: list[int] | None) -> None:
    d = root / str(pid)
    (d / "task" / str(pid)).mkdir(parents=True)
    (d / "stat").write_text(stat)
    (d / "statm").write_text(f"1000 {rss_pages} 0 0 0 0 0\n")
    if children is not None:
        (d / "task" / str(pid) / "children").write_text(" ".join(map(str, children)) + " ")


def test_the_reader_sums_the_process_its_live_workers_and_the_workers_it_reaped(tmp_path: Path) -> None:
    # Main 10 (utime 100 + stime 20; reaped children 30 + 5), workers 11 and 12 (12 has a child 13),
    # a zombie 14 not yet reaped (its own times only, no RSS, not a live worker).
    _proc(tmp_path, 10, _stat(10, 1, "R", 100, 20, 30, 5), 500, [11, 12, 14])
    _proc(tmp_path, 11, _stat(11, 10, "S", 40, 2), 100, [])
    _proc(tmp_path, 12, _stat(12, 10, "R", 7, 1, 3, 0), 50, [13])
    _proc(tmp_path, 13, _stat(13, 12, "R", 4, 0), 25, [])
    _proc(tmp_path, 14, _stat(14, 10, "Z", 9, 1), 0, [])
    figures = ProcessReader(str(tmp_path), pid=10).read(0)
    assert figures is not None
    main_ns, worker_ns, main_rss, worker_rss, workers, _ = figures
    assert main_ns == 120 * TICK_NS
    assert worker_ns == (35 + 42 + 11 + 4 + 10) * TICK_NS
    assert (main_rss, worker_rss, workers) == (500 * PAGE, 175 * PAGE, 3)


def test_without_a_children_file_the_workers_are_found_by_their_parent_pid(tmp_path: Path) -> None:
    _proc(tmp_path, 20, _stat(20, 1, "R", 10, 0), 10, None)
    _proc(tmp_path, 21, _stat(21, 20, "S", 5, 5), 10, None)
    _proc(tmp_path, 22, _stat(22, 1, "S", 99, 0), 10, None)  # not a child
    figures = ProcessReader(str(tmp_path), pid=20).read(0)
    assert figures is not None and figures[1] == 10 * TICK_NS and figures[4] == 1


def test_cpu_time_never_goes_down_when_a_worker_ends_between_two_reads(tmp_path: Path) -> None:
    _proc(tmp_path, 30, _stat(30, 1, "R", 10, 0), 10, [31])
    _proc(tmp_path, 31, _stat(31, 30, "R", 50, 0), 10, [])
    reader = ProcessReader(str(tmp_path), pid=30)
    first = reader.read(0)
    # The worker ended and the read caught it neither alive nor in cutime yet (the parent had not reaped it).
    (tmp_path / "30" / "task" / "30" / "children").write_text("")
    second = reader.read(REFRESH_NS)
    # Then it was reaped: its time is in the parent's cutime.
    (tmp_path / "30" / "stat").write_text(_stat(30, 1, "R", 12, 0, 50, 0))
    third = reader.read(2 * REFRESH_NS)
    assert first is not None and second is not None and third is not None
    assert (first[1], second[1], third[1]) == (50 * TICK_NS, 50 * TICK_NS, 50 * TICK_NS)
    assert (second[4], third[0]) == (0, 12 * TICK_NS)


def test_the_figures_are_read_at_most_once_a_second_and_a_failure_is_retried_rarely(tmp_path: Path) -> None:
    _proc(tmp_path, 40, _stat(40, 1, "R", 10, 0), 10, [])
    reader = ProcessReader(str(tmp_path), pid=40)
    assert reader.read(0) is not None
    (tmp_path / "40" / "stat").write_text(_stat(40, 1, "R", 99, 0))
    assert reader.read(REFRESH_NS - 1) == reader.read(0)  # cached
    assert reader.read(REFRESH_NS)[0] == 99 * TICK_NS  # type: ignore[index]
    (tmp_path / "40" / "stat").write_text("garbage")
    assert reader.read(2 * REFRESH_NS) is None
    (tmp_path / "40" / "stat").write_text(_stat(40, 1, "R", 100, 0))
    assert reader.read(2 * REFRESH_NS + RETRY_NS - 1) is None
    assert reader.read(2 * REFRESH_NS + RETRY_NS) is not None


def test_the_process_figures_round_trip_and_need_their_flag_bit() -> None:
    rec = small_record(
        batch_size=7,
        process_cpu_ns=11,
        worker_cpu_ns=12,
        process_rss_bytes=13,
        worker_rss_bytes=14,
        workers=2,
        pid_namespace=4026531836,
    )
    image = bytearray(encode(rec))
    assert decode(bytes(image))[1] == rec
    flags_at = 92
    (flags,) = struct.unpack_from("<I", image, flags_at)
    assert flags & FLAG_PROCESS
    # A writer that did not know them (flag clear) reads as unknown, never as zero, whatever the bytes.
    struct.pack_into("<I", image, flags_at, flags & ~FLAG_PROCESS)
    got = decode(bytes(image))[1]
    assert (got.process_cpu_ns, got.worker_cpu_ns, got.workers, got.pid_namespace) == (None,) * 4
    assert struct.unpack_from("<Q", image, 592) == (11,) and struct.unpack_from("<II", image, 624) == (
        2,
        4026531836,
    )
    with pytest.raises(ValueError, match="need process_cpu_ns"):
        ProbeRecord(**{**rec.__dict__, "process_cpu_ns": None})


def test_a_version_one_file_has_no_process_figures() -> None:
    rec = small_record(version=1)
    assert decode(encode(rec))[1].process_cpu_ns is None
    assert layout.SIZES[1] == 512


def test_a_training_process_publishes_its_own_and_its_dataloader_workers_cpu_and_memory(
    tmp_path: Path,
) -> None:
    """Real PyTorch, two DataLoader workers that burn CPU: the file says what /proc says."""
    probes = tmp_path / "probes"
    out = tmp_path / "seen.json"
    code = f"""
        import json, os, time, torch
        from torch.utils.data import DataLoader, Dataset
        import dam_probe

        class Busy(Dataset):
            def __len__(self):
                return 400
            def __getitem__(self, i):
                t = time.process_time()
                while time.process_time() - t < 0.01:
                    pass
                return torch.zeros(4)

        loader = DataLoader(Busy(), batch_size=4, num_workers=2, persistent_workers=True)
        ticks = os.sysconf("SC_CLK_TCK")
        seen = None
        for i, _ in enumerate(dam_probe.instrument(loader)):
            if i == 80:
                kids = [int(p) for p in open(f"/proc/self/task/{{os.getpid()}}/children").read().split()]
                cpu = lambda pid: sum(  # noqa: E731
                    int(f) for f in open(f"/proc/{{pid}}/stat").read().rsplit(")", 1)[1].split()[11:13]
                )
                time.sleep(1.1)  # the next publish re-reads /proc
                seen = {{"kids": len(kids), "worker_cpu_ns": sum(cpu(k) for k in kids) * 10**9 // ticks,
                         "main_cpu_ns": cpu(os.getpid()) * 10**9 // ticks}}
            if i == 81:
                from dam_probe.layout import probe_files, read_file
                rec = read_file(probe_files(os.environ["DAM_PROBE_DIR"])[0])
                seen.update(published=[rec.process_cpu_ns, rec.worker_cpu_ns, rec.process_rss_bytes,
                                       rec.worker_rss_bytes, rec.workers, rec.pid_namespace])
        json.dump(seen, open({str(out)!r}, "w"))
    """
    started = time.monotonic()
    done = run_python(code, python_env(DAM_PROBE_DIR=str(probes)), timeout=180)
    assert done.returncode == 0, done.stderr
    seen = json.loads(out.read_text())
    main_ns, worker_ns, main_rss, worker_rss, workers, pid_ns = seen["published"]
    assert workers == seen["kids"] == 2
    # Each worker burned ~10 ms of CPU per item for 300+ items before the read: seconds, not zero.
    assert worker_ns >= 0.9 * seen["worker_cpu_ns"] > 0.5e9
    assert main_ns >= 0.9 * seen["main_cpu_ns"] > 0
    assert main_rss > 50 * 2**20 and worker_rss > 2 * 20 * 2**20  # torch is imported in each
    assert pid_ns == pid_namespace()
    assert time.monotonic() - started < 180
    rec = read_file(probe_files(str(probes))[0])
    assert rec.closed and rec.worker_cpu_ns is not None and rec.worker_cpu_ns >= worker_ns
