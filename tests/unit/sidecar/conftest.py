"""Fixtures for the sidecar tests: probe files, /proc and cgroup trees in tmp_path."""

from __future__ import annotations

import os
from pathlib import Path

from dam_probe.layout import ProbeRecord, encode, probe_path
from dam_sidecar.attribution import Attributor
from dam_sidecar.collector import SidecarCollector, standard_collectors
from dam_sidecar.errors import ErrorLog
from dam_sidecar.samplers.cpu import CpuSampler, PublishedCpu
from dam_sidecar.samplers.nvml import NoNvml
from dam_sidecar.samplers.probe import ProbeReader

OWN_NS, OTHER_NS = 4026531836, 4026532999
"""The sidecar's PID namespace and a trainer's other one (``published_collector``)."""


def write_probe(directory: Path, **fields: object) -> str:
    """Write a probe file image (any ProbeRecord field can be given)."""
    defaults: dict[str, object] = {
        "pid": 4242,
        "start_time_ns": 1_000,
        "steps": 0,
        "wait_ns": 0,
        "step_ns": 0,
        "last_update_ns": 10**19 - 1,
        "batch_size": 0,
        "flops_per_step": 0.0,
        "closed": False,
        "device_uuids": (),
    }
    defaults.update(fields)
    record = ProbeRecord(**defaults)  # type: ignore[arg-type]
    path = probe_path(str(directory), record.pid)
    with open(path, "wb") as fh:
        fh.write(encode(record))
    return path


def write_proc_stat(
    proc: Path, pid: int, ppid: int, *, utime: int, stime: int, start: int = 100, comm: str = "python"
) -> None:
    d = proc / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    # Fields 3..22: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
    # cutime cstime priority nice threads itrealvalue starttime
    rest = ["S", str(ppid), "1", "1", "0", "-1", "0", "0", "0", "0", "0", str(utime), str(stime)]
    rest += ["0", "0", "20", "0", "1", "0", str(start), "0", "0"]
    (d / "stat").write_text(f"{pid} ({comm}) " + " ".join(rest) + "\n")


def write_children(proc: Path, pid: int, children: list[int]) -> None:
    d = proc / str(pid) / "task" / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "children").write_text("".join(f"{c} " for c in children))


def remove_proc(proc: Path, pid: int) -> None:
    import shutil

    shutil.rmtree(proc / str(pid), ignore_errors=True)


def touch_dir(path: Path) -> Path:
    os.makedirs(path, exist_ok=True)
    return path


def published_collector(tmp_path: Path) -> tuple[SidecarCollector, Path, Path]:
    """A collector over probe files, /proc and cgroup trees in ``tmp_path``, whose own PID namespace
    is ``OWN_NS`` (a probe of another one publishes its process figures); with the probe and /proc
    directories."""
    probes, proc = touch_dir(tmp_path / "probes"), touch_dir(tmp_path / "proc")
    cg = touch_dir(tmp_path / "cg")
    errors = ErrorLog()
    collector = SidecarCollector(
        standard_collectors(
            probe=ProbeReader(str(probes), errors, proc_root=str(proc)),
            nvml=NoNvml(),
            cpu=CpuSampler(errors, proc_root=str(proc), cgroup_root=str(cg), clock_ticks_per_second=100),
            errors=errors,
            attributor=Attributor("visible_devices", None),
            published=PublishedCpu(own_namespace=OWN_NS),
        ),
        errors=errors,
    )
    return collector, probes, proc
