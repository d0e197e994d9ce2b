"""The collective wrappers' arithmetic, in process and without torch (fake works and futures)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from dam_probe import _comm
from dam_probe._core import Probe, rank_identity
from dam_probe.layout import probe_files, read_file


class Tensor:
    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes


class Work:
    """A fake torch Work: complete when the test says so; ``wait`` moves the fake clock to then."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock
        self.done_at: int | None = None
        self.waited = False

    def is_completed(self) -> bool:
        return self.done_at is not None and (self.clock is None or self.clock.now >= self.done_at)

    def wait(self) -> bool:
        self.waited = True
        if self.clock is not None and self.done_at is not None and self.clock.now < self.done_at:
            self.clock.now = self.done_at  # blocked until the collective completes
        return True


class Clock:
    """A fake perf_counter_ns the tests move by hand."""

    def __init__(self) -> None:
        self.now = 1_000

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(_comm, "perf_counter_ns", c)
    return c


@pytest.fixture
def p() -> Probe:
    """A probe whose training thread is this one, past its first batch (where a collective's wait
    is communication: _comm.exposed_here)."""
    fresh = Probe()
    fresh.goodput.train_thread = threading.get_ident()
    fresh.comm_on = True
    fresh.comm.next_ns = 1 << 62  # these tests look at counters, not at the file
    return fresh


def counters(p: Probe) -> tuple[int, int, int, int]:
    return p.comm.count, p.comm.ns, p.comm.exposed_ns, p.comm.nbytes


def test_a_synchronous_collective_counts_whole_as_exposed_with_its_bytes(clock: Clock, p: Probe) -> None:
    def all_reduce(tensor: Tensor, op: object = None, group: object = None, async_op: bool = False) -> None:
        clock.now += 500

    timed = _comm.timed_collective(all_reduce, 0, "tensor", p)
    timed(Tensor(4096))
    timed(tensor=Tensor(8))
    assert counters(p) == (2, 1000, 1000, 4104)


def test_overlapping_asynchronous_collectives_count_once_in_time_and_waits_are_exposed(
    clock: Clock, p: Probe
) -> None:
    works: list[Work] = []

    def all_reduce(tensor: Tensor, async_op: bool = False) -> Work:
        works.append(Work(clock))
        return works[-1]

    timed = _comm.timed_collective(all_reduce, 0, "tensor", p)
    wait = _comm.timed_wait(Work.wait, p)
    a = timed(Tensor(100), async_op=True)  # in flight from t=1000
    clock.now += 200
    b = timed(Tensor(50), async_op=True)  # from t=1200, overlapping a
    works[0].done_at, works[1].done_at = 1500, 1900
    assert counters(p) == (0, 0, 0, 0)  # nothing seen complete yet
    clock.now = 1600
    wait(a)  # already complete: its flight ends at the call, no time exposed
    assert (p.comm.count, p.comm.exposed_ns) == (1, 0)
    wait(b)  # blocks from 1600 until 1900: exposed; the busy period ran 1000..1900
    assert counters(p) == (2, 900, 300, 150)
    assert a.waited and b.waited
    assert _comm.PENDING == {}


def test_a_work_nobody_waits_on_ends_when_a_sweep_finds_it_complete(clock: Clock, p: Probe) -> None:
    works: list[Work] = []

    def all_reduce(tensor: Tensor) -> Work:
        works.append(Work(clock))
        return works[-1]

    timed = _comm.timed_collective(all_reduce, 0, "tensor", p)
    timed(Tensor(10))
    works[0].done_at = 1100
    clock.now = 1050
    _comm.sweep(clock.now)  # not complete yet
    assert p.comm.count == 0
    clock.now = 1300
    timed(Tensor(20))  # the next collective sweeps: the first ends as of now
    assert (p.comm.count, p.comm.nbytes, p.comm.ns) == (1, 10, 300)  # the second is still in flight
    works[1].done_at = 1300
    _comm.sweep(1400)
    assert (p.comm.count, p.comm.nbytes, p.comm.ns, p.comm.exposed_ns) == (2, 30, 400, 0)


