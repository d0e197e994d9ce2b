"""Three sharded operator replicas against the real API server: each profile is evaluated by
exactly one of them, a replica SIGKILLed mid-run loses none of its profiles for more than two
windows (no doubled Event, status.goodput continues), and a replica added takes only its share.

The real ``dam operator`` runs as three child processes (``DAM_SHARDING=true``, each its own
``HOSTNAME``, as Pods of a Deployment have); their Leases live in the operator's namespace. The
training pods' sidecars are fakes on loopback (tests/support/fake_sidecar.py), one per pod IP.
Which replica evaluates a profile is read from the replicas' own ``/metrics``: a profile's
``dam_profile_*`` series exist only on the replica that evaluates it (released profiles' series
are dropped, docs/operator.md "Sharding").
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dam_operator.cluster.steps import sharding as sh
from tests.support.fake_sidecar import FakeJob, FakeSidecars, ThreadedFakeSidecars, pod_ip
from tests.support.faultproxy import FaultProxy, refused, verb_and_resource
from tests.support.kubecluster import ControlPlane
from tests.support.operator_harness import (
    OperatorProcess,
    damprofile,
    events_for,
    install_chart,
    profile_of,
    wait_for,
)

WINDOW = 8
PROFILES = 30
LEASE_SECONDS = 4
RENEW_SECONDS = 1
NAMES = [f"job-{i:02d}" for i in range(PROFILES)]
SERIES = re.compile(r'^dam_profile_\w+\{[^}]*profile="([^"]+)"', re.MULTILINE)


def manifests(port: int) -> str:
    docs: list[dict[str, Any]] = []
    for name in NAMES:
        docs.append(damprofile(name, {"job": name}, port=port, window_seconds=WINDOW))
        docs.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"{name}-0", "labels": {"job": name}},
                "spec": {"containers": [{"name": "train", "image": "python:3.11-slim"}]},
            }
        )
    return yaml.safe_dump_all(docs)


@pytest.fixture
def sidecars() -> Iterator[FakeSidecars]:
    with ThreadedFakeSidecars("0.0.0.0") as fakes:
        yield fakes


class Replicas:
    def __init__(self, cp: ControlPlane, ns: str, system: str, workdir: Path) -> None:
        self.cp, self.ns, self.system, self.workdir = cp, ns, system, workdir
        self.group = f"shards-{secrets.token_hex(3)}"
        self.ops: dict[str, OperatorProcess] = {}

    def start(self, identity: str) -> OperatorProcess:
        workdir = self.workdir / identity
        workdir.mkdir()
        env = {
            "HOSTNAME": identity,
            "DAM_SHARDING": "true",
            "DAM_SHARD_GROUP": self.group,
            "DAM_SHARD_LEASE_DURATION_SECONDS": str(LEASE_SECONDS),
            "DAM_SHARD_RENEW_SECONDS": str(RENEW_SECONDS),
            "DAM_SCRAPE_TIMEOUT_SECONDS": "2",
        }
        op = OperatorProcess(
            self.cp, workdir, namespace=self.ns, operator_namespace=self.system, webhook=False, env=env
        )
        self.ops[identity] = op.start(wait=False)
        return op

    def owned(self, identity: str) -> set[str]:
        """The profiles whose series the replica serves: those it evaluates."""
        return set(SERIES.findall(self.ops[identity].metrics()))

    def expected(self, members: list[str]) -> dict[str, set[str]]:
        owners = {n: sh.owner_of(sh.bucket_of(self.ns, n), members) for n in NAMES}
        return {m: {n for n, o in owners.items() if o == m} for m in members}

    def close(self) -> None:
        for op in self.ops.values():
            op.close()

    def logs(self) -> str:
        return "\n".join(f"=== {i}\n{op.log()[-4000:]}" for i, op in self.ops.items())


def assert_never_refused(proxy: FaultProxy) -> None:
    bad = refused(proxy.snapshot())
    assert not bad, ", ".join(f"{r.method} {r.path} -> {r.status}" for r in bad)


def bottleneck_events(cp: ControlPlane, ns: str) -> dict[str, int]:
    return {n: len(events_for(cp, ns, n, "BottleneckChanged")) for n in NAMES}


@pytest.mark.slow
def test_three_replicas_share_the_profiles_survive_a_sigkill_and_take_in_a_new_one(
    control_plane: ControlPlane,
    kube_namespace: str,
    system_namespace: str,
    sidecars: FakeSidecars,
    tmp_path: Path,
) -> None:
    cp, ns = control_plane, kube_namespace
    jobs = {name: sidecars.add(pod_ip(i), FakeJob(goodput=True)) for i, name in enumerate(NAMES)}

    def scrapes() -> dict[str, int]:
        return {n: j.scrapes for n, j in jobs.items()}

    cp.kubectl("apply", "-n", ns, "-f", "-", input=manifests(sidecars.port))
    for i, name in enumerate(NAMES):
        cp.mark_pod_running(ns, f"{name}-0", pod_ip=pod_ip(i))
    replicas = Replicas(cp, ns, system_namespace, tmp_path)
    try:
        for identity in ("op-0", "op-1", "op-2"):
            replicas.start(identity)
        for op in replicas.ops.values():
            op.wait_ready()

        # Every profile diagnosed once, by the one replica the rendezvous hash names.
        def diagnosed() -> bool:
            return all((profile_of(cp, ns, n).get("status") or {}).get("bottleneck") for n in NAMES)

        wait_for(diagnosed, 60, "every profile's first verdict")
        want = replicas.expected(["op-0", "op-1", "op-2"])
        wait_for(lambda: all(replicas.owned(m) == want[m] for m in want), 2 * WINDOW, "each replica's share")
        assert all(want.values()), want  # 30 profiles: each replica has some
        assert bottleneck_events(cp, ns) == dict.fromkeys(NAMES, 1)
        # One evaluation a window per profile, not one per replica: each sidecar is scraped
        # once a window (two windows: 2, or 3 where a window's scrape fell on either edge).
        seen = scrapes()
        time.sleep(2 * WINDOW)
        counts = {n: c - seen[n] for n, c in scrapes().items()}
        assert all(1 <= c <= 3 for c in counts.values()), counts

        # SIGKILL one replica mid-run: its profiles are evaluated again within two windows.
        # (An evaluation = the adopting replica's baseline scrape, then a window's scrape: the
        # status is written only when more than lastEvaluationTime changes, so the sidecars'
        # scrape counts tell when a profile was evaluated.)
        victim = sorted(want["op-1"])
        before = {n: dict(profile_of(cp, ns, n)["status"]["goodput"]) for n in victim}
        at_kill = scrapes()
        started = time.monotonic()
        replicas.ops["op-1"].kill()
        # What only the status holds (the operator counts restarts; no sidecar can tell them
        # again): the last write of op-1 had counted two restarts of each of its jobs.
        for n in victim:
            counted = {
                "restarts": int(before[n].get("restarts") or 0) + 2,
                "badputSeconds": {"restart": float(before[n]["badputSeconds"].get("restart") or 0) + 30.0},
            }
            cp.api(
                "PATCH",
                f"/apis/dam.mlsys.dev/v1alpha1/namespaces/{ns}/damprofiles/{n}/status",
                {"status": {"goodput": counted}},
                content_type="application/merge-patch+json",
            )
            before[n] = {**before[n], **counted}

        def all_evaluated_since_kill() -> bool:
            now = scrapes()
            return all(now[n] >= at_kill[n] + (2 if n in victim else 1) for n in NAMES)

        try:
            wait_for(all_evaluated_since_kill, 2 * WINDOW + 2, "every profile evaluated after the kill")
        except AssertionError:
            raise AssertionError(f"at the kill {at_kill}, now {scrapes()}; victims {victim}") from None
        took = time.monotonic() - started
        assert took <= 2 * WINDOW, took
        survivors = replicas.expected(["op-0", "op-2"])
        wait_for(lambda: all(replicas.owned(m) == survivors[m] for m in survivors), 5, "the survivors")
        for m in ("op-0", "op-2"):
            assert want[m] <= survivors[m]  # only the lost member's share moved

        # A replica added takes only its share, drained from the others first.
        replicas.start("op-3").wait_ready()
        grown = replicas.expected(["op-0", "op-2", "op-3"])
        wait_for(
            lambda: all(replicas.owned(m) == grown[m] for m in grown), 3 * WINDOW, "the new replica's share"
        )
        for m in ("op-0", "op-2"):
            assert grown[m] <= survivors[m]  # gave away, took nothing
        at_move = scrapes()
        wait_for(
            lambda: all(scrapes()[n] >= at_move[n] + 1 for n in grown["op-3"]),
            WINDOW + 2,
            "the new replica's profiles evaluated",
        )
        # No doubled Event through it all: the verdict (Data) was published once per profile.
        assert bottleneck_events(cp, ns) == dict.fromkeys(NAMES, 1)
        # The killed replica's profiles kept their goodput ledger: it went on from where op-1
        # left it (their new owner resumed it from the status), it did not start from zero.
        for n in victim:
            after = profile_of(cp, ns, n)["status"]["goodput"]
            assert after["productiveSeconds"] >= before[n]["productiveSeconds"] > 0, (n, before[n], after)
            assert after["elapsedSeconds"] > before[n]["elapsedSeconds"], (n, before[n], after)
            assert after["restarts"] == before[n]["restarts"], (n, before[n], after)
            assert after["badputSeconds"]["restart"] >= before[n]["badputSeconds"]["restart"], (n, after)
    except AssertionError:
        print(replicas.logs())
        raise
    finally:
        replicas.close()


@pytest.mark.slow
def test_sharded_replicas_need_no_right_beyond_the_charts_and_a_clean_stop_hands_over(
    control_plane: ControlPlane,
    kube_namespace: str,
    system_namespace: str,
    sidecars: FakeSidecars,
    tmp_path: Path,
) -> None:
    """Two replicas with exactly the RBAC the chart renders for ``operator.replicas: 2`` (a
    recording proxy between them and the API server): their Leases, renewals and lists are never
    refused; one stopped cleanly (SIGTERM) deletes its Lease and the other takes its profiles over
    within a few renew periods, well before a Lease duration."""
    cp, ns = control_plane, kube_namespace
    chart = install_chart(cp, system_namespace, {"operator": {"watchNamespace": ns, "replicas": 2}})
    env = chart.env()
    assert env["DAM_SHARDING"] == "true"
    names = NAMES[:6]
    jobs = {n: sidecars.add(pod_ip(i), FakeJob()) for i, n in enumerate(names)}
    docs = [
        d
        for d in yaml.safe_load_all(manifests(sidecars.port))
        if d["metadata"]["name"].startswith(tuple(names))
    ]
    cp.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump_all(docs))
    for i, name in enumerate(names):
        cp.mark_pod_running(ns, f"{name}-0", pod_ip=pod_ip(i))
    with FaultProxy(cp.url, cp.ssl_context()) as proxy:
        kubeconfig = proxy.kubeconfig(chart.kubeconfig, tmp_path / "operator.kubeconfig")
        ops: dict[str, OperatorProcess] = {}
        try:
            for identity in ("op-a", "op-b"):
                workdir = tmp_path / identity
                workdir.mkdir()
                ops[identity] = OperatorProcess(
                    cp,
                    workdir,
                    namespace=ns,
                    operator_namespace=chart.namespace,
                    kubeconfig=kubeconfig,
                    webhook=False,
                    env={
                        **env,
                        "HOSTNAME": identity,
                        "DAM_SHARD_LEASE_DURATION_SECONDS": "20",  # a takeover by expiry would be slow
                        "DAM_SHARD_RENEW_SECONDS": "1",
                    },
                ).start(wait=False)
            for op in ops.values():
                op.wait_ready()
            wait_for(
                lambda: all((profile_of(cp, ns, n).get("status") or {}).get("bottleneck") for n in names),
                60,
                "every profile's first verdict",
            )
            leases = cp.api("GET", f"/apis/coordination.k8s.io/v1/namespaces/{chart.namespace}/leases")
            holders = {i["spec"]["holderIdentity"] for i in leases["items"]}
            assert holders == {"op-a", "op-b"}, holders

            owners = {n: sh.owner_of(sh.bucket_of(ns, n), ["op-a", "op-b"]) for n in names}
            leaving = [n for n, o in owners.items() if o == "op-b"]
            at_stop = {n: j.scrapes for n, j in jobs.items()}
            started = time.monotonic()
            ops["op-b"].stop()  # SIGTERM: releases its share and deletes its Lease
            wait_for(
                lambda: all(jobs[n].scrapes >= at_stop[n] + 1 for n in leaving),
                10,
                "op-b's profiles taken over by op-a",
            )
            assert time.monotonic() - started < 10  # not the 20 s Lease duration
            leases = cp.api("GET", f"/apis/coordination.k8s.io/v1/namespaces/{chart.namespace}/leases")
            assert {i["spec"]["holderIdentity"] for i in leases["items"]} == {"op-a"}
            assert_never_refused(proxy)
            used = {v for r in proxy.snapshot() if (v := verb_and_resource(r))}
            lease_verbs = {v[0] for v in used if v[1:] == ("coordination.k8s.io", "leases")}
            assert {"create", "update", "list", "delete"} <= lease_verbs, lease_verbs
        except AssertionError:
            print("\n".join(op.log()[-4000:] for op in ops.values()))
            raise
        finally:
            for op in ops.values():
                op.close()
            chart.uninstall()
