"""The pod webhook's edge Pods, created through a real kube-apiserver (issue 17's hostile-input set).

The operator runs in this process with its webhook registered by URL (as in
test_webhook_real_server.py); Pods are created with the real kubectl, so the API server's own
admission runs around the webhook (the ServiceAccount plugin among them, re-run after our patch)
and validates what it stores. Each test asserts the stored Pod and the warnings kubectl printed.

Then the webhook's HTTPS server under clients that never finish their requests: they are cut off
within the webhook's request timeout while a normal review is answered meanwhile.
"""

from __future__ import annotations

import json
import socket
import ssl
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from dam_operator.cluster.runtime.webhook import WebhookLimits
from dam_operator.cluster.steps.injection import (
    ANNOTATION_HOST_NETWORK_PORT,
    ANNOTATION_NOTES,
    INSTALL_CONTAINER,
    SIDECAR_CONTAINER,
    TOKEN_PATH,
    VOLUME_NAME,
)
from tests.support.kubecluster import ControlPlane
from tests.support.operator_harness import (
    MWC_PATH,
    InProcessOperator,
    condition,
    profile_of,
    wait_for,
    webhook_operator,
)

TIMEOUT_SECONDS = 2
PROFILE = yaml.safe_dump(
    {
        "apiVersion": "dam.mlsys.dev/v1alpha1",
        "kind": "DAMProfile",
        "metadata": {"name": "p"},
        "spec": {"selector": {"matchLabels": {"app": "trainer"}}, "evaluation": {"windowSeconds": 5}},
    }
)


def _pod(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "trainer"}},
        "spec": {"containers": [{"name": "train", "image": "python:3.11-slim"}], **spec},
    }


@pytest.fixture(scope="module")
def operator(control_plane: ControlPlane) -> Iterator[InProcessOperator]:
    with webhook_operator(control_plane, TIMEOUT_SECONDS) as running:
        yield running


class Namespace:
    def __init__(self, cp: ControlPlane, ns: str) -> None:
        self.cp, self.ns = cp, ns

    def create(self, pod: dict[str, Any]) -> tuple[dict[str, Any], str]:
        """kubectl create; (the Pod as the server stored it, the warnings kubectl printed)."""
        done = self.cp.kubectl("create", "-n", self.ns, "-f", "-", input=json.dumps(pod))
        name = pod["metadata"]["name"]
        stored: dict[str, Any] = self.cp.api("GET", f"/api/v1/namespaces/{self.ns}/pods/{name}")
        return stored, done.stderr


@pytest.fixture
def ns(control_plane: ControlPlane, kube_namespace: str, operator: InProcessOperator) -> Namespace:
    cp = control_plane
    mwc = f"{MWC_PATH}/{operator.settings.webhook_configuration_name}"
    wait_for(lambda: cp.api("GET", mwc)["webhooks"][0]["clientConfig"].get("caBundle"), 30, "the webhook")
    cp.kubectl("apply", "-n", kube_namespace, "-f", "-", input=PROFILE)
    wait_for(lambda: condition(profile_of(cp, kube_namespace, "p"), "SpecValid"), 30, "registration")
    return Namespace(cp, kube_namespace)


def _init(pod: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in pod["spec"].get("initContainers", []) if c["name"] == name)


def _mounts_at(container: dict[str, Any], path: str) -> list[dict[str, Any]]:
    return [m for m in container.get("volumeMounts", []) if m["mountPath"] == path]


def test_injected_containers_get_no_api_token_and_the_training_container_keeps_its_own(ns: Namespace) -> None:
    pod, _ = ns.create(_pod("token"))
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    train = pod["spec"]["containers"][0]
    (train_token,) = _mounts_at(train, TOKEN_PATH)
    # The ServiceAccount plugin gave the user's container its projected token ...
    assert "projected" in volumes[train_token["name"]], volumes[train_token["name"]]
    for name in (INSTALL_CONTAINER, SIDECAR_CONTAINER):
        # ... and ours only the empty in-memory volume they mount over its path (no second mount).
        (mount,) = _mounts_at(_init(pod, name), TOKEN_PATH)
        assert volumes[mount["name"]] == {
            "name": mount["name"],
            "emptyDir": {"medium": "Memory", "sizeLimit": "64Ki"},
        }, name


def test_a_pod_whose_profile_does_not_ask_gets_no_shared_process_namespace(ns: Namespace) -> None:
    pod, warnings = ns.create(_pod("plain"))
    assert _init(pod, SIDECAR_CONTAINER)  # instrumented ...
    assert "shareProcessNamespace" not in pod["spec"], pod["spec"]  # ... in its own process namespaces
    assert "shareProcessNamespace" not in warnings, warnings
    # A pod that says false keeps it, with nothing to say: not sharing is the default.
    kept, warnings = ns.create(_pod("unshared", shareProcessNamespace=False))
    assert kept["spec"]["shareProcessNamespace"] is False and _init(kept, SIDECAR_CONTAINER)
    assert ANNOTATION_NOTES not in kept["metadata"]["annotations"], kept["metadata"]["annotations"]


