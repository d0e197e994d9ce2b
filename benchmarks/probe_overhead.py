"""What the probe costs a training loop, next to torch.profiler: time per batch and memory.

Prints, in one run:

1. micro: the probe's own cost per item on a plain Python iterable (no DataLoader noise),
   for ``dam_probe.instrument`` and for the automatic ``__next__`` hook;
2. DataLoader: time added per batch (median of ``--repeats`` interleaved repeats of
   ``--batches`` batches) by the probe's automatic hook and by ``torch.profiler.profile``
   (CPU activity), over a bare loop on a trivial in-memory dataset (batch_size 4, 0 workers);
3. RSS growth over ``--rss-batches`` batches for each, each in a fresh child process
   (RSS read from /proc/self/statm);

and PASS/FAIL against the targets: probe <= 0.5 us/batch added, <= 1 MiB growth.

    .venv/bin/python benchmarks/probe_overhead.py [--batches 20000] [--repeats 5] [--rss-batches 200000]
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
    if variant == "probe":
        run_variant("probe", loader, 2000)
    before = rss_mib()
    result: dict[str, float] = {}

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
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if min(args.batches, args.repeats, args.rss_batches, args.micro_items, args.micro_repeats) <= 0:
        parser.error(
            "--batches, --repeats, --rss-batches, --micro-items and --micro-repeats must be positive"
        )

    if args.child:
        child(args.child, args.rss_batches)
        return 0

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
        files = sorted(os.listdir(probe_dir))

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
    print(f"probe files written: {len(files)}; total {time.perf_counter() - started:.0f} s")
    return 0 if probe_us <= TARGET_US and probe_mib <= TARGET_MIB else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
