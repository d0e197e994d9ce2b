"""The closed loop through the evaluator and the webhook: a profile in mode Apply whose job is
input-bound gets a pending action; the next pod the webhook admits carries it; the pods' figures
decide the outcome; a worse change is rolled back on the following pod. InPlace: the operator
sends the resize request and records the API's refusal.

Real fake-sidecar HTTP servers on loopback, the in-memory status API of test_scheduler, the
webhook's own ``review`` function, a simulated clock.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import jsonpatch
from prometheus_client import CollectorRegistry

from dam_contract import names
from dam_operator.cluster.adapters.kube import ApiError
from dam_operator.cluster.adapters.sources import ScrapeSource
from dam_operator.cluster.runtime.opmetrics import OperatorMetrics
from dam_operator.cluster.runtime.scheduler import Evaluator
from dam_operator.cluster.runtime.webhook import ProfileRef, review
from dam_operator.cluster.steps import metric_names as n
from dam_operator.cluster.steps.injection import ANNOTATION_ACTION, InjectionSettings, is_instrumented
from dam_operator.cluster.steps.registry import PodInfo, Registry
from dam_operator.cluster.steps.spec import parse_spec
from dam_probe.overrides import ENV_LOADER_OVERRIDES, parse_overrides
from tests.support.fake_sidecar import FakeJob, FakeSidecars, Regime, pod_ip
from tests.unit.cluster.test_scheduler import Clock, FakeAPI

SETTINGS = InjectionSettings(image="ghcr.io/mlsys/dam-operator:0.1.0")


def starved(steps_per_second: float, wait: float = 0.7) -> Regime:
    return Regime(steps_per_second=steps_per_second, data_wait_ratio=wait, gpu_util=0.3, sm_active=0.2)


@dataclass
class LoaderJob(FakeJob):
    """A fake job that also reports its loader worker processes, CPU limit and throttling."""

    workers: int = 0
    cpu_limit: float = 4.0
    throttled_ratio: float = 0.0
    throttled_seconds: float = 0.0

    def advance(self) -> float:
        before = self._last
        now = super().advance()
        if before is not None and now > before:
            self.throttled_seconds += self.throttled_ratio * (now - before)
        return now

    def exposition(self) -> str:
        text = super().exposition()
        return text + (
            f'{names.PROCESSES}{{role="worker"}} {self.workers}\n'
            f"{names.CONTAINER_CPU_LIMIT_CORES} {self.cpu_limit}\n"
            f"# TYPE {names.CONTAINER_CPU_THROTTLED_SECONDS_TOTAL} counter\n"
            f"{names.CONTAINER_CPU_THROTTLED_SECONDS_TOTAL} {self.throttled_seconds!r}\n"
        )


class Cluster:
    """Registry, sidecars, evaluator and webhook around one profile ``ns/p``."""

    def __init__(self, api: FakeAPI, actions: Mapping[str, Any]) -> None:
        self.clock = Clock()
        self.api = api
        self.registry = Registry()
        self.prom = CollectorRegistry()
        self.metrics = OperatorMetrics(self.prom)
        self.sidecars = FakeSidecars()
        self.actions = dict(actions)
        self.pods = 0

    async def __aenter__(self) -> Cluster:
        port = await self.sidecars.start("0.0.0.0", 0)
        spec = {
            "selector": {"matchLabels": {"app": "trainer"}},
            "evaluation": {"windowSeconds": 30, "hysteresisWindows": 1},
            "sidecar": {"port": port},
            "actions": self.actions,
        }
        self.registry.upsert_profile("ns", "p", uid="uid-1", generation=2, spec=parse_spec(spec))
        self.session = aiohttp.ClientSession()
        self.evaluator = Evaluator(
            self.registry,
            self.api,
            lambda _spec: ScrapeSource(self.session, timeout_seconds=0.5),
            self.metrics,
            now=self.clock.now,
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.session.close()
        await self.sidecars.stop()

    def profiles_for(self, namespace: str) -> list[ProfileRef]:
        """What webhook_lifecycle gives the webhook: the registry's profiles with their status."""
        return [
            ProfileRef(e.namespace, e.name, e.spec, e.status)
            for e in self.registry.profiles_in(namespace)
            if e.spec
        ]

    def create_pod(self, job: LoaderJob, *, replace: bool = True) -> dict[str, Any]:
        """A new pod of the job goes through the webhook; the "kubelet" runs it with ``job``."""
        name = f"train-{self.pods}"
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "labels": {"app": "trainer"}},
            "spec": {
                "containers": [
                    {
                        "name": "train",
                        "image": "pytorch:2",
                        "resources": {"limits": {"cpu": "2"}, "requests": {"cpu": "1"}},
                    }
                ]
            },
        }
        request = {
            "uid": name,
            "kind": {"kind": "Pod"},
            "operation": "CREATE",
            "namespace": "ns",
            "object": body,
        }
        decision = review(request, self.profiles_for, SETTINGS)
        pod: dict[str, Any] = jsonpatch.apply_patch(body, decision.patch)
        ip = pod_ip(self.pods)
        pod["status"] = {"phase": "Running", "podIP": ip}
        if replace:
            for old in [p.name for p in self.registry.pods_for(self._entry())]:
                self.registry.remove_pod("ns", old)
        self.sidecars.add(ip, job)
        job.clock = self.clock
        self.registry.upsert_pod(PodInfo.from_body(pod, is_instrumented(pod)))
        self.pods += 1
        return pod

    def _entry(self) -> Any:
        entry = self.registry.profile("ns", "p")
        assert entry is not None
        return entry

    async def window(self) -> dict[str, Any]:
        self.clock.t += 30.0
        await self.evaluator.evaluate(self._entry())
        return self.api.status()

    def reasons(self) -> list[str]:
        return [e["reason"] for e in self.api.events if e["reason"].startswith("Action")]

    def outcomes(self) -> list[str]:
        return [a["outcome"] for a in self.api.status().get("actions", [])]


