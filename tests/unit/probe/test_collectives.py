"""Collectives and DDP gradient buckets are timed with no code change: real torch, real gloo, 2 ranks.

Each test module run starts the ranks once (``torch.multiprocessing.spawn``)
under ``sitecustomize`` on ``PYTHONPATH``, the way ``dam run`` and the pod's
init container arrange it, and every rank reports what its probe counted after
each phase.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dam_probe.bootstrap import install_into
from dam_probe.layout import probe_files, read_file

from .conftest import probe_lines, python_env, run_python

pytest.importorskip("torch")

TRAIN = r"""
import json, os, sys, time
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

LATE = float(os.environ.get("LATE_SECONDS", "0"))


def snap():
    from dam_probe import PROBE
    deadline = time.monotonic() + 10
    while PROBE.comm.inflight and time.monotonic() < deadline:
        time.sleep(0.01)  # completion callbacks still to run on gloo's threads
    with PROBE.comm.lock:
        return {"count": PROBE.comm.count, "ns": PROBE.comm.ns, "exposed": PROBE.comm.exposed_ns,
                "bytes": PROBE.comm.nbytes}


def flush(model):
    # A synchronising forward: DDP computes the previous step's runtime statistics here (and the
    # probe reads them); a forward without a backward adds nothing of its own.
    model(torch.zeros(1, 64))


def net():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(6)])


def steps(model, n, rank, late=0.0):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    for _ in range(n):
        x = torch.randn(16, 64, generator=g)
        if late:
            time.sleep(late)
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()


