"""One rank of a two-Pod job that stalls once: on its first attempt rank 1 stops in its own code
before a collective that rank 0 has entered and waits in; a later attempt runs to its end.

Rank, world, rendezvous and gloo's interface as in ddp.py (env RANK from the Job's completion
index, WORLD_SIZE, RENDEZVOUS_DIR a directory both Pods mount, GLOO_SOCKET_IFNAME), and POD_NAME
(the downward API's metadata.name). A step: a batch from a DataLoader whose samples sleep DELAY_MS
(the probe counts a step per batch; sleeping leaves the node's two cores to the other scenarios),
forward and backward of a tiny model, one explicit ``dist.all_reduce`` of the flattened gradients,
an SGD step.

The first attempt: rank 1, at step STALL_STEP, writes the marker RENDEZVOUS_DIR/stalled (its Unix
time and its Pod's name, written to a temporary file and renamed over the marker: a reader sees all
of it or nothing), prints the time and calls ``hang()``, an hour's sleep, before that step's
all_reduce, which rank 0 has entered. Gloo's timeout on that attempt is two hours: rank 0 waits as
long as rank 1 sleeps, and the Pods outlive any check of the stall. Deleted, their Indexed Job
recreates them (same indexes, so the same ranks).

A later attempt finds the marker: it runs STEPS steps without stalling and ends.

The store: each attempt rendezvouses in its own FileStore file, ``store-1`` without the marker and
``store-2`` with it. A FileStore keeps its keys and its count of users in the file, and a killed
attempt leaves the file behind: a second attempt in the same file would read the first one's keys
(its rank table) and never rendezvous cleanly. Both ranks of an attempt pick the same file: the
first attempt's marker is written only after both of its ranks passed the rendezvous (rank 1 has
finished STALL_STEP all_reduces with rank 0 by then), and the replacement Pods start only after
the old ones were deleted, at least a stall's threshold after the marker was written (the Job's
``podReplacementPolicy: Failed`` creates each once its predecessor has ended, so the two attempts
never overlap).

    python3 stall.py STEPS STALL_STEP DELAY_MS
"""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

STEPS, STALL_STEP, DELAY = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]) / 1000.0
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
shared = os.environ["RENDEZVOUS_DIR"]
marker = os.path.join(shared, "stalled")
first = not os.path.exists(marker)
attempt = 1 if first else 2


class Samples(Dataset):
    def __len__(self):
        return 1_000_000

    def __getitem__(self, i):
        time.sleep(DELAY)
        x = torch.randn(32)
        return x, int(x.sum() > 0)


def mark_stall():
    """The marker, atomically: its content (the stall's time, this Pod) comes with its name."""
    at = time.time()
    tmp = f"{marker}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{at:.3f} {os.environ['POD_NAME']}\n")
    os.replace(tmp, marker)
    return at


def hang():
    time.sleep(3600)  # the stall: neither a collective nor the loader, the job's own code


timeout = datetime.timedelta(hours=2) if first else datetime.timedelta(seconds=300)
dist.init_process_group(
    "gloo", init_method=f"file://{shared}/store-{attempt}", rank=rank, world_size=world, timeout=timeout
)
print(f"stall.py: rank {rank} attempt {attempt}", flush=True)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2))
params = list(model.parameters())
opt = torch.optim.SGD(params, lr=0.01)
loader = DataLoader(Samples(), batch_size=16, num_workers=0)
for step, (x, y) in enumerate(loader):
    if step == STEPS:
        break
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    if first and rank == 1 and step == STALL_STEP:
        print(f"stall.py: rank 1 stalls at {mark_stall():.3f}, before step {step}'s all_reduce", flush=True)
        hang()
    dist.all_reduce(flat)
    flat /= world
    offset = 0
    for p in params:
        n = p.grad.numel()
        p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
        offset += n
    opt.step()
dist.barrier()
dist.destroy_process_group()
print(f"stall.py: rank {rank} attempt {attempt} done after {STEPS} steps", flush=True)
