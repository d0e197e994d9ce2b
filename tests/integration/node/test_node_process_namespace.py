"""What the sidecar sees with and without a shared process namespace, on a real node (issue 25).

The webhook no longer shares the Pod's process namespace unless the profile asks for it
(``spec.sidecar.shareProcessNamespace``) where the chart allows it. The package fixture
``scenarios`` runs the same Job (examples/train.py, a DataLoader with two workers) in two
namespaces: "unshared" (a profile that does not ask: the default) and "shared" (a profile that
asks; the node tier's chart allows it). This test reads both Pods as the API server stored them,
what each sidecar's PID namespace shows (``kubectl exec`` into the sidecar: the processes it could
read in ``/proc``) and the process series each sidecar exports, and prints the figures that
docs/security.md quotes.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from dam_contract import names
from tests.support.node_jobs import SIDECAR_CONTAINER, dump, pods_of, scrape_sidecar
from tests.support.procs import wait_for

from .conftest import Launched

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PROCESS_SERIES = (
    names.PROCESS_CPU_SECONDS_TOTAL,
    names.PROCESS_CPU_WAIT_SECONDS_TOTAL,
    names.PROCESS_RESIDENT_MEMORY_BYTES,
    names.PROCESSES,
)
# Counts the processes the sidecar's /proc shows (but this one), and how many of them run the
# training script (the trainer and its workers).
VISIBLE = (
    "import os\n"
    "pids = [p for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid()]\n"
    "def cmd(p):\n"
    "    try:\n"
    "        return open(f'/proc/{p}/cmdline', 'rb').read().replace(b'\\0', b' ').decode()\n"
    "    except OSError:\n"
    "        return ''\n"
    "print(len(pids), sum('train.py' in cmd(p) for p in pids))\n"
)


def _series(text: str) -> dict[str, float]:
    """The process series the sidecar exports, ``name{labels}`` → value."""
    out = {}
    for line in text.splitlines():
        if line.startswith(PROCESS_SERIES) and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def _running(launched: Launched, scenario: str) -> dict[str, Any]:
    ns = launched.ns(scenario)

    def pod() -> dict[str, Any] | None:
        items = [p for p in pods_of(launched.node, ns, "procs") if p["status"].get("phase") == "Running"]
        return items[0] if items and items[0]["status"].get("podIP") else None

    return wait_for(pod, 180, f"the {scenario} Pod to run", interval=2.0)


def _workers_seen(pod: dict[str, Any]) -> dict[str, float] | None:
    try:
        series = _series(scrape_sidecar(pod, timeout_s=10.0))
    except OSError:
        return None
    worker_cpu = series.get(f'{names.PROCESS_CPU_SECONDS_TOTAL}{{role="{names.ROLE_WORKER}"}}', 0.0)
    return series if worker_cpu > 0.05 else None  # the workers ran (two cores shared by every scenario)


def test_the_sidecar_sees_the_trainer_and_its_workers_with_or_without_a_shared_process_namespace(
    scenarios: Launched,
) -> None:
    node = scenarios.node
    figures: dict[str, dict[str, Any]] = {}
    for scenario in ("unshared", "shared"):
        ns = scenarios.ns(scenario)
        try:
            pod = _running(scenarios, scenario)
            assert ("shareProcessNamespace" in pod["spec"]) == (scenario == "shared"), pod["spec"]
            assert pod["spec"].get("shareProcessNamespace", False) is (scenario == "shared")
            assert any(c["name"] == SIDECAR_CONTAINER for c in pod["spec"]["initContainers"])
            # Up to 300 s: fifteen Pods starting at once on two cores, a trainer's start-up (its
            # torch import) can take minutes; the wait ends when its workers ran.
            series = wait_for(
                lambda pod=pod: _workers_seen(pod), 300, f"{scenario}: worker CPU", interval=2.0
            )
            done = node.kubectl(
                *("-n", ns, "exec", pod["metadata"]["name"], "-c", SIDECAR_CONTAINER, "--"),
                *("python3", "-c", VISIBLE),
                check=False,
                timeout_s=60,
            )
            visible = [int(x) for x in done.stdout.split()] if done.returncode == 0 else None
            figures[scenario] = {"series": series, "visible_processes_and_trainers": visible}
        except BaseException:
            dump(node, ns)
            raise
    print("issue 25 figures:", json.dumps(figures, indent=1, sort_keys=True))
    unshared, shared = figures["unshared"], figures["shared"]
    # Without sharing the sidecar's /proc holds only its own processes; with it, the trainer's too.
    if unshared["visible_processes_and_trainers"] is not None:
        assert unshared["visible_processes_and_trainers"][1] == 0, unshared
    if shared["visible_processes_and_trainers"] is not None:
        assert shared["visible_processes_and_trainers"][1] >= 3, shared  # the trainer and two workers
    # The same series either way: the probe publishes what the sidecar would read in /proc.
    assert set(unshared["series"]) == set(shared["series"]), (unshared, shared)
    for role in (names.ROLE_MAIN, names.ROLE_WORKER):
        for figures_of in (unshared, shared):
            got = figures_of["series"]
            assert got[f'{names.PROCESS_CPU_SECONDS_TOTAL}{{role="{role}"}}'] > 0, got
            assert got[f'{names.PROCESSES}{{role="{role}"}}'] == (1 if role == names.ROLE_MAIN else 2), got
            assert got[f'{names.PROCESS_RESIDENT_MEMORY_BYTES}{{role="{role}"}}'] > 0, got
    for scenario in ("unshared", "shared"):
        node.kubectl("-n", scenarios.ns(scenario), "delete", "job", "procs", "--wait=false")
