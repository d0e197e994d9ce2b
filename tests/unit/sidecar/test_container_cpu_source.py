"""Container CPU throttling and limit: the sidecar's own cgroup read first, else the probe's."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from dam_contract import names as n
from dam_contract.snapshot import Snapshot, labels_of
from dam_operator.diagnosis.window import observation_from_snapshots
from dam_probe.layout import probe_path
from dam_sidecar.collector import SidecarCollector, build_collector
from dam_sidecar.collectors.host import SourcedCounter
from dam_sidecar.settings import SidecarSettings

from .conftest import write_probe, write_proc_stat

PID = 10


class Pod:
    """A probe directory, a /proc and the cgroup tree the sidecar sees, all under tmp_path."""

    def __init__(self, tmp_path: Path) -> None:
        self.probe = tmp_path / "probe"
        self.proc = tmp_path / "proc"
        self.cgroup = tmp_path / "sidecar-cg"
        for d in (self.probe, self.proc, self.cgroup):
            d.mkdir()
        (self.cgroup / "cgroup.controllers").write_text("cpu\n")
        (self.cgroup / "cpu.stat").write_text("throttled_usec 999000000\n")  # the sidecar's own
        write_proc_stat(self.proc, PID, 1, utime=100, stime=0)
        # The usual pod: the trainer's cgroup lies in another container's cgroup namespace.
        (self.proc / str(PID) / "cgroup").write_text("0::/../trainer\n")

    def collector(self) -> SidecarCollector:
        return build_collector(
            SidecarSettings(
                probe_dir=str(self.probe),
                proc_root=str(self.proc),
                cgroup_root=str(self.cgroup),
                clock_ticks_per_second=100,
            ),
            use_nvml=False,
        )

    def publish(
        self, throttled_ns: int, limit_millicores: int = 1500, cgroup_id: int = 77, **kw: object
    ) -> None:
        fields: dict[str, object] = {"pid": PID, "steps": 10}
        fields.update(kw)
        write_probe(
            self.probe,
            cgroup_throttled_ns=throttled_ns,
            cgroup_limit_millicores=limit_millicores,
            cgroup_id=cgroup_id,
            **fields,
        )

    def make_trainer_cgroup_visible(
        self, throttled_usec: int, cpu_max: str = "400000 100000", pid: int = PID
    ) -> None:
        d = self.cgroup / "kubepods" / "trainer"
        d.mkdir(parents=True, exist_ok=True)
        (d / "cpu.stat").write_text(f"throttled_usec {throttled_usec}\n")
        (d / "cpu.max").write_text(f"{cpu_max}\n")
        write_proc_stat(self.proc, pid, 1, utime=100, stime=0)
        (self.proc / str(pid) / "cgroup").write_text("0::/kubepods/trainer\n")


def throttled(snap: Snapshot) -> float | None:
    return snap.series(n.CONTAINER_CPU_THROTTLED_SECONDS_TOTAL).get(())


def limit(snap: Snapshot) -> float | None:
    return snap.series(n.CONTAINER_CPU_LIMIT_CORES).get(())


def source(snap: Snapshot) -> str:
    (current,) = [s.label("source") for s in snap.samples(n.CONTAINER_CPU_SOURCE) if s.value == 1.0]
    return current or ""


def tick(c: SidecarCollector) -> Snapshot:
    c.sample_now()
    return c.snapshot()


def test_without_the_trainer_cgroup_the_probe_values_are_exported(tmp_path: Path) -> None:
    pod = Pod(tmp_path)
    pod.publish(throttled_ns=3_000_000_000, limit_millicores=1500)
    c = pod.collector()
    snap = tick(c)
    assert c.errors.count("cpu", "cgroup_unresolved") == 1  # the sidecar could not read it itself
    assert throttled(snap) == pytest.approx(3.0)  # not the sidecar's own 999 s
    assert limit(snap) == pytest.approx(1.5)
    assert source(snap) == n.CPU_SOURCE_PROBE


def test_the_sidecar_prefers_the_trainer_cgroup_it_can_read_itself(tmp_path: Path) -> None:
    pod = Pod(tmp_path)
    pod.make_trainer_cgroup_visible(throttled_usec=8_000_000, cpu_max="400000 100000")
    pod.publish(throttled_ns=3_000_000_000, limit_millicores=1500)
    snap = tick(pod.collector())
    assert throttled(snap) == pytest.approx(8.0)
    assert limit(snap) == pytest.approx(4.0)
    assert source(snap) == n.CPU_SOURCE_CGROUP


def test_an_unlimited_visible_cgroup_is_not_overridden_by_the_probe_limit(tmp_path: Path) -> None:
    pod = Pod(tmp_path)
    pod.make_trainer_cgroup_visible(throttled_usec=0, cpu_max="max 100000")
    pod.publish(throttled_ns=1, limit_millicores=1500)
    snap = tick(pod.collector())
    assert source(snap) == n.CPU_SOURCE_CGROUP and limit(snap) is None


def test_no_source_means_no_throttling_series_and_source_none(tmp_path: Path) -> None:
    pod = Pod(tmp_path)
    write_probe(pod.probe, pid=PID, steps=3)  # an old probe: no cgroup fields
    snap = tick(pod.collector())
    assert throttled(snap) is None and limit(snap) is None
    assert source(snap) == n.CPU_SOURCE_NONE


def test_probe_throttling_stays_monotonic_when_the_trainer_restarts(tmp_path: Path) -> None:
    pod = Pod(tmp_path)
    c = pod.collector()
    pod.publish(throttled_ns=5_000_000_000, start_time_ns=1, cgroup_id=77)
    first = throttled(tick(c))
    pod.publish(throttled_ns=6_000_000_000, start_time_ns=1, cgroup_id=77)
    second = throttled(tick(c))
    # The container restarts: same pid, a new cgroup whose counter starts from zero.
    pod.publish(throttled_ns=500_000_000, start_time_ns=2, cgroup_id=78)
    third = throttled(tick(c))
    pod.publish(throttled_ns=1_500_000_000, start_time_ns=2, cgroup_id=78)
    fourth = throttled(tick(c))
    assert [first, second, third, fourth] == pytest.approx([5.0, 6.0, 6.5, 7.5])


def test_switching_source_never_makes_the_counter_jump_or_go_down(tmp_path: Path) -> None:
    pod = Pod(tmp_path)
    c = pod.collector()
    pod.publish(throttled_ns=2_000_000_000)
    first = tick(c)
    # A new trainer process (pid 11) whose cgroup the sidecar can read: 50 s there, another base.
    os.remove(probe_path(str(pod.probe), PID))
    pod.make_trainer_cgroup_visible(throttled_usec=50_000_000, pid=11)
    pod.publish(throttled_ns=2_000_000_000, pid=11)
    second = tick(c)
    pod.make_trainer_cgroup_visible(throttled_usec=51_000_000, pid=11)
    third = tick(c)
    assert [source(first), source(second), source(third)] == ["probe", "cgroup", "cgroup"]
    assert [throttled(first), throttled(second), throttled(third)] == pytest.approx([2.0, 2.0, 3.0])


def test_sourced_counter_adds_only_the_increases_of_the_chosen_source() -> None:
    counter = SourcedCounter()
    assert counter.update("probe", {"probe": 4.0, "cgroup": None}) == 4.0
    assert counter.update("probe", {"probe": 5.0, "cgroup": 100.0}) == 5.0
    assert counter.update("cgroup", {"probe": 9.0, "cgroup": 102.0}) == 7.0
    assert counter.update(None, {"probe": None, "cgroup": None}) == 7.0
    assert counter.update("probe", {"probe": 10.0, "cgroup": None}) == 7.0  # absent last tick: no delta


def test_the_source_in_use_is_logged_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pod = Pod(tmp_path)
    pod.publish(throttled_ns=1)
    c = pod.collector()
    with caplog.at_level(logging.INFO, logger="dam_sidecar"):
        tick(c)
        tick(c)
    lines = [r.getMessage() for r in caplog.records if "container CPU throttling" in r.getMessage()]
    assert len(lines) == 1 and "published by the probe" in lines[0]


def test_the_window_builder_sees_the_throttled_ratio_from_the_probe_fallback(tmp_path: Path) -> None:
    pod = Pod(tmp_path)
    c = pod.collector()
    pod.publish(throttled_ns=10_000_000_000, limit_millicores=2000)
    before = tick(c)
    pod.publish(throttled_ns=16_000_000_000, limit_millicores=2000)  # 6 s throttled in a 10 s window
    after = tick(c)
    assert after.series(n.CONTAINER_CPU_SOURCE)[labels_of({"source": "probe"})] == 1.0
    obs = observation_from_snapshots(before, after, elapsed_seconds=10.0)
    assert obs.cpu_throttled_ratio == pytest.approx(0.6)
    assert obs.cpu_limit_cores == pytest.approx(2.0)
