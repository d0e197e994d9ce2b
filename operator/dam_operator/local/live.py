"""``dam run``'s live verdict: one status line on a terminal, one line per change elsewhere.

On a terminal (stderr is a tty) ``dam run`` keeps ONE status line at the bottom,
redrawn in place with a carriage return and clear-to-end-of-line (``\\r\\x1b[K``),
like a progress bar: "waiting for the first training step", then "warming up: N
steps so far" until one full window of training has been seen, then the live
verdict. It never scrolls.

The training command's own output would land on that line, so on a terminal the
command's stdout and stderr are connected to pseudo-terminals (it still sees a
terminal: line buffering, colours and progress bars keep working) and relayed:
before a chunk of its output is written the status line is cleared, and once the
command has finished a line (its output ends with a newline) the status line is
drawn again below it. While the command has a line half-written (a progress bar of
its own, a prompt) the status line stays hidden, so the two never share a line.

Off a terminal (a log file, CI, a pipe) nothing is redrawn: a line is printed only
when the verdict's axis or regime changes, and none during the warm-up.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
import struct
import termios
from collections.abc import Callable
from dataclasses import dataclass

from dam_operator.diagnosis.model import Verdict
from dam_operator.diagnosis.render import render_line

CLEAR_LINE = "\r\x1b[K"
"""Carriage return, then erase to the end of the line: the status line's redraw prefix."""


LIVE_MODES = ("auto", "line", "changes", "never")
"""``--live``: auto = a status line on a terminal, change lines elsewhere; line and changes force one."""


def live_mode(requested: str, *, stderr_is_terminal: bool) -> str:
    """The live output actually used: ``line``, ``changes`` or ``never``."""
    if requested == "auto":
        return "line" if stderr_is_terminal else "changes"
    return requested


def progress_text(elapsed: float, steps: float, window_seconds: float) -> str:
    """The status line's text before the first full window of training."""
    if steps <= 0:
        return f"dam: {elapsed:4.0f}s  waiting for the first training step"
    n = int(steps)
    return (
        f"dam: {elapsed:4.0f}s  warming up: {n} step{'' if n == 1 else 's'} so far "
        f"(first verdict after {window_seconds:g}s of training)"
    )


def verdict_text(elapsed: float, verdict: Verdict) -> str:
    """The status line's (or a change line's) text for a verdict, naming a straggler first."""
    s = verdict.bottleneck.straggler
    lagging = ""
    if s is not None:
        who = f"rank {s.rank}" if s.rank is not None else (s.pod or "a process")
        lagging = f"straggler {who} ({s.cause.value}) · "
    return f"dam: {elapsed:4.0f}s  {lagging}{render_line(verdict)}"


def fit(text: str, columns: int) -> str:
    """``text`` cut to fit one terminal row (a wrapped status line could not be redrawn in place)."""
    limit = max(columns - 1, 8)
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass
class ChangeFilter:
    """Off a terminal: says whether a verdict is worth a line (its axis, regime or straggler changed)."""

    last: tuple[str, str, str] | None = None

    def changed(self, verdict: Verdict) -> bool:
        b = verdict.bottleneck
        lagging = "" if b.straggler is None else f"{b.straggler.rank}:{b.straggler.cause.value}"
        key = (b.axis.value, b.regime.value, lagging)
        if key == self.last:
            return False
        self.last = key
        return True


