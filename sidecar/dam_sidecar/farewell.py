"""The sidecar's last words: each rank's goodput figures, into its container's termination message.

Why: the operator scrapes once a window, so what a training process did between its pod's last
scrape and its end (up to a window: its last steps, a save, the wait for a peer that died) was
never seen, and counted as the restart's when the pod failed or was deleted (issue 28's node
runs: a deleted rank's restart read 3.1 s, 10 %, over the job's own 30.6 s). When the sidecar
stops (SIGTERM), it samples the probe files once more and writes, per rank, the figures it exports
as ``dam_goodput_seconds_total`` and ``dam_badput_seconds_total{cause}``, with the time they were
taken (the rank's latest publish): the operator reads them from the Pod's last body
(``Registry.exited_pods_for``) and counts the difference from the last scrape as what it was.

What it relies on: a native sidecar (an init container with ``restartPolicy: Always``, what the
webhook injects) is stopped after the Pod's main containers exited (KEP-753: "sidecar containers
are terminated after the main containers"), so the training processes' last publishes are on file
by then, whether they closed cleanly or died (SIGTERM's default, ``os._exit``, SIGKILL: the figures
of their last publish, at most the probe's 100 ms old). The kubelet creates the termination-message
file (``/dev/termination-log`` unless the Pod says otherwise), writable by the container's user, and
keeps 4,096 bytes of it (``dam_probe.lastwords``, whose line format these are: one
``dam-probe/1`` line a rank, ``pid=0`` for the sidecar's sum of the rank's processes). A plain
sidecar container is stopped with the others: its figures may then stop short of the processes'
end; the operator checks that they continue its last scrape.
"""

from __future__ import annotations

from collections.abc import Sequence

from dam_contract import names as n
from dam_probe import lastwords
from dam_probe.lastwords import LastWords, Totals
from dam_sidecar.collectors.probe import badput_causes
from dam_sidecar.samplers.probe import RankSample

SIDECAR_PID = 0
"""The ``pid`` of the sidecar's lines: the rank's processes together, not one of them."""


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else max(0, round(seconds * 1000))


def rank_words(ranks: Sequence[RankSample]) -> list[LastWords]:
    """One line a rank that accounts for goodput, its figures as the collector exports them."""
    out = []
    for r in ranks:
        productive, at = _ms(r.productive_seconds), _ms(r.published_seconds)
        if productive is None or at is None:
            continue
        causes = badput_causes(r)
        since = (
            r.steps_since_checkpoint
            if r.steps_since_checkpoint is not None
            else r.ended_steps_since_checkpoint
        )
        totals = Totals(
            at_ms=at,
            productive_ms=productive,
            startup_ms=_ms(causes[n.CAUSE_STARTUP]) or 0,
            data_wait_ms=_ms(causes[n.CAUSE_DATA_WAIT]) or 0,
            other_ms=_ms(causes[n.CAUSE_OTHER]) or 0,
            communication_ms=_ms(causes[n.CAUSE_COMMUNICATION]),
            checkpoint_ms=_ms(causes[n.CAUSE_CHECKPOINT]),
            steps_since_checkpoint=since if r.checkpoint_seconds is not None else None,
        )
        out.append(LastWords(pid=SIDECAR_PID, rank=r.rank, steps=r.steps, totals=totals))
    return out


def say(path: str, ranks: Sequence[RankSample]) -> int:
    """Appends each rank's line to the termination-message file at ``path`` (never creating it,
    never into a message of the user's, never past what the kubelet keeps: ``lastwords.write``);
    the lines written. Never raises."""
    written = 0
    for words in rank_words(ranks):
        if not lastwords.write(path, words):
            break
        written += 1
    return written
