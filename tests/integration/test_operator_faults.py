"""The operator under faults, on a real control plane: killed mid-evaluation; API errors, slow
answers, lost answers, dropped and expired watches (a fault-injecting proxy between the operator
and the API server); the API server and etcd restarted mid-run; pods created while the webhook is
down; invalid specs; misbehaving sidecars.

The real ``dam operator`` runs as a child process; the training pods' sidecars are fakes on
loopback (their regime can be switched and they can be made slow, down or garbage), served from
this process; pods get distinct loopback IPs through ``pods/status``, as a kubelet would report.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from dam_contract.snapshot import parse_snapshot
from dam_operator.cluster.steps import metric_names as mn
from tests.support.fake_sidecar import COMPUTE, FakeJob, FakeSidecars, ThreadedFakeSidecars
from tests.support.faultproxy import Fault, FaultProxy
from tests.support.kubecluster import ControlPlane
from tests.support.operator_harness import (
    OperatorProcess,
    condition,
    dumps,
    ensure_crds,
    events_for,
    log_on_failure,
    operator_namespace,
    profile_of,
    wait_for,
)

WINDOW = 5
MERGE = "application/merge-patch+json"


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


class Cluster:
    """The control plane seen from one test's namespace."""

    def __init__(self, cp: ControlPlane, namespace: str, system: str) -> None:
        self.cp, self.ns, self.system = cp, namespace, system

    def apply(self, manifest: str) -> None:
        self.cp.kubectl("apply", "-n", self.ns, "-f", "-", input=manifest)

    def running(self, name: str, ip: str = "127.0.0.1") -> None:
        self.cp.mark_pod_running(self.ns, name, pod_ip=ip)

    def get(self, name: str) -> dict[str, Any]:
        return profile_of(self.cp, self.ns, name)

    def status(self, name: str) -> dict[str, Any]:
        return dict(self.get(name).get("status") or {})

    def axis(self, name: str) -> str | None:
        return (self.status(name).get("bottleneck") or {}).get("axis")

    def events(self, name: str, reason: str | None = None) -> list[dict[str, Any]]:
        return events_for(self.cp, self.ns, name, reason)

    def pod(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.cp.api("GET", f"/api/v1/namespaces/{self.ns}/pods/{name}")
        return found

    def operator(self, workdir: Path, **kw: Any) -> OperatorProcess:
        kw.setdefault("operator_namespace", self.system)
        return OperatorProcess(self.cp, workdir, namespace=self.ns, **kw)


@pytest.fixture
def cluster(control_plane: ControlPlane, kube_namespace: str) -> Iterator[Cluster]:
    ensure_crds(control_plane)
    with operator_namespace(control_plane) as system:
        yield Cluster(control_plane, kube_namespace, system)


@pytest.fixture
def sidecars() -> Iterator[FakeSidecars]:
    # All addresses: pods get distinct loopback IPs (127.0.0.x) and are told apart by them.
    with ThreadedFakeSidecars("0.0.0.0") as sidecars:
        yield sidecars


def bottleneck_messages(c: Cluster, name: str) -> list[str]:
    return sorted(e["message"] for e in c.events(name, "BottleneckChanged"))


@pytest.mark.slow
def test_killed_mid_evaluation_the_operator_converges_after_restart(
    cluster: Cluster, sidecars: FakeSidecars, tmp_path: Path
) -> None:
    c = cluster
    job = sidecars.add("127.0.0.1", FakeJob())
    op = c.operator(tmp_path, env={"DAM_SCRAPE_TIMEOUT_SECONDS": "3"}).start()
    with log_on_failure(op):
        c.apply(profile("p", sidecars.port, {"app": "t"}))
        wait_for(lambda: condition(c.get("p"), "SpecValid"), 30, "registration")
        c.apply(pod("trainer-0", {"app": "t"}))
        c.running("trainer-0")
        wait_for(lambda: c.axis("p") == "Data", 40, "the Data verdict")
        assert len(c.events("p", "BottleneckChanged")) == 1

        # Kill it while an evaluation waits on a slow sidecar.
        job.fault, job.slow_seconds = "slow", 2.5
        seen = sidecars.requests
        wait_for(lambda: sidecars.requests > seen, 3 * WINDOW, "an evaluation to start scraping", 0.02)
        op.kill()

        # While it is down: the job becomes compute-bound; a pod is created that the webhook
        # (still registered, failurePolicy Ignore, nobody answering) cannot instrument: the API
        # server admits it unchanged; and an older operator's condition lingers in the status.
        job.fault = "none"
        job.switch(COMPUTE)
        c.apply(pod("late-0", {"app": "t"}))
        assert op.webhook_registered()
        late = c.pod("late-0")
        assert not any(x["name"] == "dam-sidecar" for x in late["spec"].get("initContainers", []))
        c.running("late-0", ip="127.0.0.9")
        stale = [
            *c.status("p")["conditions"],
            {
                "type": "Ready",
                "status": "True",
                "reason": "Old",
                "lastTransitionTime": "2020-01-01T00:00:00Z",
            },
        ]
        c.cp.api(
            "PATCH",
            f"/apis/dam.mlsys.dev/v1alpha1/namespaces/{c.ns}/damprofiles/p/status",
            {"status": {"conditions": stale}},
            content_type=MERGE,
        )
        before = c.status("p")["lastEvaluationTime"]

        op.start()
        wait_for(lambda: c.axis("p") == "Machine", 6 * WINDOW, "the Machine verdict after the restart")
        final = c.get("p")
        st = final["status"]
        assert st["lastEvaluationTime"] > before
        assert "Ready" not in {x["type"] for x in st["conditions"]}, dumps(st)
        instrumented = condition(final, "Instrumented")
        assert instrumented is not None and instrumented["status"] == "False"
        assert instrumented["reason"] == "PodsNotInstrumented" and "late-0" in instrumented["message"]
        assert st["pods"]["notInstrumented"] == ["late-0"]
        assert st["pods"]["matched"] == 2 and st["pods"]["instrumented"] == 1
        assert condition(final, "Diagnosed")["status"] == "True"  # type: ignore[index]
        messages = bottleneck_messages(c, "p")
        assert len(messages) == 2, messages  # no duplicate Data event after the restart
        assert messages[0].startswith("Bottleneck is Data (input-bound)"), messages
        assert messages[1].startswith("Bottleneck is Machine (compute-bound)") and "was Data" in messages[1]


@pytest.mark.slow
def test_api_errors_lost_answers_and_broken_watches_are_survived(
    cluster: Cluster, sidecars: FakeSidecars, tmp_path: Path
) -> None:
    c = cluster
    job = sidecars.add("127.0.0.1", FakeJob())
    with FaultProxy(c.cp.url, c.cp.ssl_context()) as proxy:
        kubeconfig = proxy.kubeconfig(c.cp.kubeconfig, tmp_path / "proxy.kubeconfig")
        env = {"DAM_API_BACKOFF_SECONDS": "0.2", "DAM_API_TIMEOUT_SECONDS": "2"}
        op = c.operator(tmp_path, kubeconfig=kubeconfig, env=env).start()
        try:
            # The first Event's answer is lost after the server stored it: the retry must not
            # post it twice.
            lost = proxy.add(Fault("lost", r"/events$", method="POST"))
            c.apply(profile("p", sidecars.port, {"app": "t"}))
            c.apply(pod("trainer-0", {"app": "t"}))
            c.running("trainer-0")
            wait_for(lambda: c.axis("p") == "Data", 40, "the Data verdict")
            wait_for(lambda: lost.hits, 10, "the Event whose answer is lost")
            wait_for(lambda: c.events("p", "BottleneckChanged"), 10, "the BottleneckChanged Event")

            # The job becomes compute-bound, and the status write that says so fails: 503 twice,
            # 429 with Retry-After, 500, then an answer slower than the client's timeout.
            faults = [
                proxy.add(Fault("status", r"/damprofiles/p/status", method="PATCH", status=503, count=2)),
                proxy.add(
                    Fault("status", r"/damprofiles/p/status", method="PATCH", status=429, retry_after=1)
                ),
                proxy.add(Fault("status", r"/damprofiles/p/status", method="PATCH", status=500)),
                proxy.add(Fault("delay", r"/damprofiles/p/status", method="PATCH", delay_s=3)),
            ]
            job.switch(COMPUTE)
            wait_for(lambda: c.axis("p") == "Machine", 8 * WINDOW, "the Machine verdict through the errors")
            assert [f.hits for f in faults] == [2, 1, 1, 1]

            # Every watch stream is cut; the next watches are told their resourceVersion is gone
            # (410), then the API refuses them for a moment (503): kopf must list again and resume.
            proxy.add(Fault("gone", watch=True, count=3))
            proxy.add(Fault("status", watch=True, status=503, count=2))
            assert proxy.drop_watches() >= 2
            c.apply(profile("q", sidecars.port, {"app": "other"}))
            wait_for(
                lambda: condition(c.get("q"), "SpecValid"), 60, "the new profile seen through the faults"
            )
            c.apply(pod("other-0", {"app": "other"}))
            wait_for(
                lambda: (c.status("q").get("pods") or {}).get("matched") == 1, 60, "the new profile and pod"
            )
            other = c.pod("other-0")
            assert any(x["name"] == "dam-sidecar" for x in other["spec"].get("initContainers", []))
            # The old profile's stream came back too: its new generation is seen and acted on.
            c.apply(profile("p", sidecars.port, {"app": "t"}, thresholds={"dataWaitSuspect": 0.2}))
            wait_for(lambda: c.status("p").get("observedGeneration") == 2, 6 * WINDOW, "generation 2 of p")

            messages = bottleneck_messages(c, "p")
            assert len(messages) == 2, messages  # one per change: none doubled by the lost answer
            assert httpx.get(f"http://127.0.0.1:{op.metrics_port}/healthz").status_code == 200
            assert op.starts == 1
            op.assert_alive()
        except AssertionError:
            print(op.log())
            print("\n".join(map(str, proxy.snapshot()[-60:])))
            raise
        finally:
            op.close()


def test_the_start_up_listing_comes_in_pages_and_misses_no_profile_or_pod(
    cluster: Cluster, sidecars: FakeSidecars, tmp_path: Path
) -> None:
    c = cluster
    for i in range(5):
        c.apply(profile(f"p{i}", sidecars.port, {"app": "t"}))
    for i in range(3):
        c.apply(pod(f"trainer-{i}", {"app": "t"}))
    with FaultProxy(c.cp.url, c.cp.ssl_context()) as proxy:
        kubeconfig = proxy.kubeconfig(c.cp.kubeconfig, tmp_path / "proxy.kubeconfig")
        op = c.operator(tmp_path, kubeconfig=kubeconfig, env={"DAM_LIST_CHUNK_SIZE": "2"}).start()
        with log_on_failure(op):
            for i in range(5):
                wait_for(
                    lambda i=i: (c.status(f"p{i}").get("pods") or {}).get("matched") == 3,  # type: ignore[misc]
                    40,
                    f"profile p{i} counting the 3 pods",
                )
            lists = [r for r in proxy.snapshot() if r.method == "GET" and not r.watch]
            for resource in ("damprofiles", "pods"):
                pages = [r for r in lists if r.path.endswith(f"/{resource}")]
                assert pages and all("limit=2" in r.query for r in pages), pages
                assert any("continue=" in r.query for r in pages), f"{resource}: a second page"
            op.assert_alive()


@pytest.mark.slow
def test_api_server_and_etcd_restarts_mid_run_lose_nothing(
    cluster: Cluster, sidecars: FakeSidecars, tmp_path: Path
) -> None:
    c = cluster
    job = sidecars.add("127.0.0.1", FakeJob())
    op = c.operator(tmp_path, env={"DAM_API_BACKOFF_SECONDS": "0.5"}).start()
    with log_on_failure(op):
        c.apply(profile("p", sidecars.port, {"app": "t"}))
        c.apply(pod("trainer-0", {"app": "t"}))
        c.running("trainer-0")
        wait_for(lambda: c.axis("p") == "Data", 40, "the Data verdict")
        kept = c.status("p")

        c.cp.restart_etcd()
        job.switch(COMPUTE)
        c.cp.restart_apiserver()
        wait_for(lambda: c.axis("p") == "Machine", 8 * WINDOW, "the Machine verdict after the restarts")

        st = c.status("p")
        assert st["lastEvaluationTime"] > kept["lastEvaluationTime"]
        assert st["observedGeneration"] == kept["observedGeneration"]
        assert st["pods"] == kept["pods"]
        assert {x["type"] for x in st["conditions"]} == {x["type"] for x in kept["conditions"]}
        # The Machine verdict's Event too: one the API refused while restarting is posted again
        # at the next window.
        wait_for(lambda: len(bottleneck_messages(c, "p")) >= 2, 3 * WINDOW, "the Machine verdict's Event")
        # Still watching after the restarts: a new profile is picked up.
        c.apply(profile("q", sidecars.port, {"app": "t"}))
        wait_for(lambda: c.axis("q") == "Machine", 6 * WINDOW, "a profile created after the restarts")
        messages = bottleneck_messages(c, "p")
        assert len(messages) == 2, messages  # each once
        assert any("was Data (input-bound)" in m for m in messages), messages
        assert op.starts == 1
        op.assert_alive()


@pytest.mark.slow
def test_misbehaving_sidecars_are_reported_and_do_not_stop_diagnosis(
    cluster: Cluster, sidecars: FakeSidecars, tmp_path: Path
) -> None:
    c = cluster
    good = sidecars.add("127.0.0.1", FakeJob())
    says = {"garbage": "not Prometheus text", "slow": "did not answer", "down": "HTTP 503"}
    bad = {fault: sidecars.add(f"127.0.0.{i}", FakeJob()) for i, fault in enumerate(says, start=2)}
    op = c.operator(tmp_path, env={"DAM_SCRAPE_TIMEOUT_SECONDS": "1"}).start()
    try:
        c.apply(profile("p", sidecars.port, {"app": "t"}))
        wait_for(lambda: condition(c.get("p"), "SpecValid"), 30, "registration")
        names = {"good": "a-0", "garbage": "b-0", "slow": "c-0", "down": "d-0"}
        for i, name in enumerate(names.values(), start=1):
            c.apply(pod(name, {"app": "t"}))
            c.running(name, ip=f"127.0.0.{i}")
        wait_for(lambda: c.axis("p") == "Data", 40, "the Data verdict")
        wait_for(lambda: c.status("p")["pods"]["reporting"] == 4, 4 * WINDOW, "every pod reporting")
        for fault, job in bad.items():
            job.fault = fault  # type: ignore[assignment]
            job.slow_seconds = 3.0

        def reported() -> bool:
            cond = condition(c.get("p"), "Reporting")
            return bool(
                cond
                and cond["status"] == "False"
                and all(
                    f"{names[fault]}: " in cond["message"] and text in cond["message"]
                    for fault, text in says.items()
                )
            )

        wait_for(reported, 4 * WINDOW, "the garbage, slow and down sidecars to be reported")
        st = c.status("p")
        assert st["pods"]["reporting"] == 1, dumps(st)
        assert st["bottleneck"]["axis"] == "Data"  # the good pod still tells
        assert good.fault == "none"
        metrics = parse_snapshot(op.metrics(), "operator")
        errors = metrics.samples(mn.OPERATOR_EVALUATION_ERRORS_TOTAL)
        reasons = {dict(s.labels)["reason"] for s in errors if s.value > 0}
        assert {"scrape-garbage", "scrape-timeout", "scrape-http-status"} <= reasons, reasons
    except AssertionError:
        print(op.log())
        print(dumps(c.status("p")))
        raise
    finally:
        op.close()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"sampling": {"intervalSeconds": -1}}, "spec.sampling.intervalSeconds: Invalid value: -1"),
        ({"sampling": {"intervalSeconds": "fast"}}, 'spec.sampling.intervalSeconds: Invalid value: "string"'),
        ({"sidecar": {"image": "x" * 600}}, "spec.sidecar.image: Too long"),
        (
            {"thresholds": {"dataWaitFine": 0.5, "dataWaitSuspect": 0.2}},
            "dataWaitFine must be below dataWaitSuspect",
        ),
    ],
    ids=["range", "type", "length", "cel-rule"],
)
def test_schema_invalid_specs_are_refused_by_the_api_server(
    cluster: Cluster, spec: dict[str, Any], message: str
) -> None:
    done = cluster.cp.kubectl(
        "apply", "-n", cluster.ns, "-f", "-", input=profile("bad", 9450, {"app": "t"}, **spec), check=False
    )
    assert done.returncode != 0
    assert message in done.stderr, done.stderr


