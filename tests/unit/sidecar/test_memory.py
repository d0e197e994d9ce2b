"""Container memory and OOM kills (cgroup v2/v1 fixture trees, a real cgroup), resident memory by role."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from dam_contract import names as n
from dam_contract.snapshot import Snapshot
from dam_probe import cgroup
from dam_sidecar.collector import SidecarCollector, build_collector
from dam_sidecar.errors import ErrorLog
from dam_sidecar.samplers.cpu import CpuSampler
from dam_sidecar.settings import SidecarSettings
from tests.support.procs import spawn

from .conftest import write_children, write_probe, write_proc_stat

MIB = 2**20
PID = 10


def sampler(tmp_path: Path) -> CpuSampler:
    (tmp_path / "proc").mkdir(exist_ok=True)
    (tmp_path / "cg").mkdir(exist_ok=True)
    return CpuSampler(
        ErrorLog(),
        proc_root=str(tmp_path / "proc"),
        cgroup_root=str(tmp_path / "cg"),
        clock_ticks_per_second=100,
        page_size=4096,
    )


def v2_trainer(
    tmp_path: Path, current: int, max_: str, oom_kills: int, *, path: str = "kubepods/trainer", pid: int = PID
) -> Path:
    cg = tmp_path / "cg"
    (cg / "cgroup.controllers").write_text("cpu memory\n")
    d = cg / path
    d.mkdir(parents=True, exist_ok=True)
    (d / "cpu.stat").write_text("throttled_usec 0\n")
    (d / "memory.current").write_text(f"{current}\n")
    (d / "memory.max").write_text(f"{max_}\n")
    (d / "memory.events").write_text(
        f"low 0\nhigh 0\nmax 12\noom 3\noom_kill {oom_kills}\noom_group_kill 0\n"
    )
    write_proc_stat(tmp_path / "proc", pid, 1, utime=1, stime=0)
    (tmp_path / "proc" / str(pid) / "cgroup").write_text(f"0::/{path}\n")
    return d


def test_cgroup_v2_usage_limit_and_oom_kills_of_the_training_container(tmp_path: Path) -> None:
    s = sampler(tmp_path)
    v2_trainer(tmp_path, current=300 * MIB, max_=str(512 * MIB), oom_kills=2)
    r = s.sample([PID])
    assert (r.memory_usage_bytes, r.memory_limit_bytes, r.oom_kills) == (300 * MIB, 512 * MIB, 2)


def test_cgroup_v2_memory_max_is_no_limit(tmp_path: Path) -> None:
    s = sampler(tmp_path)
    v2_trainer(tmp_path, current=MIB, max_="max", oom_kills=0)
    r = s.sample([PID])
    assert r.memory_usage_bytes == MIB and r.memory_limit_bytes is None and r.oom_kills == 0


def test_cgroup_v1_memory_hierarchy_with_its_huge_no_limit_value_and_oom_control(tmp_path: Path) -> None:
    s = sampler(tmp_path)
    cg, proc = tmp_path / "cg", tmp_path / "proc"
    d = cg / "memory" / "kubepods" / "trainer"
    d.mkdir(parents=True)
    (d / "memory.usage_in_bytes").write_text(f"{200 * MIB}\n")
    (d / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (d / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 4\n")
    write_proc_stat(proc, PID, 1, utime=1, stime=0)
    (proc / str(PID) / "cgroup").write_text("5:cpu,cpuacct:/other\n4:memory:/kubepods/trainer\n0::/\n")
    r = s.sample([PID])
    assert (r.memory_usage_bytes, r.memory_limit_bytes, r.oom_kills) == (200 * MIB, None, 4)
    (d / "memory.limit_in_bytes").write_text(f"{256 * MIB}\n")
    (d / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\n")  # kernels before 4.13
    r = s.sample([PID])
    assert r.memory_limit_bytes == 256 * MIB and r.oom_kills == 4  # the counter never goes down


def test_an_invisible_memory_cgroup_gives_no_figures_and_is_counted(tmp_path: Path) -> None:
    s = sampler(tmp_path)
    (tmp_path / "cg" / "cgroup.controllers").write_text("memory\n")
    write_proc_stat(tmp_path / "proc", PID, 1, utime=1, stime=0)
    (tmp_path / "proc" / str(PID) / "cgroup").write_text("0::/../trainer\n")
    r = s.sample([PID])
    assert r.memory_usage_bytes is None and r.oom_kills is None
    assert s.errors.count("cpu", "memory_cgroup_unresolved") == 1


def test_oom_kills_stay_monotonic_when_the_cgroup_is_recreated(tmp_path: Path) -> None:
    s = sampler(tmp_path)
    d = v2_trainer(tmp_path, current=MIB, max_="max", oom_kills=3)
    assert s.sample([PID]).oom_kills == 3
    (d / "memory.events").write_text("oom_kill 1\n")  # a new container: the kernel count restarts
    assert s.sample([PID]).oom_kills == 4


def test_resident_memory_of_the_trainer_and_of_its_loader_workers(tmp_path: Path) -> None:
    s = sampler(tmp_path)
    proc = tmp_path / "proc"
    write_proc_stat(proc, PID, 1, utime=1, stime=0)
    write_proc_stat(proc, 11, PID, utime=1, stime=0)
    write_proc_stat(proc, 12, PID, utime=1, stime=0)
    write_children(proc, PID, [11, 12])
    write_children(proc, 11, [])
    write_children(proc, 12, [])
    (proc / str(PID) / "statm").write_text("500000 25600 100 1 0 2000 0\n")  # 100 MiB resident
    (proc / "11" / "statm").write_text("400000 12800 100 1 0 2000 0\n")  # 50 MiB
    (proc / "12" / "statm").write_text("400000 2560 100 1 0 2000 0\n")  # 10 MiB
    r = s.sample([PID])
    assert r.main_rss_bytes == 100 * MIB and r.worker_rss_bytes == 60 * MIB


def test_no_training_process_means_no_resident_memory_series(tmp_path: Path) -> None:
    r = sampler(tmp_path).sample([])
    assert r.main_rss_bytes is None and r.worker_rss_bytes is None and r.memory_usage_bytes is None


# --- the collector: the sidecar's own read first, else what the probe read ----------------------------


class Pod:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.probe = tmp_path / "probe"
        self.probe.mkdir()
        (tmp_path / "proc").mkdir()
        (tmp_path / "cg").mkdir()
        (tmp_path / "cg" / "cgroup.controllers").write_text("cpu memory\n")
        write_proc_stat(tmp_path / "proc", PID, 1, utime=1, stime=0)
        (tmp_path / "proc" / str(PID) / "cgroup").write_text("0::/../trainer\n")  # not visible

    def collector(self) -> SidecarCollector:
        return build_collector(
            SidecarSettings(
                probe_dir=str(self.probe),
                proc_root=str(self.tmp / "proc"),
                cgroup_root=str(self.tmp / "cg"),
                clock_ticks_per_second=100,
            ),
            use_nvml=False,
        )

    def publish(self, usage: int, limit: int, kills: int, cgroup_id: int = 9, **kw: object) -> None:
        fields: dict[str, object] = {"pid": PID, "steps": 1}
        fields.update(kw)
        write_probe(
            self.probe,
            memory_usage_bytes=usage,
            memory_limit_bytes=limit,
            oom_kills=kills,
            memory_cgroup_id=cgroup_id,
            **fields,
        )


def tick(c: SidecarCollector) -> Snapshot:
    c.sample_now()
    return c.snapshot()


def memory_source(snap: Snapshot) -> str:
    (current,) = [s.label("source") for s in snap.samples(n.CONTAINER_MEMORY_SOURCE) if s.value == 1.0]
    return current


def test_the_probes_memory_reading_is_the_fallback_when_the_trainer_cgroup_is_not_visible(
    tmp_path: Path,
) -> None:
    pod = Pod(tmp_path)
    pod.publish(usage=700 * MIB, limit=1024 * MIB, kills=1)
    snap = tick(pod.collector())
    assert memory_source(snap) == n.CPU_SOURCE_PROBE
    assert snap.series(n.CONTAINER_MEMORY_USAGE_BYTES)[()] == 700 * MIB
    assert snap.series(n.CONTAINER_MEMORY_LIMIT_BYTES)[()] == 1024 * MIB
    assert snap.series(n.CONTAINER_OOM_KILLS_TOTAL)[()] == 1


def test_an_unlimited_probe_cgroup_has_no_limit_series(tmp_path: Path) -> None:
    pod = Pod(tmp_path)
    pod.publish(usage=MIB, limit=0, kills=0)
    snap = tick(pod.collector())
    assert n.CONTAINER_MEMORY_LIMIT_BYTES not in snap.names()
    assert snap.series(n.CONTAINER_OOM_KILLS_TOTAL)[()] == 0


def test_the_sidecars_own_reading_wins_and_oom_kills_never_go_down_when_the_source_changes(
    tmp_path: Path,
) -> None:
    pod = Pod(tmp_path)
    pod.publish(usage=MIB, limit=0, kills=2)
    c = pod.collector()
    assert tick(c).series(n.CONTAINER_OOM_KILLS_TOTAL)[()] == 2
    # The trainer restarts as pid 12, in a cgroup the sidecar can see (its kernel count is 2 too).
    (pod.probe / f"probe-{PID}.bin").unlink()
    v2_trainer(tmp_path, current=5 * MIB, max_=str(64 * MIB), oom_kills=2, pid=12)
    pod.publish(usage=MIB, limit=0, kills=2, pid=12, start_time_ns=5)
    snap = tick(c)
    assert memory_source(snap) == n.CPU_SOURCE_CGROUP
    assert snap.series(n.CONTAINER_MEMORY_USAGE_BYTES)[()] == 5 * MIB
    assert snap.series(n.CONTAINER_OOM_KILLS_TOTAL)[()] == 2  # no jump on the switch
    v2_trainer(tmp_path, current=5 * MIB, max_=str(64 * MIB), oom_kills=3, pid=12)
    assert tick(c).series(n.CONTAINER_OOM_KILLS_TOTAL)[()] == 3


def test_oom_kills_published_by_probes_of_one_cgroup_are_not_summed_and_survive_the_probe(
    tmp_path: Path,
) -> None:
    pod = Pod(tmp_path)
    pod.publish(usage=MIB, limit=0, kills=2, pid=PID, last_update_ns=1)
    pod.publish(usage=MIB, limit=0, kills=3, pid=11, last_update_ns=2)
    (tmp_path / "proc" / "11").mkdir()
    c = pod.collector()
    assert tick(c).series(n.CONTAINER_OOM_KILLS_TOTAL)[()] == 3  # the freshest reading, not 5
    for f in pod.probe.iterdir():
        f.unlink()
    snap = tick(c)
    assert snap.series(n.CONTAINER_OOM_KILLS_TOTAL)[()] == 3
    assert n.CONTAINER_MEMORY_USAGE_BYTES not in snap.names()  # usage is only for live processes


def test_no_source_means_no_memory_series_and_source_none(tmp_path: Path) -> None:
    pod = Pod(tmp_path)
    write_probe(pod.probe, pid=PID, steps=1)  # a probe that does not read its memory cgroup
    snap = tick(pod.collector())
    assert memory_source(snap) == n.CPU_SOURCE_NONE
    assert not {n.CONTAINER_MEMORY_USAGE_BYTES, n.CONTAINER_OOM_KILLS_TOTAL} & snap.names()


# --- a real cgroup: a process exceeds its memory limit and the kernel kills it ------------------------

CHILD = r"""
import json, os, subprocess, sys
with open(sys.argv[1], "w") as fh:
    fh.write(str(os.getpid()))
