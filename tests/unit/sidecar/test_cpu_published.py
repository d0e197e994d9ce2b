"""Training processes in another PID namespace: their CPU and memory come from their probe files.

A Pod that keeps ``shareProcessNamespace: false`` runs the sidecar in its own PID namespace: the
trainer's pid in its probe file means nothing in the sidecar's ``/proc`` (pid 1 there is the
sidecar itself). The probe publishes its PID namespace and its figures (flag bit 4); the
collector reads ``/proc`` only for pids of its own namespace.
"""

from __future__ import annotations

import time
from pathlib import Path

from dam_contract import names as n
from dam_contract.snapshot import labels_of
from dam_sidecar.collector import SidecarCollector

from .conftest import (
    OTHER_NS,
    OWN_NS,
    published_collector,
    remove_proc,
    write_children,
    write_probe,
    write_proc_stat,
)

GIB = 2**30


def _published(probes: Path, pid: int, ns: int, main_s: float, worker_s: float, **more: object) -> None:
    write_probe(
        probes,
        pid=pid,
        steps=5,
        process_cpu_ns=int(main_s * 1e9),
        worker_cpu_ns=int(worker_s * 1e9),
        process_rss_bytes=more.pop("rss", 2 * GIB),
        worker_rss_bytes=more.pop("worker_rss", GIB),
        workers=more.pop("workers", 4),
        pid_namespace=ns,
        **more,
    )


def _cpu(collector: SidecarCollector) -> dict[str, float]:
    collector.sample_now()
    snap = collector.snapshot()
    series = snap.series(n.PROCESS_CPU_SECONDS_TOTAL)
    return {role: series[labels_of({"role": role})] for role in (n.ROLE_MAIN, n.ROLE_WORKER)}


def test_a_trainer_of_another_pid_namespace_is_reported_from_its_probe_not_from_this_proc(
    tmp_path: Path,
) -> None:
    collector, probes, proc = published_collector(tmp_path)
    # pid 1 in the sidecar's /proc is the sidecar itself (3 s of CPU); the trainer is pid 1 in its own.
    write_proc_stat(proc, 1, 0, utime=200, stime=100)
    _published(probes, 1, OTHER_NS, main_s=40.0, worker_s=90.0)
    assert _cpu(collector) == {n.ROLE_MAIN: 40.0, n.ROLE_WORKER: 90.0}
    snap = collector.snapshot()
    assert snap.series(n.PROCESS_RESIDENT_MEMORY_BYTES)[labels_of({"role": n.ROLE_MAIN})] == 2 * GIB
    assert snap.series(n.PROCESSES)[labels_of({"role": n.ROLE_WORKER})] == 4
    _published(probes, 1, OTHER_NS, main_s=41.0, worker_s=95.5)
    assert _cpu(collector) == {n.ROLE_MAIN: 41.0, n.ROLE_WORKER: 95.5}


def test_a_trainer_of_this_pid_namespace_is_still_read_from_proc(tmp_path: Path) -> None:
    collector, probes, proc = published_collector(tmp_path)
    write_proc_stat(proc, 7, 1, utime=150, stime=50)
    write_proc_stat(proc, 8, 7, utime=300, stime=0)
    write_children(proc, 7, [8])
    _published(probes, 7, OWN_NS, main_s=999.0, worker_s=2.5, workers=1)
    assert _cpu(collector) == {n.ROLE_MAIN: 2.0, n.ROLE_WORKER: 3.0}


def test_an_older_probe_without_a_namespace_is_read_from_proc_as_before(tmp_path: Path) -> None:
    collector, probes, proc = published_collector(tmp_path)
    write_proc_stat(proc, 7, 1, utime=100, stime=0)
    write_probe(probes, pid=7)
    assert _cpu(collector)[n.ROLE_MAIN] == 1.0


def test_published_cpu_never_goes_down_when_a_trainer_restarts(tmp_path: Path) -> None:
    collector, probes, proc = published_collector(tmp_path)
    write_proc_stat(proc, 1, 0, utime=1, stime=0)
    _published(probes, 1, OTHER_NS, main_s=40.0, worker_s=90.0)
    assert _cpu(collector)[n.ROLE_WORKER] == 90.0
    # The container restarted: a new trainer, pid 1 again, from zero (started since the last sample).
    _published(probes, 1, OTHER_NS, main_s=1.0, worker_s=2.0, start_time_ns=time.time_ns())
    assert _cpu(collector) == {n.ROLE_MAIN: 41.0, n.ROLE_WORKER: 92.0}
    remove_proc(proc, 1)


