"""The precision of the counted step's matmuls: the dtype the most FLOPs ran in, seen by the
probe's FLOP counter on a real step (torch on CPU), and its place in the probe file."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import dam_probe
from dam_contract import names as n
from dam_probe._core import Probe
from dam_probe._goodput import dominant_precision
from dam_probe.layout import (
    FLAG_PRECISION,
    FLOPS_MEASURED,
    PRECISION_BF16,
    PRECISION_FP16,
    PRECISION_FP32,
    PRECISION_FP64,
    PRECISION_NAMES,
    PRECISION_TF32,
    PRECISION_UNKNOWN,
    ProbeRecord,
    decode,
    encode,
    probe_files,
    probe_path,
    read_file,
)
from dam_sidecar.collector import build_collector
from dam_sidecar.settings import SidecarSettings

torch = pytest.importorskip("torch")

BATCH, IN, HIDDEN, OUT = 16, 32, 64, 8


@pytest.fixture
def fast_probe(probe: Probe) -> Probe:
    probe.interval_ns = 0  # every batch takes the slow path: the count starts right after warm-up
    return probe


def _train(
    steps: int,
    *,
    dtype: Any = None,
    autocast: Callable[[], Any] = contextlib.nullcontext,
    device: str = "cpu",
) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, OUT))
    model = model.to(device=device, dtype=dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [
        (
            torch.randn(BATCH, IN, device=device, dtype=dtype),
            torch.randn(BATCH, OUT, device=device, dtype=dtype),
        )
        for _ in range(steps)
    ]
    for x, y in dam_probe.instrument(data):
        with autocast():
            loss = ((model(x) - y) ** 2).float().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def _published(p: Probe) -> ProbeRecord:
    p.close()
    (path,) = probe_files(p.directory)
    return read_file(path)


def test_an_fp32_step_on_cpu_reads_fp32(fast_probe: Probe) -> None:
    _train(30)
    f = fast_probe.goodput.flops
    assert f.state == FLOPS_MEASURED and f.precision == PRECISION_FP32
    assert _published(fast_probe).matmul_precision == PRECISION_FP32


def test_a_bf16_autocast_step_on_cpu_reads_bf16(fast_probe: Probe) -> None:
    # The model and the data stay fp32: autocast casts the matmuls' inputs before the counter sees them.
    _train(30, autocast=lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    assert fast_probe.goodput.flops.precision == PRECISION_BF16
    assert _published(fast_probe).matmul_precision == PRECISION_BF16


def test_an_fp64_model_reads_fp64(fast_probe: Probe) -> None:
    _train(30, dtype=torch.float64)
    assert fast_probe.goodput.flops.precision == PRECISION_FP64


def test_tf32_is_off_on_the_cpu_whatever_the_setting(fast_probe: Probe) -> None:
    # TF32 is a CUDA tensor-core format: the CPU's fp32 matmuls stay fp32 with "high" set.
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        _train(30)
    finally:
        torch.set_float32_matmul_precision(before)
    assert fast_probe.goodput.flops.precision == PRECISION_FP32


@pytest.mark.gpu
@pytest.mark.parametrize(("setting", "expected"), [("highest", PRECISION_FP32), ("high", PRECISION_TF32)])
def test_fp32_on_cuda_reads_tf32_when_tf32_is_allowed(fast_probe: Probe, setting: str, expected: int) -> None:
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(setting)
    try:
        _train(30, device="cuda")
    finally:
        torch.set_float32_matmul_precision(before)
    assert fast_probe.goodput.flops.precision == expected


@pytest.mark.gpu
def test_an_fp16_autocast_step_on_cuda_reads_fp16(fast_probe: Probe) -> None:
    _train(30, device="cuda", autocast=lambda: torch.autocast("cuda", dtype=torch.float16))
    assert fast_probe.goodput.flops.precision == PRECISION_FP16


def test_the_precision_of_the_most_flops_wins() -> None:
    assert dominant_precision({PRECISION_FP32: 10, PRECISION_BF16: 90}) == PRECISION_BF16
    assert dominant_precision({PRECISION_FP32: 90, PRECISION_BF16: 10}) == PRECISION_FP32
    # FLOPs of no known dtype (an integer matmul) say nothing; none at all: unknown.
    assert dominant_precision({PRECISION_UNKNOWN: 100, PRECISION_FP16: 1}) is None
    assert dominant_precision({}) is None


def _record(**fields: Any) -> ProbeRecord:
    base: dict[str, Any] = {
        "pid": 7,
        "start_time_ns": 1,
        "steps": 3,
        "wait_ns": 0,
        "step_ns": 10,
        "last_update_ns": 2,
        "batch_size": 0,
        "flops_per_step": 0.0,
        "closed": False,
    }
    return ProbeRecord(**{**base, **fields})


def test_the_precision_round_trips_through_the_file_at_offset_524() -> None:
    image = encode(_record(matmul_precision=PRECISION_BF16))
    assert int.from_bytes(image[524:528], "little") == PRECISION_BF16
    assert int.from_bytes(image[92:96], "little") & FLAG_PRECISION
    assert decode(image)[1].matmul_precision == PRECISION_BF16


def test_a_file_without_the_flag_reads_precision_none() -> None:
    # A version-2 writer from before the field: offset 524 reserved zero, flag bit 13 clear.
    image = encode(_record())
    assert not int.from_bytes(image[92:96], "little") & FLAG_PRECISION
    assert decode(image)[1].matmul_precision is None
    # Bytes at 524 without the flag are not read either.
    patched = bytearray(image)
    patched[524:528] = PRECISION_FP16.to_bytes(4, "little")
    assert decode(bytes(patched))[1].matmul_precision is None


def test_an_unknown_code_reads_unknown_not_a_precision() -> None:
    patched = bytearray(encode(_record(matmul_precision=PRECISION_BF16)))
    patched[524:528] = (99).to_bytes(4, "little")
    assert decode(bytes(patched))[1].matmul_precision == PRECISION_UNKNOWN


# --- the sidecar's export ------------------------------------------------------------------------


def test_the_contract_names_each_probe_code() -> None:
    assert {code: n.PRECISIONS[code - 1] for code in PRECISION_NAMES} == PRECISION_NAMES


def test_the_sidecar_exports_a_real_probe_s_precision_beside_its_flops(fast_probe: Probe) -> None:
    _train(30, autocast=lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    fast_probe.publish(time.perf_counter_ns())  # live: a closed file is folded in on its first read
    collector = build_collector(SidecarSettings(probe_dir=fast_probe.directory, port=0), use_nvml=False)
    try:
        collector.sample_now()
        snap = collector.snapshot()
    finally:
        collector.close()
    (sample,) = snap.samples(n.MODEL_FLOPS_PRECISION)
    assert sample.label(n.PRECISION_LABEL) == "bf16" and sample.value == 1.0
    (flops,) = snap.samples(n.MODEL_FLOPS_PER_STEP)
    assert flops.label(n.SOURCE_LABEL) == "measured"


def test_no_precision_series_without_a_known_precision(tmp_path: Path) -> None:
    directory = str(tmp_path)
    with open(probe_path(directory, os.getpid()), "wb") as fh:
        fh.write(encode(_record(pid=os.getpid(), flops_per_step=4e9)))  # declared: nothing counted
    collector = build_collector(SidecarSettings(probe_dir=directory, port=0), use_nvml=False)
    try:
        collector.sample_now()
        snap = collector.snapshot()
    finally:
        collector.close()
    assert snap.samples(n.MODEL_FLOPS_PER_STEP) and not snap.samples(n.MODEL_FLOPS_PRECISION)
