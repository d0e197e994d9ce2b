"""One rank of a data-parallel gloo job that logs its own truth: where each of its seconds went,
measured by the job itself (not by the probe), for the ground-truth scenarios (issue 28).

Two layouts, the same work:
- ``pods``: two Pods of an Indexed Job, one rank each (env RANK from the completion index,
  WORLD_SIZE, RENDEZVOUS_DIR a directory both Pods mount, GLOO_SOCKET_IFNAME), as ddp.py;
- ``torchrun``: one Pod whose container runs ``python -m torch.distributed.run --nproc-per-node 2
  truth.py ...``: torchrun sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (env://).

A step: a batch from a DataLoader (no workers) whose samples sleep DELAY_MS (the data wait), the
forward and backward of a three-layer MLP (analytic FLOPs below), one explicit ``all_reduce`` of
the flattened gradients (the copies in and out are compute; the collective is communication), an
SGD step. Every SAVE_EVERY steps rank 0 saves the model and a
CKPT_MIB MiB tensor with ``torch.save`` and ``os.fsync`` into RENDEZVOUS_DIR (its checkpoint for
both ranks) while rank 1 waits in ``dist.barrier()``. A new attempt (a restarted Pod) resumes both
ranks from that checkpoint's step.

Attempts (layout ``pods``): the test writes RENDEZVOUS_DIR/attempt-N before it deletes a Pod;
each process rendezvouses in the FileStore of the highest N it finds (``store-N``, as stall.py: a
killed attempt's store cannot be reused). A deleted Pod's process gets SIGTERM and logs its end;
the other rank's collective then fails (gloo: the peer closed the connection), and it logs its end
and exits 1. Both are replaced by the Indexed Job.

The truth, one JSON object a line in RENDEZVOUS_DIR/truth-RANK-PID-START.jsonl (flushed each line):
``start`` (the process's start from /proc, Unix s, its container's: PID 1's, and the FLOPs of one
step by formula),
``first`` (the first batch asked for), ``step`` (per step: data wait, compute, all_reduce, save,
barrier seconds; when its batch was asked for and came, and the step's end),
``end`` (the last step's end: before the quiet tail), ``exit``.
After the last step each rank sleeps TAIL_S (idle, so the last scrape before the Pod ends has seen
every step).

    python3 truth.py LAYOUT STEPS SAVE_EVERY DELAY_MS CKPT_MIB TAIL_S
"""

import datetime
import itertools
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

LAYOUT = sys.argv[1]
STEPS, SAVE_EVERY, DELAY = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]) / 1000.0
CKPT_MIB, TAIL = int(sys.argv[5]), float(sys.argv[6])
BATCH, WIDTHS = 16, (256, 768, 768, 16)  # light: the tier's other Pods share 2 cores
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
shared = os.environ["RENDEZVOUS_DIR"]


def analytic_flops() -> float:
    """One step's FLOPs by formula (multiply-add = 2): forward 2·B·a·b a layer; backward the
    weight gradient 2·B·a·b a layer and the input gradient 2·B·a·b for every layer but the first
    (the input needs none). Bias adds and the loss are not matmuls (FlopCounterMode counts
    neither)."""
    pairs = list(itertools.pairwise(WIDTHS))
    dense = sum(2.0 * BATCH * a * b for a, b in pairs)
    return dense + dense + (dense - 2.0 * BATCH * pairs[0][0] * pairs[0][1])


def process_start(pid: str = "self") -> float:
    """A process's start, Unix seconds: /proc/PID/stat's start time (clock ticks since boot) plus
    the boot time (/proc/stat btime), as the kernel keeps it. PID 1 is the container's own process
    (this one, or torchrun's launcher whose child this is): its start is the container's."""
    with open(f"/proc/{pid}/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/stat") as f:
        btime = next(int(line.split()[1]) for line in f if line.startswith("btime"))
    return btime + ticks / os.sysconf("SC_CLK_TCK")


