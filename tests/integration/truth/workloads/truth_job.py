"""A real two-rank gloo job that logs its own truth (the ground-truth tier's workload).

Launched by ``python -m torch.distributed.run --nproc-per-node 2 --max-restarts 1 truth_job.py OUT``.
Each rank trains a small MLP on batches from a DataLoader whose dataset sleeps a known time per
batch, all-reduces its gradients itself (``dist.all_reduce``: the job times its own communication),
and every ``EVERY`` steps rank 0 saves a checkpoint for both (``torch.save`` + ``os.fsync``) while
rank 1 waits in ``dist.barrier()``. On the first attempt rank 1 kills itself (SIGKILL) at step
``KILL_STEP``; torchrun restarts both ranks, which resume from rank 0's checkpoint.

Each rank appends its own measurements as JSON lines to ``OUT/truth-<rank>.jsonl`` (wall clock,
``time.time()``): its start, its first batch, every step's data wait, compute and all-reduce time,
every save round, the kill, the resume. No figure comes from the probe or ``dam run``.
"""

import time

T0 = time.time()  # the process's own start (the interpreter started a few ms before)

import itertools  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

WIDTHS = (256, 1024, 1024, 256)
BATCH = 64
STEPS = int(os.environ.get("TRUTH_STEPS", "200"))
EVERY = int(os.environ.get("TRUTH_EVERY", "25"))
KILL_STEP = int(os.environ.get("TRUTH_KILL_STEP", "118"))
SLEEP = float(os.environ.get("TRUTH_SLEEP", "0.012"))
TAIL = float(os.environ.get("TRUTH_TAIL_S", "0"))  # seconds of no step after the last one
CKPT_FLOATS = int(os.environ.get("TRUTH_CKPT_MIB", "96")) * (1 << 20) // 4


def flops_per_step() -> int:
    """Forward 2·B·in·out per Linear; backward the weight gradient (same) and the input gradient
    (same, except the first layer's: the batch needs none). Biases and the loss are not counted."""
    pairs = list(itertools.pairwise(WIDTHS))
    forward = sum(2 * BATCH * a * b for a, b in pairs)
    return 3 * forward - 2 * BATCH * pairs[0][0] * pairs[0][1]


class Batches(Dataset):
    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(SLEEP)  # the data wait the job knows
        g = torch.Generator().manual_seed(i)
        return torch.randn(BATCH, WIDTHS[0], generator=g), torch.randn(BATCH, WIDTHS[-1], generator=g)


class Log:
    def __init__(self, path: str) -> None:
        self.fh = open(path, "a", buffering=1)  # noqa: SIM115 (the process's life long; synced at the end)

    def __call__(self, **fields: object) -> None:
        self.fh.write(json.dumps(fields) + "\n")

    def sync(self) -> None:
        self.fh.flush()
        os.fsync(self.fh.fileno())


def model_of() -> torch.nn.Module:
    layers: list[torch.nn.Module] = []
    for a, b in itertools.pairwise(WIDTHS):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def save(
    path: str, step: int, model: torch.nn.Module, opt: torch.optim.Optimizer, state: torch.Tensor
) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as fh:
        torch.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict(), "state": state}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def main(out: str) -> None:
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    # The agent's store outlives an attempt: each attempt's gloo keys under a prefix of their own
    # (attempt 1 read attempt 0's addresses from the plain store and could not connect).
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False)
    dist.init_process_group(
        "gloo", store=dist.PrefixStore(f"attempt-{attempt}", store), rank=rank, world_size=world
    )
    torch.set_num_threads(1)
    rank = dist.get_rank()
    log = Log(os.path.join(out, f"truth-{rank}.jsonl"))
    log(ev="start", attempt=attempt, wall=T0, flops=flops_per_step(), batch=BATCH)
    torch.manual_seed(0)
    model, ckpt = model_of(), os.path.join(out, "ckpt.pt")
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    state = torch.zeros(CKPT_FLOATS)  # what a checkpoint writes besides the weights
    step = 0
    if os.path.exists(ckpt):
        saved = torch.load(ckpt, weights_only=True)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        step = saved["step"]
    log(ev="resume", attempt=attempt, step=step)
    params = list(model.parameters())
    it = iter(DataLoader(Batches(), batch_size=None, num_workers=0, sampler=range(step, 10**6)))
    log(ev="first_batch", attempt=attempt, wall=time.time())
    while step < STEPS:
        if attempt == 0 and rank == 1 and step == KILL_STEP:
            log(ev="kill", attempt=attempt, step=step, wall=time.time())
            log.sync()
            os.kill(os.getpid(), signal.SIGKILL)
        t0 = time.time()
        x, y = next(it)
        t1 = time.time()
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        t3 = time.time()
        dist.all_reduce(flat)
        t4 = time.time()
        offset = 0
        for p in params:
            n = p.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad)).div_(2)
            offset += n
        opt.step()
        t5 = time.time()
        step += 1
        # compute: forward, backward, flattening and the update; comm: the all-reduce alone
        log(
            ev="step",
            attempt=attempt,
            step=step,
            wait=t1 - t0,
            compute=(t5 - t1) - (t4 - t3),
            comm=t4 - t3,
            end=t5,
        )
        if step % EVERY == 0:
            s0 = time.time()
            if rank == 0:
                save(ckpt, step, model, opt, state)
            s1 = time.time()
            dist.barrier()
            log(ev="save", attempt=attempt, step=step, start=s0, saved=s1, end=time.time())
    log(ev="end", attempt=attempt, wall=time.time())
    log.sync()
    time.sleep(TAIL)  # work after the last step (an evaluation, a slow teardown): no training
    leave()


def leave() -> None:
    """Exit handlers run (the probe's final publish is one), the interpreter's teardown not: gloo's
    worker thread can abort a finalizing interpreter (see tests/integration/test_local_multirank.py)."""
    import atexit

    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
