"""A small, real PyTorch training job with a tunable input pipeline.

Used by `make demo`, the tests and the docs. Three shapes of the same job:

  starved   a slow ``__getitem__`` (decode stand-in), 0 DataLoader workers
  fixed     the same dataset, with workers and prefetching
  compute   a heavy model and an in-memory dataset (fast loader)

Nothing in this file knows about dam: run it under ``dam run -- python
examples/train.py --scenario starved`` and the DataLoader is instrumented
automatically.
"""

from __future__ import annotations

import argparse
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


def build(
    scenario: str, args: argparse.Namespace
) -> tuple[DataLoader[tuple[torch.Tensor, torch.Tensor]], nn.Module]:
    if scenario == "compute":
        dataset: Dataset[tuple[torch.Tensor, torch.Tensor]] = SlowDataset(100_000, 512, 0.0)
        model = nn.Sequential(
            nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 2)
        )
        return DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=0), model
    dataset = SlowDataset(100_000, 256, args.sample_delay_ms / 1000.0)
    model = nn.Sequential(
        nn.Linear(256, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 2)
    )
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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scenario", choices=["starved", "fixed", "compute"], default="starved")
    parser.add_argument("--seconds", type=float, default=12.0, help="train for this long (default 12)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=8, help="DataLoader workers in the fixed scenario")
    parser.add_argument("--sample-delay-ms", type=float, default=2.0, help="cost of one __getitem__ in ms")
    args = parser.parse_args()
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