@pytest.mark.parametrize(
    "volume",
    [
        {"name": VOLUME_NAME, "configMap": {"name": "cfg"}},
        {"name": VOLUME_NAME, "persistentVolumeClaim": {"claimName": "data", "readOnly": False}},
        {"name": VOLUME_NAME, "hostPath": {"path": "/srv/data", "type": "Directory"}},
    ],
    ids=["read-only", "pvc", "host-path"],
)
def test_an_existing_dam_probe_volume_is_never_reused(ns: Namespace, volume: dict[str, Any]) -> None:
    pod, warnings = ns.create(_pod(f"vol-{next(iter(set(volume) - {'name'})).lower()}", volumes=[volume]))
    user = next(v for v in pod["spec"]["volumes"] if v["name"] == VOLUME_NAME)
    assert {k: v for k, v in user.items() if k != "name"}.keys() == {k for k in volume if k != "name"}
    for name in (INSTALL_CONTAINER, SIDECAR_CONTAINER):
        assert {m["name"] for m in _init(pod, name)["volumeMounts"]} >= {f"{VOLUME_NAME}-1"}
        assert VOLUME_NAME not in {m["name"] for m in _init(pod, name)["volumeMounts"]}
    assert "left alone" in warnings, warnings


def test_a_probe_directory_already_mounted_moves_ours(ns: Namespace) -> None:
    pod = _pod("mounted", volumes=[{"name": "mine", "emptyDir": {}}])
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "mine", "mountPath": "/dam/probe"}]
    stored, warnings = ns.create(pod)
    train = stored["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in train["env"]}
    assert env["DAM_PROBE_DIR"] == env["PYTHONPATH"] == "/dam/probe-1"
    assert {"name": "mine", "mountPath": "/dam/probe"} in [
        {k: m[k] for k in ("name", "mountPath")} for m in train["volumeMounts"]
    ]
    assert "/dam/probe-1" in warnings


def test_a_host_network_pod_is_skipped_with_a_warning_unless_it_names_the_port(ns: Namespace) -> None:
    pod, warnings = ns.create(_pod("host", hostNetwork=True))
    assert "initContainers" not in pod["spec"]
    assert ANNOTATION_HOST_NETWORK_PORT in warnings, warnings
    assert pod["metadata"]["annotations"][ANNOTATION_NOTES] == "not-injected:host-network"
    consenting = _pod("host-ok", hostNetwork=True)
    consenting["metadata"]["annotations"] = {ANNOTATION_HOST_NETWORK_PORT: "9450"}
    stored, _ = ns.create(consenting)
    assert _init(stored, SIDECAR_CONTAINER)["ports"][0]["hostPort"] == 9450  # the scheduler sees the port


def test_pythonpath_from_a_config_map_is_warned_and_reported(ns: Namespace) -> None:
    ref = {"name": "PYTHONPATH", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "pp"}}}
    pod = _pod("cm-ref")
    pod["spec"]["containers"][0]["env"] = [ref]
    stored, warnings = ns.create(pod)
    assert stored["spec"]["containers"][0]["env"][0] == ref
    assert "valueFrom" in warnings, warnings
    env_from = _pod("cm-envfrom")
    env_from["spec"]["containers"][0]["envFrom"] = [{"configMapRef": {"name": "cfg"}}]
    stored, warnings = ns.create(env_from)
    env = {e["name"]: e.get("value") for e in stored["spec"]["containers"][0]["env"]}
    assert env["PYTHONPATH"] == "/dam/probe:$(PYTHONPATH)"
    assert "envFrom" in warnings, warnings

    # The status says which pod may run without the probe, and what to do (a Pending pod counts).
    def reported() -> dict[str, Any] | None:
        cond = condition(profile_of(ns.cp, ns.ns, "p"), "Instrumented")
        return cond if cond and cond.get("reason") == "ProbeMayNotLoad" else None

    cond = wait_for(reported, 60, "the Instrumented condition")
    assert cond["status"] == "Unknown" and "cm-ref" in cond["message"], cond


# ---------------------------------------------------------------- the HTTPS server under stalled clients


def _tls(port: int) -> socket.socket:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    raw = socket.create_connection(("127.0.0.1", port), timeout=30)
    return context.wrap_socket(raw, server_hostname="127.0.0.1")


def _closed_by_server(sock: socket.socket, deadline: float) -> bool:
    sock.settimeout(max(0.1, deadline - time.monotonic()))
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except TimeoutError:
        return False
    except (ssl.SSLError, OSError):
        return True


def test_stalled_request_bodies_are_cut_off_while_a_normal_review_is_answered(
    operator: InProcessOperator, ns: Namespace
) -> None:
    port = operator.settings.webhook_port
    limit = WebhookLimits.for_timeout(TIMEOUT_SECONDS).request_timeout_seconds
    stalled: list[socket.socket] = []
    started = time.monotonic()
    try:
        for i in range(300):
            s = _tls(port)
            if i % 2:  # half send their headers and part of the body, half only part of the headers
                s.sendall(
                    b"POST /mutate-pods HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 100000\r\n\r\n" + b'{"request": ' + b" " * 1000
                )
            else:
                s.sendall(b"POST /mutate-pods HTTP/1.1\r\nHost: x\r\nContent-Le")
            stalled.append(s)
        opened = time.monotonic() - started
        # Meanwhile the API server's reviews are answered: a pod is created and instrumented.
        pod, _ = ns.create(_pod("meanwhile"))
        assert _init(pod, SIDECAR_CONTAINER)
        deadline = started + opened + limit + 5.0
        open_after = [s for s in stalled if not _closed_by_server(s, deadline)]
        assert open_after == [], (
            f"{len(open_after)} of 300 stalled connections still open after {limit + 5} s"
        )
        elapsed = time.monotonic() - started
        assert elapsed < opened + limit + 5.0
    finally:
        for s in stalled:
            s.close()
