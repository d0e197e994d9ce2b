"""A training loop whose own process keeps every batch's activations (a growing list) until the
kernel's OOM killer takes it: the container ends OOMKilled, exit code 137.

    python3 hog.py MIB_PER_STEP SECONDS_PER_STEP
"""

import sys
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

KEPT = []
MIB, PAUSE = int(sys.argv[1]), float(sys.argv[2])
model = torch.nn.Linear(8, 1)
for (x,) in DataLoader(TensorDataset(torch.ones(100_000, 8)), batch_size=4, num_workers=0):
    model(x).sum().backward()
    KEPT.append(bytearray(MIB << 20))
    time.sleep(PAUSE)
print("hog.py: trained", flush=True)
