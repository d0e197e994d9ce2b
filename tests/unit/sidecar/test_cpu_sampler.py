"""The CPU sampler on fixture /proc and cgroup trees."""

from __future__ import annotations

from pathlib import Path

import pytest

from dam_sidecar.errors import ErrorLog
from dam_sidecar.samplers.cpu import CpuSampler, parse_stat

from .conftest import remove_proc, write_children, write_proc_stat


def sampler(tmp_path: Path) -> tuple[CpuSampler, ErrorLog]:
    errors = ErrorLog()
    (tmp_path / "proc").mkdir(exist_ok=True)
    (tmp_path / "cg").mkdir(exist_ok=True)
    return (
        CpuSampler(
            errors,
            proc_root=str(tmp_path / "proc"),
            cgroup_root=str(tmp_path / "cg"),
            clock_ticks_per_second=100,
        ),
        errors,
    )


def node_stat(proc: Path, user: int, idle: int) -> None:
    (proc / "stat").write_text(f"cpu  {user} 0 0 {idle} 0 0 0 0 0 0\ncpu0 {user} 0 0 {idle} 0 0 0 0 0 0\n")


def test_stat_parser_survives_a_command_name_with_spaces_and_parentheses() -> None:
    st = parse_stat("77 (pt_data (worker) 1) S 70 1 1 0 -1 0 0 0 0 0 250 50 0 0 20 0 1 0 999 0 0\n")
    assert (st.pid, st.ppid, st.cpu_ticks, st.start_ticks) == (77, 70, 300, 999)


def test_main_and_worker_cpu_seconds_via_children_files(tmp_path: Path) -> None:
    s, _ = sampler(tmp_path)
    proc = tmp_path / "proc"
    write_proc_stat(proc, 10, 1, utime=300, stime=100)
    write_proc_stat(proc, 11, 10, utime=150, stime=50)
    write_proc_stat(proc, 12, 11, utime=100, stime=0)  # a grandchild counts as a worker too
    write_children(proc, 10, [11])
    write_children(proc, 11, [12])
    write_children(proc, 12, [])
    r = s.sample([10])
    assert r.main_cpu_seconds == pytest.approx(4.0)
    assert r.worker_cpu_seconds == pytest.approx(3.0)
    assert r.worker_processes == 2


def test_workers_found_by_parent_pid_when_the_kernel_has_no_children_file(tmp_path: Path) -> None:
    s, _ = sampler(tmp_path)
    proc = tmp_path / "proc"
    write_proc_stat(proc, 10, 1, utime=100, stime=0)
    write_proc_stat(proc, 11, 10, utime=200, stime=0)
    write_proc_stat(proc, 99, 1, utime=5000, stime=0)  # an unrelated process
    r = s.sample([10])
    assert r.main_cpu_seconds == pytest.approx(1.0)
    assert r.worker_cpu_seconds == pytest.approx(2.0)


def test_worker_cpu_stays_monotonic_when_workers_exit_and_respawn(tmp_path: Path) -> None:
    s, _ = sampler(tmp_path)
    proc = tmp_path / "proc"
    write_proc_stat(proc, 10, 1, utime=100, stime=0)
    write_proc_stat(proc, 11, 10, utime=500, stime=0, start=200)
    first = s.sample([10]).worker_cpu_seconds
    remove_proc(proc, 11)  # the epoch ends, its worker exits
    write_proc_stat(proc, 12, 10, utime=10, stime=0, start=300)  # next epoch's worker
    second = s.sample([10]).worker_cpu_seconds
    assert first == pytest.approx(5.0)
    assert second == pytest.approx(5.1)


def test_pid_reused_by_a_new_process_is_not_mistaken_for_the_old_one(tmp_path: Path) -> None:
    s, _ = sampler(tmp_path)
    proc = tmp_path / "proc"
    write_proc_stat(proc, 10, 1, utime=800, stime=0, start=100)
    assert s.sample([10]).main_cpu_seconds == pytest.approx(8.0)
    write_proc_stat(proc, 10, 1, utime=100, stime=0, start=5000)  # a restarted trainer, same pid
    assert s.sample([10]).main_cpu_seconds == pytest.approx(9.0)


def test_no_training_process_means_no_process_cpu_series(tmp_path: Path) -> None:
    s, _ = sampler(tmp_path)
    r = s.sample([])
    assert r.main_cpu_seconds is None and r.throttled_seconds is None


