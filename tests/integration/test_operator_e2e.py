"""The acceptance path on a real control plane: profile → webhook injection → real sidecar and
PyTorch → verdict in the status, with the operator holding exactly the chart's RBAC.

kube-apiserver + etcd (tests/support/kubecluster.py), the real kubectl, the real ``dam operator``
(a child process, cluster-wide as the chart installs it by default) running as the chart's
ServiceAccount with only the ClusterRoles/Roles that ``charts/dam-operator`` renders, its settings
taken from the chart's Deployment; its webhook on 127.0.0.1, called by the API server through the
chart's MutatingWebhookConfiguration (pointed at that URL, its caBundle filled in by the operator).
The operator talks to the API server through a recording proxy, so that any request the server
refused (a verb missing from the chart) fails the test. The real ``dam sidecar`` and a real
PyTorch training loop whose DataLoader is starved on purpose run here; there is no kubelet, so the
test reports the pod Running on 127.0.0.1 through ``pods/status``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from dam_contract.snapshot import parse_snapshot
from dam_operator.cluster.steps import metric_names as mn
from tests.support.faultproxy import FaultProxy, refused
from tests.support.kubecluster import ControlPlane
from tests.support.operator_harness import (
    REPO,
    LocalPod,
    OperatorProcess,
    condition,
    dumps,
    events_for,
    free_port,
    install_chart,
    profile_of,
    wait_for,
)

pytestmark = pytest.mark.slow

PROFILE = "train-profile"


def profile_manifest(sidecar_port: int) -> str:
    """examples/damprofile.yaml with a short window and this test's sidecar port."""
    doc = yaml.safe_load((REPO / "examples" / "damprofile.yaml").read_text())
    doc["spec"]["evaluation"] = {"windowSeconds": 5, "hysteresisWindows": 2}
    doc["spec"]["sampling"] = {"intervalSeconds": 1}
    doc["spec"]["sidecar"]["port"] = sidecar_port
    return yaml.safe_dump(doc)


TRAINING_POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "trainer-0", "labels": {"app": "trainer"}},
    "spec": {
        "restartPolicy": "Never",
        "containers": [
            {"name": "train", "image": "python:3.11-slim", "command": ["python", "examples/train.py"]}
        ],
    },
}


