"""What the probe costs a training loop, next to torch.profiler: time per batch and memory.

Prints, in one run:

1. micro: the probe's own cost per item on a plain Python iterable (no DataLoader noise),
   for ``dam_probe.instrument`` and for the automatic ``__next__`` hook;
2. DataLoader: time added per batch (median of ``--repeats`` interleaved repeats of
   ``--batches`` batches) by the probe's automatic hook and by ``torch.profiler.profile``
   (CPU activity), over a bare loop on a trivial in-memory dataset (batch_size 4, 0 workers);
3. RSS growth over ``--rss-batches`` batches for each, each in a fresh child process
   (RSS read from /proc/self/statm);
4. collectives (2 ranks, gloo, ``torch.multiprocessing.spawn``, the probe's automatic
   instrumentation installed as ``sitecustomize`` would): time added per collective, timed
   vs bare in the same run, interleaved: a synchronous ``all_reduce`` of 1 KiB, an
   asynchronous one waited on, and a DDP step (many small buckets, little compute) timed the
   default way (DDP's own runtime statistics, sample rate 1, read once a step) and with the
   probe's timing comm hook (``DAM_PROBE_DDP_TIMING=hook``), each against DDP built and run
   without the probe (its original ``__init__`` and ``_pre_forward``), with an A/A control;
   plus the wrapper's own cost on a no-op "collective" (no torch, no network noise);

and PASS/FAIL against the targets: probe <= 0.5 us/batch added, <= 1 MiB growth,
<= 2 us added per collective.

    .venv/bin/python benchmarks/probe_overhead.py [--batches 20000] [--repeats 5] [--rss-batches 200000]
    .venv/bin/python benchmarks/probe_overhead.py --only collectives [--collective-calls 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

TARGET_US = 0.5
TARGET_MIB = 1.0
TARGET_COLLECTIVE_US = 2.0
VARIANTS = ("bare", "probe", "profiler")


def rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        resident_pages = int(fh.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE") / 2**20


# -- 1. micro ----------------------------------------------------------------------------------


def micro(items: int, repeats: int) -> dict[str, float]:
    """ns per item added by instrument() and by the hook, on plain Python iteration.

    Medians of interleaved repeats, and the best (minimum) run of each, which is
    what the code costs when the machine is not busy with anything else.
    """
    import dam_probe
    from dam_probe._autohook import timed_next

    data = list(range(items))

    class Plain:
        __slots__ = ("i",)

        def __init__(self) -> None:
            self.i = 0

        def __iter__(self) -> Plain:
            return self

        def __next__(self) -> int:
            i = self.i
            if i >= items:
                raise StopIteration
            self.i = i + 1
            return i

    class Hooked(Plain):
        __slots__ = ()

    Hooked.__next__ = timed_next(Plain.__next__)  # type: ignore[method-assign]

    def loop(it: Any) -> float:
        start = time.perf_counter_ns()
        for _ in it:
            pass
        return (time.perf_counter_ns() - start) / items

    runs: dict[str, list[float]] = {"list": [], "instrument": [], "plain": [], "hooked": []}
    for _ in range(repeats):
        runs["list"].append(loop(iter(data)))
        runs["instrument"].append(loop(dam_probe.instrument(data)))
        runs["plain"].append(loop(Plain()))
        runs["hooked"].append(loop(Hooked()))
    med = {k: statistics.median(v) for k, v in runs.items()}
    best = {k: min(v) for k, v in runs.items()}
    return {
        "instrument_ns": med["instrument"] - med["list"],
        "hook_ns": med["hooked"] - med["plain"],
        "instrument_best_ns": best["instrument"] - best["list"],
        "hook_best_ns": best["hooked"] - best["plain"],
        "list_ns": med["list"],
        "plain_next_ns": med["plain"],
    }


# -- 2. DataLoader timing ----------------------------------------------------------------------


def make_loader() -> Any:
    from torch.utils.data import DataLoader

    return DataLoader(list(range(1_000_000)), batch_size=4, num_workers=0)


def run_loop(loader: Any, n: int) -> float:
    """Seconds for ``n`` batches of a loop that does nothing with them."""
    start = time.perf_counter()
    it = iter(loader)
    for _ in range(n):
        try:
            next(it)
        except StopIteration:
            it = iter(loader)
            next(it)
    return time.perf_counter() - start


class Hook:
    """Installs / removes the probe's automatic DataLoader hook in this process."""

    def __init__(self) -> None:
        import torch.utils.data.dataloader as dl

        self.cls = dl._BaseDataLoaderIter
        self.orig = self.cls.__dict__["__next__"]

    def __enter__(self) -> Hook:
        from dam_probe._autohook import timed_next

        self.cls.__next__ = timed_next(self.orig)
        return self

    def __exit__(self, *exc: object) -> None:
        self.cls.__next__ = self.orig