# A "loader worker" in the same cgroup allocates past the limit; the kernel OOM-kills it.
worker = subprocess.run([sys.executable, "-c", "b = [bytearray(8 << 20) for _ in range(64)]"])
from dam_probe.cgroup import MemoryReader
print(json.dumps({"worker_rc": worker.returncode, "probe": MemoryReader().read(0)}), flush=True)
sys.stdin.read()  # stay alive (and in the cgroup) until the test has sampled
"""


def _real_memory_cgroup() -> tuple[Path, str, str]:
    """(directory, procs file, limit file) of a fresh memory cgroup, or pytest.skip with the reason."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create a cgroup")
    root = Path(cgroup.DEFAULT_ROOT)
    name = f"dam-test-{uuid.uuid4().hex[:8]}"
    if cgroup.is_v2(str(root)):
        controllers = (root / "cgroup.controllers").read_text().split()
        if "memory" not in controllers:
            pytest.skip("cgroup v2 without the memory controller")
        try:
            if "memory" not in (root / "cgroup.subtree_control").read_text().split():
                (root / "cgroup.subtree_control").write_text("+memory")
            d = root / name
            d.mkdir()
        except OSError as exc:
            pytest.skip(f"cannot create a cgroup v2 with memory.max under {root}: {exc}")
        return d, "cgroup.procs", "memory.max"
    base = cgroup.v1_memory_root(str(root))
    if base is None:
        pytest.skip(f"no cgroup v2 and no v1 memory hierarchy under {root}")
    try:
        d = Path(base) / name
        d.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot create a v1 memory cgroup under {base} (read-only /sys/fs/cgroup?): {exc}")
    return d, "cgroup.procs", "memory.limit_in_bytes"


