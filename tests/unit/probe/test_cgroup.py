"""The probe reads its own cgroup's CPU throttling and limit and publishes them in the probe file."""

from __future__ import annotations

from pathlib import Path

import pytest

import dam_probe
from dam_probe._core import Probe
from dam_probe.cgroup import REFRESH_NS, RETRY_NS, CgroupReader
from dam_probe.layout import probe_files, read_file

from .conftest import probe_lines, python_env, run_python


def v2_tree(root: Path, *, throttled_usec: int = 2_500_000, cpu_max: str = "150000 100000") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text("cpu memory\n")
    (root / "cpu.stat").write_text(
        f"usage_usec 900000\nuser_usec 1\nsystem_usec 1\nnr_periods 40\nnr_throttled 7\n"
        f"throttled_usec {throttled_usec}\n"
    )
    (root / "cpu.max").write_text(f"{cpu_max}\n")
    return root


def v1_tree(root: Path, hierarchy: str = "cpu,cpuacct", *, throttled_ns: int = 750_000_000) -> Path:
    d = root / hierarchy
    d.mkdir(parents=True, exist_ok=True)
    (root / "memory").mkdir(exist_ok=True)
    (d / "cpu.stat").write_text(f"nr_periods 10\nnr_throttled 2\nthrottled_time {throttled_ns}\n")
    (d / "cpu.cfs_quota_us").write_text("200000\n")
    (d / "cpu.cfs_period_us").write_text("100000\n")
    return d


def reader(root: Path, self_cgroup: str = "0::/\n", tmp: Path | None = None) -> CgroupReader:
    proc = (tmp or root.parent) / "self-cgroup"
    proc.write_text(self_cgroup)
    return CgroupReader(str(root), proc_self_cgroup=str(proc))


def test_cgroup_v2_throttled_usec_and_cpu_max_are_read_in_ns_and_millicores(tmp_path: Path) -> None:
    root = v2_tree(tmp_path / "cg")
    throttled, limit, cgroup_id = reader(root).read(1) or (None, None, None)
    assert throttled == 2_500_000_000
    assert limit == 1500
    assert cgroup_id == root.stat().st_ino


def test_cgroup_v2_without_a_limit_publishes_zero_millicores(tmp_path: Path) -> None:
    root = v2_tree(tmp_path / "cg", throttled_usec=0, cpu_max="max 100000")
    assert reader(root).read(1) == (0, 0, root.stat().st_ino)


@pytest.mark.parametrize("hierarchy", ["cpu,cpuacct", "cpu"])
def test_cgroup_v1_throttled_time_and_cfs_quota_over_period(tmp_path: Path, hierarchy: str) -> None:
    d = v1_tree(tmp_path / "cg", hierarchy)
    assert reader(tmp_path / "cg", "4:cpu,cpuacct:/docker/abc\n").read(1) == (
        750_000_000,
        2000,
        d.stat().st_ino,
    )


def test_cgroup_v1_without_a_quota_publishes_no_limit(tmp_path: Path) -> None:
    d = v1_tree(tmp_path / "cg")
    (d / "cpu.cfs_quota_us").write_text("-1\n")
    read = reader(tmp_path / "cg").read(1)
    assert read is not None and read[1] == 0


def test_the_process_own_nested_cgroup_is_read_when_it_is_visible(tmp_path: Path) -> None:
    root = v2_tree(tmp_path / "cg", throttled_usec=1)  # the root: not this process's cgroup
    own = v2_tree(root / "kubepods" / "pod1" / "trainer", throttled_usec=3_000_000, cpu_max="50000 100000")
    read = reader(root, "0::/kubepods/pod1/trainer\n").read(1)
    assert read == (3_000_000_000, 500, own.stat().st_ino)


def test_a_cgroup_path_outside_the_root_falls_back_to_the_root(tmp_path: Path) -> None:
    root = v2_tree(tmp_path / "cg", throttled_usec=4)
    read = reader(root, "0::/../../elsewhere\n").read(1)
    assert read is not None and read[0] == 4000


def test_values_are_read_at_most_once_per_refresh_interval(tmp_path: Path) -> None:
    root = v2_tree(tmp_path / "cg", throttled_usec=1_000)
    r = reader(root)
    first = r.read(10)
    v2_tree(root, throttled_usec=9_000)
    assert r.read(10 + REFRESH_NS - 1) == first
    later = r.read(10 + REFRESH_NS)
    assert first is not None and later is not None
    assert (first[0], later[0]) == (1_000_000, 9_000_000)


