"""A distributed job of three pods on a real control plane: the operator names the straggler pod.

Three real ``torch.distributed`` ranks (gloo, DDP, CPU) run here, one per "pod", each under the
probe with its own probe directory and its own real ``dam sidecar`` on a loopback address of its
own (127.0.0.2-4, the pod IPs reported through ``pods/status``; no kubelet). Rank 1's DataLoader
sleeps in ``__getitem__``: the other two ranks wait for it in every all-reduce. The real
``dam operator`` (a child process, admin rights, no webhook: the pods carry the sidecar already)
must write ``status.bottleneck.straggler`` naming that pod with cause Data, and post one
``StragglerDetected`` Event.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from tests.support.kubecluster import ControlPlane
from tests.support.operator_harness import (
    OperatorProcess,
    condition,
    damprofile,
    dumps,
    ensure_crds,
    events_for,
    free_port,
    operator_namespace,
    profile_of,
    start_rank,
    wait_for,
)
from tests.support.procs import stop_process

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
RANKS = 3
SLOW = 1
PROFILE = "ddp-job"

TRAIN = textwrap.dedent(
    """
    import sys, time, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, Dataset

    class Data(Dataset):
        def __init__(self, delay):
            self.delay = delay
        def __len__(self):
            return 10_000_000
        def __getitem__(self, i):
            if self.delay:
                time.sleep(self.delay)
            return torch.ones(64)

    if __name__ == "__main__":
        slow = int(sys.argv[1])
        dist.init_process_group("gloo")
        torch.set_num_threads(1)
        rank = dist.get_rank()
        model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1)))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for x in DataLoader(Data(0.004 if rank == slow else 0.0), batch_size=8, num_workers=0):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
    """
)


def _pod(name: str, rank: int, port: int) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "ddp", "rank": str(rank)}},
        "spec": {
            "containers": [
                {"name": "train", "image": "registry.example.com/train:1"},
                # Added by hand (the webhook is off here): counts as instrumented, is scraped.
                {
                    "name": "dam-sidecar",
                    "image": "ghcr.io/mlsys/dam-operator:test",
                    "ports": [{"name": "dam-metrics", "containerPort": port}],
                },
            ]
        },
    }


def test_the_operator_names_the_straggler_pod_of_a_three_pod_ddp_job(
    control_plane: ControlPlane, kube_namespace: str, tmp_path: Path
) -> None:
    cp, ns = control_plane, kube_namespace
    ensure_crds(cp)
    port, master_port = free_port(), free_port()
    procs: list[subprocess.Popen[bytes]] = []
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    with operator_namespace(cp) as system_ns:
        op = OperatorProcess(cp, tmp_path, namespace=ns, operator_namespace=system_ns, webhook=False)
        try:
            op.start()
            profile = damprofile(PROFILE, {"app": "ddp"}, port=port, hysteresis_windows=2, inject=False)
            cp.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(profile))
            for rank in range(RANKS):
                name, ip = f"trainer-{rank}", f"127.0.0.{rank + 2}"
                started = start_rank(
                    tmp_path,
                    rank=rank,
                    world_size=RANKS,
                    master_port=master_port,
                    command=[sys.executable, str(script), str(SLOW)],
                    host=ip,
                    sidecar_port=port,
                    log_name=name,
                )
                procs += [started.trainer, started.sidecar]
                cp.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(_pod(name, rank, port)))
                cp.mark_pod_running(ns, name, pod_ip=ip)

            def straggler() -> dict[str, object] | None:
                for p in procs:
                    if p.poll() is not None:
                        raise AssertionError(f"a pod process exited early (rc {p.returncode})")
                found = ((profile_of(cp, ns, PROFILE).get("status") or {}).get("bottleneck") or {}).get(
                    "straggler"
                )
                # The settled straggler of the synchronous job: the rank is known once every pod
                # has reported a window with its collectives.
                return found if isinstance(found, dict) and found.get("rank") is not None else None

            found = wait_for(straggler, 120, "status.bottleneck.straggler with its rank", interval=1.0)
            obj = profile_of(cp, ns, PROFILE)
            status = obj["status"]
            assert (found.get("pod"), found.get("rank"), found.get("cause")) == (
                f"trainer-{SLOW}",
                SLOW,
                "Data",
            ), dumps(status)
            assert status["pods"]["reporting"] == RANKS, dumps(status)
            assert status["metrics"]["rankCount"] == RANKS, dumps(status["metrics"])
            assert {r["pod"] for r in status["metrics"]["ranks"]} == {f"trainer-{i}" for i in range(RANKS)}
            diagnosed = condition(obj, "Diagnosed")
            assert diagnosed is not None and diagnosed["status"] == "True", dumps(status)
            events = wait_for(
                lambda: events_for(cp, ns, PROFILE, "StragglerDetected"), 20, "a StragglerDetected Event"
            )
            assert any(f"pod trainer-{SLOW} (rank {SLOW})" in e["message"] for e in events), events
            op.assert_alive()
        except AssertionError:
            for log in sorted(tmp_path.glob("trainer-*.log")):
                print(f"--- {log.name}\n{log.read_text(errors='replace')[-2000:]}")
            print(op.log())
            raise
        finally:
            for p in reversed(procs):
                stop_process(p)
            op.close()