def test_starved_training_pod_is_instrumented_and_diagnosed_data_bound(
    control_plane: ControlPlane, kube_namespace: str, system_namespace: str, tmp_path: Path
) -> None:
    cp, ns = control_plane, kube_namespace
    chart = install_chart(cp, system_namespace)  # the chart's defaults: cluster-wide
    proxy = FaultProxy(cp.url, cp.ssl_context()).__enter__()
    kubeconfig = proxy.kubeconfig(chart.kubeconfig, tmp_path / "operator.kubeconfig")
    op = OperatorProcess(
        cp,
        tmp_path,
        namespace=None,
        operator_namespace=system_namespace,
        kubeconfig=kubeconfig,
        env=chart.env(),
    )
    pod_proc: LocalPod | None = None
    try:
        # Helm owns the webhook configuration (DAM_WEBHOOK_MANAGE_CONFIGURATION=false): apply the
        # chart's, by URL; the operator fills in its caBundle.
        assert chart.env()["DAM_WEBHOOK_MANAGE_CONFIGURATION"] == "false"
        chart.apply(chart.webhook_configuration(op.webhook_url))
        op.start()

        port = free_port()
        cp.kubectl("apply", "-n", ns, "-f", "-", input=profile_manifest(port))
        # The operator has registered the profile (its first status write): the webhook knows it.
        wait_for(lambda: condition(profile_of(cp, ns, PROFILE), "SpecValid"), 30, "the first status")

        # kubectl → API server → the operator's webhook → JSONPatch → the server validates the
        # mutated Pod (and runs its own admission after it) → stored.
        cp.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(TRAINING_POD))
        pod = cp.api("GET", f"/api/v1/namespaces/{ns}/pods/trainer-0")
        spec = pod["spec"]
        sidecars = [c for c in spec.get("initContainers", []) if c["name"] == "dam-sidecar"]
        assert sidecars and sidecars[0]["restartPolicy"] == "Always", dumps(spec)
        assert str(port) in sidecars[0]["command"]
        assert any(v["name"] == "dam-probe" and "emptyDir" in v for v in spec["volumes"]), dumps(spec)
        train = next(c for c in spec["containers"] if c["name"] == "train")
        env = {e["name"]: e.get("value") for e in train["env"]}
        assert env["DAM_PROBE_DIR"] and env["PYTHONPATH"].split(":")[0] == env["DAM_PROBE_DIR"]
        assert "shareProcessNamespace" not in spec  # not asked for: the probe publishes the figures

        # Play the kubelet: run the pod's processes here, then report it Running on 127.0.0.1.
        pod_proc = LocalPod(pod, tmp_path, port)
        pod_proc.start(
            ["examples/train.py", "--scenario", "starved", "--seconds", "300", "--sample-delay-ms", "15"]
        )
        pod_proc.wait_reporting()
        cp.mark_pod_running(ns, "trainer-0")

        waited = cp.kubectl(
            "wait",
            "-n",
            ns,
            "--for=jsonpath={.status.bottleneck.axis}=Data",
            f"damp/{PROFILE}",
            "--timeout=60s",
            check=False,
            timeout_s=90,
        )
        profile = profile_of(cp, ns, PROFILE)
        assert waited.returncode == 0, f"{waited.stderr}\n{dumps(profile.get('status'))}\n{op.log()}"

        status: dict[str, Any] = profile["status"]
        assert status["bottleneck"]["regime"] == "input-bound"
        assert status["bottleneck"]["lever"]
        assert status["metrics"]["dataWaitRatio"] > 0.3
        assert status["pods"] == {"matched": 1, "instrumented": 1, "reporting": 1}
        assert status["observedGeneration"] == profile["metadata"]["generation"]
        assert status["lastEvaluationTime"]
        diagnosed = condition(profile, "Diagnosed")
        assert diagnosed is not None and diagnosed["status"] == "True", dumps(status)
        assert condition(profile, "Instrumented")["status"] == "True"  # type: ignore[index]

        changed = wait_for(
            lambda: events_for(cp, ns, PROFILE, "BottleneckChanged"), 20, "a BottleneckChanged Event"
        )
        assert any("input-bound" in e["message"] for e in changed), changed

        # Goodput over the job's life, from the real probe's counters: a starved loader's time lost
        # to data wait; a CPU-only job holds no accelerator.
        goodput = wait_for(
            lambda: (profile_of(cp, ns, PROFILE).get("status") or {}).get("goodput"), 30, "status.goodput"
        )
        assert 0 < goodput["ratio"] < 0.7, dumps(goodput)
        assert goodput["badputSeconds"]["dataWait"] > goodput["productiveSeconds"] * 0.5, dumps(goodput)
        assert goodput["badputSeconds"]["startup"] > 0, dumps(goodput)

        # The server's own Table, from the CRD's printer columns.
        rows = cp.kubectl("get", "damp", "-n", ns).stdout.splitlines()
        assert rows[0].split() == ["NAME", "AXIS", "REGIME", "LEVER", "CONFIDENCE", "GOODPUT", "AGE"], rows
        assert rows[1].split()[:3] == [PROFILE, "Data", "input-bound"], rows

        metrics = parse_snapshot(op.metrics(), "operator")
        verdict = {dict(s.labels)["axis"] for s in metrics.samples(mn.PROFILE_VERDICT)}
        assert verdict == {"Data"}
        webhook_results = {
            dict(s.labels)["result"]
            for s in metrics.samples(mn.OPERATOR_WEBHOOK_REQUESTS_TOTAL)
            if s.value > 0
        }
        assert "injected" in webhook_results, webhook_results

        # Everything the operator did, it did with the chart's RBAC: nothing was refused.
        assert refused(proxy.snapshot()) == [], refused(proxy.snapshot())
        op.assert_alive()
    except AssertionError:
        if pod_proc is not None:
            print(pod_proc.logs())
        print(op.log())
        raise
    finally:
        if pod_proc is not None:
            pod_proc.stop()
        op.close()
        proxy.__exit__(None, None, None)
        chart.uninstall()
