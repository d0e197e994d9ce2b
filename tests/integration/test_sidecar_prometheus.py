"""A real Prometheus scrapes a live ``dam sidecar`` while real PyTorch training runs under the probe.

The training loop is input-starved on purpose (the DataLoader worker sleeps per
batch), so the data wait ratio that PromQL computes from the sidecar's counters
must be high. The training script uses ``dam_probe.instrument`` explicitly.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import BinaryIO

import httpx
import pytest

from dam_contract import names as n
from tests.support.procs import free_port, spawn, stop_process

pytestmark = pytest.mark.slow

TRAIN = textwrap.dedent(
    """
    import sys, time
    import torch
    from torch.utils.data import DataLoader, Dataset
    import dam_probe

    class Slow(Dataset):
        def __len__(self):
            return 100000
        def __getitem__(self, i):
            time.sleep(0.004)  # an expensive decode: 8 items -> ~32 ms per batch
            return torch.randn(64), torch.randint(0, 4, ()).item()

    model = torch.nn.Linear(64, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Slow(), batch_size=8, num_workers=1)
    deadline = time.monotonic() + float(sys.argv[1])
    print("training", flush=True)
    for x, y in dam_probe.instrument(loader):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        if time.monotonic() > deadline:
            break
    """
)


def query(client: httpx.Client, base: str, promql: str) -> list[dict[str, object]]:
    r = client.get(f"{base}/api/v1/query", params={"query": promql})
    r.raise_for_status()
    body = r.json()
    assert body["status"] == "success", body
    result: list[dict[str, object]] = body["data"]["result"]
    return result


def test_prometheus_computes_a_high_data_wait_ratio_for_a_starved_training_loop(tmp_path: Path) -> None:
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.skip("prometheus not installed (Debian package 'prometheus')")
    probe_dir = tmp_path / "probe"
    probe_dir.mkdir()
    (tmp_path / "train.py").write_text(TRAIN)
    env = {**os.environ, "DAM_PROBE_DIR": str(probe_dir), "DAM_FAKE_GPUS": "0", "OMP_NUM_THREADS": "1"}
    with contextlib.ExitStack() as stack:
        logs = {
            name: stack.enter_context(open(tmp_path / f"{name}.log", "wb"))
            for name in ("sidecar", "prometheus", "train")
        }
        run_all(tmp_path, env, logs, prometheus)
    assert re.search(r"stopped", (tmp_path / "sidecar.log").read_text())


def run_all(tmp_path: Path, env: dict[str, str], logs: dict[str, BinaryIO], prometheus: str) -> None:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        sidecar_port = free_port()
        procs.append(
            spawn(
                [sys.executable, "-m", "dam_sidecar.app", "--host", "127.0.0.1", "--port", str(sidecar_port)],
                env=env,
                stdout=logs["sidecar"],
                stderr=subprocess.STDOUT,
                cwd=tmp_path,
            )
        )
        procs.append(
            spawn(
                [sys.executable, str(tmp_path / "train.py"), "30"],
                env=env,
                stdout=logs["train"],
                stderr=subprocess.STDOUT,
                cwd=tmp_path,
            )
        )
        prom_port = free_port()
        (tmp_path / "prometheus.yml").write_text(
            textwrap.dedent(
                f"""
                global:
                  scrape_interval: 1s
                  evaluation_interval: 1s
                scrape_configs:
                  - job_name: dam
                    static_configs:
                      - targets: ["127.0.0.1:{sidecar_port}"]
                """
            )
        )
        procs.append(
            spawn(
                [
                    prometheus,
                    f"--config.file={tmp_path / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                ],
                stdout=logs["prometheus"],
                stderr=subprocess.STDOUT,
                cwd=tmp_path,
            )
        )
        base = f"http://127.0.0.1:{prom_port}"
        ratio_q = f"rate({n.DATALOADER_WAIT_SECONDS_TOTAL}[8s]) / rate({n.STEP_SECONDS_TOTAL}[8s])"
        ratio: float | None = None
        deadline = time.monotonic() + 60
        with httpx.Client(timeout=5) as client:
            while time.monotonic() < deadline:
                time.sleep(1.0)
                for p in procs:
                    assert p.poll() is None or p is procs[1], f"{p.args[0]} exited early"
                try:
                    result = query(client, base, ratio_q)
                except httpx.HTTPError:
                    continue  # Prometheus still starting
                steps = query(client, base, f"increase({n.STEPS_TOTAL}[8s])")
                if result and steps and float(steps[0]["value"][1]) > 20:  # type: ignore[index]
                    value = float(result[0]["value"][1])  # type: ignore[index]
                    if not math.isnan(value):
                        ratio = value
                        break
            assert ratio is not None, (
                "no data wait ratio from Prometheus:\n" + (tmp_path / "sidecar.log").read_text()
            )
            up = query(client, base, f"{n.PROBE_UP}")
            main_cpu = query(client, base, f'{n.PROCESS_CPU_SECONDS_TOTAL}{{role="main"}}')
            nvml = query(client, base, n.NVML_UP)
        print(f"data wait ratio from PromQL: {ratio:.3f}")
        assert 0.5 < ratio <= 1.0, f"starved loop should wait most of the step, got {ratio:.3f}"
        assert float(up[0]["value"][1]) == 1.0  # type: ignore[index]
        assert main_cpu and float(main_cpu[0]["value"][1]) > 0  # type: ignore[index]
        assert float(nvml[0]["value"][1]) == 0.0  # type: ignore[index]  # no GPU here, reported not hidden
    finally:
        for p in reversed(procs):
            stop_process(p)
