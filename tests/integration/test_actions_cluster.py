"""spec.actions against a real kube-apiserver: the server stores the status the policy writes (no
field pruned), calls the operator's webhook when a Pod of the profile is created, validates the
mutated Pod, and the stored Pod carries the DataLoader override and the action annotation; the
pod's figures then judge the action, and a profile back in mode Recommend gets nothing.

The webhook is the operator's own aiohttp app (``make_webhook_app``) over TLS on 127.0.0.1,
registered by URL; its profiles come from a ``Registry`` seeded from the stored DAMProfile, as the
operator's resume handler seeds it. No kubelet: the Pod's status is written through ``pods/status``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import secrets
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kopf
import pytest

from dam_operator.cluster.adapters.certs import issue, write_pem_files
from dam_operator.cluster.adapters.kube import ApiError, KubeClient
from dam_operator.cluster.runtime.webhook import (
    MUTATE_PATH,
    ProfileRef,
    WebhookServer,
    make_webhook_app,
    serve_webhook,
    webhook_configuration_for_url,
)
from dam_operator.cluster.steps import actions as act
from dam_operator.cluster.steps.injection import (
    ANNOTATION_ACTION,
    InjectionSettings,
    is_instrumented,
    resize_patch,
)
from dam_operator.cluster.steps.registry import PodInfo, Registry
from dam_operator.cluster.steps.spec import parse_spec
from dam_operator.diagnosis.model import Axis, Bottleneck, Observation, Regime, Verdict, WindowMetrics
from dam_probe.overrides import ENV_LOADER_OVERRIDES, parse_overrides
from tests.support.kubecluster import ControlPlane
from tests.support.operator_harness import wait_established
from tests.support.procs import free_port

ROOT = Path(__file__).resolve().parents[2]
GROUP_PATH = "/apis/dam.mlsys.dev/v1alpha1"
SETTINGS = InjectionSettings(image="ghcr.io/mlsys/dam-operator:0.1.0", operator_namespace="dam-system")
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


@pytest.fixture(scope="module")
def damprofile_crd(control_plane: ControlPlane) -> None:
    control_plane.kubectl("apply", "-f", str(ROOT / "crds" / "damprofile.yaml"))
    wait_established(control_plane, "damprofiles.dam.mlsys.dev")


class Webhook:
    """The operator's webhook in a thread of its own, reading profiles from a Registry."""

    def __init__(self, registry: Registry, tmp: Path) -> None:
        self.registry = registry
        self.certs = issue(["localhost"], ip_addresses=["127.0.0.1"])
        self.certfile, self.keyfile = write_pem_files(self.certs, tmp)
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.server: WebhookServer | None = None
        self.thread = threading.Thread(target=self.loop.run_forever, name="dam-webhook", daemon=True)

    def profiles_for(self, namespace: str) -> list[ProfileRef]:
        # As webhook_lifecycle builds it: the registry's profiles with their last known status.
        return [
            ProfileRef(e.namespace, e.name, e.spec, e.status)
            for e in self.registry.profiles_in(namespace)
            if e.spec
        ]

    def __enter__(self) -> Webhook:
        self.thread.start()
        app = make_webhook_app(self.profiles_for, SETTINGS)
        serving = serve_webhook(app, "127.0.0.1", self.port, str(self.certfile), str(self.keyfile))
        self.server = asyncio.run_coroutine_threadsafe(serving, self.loop).result(30)
        return self

    async def _close(self) -> None:
        if self.server is not None:
            await self.server.close()
        # Let the TLS connections the API server kept alive finish closing before the loop stops.
        for _ in range(50):
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            if not others:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.1)

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.close()


