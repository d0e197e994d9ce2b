"""Who removes finished probe files: the probe, not the sidecar.

The probe directory is mounted read-only into the sidecar (it only reads), so the sidecar cannot
delete anything there. A training process that starts publishing removes the files of processes
that are over (``remove_finished``): a file whose writer closed it cleanly, or whose pid is gone,
once it has not changed for ``grace_seconds``: long enough for the sidecar (which samples every
second or so) to have read its last totals and folded them into its counters. Its own file is
never touched. A process killed by the OOM killer leaves its file for the next process of the pod
(a restarted container, the next command) to remove.

Standard library only: this module runs inside training processes.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Final

from dam_probe.layout import ProbeFormatError, probe_files, read_file

GRACE_SECONDS: Final = 120.0


def _alive(pid: int, proc_root: str) -> bool:
    return os.path.exists(os.path.join(proc_root, str(pid)))


def remove_finished(
    directory: str,
    own_pid: int,
    *,
    grace_seconds: float = GRACE_SECONDS,
    now_ns: int | None = None,
    proc_root: str = "/proc",
) -> list[str]:
    """Removes the files of finished processes (closed, or pid gone) unchanged for ``grace_seconds``;
    the paths removed. Never raises: a file it cannot read or remove is left alone."""
    now = time.time_ns() if now_ns is None else now_ns
    removed: list[str] = []
    for path in probe_files(directory):
        try:
            rec = read_file(path, retries=3)
        except (OSError, ProbeFormatError):
            continue
        if rec.pid == own_pid:
            continue
        if (now - rec.last_update_ns) / 1e9 < grace_seconds:
            continue
        if not rec.closed and _alive(rec.pid, proc_root):
            continue
        with contextlib.suppress(OSError):
            os.unlink(path)
            removed.append(path)
    return removed
