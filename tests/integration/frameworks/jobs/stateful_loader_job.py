"""A plain loop over torchdata's ``StatefulDataLoader`` (checkpointable mid-epoch); nothing of dam's in it.

    python stateful_loader_job.py --delay 0.01 --workers 0 --seconds 5

It trains ``--seconds`` after its first batch, saving the loader's ``state_dict()`` every
20 steps as a checkpointing job does.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.utils.data import Dataset
from torchdata.stateful_dataloader import StatefulDataLoader


class Samples(Dataset[torch.Tensor]):
    def __init__(self, delay: float, n: int = 1_000_000) -> None:
        self.delay = delay
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.delay:
            time.sleep(self.delay)
        return torch.full((64,), float(i % 7))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--delay", type=float, default=0.0, help="seconds per sample")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seconds", type=float, default=5.0)
    a = p.parse_args()
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = StatefulDataLoader(Samples(a.delay), batch_size=a.batch_size, num_workers=a.workers)
    deadline = None
    steps = 0
    for step, x in enumerate(loader):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        steps = step + 1
        if step % 20 == 0:
            loader.state_dict()  # what a mid-epoch checkpoint saves
        now = time.monotonic()
        deadline = deadline or now + a.seconds
        if now > deadline:
            break
    print(
        f"trained {steps} steps with {loader.num_workers} workers, prefetch {loader.prefetch_factor}",
        flush=True,
    )


if __name__ == "__main__":
    main()