@pytest.mark.parametrize(
    "breakage",
    ["missing root", "no throttled_usec", "garbage cpu.max", "no cpu.max", "negative counter"],
)
def test_a_missing_or_broken_cgroup_reads_as_unknown_and_is_retried_only_rarely(
    tmp_path: Path, breakage: str
) -> None:
    root = tmp_path / "cg"
    if breakage != "missing root":
        v2_tree(root)
    if breakage == "no throttled_usec":
        (root / "cpu.stat").write_text("usage_usec 5\n")
    elif breakage == "garbage cpu.max":
        (root / "cpu.max").write_text("lots 100000\n")
    elif breakage == "no cpu.max":
        (root / "cpu.max").unlink()
    elif breakage == "negative counter":
        (root / "cpu.stat").write_text("throttled_usec -5\n")
    tmp_path.mkdir(exist_ok=True)
    r = reader(root, tmp=tmp_path)
    assert r.read(1) is None
    v2_tree(root)  # repaired: seen only after the retry interval, not at the next refresh
    assert r.read(1 + REFRESH_NS) is None
    assert r.read(1 + RETRY_NS) is not None


def _train(n: int) -> None:
    for _ in dam_probe.instrument(list(range(n))):
        pass


def test_a_real_probe_publishes_its_cgroup_v2_values_in_the_probe_file(
    probe: Probe, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = v2_tree(tmp_path / "cg", throttled_usec=4_200_000, cpu_max="250000 100000")
    monkeypatch.setenv("DAM_PROBE_CGROUP_ROOT", str(root))
    _train(20)
    probe.close()
    (path,) = probe_files(str(tmp_path / "probes"))
    rec = read_file(path)
    assert rec.steps == 20 and rec.closed
    assert rec.cgroup_throttled_ns == 4_200_000_000
    assert rec.cgroup_limit_cores == pytest.approx(2.5)
    assert rec.cgroup_id == root.stat().st_ino


def test_a_real_probe_publishes_its_cgroup_v1_values_in_the_probe_file(
    probe: Probe, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    v1_tree(tmp_path / "cg", throttled_ns=123_456_789)
    monkeypatch.setenv("DAM_PROBE_CGROUP_ROOT", str(tmp_path / "cg"))
    _train(5)
    probe.close()
    (path,) = probe_files(str(tmp_path / "probes"))
    rec = read_file(path)
    assert (rec.steps, rec.cgroup_throttled_ns, rec.cgroup_limit_millicores) == (5, 123_456_789, 2000)


def test_a_probe_without_a_readable_cgroup_trains_and_publishes_the_fields_as_unknown(
    probe: Probe, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "cg"
    broken.mkdir()
    (broken / "cgroup.controllers").write_text("cpu\n")
    (broken / "cpu.stat").write_text("\x00\xff not a stat file")
    monkeypatch.setenv("DAM_PROBE_CGROUP_ROOT", str(broken))
    probe.interval_ns = 0  # publish on every batch: every publish meets the broken cgroup
    _train(50)
    probe.close()
    assert probe.step.steps == 50 and not probe.disabled
    assert probe_lines(capsys.readouterr().err) == []
    rec = read_file(probe_files(str(tmp_path / "probes"))[0])
    assert rec.steps == 50 and rec.closed
    assert rec.cgroup_throttled_ns is None and rec.cgroup_limit_cores is None


def test_a_training_subprocess_publishes_the_cgroup_named_by_the_environment(tmp_path: Path) -> None:
    root = v2_tree(tmp_path / "cg", throttled_usec=77, cpu_max="100000 100000")
    env = python_env(DAM_PROBE_DIR=str(tmp_path / "probes"), DAM_PROBE_CGROUP_ROOT=str(root))
    done = run_python(
        """
        import dam_probe
        for _ in dam_probe.instrument(range(10)):
            pass
        """,
        env,
    )
    assert done.returncode == 0, done.stderr
    assert probe_lines(done.stderr) == []
    rec = read_file(probe_files(str(tmp_path / "probes"))[0])
    assert (rec.steps, rec.closed, rec.cgroup_throttled_ns, rec.cgroup_limit_cores) == (10, True, 77_000, 1.0)


def test_shared_parsers_read_v2_and_v1_figures() -> None:
    from dam_probe import cgroup

    assert cgroup.throttled_ns("usage_usec 9\nthrottled_usec 1500\n", v2=True) == 1_500_000
    assert cgroup.throttled_ns("nr_periods 3\nthrottled_time 42\n", v2=False) == 42
    with pytest.raises(KeyError):
        cgroup.throttled_ns("usage_usec 9\n", v2=True)
    assert cgroup.limit_cores_v2("200000 100000\n") == 2.0
    assert cgroup.limit_cores_v2("max 100000\n") is None
    assert cgroup.limit_cores_v1(50000, 100000) == 0.5
    assert cgroup.limit_cores_v1(-1, 100000) is None


def test_a_cgroup_path_of_another_namespace_is_not_resolved(tmp_path: Path) -> None:
    from dam_probe import cgroup

    (tmp_path / "kubepods" / "pod1").mkdir(parents=True)
    (tmp_path / "kubepods" / "pod1" / "cpu.stat").write_text("throttled_usec 0\n")
    found = cgroup.cgroup_directory("0::/kubepods/pod1\n", str(tmp_path), v2=True)
    assert found == str(tmp_path / "kubepods" / "pod1")
    assert cgroup.cgroup_directory("0::/../other\n", str(tmp_path), v2=True) is None
