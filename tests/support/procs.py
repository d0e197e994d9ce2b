"""Small helpers for tests that run real processes and servers on loopback.

A test leaves nothing running, even when it is killed: start background
processes with ``spawn`` (``subprocess.Popen`` plus ``dies_with_parent``), so
that Linux kills them when the test process dies, by SIGKILL too, where a
``finally`` never runs. A child that starts its own background children gives
them the same (``CHILD_DIES_WITH_PARENT`` is the snippet for ``python -c``
children that cannot import this module).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Sequence
from typing import Any

from dam_cluster.procs import free_port, stop_process, wait_for

__all__ = [
    "CHILD_DIES_WITH_PARENT",
    "Listener",
    "dies_with_parent",
    "free_port",
    "spawn",
    "stop_process",
    "wait_for",
]

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

# For a ``python -c`` child (argv[1]: its parent's pid) that must die with its parent.
CHILD_DIES_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(0)  # the parent died before prctl: nobody would kill us\n"
)


def dies_with_parent() -> Callable[[], None]:
    """A ``preexec_fn`` after which Linux SIGKILLs the child when this process dies, however it dies.

    prctl(2) PR_SET_PDEATHSIG: the signal is sent when the *thread* that forked
    the child ends, not the process, so call it from the main thread (pytest
    runs fixtures and tests there); anywhere else it refuses. The child then
    checks that its parent is still the one that forked it: a parent that died
    between the fork and the prctl would otherwise go unnoticed.
    """
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            "dies_with_parent: start the process from the main thread (PR_SET_PDEATHSIG fires when the "
            "forking thread ends)"
        )
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # loaded here: the child only calls it
    parent = os.getpid()

    def preexec() -> None:  # runs in the child between fork and exec: no allocation-heavy work
        if prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0 or os.getppid() != parent:
            os._exit(127)

    return preexec


def spawn(args: Sequence[str | os.PathLike[str]], **kwargs: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen(args, **kwargs)`` for a background process that dies with the test process."""
    if "preexec_fn" in kwargs:
        raise TypeError("spawn sets preexec_fn itself")
    return subprocess.Popen(args, preexec_fn=dies_with_parent(), **kwargs)  # noqa: PLW1509 - only prctl()


class Listener:
    """A TCP listener on ``host`` that counts the connections it accepts (an address the code under
    test must never be sent to), IPv6 too; ``close()`` stops it."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.create_server((host, 0), family=family)
        self.sock.settimeout(0.2)
        self.port = int(self.sock.getsockname()[1])
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()
