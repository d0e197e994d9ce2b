"""The probe publishes the settings of the latest DataLoader iterated (offset 120..128, flag bit 12).

What Apply checks a change by: the settings the loader runs with after the override, read from a
real torch DataLoader's iterator, which stay known between epochs when non-persistent workers are
gone (the worker processes then number 0).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dam_probe._counters import loader_settings_of
from dam_probe.bootstrap import install_into
from dam_probe.layout import FLAG_LOADER_SETTINGS, ProbeRecord, ProbeWriter, decode, encode, read_file

from .conftest import python_env, run_python, small_record


def test_the_loader_settings_round_trip_and_read_as_unknown_without_their_flag() -> None:
    base = small_record()
    _, back = decode(encode(base))
    assert back.loader_num_workers is None and back.loader_pin_memory is None  # unknown, not zero
    rec = ProbeRecord(
        **{
            **base.__dict__,
            "loader_num_workers": 6,
            "loader_prefetch_factor": 4,
            "loader_pin_memory": True,
            "loader_persistent_workers": False,
        }
    )
    image = encode(rec)
    _, back = decode(image)
    assert (
        back.loader_num_workers,
        back.loader_prefetch_factor,
        back.loader_pin_memory,
        back.loader_persistent_workers,
    ) == (6, 4, True, False)
    assert image[120:128] == bytes([6, 0, 4, 0, 2, 1, 0, 0])
    assert int.from_bytes(image[92:96], "little") & FLAG_LOADER_SETTINGS
    # No workers: torch's prefetch_factor is None, and so is what is read back; unknown switches too.
    bare = ProbeRecord(**{**base.__dict__, "loader_num_workers": 0})
    _, back = decode(encode(bare))
    assert (back.loader_num_workers, back.loader_prefetch_factor, back.loader_pin_memory) == (0, None, None)


def test_the_writer_publishes_the_settings_given(tmp_path: Path) -> None:
    writer = ProbeWriter(str(tmp_path / "probe-1.bin"), 1)
    try:
        writer.publish(3, 4, 5, loader_settings=(2, 8, False, True))
        back = read_file(str(tmp_path / "probe-1.bin"))
    finally:
        writer.close()
    assert (back.loader_num_workers, back.loader_prefetch_factor) == (2, 8)
    assert (back.loader_pin_memory, back.loader_persistent_workers) == (False, True)


def test_an_iterator_that_is_not_a_dataloaders_gives_no_settings() -> None:
    assert loader_settings_of(iter([1, 2])) is None

    class Odd:
        _num_workers = "two"

    assert loader_settings_of(Odd()) is None


TRAIN = """
import json, multiprocessing, os, sys
import torch
from torch.utils.data import DataLoader, Dataset
from dam_probe.layout import probe_files, read_file

class Samples(Dataset):
    def __len__(self):
        return 32
    def __getitem__(self, i):
        return torch.zeros(4)

if __name__ == "__main__":
    loader = DataLoader(Samples(), batch_size=4, num_workers=0)  # the user's code: no workers
    seen = []
    for epoch in range(2):
        for batch in loader:
            pass
        # Between epochs: the non-persistent workers are gone.
        (path,) = probe_files(os.environ["DAM_PROBE_DIR"])
        rec = read_file(path)
        seen.append({
            "workers_alive": len(multiprocessing.active_children()),
            "num_workers": rec.loader_num_workers,
            "prefetch_factor": rec.loader_prefetch_factor,
            "pin_memory": rec.loader_pin_memory,
            "persistent_workers": rec.loader_persistent_workers,
        })
    print(json.dumps({
        "loader": [loader.num_workers, loader.prefetch_factor, loader.persistent_workers],
        "accelerator": bool(torch.accelerator.is_available()),
        "seen": seen,
    }))
"""


@pytest.fixture(scope="module")
def site_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return install_into(str(tmp_path_factory.mktemp("site")))


def test_a_real_dataloader_publishes_its_settings_after_the_override_also_between_epochs(
    site_dir: str, tmp_path: Path
) -> None:
    probes = tmp_path / "probes"
    overrides = {"version": 1, "num_workers": 2, "prefetch_factor": 4, "pin_memory": True}
    env = python_env(
        PYTHONPATH=site_dir, DAM_PROBE_DIR=str(probes), DAM_LOADER_OVERRIDES=json.dumps(overrides)
    )
    result = run_python(TRAIN, env, timeout=180)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["loader"] == [2, 4, False], result.stderr  # the override took, as torch's loader says
    for seen in out["seen"]:
        assert seen["workers_alive"] == 0  # between epochs: no worker process left
        assert seen["num_workers"] == 2  # ... and the setting still reads as taken
        assert seen["prefetch_factor"] == 4
        assert seen["persistent_workers"] is False
        # pin_memory is whether the loader pins: the override is applied only with an accelerator.
        assert seen["pin_memory"] is out["accelerator"]
