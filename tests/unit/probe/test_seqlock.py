"""The sequence lock: a reader never sees a record half-written by a concurrent writer."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from dam_probe.layout import ProbeFormatError, ProbeRecord, read_file
from tests.support.procs import spawn

from .conftest import python_env

K = 1_000_003  # wait_ns = K * steps, step_ns = 2K * steps in every published record

WRITER = f"""
import os, sys, time
from dam_probe.layout import ProbeWriter
path, stop = sys.argv[1], sys.argv[2]
w = ProbeWriter(path, pid=os.getpid())
n = 0
deadline = time.monotonic() + 20
while not os.path.exists(stop) and time.monotonic() < deadline:
    n += 1
    w.publish(n, n * {K}, n * {2 * K}, batch_size=n % 1000, flops_per_step=float(n),
              device_uuids=(f"GPU-{{n}}",) * (n % 8 + 1))
print(n)
"""


def _consistent(r: ProbeRecord) -> bool:
    n = r.steps
    if n == 0:
        return r.wait_ns == 0 and r.step_ns == 0 and r.device_uuids == ()
    return (
        r.wait_ns == n * K
        and r.step_ns == n * 2 * K
        and r.batch_size == n % 1000
        and r.flops_per_step == float(n)
        and r.device_uuids == (f"GPU-{n}",) * (n % 8 + 1)
    )


def test_reader_never_sees_a_torn_record_while_a_writer_publishes_in_a_tight_loop(tmp_path: Path) -> None:
    path = tmp_path / "probe-1.bin"
    stop = tmp_path / "stop"
    writer = spawn(
        [sys.executable, "-c", WRITER, str(path), str(stop)],
        env=python_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 10
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.005)
        torn: list[int] = []
        seen: set[int] = set()
        busy = 0
        reads = 0
        until = time.monotonic() + 1.5
        while reads < 4000 or time.monotonic() < until:
            reads += 1
            try:
                r = read_file(str(path))
            except ProbeFormatError as exc:
                assert "writer busy" in str(exc)
                busy += 1
                continue
            seen.add(r.steps)
            if not _consistent(r):
                torn.append(r.steps)
    finally:
        stop.touch()
        out, _ = writer.communicate(timeout=30)
    published = int(out.strip())
    assert writer.returncode == 0
    assert torn == []
    assert reads - busy >= 3000  # the lock lets readers through
    assert len(seen) > 100  # the writer really was publishing during the reads
    assert published > len(seen)
