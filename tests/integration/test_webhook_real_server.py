"""The pod webhook called by a real kube-apiserver.

The operator runs in this process (``run_operator`` in a thread, one for the module, so that a
test can break a function it calls), cluster-wide, with its webhook on
``https://127.0.0.1:PORT/mutate-pods`` and ``cert_mode: self-signed``: it makes its CA and
serving certificate, keeps them in a Secret and creates the MutatingWebhookConfiguration itself,
with that CA as ``caBundle``. Pods are created with the real kubectl; the API server calls the
webhook over TLS, applies its JSONPatch, runs its own admission and validation on the result, and
stores what passes.

- an injected pod is accepted and stored as the webhook made it;
- a broken patch (an invalid container) is refused by the server, and the check notices;
- with another webhook mutating the pod after ours, the server calls ours again
  (``reinvocationPolicy: IfNeeded``) and ours changes nothing the second time;
- a webhook that does not answer within ``timeoutSeconds``, or is down, does not stop pod
  creation (``failurePolicy: Ignore``): the pod is created without the sidecar.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from dam_contract.snapshot import parse_snapshot
from dam_operator.cluster.adapters import certs
from dam_operator.cluster.runtime import webhook as webhook_module
from dam_operator.cluster.steps import injection
from dam_operator.cluster.steps.injection import SIDECAR_CONTAINER
from tests.support.kubecluster import ApiError, ControlPlane
from tests.support.operator_harness import (
    MWC_PATH,
    InProcessOperator,
    condition,
    dumps,
    free_port,
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
        "spec": {"selector": {"matchLabels": {"app": "trainer"}}},
    }
)


def training_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "trainer"}},
        "spec": {
            "containers": [{"name": "train", "image": "python:3.11-slim", "command": ["python", "train.py"]}]
        },
    }


class Webhooked:
    """One test's namespace with a profile, and the operator whose webhook serves it."""

    def __init__(self, cp: ControlPlane, namespace: str, operator: InProcessOperator) -> None:
        self.cp, self.ns, self.operator = cp, namespace, operator

    @property
    def configuration(self) -> dict[str, Any]:
        found: dict[str, Any] = self.cp.api(
            "GET", f"{MWC_PATH}/{self.operator.settings.webhook_configuration_name}"
        )
        return found

    def create_pod(self, name: str) -> dict[str, Any]:
        """kubectl create; the Pod as the server stored it."""
        self.cp.kubectl("create", "-n", self.ns, "-f", "-", input=json.dumps(training_pod(name)))
        found: dict[str, Any] = self.cp.api("GET", f"/api/v1/namespaces/{self.ns}/pods/{name}")
        return found

    def create_instrumented_pod(self, name: str) -> dict[str, Any]:
        """Create a training pod and check that the server stored it with the sidecar."""
        pod = self.create_pod(name)
        sidecars = [c for c in pod["spec"].get("initContainers", []) if c["name"] == SIDECAR_CONTAINER]
        assert len(sidecars) == 1, dumps(pod["spec"])
        assert sidecars[0]["restartPolicy"] == "Always"
        return pod

    def webhook_results(self) -> dict[str, float]:
        snapshot = parse_snapshot(self.operator.metrics(), "operator")
        return {
            dict(s.labels)["result"]: s.value for s in snapshot.samples("dam_operator_webhook_requests_total")
        }


@pytest.fixture(scope="module")
def operator(control_plane: ControlPlane) -> Iterator[InProcessOperator]:
    """One operator for the module (cluster-wide); each test has its own namespace and profile."""
    with webhook_operator(control_plane, TIMEOUT_SECONDS) as running:
        yield running


@pytest.fixture
def hooked(control_plane: ControlPlane, kube_namespace: str, operator: InProcessOperator) -> Webhooked:
    cp = control_plane
    hooked = Webhooked(cp, kube_namespace, operator)
    wait_for(lambda: hooked.configuration["webhooks"][0]["clientConfig"].get("caBundle"), 30, "the webhook")
    cp.kubectl("apply", "-n", kube_namespace, "-f", "-", input=PROFILE)
    wait_for(lambda: condition(profile_of(cp, kube_namespace, "p"), "SpecValid"), 30, "registration")
    return hooked