def test_semantically_invalid_specs_get_a_clear_condition_and_no_crash_loop(
    cluster: Cluster, tmp_path: Path
) -> None:
    c = cluster
    op = c.operator(tmp_path, webhook=False).start()
    with log_on_failure(op):
        # Accepted by the API server (its CEL rule compares the two thresholds only when both are
        # set), but dataWaitFine crosses the operator's default dataWaitSuspect (0.1).
        c.apply(profile("p", 9450, {"app": "t"}, thresholds={"dataWaitFine": 0.5}))

        def invalid(generation: int) -> dict[str, Any] | None:
            cond = condition(c.get("p"), "SpecValid")
            ok = cond and cond["status"] == "False" and cond.get("observedGeneration") == generation
            return cond if ok else None

        cond = wait_for(lambda: invalid(1), 30, "the SpecValid=False condition")
        assert cond["reason"] == "InvalidSpec"
        assert "dataWaitFine" in cond["message"] and "dataWaitSuspect" in cond["message"]
        warning = wait_for(lambda: c.events("p", "InvalidSpec"), 20, "an InvalidSpec Event")
        assert warning[0]["type"] == "Warning"

        # An update that is wrong in another way the schema cannot see: requests above limits.
        resources = {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}
        c.apply(profile("p", 9450, {"app": "t"}, sidecar={"port": 9450, "resources": resources}))
        cond = wait_for(lambda: invalid(2), 30, "the second SpecValid=False condition")
        assert "requests.cpu" in cond["message"] and "limits.cpu" in cond["message"], cond
        assert "bottleneck" not in c.status("p")

        # Fixing the spec clears it (the update handler runs; no retries of the bad one in between).
        c.apply(profile("p", 9450, {"app": "t"}))

        def valid() -> bool:
            x = condition(c.get("p"), "SpecValid")
            return bool(x and x["status"] == "True")

        wait_for(valid, 30, "SpecValid=True after the fix")
        assert c.status("p")["observedGeneration"] == 3
        op.assert_alive()
        log = op.log()
        assert "Traceback" not in log, log
        assert len(c.events("p", "InvalidSpec")) == 2  # one per bad generation


@pytest.mark.slow
def test_webhook_that_cannot_start_does_not_stop_the_operator(
    cluster: Cluster, sidecars: FakeSidecars, tmp_path: Path
) -> None:
    # The operator's namespace does not exist: the webhook certificate Secret cannot be
    # written, so the webhook cannot start. The operator must go on diagnosing, and a pod
    # whose sidecar was added by hand (here: a fake sidecar on its IP) is honoured.
    c = cluster
    sidecars.add("127.0.0.1", FakeJob())
    op = c.operator(tmp_path, operator_namespace="no-such-namespace")
    op.start(wait=False)
    try:
        c.apply(profile("p", sidecars.port, {"app": "t"}))
        c.apply(pod("trainer-0", {"app": "t"}))
        c.running("trainer-0")
        try:
            wait_for(lambda: c.axis("p") == "Data", 40, "the Data verdict without a webhook")
        except AssertionError:
            raise AssertionError(dumps(c.status("p"))) from None
        assert "pod webhook not started" in op.log()
        assert not op.webhook_registered()
        pods = c.status("p")["pods"]
        assert pods["instrumented"] == 1 and pods["reporting"] == 1, dumps(pods)
        op.assert_alive()
    finally:
        op.close()