@pytest.fixture
def webhook(
    control_plane: ControlPlane, tmp_path: Path, kube_namespace: str
) -> Iterator[tuple[Webhook, str]]:
    registry = Registry()
    with Webhook(registry, tmp_path) as hook:
        name = f"dam-actions-{secrets.token_hex(3)}"
        config = webhook_configuration_for_url(
            name, f"https://127.0.0.1:{hook.port}{MUTATE_PATH}", ca_bundle=hook.certs.ca.cert_pem
        )
        # Only this test's namespace: other tests' pods never reach this webhook.
        config["webhooks"][0]["namespaceSelector"] = {
            "matchLabels": {"kubernetes.io/metadata.name": kube_namespace}
        }
        path = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
        control_plane.api("POST", path, config)
        try:
            yield hook, kube_namespace
        finally:
            control_plane.api("DELETE", f"{path}/{name}", ok=(200, 404))


def _register(cp: ControlPlane, registry: Registry, namespace: str, name: str) -> dict[str, Any]:
    """Read the stored profile and (re)register it, as the operator's resume handler does."""
    obj: dict[str, Any] = cp.api("GET", f"{GROUP_PATH}/namespaces/{namespace}/damprofiles/{name}")
    meta = obj["metadata"]
    registry.upsert_profile(
        namespace,
        name,
        uid=meta["uid"],
        generation=meta["generation"],
        spec=parse_spec(obj["spec"]),
        status=obj.get("status"),
    )
    return obj


def _write_status(
    cp: ControlPlane, registry: Registry, namespace: str, name: str, status: dict[str, Any]
) -> dict[str, Any]:
    """Merge-patch the status and keep what the server answered, as ``Evaluator._write`` does."""
    result: dict[str, Any] = cp.api(
        "PATCH",
        f"{GROUP_PATH}/namespaces/{namespace}/damprofiles/{name}/status",
        {"status": status},
        content_type="application/merge-patch+json",
    )
    entry = registry.profile(namespace, name)
    assert entry is not None
    entry.status = dict(result["status"])
    return result


def _create_pod(cp: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "trainer"}},
        "spec": {
            "containers": [
                {
                    "name": "train",
                    "image": "pytorch/pytorch:2",
                    "command": ["python", "train.py"],
                    "resources": {"limits": {"cpu": "2", "memory": "1Gi"}, "requests": {"cpu": "1"}},
                }
            ]
        },
    }
    created: dict[str, Any] = cp.api("POST", f"/api/v1/namespaces/{namespace}/pods", body)
    return created


def _overrides(pod: dict[str, Any]) -> dict[str, int | bool]:
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}
    return parse_overrides(env[ENV_LOADER_OVERRIDES]).settings() if ENV_LOADER_OVERRIDES in env else {}


def _input_bound() -> Verdict:
    return Verdict(
        bottleneck=Bottleneck(
            axis=Axis.DATA,
            regime=Regime.INPUT_BOUND,
            lever="increase-dataloader-workers",
            lever_detail="Raise DataLoader num_workers.",
            confidence=0.9,
        ),
        metrics=WindowMetrics(),
    )


