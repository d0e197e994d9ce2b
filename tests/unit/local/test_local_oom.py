"""`dam run` and OOM kills: its own memory cgroup's reading, the final window that holds the kill,
the run's memory peaks (fixture cgroup trees; the real kernel OOM is tests/integration/test_local_oom.py)."""

from __future__ import annotations

import signal
from pathlib import Path

from dam_contract import names
from dam_contract.snapshot import Sample, Snapshot
from dam_operator.diagnosis.model import Regime
from dam_operator.local.memory import (
    MemoryCgroupSource,
    MemoryReading,
    OwnMemoryCgroup,
    memory_cgroup_directory,
    oom_killed,
    with_container_memory,
)
from dam_operator.local.session import LocalSession, update_peaks, with_memory_peaks

MIB = 1 << 20
GIB = 1 << 30


# --- the cgroup ---------------------------------------------------------------------------------


def v1_tree(tmp_path: Path, kills: int = 0, limit: int = GIB) -> Path:
    """A v1 memory hierarchy with this process in /jobs/a, and a /proc with `self`."""
    d = tmp_path / "cg" / "memory" / "jobs" / "a"
    d.mkdir(parents=True)
    (d / "memory.usage_in_bytes").write_text(f"{300 * MIB}\n")
    (d / "memory.limit_in_bytes").write_text(f"{limit}\n")
    (d / "memory.oom_control").write_text(f"oom_kill_disable 0\nunder_oom 0\noom_kill {kills}\n")
    proc(tmp_path, "self", "4:memory:/jobs/a\n1:cpu:/\n0::/\n")
    return d


def proc(tmp_path: Path, pid: int | str, cgroup_text: str, state: str = "S", flags: int = 0x400000) -> None:
    p = tmp_path / "proc" / str(pid)
    p.mkdir(parents=True, exist_ok=True)
    (p / "cgroup").write_text(cgroup_text)
    (p / "stat").write_text(f"{pid} (python (x)) {state} 1 1 1 0 -1 {flags} 0 0\n")


def own(tmp_path: Path) -> OwnMemoryCgroup:
    return OwnMemoryCgroup(root=str(tmp_path / "cg"), proc_root=str(tmp_path / "proc"))


def test_own_v1_memory_cgroup_is_read_with_its_limit_and_oom_kills(tmp_path: Path) -> None:
    v1_tree(tmp_path, kills=3)
    assert own(tmp_path).read() == MemoryReading(300 * MIB, float(GIB), 3.0)


def test_own_v1_cgroup_without_a_limit_reads_no_limit(tmp_path: Path) -> None:
    v1_tree(tmp_path, limit=9223372036854771712)  # v1's "no limit"
    reading = own(tmp_path).read()
    assert reading is not None and reading.limit_bytes is None