def _overrides(pod: Mapping[str, Any]) -> dict[str, int | bool]:
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}
    return parse_overrides(env[ENV_LOADER_OVERRIDES]).settings() if ENV_LOADER_OVERRIDES in env else {}


def test_apply_mode_closes_the_loop_improved_then_worse_then_rolled_back() -> None:
    async def scenario() -> None:
        async with Cluster(FakeAPI(), {"mode": "Apply", "warmupWindows": 0}) as c:
            first = c.create_pod(LoaderJob(regime=starved(4.0), workers=0))
            assert ANNOTATION_ACTION not in first["metadata"]["annotations"]  # no action yet
            assert _overrides(first) == {}
            assert await c.evaluator.initialize(c._entry())
            status = await c.window()
            assert status["bottleneck"]["regime"] == "input-bound"
            (action,) = status["actions"]
            assert action["setting"] == {"name": "num_workers", "before": "0", "after": "1"}
            assert action["outcome"] == "pending" and action["generation"] == 2
            assert action["before"]["stepsPerSecond"] == 4.0
            assert c.reasons() == ["ActionPlanned"]

            # The next pod carries the override; its better figures make the action "improved".
            second = c.create_pod(LoaderJob(regime=starved(8.0, 0.4), workers=1))
            assert _overrides(second) == {"num_workers": 1}
            assert second["metadata"]["annotations"][ANNOTATION_ACTION] == "1:applied"
            await c.window()  # the new pod's baseline scrape
            status = await c.window()
            first_action, next_action = status["actions"]
            assert first_action["outcome"] == "improved" and first_action["pod"] == "train-1"
            assert first_action["after"]["stepsPerSecond"] == 8.0
            assert next_action["setting"] == {"name": "num_workers", "before": "1", "after": "2"}
            assert c.reasons() == ["ActionPlanned", "ActionApplied", "ActionImproved", "ActionPlanned"]

            # Two workers make it worse; the pod after that goes back to one worker.
            third = c.create_pod(LoaderJob(regime=starved(5.0, 0.5), workers=2))
            assert _overrides(third) == {"num_workers": 2}
            await c.window()
            await c.window()
            assert c.outcomes() == ["improved", "worse"]
            worse = next(e for e in c.api.events if e["reason"] == "ActionWorse")
            assert worse["type"] == "Warning" and "-38%" in worse["message"]
            fourth = c.create_pod(LoaderJob(regime=starved(8.0, 0.4), workers=1))
            assert _overrides(fourth) == {"num_workers": 1}
            assert fourth["metadata"]["annotations"][ANNOTATION_ACTION] == "2:withheld"
            await c.window()
            await c.window()
            assert c.outcomes()[:2] == ["improved", "rolled-back"]
            # num_workers is done for this generation: the climb moved on to prefetch_factor.
            assert c.api.status()["actions"][2]["setting"]["name"] == "prefetch_factor"

            def count(outcome: str) -> float | None:
                return c.prom.get_sample_value(n.OPERATOR_ACTIONS_TOTAL, {"outcome": outcome})

            assert [count(o) for o in n.ACTION_OUTCOMES] == [3.0, 1.0, 0.0, 1.0, 1.0]
            info = {"namespace": "ns", "profile": "p", "action": "2", "lever": "increase-dataloader-workers"}
            info |= {"setting": "num_workers", "before": "1", "after": "2", "outcome": "rolled-back"}
            assert c.prom.get_sample_value(n.PROFILE_ACTION_INFO, info) == 1.0
            steps = {"namespace": "ns", "profile": "p", "action": "2", "phase": "after"}
            assert c.prom.get_sample_value(n.PROFILE_ACTION_STEPS_PER_SECOND, steps) == 5.0

    asyncio.run(scenario())


