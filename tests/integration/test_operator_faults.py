"""The operator under faults: killed mid-evaluation, API errors and dropped watches,
pods created while the webhook is down, invalid specs, misbehaving sidecars.

The real ``dam operator`` runs as a child process against the API stand-in; the
training pods' sidecars are fakes on loopback (their regime can be switched and
they can be made slow, down or garbage), served from this process.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from dam_operator.cluster import metric_names as mn
from dam_sidecar.promtext import parse_snapshot
from tests.support.fake_sidecar import COMPUTE, FakeJob, FakeSidecars, ThreadedFakeSidecars
from tests.support.operator_harness import (
    REPO,
    OperatorProcess,
    condition,
    dumps,
    events_for,
    set_pod_running,
    wait_for,
)
from tests.support.standin import StandIn

pytestmark = pytest.mark.slow

WINDOW = 5


def profile(name: str, port: int, labels: dict[str, str], **spec: Any) -> str:
    body: dict[str, Any] = {
        "selector": {"matchLabels": labels},
        "sampling": {"intervalSeconds": 1},
        "evaluation": {"windowSeconds": WINDOW, "hysteresisWindows": 1},
        "sidecar": {"port": port},
    }
    body.update(spec)
    return yaml.safe_dump(
        {
            "apiVersion": "dam.mlsys.dev/v1alpha1",
            "kind": "DAMProfile",
            "metadata": {"name": name},
            "spec": body,
        }
    )


def pod(name: str, labels: dict[str, str]) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": labels},
            "spec": {"containers": [{"name": "train", "image": "python:3.11-slim", "command": ["python"]}]},
        }
    )


def apply(api: StandIn, manifest: str) -> None:
    result = api.kubectl("apply", "-f", "-", input=manifest)
    assert result.returncode == 0, result.stderr


def status(api: StandIn, name: str) -> dict[str, Any]:
    return dict(api.get("damp", "default", name).get("status") or {})


def axis(api: StandIn, name: str) -> str | None:
    return (status(api, name).get("bottleneck") or {}).get("axis")


@pytest.fixture
def api() -> Iterator[StandIn]:
    with StandIn.running(subprocess=True) as api:
        assert api.kubectl("apply", "-f", str(REPO / "crds")).returncode == 0
        yield api


@pytest.fixture
def sidecars() -> Iterator[FakeSidecars]:
    # All addresses: pods get distinct loopback IPs (127.0.0.x) and are told apart by them.
    with ThreadedFakeSidecars("0.0.0.0") as sidecars:
        yield sidecars


def test_killed_mid_evaluation_the_operator_converges_after_restart(
    api: StandIn, sidecars: FakeSidecars, tmp_path: Path
) -> None:
    job = sidecars.add("127.0.0.1", FakeJob())
    op = OperatorProcess(api, tmp_path, env={"DAM_SCRAPE_TIMEOUT_SECONDS": "3"}).start()
    try:
        apply(api, profile("p", sidecars.port, {"app": "t"}))
        wait_for(lambda: condition(api.get("damp", "default", "p"), "SpecValid"), 30, "registration")
        apply(api, pod("trainer-0", {"app": "t"}))
        set_pod_running(api, "default", "trainer-0")
        wait_for(lambda: axis(api, "p") == "Data", 40, "the Data verdict")
        assert len(events_for(api, "default", "p", "BottleneckChanged")) == 1

        # Kill it while an evaluation waits on a slow sidecar.
        job.fault, job.slow_seconds = "slow", 2.5
        seen = sidecars.requests
        wait_for(lambda: sidecars.requests > seen, 3 * WINDOW, "an evaluation to start scraping", 0.02)
        op.kill()

        # While it is down: the job becomes compute-bound, a pod is created that the webhook
        # (registered, failurePolicy Ignore, but not answering) cannot instrument, and an
        # older operator's condition lingers in the status.
        job.fault = "none"
        job.switch(COMPUTE)
        apply(api, pod("late-0", {"app": "t"}))
        late = api.get("pods", "default", "late-0")
        assert not any(c["name"] == "dam-sidecar" for c in late["spec"].get("initContainers", []))
        set_pod_running(api, "default", "late-0", ip="127.0.0.9")
        stale = status(api, "p")["conditions"] + [
            {"type": "Ready", "status": "True", "reason": "Old", "lastTransitionTime": "2020-01-01T00:00:00Z"}
        ]
        api.patch("damp", "default", "p", {"status": {"conditions": stale}}, subresource="status")
        before = status(api, "p")["lastEvaluationTime"]

        op.start()
        wait_for(lambda: axis(api, "p") == "Machine", 6 * WINDOW, "the Machine verdict after the restart")
        final = api.get("damp", "default", "p")
        st = final["status"]
        assert st["lastEvaluationTime"] > before
        assert "Ready" not in {c["type"] for c in st["conditions"]}, dumps(st)
        instrumented = condition(final, "Instrumented")
        assert instrumented is not None and instrumented["status"] == "False"
        assert instrumented["reason"] == "PodsNotInstrumented" and "late-0" in instrumented["message"]
        assert st["pods"]["notInstrumented"] == ["late-0"]
        assert st["pods"]["matched"] == 2 and st["pods"]["instrumented"] == 1
        assert condition(final, "Diagnosed")["status"] == "True"  # type: ignore[index]
        messages = sorted(e["message"] for e in events_for(api, "default", "p", "BottleneckChanged"))
        assert len(messages) == 2, messages  # no duplicate Data event after the restart
        assert messages[0].startswith("Bottleneck is Data (input-bound)"), messages
        assert messages[1].startswith("Bottleneck is Machine (compute-bound)") and "was Data" in messages[1]
    except AssertionError:
        print(op.log())
        raise
    finally:
        op.stop()


def test_api_errors_and_dropped_watches_are_survived(
    api: StandIn, sidecars: FakeSidecars, tmp_path: Path
) -> None:
    sidecars.add("127.0.0.1", FakeJob())
    op = OperatorProcess(api, tmp_path, env={"DAM_API_BACKOFF_SECONDS": "0.2"}).start()
    try:
        apply(api, profile("p", sidecars.port, {"app": "t"}))
        apply(api, pod("trainer-0", {"app": "t"}))
        set_pod_running(api, "default", "trainer-0")
        wait_for(lambda: axis(api, "p") == "Data", 40, "the Data verdict")

        # Status writes fail: 503 twice, then 429 (Retry-After), then 500; the client retries.
        first = status(api, "p")["lastEvaluationTime"]
        api.inject_fault(r"/damprofiles/p/status", status=503, count=2, method="PATCH")
        api.inject_fault(r"/damprofiles/p/status", status=429, count=1, method="PATCH")
        api.inject_fault(r"/damprofiles/p/status", status=500, count=1, method="PATCH")
        wait_for(
            lambda: status(api, "p")["lastEvaluationTime"] > first, 4 * WINDOW, "a write after the errors"
        )

        # Watches end abruptly, then the history is compacted (410 Gone on resume).
        api.drop_watches(abrupt=True)
        api.expire_watches()
        apply(api, profile("q", sidecars.port, {"app": "other"}))
        apply(api, pod("other-0", {"app": "other"}))
        wait_for(
            lambda: (status(api, "q").get("pods") or {}).get("matched") == 1, 60, "the new profile and pod"
        )
        other = api.get("pods", "default", "other-0")
        assert any(c["name"] == "dam-sidecar" for c in other["spec"].get("initContainers", []))
        # The stream of every kind came back: a status change of the old profile is still applied.
        later = status(api, "p")["lastEvaluationTime"]
        wait_for(lambda: status(api, "p")["lastEvaluationTime"] > later, 4 * WINDOW, "evaluations to go on")
        assert httpx.get(f"http://127.0.0.1:{op.metrics_port}/healthz").status_code == 200
        assert op.proc is not None and op.proc.poll() is None
    except AssertionError:
        print(op.log())
        raise
    finally:
        op.stop()


def test_misbehaving_sidecars_are_reported_and_do_not_stop_diagnosis(
    api: StandIn, sidecars: FakeSidecars, tmp_path: Path
) -> None:
    good = sidecars.add("127.0.0.1", FakeJob())
    bad = sidecars.add("127.0.0.2", FakeJob())
    op = OperatorProcess(api, tmp_path, env={"DAM_SCRAPE_TIMEOUT_SECONDS": "1"}).start()
    try:
        apply(api, profile("p", sidecars.port, {"app": "t"}))
        for name, ip in (("a-0", "127.0.0.1"), ("b-0", "127.0.0.2")):
            apply(api, pod(name, {"app": "t"}))
            set_pod_running(api, "default", name, ip=ip)
        wait_for(lambda: axis(api, "p") == "Data", 40, "the Data verdict")
        wait_for(lambda: status(api, "p")["pods"]["reporting"] == 2, 4 * WINDOW, "both pods reporting")
        says = {"garbage": "not Prometheus text", "slow": "did not answer", "down": "HTTP 503"}
        for fault, text in says.items():
            bad.fault = fault  # type: ignore[assignment]
            bad.slow_seconds = 3.0

            def reported(text: str = text) -> bool:
                cond = condition(api.get("damp", "default", "p"), "Reporting")
                return bool(
                    cond
                    and cond["status"] == "False"
                    and "b-0: " in cond["message"]
                    and text in cond["message"]
                )

            wait_for(reported, 4 * WINDOW, f"the {fault} sidecar to be reported")
            st = status(api, "p")
            assert st["pods"]["reporting"] == 1, dumps(st)
            assert st["bottleneck"]["axis"] == "Data"  # the good pod still tells
        assert good.fault == "none"
        metrics = parse_snapshot(op.metrics(), "operator")
        reasons = {dict(s.labels)["reason"] for s in metrics.samples(mn.OPERATOR_EVALUATION_ERRORS_TOTAL)}
        assert {"scrape-garbage", "scrape-timeout", "scrape-http-status"} <= reasons, reasons
    except AssertionError:
        print(op.log())
        raise
    finally:
        op.stop()


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"sampling": {"intervalSeconds": -1}}, "intervalSeconds"),
        ({"sampling": {"intervalSeconds": "fast"}}, "intervalSeconds"),
        ({"sidecar": {"image": "x" * 5000}}, "image"),
    ],
)
def test_schema_invalid_specs_are_refused_by_the_api_server(
    api: StandIn, spec: dict[str, Any], field: str
) -> None:
    result = api.kubectl("apply", "-f", "-", input=profile("bad", 9450, {"app": "t"}, **spec))
    assert result.returncode != 0
    assert field in result.stderr, result.stderr


def test_semantically_invalid_specs_get_a_clear_condition_and_no_crash_loop(
    api: StandIn, tmp_path: Path
) -> None:
    op = OperatorProcess(api, tmp_path, webhook=False).start()
    try:
        # Passes the CRD schema, but the window cannot hold two samples.
        apply(api, profile("p", 9450, {"app": "t"}, sampling={"intervalSeconds": 10}))

        def invalid(generation: int) -> dict[str, Any] | None:
            cond = condition(api.get("damp", "default", "p"), "SpecValid")
            ok = cond and cond["status"] == "False" and cond.get("observedGeneration") == generation
            return cond if ok else None

        cond = wait_for(lambda: invalid(1), 30, "the SpecValid=False condition")
        assert cond["reason"] == "InvalidSpec"
        assert "windowSeconds" in cond["message"] and "intervalSeconds" in cond["message"]
        warning = wait_for(lambda: events_for(api, "default", "p", "InvalidSpec"), 20, "an InvalidSpec Event")
        assert warning[0]["type"] == "Warning"

        # An update that is wrong in another way: thresholds that cross.
        apply(api, profile("p", 9450, {"app": "t"}, thresholds={"dataWaitFine": 0.5, "dataWaitSuspect": 0.2}))
        cond = wait_for(lambda: invalid(2), 30, "the second SpecValid=False condition")
        assert "dataWaitFine" in cond["message"] and "dataWaitSuspect" in cond["message"]
        assert "bottleneck" not in status(api, "p")

        # Fixing the spec clears it (the update handler runs; no retries of the bad one in between).
        apply(api, profile("p", 9450, {"app": "t"}))

        def valid() -> bool:
            c = condition(api.get("damp", "default", "p"), "SpecValid")
            return bool(c and c["status"] == "True")

        wait_for(valid, 30, "SpecValid=True after the fix")
        st = status(api, "p")
        assert st["observedGeneration"] == 3
        assert op.proc is not None and op.proc.poll() is None
        log = op.log()
        assert "Traceback" not in log, log
        assert len(events_for(api, "default", "p", "InvalidSpec")) == 2  # one per bad generation
    except AssertionError:
        print(op.log())
        raise
    finally:
        op.stop()


def test_webhook_that_cannot_start_does_not_stop_the_operator(
    api: StandIn, sidecars: FakeSidecars, tmp_path: Path
) -> None:
    # The operator's namespace does not exist: the webhook certificate Secret cannot be
    # written, so the webhook cannot start. The operator must go on diagnosing, and a pod
    # whose sidecar was added by hand (here: a fake sidecar on its IP) is honoured.
    sidecars.add("127.0.0.1", FakeJob())
    op = OperatorProcess(api, tmp_path, env={"DAM_OPERATOR_NAMESPACE": "no-such-namespace"})
    op.start(wait=False)
    try:
        apply(api, profile("p", sidecars.port, {"app": "t"}))
        apply(api, pod("trainer-0", {"app": "t"}))
        set_pod_running(api, "default", "trainer-0")
        try:
            wait_for(lambda: axis(api, "p") == "Data", 40, "the Data verdict without a webhook")
        except AssertionError:
            raise AssertionError(dumps(status(api, "p"))) from None
        assert "pod webhook not started" in op.log()
        pods = status(api, "p")["pods"]
        assert pods["instrumented"] == 1 and pods["reporting"] == 1, dumps(pods)
        assert op.proc is not None and op.proc.poll() is None
    finally:
        op.stop()