@pytest.fixture
def real_memory_cgroup() -> Iterator[tuple[Path, str, str]]:
    d, procs, limit = _real_memory_cgroup()
    try:
        (d / limit).write_text(str(64 * MIB))
        swap = d / "memory.memsw.limit_in_bytes"  # v1 with swap accounting: no escape into swap
        if swap.exists():
            swap.write_text(str(64 * MIB))
        if (d / "memory.swap.max").exists():
            (d / "memory.swap.max").write_text("0")
        yield d, procs, limit
    finally:
        for _ in range(50):
            try:
                d.rmdir()
                break
            except OSError:
                import time

                time.sleep(0.1)


def test_a_process_killed_for_exceeding_a_real_cgroup_limit_is_counted_by_sidecar_and_probe(
    real_memory_cgroup: tuple[Path, str, str],
) -> None:
    d, procs, _ = real_memory_cgroup
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    child = spawn(
        [sys.executable, "-c", CHILD, str(d / procs)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        report = json.loads(child.stdout.readline())
        assert report["worker_rc"] == -9  # SIGKILL from the OOM killer
        usage, limit, kills, _ = report["probe"]  # what the probe reads from inside the cgroup
        assert limit == 64 * MIB and kills >= 1 and usage > 0
        s = CpuSampler(ErrorLog(), proc_root="/proc", cgroup_root=cgroup.DEFAULT_ROOT)
        r = s.sample([child.pid])
        assert r.memory_limit_bytes == 64 * MIB
        assert r.oom_kills is not None and r.oom_kills >= 1
        assert r.memory_usage_bytes is not None and 0 < r.memory_usage_bytes <= 64 * MIB
        assert r.main_rss_bytes is not None and r.main_rss_bytes > 0
    finally:
        if child.stdin is not None:
            child.stdin.close()
        child.wait(timeout=30)
        if child.stdout is not None:
            child.stdout.close()


def test_loader_worker_kills_the_probe_counted_are_exported_as_a_counter(tmp_path: Path) -> None:
    pod = Pod(tmp_path)
    pod.publish(usage=MIB, limit=0, kills=0)
    assert n.DATALOADER_WORKER_KILLS_TOTAL not in tick(pod.collector()).names()  # not published: absent
    pod.publish(usage=MIB, limit=0, kills=1, loader_worker_kills=1, loader_kill_signal=9)
    snap = tick(pod.collector())
    assert snap.series(n.DATALOADER_WORKER_KILLS_TOTAL)[()] == 1