def test_the_webhook_applies_nothing_in_recommend_mode() -> None:
    async def scenario() -> None:
        async with Cluster(FakeAPI(), {"mode": "Recommend"}) as c:
            c.create_pod(LoaderJob(regime=starved(4.0)))
            await c.evaluator.initialize(c._entry())
            status = await c.window()
            assert status["bottleneck"]["regime"] == "input-bound" and "actions" not in status
            pod = c.create_pod(LoaderJob(regime=starved(4.0)))
            assert ANNOTATION_ACTION not in pod["metadata"]["annotations"] and _overrides(pod) == {}
            assert c.reasons() == []

    asyncio.run(scenario())


class ResizingAPI(FakeAPI):
    """FakeAPI plus ``pods/resize``; ``refuse`` makes the API server refuse it."""

    def __init__(self, pods: Mapping[str, Mapping[str, Any]], refuse: ApiError | None = None) -> None:
        super().__init__()
        self.pods = pods
        self.refuse = refuse
        self.resizes: list[tuple[str, dict[str, Any]]] = []

    async def get_pod(self, namespace: str, name: str) -> Mapping[str, Any]:
        return self.pods[name]

    async def resize_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> Mapping[str, Any]:
        self.resizes.append((name, json.loads(json.dumps(patch))))
        if self.refuse is not None:
            raise self.refuse
        return self.pods[name]


def _throttled() -> LoaderJob:
    return LoaderJob(regime=starved(4.0), workers=2, cpu_limit=2.0, throttled_ratio=0.4)


def test_in_place_mode_resizes_the_running_training_container() -> None:
    async def scenario() -> None:
        pods: dict[str, Any] = {}
        async with Cluster(ResizingAPI(pods), {"mode": "InPlace", "maxCpu": "3", "warmupWindows": 0}) as c:
            pods["train-0"] = c.create_pod(_throttled())
            await c.evaluator.initialize(c._entry())
            status = await c.window()
            assert status["bottleneck"]["lever"] == "raise-cpu-limit"
            assert c.api.resizes == [  # type: ignore[attr-defined]
                (
                    "train-0",
                    {"spec": {"containers": [{"name": "train", "resources": {"limits": {"cpu": "3"}}}]}},
                )
            ]
            (action,) = status["actions"]
            assert action["setting"] == {"name": "cpu", "before": "2", "after": "3"}
            assert action["inPlace"] == {"state": "Resized", "pods": ["train-0"], "podCount": 1}
            assert c.reasons() == ["ActionPlanned", "ActionApplied"]
            job = c.sidecars.jobs[pod_ip(0)]
            assert isinstance(job, LoaderJob)
            job.switch(starved(6.0, 0.3))
            job.cpu_limit = 3.0
            status = await c.window()
            assert status["actions"][0]["outcome"] == "improved"
            assert len(c.api.resizes) == 1  # type: ignore[attr-defined]

    asyncio.run(scenario())


def test_a_refused_resize_is_recorded_warned_and_not_retried() -> None:
    async def scenario() -> None:
        pods: dict[str, Any] = {}
        refusal = ApiError(422, "Pod QoS Class may not change as a result of resizing")
        async with Cluster(ResizingAPI(pods, refusal), {"mode": "InPlace", "maxCpu": "3"}) as c:
            pods["train-0"] = c.create_pod(_throttled())
            await c.evaluator.initialize(c._entry())
            status = await c.window()
            (action,) = status["actions"]
            assert action["outcome"] == "pending"
            assert action["inPlace"]["state"] == "Refused" and "QoS" in action["inPlace"]["message"]
            refused = next(e for e in c.api.events if e["reason"] == "ActionResizeRefused")
            assert refused["type"] == "Warning" and "next pod created" in refused["message"]
            errors = {"reason": "api-422"}
            assert c.prom.get_sample_value(n.OPERATOR_EVALUATION_ERRORS_TOTAL, errors) == 1.0
            for _ in range(3):
                await c.window()
            assert len(c.api.resizes) == 1  # type: ignore[attr-defined]
            # The raise still reaches the next pod the webhook admits.
            pod = c.create_pod(_throttled())
            assert pod["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "3"

    asyncio.run(scenario())
