"""The stall watchdog: where the training thread is when its step is overdue.

A daemon thread of the probe wakes every ``CHECK_NS`` (1 s) and compares the time since the latest
batch with ``overdue_ns``: at least ``OVERDUE_MIN_NS`` and ``OVERDUE_STEP_MULTIPLE`` times the mean
step so far. Until then it reads two integers and sleeps: nothing runs per step. Once overdue, it
reads the training thread's own frame (``sys._current_frames()``: no signal is sent to the process,
nothing is interrupted) and names the place (``place_of``): inside a collective (the op and its
sequence number among the collectives this thread entered), inside the DataLoader's ``next`` (with
the worker whose batch is awaited, alive or dead), inside a checkpoint save, in backward, in the
optimizer, or in the user's own code, with the innermost frames as ``file:line function``. It
publishes that through the probe file (``layout``, flag bit 11) from its own thread, re-reads it
every ``REREAD_NS`` while the step stays overdue, and the next batch clears it.

Whether that is a stall is the reader's call (``dam_operator.diagnosis.progress``: the floor and
the multiple are the profile's, ``spec.evaluation.stallAfterSeconds`` and ``stallStepMultiple``);
the probe only says where the thread is once a step takes much longer than usual. No batch yet
(first-step compilation, a long warm-up) is never overdue: there is no step to be late.

The watchdog never calls into torch (its thread may be frozen at interpreter exit: a daemon thread
inside torch's C++ aborts the process then); it reads frames, ``f_locals`` of a few known frames
and ``/proc/<pid>/stat`` of a DataLoader worker. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import sys
import sysconfig
import threading
import time
from time import perf_counter_ns
from types import FrameType
from typing import Final, Protocol

from dam_probe._counters import CommCounters, CounterGroup, StepCounters
from dam_probe._goodput import Accounting
from dam_probe.layout import (
    PLACE_BACKWARD,
    PLACE_CHECKPOINT,
    PLACE_COLLECTIVE,
    PLACE_DATALOADER,
    PLACE_DETAIL_BYTES,
    PLACE_FRAMES_BYTES,
    PLACE_NONE,
    PLACE_OPTIMIZER,
    PLACE_USER_CODE,
    ProbeWriter,
)
from dam_probe.process import running


class Probe(Protocol):
    """What the watchdog reads of its probe (``dam_probe._core.Probe``, which holds it as
    ``watchdog``): passed in, never imported, as ``_core`` imports this module."""

    @property
    def step(self) -> StepCounters: ...
    @property
    def comm(self) -> CommCounters: ...
    @property
    def goodput(self) -> Accounting: ...
    @property
    def writer(self) -> ProbeWriter | None: ...
    @property
    def disabled(self) -> bool: ...
    def publish_watch(self, now_ns: int) -> bool: ...


CHECK_NS: Final = 1_000_000_000
"""How often the watchdog thread wakes (1 s): the place is read at most this late."""
OVERDUE_MIN_NS: Final = 5_000_000_000
"""A step is overdue after at least this long (5 s) ..."""
OVERDUE_STEP_MULTIPLE: Final = 4
"""... and at least this many mean steps: a job of 10 s steps is read after 40 s."""
REREAD_NS: Final = 5_000_000_000
"""While the step stays overdue the place is read again this often (it may move)."""
MAX_FRAMES: Final = 4
"""Frames published (innermost first), within ``PLACE_FRAMES_BYTES``."""
MAX_DEPTH: Final = 200
"""Frames walked outward looking for a known place."""

ENV_WATCHDOG: Final = "DAM_PROBE_WATCHDOG"
"""``0`` (or false/no/off) turns the watchdog off: no thread, the place never read."""
_OFF: Final = frozenset({"0", "false", "no", "off"})


def off_by_env(environ: dict[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get(ENV_WATCHDOG, "").strip().lower() in _OFF


_SEP = os.sep
_paths = sysconfig.get_paths()
# (path fragment, place) for the frames of PyTorch's own code; the innermost match wins.
_TORCH_PLACES: Final = (
    (f"torch{_SEP}distributed{_SEP}checkpoint{_SEP}", PLACE_CHECKPOINT),
    (f"torch{_SEP}distributed{_SEP}", PLACE_COLLECTIVE),
    (f"torch{_SEP}utils{_SEP}data{_SEP}", PLACE_DATALOADER),
    (f"torch{_SEP}serialization.py", PLACE_CHECKPOINT),
    (f"torch{_SEP}optim{_SEP}", PLACE_OPTIMIZER),
    (f"torch{_SEP}autograd{_SEP}", PLACE_BACKWARD),
)
_HERE: Final = os.path.dirname(os.path.abspath(__file__))
_COMM_FILE: Final = os.path.join(_HERE, "_comm.py")
_CHECKPOINT_FILE: Final = os.path.join(_HERE, "_checkpoint.py")  # its save wrappers


def _ascii(text: str, limit: int) -> str:
    return text.encode("ascii", "replace").decode("ascii")[:limit]


def _frame_line(frame: FrameType) -> str:
    code = frame.f_code
    return f"{os.path.basename(code.co_filename)}:{frame.f_lineno} {code.co_name}"


def _user_frames(frame: FrameType | None) -> list[FrameType]:
    """The stack from the innermost frame outward, the probe's own frames left out."""
    out: list[FrameType] = []
    while frame is not None and len(out) < MAX_DEPTH:
        if not os.path.abspath(frame.f_code.co_filename).startswith(_HERE):
            out.append(frame)
        frame = frame.f_back
    return out