def test_pending_works_are_bounded(clock: Clock, p: Probe) -> None:
    timed = _comm.timed_collective(lambda tensor: Work(), 0, "tensor", p)
    for _ in range(_comm.MAX_PENDING + 10):
        timed(Tensor(1))
    assert len(_comm.PENDING) == _comm.MAX_PENDING
    _comm.PENDING.clear()


def test_a_collective_inside_another_timed_call_is_not_counted_twice(clock: Clock, p: Probe) -> None:
    def barrier() -> None:
        clock.now += 10

    inner = _comm.timed_collective(barrier, 0, None, p)

    def all_gather_object() -> None:  # a timed call whose body issues another timed collective
        inner()
        clock.now += 5

    outer = _comm.timed_collective(all_gather_object, 0, None, p)
    outer()
    assert counters(p) == (1, 15, 15, 0)
    inner()  # on its own it counts
    assert p.comm.count == 2


def test_a_collective_that_raises_counts_nothing_and_the_next_one_counts(clock: Clock, p: Probe) -> None:
    def broken(tensor: Tensor) -> None:
        raise RuntimeError("peer gone")

    with pytest.raises(RuntimeError, match="peer gone"):
        _comm.timed_collective(broken, 0, "tensor", p)(Tensor(1))
    assert counters(p) == (0, 0, 0, 0)
    assert _comm.LOCAL.depth == 0


def test_a_sync_collective_during_an_async_one_is_not_counted_twice_in_time(clock: Clock, p: Probe) -> None:
    works: list[Work] = []

    def async_op(tensor: Tensor) -> Work:
        works.append(Work(clock))
        return works[-1]

    def sync_op(tensor: Tensor) -> None:
        clock.now += 100

    _comm.timed_collective(async_op, 0, "tensor", p)(Tensor(1))  # busy from 1000
    _comm.timed_collective(sync_op, 0, "tensor", p)(Tensor(1))  # 1000..1100, inside
    works[0].done_at = 1150
    _comm.timed_wait(Work.wait, p)(works[0])  # blocks 1100..1150
    assert (p.comm.count, p.comm.ns, p.comm.exposed_ns) == (2, 150, 150)


def test_wrappers_keep_the_name_signature_and_a_mark(p: Probe) -> None:
    def all_reduce(tensor: object, op: object = None, group: object = None, async_op: bool = False) -> None:
        """Docs."""

    timed = _comm.timed_collective(all_reduce, 0, "tensor", p)
    import inspect

    assert timed.__name__ == "all_reduce" and timed.__doc__ == "Docs."
    assert list(inspect.signature(timed).parameters) == ["tensor", "op", "group", "async_op"]
    assert getattr(timed, _comm.MARK) is True and timed.__wrapped__ is all_reduce


def test_nbytes_of_sums_lists_and_treats_unknown_as_zero() -> None:
    class Sparse:
        @property
        def nbytes(self) -> int:
            raise RuntimeError("sparse tensors have no nbytes")

    assert _comm.nbytes_of([Tensor(3), (Tensor(4), Tensor(5))]) == 12
    assert _comm.nbytes_of(Sparse()) == 0
    assert _comm.nbytes_of(None) == 0


def test_the_collective_path_publishes_the_file_with_rank_identity(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DAM_PROBE_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    p = Probe()
    p.comm_on = True
    _comm.timed_collective(lambda tensor: None, 0, "tensor", p)(Tensor(64))
    try:
        (path,) = probe_files(str(tmp_path))
        rec = read_file(path)
    finally:
        p.close()
    assert (rec.rank, rec.local_rank, rec.world_size) == (3, 1, 4)
    assert rec.collectives == 1 and rec.collective_bytes == 64 and rec.steps == 0


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, (None, None, None)),
        ({"RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "8"}, (2, 0, 8)),
        ({"RANK": "x", "LOCAL_RANK": "-1", "WORLD_SIZE": "99999999999"}, (None, None, None)),
    ],
)
def test_rank_identity_reads_the_launcher_variables(
    env: dict[str, str], expected: tuple[int | None, int | None, int | None]
) -> None:
    assert rank_identity(env) == expected


