"""A trainer OOM-killed before any window is a verdict, not `unknown` (the real API server).

What the node tier saw (issue 18): with ``restartPolicy: Never`` the Pod is Failed seconds after
it starts and its sidecar stops with it, so no window forms. Here the test plays the kubelet
(``pods/status``): the Pod runs, maybe answers scrapes, then is Failed with the container status
``OOMKilled``. The operator (``dam operator``, a child process) must publish ``memory-capacity``
and say it judged from the kubelet's container status; the lever follows which process held the
memory in the pod's last scrape (the loader's workers → ``reduce-loader-memory``).
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from dam_contract import names
from tests.support.kubecluster import ControlPlane
from tests.support.operator_harness import (
    OperatorProcess,
    apply,
    damprofile,
    ensure_crds,
    free_port,
    operator_namespace,
    profile_of,
    wait_for,
)

GIB = 1024**3


class _Sidecar(BaseHTTPRequestHandler):
    """A sidecar's /metrics at the moment before the kill: the workers hold most of the memory."""

    def do_GET(self) -> None:
        now = time.time()
        text = "\n".join(
            [
                f"{names.SNAPSHOT_TIMESTAMP_SECONDS} {now}",
                f"{names.STEPS_TOTAL} {int(now * 10) % 1000000}",
                f'{names.PROCESSES}{{role="main"}} 1',
                f'{names.PROCESSES}{{role="worker"}} 4',
                f'{names.PROCESS_RESIDENT_MEMORY_BYTES}{{role="main"}} {0.6 * GIB}',
                f'{names.PROCESS_RESIDENT_MEMORY_BYTES}{{role="worker"}} {1.3 * GIB}',
                f"{names.CONTAINER_MEMORY_USAGE_BYTES} {1.95 * GIB}",
                f"{names.CONTAINER_MEMORY_LIMIT_BYTES} {2 * GIB}",
                "",
            ]
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def sidecar_port() -> Iterator[int]:
    port = free_port()
    server = ThreadingHTTPServer(("127.0.0.1", port), _Sidecar)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        server.shutdown()
        server.server_close()


def _profile(port: int) -> str:
    return yaml.safe_dump(damprofile("p", {"app": "trainer"}, port=port))


def _pod(cp: ControlPlane, ns: str, name: str) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "trainer"}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {"name": "trainer", "image": "example/train:1", "resources": {"limits": {"memory": "2Gi"}}}
            ],
        },
    }
    cp.api("POST", f"/api/v1/namespaces/{ns}/pods", body)


def _fail_oom(cp: ControlPlane, ns: str, name: str, exit_code: int) -> None:
    """What the kubelet writes when the trainer's container is OOM-killed under restartPolicy Never."""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    status = {
        "phase": "Failed",
        "containerStatuses": [
            {
                "name": "trainer",
                "image": "example/train:1",
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "started": False,
                "state": {
                    "terminated": {
                        "exitCode": exit_code,
                        "reason": "OOMKilled",
                        "startedAt": now,
                        "finishedAt": now,
                    }
                },
            }
        ],
    }
    cp.api(
        "PATCH",
        f"/api/v1/namespaces/{ns}/pods/{name}/status",
        {"status": status},
        content_type="application/merge-patch+json",
    )


@pytest.fixture
def operator(control_plane: ControlPlane, kube_namespace: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    ensure_crds(control_plane)
    with operator_namespace(control_plane) as dam_system:
        op = OperatorProcess(
            control_plane,
            tmp_path,
            namespace=kube_namespace,
            operator_namespace=dam_system,
            webhook=False,
        )
        try:
            op.start()
            yield op
        finally:
            op.close()


def _bottleneck(cp: ControlPlane, ns: str) -> dict[str, Any] | None:
    b = profile_of(cp, ns, "p").get("status", {}).get("bottleneck")
    return b if b and b.get("regime") != "unknown" else None


def test_a_trainer_oom_killed_before_its_first_scrape_is_memory_capacity_from_the_container_status(
    control_plane: ControlPlane, kube_namespace: str, operator: OperatorProcess
) -> None:
    apply(control_plane, kube_namespace, _profile(free_port()))  # nothing listens: never scraped
    _pod(control_plane, kube_namespace, "trainer-0")
    control_plane.mark_pod_running(kube_namespace, "trainer-0", pod_ip="127.0.0.1")
    _fail_oom(control_plane, kube_namespace, "trainer-0", exit_code=137)
    b = wait_for(lambda: _bottleneck(control_plane, kube_namespace), 60, "a verdict for the OOM-killed pod")
    assert b["regime"] == "memory-capacity", b
    assert b["axis"] == "Algorithm" and b["boundary"] == "Machine", b
    text = " ".join(b["evidence"])
    assert "OOMKilled" in text, text
    assert "pod trainer-0: container trainer was OOM-killed" in text, text
    assert "exit code 137" in text and "the pod is Failed" in text, text
    assert "no scrape of it answered before it died" in text, text
    assert b["lever"] != "collect-more-evidence"


def test_a_pod_whose_loader_workers_held_the_memory_gets_reduce_loader_memory_after_it_failed(
    control_plane: ControlPlane, kube_namespace: str, operator: OperatorProcess, sidecar_port: int
) -> None:
    apply(control_plane, kube_namespace, _profile(sidecar_port))
    _pod(control_plane, kube_namespace, "trainer-0")
    control_plane.mark_pod_running(kube_namespace, "trainer-0", pod_ip="127.0.0.1")
    # One scrape answered (the baseline) before the kill: not enough for a window of its own.
    wait_for(
        lambda: (
            (profile_of(control_plane, kube_namespace, "p").get("status", {}).get("pods") or {}).get(
                "reporting"
            )
            == 1
        ),
        60,
        "the pod's sidecar to be scraped once",
    )
    _fail_oom(control_plane, kube_namespace, "trainer-0", exit_code=1)  # a worker was taken, main exited 1
    b = wait_for(lambda: _bottleneck(control_plane, kube_namespace), 60, "a verdict for the OOM-killed pod")
    assert b["regime"] == "memory-capacity", b
    assert b["lever"] == "reduce-loader-memory", b
    text = " ".join(b["evidence"])
    assert "loader workers hold most of the resident memory" in text, text
    assert "its last scrape at" in text and "exit code 1" in text, text
