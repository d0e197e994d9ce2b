"""The engine's verdicts on a recorded corpus of windows do not change unless a change means to.

``golden/verdicts.jsonl.gz`` holds windows (the job's observation, per-rank observations,
thresholds and hardware overrides, drawn once from a fixed seed to cross every rule's screens
and their neighbours) with the verdict the engine gave each, as its status (``to_status``):
regime, lever, confidence, boundary, every evidence sentence, ``avoid``, ``missing``, the
straggler and ``status.metrics``. A refactoring of the engine (the rules' layout, the regime
table, the referee) must leave every one of them equal. After a deliberate change of the
verdicts, record the corpus again with
``DAM_UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/diagnosis/test_verdict_corpus.py``
and read the diff of the verdicts that moved.
"""

from __future__ import annotations

import gzip
import json
import os
import random
from pathlib import Path
from typing import Any

from dam_operator.diagnosis.engine import diagnose
from dam_operator.diagnosis.model import Hardware, Observation, RankId, Thresholds

CORPUS = Path(__file__).parent / "golden" / "verdicts.jsonl.gz"
CASES = 3000
SEED = 27

SHARES = [0.0, 0.004, 0.02, 0.05, 0.09, 0.1, 0.11, 0.14, 0.19, 0.2, 0.22, 0.3, 0.45, 0.6, 0.79, 0.8, 0.9]
SHARES.append(0.96)
"""Shares of the step or the window, thick around the screens (0.1, 0.2, 0.8, 0.95 ...)."""
HIGH = [0.5, 0.7, 0.75, 0.8, 0.85, 0.9, 0.94, 0.95, 0.96, 0.99, 1.0]
GIB = float(1 << 30)

