"""DataLoader overrides with real PyTorch under the automatic instrumentation (a child Python each)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from dam_probe.overrides import ENV_LOADER_OVERRIDES, loader_override_env

REPO = Path(__file__).resolve().parents[2]
SITE = os.pathsep.join([str(REPO / "sidecar" / "dam_probe" / "autoinstrument"), str(REPO / "sidecar")])

TRAIN = textwrap.dedent(
    """
    import json, multiprocessing, os, time
    import torch
    from torch.utils.data import DataLoader, Dataset, IterableDataset

    class Starved(Dataset):
        def __len__(self):
            return 48
        def __getitem__(self, i):
            time.sleep(0.004)
            return torch.tensor([i])

    class Stream(IterableDataset):
        def __iter__(self):
            return (torch.tensor([i]) for i in range(48))

    def flat(batch):
        return torch.cat(batch)

    def make(kind):
        if kind == "map":
            return DataLoader(Starved(), batch_size=4, shuffle=True)  # LINE map
        if kind == "sequential":
            return DataLoader(Starved(), batch_size=4)  # LINE sequential
        if kind == "iterable":
            return DataLoader(Stream(), batch_size=4)  # LINE iterable
        if kind == "spawn-lambda":
            return DataLoader(Starved(), batch_size=4, collate_fn=lambda b: torch.cat(b))  # LINE spawn-lambda
        return DataLoader(Starved(), batch_size=4, shuffle=True, collate_fn=flat)  # LINE spawn-flat

    def main():
        kind = os.environ["KIND"]
        if kind.startswith("spawn"):
            multiprocessing.set_start_method("spawn")
        torch.manual_seed(0)
        loader = make(kind)
        seen = []
        for epoch in range(int(os.environ.get("EPOCHS", "2"))):
            for batch in loader:
                seen.extend(int(v) for v in batch.flatten())
        from dam_probe import PROBE
        print(json.dumps({
            "seen": seen,
            "num_workers": loader.num_workers,
            "prefetch_factor": loader.prefetch_factor,
            "persistent_workers": loader.persistent_workers,
            "steps": PROBE.step.steps,
            # What the probe publishes (dam_dataloader_*): workers, prefetch, pins, persistent.
            "published": PROBE.loader.figures,
        }))

    if __name__ == "__main__":
        main()
    """
)
LINE = {line.split("# LINE ")[1]: i for i, line in enumerate(TRAIN.splitlines(), 1) if "# LINE " in line}
PYTORCH = pytest.importorskip("torch", reason="needs PyTorch (make setup)")


def train(tmp_path: Path, kind: str, **env: str) -> tuple[dict[str, Any], list[str]]:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    base = {k: v for k, v in os.environ.items() if not k.startswith("DAM_") and k != "PYTHONPATH"}
    base.update(PYTHONPATH=SITE, DAM_PROBE_DIR=str(tmp_path / "probes"), KIND=kind, **env)
    proc = subprocess.run(
        [sys.executable, str(script)],
        env=base,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    return json.loads(proc.stdout), lines


OVERRIDE = loader_override_env({"num_workers": 2, "prefetch_factor": 4, "persistent_workers": True})


def cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


SINGLE_CPU = pytest.mark.skipif(cpus() < 2, reason="workers are refused with a single CPU")


@SINGLE_CPU
def test_a_starved_map_dataset_gets_workers_and_keeps_its_shuffled_order(tmp_path: Path) -> None:
    before, quiet = train(tmp_path, "map")
    after, said = train(tmp_path, "map", **OVERRIDE)
    assert quiet == []
    assert (before["num_workers"], before["prefetch_factor"]) == (0, None)
    assert (after["num_workers"], after["prefetch_factor"], after["persistent_workers"]) == (2, 4, False)
    assert before["published"] == [0, None, False, False]
    assert after["published"] == [2, 4, False, False]  # what Apply reads as taken
    # The same shuffled indices in the same order, both epochs; every batch still measured.
    assert sorted(before["seen"][:48]) == list(range(48))
    assert before["seen"][:48] != before["seen"][48:]  # each epoch has its own shuffle
    assert after["seen"] == before["seen"]
    assert after["steps"] == before["steps"] == 24
    assert said == [
        f"dam-probe: DataLoader at train.py:{LINE['map']}: num_workers 0 → 2, prefetch_factor None → 4; "
        "persistent_workers not applied: the loader shuffles, and persistent workers would change "
        "the order of later epochs (torch draws one seed fewer per epoch)"
    ]


@SINGLE_CPU
def test_a_sequential_loader_also_gets_persistent_workers_and_keeps_its_order(tmp_path: Path) -> None:
    got, said = train(tmp_path, "sequential", **OVERRIDE)
    assert (got["num_workers"], got["prefetch_factor"], got["persistent_workers"]) == (2, 4, True)
    assert got["published"] == [2, 4, False, True]
    assert got["seen"] == list(range(48)) * 2
    assert said == [
        f"dam-probe: DataLoader at train.py:{LINE['sequential']}: "
        "num_workers 0 → 2, prefetch_factor None → 4, persistent_workers False → True"
    ]


def test_an_iterable_dataset_is_left_alone_with_the_reason(tmp_path: Path) -> None:
    got, said = train(tmp_path, "iterable", **OVERRIDE)
    assert (got["num_workers"], got["prefetch_factor"]) == (0, None)
    assert got["seen"] == list(range(48)) * 2  # no worker replays the stream
    assert len(said) == 1
    assert said[0].startswith(
        f"dam-probe: DataLoader at train.py:{LINE['iterable']}: "
        "overrides not applied: IterableDataset with num_workers=0"
    )


def test_a_lambda_collate_fn_under_spawn_is_left_alone_with_the_reason(tmp_path: Path) -> None:
    got, said = train(tmp_path, "spawn-lambda", **OVERRIDE)
    assert got["num_workers"] == 0
    assert got["seen"] == list(range(48)) * 2
    assert len(said) == 1
    assert said[0].startswith(
        f"dam-probe: DataLoader at train.py:{LINE['spawn-lambda']}: overrides not applied: "
        "collate_fn is not picklable, which spawn workers need: "
    )


@SINGLE_CPU
def test_a_picklable_loader_under_spawn_gets_workers_and_keeps_its_order(tmp_path: Path) -> None:
    # One epoch: each spawned worker imports torch afresh, which takes seconds.
    before, _ = train(tmp_path, "spawn-flat", EPOCHS="1")
    after, said = train(tmp_path, "spawn-flat", EPOCHS="1", **loader_override_env({"num_workers": 1}))
    assert after["num_workers"] == 1
    assert after["seen"] == before["seen"]
    assert said == [f"dam-probe: DataLoader at train.py:{LINE['spawn-flat']}: num_workers 0 → 1"]


def test_a_garbage_variable_is_ignored_with_one_warning_and_training_finishes(tmp_path: Path) -> None:
    got, said = train(tmp_path, "map", **{ENV_LOADER_OVERRIDES: "num_workers=4"})
    assert got["num_workers"] == 0
    assert sorted(got["seen"]) == sorted(list(range(48)) * 2)
    assert got["steps"] == 24
    assert said == [
        "dam-probe: ignoring DAM_LOADER_OVERRIDES: not valid JSON: Expecting value: line 1 column 1 (char 0)"
    ]