CHECK_PATCHED = """
import json
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed import distributed_c10d as c10d
print(json.dumps({
    "all_reduce": hasattr(dist.all_reduce, "_dam_probe_timed"),
    "c10d_barrier": hasattr(c10d.barrier, "_dam_probe_timed"),
    "ddp": hasattr(DDP.__init__, "_dam_probe_timed"),
    "wait": hasattr(c10d.Work.wait, "_dam_probe_timed"),
}))
"""


@pytest.mark.parametrize(("setting", "patched"), [(None, True), ("0", False)])
def test_importing_torch_patches_collectives_and_ddp_unless_turned_off(
    tmp_path: Path, setting: str | None, patched: bool
) -> None:
    import json

    from dam_probe.bootstrap import install_into

    from .conftest import probe_lines, python_env, run_python

    pytest.importorskip("torch")
    env = python_env(PYTHONPATH=install_into(str(tmp_path / "site")), DAM_PROBE_DIR=str(tmp_path / "p"))
    if setting is not None:
        env["DAM_PROBE_COLLECTIVES"] = setting
    result = run_python(CHECK_PATCHED, env)
    assert result.returncode == 0, result.stderr
    assert probe_lines(result.stderr) == []
    assert set(json.loads(result.stdout).values()) == {patched}


def _step(start: int, comm: int, overlap: int, buckets: int = 3) -> dict[str, int]:
    """``DDPLoggingData.ints_map`` once DDP computed a step's figures (ns; CLOCK_REALTIME stamps)."""
    return {
        "iteration": 7,
        "total_parameter_size_bytes": 4096,
        "backward_comm_time": comm,
        "backward_compute_comm_overlap_time": overlap,
        "backward_comm_time_start": start,
        "backward_comm_time_end": start + comm,
        "num_buckets_reduced": buckets,
    }


def test_ddp_statistics_add_each_synchronising_step_once_with_its_exposed_part(p: Probe) -> None:
    state = _comm.DdpStats(logger=None, nbytes=4096)
    assert _comm.count_step(state, _step(10_000, comm=900, overlap=600), p)
    # The next forward without a backward re-measures the same events: not counted again.
    assert not _comm.count_step(state, _step(10_000, comm=900, overlap=600), p)
    # Communication fully hidden by the backward pass (overlap beyond comm): nothing exposed.
    assert _comm.count_step(state, _step(20_000, comm=500, overlap=700, buckets=2), p)
    assert counters(p) == (5, 1400, 300, 8192)


def test_ddp_statistics_without_timings_or_buckets_count_nothing(p: Probe) -> None:
    state = _comm.DdpStats(logger=None, nbytes=4096)
    first = {"iteration": 0, "total_parameter_size_bytes": 4096}  # before the first step
    assert not _comm.count_step(state, first, p)
    assert not _comm.count_step(state, _step(30_000, comm=400, overlap=100, buckets=0), p)
    assert counters(p) == (0, 0, 0, 0)


@pytest.mark.parametrize(
    ("value", "mode"),
    [(None, "stats"), ("", "stats"), ("hook", "hook"), (" HOOK ", "hook"), ("stats", "stats")],
)
def test_ddp_timing_defaults_to_ddps_statistics_and_hook_selects_the_comm_hook(
    value: str | None, mode: str
) -> None:
    env = {} if value is None else {"DAM_PROBE_DDP_TIMING": value}
    assert _comm.ddp_timing_by_env(env) == mode