FIELDS: dict[str, tuple[float, list[Any]]] = {
    # name: (probability it is set, its values)
    "data_wait_ratio": (0.8, SHARES),
    "gpu_utilization": (0.7, [*SHARES, *HIGH]),
    "gpu_memory_busy": (0.3, SHARES),
    "sm_active": (0.5, [*SHARES, *HIGH]),
    "sm_occupancy": (0.2, SHARES),
    "tensor_active": (0.4, SHARES),
    "dram_bandwidth_utilization": (0.4, [*SHARES, *HIGH]),
    "gpu_count": (0.6, [0, 1, 1, 2, 8]),
    "main_cpu_cores": (0.7, [0.05, 0.3, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0, 1.4, 2.0, 3.5]),
    "worker_cpu_cores": (0.5, [0.1, 0.5, 1.0, 2.0, 3.8, 7.5]),
    "worker_count": (0.6, [0, 0, 1, 2, 4, 8]),
    "loader_num_workers": (0.3, [0, 1, 2, 4, 8]),
    "loader_prefetch_factor": (0.2, [2, 4]),
    "loader_pin_memory": (0.2, [True, False]),
    "cpu_wait_ratio": (0.4, [0.0, 0.05, 0.19, 0.2, 0.25, 0.4, 0.6, 1.0]),
    "worker_cpu_wait_ratio": (0.3, [0.0, 0.1, 0.2, 0.3, 0.5]),
    "cpu_throttled_ratio": (0.3, [0.0, 0.05, 0.1, 0.11, 0.3]),
    "cpu_limit_cores": (0.4, [1.0, 2.0, 4.0, 8.0]),
    "node_cpu_utilization": (0.4, [0.2, 0.5, 0.85, 0.9, 0.95, 1.0]),
    "batch_size": (0.4, [1, 1, 8, 64, 256]),
    "flops_per_step": (0.4, [1e9, 1e12, 5e13, 4e14]),
    "bytes_per_step": (0.3, [1e8, 1e10, 1e12]),
    "gpu_model": (0.4, ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB", "Tesla T4", "nonsense"]),
    "matmul_precision": (0.2, ["bf16", "fp32", "tf32"]),
    "checkpoint_seconds": (0.3, [0.5, 3.0, 6.0, 12.0, 30.0]),
    "checkpoint_ratio": (0.4, [0.0, 0.05, 0.1, 0.11, 0.15, 0.2, 0.35, 0.6]),
    "checkpoints": (0.3, [1, 2, 6, 20, 80]),
    "ranks": (0.4, [1, 2, 4, 8]),
    "collective_seconds": (0.3, [0.5, 5.0, 20.0]),
    "collective_exposed_seconds": (0.3, [0.2, 2.0, 10.0]),
    "collectives": (0.3, [100.0, 5000.0]),
    "collective_bytes": (0.2, [1e8, 1e11]),
    "collective_ratio": (0.35, [0.05, 0.15, 0.3, 0.6, 1.2]),
    "exposed_communication_ratio": (0.45, SHARES),
    "collective_skew": (0.3, [0.0, 0.05, 0.12, 0.3]),
    "nvlink_bytes_per_second": (0.2, [0.0, 5e9, 1e11]),
    "pcie_bytes_per_second": (0.2, [0.0, 1e9, 2e10]),
    "gpu_memory_used_ratio": (0.25, [0.3, 0.6, 0.9, 0.95, 0.96, 0.995]),
    "container_memory_ratio": (0.4, [0.3, 0.7, 0.94, 0.95, 0.99]),
    "container_memory_limit_bytes": (0.4, [4 * GIB, 16 * GIB]),
    "oom_kills": (0.08, [0, 1, 3]),
    "loader_worker_kills": (0.06, [0, 1, 2]),
    "oom_killed": (0.06, [True, False]),
    "oom_exit_code": (0.08, [137, 1, 9]),
    "starting": (0.3, [True, False]),
    "main_rss_bytes": (0.4, [0.5 * GIB, 3 * GIB, 12 * GIB]),
    "worker_rss_bytes": (0.4, [0.2 * GIB, 4 * GIB, 14 * GIB]),
    "sm_clock_hertz": (0.2, [1.2e9, 1.98e9]),
    "gpu_slowdown_reasons": (0.1, [("hw_thermal_slowdown",), ("gpu_idle",)]),
    "flops_unavailable": (0.05, ["no torch"]),
}
THRESHOLD_FIELDS = {
    "data_wait_suspect": [0.05, 0.2],
    "gpu_util_starved": [0.6, 0.9],
    "communication_suspect": [0.05, 0.2],
    "checkpoint_suspect": [0.05, 0.3],
    "cpu_wait_suspect": [0.1, 0.4],
    "min_steps": [1, 20],
    "main_cpu_saturated_cores": [0.5, 1.5],
    "gpu_memory_full": [0.9, 0.99],
    "straggler_skew": [0.05, 0.3],
}


def _timing(rng: random.Random) -> dict[str, Any]:
    """The window's size and rate, consistent with each other (or partly unknown)."""
    window = rng.choice([30.0, 60.0])
    steps = rng.choice([0, 1, 2, 3, 5, 20, 120, 600, 6000])
    step_s = rng.choice([0.005, 0.05, 0.2, 0.45, 1.0, 4.0])
    out: dict[str, Any] = {"window_seconds": window, "steps": float(steps)}
    if steps and rng.random() < 0.9:
        out["mean_step_seconds"] = min(step_s, window / steps)
    if rng.random() < 0.9:
        out["steps_per_second"] = steps / window
    if rng.random() < 0.2:
        out["job_steps"] = float(max(0, steps // 2))
    if rng.random() < 0.05:
        return {}
    return out


def _rank(rng: random.Random, base: dict[str, Any], rank: int) -> dict[str, Any]:
    steps = base.get("steps", 100.0) or 100.0
    window = base.get("window_seconds", 60.0)
    out: dict[str, Any] = {
        "window_seconds": window,
        "steps": steps if rng.random() < 0.8 else steps * rng.choice([0.5, 0.9]),
        "mean_step_seconds": window / steps if steps else None,
        "ranks": 1,
        "data_wait_ratio": rng.choice(SHARES),
        "collective_seconds": rng.choice([1.0, 5.0, 20.0, 40.0]),
        "collective_exposed_seconds": rng.choice([0.5, 2.0, 10.0]),
    }
    out["steps_per_second"] = out["steps"] / window
    for name, values in (
        ("checkpoint_seconds", [0.0, 5.0, 20.0]),
        ("checkpoints", [0.0, 2.0, 10.0]),
        ("gpu_utilization", [0.3, 0.9, 0.99]),
        ("cpu_throttled_ratio", [0.0, 0.3]),
        ("cpu_wait_ratio", [0.0, 0.4]),
        ("sm_clock_hertz", [1.2e9, 1.98e9]),
        ("node_cpu_utilization", [0.3, 0.98]),
    ):
        if rng.random() < 0.35:
            out[name] = rng.choice(values)
    if rng.random() < 0.1:
        out["gpu_slowdown_reasons"] = ["hw_thermal_slowdown"]
    return out


def _case(rng: random.Random) -> dict[str, Any]:
    obs = _timing(rng)
    for name, (p, values) in FIELDS.items():
        if rng.random() < p:
            obs[name] = rng.choice(values)
    Observation.model_validate(obs)
    case: dict[str, Any] = {"obs": obs}
    if rng.random() < 0.3:
        n = rng.choice([1, 2, 3, 4])
        pods = ["", "p-0", "p-1"]
        ranks = []
        for r in range(n):
            pod = rng.choice(pods) if rng.random() < 0.5 else f"p-{r}"
            rank = None if rng.random() < 0.1 else r
            ranks.append({"pod": pod, "rank": rank, "obs": _rank(rng, obs, r)})
        if len({(x["pod"], x["rank"]) for x in ranks}) == len(ranks):
            case["ranks"] = ranks
    if rng.random() < 0.2:
        picked = rng.sample(sorted(THRESHOLD_FIELDS), rng.choice([1, 2, 3]))
        case["thresholds"] = {k: rng.choice(THRESHOLD_FIELDS[k]) for k in picked}
    if rng.random() < 0.2:
        case["hardware"] = rng.choice(
            [
                {"peak_flops": 1e14, "memory_bandwidth_bytes_per_second": 1e12},
                {"gpu_model": "NVIDIA H100 80GB HBM3"},
                {"peak_flops": 3e14},
            ]
        )
    return case


def _verdict(case: dict[str, Any]) -> dict[str, Any]:
    obs = Observation.model_validate(case["obs"])
    ranks = None
    if "ranks" in case:
        ranks = {RankId(r["pod"], r["rank"]): Observation.model_validate(r["obs"]) for r in case["ranks"]}
    t = Thresholds.model_validate(case["thresholds"]) if "thresholds" in case else None
    hw = Hardware.model_validate(case["hardware"]) if "hardware" in case else None
    return diagnose(obs, t, hw, ranks=ranks).to_status()


def _record() -> None:
    rng = random.Random(SEED)
    lines = []
    for _ in range(CASES):
        case = _case(rng)
        case["verdict"] = _verdict(case)
        lines.append(json.dumps(case, sort_keys=True, ensure_ascii=False))
    CORPUS.parent.mkdir(exist_ok=True)
    with gzip.GzipFile(CORPUS, "wb", mtime=0) as f:
        f.write(("\n".join(lines) + "\n").encode())


def _load() -> list[dict[str, Any]]:
    with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_every_recorded_window_gets_the_recorded_verdict() -> None:
    if os.environ.get("DAM_UPDATE_GOLDEN"):
        _record()
    cases = _load()
    moved = [(i, c["verdict"], got) for i, c in enumerate(cases) if (got := _verdict(c)) != c["verdict"]]
    assert not moved, f"{len(moved)} of {len(cases)} verdicts moved; the first: {moved[0]}"


def test_the_corpus_crosses_every_regime_and_the_straggler() -> None:
    """The corpus is worth its name: every regime, both sides of the straggler, the aside."""
    cases = _load()
    regimes = {c["verdict"]["bottleneck"]["regime"] for c in cases}
    assert regimes == {
        "input-bound",
        "memory-bound",
        "compute-bound",
        "latency-bound",
        "communication-bound",
        "memory-capacity",
        "checkpoint-bound",
        "unknown",
    }
    assert any("straggler" in c["verdict"]["bottleneck"] for c in cases)
    evidence = [s for c in cases for s in c["verdict"]["bottleneck"]["evidence"]]
    assert any(s.startswith("apart from memory the window reads as") for s in evidence)
    assert any("a suspect, not the bottleneck" in s for s in evidence)
