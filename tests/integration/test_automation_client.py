"""docs/automation.md's example with the official ``kubernetes`` client, run as written against the
real API server (kube-apiserver + etcd, :mod:`tests.support.kubecluster`).

The code is the page's block between ``<!-- automation-client:begin`` and ``<!--
automation-client:end -->``, run unchanged as a script with the rights the page says it needs (a
ServiceAccount with ``get``, ``list`` and ``watch`` on damprofiles only; its kubeconfig's context
names the test's namespace). The statuses it reads are the operator's own: built by the operator's
pure functions (the diagnosis engine's verdict, ``steps.status.evaluation_patch``) and written as
the operator writes them, a JSON merge patch of the status subresource. The script must print the
read field, then one line per verdict change, and nothing for a status write that keeps the
verdict or for a verdict of an older spec; a marker profile's line shows that nothing was printed
in between (one watch delivers events in the order the server stored them).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import queue
import re
import secrets
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from dam_operator.cluster.steps import status as st
from dam_operator.diagnosis.engine import diagnose
from dam_operator.diagnosis.model import Observation
from tests.support.kubecluster import REPO, ControlPlane
from tests.support.operator_harness import GROUP_PATH, ensure_crds
from tests.support.procs import spawn, stop_process

PAGE = REPO / "docs" / "automation.md"
BLOCK = re.compile(
    r"<!-- automation-client:begin[^>]*-->\s*```python\n(?P<code>.*?)```\s*<!-- automation-client:end -->",
    re.DOTALL,
)
LINE_TIMEOUT_S = 30.0
MERGE_PATCH = "application/merge-patch+json"  # what dam_operator.cluster.adapters.kube sends

# A starved GPU job (Data, input-bound) and a CPU job that waits for a CPU (Machine, compute-bound).
STARVED: dict[str, Any] = {
    "window_seconds": 60,
    "steps": 600,
    "data_wait_ratio": 0.3,
    "gpu_count": 2,
    "gpu_utilization": 0.55,
    "main_cpu_cores": 0.6,
    "worker_cpu_cores": 3.5,
    "worker_count": 4,
    "batch_size": 64,
    "gpu_model": "H100",
}
CPU_STARVED: dict[str, Any] = {
    "gpu_count": 0,
    "steps": 40,
    "window_seconds": 10.0,
    "mean_step_seconds": 0.25,
    "data_wait_ratio": 0.002,
    "main_cpu_cores": 0.79,
    "worker_count": 0,
    "cpu_wait_ratio": 0.21,
}


def documented_code() -> str:
    found = BLOCK.search(PAGE.read_text(encoding="utf-8"))
    assert found, f"{PAGE}: the marked block automation-client is missing"
    return found["code"]


def verdict_status(observation: dict[str, Any]) -> dict[str, Any]:
    """``Verdict.to_status()`` of the real engine (``bottleneck``, ``metrics``)."""
    return diagnose(Observation(**observation)).to_status()


def expected_line(namespace: str, name: str, verdict: dict[str, Any]) -> str:
    b = verdict["bottleneck"]
    verdict_text = f"{b['axis']} ({b['regime']}), pull {b['lever']}"
    return f"{namespace}/{name}: {verdict_text} [confidence {b['confidence']:.2f}]"


class Profiles:
    """DAMProfiles in one namespace, their statuses written as the operator writes them."""

    def __init__(self, cp: ControlPlane, namespace: str) -> None:
        self.cp, self.namespace = cp, namespace

    def path(self, name: str) -> str:
        return f"{GROUP_PATH}/namespaces/{self.namespace}/damprofiles/{name}"

    def create(self, name: str) -> None:
        body = {
            "apiVersion": "dam.mlsys.dev/v1alpha1",
            "kind": "DAMProfile",
            "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": {"app": name}}},
        }
        self.cp.api("POST", f"{GROUP_PATH}/namespaces/{self.namespace}/damprofiles", body)

    def get(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.cp.api("GET", self.path(name))
        return found

    def evaluate(self, name: str, verdict: dict[str, Any], *, generation: int | None = None) -> None:
        """One evaluation's status write: the verdict, one reporting pod, for ``generation``
        (default: the profile's current one)."""
        obj = self.get(name)
        generation = obj["metadata"]["generation"] if generation is None else generation
        conditions = [st.condition(st.DIAGNOSED, True, st.REASON_DIAGNOSED, "test verdict", generation)]
        patch = st.evaluation_patch(
            obj.get("status"),
            verdict_status=verdict,
            pods=st.pods_status(1, 1, 1),
            conditions=conditions,
            generation=generation,
            now=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        )
        self.cp.api("PATCH", f"{self.path(name)}/status", patch, content_type=MERGE_PATCH)

    def edit_spec(self, name: str) -> None:
        patch = {"spec": {"evaluation": {"windowSeconds": 60}}}
        self.cp.api("PATCH", self.path(name), patch, content_type=MERGE_PATCH)

    def delete(self, name: str) -> None:
        self.cp.api("DELETE", self.path(name))


@contextlib.contextmanager
def watcher_rights(cp: ControlPlane, namespace: str) -> Iterator[Path]:
    """A ServiceAccount with get, list and watch on damprofiles in every namespace (the page's
    ClusterRole and ClusterRoleBinding); its kubeconfig, whose context names ``namespace``."""
    name = f"dam-watcher-{secrets.token_hex(3)}"
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": [
            {"apiGroups": ["dam.mlsys.dev"], "resources": ["damprofiles"], "verbs": ["get", "list", "watch"]}
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": "watcher", "namespace": namespace}],
    }
    cp.api("POST", f"{rbac}/clusterroles", role)
    cp.api("POST", f"{rbac}/clusterrolebindings", binding)
    try:
        yield cp.service_account_kubeconfig(namespace, "watcher")
    finally:
        if cp.running:  # cluster-scoped: they would outlive the namespace
            cp.api("DELETE", f"{rbac}/clusterrolebindings/{name}", ok=(200, 404))
            cp.api("DELETE", f"{rbac}/clusterroles/{name}", ok=(200, 404))