_LIBRARY_KEYS: Final = ("stdlib", "platstdlib", "purelib", "platlib")
_LIBRARY_DIRS: Final = tuple({os.path.abspath(p) + _SEP for k in _LIBRARY_KEYS if (p := _paths.get(k))})


def _own(frame: FrameType) -> bool:
    """A frame of the job's own code: not of the standard library or of an installed package."""
    return not os.path.abspath(frame.f_code.co_filename).startswith(_LIBRARY_DIRS)


def frames_text(frames: list[FrameType]) -> str:
    """``file:line function`` lines, within the field's bytes: the two innermost frames (where the
    thread waits), then the innermost two of the job's own code (what of it got there)."""
    picked = frames[:2] + [f for f in frames[2:] if _own(f)][: MAX_FRAMES - 2]
    lines: list[str] = []
    size = 0
    for frame in picked:
        line = _ascii(_frame_line(frame), PLACE_FRAMES_BYTES)
        if size + len(line) + (1 if lines else 0) > PLACE_FRAMES_BYTES:
            break
        size += len(line) + (1 if lines else 0)
        lines.append(line)
    return "\n".join(lines)


def _worker_state(pid: int) -> str:
    """``alive`` or ``dead`` (gone, or a zombie): ``/proc/<pid>/stat``, no wait, no reaping."""
    return "alive" if running(pid) else "dead"


def _loader_detail(frames: list[FrameType]) -> str:
    """The worker whose batch a multi-process DataLoader iterator awaits, or the main process."""
    for frame in frames:
        it = frame.f_locals.get("self") if frame.f_code.co_name in ("_next_data", "_get_data") else None
        if it is None or not hasattr(it, "_rcvd_idx"):
            continue
        with contextlib.suppress(Exception):
            idx = it._rcvd_idx
            info = it._task_info.get(idx)
            workers = it._workers
            if info and len(info) == 1:  # dispatched, not returned (DataLoader's own bookkeeping)
                worker = int(info[0])
                pid = int(workers[worker].pid)
                return f"worker {worker} pid {pid} {_worker_state(pid)}, batch {idx}"
            return f"batch {idx}"
    return "in the main process"


def _collective_detail(frame: FrameType) -> str:
    """The op and its sequence number, from the probe's timed wrapper's frame."""
    names = frame.f_locals
    orig = names.get("orig")
    op = getattr(orig, "__name__", "") or frame.f_code.co_name
    seq = names.get("seq")
    return f"{op} #{seq}" if isinstance(seq, int) else ("wait" if frame.f_code.co_name == "wait" else op)


def _timed_collective(top: FrameType | None) -> FrameType | None:
    """The outermost frame of the probe's timed collective wrapper on the stack (None: none)."""
    found, frame, depth = None, top, 0
    while frame is not None and depth < MAX_DEPTH:
        if frame.f_code.co_name == "collective" and os.path.abspath(frame.f_code.co_filename) == _COMM_FILE:
            found = frame
        frame, depth = frame.f_back, depth + 1
    return found


