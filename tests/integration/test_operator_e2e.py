"""The acceptance path: profile → webhook injection → real sidecar and PyTorch → verdict in the status.

Against the Kubernetes API stand-in, with the real kubectl, the real ``dam operator``
(a child process, standalone, namespace ``default``, its webhook on 127.0.0.1 and
registered by URL), the real ``dam sidecar`` and a real PyTorch training loop whose
DataLoader is starved on purpose (slow ``__getitem__``, 0 workers), instrumented
automatically through the injected ``PYTHONPATH``/``DAM_PROBE_DIR``. The test plays
the kubelet: it sets the pod Running with podIP 127.0.0.1 and starts its processes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from dam_operator.cluster import metric_names as mn
from dam_sidecar.promtext import parse_snapshot
from tests.support.operator_harness import (
    REPO,
    LocalPod,
    OperatorProcess,
    condition,
    dumps,
    events_for,
    free_port,
    set_pod_running,
    wait_for,
)
from tests.support.standin import StandIn

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


@pytest.fixture
def api() -> Iterator[StandIn]:
    with StandIn.running(subprocess=True) as api:
        assert api.kubectl("apply", "-f", str(REPO / "crds")).returncode == 0
        yield api


def test_starved_training_pod_is_instrumented_and_diagnosed_data_bound(api: StandIn, tmp_path: Path) -> None:
    op = OperatorProcess(api, tmp_path).start()
    pod_proc: LocalPod | None = None
    try:
        port = free_port()
        applied = api.kubectl("apply", "-f", "-", input=profile_manifest(port))
        assert applied.returncode == 0, applied.stderr

        # Wait until the operator has registered the profile (its first status write),
        # so the webhook knows it when the pod is created.
        wait_for(lambda: condition(api.get("damp", "default", PROFILE), "SpecValid"), 30, "the first status")

        created = api.kubectl("apply", "-f", "-", input=json.dumps(TRAINING_POD))
        assert created.returncode == 0, created.stderr
        pod = api.get("pods", "default", "trainer-0")

        # The webhook injected the native sidecar, the probe volume, the env and the shared PID namespace.
        spec = pod["spec"]
        sidecars = [c for c in spec.get("initContainers", []) if c["name"] == "dam-sidecar"]
        assert sidecars and sidecars[0]["restartPolicy"] == "Always", dumps(spec)
        assert str(port) in sidecars[0]["command"]
        assert any(v["name"] == "dam-probe" and "emptyDir" in v for v in spec["volumes"]), dumps(spec)
        train = next(c for c in spec["containers"] if c["name"] == "train")
        env = {e["name"]: e.get("value") for e in train["env"]}
        assert env["DAM_PROBE_DIR"] and env["PYTHONPATH"].split(":")[0] == env["DAM_PROBE_DIR"]
        assert spec["shareProcessNamespace"] is True

        # Play the kubelet: run the pod's processes here, then report it Running on 127.0.0.1.
        pod_proc = LocalPod(pod, tmp_path, port)
        pod_proc.start(
            ["examples/train.py", "--scenario", "starved", "--seconds", "300", "--sample-delay-ms", "15"]
        )
        pod_proc.wait_reporting()
        set_pod_running(api, "default", "trainer-0")

        waited = api.kubectl(
            "wait",
            "--for=jsonpath={.status.bottleneck.axis}=Data",
            f"damp/{PROFILE}",
            "--timeout=60s",
            timeout=90,
        )
        profile = api.get("damp", "default", PROFILE)
        assert waited.returncode == 0, f"{waited.stderr}\n{dumps(profile.get('status'))}\n{op.log()}"

        status = profile["status"]
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
            lambda: events_for(api, "default", PROFILE, "BottleneckChanged"), 20, "a BottleneckChanged Event"
        )
        assert any("input-bound" in e["message"] for e in changed), changed

        table = api.kubectl("get", "damp")
        header = table.stdout.splitlines()[0].split()
        assert header[:5] == ["NAME", "AXIS", "REGIME", "LEVER", "CONFIDENCE"], table.stdout
        assert "Data" in table.stdout and "input-bound" in table.stdout

        metrics = parse_snapshot(op.metrics(), "operator")
        verdict = {dict(s.labels)["axis"] for s in metrics.samples(mn.PROFILE_VERDICT)}
        assert verdict == {"Data"}
        assert metrics.samples(mn.OPERATOR_WEBHOOK_REQUESTS_TOTAL)
    except AssertionError:
        if pod_proc is not None:
            print(pod_proc.logs())
        print(op.log())
        raise
    finally:
        if pod_proc is not None:
            pod_proc.stop()
        op.stop()
