"""A small, real PyTorch training job with a tunable input pipeline.

Used by `make demo`, the tests and the docs. Three shapes of the same job:

  starved   a slow ``__getitem__`` (decode stand-in), 0 DataLoader workers
  fixed     the same dataset, with workers and prefetching
  compute   a heavy model and an in-memory dataset (fast loader)

Nothing in this file knows about dam: run it under ``dam run -- python
examples/train.py --scenario starved`` and the DataLoader is instrumented
automatically.

``--calibrate`` sizes the three shapes for this machine (``make demo`` runs it first) and
prints the sizes as JSON: the model widths and the per-sample delay such that a step's
compute clearly dominates the loader's own CPU cost per batch, the starved loader takes
``STARVED_LOAD`` steps' compute per batch, and the fixed shape's ``WORKERS`` workers deliver
batches ``WORKERS / STARVED_LOAD`` times faster than the step consumes them. A fast machine gets a wider
model; a slow one a narrower model; the margins stay.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SlowDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Each sample costs ``delay_s`` of blocking I/O-like latency (a stand-in for JPEG decode)."""

    def __init__(self, size: int, features: int, delay_s: float) -> None:
        self.size = size
        self.features = features
        self.delay_s = delay_s

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.delay_s:
            time.sleep(self.delay_s)
        g = torch.Generator().manual_seed(index)
        x = torch.randn(self.features, generator=g)
        return x, (x.sum() > 0).long()


FEATURES = 256
"""Input width of the starved and fixed shapes (the compute shape: ``COMPUTE_FEATURES``)."""
COMPUTE_FEATURES = 512


def mlp(features: int, hidden: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 2)
    )


def build(
    scenario: str, args: argparse.Namespace
) -> tuple[DataLoader[tuple[torch.Tensor, torch.Tensor]], nn.Module]:
    if scenario == "compute":
        dataset: Dataset[tuple[torch.Tensor, torch.Tensor]] = SlowDataset(100_000, COMPUTE_FEATURES, 0.0)
        model = mlp(COMPUTE_FEATURES, args.compute_hidden)
        return DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=0), model
    dataset = SlowDataset(100_000, FEATURES, args.sample_delay_ms / 1000.0)
    model = mlp(FEATURES, args.hidden)
    if scenario == "fixed":
        loader = DataLoader(
            dataset,
            batch_size=args.batch_size,
            shuffle=True,
            num_workers=args.workers,
            prefetch_factor=4,
            persistent_workers=True,
        )
    else:
        loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=0)
    return loader, model


# --- calibration (--calibrate) -------------------------------------------------------------------
STEP_FLOOR_S = 0.010
"""A starved/fixed step computes at least this long: far above a batch's own loading cost on any
CPU, yet short enough for many steps in a few seconds."""
STEP_CEILING_S = 0.100
"""And the target is at most this long, so that a window of a few seconds still holds enough steps."""
LOAD_MARGIN = 30
"""A step computes at least this many times what the main process spends on one batch of the
dataset without its delay: loading it itself (0 workers; the compute shape, whose model computes
twice as long, keeps a data wait near 1 / (2 LOAD_MARGIN)), or taking a ready one from workers
(the fixed shape: unpickling it and fetching its tensors' shared memory from the worker, about
1.4 ms on a 2-core VM, which is 14 % of a 10 ms step even with the queue full)."""
STARVED_LOAD = 4.0
"""The starved loader spends this many steps' compute on each batch: a data wait of about
STARVED_LOAD / (STARVED_LOAD + 1), 80 %, far above the 10 % screen, and still above it if a busy
machine makes the compute 30 times as slow (its delay is a sleep, which a busy machine does not
slow). ``WORKERS`` workers then deliver WORKERS / STARVED_LOAD = 4 times as fast as the step
consumes; a busy machine only slows the step, which widens that margin."""
WORKERS = 16
"""The fixed shape's DataLoader workers (they sleep, the I/O stand-in: more than the cores is fine)."""
WIDTHS = (256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192)
"""The hidden widths calibration tries, narrowest first: the first whose step reaches the target."""


