"""DataLoader workers that each keep a growing cache of touched buffers (the classic loader memory
blow-up) until the kernel's OOM killer takes one; the training process then raises DataLoader's
"worker ... is killed by signal" and exits 1.

    python3 leaky_loader.py MIB_PER_SAMPLE SECONDS_PER_SAMPLE
"""

import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

CACHE = []  # each worker's own cache, never evicted
MIB, PAUSE = int(sys.argv[1]), float(sys.argv[2])


class Cached(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        CACHE.append(bytearray(MIB << 20))  # zero-filled: every page touched
        time.sleep(PAUSE)
        return torch.ones(8)


model = torch.nn.Linear(8, 1)
for x in DataLoader(Cached(), batch_size=1, num_workers=2):
    model(x).sum().backward()
print("leaky_loader.py: trained", flush=True)
