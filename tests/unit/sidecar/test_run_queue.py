"""Run-queue delay (``dam_process_cpu_wait_seconds_total{role}``): time the training process and its
loader workers were runnable but waited for a CPU, from ``/proc/<pid>/schedstat`` field 2, or from the
probe file (flag bit 5) for a trainer the sidecar cannot see."""

from __future__ import annotations

import os
from pathlib import Path

from dam_contract import names as n
from dam_contract.snapshot import labels_of
from dam_probe.layout import ProbeRecord, decode, encode
from dam_probe.schedstat import RunQueueReader, run_delay_ns
from dam_sidecar.collector import SidecarCollector

from .conftest import (
    OTHER_NS,
    published_collector,
    remove_proc,
    write_children,
    write_probe,
    write_proc_stat,
)


def _schedstat(proc: Path, pid: int, run_delay_s: float) -> None:
    (proc / str(pid) / "schedstat").write_text(f"123456789 {int(run_delay_s * 1e9)} 42\n")


def _waits(collector: SidecarCollector) -> dict[str, float] | None:
    collector.sample_now()
    series = collector.snapshot().series(n.PROCESS_CPU_WAIT_SECONDS_TOTAL)
    if not series:
        return None
    return {role: series[labels_of({"role": role})] for role in (n.ROLE_MAIN, n.ROLE_WORKER)}


def test_the_sidecar_reads_the_run_queue_delay_of_the_trainer_and_its_workers(tmp_path: Path) -> None:
    collector, probes, proc = published_collector(tmp_path)
    write_proc_stat(proc, 7, 1, utime=100, stime=0)
    write_proc_stat(proc, 8, 7, utime=100, stime=0)
    write_proc_stat(proc, 9, 7, utime=100, stime=0)
    write_children(proc, 7, [8, 9])
    write_probe(probes, pid=7, steps=3)
    _schedstat(proc, 7, 2.5)
    _schedstat(proc, 8, 1.0)
    _schedstat(proc, 9, 0.5)
    assert _waits(collector) == {n.ROLE_MAIN: 2.5, n.ROLE_WORKER: 1.5}


def test_a_worker_that_ended_keeps_what_it_waited(tmp_path: Path) -> None:
    collector, probes, proc = published_collector(tmp_path)
    write_proc_stat(proc, 7, 1, utime=100, stime=0)
    write_proc_stat(proc, 8, 7, utime=100, stime=0)
    write_children(proc, 7, [8])
    write_probe(probes, pid=7, steps=3)
    _schedstat(proc, 7, 1.0)
    _schedstat(proc, 8, 4.0)
    assert _waits(collector) == {n.ROLE_MAIN: 1.0, n.ROLE_WORKER: 4.0}
    remove_proc(proc, 8)
    write_children(proc, 7, [])
    _schedstat(proc, 7, 1.5)
    assert _waits(collector) == {n.ROLE_MAIN: 1.5, n.ROLE_WORKER: 4.0}


def test_no_schedstat_means_no_series_not_zero(tmp_path: Path) -> None:
    collector, probes, proc = published_collector(tmp_path)
    write_proc_stat(proc, 7, 1, utime=100, stime=0)
    write_probe(probes, pid=7, steps=3)
    assert _waits(collector) is None


def test_a_trainer_of_another_pid_namespace_is_reported_from_its_probe(tmp_path: Path) -> None:
    collector, probes, proc = published_collector(tmp_path)
    write_proc_stat(proc, 1, 0, utime=200, stime=100)
    _schedstat(proc, 1, 99.0)  # the sidecar's own pid 1: never read for the trainer
    write_probe(
        probes,
        pid=1,
        steps=5,
        process_cpu_ns=10**9,
        worker_cpu_ns=0,
        pid_namespace=OTHER_NS,
        run_queue_ns=3 * 10**9,
        worker_run_queue_ns=5 * 10**8,
    )
    assert _waits(collector) == {n.ROLE_MAIN: 3.0, n.ROLE_WORKER: 0.5}


def test_the_probe_file_round_trips_the_run_queue_delays_and_unknown_stays_unknown() -> None:
    base = {
        "pid": 1,
        "start_time_ns": 1,
        "steps": 0,
        "wait_ns": 0,
        "step_ns": 0,
        "last_update_ns": 1,
        "batch_size": 0,
        "flops_per_step": 0.0,
        "closed": False,
    }
    _, known = decode(encode(ProbeRecord(**base, run_queue_ns=7, worker_run_queue_ns=0)))  # type: ignore[arg-type]
    assert (known.run_queue_ns, known.worker_run_queue_ns) == (7, 0)
    _, unknown = decode(encode(ProbeRecord(**base)))  # type: ignore[arg-type]
    assert (unknown.run_queue_ns, unknown.worker_run_queue_ns) == (None, None)


def test_the_probe_reads_its_own_and_its_childrens_run_queue_delay(tmp_path: Path) -> None:
    me = os.getpid()
    proc = tmp_path / "proc"
    (proc / str(me) / "task" / str(me)).mkdir(parents=True)
    (proc / str(me) / "task" / str(me) / "children").write_text("50 51")
    for pid, delay in ((me, 2.0), (50, 1.0), (51, 0.25)):
        (proc / str(pid)).mkdir(exist_ok=True)
        _schedstat(proc, pid, delay)
    reader = RunQueueReader(str(proc))
    assert reader.read(0) == (2 * 10**9, 125 * 10**7)
    (proc / str(me) / "task" / str(me) / "children").write_text("50")  # worker 51 ended
    assert reader.read(2 * 10**9) == (2 * 10**9, 125 * 10**7)


def test_the_probe_reads_the_real_kernel_file() -> None:
    with open(f"/proc/{os.getpid()}/schedstat") as fh:
        assert run_delay_ns(fh.read()) >= 0
    figures = RunQueueReader().read(0)
    assert figures is not None and figures[0] >= 0
