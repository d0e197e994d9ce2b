"""Small process and polling helpers the control plane and the node use (and the tests, through
tests/support/procs.py): a free loopback port, a poll with a deadline, a stop that always reaps."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(check: Callable[[], T | None], timeout: float, what: str, interval: float = 0.25) -> T:
    """Poll ``check`` until it returns something truthy; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except Exception as exc:  # keep polling; report the last error
            last = exc
        time.sleep(interval)
    raise AssertionError(
        f"timed out after {timeout:g} s waiting for {what}" + (f" (last error: {last})" if last else "")
    )


def stop_process(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, timeout: float = 20.0) -> None:
    """Stop ``proc`` with ``sig``, kill it after ``timeout``, and close its pipes."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