# One file a process: its pid (1 in a Pod of its own, in every attempt) and its start.
name = f"truth-{rank}-{os.getpid()}-{round(process_start() * 100)}.jsonl"
truth = open(os.path.join(shared, name), "a", buffering=1)  # noqa: SIM115


def log(kind: str, **fields: object) -> None:
    truth.write(json.dumps({"kind": kind, "rank": rank, "pid": os.getpid(), **fields}) + "\n")


def on_term(signum: int, frame: object) -> None:
    log("exit", at=time.time(), why="SIGTERM")
    os._exit(143)


signal.signal(signal.SIGTERM, on_term)
log("start", at=process_start(), container=process_start("1"), flops=analytic_flops(), layout=LAYOUT)


class Samples(Dataset):
    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        time.sleep(DELAY)
        x = torch.randn(WIDTHS[0])
        return x, int(x.sum() > 0)


def attempt() -> int:
    found = [int(n.split("-")[1]) for n in os.listdir(shared) if n.startswith("attempt-")]
    return max(found, default=1)


if LAYOUT == "pods":
    init = f"file://{shared}/store-{attempt()}"
    dist.init_process_group(
        "gloo", init_method=init, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300)
    )
else:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))

layers: list[nn.Module] = []
for a, b in itertools.pairwise(WIDTHS):
    layers += [nn.Linear(a, b), nn.ReLU()]
model = nn.Sequential(*layers[:-1])
params = list(model.parameters())
opt = torch.optim.SGD(params, lr=0.01)
ckpt = os.path.join(shared, "checkpoint.pt")
begin = 0
if os.path.exists(ckpt):
    state = torch.load(ckpt)
    model.load_state_dict(state["model"])
    begin = state["step"]
log("resume", step=begin)
ballast = torch.zeros(CKPT_MIB << 18)  # CKPT_MIB MiB of float32


def save(step: int) -> float:
    t0 = time.time()
    tmp = f"{ckpt}.tmp"
    with open(tmp, "wb") as f:
        torch.save({"model": model.state_dict(), "step": step, "ballast": ballast}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, ckpt)
    return time.time() - t0


def all_reduce() -> tuple[float, float]:
    """The gradients averaged over the ranks: (seconds in ``dist.all_reduce``, seconds copying)."""
    t0 = time.time()
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    t1 = time.time()
    dist.all_reduce(flat)
    t2 = time.time()
    flat /= world
    offset = 0
    for p in params:
        n = p.grad.numel()
        p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
        offset += n
    return t2 - t1, (t1 - t0) + (time.time() - t2)


loader = iter(DataLoader(Samples(), batch_size=BATCH, num_workers=0))
log("first", at=time.time())
step = begin
try:
    while step < STEPS:
        t0 = time.time()
        x, y = next(loader)
        t1 = time.time()
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        t2 = time.time()
        reduce, copying = all_reduce()
        t3 = time.time()
        opt.step()
        t4 = time.time()
        step += 1
        saved = save(step) if rank == 0 and step % SAVE_EVERY == 0 else 0.0
        t5 = time.time()
        if step % SAVE_EVERY == 0:
            dist.barrier()
        t6 = time.time()
        compute = (t2 - t1) + copying + (t4 - t3)
        log(
            "step",
            step=step,
            data=t1 - t0,
            compute=compute,
            reduce=reduce,
            save=saved,
            barrier=t6 - t5,
            asked=t0,
            got=t1,
            at=t6,
        )
except Exception as exc:  # the peer's Pod was deleted: its collective fails here
    log("exit", at=time.time(), why=f"{type(exc).__name__}: {exc}"[:200])
    truth.close()
    sys.exit(1)
log("end", at=time.time(), step=step)
time.sleep(TAIL)
dist.destroy_process_group()
log("exit", at=time.time(), why="done")
print(f"truth.py: rank {rank} done after {step} steps", flush=True)