def test_visible_and_hidden_trainers_add_up(tmp_path: Path) -> None:
    collector, probes, proc = published_collector(tmp_path)
    write_proc_stat(proc, 7, 1, utime=100, stime=0)
    write_probe(probes, pid=7, pid_namespace=OWN_NS, process_cpu_ns=5 * 10**9)
    _published(probes, 9, OTHER_NS, main_s=4.0, worker_s=6.0)
    assert _cpu(collector) == {n.ROLE_MAIN: 5.0, n.ROLE_WORKER: 6.0}


def test_workers_the_sidecar_cannot_find_are_taken_from_the_probe_of_a_visible_trainer(
    tmp_path: Path,
) -> None:
    """The trainer is in this /proc, but its workers are not found under it (seen on a real node:
    workerCount 0 for a Pod with two workers): its probe counts them from inside (flag bit 4), and
    more workers published than found means the probe's worker count, CPU and RSS are taken."""
    collector, probes, proc = published_collector(tmp_path)
    write_proc_stat(proc, 7, 1, utime=150, stime=50)
    write_children(proc, 7, [])  # the kernel lists no children (the workers are not found)
    (proc / "7" / "statm").write_text("1000 500 0 0 0 0 0\n")
    _published(probes, 7, OWN_NS, main_s=2.0, worker_s=6.0, workers=2, worker_rss=GIB)
    assert _cpu(collector) == {n.ROLE_MAIN: 2.0, n.ROLE_WORKER: 6.0}
    snap = collector.snapshot()
    assert snap.series(n.PROCESSES)[labels_of({"role": n.ROLE_WORKER})] == 2
    assert snap.series(n.PROCESS_RESIDENT_MEMORY_BYTES)[labels_of({"role": n.ROLE_WORKER})] == GIB
    # The sidecar finds one of them again: the probe's two still win; its CPU never goes down.
    write_proc_stat(proc, 8, 7, utime=100, stime=0)
    write_children(proc, 7, [8])
    _published(probes, 7, OWN_NS, main_s=2.0, worker_s=6.5, workers=2, worker_rss=GIB)
    assert _cpu(collector) == {n.ROLE_MAIN: 2.0, n.ROLE_WORKER: 6.5}
    assert collector.snapshot().series(n.PROCESSES)[labels_of({"role": n.ROLE_WORKER})] == 2
    # The workers ended (the probe says 0): what the sidecar reads stands, the counter kept.
    remove_proc(proc, 8)
    write_children(proc, 7, [])
    _published(probes, 7, OWN_NS, main_s=2.1, worker_s=6.5, workers=0, worker_rss=0)
    assert _cpu(collector)[n.ROLE_WORKER] == 6.5
    assert collector.snapshot().series(n.PROCESSES)[labels_of({"role": n.ROLE_WORKER})] == 0


def test_a_trainer_whose_first_record_comes_late_counts_from_that_record(tmp_path: Path) -> None:
    """The probe publishes at the first batch: on a busy node that is 20 s and more after the process
    started, with all it counted since. A process that started before the sidecar's previous sample
    counts from its first record: no window receives that past at once (a busy node's trainer read
    100 % CPU wait, its own schedstat 51 %)."""
    collector, probes, proc = published_collector(tmp_path)
    write_proc_stat(proc, 1, 0, utime=1, stime=0)
    collector.sample_now()  # the sidecar's first sample: no trainer yet
    started = time.time_ns() - 30 * 10**9  # the trainer started 30 s ago, before that sample
    _published(probes, 1, OTHER_NS, main_s=20.0, worker_s=0.0, start_time_ns=started, run_queue_ns=25 * 10**9)
    first = _cpu(collector)
    assert first == {n.ROLE_MAIN: 0.0, n.ROLE_WORKER: 0.0}, first
    waits = collector.snapshot().series(n.PROCESS_CPU_WAIT_SECONDS_TOTAL)
    assert waits[labels_of({"role": n.ROLE_MAIN})] == 0.0
    _published(probes, 1, OTHER_NS, main_s=21.5, worker_s=0.0, start_time_ns=started, run_queue_ns=27 * 10**9)
    assert _cpu(collector) == {n.ROLE_MAIN: 1.5, n.ROLE_WORKER: 0.0}
    waits = collector.snapshot().series(n.PROCESS_CPU_WAIT_SECONDS_TOTAL)
    assert waits[labels_of({"role": n.ROLE_MAIN})] == 2.0
