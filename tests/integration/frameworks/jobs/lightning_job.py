"""A PyTorch Lightning job: a small model, synthetic data, `Trainer.fit`; nothing of dam's in it.

    python lightning_job.py --delay 0.004 --workers 0 --seconds 6      # starved: slow samples, no workers
    python lightning_job.py --compute --workers 2 --seconds 6          # healthy: in-memory data, heavy model
    python lightning_job.py --devices 2 --slow-rank 1 --delay 0.004    # DDP on two gloo ranks (Lightning
                                                                       # launches rank 1 itself)

Training stops ``--seconds`` after its first batch (every rank agrees on the step: Lightning's
``reduce_boolean_decision``), so start-up time (imports, the launcher) is not counted.
"""

from __future__ import annotations

import argparse
import os
import time

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset

FEATURES = 64


class Samples(Dataset[torch.Tensor]):
    """Map-style: each sample costs ``delay`` seconds (decode or I/O latency) and is made fresh."""

    def __init__(self, delay: float, n: int = 1_000_000) -> None:
        self.delay = delay
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.delay:
            time.sleep(self.delay)
        return torch.full((FEATURES,), float(i % 7))


class Model(pl.LightningModule):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        layers: list[torch.nn.Module] = [torch.nn.Linear(FEATURES, width), torch.nn.ReLU()]
        for _ in range(depth):
            layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
        layers.append(torch.nn.Linear(width, 1))
        self.net = torch.nn.Sequential(*layers)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.net(batch).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


class StopAfter(pl.Callback):
    """Stops ``seconds`` after the first batch, on the same step on every rank."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.deadline: float | None = None

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        now = time.monotonic()
        if self.deadline is None:
            self.deadline = now + self.seconds
        stop = trainer.strategy.reduce_boolean_decision(now > self.deadline, all=False)
        if stop:
            trainer.should_stop = True


class Job(pl.LightningDataModule):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args

    def train_dataloader(self) -> DataLoader[torch.Tensor]:
        a = self.args
        rank = int(os.environ.get("LOCAL_RANK", "0"))  # Lightning sets it for the ranks it launches
        delay = a.delay if a.slow_rank is None or a.slow_rank == rank else 0.0
        return DataLoader(Samples(delay), batch_size=a.batch_size, num_workers=a.workers)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--delay", type=float, default=0.0, help="seconds per sample")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--compute", action="store_true", help="a wide, deep model: compute dominates")
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--slow-rank", type=int, default=None, help="only this rank's loader is slow")
    a = p.parse_args()
    # One intra-op thread: on a busy 2-core machine torch's default (a thread per core, spinning
    # between ops) makes a small model's step 10-20x slower than one thread does.
    torch.set_num_threads(1)
    width, depth = (1024, 2) if a.compute else (32, 1)
    if a.compute:
        a.batch_size = max(a.batch_size, 256)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=a.devices,
        strategy="ddp" if a.devices > 1 else "auto",
        max_epochs=1,
        max_steps=-1,
        callbacks=[StopAfter(a.seconds)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(Model(width, depth), datamodule=Job(a))
    print(f"trained {trainer.global_step} steps on rank {trainer.global_rank}", flush=True)


if __name__ == "__main__":
    main()
