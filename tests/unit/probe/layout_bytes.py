"""The byte-identity records: one per layout version and flag group, all fields set.

``python tests/unit/probe/layout_bytes.py`` (with main's PYTHONPATH) wrote
``fixtures/layout_bytes.json`` from the layout code before the field table; the
test packs the same records with today's code and compares byte for byte.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

from dam_probe.layout import ProbeRecord, encode

FIXTURE = Path(__file__).parent / "fixtures" / "layout_bytes.json"

BASE = ProbeRecord(
    pid=4321,
    start_time_ns=1_700_000_000_000_000_123,
    steps=77,
    wait_ns=2_000_003,
    step_ns=9_000_005,
    last_update_ns=1_700_000_001_000_000_007,
    batch_size=32,
    flops_per_step=1.5e12,
    closed=True,
    device_uuids=("GPU-11111111-2222-3333-4444-555555555555", "GPU-aaaa"),
)
GROUPS: dict[str, dict[str, object]] = {
    "cgroup": {"cgroup_throttled_ns": 11, "cgroup_limit_millicores": 2500, "cgroup_id": 987},
    "ranks": {"rank": 3, "local_rank": 1, "world_size": 8},
    "collectives": {
        "collectives": 5,
        "collective_ns": 600,
        "collective_exposed_ns": 70,
        "collective_bytes": 8000,
    },
    "memory": {
        "memory_usage_bytes": 1 << 30,
        "memory_limit_bytes": 1 << 32,
        "oom_kills": 2,
        "memory_cgroup_id": 55,
    },
    "process": {
        "process_cpu_ns": 100,
        "worker_cpu_ns": 200,
        "process_rss_bytes": 300,
        "worker_rss_bytes": 400,
        "workers": 4,
        "pid_namespace": 4026531836,
    },
    "loader_kills": {"loader_worker_kills": 2, "loader_kill_signal": 9},
    "run_queue": {"run_queue_ns": 123, "worker_run_queue_ns": 456},
    "goodput": {
        "process_start_ns": 1_699_999_999_000_000_000,
        "startup_ns": 5,
        "productive_ns": 6,
        "other_ns": 7,
        "flops_state": 1,
    },
    "checkpoints": {
        "checkpoint_ns": 10,
        "checkpoint_step_ns": 4,
        "checkpoints": 2,
        "last_checkpoint_ns": 1_700_000_000_500_000_000,
        "last_checkpoint_steps": 40,
    },
    "measured_flops": {
        "measured_flops_per_step": 3.25e12,
        "flops_measured_ns": 1234,
        "flops_measured_steps": 1,
    },
    "flops_reason": {"flops_reason": 6, "flops_detail": "cond HigherOrderOperator"},
    "progress": {
        "collectives_entered": 12,
        "last_batch_ns": 1_700_000_000_900_000_000,
        "place_read_ns": 1_700_000_001_000_000_000,
        "place": 1,
        "place_detail": "all_reduce #12",
        "place_frames": "train.py:10 step\nmodel.py:20 forward",
    },
    "loader_settings": {
        "loader_num_workers": 4,
        "loader_prefetch_factor": 2,
        "loader_pin_memory": True,
        "loader_persistent_workers": False,
    },
    "matmul_precision": {"matmul_precision": 4},
}
V1_GROUPS = ("cgroup",)  # the only flag group a version-1 file carries


def records() -> dict[str, ProbeRecord]:
    """Every case: each layout version bare, with each flag group alone, and with all of them."""
    out = {"v1": replace(BASE, version=1), "v2": BASE}
    for name, fields in GROUPS.items():
        out[f"v2+{name}"] = replace(BASE, **fields)  # type: ignore[arg-type]
        if name in V1_GROUPS:
            out[f"v1+{name}"] = replace(BASE, version=1, **fields)  # type: ignore[arg-type]
    everything: dict[str, object] = {k: v for fields in GROUPS.values() for k, v in fields.items()}
    out["v2+all"] = replace(BASE, **everything)  # type: ignore[arg-type]
    out["v2+all+open"] = replace(BASE, closed=False, **everything)  # type: ignore[arg-type]
    out["v2+unknown-ranks"] = replace(BASE, rank=None, local_rank=2, world_size=None)
    return out


if __name__ == "__main__":
    images = {name: encode(record, 6).hex() for name, record in records().items()}
    FIXTURE.write_text(json.dumps(images, indent=1, sort_keys=True) + "\n")
    sys.stdout.write(f"{len(images)} images -> {FIXTURE}\n")
