"""A loader whose ``__getitem__`` burns CPU (a JPEG-decode stand-in), in the main process.

python3 decode.py SECONDS
"""

import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Decode(Dataset):
    def __len__(self):
        return 1_000_000

    def __getitem__(self, i):
        x = torch.randn(64, 64)
        for _ in range(6):
            x = torch.tanh(x @ x.T / 64)
        return x.flatten()[:256], int(i % 2)


model = nn.Linear(256, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
deadline = time.monotonic() + float(sys.argv[1])
for x, y in DataLoader(Decode(), batch_size=16, num_workers=0):
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    if time.monotonic() > deadline:
        break
print("decode.py: done", flush=True)
