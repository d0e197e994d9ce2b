"""Goodput and badput by cause in the probe: start-up, checkpoint saves, productive and other time."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import dam_probe
from dam_probe import _checkpoint
from dam_probe._core import Probe
from dam_probe.bootstrap import install_into
from dam_probe.layout import (
    FLOPS_MEASURED,
    FLOPS_PENDING,
    ProbeRecord,
    decode,
    encode,
    probe_files,
    read_file,
)

from .conftest import python_env, run_python

MS = 1_000_000


def _record(probe: Probe) -> ProbeRecord:
    probe.close()  # the final publish, closed flag set
    (path,) = probe_files(probe.directory)
    return read_file(path)


def _save_that_takes(seconds: float) -> Callable[[object, str], None]:
    def save(obj: object, path: str) -> None:
        time.sleep(seconds)

    return save


def _loop(
    probe: Probe, batches: int, work: float, save: Callable[..., Any] | None = None, every: int = 0
) -> None:
    for i, _ in enumerate(dam_probe.instrument(list(range(batches)))):
        time.sleep(work)
        if save is not None and every and i % every == every - 1:
            save({"step": i}, "unused")


def test_a_save_inside_the_loop_is_checkpoint_badput_not_productive_time(probe: Probe) -> None:
    save = _checkpoint.timed_save(_save_that_takes(0.03), probe)
    probe.goodput.checkpoints_on = True
    _loop(probe, 20, 0.002, save, every=5)
    r = _record(probe)
    assert r.checkpoints == 4
    assert r.checkpoint_ns is not None and r.checkpoint_step_ns is not None and r.productive_ns is not None
    assert 4 * 30 * MS <= r.checkpoint_ns < 4 * 30 * MS + 300 * MS  # sleeps overrun on a busy machine
    assert r.checkpoint_step_ns == r.checkpoint_ns  # every save was between two batches (or before the end)
    # Productive time is the work only: the saves are out of it, though they are in the step time.
    assert r.step_ns >= r.checkpoint_ns + 20 * 2 * MS
    assert 20 * 2 * MS <= r.productive_ns < r.step_ns - r.checkpoint_ns
    assert r.productive_ns + r.wait_ns + r.checkpoint_step_ns == pytest.approx(r.step_ns, abs=MS)
    assert r.last_checkpoint_steps == 20
    assert r.last_checkpoint_ns and abs(r.last_checkpoint_ns - time.time_ns()) < 60 * 10**9


def test_a_save_after_the_loop_is_checkpoint_badput_outside_step_time(probe: Probe) -> None:
    save = _checkpoint.timed_save(_save_that_takes(0.05), probe)
    probe.goodput.checkpoints_on = True
    _loop(probe, 10, 0.002)
    save({}, "unused")  # after the loader ran out: not part of any step
    r = _record(probe)
    assert r.checkpoints == 1 and r.checkpoint_ns is not None and r.checkpoint_ns >= 50 * MS
    assert r.checkpoint_step_ns == 0
    assert r.productive_ns is not None and r.productive_ns + r.wait_ns == pytest.approx(r.step_ns, abs=MS)


def test_nested_saves_count_once_and_saves_from_other_threads_not_at_all(probe: Probe) -> None:
    inner = _checkpoint.timed_save(_save_that_takes(0.02), probe)

    def outer_save(obj: object, path: str) -> None:  # dcp.save writing its items with torch.save
        inner(obj, path)
        inner(obj, path)

    outer = _checkpoint.timed_save(outer_save, probe)
    probe.goodput.checkpoints_on = True
    for i, _ in enumerate(dam_probe.instrument(list(range(6)))):
        if i == 2:
            outer({}, "unused")
        if i == 4:  # async_save's writer thread: the training thread does not wait for it
            writer = threading.Thread(target=inner, args=({}, "unused"))
            writer.start()
            writer.join()
    r = _record(probe)
    assert r.checkpoints == 1
    assert r.checkpoint_ns is not None and 40 * MS <= r.checkpoint_ns < 1000 * MS


def test_a_save_before_the_first_batch_belongs_to_startup(probe: Probe) -> None:
    save = _checkpoint.timed_save(_save_that_takes(0.02), probe)
    probe.goodput.checkpoints_on = True
    save({}, "unused")
    _loop(probe, 5, 0.001)
    r = _record(probe)
    assert r.checkpoints == 0 and r.checkpoint_ns == 0


def test_other_is_the_rest_of_the_elapsed_time_and_the_parts_add_up(probe: Probe) -> None:
    _loop(probe, 10, 0.003)
    time.sleep(0.2)  # evaluation outside the loader loop
    r = _record(probe)
    assert r.process_start_ns is not None and r.startup_ns is not None
    assert r.other_ns is not None and r.productive_ns is not None
    assert r.other_ns >= 200 * MS
    elapsed = r.last_update_ns - r.process_start_ns
    parts = r.startup_ns + r.wait_ns + r.productive_ns + r.other_ns  # no checkpoint, no collectives
    assert parts == pytest.approx(elapsed, abs=5 * MS)
    assert r.checkpoint_ns is None  # no save function was wrapped: unknown, not zero


def test_before_the_first_batch_no_goodput_is_published(probe: Probe) -> None:
    goodput, checkpoints, flops = probe.goodput.figures(probe, 0, 0, 0)
    assert goodput is None and checkpoints is None and flops is None


def test_startup_runs_from_process_start_to_the_first_batch(tmp_path: Path) -> None:
    probes = tmp_path / "probes"
    code = """
    import json, time
    import dam_probe
    time.sleep(1.0)
    asked = time.time_ns()
    for _ in dam_probe.instrument(range(5)):
        time.sleep(0.001)
    print(json.dumps({"asked": asked}))
    """
    result = run_python(code, python_env(DAM_PROBE_DIR=str(probes), PYTHONPATH=str(Path.cwd() / "sidecar")))
    assert result.returncode == 0, result.stderr
    asked = json.loads(result.stdout)["asked"]
    (path,) = probe_files(str(probes))
    r = read_file(path)
    assert r.startup_ns is not None and r.process_start_ns is not None
    assert 1.0e9 <= r.startup_ns < 1.0e9 + 3e9
    # The probe's start is the kernel's start time of the process (10 ms ticks), before the script ran.
    assert r.process_start_ns <= asked - 1.0e9 + 20 * MS
    assert r.process_start_ns + r.startup_ns == pytest.approx(asked, abs=30 * MS)


def test_goodput_fields_round_trip_and_read_as_none_without_their_flags() -> None:
    base = ProbeRecord(
        pid=7,
        start_time_ns=1,
        steps=3,
        wait_ns=4,
        step_ns=50,
        last_update_ns=60,
        batch_size=0,
        flops_per_step=0.0,
        closed=False,
    )
    full = ProbeRecord(
        **{
            **base.__dict__,
            "process_start_ns": 10,
            "startup_ns": 20,
            "productive_ns": 30,
            "other_ns": 1,
            "flops_state": FLOPS_MEASURED,
            "checkpoint_ns": 5,
            "checkpoint_step_ns": 4,
            "checkpoints": 2,
            "last_checkpoint_ns": 55,
            "last_checkpoint_steps": 3,
            "measured_flops_per_step": 1.5e9,
            "flops_measured_ns": 9,
            "flops_measured_steps": 1,
        }
    )
    assert decode(encode(full))[1] == full
    empty = decode(encode(base))[1]
    assert empty.productive_ns is None and empty.checkpoint_ns is None
    assert empty.measured_flops_per_step is None
    assert empty.flops_state is None
    assert full.effective_flops_per_step == (1.5e9, "measured")
    declared = ProbeRecord(**{**full.__dict__, "flops_per_step": 2e9})
    assert declared.effective_flops_per_step == (2e9, "declared")
    with pytest.raises(ValueError, match="go together"):
        ProbeRecord(**{**base.__dict__, "productive_ns": 3})
    with pytest.raises(ValueError, match="checkpoint fields"):
        ProbeRecord(**{**base.__dict__, "checkpoints": 3})


def test_a_fresh_probe_has_not_counted_flops_yet(probe: Probe) -> None:
    assert probe.goodput.flops.state == FLOPS_PENDING


def test_the_automatic_instrumentation_times_torch_save_and_dcp_save(tmp_path: Path) -> None:
    site = install_into(str(tmp_path / "site"))
    probes = tmp_path / "probes"
    code = f"""
    import json, time
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.utils.data import DataLoader
    from dam_probe import PROBE
    blocked = 0
    for i, (x,) in enumerate(DataLoader(torch.utils.data.TensorDataset(torch.zeros(40, 4)), batch_size=4)):
        if i == 3:
            t = time.perf_counter_ns()
            torch.save({{"w": torch.zeros(256, 256)}}, {str(tmp_path / "a.pt")!r})
            blocked += time.perf_counter_ns() - t
        if i == 6:
            t = time.perf_counter_ns()
            dcp.save({{"w": torch.zeros(256, 256)}}, checkpoint_id={str(tmp_path / "dcp")!r}, no_dist=True)
            blocked += time.perf_counter_ns() - t
    g = PROBE.goodput
    print(json.dumps({{
        "save": hasattr(torch.save, "_dam_probe_checkpoint"),
        "dcp": all(hasattr(f, "_dam_probe_checkpoint") for f in (dcp.save, dcp.async_save)),
        "saves": g.ckpt_count, "ns": g.ckpt_ns, "blocked": blocked,
    }}))
    """
    result = run_python(code, python_env(DAM_PROBE_DIR=str(probes), PYTHONPATH=site), timeout=120)
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout.strip().splitlines()[-1])
    assert got["save"] and got["dcp"]
    assert got["saves"] == 2  # dcp.save's own torch.save calls are not counted again
    assert 0 < got["ns"] <= got["blocked"]
    assert got["ns"] >= 0.5 * got["blocked"]  # the rest: building the state dicts, a busy machine
    (path,) = probe_files(str(probes))
    r = read_file(path)
    assert r.checkpoints == 2 and r.checkpoint_ns == got["ns"]


def test_the_automatic_instrumentation_times_safetensors_saves_once_each(tmp_path: Path) -> None:
    """Hugging Face's format (``save_pretrained`` writes through it): ``save_file`` and
    ``save_model`` (which calls ``save_file``: once) are checkpoint badput, bound by a later
    ``from safetensors.torch import save_file`` too."""
    site = install_into(str(tmp_path / "site"))
    probes = tmp_path / "probes"
    code = f"""
    import json, time
    import torch
    from safetensors.torch import save_file, save_model
    from torch.utils.data import DataLoader
    from dam_probe import PROBE
    model = torch.nn.Linear(512, 512)
    weights = {{"w": torch.zeros(512, 512)}}  # made outside the timing: torch's first fill starts its threads
    blocked = 0
    for i, (x,) in enumerate(DataLoader(torch.utils.data.TensorDataset(torch.zeros(40, 4)), batch_size=4)):
        if i in (2, 5):
            t = time.perf_counter_ns()
            if i == 2:
                save_file(weights, {str(tmp_path / "a.safetensors")!r})
            else:
                save_model(model, {str(tmp_path / "m.safetensors")!r})
            blocked += time.perf_counter_ns() - t
    g = PROBE.goodput
    print(json.dumps({{"wrapped": hasattr(save_file, "_dam_probe_checkpoint"), "saves": g.ckpt_count,
                       "ns": g.ckpt_ns, "blocked": blocked}}))
    """
    result = run_python(code, python_env(DAM_PROBE_DIR=str(probes), PYTHONPATH=site), timeout=120)
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout.strip().splitlines()[-1])
    assert got["wrapped"]
    assert got["saves"] == 2
    assert 0 < got["ns"] <= got["blocked"]
    assert got["ns"] >= 0.5 * got["blocked"]


def _flush_that_takes(seconds: float) -> Callable[[int], None]:
    def fsync(fd: int) -> None:
        time.sleep(seconds)

    return fsync


def test_an_fsync_right_after_a_save_is_that_save_s_time_and_no_save_of_its_own(probe: Probe) -> None:
    save = _checkpoint.timed_save(_save_that_takes(0.02), probe)
    fsync = _checkpoint.timed_flush(_flush_that_takes(0.05), probe)
    probe.goodput.checkpoints_on = True
    for i, _ in enumerate(dam_probe.instrument(list(range(8)))):
        time.sleep(0.002)
        if i in (2, 5):
            save({}, "unused")
            fsync(3)  # torch.save(obj, fh); os.fsync(fh.fileno())
    r = _record(probe)
    assert r.checkpoints == 2
    assert r.checkpoint_ns is not None and 2 * 70 * MS <= r.checkpoint_ns < 2 * 70 * MS + 300 * MS
    assert r.checkpoint_step_ns == r.checkpoint_ns  # both inside the loop: out of productive time
    assert r.last_checkpoint_steps == 6


def test_an_fsync_with_a_batch_since_the_save_or_before_any_save_is_the_step_s_own(probe: Probe) -> None:
    save = _checkpoint.timed_save(_save_that_takes(0.01), probe)
    fsync = _checkpoint.timed_flush(_flush_that_takes(0.04), probe)
    probe.goodput.checkpoints_on = True
    for i, _ in enumerate(dam_probe.instrument(list(range(6)))):
        if i == 1:
            fsync(3)  # no save yet: a log file's flush, say
        if i == 2:
            save({}, "unused")
        if i == 4:
            fsync(3)  # two batches after the save
    r = _record(probe)
    assert r.checkpoints == 1
    assert r.checkpoint_ns is not None and 10 * MS <= r.checkpoint_ns < 40 * MS


def test_patching_serialization_wraps_os_fsync_once(probe: Probe, monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import types

    monkeypatch.setattr(os, "fsync", _flush_that_takes(0.0))
    monkeypatch.setattr(os, "fdatasync", _flush_that_takes(0.0), raising=False)
    module = types.ModuleType("torch.serialization")
    module.save = _save_that_takes(0.0)  # type: ignore[attr-defined]
    _checkpoint.patch_serialization(module, probe)
    wrapped = os.fsync
    assert getattr(wrapped, _checkpoint.MARK, False)
    _checkpoint.patch_serialization(module, probe)
    assert os.fsync is wrapped  # not wrapped twice
    assert getattr(os.fdatasync, _checkpoint.MARK, False)
