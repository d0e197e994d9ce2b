"""Per-rank series: probe counters and collective counters labelled by rank, rank identity, exposition."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import CollectorRegistry

from dam_contract import names as n
from dam_contract.names import MetricSpec
from dam_contract.snapshot import Snapshot, labels_of, parse
from dam_probe.layout import RANK_TOTALS, total_key
from dam_sidecar.collector import SidecarCollector, build_collector
from dam_sidecar.collectors import probe as probe_collector
from dam_sidecar.errors import ErrorLog
from dam_sidecar.samplers.probe import ProbeReader
from dam_sidecar.settings import SidecarSettings

from .conftest import write_probe

NOW_NS = 2_000 * 10**9
COLL = {
    "collectives": 10,
    "collective_ns": 2 * 10**9,
    "collective_exposed_ns": 5 * 10**8,
    "collective_bytes": 4096,
}


def setup(tmp_path: Path, *pids: int) -> tuple[Path, ProbeReader]:
    probe, proc = tmp_path / "probe", tmp_path / "proc"
    probe.mkdir(exist_ok=True)
    for pid in pids:
        (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    return probe, ProbeReader(str(probe), ErrorLog(), proc_root=str(proc), clock_ns=lambda: NOW_NS)


def by_rank(reader: ProbeReader) -> dict[int | None, object]:
    return {r.rank: r for r in reader.sample().ranks}


def test_each_rank_has_its_own_totals_and_the_job_totals_are_their_sums(tmp_path: Path) -> None:
    probe, r = setup(tmp_path, 10, 11)
    write_probe(probe, pid=10, rank=0, world_size=2, steps=5, wait_ns=10**9, **COLL)
    write_probe(
        probe, pid=11, rank=1, world_size=2, steps=7, wait_ns=3 * 10**9, **{**COLL, "collectives": 12}
    )
    s = r.sample()
    ranks = {x.rank: x for x in s.ranks}
    assert set(ranks) == {0, 1}
    assert (ranks[0].steps, ranks[1].steps, s.steps) == (5, 7, 12)
    assert ranks[1].wait_seconds == pytest.approx(3.0) and s.wait_seconds == pytest.approx(4.0)
    assert (ranks[0].collectives, ranks[1].collectives) == (10, 12)
    assert ranks[0].totals["collective_seconds"] == pytest.approx(2.0)
    assert ranks[0].collective_exposed_seconds == pytest.approx(0.5)
    assert [(i.rank, i.world_size) for i in s.rank_info] == [(0, 2), (1, 2)]


def test_a_process_without_rank_or_collective_counters_reads_as_unranked_and_unknown(tmp_path: Path) -> None:
    probe, r = setup(tmp_path, 10)
    write_probe(probe, pid=10, steps=3)
    (only,) = r.sample().ranks
    assert only.rank is None and only.steps == 3 and only.collectives is None


def test_a_rank_keeps_its_count_when_its_process_restarts(tmp_path: Path) -> None:
    probe, r = setup(tmp_path, 10, 20)
    path = write_probe(probe, pid=10, rank=1, steps=50, **COLL)
    r.sample()
    Path(path).unlink()  # rank 1 restarts as pid 20 (elastic restart), counters from zero
    write_probe(probe, pid=20, start_time_ns=9, rank=1, steps=4, **{**COLL, "collectives": 1})
    ranks = by_rank(r)
    assert ranks[1].steps == 54 and ranks[1].collectives == 11  # type: ignore[attr-defined]


def test_a_process_that_learns_its_rank_late_never_makes_a_series_go_down(tmp_path: Path) -> None:
    probe, r = setup(tmp_path, 10)
    write_probe(probe, pid=10, steps=5, last_update_ns=1)  # before init_process_group: no rank
    assert by_rank(r)[None].steps == 5  # type: ignore[attr-defined]
    write_probe(probe, pid=10, rank=3, steps=8, last_update_ns=2)
    ranks = by_rank(r)
    assert ranks[None].steps == 5  # type: ignore[attr-defined]  # what it counted before stays there
    assert ranks[3].steps == 3  # type: ignore[attr-defined]  # only what it counted since
    write_probe(probe, pid=10, rank=3, steps=10, last_update_ns=3, closed=True)
    ranks = by_rank(r)
    assert ranks[None].steps == 5 and ranks[3].steps == 5  # type: ignore[attr-defined]
    assert r.sample().steps == 10


# --- the exposition ---------------------------------------------------------------------------------


def collector(tmp_path: Path) -> SidecarCollector:
    (tmp_path / "proc").mkdir(exist_ok=True)
    return build_collector(
        SidecarSettings(probe_dir=str(tmp_path / "probe"), proc_root=str(tmp_path / "proc")), use_nvml=False
    )


def snap_of(tmp_path: Path) -> tuple[SidecarCollector, Snapshot]:
    c = collector(tmp_path)
    c.sample_now()
    return c, c.snapshot()


def test_probe_series_carry_a_rank_label_when_the_process_has_a_rank(tmp_path: Path) -> None:
    probe, _ = setup(tmp_path, 10, 11)
    write_probe(probe, pid=10, rank=0, local_rank=0, world_size=2, steps=5, batch_size=8, **COLL)
    write_probe(probe, pid=11, rank=1, local_rank=1, world_size=2, steps=7, batch_size=8, **COLL)
    _, snap = snap_of(tmp_path)
    assert snap.series(n.STEPS_TOTAL) == {labels_of({"rank": "0"}): 5, labels_of({"rank": "1"}): 7}
    assert snap.series(n.COLLECTIVES_TOTAL) == {labels_of({"rank": "0"}): 10, labels_of({"rank": "1"}): 10}
    assert snap.series(n.COLLECTIVE_SECONDS_TOTAL)[labels_of({"rank": "1"})] == pytest.approx(2.0)
    assert snap.series(n.COLLECTIVE_EXPOSED_SECONDS_TOTAL)[labels_of({"rank": "0"})] == pytest.approx(0.5)
    assert snap.series(n.COLLECTIVE_BYTES_TOTAL)[labels_of({"rank": "0"})] == 4096
    assert snap.series(n.BATCH_SIZE) == {labels_of({"rank": "0"}): 8, labels_of({"rank": "1"}): 8}
    assert snap.series(n.PROCESS_RANK_INFO) == {
        labels_of({"rank": "0", "local_rank": "0", "world_size": "2"}): 1,
        labels_of({"rank": "1", "local_rank": "1", "world_size": "2"}): 1,
    }
    assert snap.series(n.PROBE_UP) == {(): 1.0}  # not per rank


def test_without_a_rank_the_series_have_no_label_and_no_collective_series(tmp_path: Path) -> None:
    probe, _ = setup(tmp_path, 10)
    write_probe(probe, pid=10, steps=3)
    _, snap = snap_of(tmp_path)
    assert snap.series(n.STEPS_TOTAL) == {(): 3}
    assert not {n.COLLECTIVES_TOTAL, n.COLLECTIVE_SECONDS_TOTAL, n.PROCESS_RANK_INFO} & snap.names()


def test_without_any_probe_file_the_step_counters_read_zero_unlabelled(tmp_path: Path) -> None:
    (tmp_path / "probe").mkdir()
    _, snap = snap_of(tmp_path)
    assert snap.series(n.STEPS_TOTAL) == {(): 0}


def test_mixed_ranked_and_unranked_samples_render_as_valid_exposition(tmp_path: Path) -> None:
    probe, _ = setup(tmp_path, 10, 11)
    write_probe(probe, pid=10, rank=0, steps=5, **COLL)
    write_probe(probe, pid=11, steps=2)  # e.g. a helper process without a rank
    c, snap = snap_of(tmp_path)
    assert snap.series(n.STEPS_TOTAL) == {labels_of({"rank": "0"}): 5, (): 2}
    # The client library renders the same samples from collect() (the OpenMetrics path uses it).
    registry = CollectorRegistry(auto_describe=False)
    registry.register(c)
    library = {(s.name, s.labels, s.value) for s in parse(generate_latest(registry).decode())}
    ours = {(s.name, s.labels, s.value) for s in parse(c.text().decode())}
    assert library == ours
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed")
    result = subprocess.run([promtool, "check", "metrics"], input=c.text(), capture_output=True, check=False)
    assert result.returncode == 0, result.stderr.decode()


# --- the field table drives the per-rank totals --------------------------------------------------

# Every group a summed field belongs to, filled (a group is published whole or not at all).
GROUPS: dict[str, int] = {
    **COLL,
    "process_start_ns": 1,
    "startup_ns": 3 * 10**9,
    "productive_ns": 7 * 10**9,
    "other_ns": 10**9,
    "flops_state": 0,
    "checkpoint_ns": 2 * 10**9,
    "checkpoint_step_ns": 0,
    "checkpoints": 2,
    "last_checkpoint_ns": 0,
    "last_checkpoint_steps": 0,
}


@pytest.mark.parametrize(("name", "unit"), RANK_TOTALS[3:], ids=str)
def test_every_summed_field_of_the_table_is_carried_per_rank_across_a_restart(
    tmp_path: Path, name: str, unit: str
) -> None:
    probe, r = setup(tmp_path, 10, 20)
    first = write_probe(probe, pid=10, rank=1, steps=5, **{**GROUPS, name: 40})
    r.sample()
    Path(first).unlink()  # rank 1 restarts as pid 20: its counters start from zero
    write_probe(probe, pid=20, start_time_ns=9, rank=1, steps=1, **{**GROUPS, name: 2})
    write_probe(probe, pid=30, start_time_ns=9, rank=2, steps=1)  # publishes none of the groups
    (tmp_path / "proc" / "30").mkdir()
    ranks = {x.rank: x for x in r.sample().ranks}
    scale = 1e-9 if unit == "ns" else 1.0
    assert ranks[1].totals[total_key(name, unit)] == pytest.approx(42 * scale)
    assert total_key(name, unit) not in ranks[2].totals  # unknown, not zero


def test_a_family_declared_on_a_rank_total_is_exported_per_rank_without_collector_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    extra = MetricSpec(
        "dam_test_startup_seconds_total",
        "counter",
        "A test family.",
        n.RANK_LABELS,
        "probe",
        "totals.startup_seconds",
    )
    monkeypatch.setattr(probe_collector, "_PER_RANK", (*probe_collector._PER_RANK, extra))
    probe = tmp_path / "probe"
    probe.mkdir()
    write_probe(probe, pid=10, rank=0, steps=5, **GROUPS)
    write_probe(probe, pid=11, steps=5)  # no rank and no goodput accounting: no series
    _, snap = snap_of(tmp_path)
    assert snap.series("dam_test_startup_seconds_total") == {(("rank", "0"),): pytest.approx(3.0)}