def test_the_api_server_calls_the_webhook_and_stores_the_mutated_pod(hooked: Webhooked) -> None:
    mwc = hooked.configuration
    (hook,) = mwc["webhooks"]
    assert hook["clientConfig"]["url"] == hooked.operator.settings.webhook_url
    ca = base64.b64decode(hook["clientConfig"]["caBundle"])
    secret = hooked.cp.api(
        "GET",
        f"/api/v1/namespaces/{hooked.operator.settings.operator_namespace}/secrets/"
        f"{hooked.operator.settings.cert_secret_name}",
    )
    assert base64.b64decode(secret["data"][certs.CA_CRT]) == ca  # the CA the operator keeps
    assert hook["failurePolicy"] == "Ignore"
    assert hook["timeoutSeconds"] == TIMEOUT_SECONDS
    assert hook["reinvocationPolicy"] == "IfNeeded"
    assert hook["sideEffects"] == "None"

    pod = hooked.create_instrumented_pod("trainer-0")
    spec = pod["spec"]
    assert "shareProcessNamespace" not in spec  # not asked for (spec.sidecar.shareProcessNamespace)
    assert any(v["name"] == "dam-probe" and "emptyDir" in v for v in spec["volumes"])
    train = next(c for c in spec["containers"] if c["name"] == "train")
    assert {e["name"] for e in train["env"]} >= {"DAM_PROBE_DIR", "PYTHONPATH"}
    # The server's own admission ran around the webhook: defaults the webhook's containers did not
    # set are filled in (a kubelet would refuse a pod without them).
    for container in spec["initContainers"]:
        assert container["terminationMessagePolicy"] == "File"
        assert container["imagePullPolicy"]
    assert pod["metadata"]["annotations"]["dam.mlsys.dev/injected"]
    assert hooked.webhook_results().get("injected", 0) >= 1

    # A pod of no profile passes through unchanged.
    other = training_pod("other-0")
    other["metadata"]["labels"] = {"app": "web"}
    hooked.cp.kubectl("create", "-n", hooked.ns, "-f", "-", input=json.dumps(other))
    stored = hooked.cp.api("GET", f"/api/v1/namespaces/{hooked.ns}/pods/other-0")
    assert "initContainers" not in stored["spec"]


def test_a_broken_injection_patch_is_refused_by_the_server_and_the_check_notices(
    hooked: Webhooked, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = injection.build_injection

    def broken(*args: Any, **kwargs: Any) -> injection.Injection:
        made = original(*args, **kwargs)
        # A second container with the sidecar's name and no image: an invalid Pod.
        bad = {"op": "add", "path": "/spec/containers/-", "value": {"name": SIDECAR_CONTAINER}}
        return injection.Injection([*made.patch, bad], made.warnings, made.notes)

    monkeypatch.setattr(webhook_module, "build_injection", broken)
    with pytest.raises(AssertionError) as caught:
        hooked.create_instrumented_pod("trainer-0")
    message = str(caught.value)
    assert "is invalid" in message, message
    assert "spec.containers[1].image: Required value" in message, message
    assert 'Duplicate value: "dam-sidecar"' in message, message
    with pytest.raises(ApiError) as absent:
        hooked.cp.api("GET", f"/api/v1/namespaces/{hooked.ns}/pods/trainer-0")
    assert absent.value.status == 404

    monkeypatch.undo()
    hooked.create_instrumented_pod("trainer-0")  # the same check passes with the real builder


class TouchingWebhook:
    """A second mutating webhook (HTTPS on 127.0.0.1, its own CA) that adds an annotation to
    every pod it sees, and counts its calls."""

    def __init__(self, tmp: Path) -> None:
        self.bundle = certs.issue(["localhost"], ["127.0.0.1"])
        self.cert, self.key = certs.write_pem_files(self.bundle, tmp / "touch-certs")
        self.port = free_port()
        self.calls = 0
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    async def _mutate(self, request: web.Request) -> web.Response:
        self.calls += 1
        review = await request.json()
        pod = review["request"]["object"]
        patch: list[dict[str, Any]] = []
        if not (pod["metadata"].get("annotations") or {}):
            patch.append({"op": "add", "path": "/metadata/annotations", "value": {}})
        patch.append(
            {"op": "add", "path": "/metadata/annotations/test.dam.mlsys.dev~1touched", "value": "yes"}
        )
        response = {
            "uid": review["request"]["uid"],
            "allowed": True,
            "patchType": "JSONPatch",
            "patch": base64.b64encode(json.dumps(patch).encode()).decode(),
        }
        return web.json_response(
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
        )

    def _run(self) -> None:
        import ssl

        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/touch", self._mutate)
        runner = web.AppRunner(app, access_log=None)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert, self.key)
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(
            web.TCPSite(runner, "127.0.0.1", self.port, ssl_context=context).start()
        )
        self._started.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())
        self._loop.run_until_complete(asyncio.sleep(0.5))  # TLS close_notify with the API server
        self._loop.close()

    def __enter__(self) -> TouchingWebhook:
        self._thread.start()
        self._started.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def configuration(self, name: str, namespace: str) -> dict[str, Any]:
        return {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [
                {
                    "name": "touch.test.dam.mlsys.dev",
                    "admissionReviewVersions": ["v1"],
                    "clientConfig": {
                        "url": f"https://127.0.0.1:{self.port}/touch",
                        "caBundle": base64.b64encode(self.bundle.ca_bundle).decode(),
                    },
                    "rules": [
                        {
                            "operations": ["CREATE"],
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "resources": ["pods"],
                        }
                    ],
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                    "failurePolicy": "Fail",
                    "sideEffects": "None",
                    "timeoutSeconds": 5,
                }
            ],
        }