def test_own_v2_memory_cgroup_is_read_from_memory_events(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    d = root / "user.slice" / "job"
    d.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory\n")
    (d / "memory.current").write_text(f"{200 * MIB}\n")
    (d / "memory.max").write_text("max\n")
    (d / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 2\noom_kill 2\n")
    proc(tmp_path, "self", "0::/user.slice/job\n")
    assert own(tmp_path).read() == MemoryReading(200 * MIB, None, 2.0)


def test_no_visible_memory_cgroup_reads_nothing(tmp_path: Path) -> None:
    (tmp_path / "cg").mkdir()
    proc(tmp_path, "self", "0::/\n")  # neither a v2 root nor a v1 memory hierarchy
    assert own(tmp_path).read() is None
    v1_tree(tmp_path / "other")
    assert memory_cgroup_directory("4:memory:/../elsewhere\n", str(tmp_path / "other" / "cg")) is None


def test_the_commands_oom_kill_needs_sigkill_and_a_counted_kill() -> None:
    assert oom_killed(-signal.SIGKILL, 0, 1) is True
    assert oom_killed(-signal.SIGKILL, 1, 1) is None, "a SIGKILL someone sent is not an OOM kill"
    assert oom_killed(1, 0, 1) is None, "a worker's kill is the kill counter's evidence, not the command's"
    assert oom_killed(-signal.SIGKILL, None, 1) is None
    assert oom_killed(None, 0, 1) is None


def test_the_cgroup_reading_replaces_the_samplers_container_memory() -> None:
    snap = Snapshot(
        [
            Sample(names.STEPS_TOTAL, (), 5.0),
            Sample(names.CONTAINER_MEMORY_USAGE_BYTES, (), 1.0),
            Sample(names.CONTAINER_MEMORY_LIMIT_BYTES, (), 2.0),
            Sample(names.CONTAINER_OOM_KILLS_TOTAL, (), 0.0),
        ],
        timestamp_seconds=12.0,
    )
    out = with_container_memory(snap, MemoryReading(300.0, None, 4.0))
    assert out.series(names.CONTAINER_MEMORY_USAGE_BYTES) == {(): 300.0}
    assert out.series(names.CONTAINER_MEMORY_LIMIT_BYTES) == {}, "an unlimited cgroup has no limit series"
    assert out.series(names.CONTAINER_OOM_KILLS_TOTAL) == {(): 4.0}
    assert out.series(names.STEPS_TOTAL) == {(): 5.0}
    assert out.timestamp_seconds == 12.0


class Source:
    def __init__(self) -> None:
        self.closed = False

    def snapshot(self) -> Snapshot:
        return Snapshot([Sample(names.CONTAINER_OOM_KILLS_TOTAL, (), 99.0)])

    def close(self) -> None:
        self.closed = True


def test_the_reading_is_used_while_the_command_shares_the_cgroup_and_after_it_exited(tmp_path: Path) -> None:
    d = v1_tree(tmp_path, kills=0)
    proc(tmp_path, 42, "4:memory:/jobs/a\n")
    source = MemoryCgroupSource(Source(), own(tmp_path), 42)
    assert source.snapshot().series(names.CONTAINER_OOM_KILLS_TOTAL) == {(): 0.0}
    (d / "memory.oom_control").write_text("oom_kill 1\n")
    # Exiting (PF_EXITING), then exited but not yet reaped: the kernel already names the root cgroup.
    proc(tmp_path, 42, "4:memory:/\n", state="R", flags=0x400004)
    assert source.snapshot().series(names.CONTAINER_OOM_KILLS_TOTAL) == {(): 1.0}
    proc(tmp_path, 42, "4:memory:/\n", state="Z", flags=0x400004)
    assert source.snapshot().series(names.CONTAINER_OOM_KILLS_TOTAL) == {(): 1.0}
    assert source.oom_killed(-signal.SIGKILL) is True
    assert source.oom_killed(1) is None
    source.close()
    assert isinstance(source.inner, Source) and source.inner.closed


def test_a_command_that_moved_to_another_cgroup_keeps_the_samplers_figures(tmp_path: Path) -> None:
    v1_tree(tmp_path)
    (tmp_path / "cg" / "memory" / "elsewhere").mkdir()
    (tmp_path / "cg" / "memory" / "elsewhere" / "memory.usage_in_bytes").write_text("1\n")
    proc(tmp_path, 42, "4:memory:/elsewhere\n")
    source = MemoryCgroupSource(Source(), own(tmp_path), 42)
    assert source.snapshot().series(names.CONTAINER_OOM_KILLS_TOTAL) == {(): 99.0}
    assert source.oom_killed(-signal.SIGKILL) is None


# --- the final verdict --------------------------------------------------------------------------

WORKER = (("role", names.ROLE_WORKER),)
MAIN = (("role", names.ROLE_MAIN),)


def run_snap(
    t: float, *, kills: float, workers: int = 2, worker_rss: float = 0.0, usage: float = 0.4 * GIB
) -> Snapshot:
    """A starved single-process run (data wait 90 % of the step) with workers and a 1 GiB limit.

    ``workers=0``: the processes have exited (no resident memory, no workers).
    """
    steps = 10 * t
    samples = [
        Sample(names.STEPS_TOTAL, (), steps),
        Sample(names.STEP_SECONDS_TOTAL, (), t),
        Sample(names.DATALOADER_WAIT_SECONDS_TOTAL, (), 0.9 * t),
        Sample(names.CONTAINER_MEMORY_USAGE_BYTES, (), usage),
        Sample(names.CONTAINER_MEMORY_LIMIT_BYTES, (), float(GIB)),
        Sample(names.CONTAINER_OOM_KILLS_TOTAL, (), kills),
    ]
    if workers:
        samples += [
            Sample(names.PROCESS_RESIDENT_MEMORY_BYTES, MAIN, 0.5 * GIB),
            Sample(names.PROCESS_RESIDENT_MEMORY_BYTES, WORKER, worker_rss),
            Sample(names.PROCESSES, MAIN, 1.0),
            Sample(names.PROCESSES, WORKER, float(workers)),
        ]
    return Snapshot(samples)


def test_a_worker_killed_at_the_end_of_the_run_is_memory_capacity_with_the_run_s_peak_memory() -> None:
    session = LocalSession(window_seconds=2.0)
    session.add(0.0, Snapshot([Sample(names.CONTAINER_OOM_KILLS_TOTAL, (), 5.0)]))  # earlier kills
    for i in range(1, 13):
        t = i * 0.5
        session.add(
            t, run_snap(t, kills=5, worker_rss=0.6 * GIB + i * 0.05 * GIB, usage=0.5 * GIB + i * 0.04 * GIB)
        )
    # The kernel kills a worker, the trainer raises and exits: only the snapshot after the exit sees it.
    session.add(6.6, run_snap(6.6, kills=6, workers=0, usage=0.05 * GIB))
    final = session.final_verdict()
    b = final.bottleneck
    assert b.regime is Regime.MEMORY_CAPACITY
    assert b.lever == "reduce-loader-memory"
    assert final.metrics.oom_kills == 1.0, "only the kill during the run counts"
    assert "1 OOM kill in the container's cgroup in the window" in b.evidence
    assert any("2 loader workers 1.20 GiB, main process 0.50 GiB" in e for e in b.evidence), b.evidence
    assert any("container memory at 98.0%" in e for e in b.evidence), "the peak, not the emptied cgroup"


def test_a_kill_in_the_warmup_still_decides_the_final_verdict() -> None:
    session = LocalSession(window_seconds=10.0)
    session.add(0.0, run_snap(0.0, kills=0))
    session.add(1.0, run_snap(1.0, kills=0, worker_rss=0.9 * GIB))
    session.add(1.5, run_snap(1.5, kills=1, worker_rss=0.3 * GIB))  # one worker killed, the job goes on
    for i in range(4, 60):
        session.add(i * 0.5, run_snap(i * 0.5, kills=1, worker_rss=0.3 * GIB))
    start, _ = session.final_span() or (None, None)
    assert start is not None and start[0] == 1.0, "the span starts at the last snapshot before the kill"
    assert session.final_verdict().bottleneck.regime is Regime.MEMORY_CAPACITY


def test_a_run_killed_before_its_first_step_is_memory_capacity_not_unknown() -> None:
    session = LocalSession(window_seconds=2.0)
    for i in range(4):
        session.add(i * 0.5, Snapshot([Sample(names.CONTAINER_OOM_KILLS_TOTAL, (), 0.0)]))
    session.add(2.0, Snapshot([Sample(names.CONTAINER_OOM_KILLS_TOTAL, (), 1.0)]))
    final = session.final_verdict()
    assert final.bottleneck.regime is Regime.MEMORY_CAPACITY
    assert final.metrics.oom_kills == 1.0


def test_the_command_itself_oom_killed_is_said_and_decides_even_without_a_span() -> None:
    session = LocalSession(window_seconds=2.0)
    session.add(0.0, Snapshot([]))
    final = session.final_verdict(oom_killed=True)
    assert final.bottleneck.regime is Regime.MEMORY_CAPACITY
    assert any("OOM-killed" in e for e in final.bottleneck.evidence)


def test_a_run_without_an_oom_kill_is_judged_from_its_last_figures_not_its_peaks() -> None:
    session = LocalSession(window_seconds=2.0)
    for i in range(12):
        session.add(
            i * 0.5,
            run_snap(i * 0.5, kills=0, worker_rss=0.1 * GIB, usage=0.99 * GIB if i == 3 else 0.4 * GIB),
        )
    final = session.final_verdict()
    assert final.bottleneck.regime is Regime.INPUT_BOUND
    assert final.metrics.container_memory_ratio is not None and final.metrics.container_memory_ratio < 0.5


def test_peaks_replace_only_the_memory_gauges() -> None:
    peaks: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    update_peaks(peaks, run_snap(1.0, kills=0, worker_rss=0.7 * GIB, usage=0.9 * GIB))
    update_peaks(peaks, run_snap(2.0, kills=0, worker_rss=0.2 * GIB, usage=0.3 * GIB))
    update_peaks(peaks, Snapshot([Sample(names.CONTAINER_MEMORY_USAGE_BYTES, (), float("nan"))]))
    after = with_memory_peaks(run_snap(3.0, kills=1, workers=0, usage=0.1 * GIB), peaks)
    assert after.series(names.PROCESS_RESIDENT_MEMORY_BYTES)[WORKER] == 0.7 * GIB
    assert after.series(names.PROCESS_RESIDENT_MEMORY_BYTES)[MAIN] == 0.5 * GIB
    assert after.series(names.PROCESSES)[WORKER] == 2.0
    assert after.series(names.CONTAINER_MEMORY_USAGE_BYTES) == {(): 0.9 * GIB}
    assert after.series(names.STEPS_TOTAL) == {(): 30.0}
    assert after.series(names.CONTAINER_OOM_KILLS_TOTAL) == {(): 1.0}
