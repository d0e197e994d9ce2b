"""``dam run --stall-after SECONDS --on-stall {report,exit}``: the job's progress while it runs.

Each sample reads the command's probe files (every rank's: its steps, its latest batch, its
collectives entered and, once a step is overdue, where its watchdog found the training thread;
``dam_probe._watchdog``) and asks the progress judge (``dam_operator.diagnosis.progress``). A
change of state is printed on stderr (``report``); with ``exit`` a stall ends the command (its
process group is stopped) and ``dam run`` exits ``STALL_EXIT_CODE``, its ``--json`` carrying
``progress`` in the shape of ``status.progress``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Final

from dam_operator.diagnosis.progress import Progress, RankPlace, StallSettings, Tracker, judge, rfc3339_ns
from dam_probe.layout import PLACE_NAMES, ProbeFormatError, ProbeRecord, probe_files, read_file
from dam_probe.process import running

STALL_EXIT_CODE: Final = 3
ON_STALL: Final = ("report", "exit")


def rank_place(record: ProbeRecord, pod: str, is_running: bool) -> RankPlace:
    """The progress judge's view of one probe record (a record without the progress fields, an
    older probe's, counts its steps and nothing else)."""
    read = bool(record.place_read_ns) and record.place in PLACE_NAMES
    frames = tuple(line for line in (record.place_frames or "").split("\n") if line)
    return RankPlace(
        pod=pod,
        rank=record.rank,
        steps=record.steps,
        step_seconds=record.step_ns / 1e9,
        last_batch_ns=record.last_batch_ns or 0,
        running=is_running and not record.closed,
        entered=record.collectives_entered or 0,
        place=PLACE_NAMES[record.place] if read and record.place is not None else None,
        detail=(record.place_detail or "") if read else "",
        frames=frames if read else (),
    )


def rank_places(probe_dir: str, is_running: Callable[[int], bool] = running) -> dict[str, RankPlace]:
    """Every training process of the command (a probe file with a batch or a rank), by file."""
    out: dict[str, RankPlace] = {}
    for path in probe_files(probe_dir):
        try:
            record = read_file(path)
        except (OSError, ProbeFormatError):
            continue  # gone meanwhile, or torn: the next sample reads it
        if record.steps or record.rank is not None:
            out[path] = rank_place(record, "", is_running(record.pid))
    return out


@dataclass
class StallWatch:
    """The progress of the command's ranks, sample after sample."""

    probe_dir: str
    settings: StallSettings
    on_stall: str = "report"
    clock_ns: Callable[[], int] = time.time_ns
    tracker: Tracker = field(default_factory=Tracker)
    progress: Progress | None = None
    seen: dict[str, RankPlace] = field(default_factory=dict)
    """Every process's latest figures: one whose file went (a finished process's file is removed
    by the next probe that starts) keeps them, as ended."""

    def sample(self) -> tuple[Progress, bool]:
        """The progress now, and whether its state changed."""
        now = self.clock_ns()
        current = rank_places(self.probe_dir)
        for path, place in self.seen.items():
            if path not in current:
                self.seen[path] = replace(place, running=False)
        self.seen.update(current)
        found = judge(list(self.seen.values()), now, self.settings)
        self.progress, changed = self.tracker.update(found, rfc3339_ns(now))
        return self.progress, changed

    def stops(self) -> bool:
        """Whether the command is to be ended now (``--on-stall exit`` and a stall)."""
        return self.on_stall == "exit" and self.progress is not None and self.progress.state == "Stalled"