def place_of(top: FrameType | None) -> tuple[int, str, str]:
    """``(PLACE_*, detail, frames)`` of a thread whose innermost frame is ``top``."""
    place, detail = PLACE_USER_CODE, ""
    outer = _timed_collective(top)
    frame = None if outer is not None else top
    if outer is not None:  # inside a collective the probe timed (a Work.wait inside it too)
        place, detail = PLACE_COLLECTIVE, _collective_detail(outer)
    depth = 0
    while frame is not None and depth < MAX_DEPTH:
        path = os.path.abspath(frame.f_code.co_filename)
        name = frame.f_code.co_name
        if path == _COMM_FILE and name == "wait":  # an asynchronous work's wait (the timed call returned)
            place, detail = PLACE_COLLECTIVE, _collective_detail(frame)
            break
        if path == _CHECKPOINT_FILE and name == "save":
            place = PLACE_CHECKPOINT
            break
        found = next((p for fragment, p in _TORCH_PLACES if fragment in path), None)
        if found is not None:
            place = found
            if found == PLACE_COLLECTIVE:
                detail = name  # torch.distributed's own function: the op, without our count
            break
        frame, depth = frame.f_back, depth + 1
    frames = _user_frames(top)
    if place == PLACE_DATALOADER:
        detail = _loader_detail(frames)
    return place, _ascii(detail, PLACE_DETAIL_BYTES), frames_text(frames)


class Watchdog(CounterGroup):
    """The watchdog thread's state and what it last read (see the module docstring)."""

    __slots__ = ("detail", "frames", "pid", "place", "read_ns", "thread")

    def reset(self) -> None:
        """Nothing read; a forked child has no watchdog thread (started again at its first batch)."""
        self.place = PLACE_NONE
        self.detail = ""
        self.frames = ""
        self.read_ns = 0  # Unix ns of the latest read (0: not read since the latest batch)
        self.pid = 0  # the process whose thread runs (a forked child's is not running)
        self.thread: threading.Thread | None = None

    def figures(self, p: Probe) -> tuple[int, int, int, int, str, str]:
        """``(collectives entered, latest batch Unix ns, read Unix ns, PLACE_*, detail, frames)``."""
        s = p.step
        last = 0
        if s.steps:
            last = time.time_ns() - max(0, perf_counter_ns() - s.last_ns)
        return p.comm.entered, last, self.read_ns, self.place, self.detail, self.frames

    def at_batch(self, p: Probe) -> None:
        """On the slow path: starts the thread once per process; a batch ends what was read."""
        if self.pid != os.getpid():
            self.pid = os.getpid()
            if off_by_env():
                return
            self.thread = threading.Thread(
                target=self._run, args=(p,), name="dam-probe-watchdog", daemon=True
            )
            self.thread.start()
        if self.read_ns:
            self.place, self.detail, self.frames, self.read_ns = PLACE_NONE, "", "", 0

    def announce(self, p: Probe, place: int, detail: str) -> None:
        """Entering a call that may hold the GIL while it blocks (a save opening a file on a dead
        file system, in C++): the place is published now, from the calling thread, since this
        thread could not read it then. Never raises."""
        with contextlib.suppress(Exception):
            frames = frames_text(_user_frames(sys._getframe(1)))
            self.place, self.detail, self.frames = place, _ascii(detail, PLACE_DETAIL_BYTES), frames
            self.read_ns = time.time_ns()
            p.publish_watch(perf_counter_ns())

    def left(self) -> None:
        """The announced call returned: the next publish carries no place."""
        self.place, self.detail, self.frames, self.read_ns = PLACE_NONE, "", "", 0

    def overdue_ns(self, p: Probe) -> int:
        s = p.step
        mean = s.step_ns // s.steps if s.steps > 1 else 0
        return max(OVERDUE_MIN_NS, OVERDUE_STEP_MULTIPLE * mean)

    def check(self, p: Probe, now_ns: int) -> bool:
        """One wake-up: reads the place when the step is overdue (and not read lately); True when
        it published. Never raises."""
        try:
            s = p.step
            if not s.steps or p.disabled or p.writer is None or self.pid != os.getpid():
                return False
            if now_ns - s.last_ns < self.overdue_ns(p):
                return False
            if self.read_ns and time.time_ns() - self.read_ns < REREAD_NS:
                return False
            tid = p.goodput.train_thread
            top = sys._current_frames().get(tid) if tid else None
            if top is None:
                return False
            last_ns = s.last_ns
            place, detail, frames = place_of(top)
            if s.last_ns != last_ns:  # a batch came meanwhile: not overdue after all
                return False
            self.place, self.detail, self.frames, self.read_ns = place, detail, frames, time.time_ns()
            return p.publish_watch(perf_counter_ns())
        except Exception:
            return False

    def _run(self, p: Probe) -> None:
        me = os.getpid()
        while os.getpid() == me:  # (threads do not survive a fork; the check is cheap)
            time.sleep(CHECK_NS / 1e9)
            self.check(p, perf_counter_ns())