def test_a_pod_created_for_a_profile_in_apply_mode_carries_the_action(
    control_plane: ControlPlane, damprofile_crd: None, webhook: tuple[Webhook, str]
) -> None:
    hook, ns = webhook
    cp = control_plane
    profile = {
        "apiVersion": "dam.mlsys.dev/v1alpha1",
        "kind": "DAMProfile",
        "metadata": {"name": "train"},
        "spec": {
            "selector": {"matchLabels": {"app": "trainer"}},
            "actions": {"mode": "Apply", "warmupWindows": 0},
        },
    }
    cp.api("POST", f"{GROUP_PATH}/namespaces/{ns}/damprofiles", profile)
    obj = _register(cp, hook.registry, ns, "train")
    assert obj["spec"]["actions"]["minConfidence"] == 0.6  # the server filled the CRD's defaults

    # Before any action a new pod gets the probe and nothing else.
    plain = _create_pod(cp, ns, "train-0")
    assert is_instrumented(plain)
    assert ANNOTATION_ACTION not in plain["metadata"]["annotations"] and _overrides(plain) == {}

    # The window step's decision for an input-bound job, written as the evaluator writes it.
    spec = parse_spec(obj["spec"])
    step = act.window_actions(
        spec=spec,
        status={},
        generation=obj["metadata"]["generation"],
        pods=[PodInfo.from_body(plain, True)],
        per_pod={"train-0": Observation(steps_per_second=4.0, data_wait_ratio=0.7, worker_count=0)},
        verdict=_input_bound(),
        when=T0,
    )
    assert step.actions is not None
    stored = _write_status(cp, hook.registry, ns, "train", {"actions": step.actions})
    assert stored["status"]["actions"] == step.actions  # every field survived the schema's pruning

    # The next pod: the API server calls the webhook, validates the mutated pod and stores it.
    carrier = _create_pod(cp, ns, "train-1")
    assert carrier["metadata"]["annotations"][ANNOTATION_ACTION] == "1:applied"
    assert _overrides(carrier) == {"num_workers": 1}
    assert carrier["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "2"  # no CPU action

    # It runs and reports better figures: the action is judged improved, and the server takes it.
    running = cp.mark_pod_running(ns, "train-1", pod_ip="127.0.0.2")
    judged = act.window_actions(
        spec=spec,
        status=stored["status"],
        generation=obj["metadata"]["generation"],
        pods=[PodInfo.from_body(running, True)],
        per_pod={"train-1": Observation(steps_per_second=7.0, data_wait_ratio=0.2, worker_count=1)},
        verdict=_input_bound(),
        when=T0 + dt.timedelta(seconds=60),
    )
    assert judged.actions is not None and judged.actions[0]["outcome"] == "improved"
    stored = _write_status(cp, hook.registry, ns, "train", {"actions": judged.actions})
    assert [a["outcome"] for a in stored["status"]["actions"]] == ["improved", "pending"]
    assert stored["status"]["actions"][0]["after"] == {"stepsPerSecond": 7.0, "dataWaitRatio": 0.2}

    # Back to Recommend: pods created from now on get no action at all.
    cp.api(
        "PATCH",
        f"{GROUP_PATH}/namespaces/{ns}/damprofiles/train",
        {"spec": {"actions": {"mode": "Recommend"}}},
        content_type="application/merge-patch+json",
    )
    _register(cp, hook.registry, ns, "train")
    after = _create_pod(cp, ns, "train-2")
    assert is_instrumented(after)
    assert ANNOTATION_ACTION not in after["metadata"]["annotations"] and _overrides(after) == {}


def test_the_server_refuses_an_actions_spec_the_operator_would_refuse(
    control_plane: ControlPlane, damprofile_crd: None, kube_namespace: str
) -> None:
    for actions in ({"mode": "Sometimes"}, {"maxCpu": "lots"}, {"minConfidence": 2}, {"maxWorkers": 0}):
        profile = {
            "apiVersion": "dam.mlsys.dev/v1alpha1",
            "kind": "DAMProfile",
            "metadata": {"name": "bad"},
            "spec": {"selector": {"matchLabels": {"app": "trainer"}}, "actions": actions},
        }
        status, _ = control_plane._request(
            "POST", f"{GROUP_PATH}/namespaces/{kube_namespace}/damprofiles", profile
        )
        assert status == 422, actions


def test_a_kept_cpu_raise_reaches_the_next_pod_within_max_cpu(
    control_plane: ControlPlane, damprofile_crd: None, webhook: tuple[Webhook, str]
) -> None:
    hook, ns = webhook
    cp = control_plane
    profile = {
        "apiVersion": "dam.mlsys.dev/v1alpha1",
        "kind": "DAMProfile",
        "metadata": {"name": "cpu"},
        "spec": {
            "selector": {"matchLabels": {"app": "trainer"}},
            "actions": {"mode": "Apply", "maxCpu": "3500m"},
        },
    }
    cp.api("POST", f"{GROUP_PATH}/namespaces/{ns}/damprofiles", profile)
    obj = _register(cp, hook.registry, ns, "cpu")
    verdict = _input_bound().model_copy(
        update={"bottleneck": _input_bound().bottleneck.model_copy(update={"lever": "raise-cpu-limit"})}
    )
    step = act.window_actions(
        spec=parse_spec(obj["spec"]),
        status={},
        generation=obj["metadata"]["generation"],
        pods=[],
        per_pod={"old": Observation(steps_per_second=4.0, cpu_limit_cores=2.0, cpu_throttled_ratio=0.4)},
        verdict=verdict,
        when=T0,
    )
    assert step.actions is not None and step.actions[0]["setting"] == {
        "name": "cpu",
        "before": "2",
        "after": "3500m",
    }
    _write_status(cp, hook.registry, ns, "cpu", {"actions": step.actions})
    pod = _create_pod(cp, ns, "train-cpu")
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources["limits"] == {"cpu": "3500m", "memory": "1Gi"}
    assert resources["requests"]["cpu"] == "1"  # a request below the limit stays (Burstable stays Burstable)


def _kubelet_reports_resources(cp: ControlPlane, namespace: str, name: str) -> None:
    """What a kubelet that supports in-place resize writes: each container's resources in its status
    (the API server refuses a resize of a running pod whose status lacks them)."""
    path = f"/api/v1/namespaces/{namespace}/pods/{name}"
    pod = cp.api("GET", path)
    spec = {c["name"]: c.get("resources", {}) for c in pod["spec"]["containers"]}
    for status in pod["status"]["containerStatuses"]:
        status["resources"] = spec[status["name"]]
    cp.api("PUT", f"{path}/status", pod)


def test_in_place_resize_is_sent_to_pods_resize_and_a_refusal_is_an_api_error(
    control_plane: ControlPlane, damprofile_crd: None, kube_namespace: str
) -> None:
    cp, ns = control_plane, kube_namespace
    burstable = {"limits": {"cpu": "1"}, "requests": {"cpu": "500m"}}
    guaranteed = {"limits": {"cpu": "1", "memory": "256Mi"}, "requests": {"cpu": "1", "memory": "256Mi"}}
    for name, resources in (("burstable", burstable), ("guaranteed", guaranteed)):
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "train", "image": "pytorch/pytorch:2", "resources": resources}]},
        }
        cp.api("POST", f"/api/v1/namespaces/{ns}/pods", body)
        cp.mark_pod_running(ns, name)

    async def run() -> None:
        kube = KubeClient(
            lambda: kopf.ConnectionInfo(server=cp.url, ca_path=str(cp.ca_file), token=cp.admin_token),
            retries=0,
        )
        try:
            pod = await kube.get_pod(ns, "burstable")
            patch = resize_patch(pod, "2")
            assert patch == {
                "spec": {"containers": [{"name": "train", "resources": {"limits": {"cpu": "2"}}}]}
            }
            # A node whose kubelet does not report container resources cannot resize: refused.
            with pytest.raises(ApiError) as unsupported:
                await kube.resize_pod(ns, "burstable", patch)
            assert (
                unsupported.value.status == 422 and "without support for resize" in unsupported.value.message
            )
            _kubelet_reports_resources(cp, ns, "burstable")
            resized = await kube.resize_pod(ns, "burstable", patch)
            assert resized["spec"]["containers"][0]["resources"] == {
                "limits": {"cpu": "2"},
                "requests": {"cpu": "500m"},
            }
            # The operator's own patch keeps a Guaranteed pod Guaranteed (requests follow the limit) ...
            _kubelet_reports_resources(cp, ns, "guaranteed")
            pod = await kube.get_pod(ns, "guaranteed")
            patch = resize_patch(pod, "2")
            assert patch is not None
            resized = await kube.resize_pod(ns, "guaranteed", patch)
            assert resized["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "2"
            # ... a change of the QoS class is refused.
            qos = {"spec": {"containers": [{"name": "train", "resources": {"limits": {"cpu": "3"}}}]}}
            with pytest.raises(ApiError) as refused:
                await kube.resize_pod(ns, "guaranteed", qos)
            assert refused.value.status == 422 and "QOS" in refused.value.message.upper()
            with pytest.raises(ApiError) as missing:
                await kube.resize_pod(ns, "no-such-pod", qos)
            assert missing.value.status == 404
        finally:
            await kube.close()

    asyncio.run(run())
