"""A Hugging Face ``transformers.Trainer`` job (accelerate underneath): a tiny BERT built from its
config (no download), synthetic token batches; nothing of dam's in it.

    python hf_trainer_job.py --delay 0.01 --workers 0 --seconds 5    # starved: slow samples, no workers
    python hf_trainer_job.py --compute --workers 2 --seconds 5       # healthy: cheap samples, a wider model
    torchrun --standalone --nproc-per-node 2 hf_trainer_job.py --slow-rank 1 --delay 0.01   # DDP (gloo)

Training stops ``--seconds`` after its first step (a ``TrainerCallback``; every rank decides on
the same step, through one all-reduce of the flag), so start-up time is not counted. Run with
``HF_HUB_OFFLINE=1`` and ``TRANSFORMERS_OFFLINE=1``: nothing is fetched.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch
from torch.utils.data import Dataset
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

SEQ = 16
VOCAB = 128


class Tokens(Dataset[dict[str, torch.Tensor]]):
    """Map-style, tokenised already; each sample costs ``delay`` seconds (tokenising, reading)."""

    def __init__(self, delay: float, n: int = 1_000_000) -> None:
        self.delay = delay
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if self.delay:
            time.sleep(self.delay)
        ids = (torch.arange(SEQ) * (i % 13 + 1)) % VOCAB
        return {
            "input_ids": ids,
            "attention_mask": torch.ones(SEQ, dtype=torch.long),
            "labels": torch.tensor(i % 2),
        }


class StopAfter(TrainerCallback):
    """Stops ``seconds`` after the first step, on the same step on every rank."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.deadline: float | None = None

    def on_step_end(self, args: TrainingArguments, state: object, control: object, **kwargs: object) -> None:
        now = time.monotonic()
        if self.deadline is None:
            self.deadline = now + self.seconds
        stop = now > self.deadline
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            flag = torch.tensor([1.0 if stop else 0.0])
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            stop = flag.item() > 0
        if stop:
            control.should_training_stop = True  # type: ignore[attr-defined]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--delay", type=float, default=0.0, help="seconds per sample")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--compute", action="store_true", help="a wider model and batch: compute dominates")
    p.add_argument("--slow-rank", type=int, default=None, help="only this rank's loader is slow")
    a = p.parse_args()
    # One intra-op thread: on a busy 2-core machine torch's default (a thread per core, spinning
    # between ops) makes this model's step 10-20x slower than one thread does.
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    delay = a.delay if a.slow_rank is None or a.slow_rank == rank else 0.0
    hidden, layers, batch = (128, 4, 64) if a.compute else (32, 2, a.batch_size)
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=hidden * 4,
        max_position_embeddings=SEQ,
        num_labels=2,
    )
    torch.manual_seed(0)
    model = BertForSequenceClassification(config)
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out,
            per_device_train_batch_size=batch,
            max_steps=1_000_000,
            dataloader_num_workers=a.workers,
            use_cpu=True,
            ddp_backend="gloo" if "WORLD_SIZE" in os.environ else None,
            report_to="none",
            logging_strategy="no",
            save_strategy="no",
            disable_tqdm=True,
        )
        trainer = Trainer(
            model=model, args=args, train_dataset=Tokens(delay), callbacks=[StopAfter(a.seconds)]
        )
        trainer.train()
    print(f"trained {trainer.state.global_step} steps on rank {rank}", flush=True)


if __name__ == "__main__":
    main()