def test_cgroup_v2_throttling_and_limit_of_the_training_container(tmp_path: Path) -> None:
    s, _ = sampler(tmp_path)
    proc, cg = tmp_path / "proc", tmp_path / "cg"
    write_proc_stat(proc, 10, 1, utime=1, stime=0)
    (proc / "10" / "cgroup").write_text("0::/kubepods/pod1/trainer\n")
    (cg / "cgroup.controllers").write_text("cpu memory\n")
    d = cg / "kubepods" / "pod1" / "trainer"
    d.mkdir(parents=True)
    (d / "cpu.stat").write_text("usage_usec 100\nnr_throttled 3\nthrottled_usec 2500000\n")
    (d / "cpu.max").write_text("150000 100000\n")
    r = s.sample([10])
    assert r.throttled_seconds == pytest.approx(2.5)
    assert r.limit_cores == pytest.approx(1.5)


def test_cgroup_v2_without_a_limit_has_no_limit_series(tmp_path: Path) -> None:
    s, _ = sampler(tmp_path)
    proc, cg = tmp_path / "proc", tmp_path / "cg"
    write_proc_stat(proc, 10, 1, utime=1, stime=0)
    (proc / "10" / "cgroup").write_text("0::/\n")
    (cg / "cgroup.controllers").write_text("cpu\n")
    (cg / "cpu.stat").write_text("throttled_usec 0\n")
    (cg / "cpu.max").write_text("max 100000\n")
    r = s.sample([10])
    assert r.throttled_seconds == 0.0 and r.limit_cores is None


def test_cgroup_v1_throttling_in_nanoseconds_and_quota_over_period(tmp_path: Path) -> None:
    s, _ = sampler(tmp_path)
    proc, cg = tmp_path / "proc", tmp_path / "cg"
    write_proc_stat(proc, 10, 1, utime=1, stime=0)
    (proc / "10" / "cgroup").write_text("5:memory:/x\n4:cpu,cpuacct:/kubepods/c1\n")
    d = cg / "cpu,cpuacct" / "kubepods" / "c1"
    d.mkdir(parents=True)
    (d / "cpu.stat").write_text("nr_periods 10\nnr_throttled 2\nthrottled_time 750000000\n")
    (d / "cpu.cfs_quota_us").write_text("200000\n")
    (d / "cpu.cfs_period_us").write_text("100000\n")
    r = s.sample([10])
    assert r.throttled_seconds == pytest.approx(0.75)
    assert r.limit_cores == pytest.approx(2.0)


def test_cgroup_of_another_container_that_is_not_visible_gives_no_series(tmp_path: Path) -> None:
    s, errors = sampler(tmp_path)
    proc, cg = tmp_path / "proc", tmp_path / "cg"
    write_proc_stat(proc, 10, 1, utime=1, stime=0)
    (proc / "10" / "cgroup").write_text("0::/../other-container\n")
    (cg / "cgroup.controllers").write_text("cpu\n")
    (cg / "cpu.stat").write_text("throttled_usec 999\n")  # the sidecar's own: must not be reported
    r = s.sample([10])
    assert r.throttled_seconds is None
    assert errors.count("cpu", "cgroup_unresolved") == 1


def test_node_cpu_utilization_from_two_proc_stat_readings(tmp_path: Path) -> None:
    s, _ = sampler(tmp_path)
    proc = tmp_path / "proc"
    node_stat(proc, user=1000, idle=1000)
    assert s.sample([]).node_utilization_ratio is None
    node_stat(proc, user=1300, idle=1100)
    assert s.sample([]).node_utilization_ratio == pytest.approx(0.75)


def test_garbage_proc_stat_is_counted_not_raised(tmp_path: Path) -> None:
    s, errors = sampler(tmp_path)
    proc = tmp_path / "proc"
    (proc / "stat").write_text("garbage\n")
    (proc / "10").mkdir()
    (proc / "10" / "stat").write_text("10 no-parens\n")
    r = s.sample([10])
    assert r.node_utilization_ratio is None and r.main_cpu_seconds is None
    assert errors.count("cpu", "proc_parse") == 2


def test_reads_the_real_proc_of_this_process() -> None:
    import os

    s = CpuSampler(ErrorLog())
    r = s.sample([os.getpid()])
    assert r.main_cpu_seconds is not None and r.main_cpu_seconds > 0