def _step_seconds(features: int, hidden: int, batch_size: int, steps: int = 4) -> float:
    """A training step's (forward, backward, SGD) time of ``mlp(features, hidden)`` on torch's
    threads of an idle machine, from below: the fewest CPU seconds the step takes on one thread,
    over the threads.

    CPU time, not wall time: on a machine busy with other work a step waits for the CPU, and a
    wall-clock figure would take a narrow model for a wide one; the demo would then run a model
    whose step no longer dominates its loader's costs as soon as the machine is idle again. One
    thread, so that no thread spins waiting for another that is not running (CPU time that is
    no work). Over the threads it is at most the idle wall time (they cannot share the work
    better than evenly), so the width chosen is, if anything, wider than needed: the margins
    hold, and a busy machine while the demo runs only slows the step, which widens them."""
    model = mlp(features, hidden)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.randn(batch_size, features)
    y = (x.sum(dim=1) > 0).long()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    times = []
    try:
        for i in range(steps + 1):  # a warm-up step (allocator, kernels)
            t0 = time.thread_time()
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
            if i >= 1:
                times.append((time.thread_time() - t0) / threads)
    finally:
        torch.set_num_threads(threads)
    return min(times)


def _load_seconds(features: int, batch_size: int, batches: int = 20) -> float:
    """The median batch the main process loads from the dataset without its delay (0 workers)."""
    it = iter(DataLoader(SlowDataset(100_000, features, 0.0), batch_size=batch_size, shuffle=True))
    times = []
    for _ in range(batches + 1):
        t0 = time.perf_counter()
        next(it)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def _receive_seconds(features: int, batch_size: int, workers: int = 2) -> float:
    """The median time the main process takes to get a batch that workers have ready (their
    queue full: prefetched while it slept), as in the fixed shape."""
    loader = DataLoader(
        SlowDataset(100_000, features, 0.0),
        batch_size=batch_size,
        shuffle=True,
        num_workers=workers,
        prefetch_factor=4,
    )
    it = iter(loader)
    next(it)  # the workers are up
    time.sleep(0.5)  # and have filled their queue (4 batches each)
    times = []
    for _ in range(workers * 4 - 1):
        t0 = time.perf_counter()
        next(it)
        times.append(time.perf_counter() - t0)
    del it
    return statistics.median(times)


def _width_for(features: int, target_s: float, batch_size: int) -> tuple[int, float]:
    """The narrowest width of ``WIDTHS`` whose step takes at least ``target_s`` here (the widest
    when none does), and its step time."""
    for hidden in WIDTHS:
        seconds = _step_seconds(features, hidden, batch_size)
        if seconds >= target_s:
            break
    return hidden, seconds


def calibrate(batch_size: int) -> dict[str, float | int]:
    """The three shapes' sizes for this machine (see the module's docstring)."""
    torch.manual_seed(0)
    load = max(_load_seconds(FEATURES, batch_size), _load_seconds(COMPUTE_FEATURES, batch_size))
    receive = _receive_seconds(FEATURES, batch_size)
    target = min(max(STEP_FLOOR_S, LOAD_MARGIN * max(load, receive)), STEP_CEILING_S)
    hidden, step = _width_for(FEATURES, target, batch_size)
    compute_hidden, compute_step = _width_for(COMPUTE_FEATURES, 2 * target, batch_size)
    # The starved batch costs STARVED_LOAD steps: the delay adds what the loading's CPU does not.
    delay = max((STARVED_LOAD * step - load) / batch_size, 0.0002)
    return {
        "loadSeconds": round(load, 6),
        "receiveSeconds": round(receive, 6),
        "hidden": hidden,
        "stepSeconds": round(step, 6),
        "computeHidden": compute_hidden,
        "computeStepSeconds": round(compute_step, 6),
        "sampleDelayMs": round(delay * 1000, 3),
        "workers": WORKERS,
        "threads": torch.get_num_threads(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scenario", choices=["starved", "fixed", "compute"], default="starved")
    parser.add_argument("--seconds", type=float, default=12.0, help="train for this long (default 12)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=8, help="DataLoader workers in the fixed scenario")
    parser.add_argument("--sample-delay-ms", type=float, default=2.0, help="cost of one __getitem__ in ms")
    parser.add_argument("--hidden", type=int, default=2048, help="hidden width of the starved/fixed model")
    parser.add_argument("--compute-hidden", type=int, default=2048, help="hidden width of the compute model")
    parser.add_argument(
        "--calibrate", action="store_true", help="print the sizes for this machine as JSON, and exit"
    )
    args = parser.parse_args()
    if args.calibrate:
        print(json.dumps(calibrate(args.batch_size)), flush=True)
        return
    # The demo machine may have fewer cores than workers; the workers mostly sleep (I/O stand-in).
    warnings.filterwarnings("ignore", message="This DataLoader will create")

    torch.manual_seed(0)
    loader, model = build(args.scenario, args)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    deadline = time.monotonic() + args.seconds
    steps = 0
    while time.monotonic() < deadline:
        for x, y in loader:
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            steps += 1
            if time.monotonic() >= deadline:
                break
    print(f"train.py: scenario={args.scenario} steps={steps} loss={loss.item():.3f}", flush=True)


if __name__ == "__main__":
    main()