class StatusLine:
    """One line at the bottom of a terminal, redrawn in place; the command's output passes above it.

    ``write`` writes to the terminal (stderr); ``columns`` gives its width.
    """

    def __init__(self, write: Callable[[str], None], columns: Callable[[], int]) -> None:
        self._write = write
        self._columns = columns
        self._text = ""
        self._shown = False
        self._line_open = False  # the command has a line half-written: the status line waits

    def show(self, text: str) -> None:
        if self._shown and text == self._text:
            return
        self._text = text
        if not self._line_open:
            self._write(CLEAR_LINE + fit(text, self._columns()))
            self._shown = True

    def before_output(self) -> None:
        """Clears the status line before the command's output is written."""
        if self._shown:
            self._write(CLEAR_LINE)
            self._shown = False

    def after_output(self, chunk: bytes) -> None:
        """Redraws the status line once the command's output ends a line."""
        if not chunk:
            return
        self._line_open = not chunk.endswith(b"\n")
        if not self._line_open and self._text:
            self.show(self._text)

    def close(self) -> None:
        """Removes the status line (before the final verdict is printed)."""
        self.before_output()
        self._text = ""


def terminal_columns(fd: int) -> int:
    try:
        return os.get_terminal_size(fd).columns or 80
    except OSError:
        return 80


class OutputRelay:
    """Connects the command's output to pseudo-terminals and copies it to the real ones.

    ``destinations`` maps each of the command's streams (1 = stdout, 2 = stderr) to the
    file descriptor of this process where its output goes. A destination that is a
    terminal gets a pseudo-terminal (one per destination) whose output is relayed
    through ``status``; any other destination is handed to the command as it is.
    """

    READ_BYTES = 65536

    def __init__(self, destinations: dict[int, int], status: StatusLine) -> None:
        self.status = status
        self._masters: dict[int, int] = {}  # master fd -> destination fd
        self._slaves: dict[int, int] = {}  # destination fd -> slave fd
        self.child_fds: dict[int, int] = {}  # command's stream -> fd to give it
        for stream, dest in sorted(destinations.items()):
            if os.isatty(dest):
                if dest not in self._slaves:
                    master, slave = os.openpty()
                    _copy_window_size(dest, slave)
                    self._masters[master] = dest
                    self._slaves[dest] = slave
                self.child_fds[stream] = self._slaves[dest]
            else:
                self.child_fds[stream] = dest

    def started(self) -> None:
        """Closes this process's copies of the slave ends (the command holds its own)."""
        for slave in self._slaves.values():
            os.close(slave)
        self._slaves.clear()

    def pump(self, timeout: float) -> None:
        """Copies what the command wrote within ``timeout`` seconds (returns early when idle)."""
        if not self._masters:
            return
        try:
            ready, _, _ = select.select(list(self._masters), [], [], max(timeout, 0.0))
        except InterruptedError:
            return
        for master in ready:
            self._copy(master)

    def drain(self, quiet_seconds: float = 0.05) -> None:
        """Copies what is left after the command exited, then closes the pseudo-terminals."""
        while self._masters:
            ready, _, _ = select.select(list(self._masters), [], [], quiet_seconds)
            if not ready:
                break
            for master in ready:
                self._copy(master)
        self.close()

    def close(self) -> None:
        for master in list(self._masters):
            self._close_master(master)
        for slave in self._slaves.values():
            os.close(slave)
        self._slaves.clear()

    def _copy(self, master: int) -> None:
        try:
            chunk = os.read(master, self.READ_BYTES)
        except OSError as exc:  # EIO: every holder of the slave end has closed it
            if exc.errno not in (errno.EIO, errno.EBADF):
                raise
            chunk = b""
        if not chunk:
            self._close_master(master)
            return
        dest = self._masters[master]
        self.status.before_output()
        _write_all(dest, chunk)
        self.status.after_output(chunk)

    def _close_master(self, master: int) -> None:
        self._masters.pop(master, None)
        with contextlib.suppress(OSError):
            os.close(master)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except InterruptedError:
            continue
        view = view[n:]


def _copy_window_size(src: int, dst: int) -> None:
    """Gives the pseudo-terminal the real terminal's size (progress bars size themselves by it)."""
    with contextlib.suppress(OSError):
        size = fcntl.ioctl(src, termios.TIOCGWINSZ, struct.pack("HHHH", 0, 0, 0, 0))
        fcntl.ioctl(dst, termios.TIOCSWINSZ, size)
