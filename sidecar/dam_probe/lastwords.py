"""The probe's last words: one line in the container's termination message.

Why: a loader whose workers the OOM killer takes a second after the loop starts dies before any
scrape of its sidecar (issue 28 item 8): the probe counted the kill and knew the loader's
workers, but nothing of it left the Pod. The kubelet reads a container's termination-message file
(``terminationMessagePath``, ``/dev/termination-log`` unless the Pod says otherwise) when the
container ends and puts what it holds into the Pod's status
(``containerStatuses[].state.terminated.message``), next to the exit code and the ``OOMKilled``
reason: the operator reads it from the Pod it already watches, however fast the process died.

What it relies on (Kubernetes' documented contract, "Determine the Reason for Pod Failure", and
the kubelet's ``kuberuntime_container.go``): the kubelet creates the file empty before the
container starts, writable by any user of the container (mode 0666), and keeps at most 4,096
bytes of it (``MaxContainerTerminationMessageLength``), 12 KiB for all containers of a Pod.

The webhook names the file in ``DAM_PROBE_EXIT_RECORD`` (the container's own
``terminationMessagePath``; never for ``terminationMessagePolicy: FallbackToLogsOnError``, whose
users want the log's tail there). Without it the probe writes nothing. The probe never creates
the file (``O_APPEND`` without ``O_CREAT``), never writes into a message of the user's own (a file
that holds anything but our lines), and never past 4,096 bytes. A process killed by SIGKILL
writes nothing: its exit code (137) says who it was.

One line a process, ``dam-probe/1 key=value ...``, integers only; the parser (``parse``) takes
the lines it can read whole and ignores the rest (and the keys it does not know: an older operator
reads a newer probe's line). Standard library only: this module runs inside training processes
and in the operator.

Exit totals. A process that took its first batch also says where its seconds went up to its end
(``Totals``: the figures of its closing publish, the ones its sidecar exports as
``dam_goodput_seconds_total`` and ``dam_badput_seconds_total{cause}``, in milliseconds, and the
Unix time they were taken). The operator scrapes once a window: what a process did between its
pod's last scrape and its end (up to a window: its last steps, a save, the wait for a peer that
died) was never seen, and counted as the restart's when the pod failed or was deleted (issue 28's
node runs: 3.1 s of each process's 30 s restart, 10 % of it). Its last words carry it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

ENV_EXIT_RECORD: Final = "DAM_PROBE_EXIT_RECORD"
PREFIX: Final = "dam-probe/1"
MAX_MESSAGE_BYTES: Final = 4096
"""The kubelet keeps this much of a container's termination message."""
_MAX_VALUE: Final = 1 << 53


@dataclass(frozen=True, slots=True)
class Totals:
    """A process's seconds by use at its end (milliseconds; None: not measured), as its sidecar
    exports them (``dam_goodput_seconds_total``, ``dam_badput_seconds_total{cause}``)."""

    at_ms: int
    """Unix milliseconds when they were taken (the closing publish)."""
    productive_ms: int
    startup_ms: int
    data_wait_ms: int
    other_ms: int
    communication_ms: int | None = None
    """Exposed collective time; None when the collectives were not timed."""
    checkpoint_ms: int | None = None
    """Blocking saves; None when no save function was timed."""
    steps_since_checkpoint: int | None = None
    """Its steps since its latest save (every step when it saved none); None when saves were not timed."""

    def fields(self) -> dict[str, int | None]:
        return {
            "at": self.at_ms,
            "good": self.productive_ms,
            "startup": self.startup_ms,
            "data": self.data_wait_ms,
            "other": self.other_ms,
            "comm": self.communication_ms,
            "ckpt": self.checkpoint_ms,
            "since": self.steps_since_checkpoint,
        }


def _totals(values: Mapping[str, int | None]) -> Totals | None:
    required = [values.get(k) for k in ("at", "good", "startup", "data", "other")]
    at, good, startup, data, other = required
    if at is None or good is None or startup is None or data is None or other is None:
        return None
    return Totals(at, good, startup, data, other, values.get("comm"), values.get("ckpt"), values.get("since"))


@dataclass(frozen=True, slots=True)
class LastWords:
    """What one training process said on its way out; None: it did not know."""

    pid: int
    rank: int | None = None
    steps: int = 0
    loader_workers: int | None = None
    """``num_workers`` of the DataLoader it iterated last (0: in the main process)."""
    worker_kills: int = 0
    """DataLoader workers that died, as DataLoader's own error said."""
    kill_signal: int = 0
    """The signal of the last of them (9: SIGKILL, the OOM killer's)."""
    totals: Totals | None = None
    """Where its seconds went to its end; None before its first batch (or an older probe)."""

    def line(self) -> str:
        fields = {
            "pid": self.pid,
            "rank": self.rank,
            "steps": self.steps,
            "workers": self.loader_workers,
            "worker_kills": self.worker_kills,
            "signal": self.kill_signal,
            **(self.totals.fields() if self.totals is not None else {}),
        }
        return " ".join([PREFIX, *(f"{k}={v}" for k, v in fields.items() if v is not None)]) + "\n"


def _int(text: str | None) -> int | None:
    if text is None or not text.isdigit() or len(text) > 16:
        return None
    value = int(text)
    return value if value < _MAX_VALUE else None


def parse(message: str) -> tuple[LastWords, ...]:
    """The probe's lines in a termination message (any other line is the user's and is skipped;
    a line with a field it cannot read whole is skipped). Never raises."""
    found: list[LastWords] = []
    for raw in message[: 4 * MAX_MESSAGE_BYTES].splitlines()[:256]:
        parts = raw.split()
        if not parts or parts[0] != PREFIX:
            continue
        fields: dict[str, str] = {}
        for part in parts[1:]:
            key, sep, value = part.partition("=")
            if sep:
                fields[key] = value
        values = {k: _int(v) for k, v in fields.items()}
        pid = values.get("pid")
        if pid is None or any(v is None for v in values.values()):
            continue
        found.append(
            LastWords(
                pid=pid,
                rank=values.get("rank"),
                steps=values.get("steps") or 0,
                loader_workers=values.get("workers"),
                worker_kills=values.get("worker_kills") or 0,
                kill_signal=values.get("signal") or 0,
                totals=_totals(values),
            )
        )
    return tuple(found)


def exit_record_path(environ: Mapping[str, str] | None = None) -> str:
    """The file the webhook named (``DAM_PROBE_EXIT_RECORD``), or "" (write nothing)."""
    env = os.environ if environ is None else environ
    return env.get(ENV_EXIT_RECORD, "").strip()


def write(path: str, words: LastWords) -> bool:
    """Appends ``words`` to the termination-message file at ``path``; False when it did not (no
    such file, the user's own message there, no room left, any error). Never raises."""
    if not path:
        return False
    line = words.line().encode()
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOCTTY)
        try:
            size = os.fstat(fd).st_size
            if size + len(line) > MAX_MESSAGE_BYTES:
                return False
            if size and not _ours(path):
                return False
            return os.write(fd, line) == len(line)
        finally:
            os.close(fd)
    return False


def _ours(path: str) -> bool:
    """The file holds only the probe's lines (another process of the container wrote them)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(MAX_MESSAGE_BYTES)
    except OSError:
        return False
    return all(line.split(" ", 1)[0] == PREFIX for line in text.splitlines() if line)
