"""Peak memory of ``dam evaluate`` on huge snapshots (issue 17: 100 MB / 1.2 M series took 1.55 GB).

    .venv/bin/python benchmarks/evaluate_memory.py [--series 1200000] [--keep]

Writes, in a temporary directory, a BEFORE/AFTER pair of a sidecar's ``dam_`` series
(one GPU, the probe's counters, 60 s apart) and three variants of it:

- ``small``: the pair alone (the interpreter and its imports: the floor);
- ``unrelated``: each file padded with ``--series`` series of other exporters
  (about 100 MB a file at 1.2 M series) - ``dam evaluate`` must answer, holding only
  the ``dam_`` series it reads;
- ``dam-flood``: AFTER padded with ``--series`` series of a name ``dam evaluate`` reads
  (``dam_gpu_utilization_ratio`` with 1.2 M ``gpu`` labels) - it must refuse at its
  series cap (exit 2) instead of holding them.

Runs ``dam evaluate`` as a child process for each and prints its exit status, wall
time and peak RSS, read from the child's own resource usage (``os.wait4``: the
kernel's ``ru_maxrss`` of that child, in KiB on Linux).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dam_contract import names as n

WINDOW_SECONDS = 60.0


def dam_series(at_end: bool) -> str:
    """A one-GPU sidecar's exposition: an input-bound job (55 % data wait), 60 s apart."""
    k = 1.0 if at_end else 0.0
    lines = [
        f"# TYPE {n.STEPS_TOTAL} counter",
        f"{n.STEPS_TOTAL} {2000 + k * 120}",
        f"# TYPE {n.STEP_SECONDS_TOTAL} counter",
        f"{n.STEP_SECONDS_TOTAL} {1000 + k * WINDOW_SECONDS}",
        f"# TYPE {n.DATALOADER_WAIT_SECONDS_TOTAL} counter",
        f"{n.DATALOADER_WAIT_SECONDS_TOTAL} {100 + k * WINDOW_SECONDS * 0.55}",
        f"# TYPE {n.PROCESS_CPU_SECONDS_TOTAL} counter",
        f'{n.PROCESS_CPU_SECONDS_TOTAL}{{role="main"}} {1000 + k * 30}',
        f"{n.PROBE_UP} 1",
        f"{n.NVML_UP} 1",
        f'{n.GPU_UTILIZATION_RATIO}{{gpu="0",uuid="GPU-0"}} 0.3',
        f'{n.GPU_SM_ACTIVE_RATIO}{{gpu="0",uuid="GPU-0"}} 0.2',
        f'{n.GPU_INFO}{{gpu="0",uuid="GPU-0",name="NVIDIA A100-SXM4-40GB"}} 1',
        f"{n.SNAPSHOT_TIMESTAMP_SECONDS} {1.7e9 + k * WINDOW_SECONDS}",
    ]
    return "\n".join(lines) + "\n"


def write_padded(path: Path, head: str, series: int, line: str, value: float) -> None:
    """``head``, then ``series`` lines of ``line`` (a format with ``{i}``), written in chunks."""
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(head)
        chunk = 50_000
        for start in range(0, series, chunk):
            fh.write("".join(line.format(i=i, v=value + i) for i in range(start, min(series, start + chunk))))


def run(argv: list[str]) -> tuple[int, float, float]:
    """(exit status, wall seconds, peak RSS MiB) of ``dam evaluate ARGV`` as a child process."""
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dam_operator.cli", "evaluate", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.stderr is not None
    err = proc.stderr.read().decode(errors="replace").strip()
    proc.stderr.close()
    if err:
        print(f"    stderr: {err[:300]}")
    return proc.returncode, wall, usage.ru_maxrss / 1024.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--series", type=int, default=1_200_000, help="padding series per file")
    ap.add_argument("--keep", action="store_true", help="keep the generated files (prints the directory)")
    args = ap.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="dam-evaluate-memory-"))
    before, after = dam_series(False), dam_series(True)
    (tmp / "small-before.prom").write_text(before)
    (tmp / "small-after.prom").write_text(after)
    other = 'http_requests_total{{method="GET",path="/api/v1/items/{i:07d}",code="200"}} {v}\n'
    write_padded(tmp / "unrelated-before.prom", before, args.series, other, 1000.0)
    write_padded(tmp / "unrelated-after.prom", after, args.series, other, 2000.0)
    flood = n.GPU_UTILIZATION_RATIO + '{{gpu="{i}",uuid="GPU-{i:08d}-0000-0000-000000000000"}} 0.5\n'
    write_padded(tmp / "flood-after.prom", after, args.series, flood, 0.0)

    cases = [
        ("small", "small-before.prom", "small-after.prom"),
        ("unrelated", "unrelated-before.prom", "unrelated-after.prom"),
        ("dam-flood", "small-before.prom", "flood-after.prom"),
    ]
    print(f"{'case':<10} {'AFTER MB':>9} {'series':>9} {'exit':>5} {'wall s':>7} {'peak RSS MiB':>13}")
    for name, b, a in cases:
        size = (tmp / a).stat().st_size / 1e6
        with open(tmp / a, encoding="utf-8") as fh:
            series = sum(1 for line in fh if not line.startswith("#"))
        rc, wall, rss = run([str(tmp / b), str(tmp / a), "--json"])
        print(f"{name:<10} {size:>9.1f} {series:>9} {rc:>5} {wall:>7.1f} {rss:>13.1f}")
    if args.keep:
        print(f"files kept in {tmp}")
    else:
        for f in tmp.iterdir():
            f.unlink()
        tmp.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
