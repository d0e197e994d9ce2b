"""A single-thread CPU-bound trainer and its noisy neighbours, pinned to one CPU.

    python3 contended.py train SECONDS CPU       # the training process (instrumented)
    python3 contended.py spin SECONDS CPU COUNT  # COUNT busy loops: another Pod, not instrumented

On a shared node the neighbours take every core; here both Pods pin themselves to the same CPU
(a container may narrow its own affinity within its cpuset: no static CPU manager policy), so the
trainer is runnable but waits for that CPU about COUNT / (COUNT + 1) of the time, while the
node's other CPUs stay free for the scenarios beside it.
"""

import multiprocessing
import os
import sys
import time

MODE, SECONDS, CPU = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
os.sched_setaffinity(0, {CPU})
started = time.monotonic()
deadline = started + SECONDS


def run_queue_seconds() -> float:
    """This process's main thread: time runnable but waiting for a CPU (/proc/self/schedstat,
    field 2, ns; the figure the probe reads, dam_probe.schedstat)."""
    with open("/proc/self/schedstat") as fh:
        return int(fh.read().split()[1]) / 1e9


waited_at_start = run_queue_seconds()


def spin() -> None:
    while time.monotonic() < deadline:
        pass


if MODE == "spin":
    loops = [multiprocessing.Process(target=spin) for _ in range(int(sys.argv[4]))]
    for p in loops:
        p.start()
    for p in loops:
        p.join()
    print("contended.py: neighbours done", flush=True)
    sys.exit(0)

import json  # noqa: E402
import threading  # noqa: E402

# The trainer's own run-queue wait, cumulative, once a second (Unix time, seconds): the test reads
# the part of it inside the window the sidecar's figure covers.
waits = []


def record_waits() -> None:
    while True:
        waits.append((round(time.time(), 3), round(run_queue_seconds(), 4)))
        time.sleep(1.0)


threading.Thread(target=record_waits, daemon=True).start()

import torch  # noqa: E402  (the neighbours need no torch)
from torch.utils.data import DataLoader, Dataset  # noqa: E402

torch.set_num_threads(1)


class InMemory(Dataset):
    def __len__(self):
        return 1_000_000

    def __getitem__(self, i):
        return torch.ones(256)


a = torch.randn(256, 256)
for batch in DataLoader(InMemory(), batch_size=64, num_workers=0):
    y = batch
    for _ in range(100):  # ~15 ms of arithmetic a step: the collate of a batch is under 2 % of it
        y = torch.tanh(y @ a)
    if time.monotonic() > deadline:
        break
# The job's own truth, left in its log for the test to read after the Pod ended.
wall = time.monotonic() - started
waited = run_queue_seconds() - waited_at_start
print(
    f"contended.py: trained; waited {waited:.2f} s for a CPU in {wall:.2f} s: ratio {waited / wall:.3f}",
    flush=True,
)
print("contended.py: waits " + json.dumps(waits), flush=True)
