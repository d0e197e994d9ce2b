"""One rank of a two-Pod DDP job over gloo, between the Pods' addresses.

Rank = the Pod's Job completion index (env RANK, from the downward API). Rendezvous: a
torch.distributed FileStore on a directory both Pods mount (one node; on a real cluster: a
headless Service and MASTER_ADDR); gloo then connects the ranks at the Pods' eth0 addresses
(GLOO_SOCKET_IFNAME). Rank SLOW_RANK's loader sleeps DELAY_MS per sample; the other's is free.

    python3 ddp.py STEPS SLOW_RANK DELAY_MS
"""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

STEPS, SLOW, DELAY = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]) / 1000.0
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


class Samples(Dataset):
    def __init__(self, delay):
        self.delay = delay

    def __len__(self):
        return 1_000_000

    def __getitem__(self, i):
        if self.delay:
            time.sleep(self.delay)
        x = torch.randn(64)
        return x, int(x.sum() > 0)


dist.init_process_group(
    "gloo",
    init_method=f"file://{os.environ['RENDEZVOUS_DIR']}/store",
    rank=rank,
    world_size=world,
    timeout=datetime.timedelta(seconds=120),
)
model = DistributedDataParallel(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 2)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(Samples(DELAY if rank == SLOW else 0.0), batch_size=16, num_workers=0)
for step, (x, y) in enumerate(loader):
    if step == STEPS:
        break
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
dist.barrier()
dist.destroy_process_group()
print(f"ddp.py: rank {rank} done", flush=True)