def test_a_later_webhook_mutating_the_pod_reinvokes_ours_which_changes_nothing(
    hooked: Webhooked, tmp_path: Path
) -> None:
    cp = hooked.cp
    # Webhooks run in the order of their configurations' names: ours, then this one.
    name = f"zz-{hooked.ns}"
    assert name > hooked.operator.settings.webhook_configuration_name
    with TouchingWebhook(tmp_path) as touching:
        cp.api("POST", MWC_PATH, touching.configuration(name, hooked.ns))
        try:
            before = hooked.webhook_results()
            pod = hooked.create_instrumented_pod("trainer-0")
            after = hooked.webhook_results()
        finally:
            cp.api("DELETE", f"{MWC_PATH}/{name}", ok=(200, 404))
    assert pod["metadata"]["annotations"]["test.dam.mlsys.dev/touched"] == "yes"
    assert touching.calls == 1
    # Ours was called twice: it injected, then (reinvoked after the other webhook's change) left
    # the already instrumented pod alone; one sidecar, no duplicate containers.
    assert after.get("injected", 0) - before.get("injected", 0) == 1
    assert after.get("skipped", 0) - before.get("skipped", 0) == 1, (before, after)


def test_a_slow_or_down_webhook_does_not_stop_pod_creation(hooked: Webhooked) -> None:
    cp, name = hooked.cp, hooked.operator.settings.webhook_configuration_name

    def point_at(url: str) -> None:
        move = [{"op": "replace", "path": "/webhooks/0/clientConfig/url", "value": url}]
        cp.api("PATCH", f"{MWC_PATH}/{name}", move, content_type="application/json-patch+json")

    try:
        # Slow: the webhook's address accepts connections and never answers (a hung server).
        with socket.socket() as hung:
            hung.bind(("127.0.0.1", 0))
            hung.listen(16)
            point_at(f"https://127.0.0.1:{hung.getsockname()[1]}/mutate-pods")
            started = time.monotonic()
            pod = hooked.create_pod("slow-0")
            took = time.monotonic() - started
        assert "initContainers" not in pod["spec"], dumps(pod["spec"])  # admitted unchanged
        assert TIMEOUT_SECONDS - 0.5 <= took < TIMEOUT_SECONDS + 10, took  # the server waited timeoutSeconds

        # Down: nothing listens at the webhook's address (connection refused).
        point_at(f"https://127.0.0.1:{free_port()}/mutate-pods")
        started = time.monotonic()
        pod = hooked.create_pod("down-0")
        assert "initContainers" not in pod["spec"], dumps(pod["spec"])
        assert time.monotonic() - started < TIMEOUT_SECONDS + 5
    finally:
        point_at(hooked.operator.settings.webhook_url)
    hooked.create_instrumented_pod("trainer-0")  # served again
    assert hooked.configuration["webhooks"][0]["failurePolicy"] == "Ignore"