class Script:
    """The page's code as a child process; its output lines about one namespace, in order."""

    def __init__(self, code: str, kubeconfig: Path, workdir: Path, namespace: str) -> None:
        self.prefix = f"{namespace}/"
        self.lines: queue.Queue[str] = queue.Queue()
        self.stderr = workdir / "watcher.stderr"
        path = workdir / "watcher.py"
        path.write_text(code, encoding="utf-8")
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        env.update(KUBECONFIG=str(kubeconfig), PYTHONUNBUFFERED="1")
        with open(self.stderr, "wb") as err:
            self.proc = spawn([sys.executable, str(path)], env=env, stdout=subprocess.PIPE, stderr=err)
        self._reader = threading.Thread(target=self._read, name="watcher-stdout", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            if line.startswith(self.prefix):  # the watch is cluster-wide: other tests' profiles too
                self.lines.put(line)

    def next_line(self) -> str:
        try:
            return self.lines.get(timeout=LINE_TIMEOUT_S)
        except queue.Empty:
            alive = "running" if self.proc.poll() is None else f"exited {self.proc.returncode}"
            raise AssertionError(
                f"no line in {LINE_TIMEOUT_S:.0f} s (the script is {alive}); stderr:\n"
                + self.stderr.read_text(errors="replace")[-4000:]
            ) from None

    def stop(self) -> None:
        stop_process(self.proc)


def test_the_documented_official_client_example_reads_the_verdict_and_reacts_to_each_change(
    control_plane: ControlPlane, kube_namespace: str, tmp_path: Path
) -> None:
    if importlib.util.find_spec("kubernetes") is None:
        pytest.fail("the official kubernetes client is missing: pip install -e '.[dev]'", pytrace=False)
    ensure_crds(control_plane)
    ns, profiles = kube_namespace, Profiles(control_plane, kube_namespace)
    data, machine = verdict_status(STARVED), verdict_status(CPU_STARVED)
    same_data = verdict_status({**STARVED, "steps": 660, "data_wait_ratio": 0.32})
    assert (data["bottleneck"]["axis"], machine["bottleneck"]["axis"]) == ("Data", "Machine")
    # A later window: other figures, the same verdict.
    key = ("axis", "regime", "lever")
    assert [same_data["bottleneck"][k] for k in key] == [data["bottleneck"][k] for k in key]
    assert same_data["metrics"] != data["metrics"]

    profiles.create("train-profile")
    profiles.evaluate("train-profile", data)
    with watcher_rights(control_plane, ns) as kubeconfig:
        script = Script(documented_code(), kubeconfig, tmp_path, ns)
        try:
            # The status field read, then the watch's first event: the profile as it is.
            assert script.next_line() == f"{ns}/train-profile: Data"
            assert script.next_line() == expected_line(ns, "train-profile", data)

            # Nothing to print: a window that keeps the verdict, a spec change (the verdict is for
            # the older generation now) and an evaluation that was still for the older generation.
            profiles.evaluate("train-profile", same_data)
            profiles.edit_spec("train-profile")
            assert profiles.get("train-profile")["metadata"]["generation"] == 2
            profiles.evaluate("train-profile", machine, generation=1)
            profiles.create("marker")
            profiles.evaluate("marker", machine)
            assert script.next_line() == expected_line(ns, "marker", machine)

            # The verdict changes for the current spec.
            profiles.evaluate("train-profile", machine)
            assert script.next_line() == expected_line(ns, "train-profile", machine)

            # Deleted and created again: its first verdict is news again.
            profiles.delete("train-profile")
            profiles.create("train-profile")
            profiles.evaluate("train-profile", machine)
            assert script.next_line() == expected_line(ns, "train-profile", machine)
            assert script.proc.poll() is None, script.stderr.read_text(errors="replace")
        finally:
            script.stop()
    assert script.lines.empty(), list(script.lines.queue)