def run(rank, world, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    report = {"rank": rank, "start_before_batch": snap()}
    # 0. Before the first batch the time is startup: a collective there is counted, not exposed.
    dist.all_reduce(torch.ones(64))
    report["before_batch"] = snap()
    import dam_probe
    for _ in dam_probe.instrument([0]):
        pass  # the first batch: from here the training thread's waits are communication
    report["start"] = snap()

    # 1. DDP with the automatic hook; in the "late" run rank 1 sleeps before every step.
    model = DDP(net(), bucket_cap_mb=0.01)
    report["hooked"] = hasattr(model, "_dam_probe_comm")
    report["stats"] = hasattr(model, "_dam_probe_stats")
    steps(model, 8, rank, LATE if rank == 1 else 0.0)
    flush(model)
    report["ddp"] = snap()
    flush(model)  # again: the same figures are not counted twice
    report["ddp_again"] = snap()
    # The gradient DDP averaged equals the mean of every rank's own gradient.
    plain = net()
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(100 + rank))
    plain.load_state_dict(model.module.state_dict())
    plain(x).square().mean().backward()
    model.zero_grad()
    model(x).square().mean().backward()
    report["ddp_step_count"] = snap()["count"] - report["ddp"]["count"]
    expected = [p.grad.clone() for p in plain.parameters()]
    for t in expected:
        dist.all_reduce(t)
        t /= world
    got = [p.grad for p in model.module.parameters()]
    report["grads_match"] = all(torch.allclose(a, b, atol=1e-6) for a, b in zip(expected, got))
    if LATE:
        finish(report, out)
        return
    # 1b. A collective from another thread (an async_save's writer) overlaps the training: not exposed.
    import threading
    other = {}
    def background():
        b0 = snap()
        dist.all_reduce(torch.ones(64))
        other["delta"] = {k: snap()[k] - b0[k] for k in b0}
    worker = threading.Thread(target=background)
    worker.start()
    worker.join()
    report["background"] = other["delta"]
    # 1c. A collective inside a checkpoint save (dcp.save gathers its plan): the save's time.
    from dam_probe import PROBE
    from dam_probe._checkpoint import timed_save
    def save_with_a_collective():
        dist.all_reduce(torch.ones(64))
    s0 = snap()
    timed_save(save_with_a_collective, PROBE)()
    report["in_save"] = {k: snap()[k] - s0[k] for k in s0}
    before = snap()

    # 2. Explicit collectives: synchronous, a barrier, asynchronous waited on, positional async_op.
    t = torch.ones(1024)
    dist.all_reduce(t)
    dist.barrier()
    work = dist.all_reduce(torch.ones(256), async_op=True)
    work.wait()
    work2 = dist.all_reduce(torch.ones(256), dist.ReduceOp.SUM, None, True)
    work2.wait()
    out_list = [torch.empty(8) for _ in range(world)]
    dist.all_gather(out_list, torch.full((8,), float(rank)))
    report["explicit_before"] = before
    report["explicit"] = snap()
    report["gathered"] = [o[0].item() for o in out_list]

    # 3. A user's own comm hook, registered after construction: it runs, and it is timed once per bucket.
    calls = []

    def my_hook(state, bucket):
        calls.append(bucket.index())
        return default_hooks.allreduce_hook(state, bucket)

    model2 = DDP(net(), bucket_cap_mb=0.01)
    model2.register_comm_hook(dist.group.WORLD, my_hook)
    try:
        model2.register_comm_hook(None, my_hook)
        report["second_hook_error"] = None
    except Exception as exc:
        report["second_hook_error"] = f"{type(exc).__name__}: {exc}"
    before = snap()
    steps(model2, 3, rank)
    flush(model2)
    report["user_hook_calls"] = len(calls)
    report["user_hook"] = snap()
    report["user_hook_before"] = before

    # 4. A built-in hook type becomes its Python twin.
    model3 = DDP(net(), bucket_cap_mb=0.01)
    model3._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
    before = snap()
    steps(model3, 2, rank)
    flush(model3)
    report["builtin_before"] = before
    report["builtin"] = snap()

    # 5. Gradient accumulation: two no_sync micro-batches, then a synchronising one, three times.
    model4 = DDP(net(), bucket_cap_mb=0.01)
    opt = torch.optim.SGD(model4.parameters(), lr=0.01)
    before = snap()
    for _ in range(3):
        for _ in range(2):
            with model4.no_sync():
                model4(torch.randn(16, 64)).square().mean().backward()
        model4(torch.randn(16, 64)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    flush(model4)
    with torch.no_grad():
        model4(torch.randn(16, 64))  # an evaluation forward reads nothing
    report["accumulate_before"] = before
    report["accumulate"] = snap()

    finish(report, out)


def finish(report, out):
    report["pid"] = os.getpid()
    with open(os.path.join(out, f"rank{report['rank']}.json"), "w") as fh:
        json.dump(report, fh)
    dist.barrier()
    dist.destroy_process_group()
    # The report is written and the group is gone. Run the exit handlers (the probe's final,
    # closed publish is one), then leave without the rest of the interpreter's teardown: gloo's
    # worker thread drops the last all-reduce, which holds a Python object (the backward pass's
    # context); when that happens after finalization began the process aborts ("terminate called
    # without an active exception", pytorch/pytorch#179291 and #190489; seen without the probe too).
    import atexit

    atexit._run_exitfuncs()
    os._exit(0)


if __name__ == "__main__":
    mp.spawn(run, args=(2, int(sys.argv[1]), sys.argv[2]), nprocs=2)
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(tmp: Path, late: float, timing: str = "") -> tuple[list[dict[str, Any]], Path, str]:
    site = install_into(str(tmp / "site"))
    script = tmp / "train.py"
    script.write_text(TRAIN)
    probes = tmp / "probes"
    out = tmp / "out"
    out.mkdir()
    env = python_env(PYTHONPATH=site, DAM_PROBE_DIR=str(probes), LATE_SECONDS=str(late), OMP_NUM_THREADS="1")
    if timing:
        env["DAM_PROBE_DDP_TIMING"] = timing
    code = (
        f"import runpy, sys; sys.argv = ['train.py', '{_free_port()}', '{out}']; "
        f"runpy.run_path('{script}', run_name='__main__')"
    )
    result = run_python(code, env, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    return reports, probes, result.stderr


Run = tuple[list[dict[str, Any]], Path, str]
STATS_LINE = "dam-probe: DDP timed from DDP's runtime statistics"
HOOK_LINE = "dam-probe: DDP timed by a communication hook (DAM_PROBE_DDP_TIMING=hook)"


@pytest.fixture(scope="module", params=["", "hook"], ids=["ddp-statistics", "comm-hook"])
def balanced(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Run:
    return _run(tmp_path_factory.mktemp("balanced"), 0.0, request.param)


def _delta(report: dict[str, Any], phase: str, before: str) -> dict[str, int]:
    return {k: report[phase][k] - report[before][k] for k in report[phase]}


def _hook_mode(stderr: str) -> bool:
    return HOOK_LINE in probe_lines(stderr)


def test_one_line_says_how_ddp_is_timed_and_the_default_keeps_ddps_own_all_reduce(balanced: Run) -> None:
    reports, _, stderr = balanced
    lines = probe_lines(stderr)
    assert lines in ([STATS_LINE] * 2, [HOOK_LINE] * 2)  # one per rank process
    for r in reports:
        # Statistics: no Python comm hook on the reducer (DDP keeps its C++ all-reduce).
        assert (r["stats"], r["hooked"]) == ((False, True) if _hook_mode(stderr) else (True, False))


def test_ddp_buckets_are_counted_and_exposed_time_stays_within_collective_time(balanced: Run) -> None:
    reports, _, _ = balanced
    for r in reports:
        ddp = _delta(r, "ddp", "start")
        assert ddp["count"] >= 8 * 2  # several buckets a step (bucket_cap_mb is tiny)
        assert ddp["bytes"] == 8 * 6 * (64 * 64 + 64) * 4  # every gradient went through once a step
        assert 0 < ddp["exposed"] <= ddp["ns"]
        assert r["ddp_again"] == r["ddp"]  # a forward without a backward counts nothing again
        assert r["grads_match"] is True  # the gradients are averaged exactly as DDP does


def test_a_collective_before_the_first_batch_or_off_the_training_thread_is_counted_not_exposed(
    balanced: Run,
) -> None:
    """One cause per second: before the first batch the time is startup; a background thread's
    collective (an ``async_save`` writer's) overlaps the training."""
    reports, _, _ = balanced
    for r in reports:
        d = _delta(r, "before_batch", "start_before_batch")
        assert (d["count"], d["bytes"], d["exposed"]) == (1, 64 * 4, 0), d
        assert d["ns"] > 0
        assert (r["background"]["count"], r["background"]["exposed"]) == (1, 0), r["background"]
        assert (r["in_save"]["count"], r["in_save"]["exposed"]) == (1, 0), r["in_save"]


def test_explicit_collectives_sync_async_and_barrier_are_counted(balanced: Run) -> None:
    reports, _, _ = balanced
    for r in reports:
        d = _delta(r, "explicit", "explicit_before")
        assert d["count"] == 5  # all_reduce, barrier, two async all_reduce, all_gather
        assert d["bytes"] == 1024 * 4 + 0 + 256 * 4 * 2 + 8 * 4
        assert 0 < d["exposed"] <= d["ns"]
        assert r["gathered"] == [0.0, 1.0]  # the wrapped collectives still do their job


def test_a_users_own_comm_hook_runs_and_each_bucket_is_counted_once(balanced: Run) -> None:
    reports, _, _ = balanced
    for r in reports:
        assert r["user_hook_calls"] >= 3 * 2
        d = _delta(r, "user_hook", "user_hook_before")
        # The all_reduce inside the user's hook is not counted a second time.
        assert d["count"] == r["user_hook_calls"]
        assert 0 < d["exposed"] <= d["ns"]
        assert r["second_hook_error"] is not None and "once" in r["second_hook_error"]
        b = _delta(r, "builtin", "builtin_before")
        assert b["count"] >= 2 * 2
        assert b["bytes"] == 2 * 6 * (64 * 64 + 64) * 4


def test_no_sync_accumulation_steps_count_nothing_and_the_synchronising_ones_once(balanced: Run) -> None:
    reports, _, _ = balanced
    for r in reports:
        d = _delta(r, "accumulate", "accumulate_before")
        assert d["bytes"] == 3 * 6 * (64 * 64 + 64) * 4  # three synchronising steps of nine
        assert d["count"] >= 3
        assert 0 < d["exposed"] <= d["ns"]


def test_each_rank_writes_its_own_probe_file_with_its_identity_and_counters(balanced: Run) -> None:
    reports, probes, _ = balanced
    records = {read_file(p).pid: read_file(p) for p in probe_files(str(probes))}
    for r in reports:
        rec = records[r["pid"]]
        assert (rec.rank, rec.local_rank, rec.world_size) == (r["rank"], r["rank"], 2)
        assert rec.closed
        assert rec.collectives is not None and rec.collectives >= r["accumulate"]["count"]
        assert rec.collective_ns is not None and rec.collective_exposed_ns is not None
        assert 0 < rec.collective_exposed_ns <= rec.collective_ns
        assert rec.collective_bytes is not None and rec.collective_bytes >= r["accumulate"]["bytes"]


@pytest.mark.parametrize("timing", ["", "hook"], ids=["ddp-statistics", "comm-hook"])
def test_a_late_rank_makes_the_other_rank_wait_in_its_collectives(tmp_path: Path, timing: str) -> None:
    reports, _, _ = _run(tmp_path, 0.05, timing)
    prompt, late = (_delta(r, "ddp", "start") for r in reports)
    # 8 steps 50 ms late: rank 0 waits for rank 1 in its buckets; rank 1 hardly waits.
    assert prompt["ns"] - late["ns"] > 0.2e9
    assert prompt["exposed"] > late["exposed"]
    assert 0 < late["exposed"] <= late["ns"]