def run_variant(variant: str, loader: Any, n: int, inside: Callable[[], None] | None = None) -> float:
    if variant == "bare":
        seconds = run_loop(loader, n)
    elif variant == "probe":
        with Hook():
            seconds = run_loop(loader, n)
    else:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]):
            seconds = run_loop(loader, n)
            if inside is not None:
                inside()
    return seconds


def dataloader_timing(n: int, repeats: int) -> dict[str, float]:
    loader = make_loader()
    run_loop(loader, 2000)  # warm-up
    per_batch: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(repeats):
        for variant in VARIANTS:  # interleaved, so drifts in machine load hit all alike
            per_batch[variant].append(run_variant(variant, loader, n) / n * 1e6)
    return {v: statistics.median(x) for v, x in per_batch.items()}


# -- 3. RSS growth (child process per variant) ---------------------------------------------------


def child(variant: str, n: int) -> None:
    loader = make_loader()
    run_loop(loader, 2000)  # warm-up: import-time and first-batch allocations are not growth
    result: dict[str, float] = {}
    if variant == "probe":
        # The probe's one-time costs (its file, the FLOP count once after warm-up, which imports
        # PyTorch's FLOP counter) are its own line, not growth: run until the count is behind.
        from dam_probe._core import PROBE
        from dam_probe.layout import FLOPS_PENDING

        start, deadline = rss_mib(), time.monotonic() + 30
        run_variant("probe", loader, 2000)
        while PROBE.goodput.flops.state == FLOPS_PENDING and time.monotonic() < deadline:
            run_variant("probe", loader, 2000)
        result["one_time_mib"] = rss_mib() - start
    before = rss_mib()

    def measure() -> None:  # inside the profiler session, before its (slow) post-processing
        result["after"] = rss_mib()

    seconds = run_variant(variant, loader, n, inside=measure)
    result.setdefault("after", rss_mib())
    result.update(before=before, us_per_batch=seconds / n * 1e6)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    os._exit(0)  # skip the profiler's result processing and interpreter teardown


