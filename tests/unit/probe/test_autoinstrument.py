"""Automatic instrumentation: ``sitecustomize`` on PYTHONPATH measures real torch DataLoaders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dam_probe.bootstrap import install_into
from dam_probe.layout import probe_files, read_file

from .conftest import probe_lines, python_env, run_python

TRAIN = """
import json, os, sys, time
from dam_probe import _autohook
report = {"torch_before": "torch" in sys.modules, "hooked": _autohook.installed()}
import torch
from torch.utils.data import DataLoader, Dataset

class Samples(Dataset):
    def __init__(self, delay):
        self.delay = delay
    def __len__(self):
        return 48
    def __getitem__(self, i):
        time.sleep(self.delay)
        return torch.zeros(4), i

def counters():
    from dam_probe import PROBE
    return PROBE.step.steps, PROBE.step.wait_ns, PROBE.step.step_ns

def phase(loader, work):
    s0, w0, t0 = counters()
    for x, y in loader:
        time.sleep(work)
    s1, w1, t1 = counters()
    return {"steps": s1 - s0, "ratio": (w1 - w0) / (t1 - t0) if t1 > t0 else None}

report["starved"] = phase(DataLoader(Samples(0.01), batch_size=8, num_workers=WORKERS), 0.0)
report["busy"] = phase(DataLoader(Samples(0.0), batch_size=8), 0.02)
report["pid"] = os.getpid()
report["wrapped"] = hasattr(torch.utils.data.dataloader._BaseDataLoaderIter.__next__, "_dam_probe_wrapped")
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def site_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return install_into(str(tmp_path_factory.mktemp("site")))


def test_starved_dataloader_shows_a_high_wait_ratio_without_code_changes(
    site_dir: str, tmp_path: Path
) -> None:
    probes = tmp_path / "probes"
    # The starved phase uses two forked worker processes; the busy phase loads in the main process.
    result = run_python(
        TRAIN.replace("WORKERS", "2"), python_env(PYTHONPATH=site_dir, DAM_PROBE_DIR=str(probes))
    )
    assert result.returncode == 0, result.stderr
    assert probe_lines(result.stderr) == []
    report = json.loads(result.stdout)
    assert report["torch_before"] is False  # the hook never imports torch itself
    assert report["hooked"] is True
    assert report["wrapped"] is True
    assert report["starved"]["steps"] == 6
    assert report["starved"]["ratio"] > 0.7
    assert report["busy"]["steps"] == 6
    assert report["busy"]["ratio"] < 0.3
    # One file, the training process's own: DataLoader workers never write one.
    (path,) = probe_files(str(probes))
    rec = read_file(path)
    assert rec.pid == report["pid"]
    assert (rec.steps, rec.batch_size, rec.closed) == (12, 8, True)
    assert rec.device_uuids == ()  # CPU only: no CUDA device to attribute


def test_disable_variable_leaves_dataloaders_untouched_and_writes_no_file(
    site_dir: str, tmp_path: Path
) -> None:
    probes = tmp_path / "probes"
    env = python_env(PYTHONPATH=site_dir, DAM_PROBE_DIR=str(probes), DAM_PROBE_DISABLE="1")
    result = run_python(TRAIN.replace("WORKERS", "0"), env)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["hooked"] is False
    assert report["wrapped"] is False
    assert report["starved"]["steps"] == 0
    assert not probes.exists()


def test_unwritable_probe_dir_prints_one_line_and_the_training_completes(
    site_dir: str, tmp_path: Path
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    env = python_env(PYTHONPATH=site_dir, DAM_PROBE_DIR=str(blocker / "probes"))
    result = run_python(TRAIN.replace("WORKERS", "0"), env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["busy"]["steps"] == 6  # the loop ran to the end
    lines = probe_lines(result.stderr)
    assert len(lines) == 1
    assert lines[0].startswith("dam-probe: disabled: cannot create ")
    assert "Traceback" not in result.stderr


USER_SITE = """
import os
with open(os.environ["CHAIN_LOG"], "a") as fh:
    fh.write("ran\\n")
USER_VALUE = 42
"""

CHECK = """
import json, runpy, sys
from dam_probe import _autohook
site = sys.modules["sitecustomize"]
again = RUN_AGAIN
if again:
    runpy.run_path(again)
    _autohook.install()
print(json.dumps({
    "user_value": getattr(site, "USER_VALUE", None),
    "hooks": sum(1 for f in sys.meta_path if getattr(f, "dam_probe_hook", False)),
    "torch": "torch" in sys.modules,
}))
"""


def _user_site(tmp_path: Path) -> Path:
    user = tmp_path / "user"
    user.mkdir()
    (user / "sitecustomize.py").write_text(USER_SITE)
    return user


@pytest.mark.parametrize("probe_dir", [True, False])
def test_an_existing_sitecustomize_further_down_the_path_still_runs_once(
    site_dir: str, tmp_path: Path, probe_dir: bool
) -> None:
    log = tmp_path / "chain.log"
    env = python_env(PYTHONPATH=f"{site_dir}:{_user_site(tmp_path)}", CHAIN_LOG=str(log))
    if probe_dir:
        env["DAM_PROBE_DIR"] = str(tmp_path / "probes")
    result = run_python(CHECK.replace("RUN_AGAIN", "None"), env)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert log.read_text() == "ran\n"
    assert report["user_value"] == 42  # `import sitecustomize` gives the user's module, as without us
    assert report["hooks"] == (1 if probe_dir else 0)
    assert report["torch"] is False


def test_running_the_sitecustomize_twice_and_two_installs_on_the_path_are_harmless(
    site_dir: str, tmp_path: Path
) -> None:
    second = install_into(str(tmp_path / "second"))
    log = tmp_path / "chain.log"
    env = python_env(
        PYTHONPATH=f"{site_dir}:{second}:{_user_site(tmp_path)}",
        CHAIN_LOG=str(log),
        DAM_PROBE_DIR=str(tmp_path / "probes"),
    )
    result = run_python(CHECK.replace("RUN_AGAIN", repr(f"{site_dir}/sitecustomize.py")), env)
    assert result.returncode == 0, result.stderr
    assert probe_lines(result.stderr) == []
    report = json.loads(result.stdout)
    assert log.read_text() == "ran\n"
    assert report["hooks"] == 1