def rss_growth(n: int, probe_dir: str) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    env = dict(os.environ, DAM_PROBE_DIR=probe_dir, PYTHONWARNINGS="ignore")
    for variant in VARIANTS:
        proc = subprocess.run(
            [sys.executable, __file__, "--child", variant, "--rss-batches", str(n)],
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=600,
        )
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        if proc.returncode != 0 or not lines:
            raise SystemExit(f"child {variant} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
        out[variant] = json.loads(lines[-1])
    return out


# -- 4. collectives (2 ranks, gloo) --------------------------------------------------------------


def collective_micro(calls: int, repeats: int) -> dict[str, float]:
    """ns added by the collective wrapper around a no-op function (its own cost, no torch)."""
    from dam_probe._comm import timed_collective
    from dam_probe._core import Probe

    p = Probe()
    p.comm_on = True
    p.comm.next_ns = 1 << 62  # never publish: the file is not what is measured here

    class T:
        nbytes = 1024

    def noop(tensor: object, op: object = None, group: object = None, async_op: bool = False) -> None:
        return None

    timed = timed_collective(noop, 0, "tensor", p)
    t = T()
    bare_runs: list[float] = []
    timed_runs: list[float] = []
    for _ in range(repeats):
        for fn, runs in ((noop, bare_runs), (timed, timed_runs)):
            t0 = time.perf_counter_ns()
            for _ in range(calls):
                fn(t)
            runs.append((time.perf_counter_ns() - t0) / calls)
    return {
        "added_ns": statistics.median(timed_runs) - statistics.median(bare_runs),
        "added_best_ns": min(timed_runs) - min(bare_runs),
    }


def _rank_main(rank: int, cfg: dict[str, Any]) -> None:
    """One rank of the collective benchmark (spawned); rank 0 writes the figures to ``cfg["out"]``."""
    world, calls, steps, repeats = cfg["world"], cfg["calls"], cfg["steps"], cfg["repeats"]
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(cfg["port"]), RANK=str(rank), WORLD_SIZE=str(world)
    )
    from dam_probe import _autohook

    _autohook.install()  # what sitecustomize does, before torch is imported
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from dam_probe import _comm

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    bare_all_reduce = _comm.ORIGINALS["all_reduce"]

    def per_call_us(fn: Callable[[], None], n: int) -> float:
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        return (time.perf_counter_ns() - t0) / n / 1000

    x = torch.ones(256)  # 1 KiB
    variants: dict[str, tuple[Callable[[], None], Callable[[], None]]] = {
        "sync": (lambda: bare_all_reduce(x), lambda: dist.all_reduce(x)),
        # A/A control: bare against bare, the same alternation; what the pairing itself reads.
        "control": (lambda: bare_all_reduce(x), lambda: bare_all_reduce(x)),
        "async": (
            lambda: bare_all_reduce(x, async_op=True).wait(),
            lambda: dist.all_reduce(x, async_op=True).wait(),
        ),
    }

    def net() -> Any:
        torch.manual_seed(0)
        return torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(12)])

    import types

    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    original_pre_forward: Any = getattr(DistributedDataParallel._pre_forward, "__wrapped__")  # noqa: B009

    def untimed() -> Any:  # DDP built by its original __init__ and forward: nothing of the probe's
        model = DistributedDataParallel.__new__(DistributedDataParallel)
        original_init: Any = getattr(DistributedDataParallel.__init__, "__wrapped__")  # noqa: B009
        original_init(model, net(), bucket_cap_mb=0.004)
        object.__setattr__(model, "_pre_forward", types.MethodType(original_pre_forward, model))
        return model

    stats = DistributedDataParallel(net(), bucket_cap_mb=0.004)  # the default: DDP's own statistics
    assert getattr(stats, _comm.STATS_SLOT, None) is not None, "DDP statistics not in use"
    hooked = untimed()  # DAM_PROBE_DDP_TIMING=hook: the probe's timing comm hook
    assert _comm._attach(hooked, _comm.make_ddp_hook())
    object.__setattr__(hooked, "_pre_forward", types.MethodType(original_pre_forward, hooked))
    plain = untimed()
    plain2 = untimed()
    stock = untimed()  # torch's own Python allreduce_hook: what any Python comm hook costs
    stock.register_comm_hook(None, default_hooks.allreduce_hook)
    batch = torch.randn(8, 32)

    def step(model: Any) -> Callable[[], None]:
        def run() -> None:
            model.zero_grad(set_to_none=True)
            model(batch).sum().backward()

        return run

    for model in (stats, hooked, plain, plain2, stock):  # warm-up: DDP rebuilds its buckets
        for _ in range(5):
            step(model)()
    stats(batch)  # a forward: DDP computes the last step's statistics
    logger: Any = stats.logger
    buckets = logger._get_ddp_logging_data().ints_map["num_buckets_reduced"]
    variants["ddp_control"] = (step(plain), step(plain2))
    variants["ddp_stats"] = (step(plain), step(stats))
    variants["ddp_hook"] = (step(plain), step(hooked))
    variants["ddp_hook_vs_python_hook"] = (step(stock), step(hooked))
    results: dict[str, Any] = {"buckets_per_step": buckets}
    for name, (bare, timed) in variants.items():
        n = steps if name.startswith("ddp") else calls
        for fn in (bare, timed):
            per_call_us(fn, max(10, n // 10))  # warm-up
        runs: dict[str, list[float]] = {"bare": [], "timed": []}
        for _ in range(repeats):
            for label, fn in (("bare", bare), ("timed", timed)):
                dist.barrier()
                runs[label].append(per_call_us(fn, n))
        results[name] = {k: statistics.median(v) for k, v in runs.items()}
        results[name]["best_bare"] = min(runs["bare"])
        results[name]["best_timed"] = min(runs["timed"])
        # Paired: bare and timed alternate call by call, and the median of the differences is
        # taken, so load that comes and goes on a shared machine hits both alike.
        diffs: list[float] = []
        clock = time.perf_counter_ns
        dist.barrier()
        for _ in range(n * repeats // 2):
            t0 = clock()
            bare()
            t1 = clock()
            timed()
            t2 = clock()
            diffs.append(((t2 - t1) - (t1 - t0)) / 1000)
        results[name]["paired_median"] = statistics.median(diffs)
    if rank == 0:
        with open(cfg["out"], "w") as fh:
            json.dump(results, fh)
    dist.barrier()
    dist.destroy_process_group()


def collectives(calls: int, steps: int, repeats: int, probe_dir: str) -> dict[str, Any]:
    import socket

    from torch.multiprocessing import spawn  # type: ignore[attr-defined]

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    out = os.path.join(probe_dir, "collectives.json")
    os.environ["DAM_PROBE_DIR"] = probe_dir
    cfg = {"world": 2, "port": port, "calls": calls, "steps": steps, "repeats": repeats, "out": out}
    spawn(_rank_main, args=(cfg,), nprocs=2)  # type: ignore[no-untyped-call]
    with open(out) as fh:
        result: dict[str, Any] = json.load(fh)
    return result


def print_collectives(c: dict[str, Any], micro_ns: dict[str, float], calls: int, steps: int) -> float:
    """Prints the collective figures; returns the worst added µs per collective (medians)."""
    print(f"collectives (2 ranks, gloo, {calls} calls / {steps} DDP steps per repeat):")
    added_ns, best_ns = micro_ns["added_ns"], micro_ns["added_best_ns"]
    print(f"  wrapper on a no-op function adds {added_ns:6.0f} ns (best {best_ns:.0f} ns)")
    worst = 0.0
    buckets = max(1, int(c["buckets_per_step"]))
    for name, label, per in (
        ("control", "A/A control: bare vs bare", 1),
        ("sync", "all_reduce 1 KiB, synchronous", 1),
        ("async", "all_reduce 1 KiB, async + wait", 1),
        ("ddp_control", f"DDP step, {buckets} buckets, A/A", buckets),
        ("ddp_stats", "  DDP's statistics vs C++", buckets),
        ("ddp_hook", "  timing comm hook vs C++", buckets),
        ("ddp_hook_vs_python_hook", "  hook vs torch's Python hook", buckets),
    ):
        r = c[name]
        added = r["paired_median"] / per
        best = (r["best_timed"] - r["best_bare"]) / per
        if name in ("sync", "async", "ddp_stats"):  # what the probe adds by default
            worst = max(worst, added)
        per_step = f" ({r['paired_median']:+7.1f} us per step)" if name.startswith("ddp") else ""
        print(
            f"  {label:<32} bare {r['bare']:8.1f} us, timed {r['timed']:8.1f} us: "
            f"{added:+6.2f} us per collective{per_step} (paired median; best runs {best:+.2f})"
        )
    return worst


# -- main -----------------------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--batches", type=int, default=20_000, help="batches per timing repeat (default 20000)"
    )
    parser.add_argument("--repeats", type=int, default=5, help="timing repeats, median reported (default 5)")
    parser.add_argument(
        "--rss-batches", type=int, default=200_000, help="batches for RSS growth (default 200000)"
    )
    parser.add_argument(
        "--micro-items", type=int, default=200_000, help="items per micro repeat (default 200000)"
    )
    parser.add_argument("--micro-repeats", type=int, default=15, help="micro repeats (default 15)")
    parser.add_argument(
        "--collective-calls", type=int, default=2000, help="collective calls per repeat (default 2000)"
    )
    parser.add_argument("--ddp-steps", type=int, default=300, help="DDP steps per repeat (default 300)")
    parser.add_argument(
        "--only", choices=("all", "collectives"), default="all", help="run every part (default) or one"
    )
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if min(args.batches, args.repeats, args.rss_batches, args.micro_items, args.micro_repeats) <= 0:
        parser.error(
            "--batches, --repeats, --rss-batches, --micro-items and --micro-repeats must be positive"
        )

    if args.child:
        child(args.child, args.rss_batches)
        return 0

    if args.only == "collectives":
        with tempfile.TemporaryDirectory(prefix="dam-probe-bench-") as probe_dir:
            os.environ.pop("DAM_PROBE_DISABLE", None)
            print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} (1 min)")
            cm = collective_micro(200_000, args.micro_repeats)
            c = collectives(args.collective_calls, args.ddp_steps, args.repeats, probe_dir)
            worst = print_collectives(c, cm, args.collective_calls, args.ddp_steps)
        ok = worst <= TARGET_COLLECTIVE_US
        print(f"  <= {TARGET_COLLECTIVE_US} us added per collective: {worst:.2f} us {verdict(ok)}")
        return 0 if worst <= TARGET_COLLECTIVE_US else 1

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dam-probe-bench-") as probe_dir:
        os.environ["DAM_PROBE_DIR"] = probe_dir
        os.environ.pop("DAM_PROBE_DISABLE", None)

        print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} (1 min)")
        m = micro(args.micro_items, args.micro_repeats)
        print(f"micro (plain Python iteration, {args.micro_items} items, {args.micro_repeats} repeats):")
        print("                              median     best")
        print(f"  bare list iteration       {m['list_ns']:8.1f}            ns/item")
        print(
            f"  dam_probe.instrument adds {m['instrument_ns']:8.1f} {m['instrument_best_ns']:8.1f}   ns/item"
        )
        print(f"  bare __next__ method      {m['plain_next_ns']:8.1f}            ns/item")
        print(f"  automatic hook adds       {m['hook_ns']:8.1f} {m['hook_best_ns']:8.1f}   ns/item")

        t = dataloader_timing(args.batches, args.repeats)
        print(f"DataLoader (batch_size 4, 0 workers, {args.batches} batches, median of {args.repeats}):")
        print(f"  bare                        {t['bare']:8.2f} us/batch")
        for v in ("probe", "profiler"):
            print(f"  {v:<10} adds              {t[v] - t['bare']:8.2f} us/batch")

        r = rss_growth(args.rss_batches, probe_dir)
        print(f"RSS growth over {args.rss_batches} batches (fresh process each):")
        for v in VARIANTS:
            grow = r[v]["after"] - r[v]["before"]
            print(f"  {v:<10} {grow:8.2f} MiB   ({r[v]['us_per_batch']:.2f} us/batch in that run)")
        once = r["probe"].get("one_time_mib", 0.0)
        print(f"  probe, once at start (its file and the one FLOP count): {once:.1f} MiB")
        files = sorted(f for f in os.listdir(probe_dir) if f.startswith("probe-"))
        cm = collective_micro(200_000, args.micro_repeats)
        c = collectives(args.collective_calls, args.ddp_steps, args.repeats, probe_dir)
        worst = print_collectives(c, cm, args.collective_calls, args.ddp_steps)

    probe_us = max(m["instrument_ns"], m["hook_ns"]) / 1000
    probe_best_us = max(m["instrument_best_ns"], m["hook_best_ns"]) / 1000
    probe_mib = r["probe"]["after"] - r["probe"]["before"]
    print("targets:")
    print(
        f"  probe's own cost <= {TARGET_US} us/batch: median {probe_us:.3f} us "
        f"{verdict(probe_us <= TARGET_US)}; best {probe_best_us:.3f} us {verdict(probe_best_us <= TARGET_US)}"
    )
    dl_added = t["probe"] - t["bare"]
    print(
        f"  probe on DataLoader <= {TARGET_US} us/batch: {dl_added:.3f} us  {verdict(dl_added <= TARGET_US)}"
        "  (DataLoader noise between repeats is of the same order)"
    )
    print(f"  probe RSS growth <= {TARGET_MIB} MiB: {probe_mib:.2f} MiB  {verdict(probe_mib <= TARGET_MIB)}")
    print(
        f"  <= {TARGET_COLLECTIVE_US} us added per collective: {worst:.2f} us "
        f"{verdict(worst <= TARGET_COLLECTIVE_US)}"
    )
    print(f"probe files written: {len(files)}; total {time.perf_counter() - started:.0f} s")
    ok = probe_us <= TARGET_US and probe_mib <= TARGET_MIB and worst <= TARGET_COLLECTIVE_US
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
