"""The in-memory registry of profiles and pods."""

from __future__ import annotations

from typing import Any

from dam_operator.cluster.steps.registry import PodInfo, ProfileEntry, Registry
from dam_operator.cluster.steps.spec import parse_spec


def _spec(labels: dict[str, str], **extra: Any) -> Any:
    return parse_spec({"selector": {"matchLabels": labels, **extra}})


def _pod(name: str, labels: dict[str, str], **kw: Any) -> PodInfo:
    return PodInfo(namespace=kw.pop("namespace", "ns"), name=name, labels=labels, **kw)


def test_pods_for_matches_labels_and_expressions_in_the_profile_namespace() -> None:
    reg = Registry()
    spec = _spec(
        {"app": "trainer"},
        matchExpressions=[{"key": "tier", "operator": "NotIn", "values": ["debug"]}],
    )
    entry = reg.upsert_profile("ns", "p", uid="u", generation=1, spec=spec)
    reg.upsert_pod(_pod("a", {"app": "trainer"}))
    reg.upsert_pod(_pod("b", {"app": "trainer", "tier": "debug"}))
    reg.upsert_pod(_pod("c", {"app": "other"}))
    reg.upsert_pod(_pod("d", {"app": "trainer"}, namespace="elsewhere"))
    assert [p.name for p in reg.pods_for(entry)] == ["a"]


def test_finished_and_deleting_pods_do_not_count() -> None:
    reg = Registry()
    entry = reg.upsert_profile("ns", "p", uid="u", generation=1, spec=_spec({"app": "t"}))
    reg.upsert_pod(_pod("done", {"app": "t"}, phase="Succeeded"))
    reg.upsert_pod(_pod("going", {"app": "t"}, phase="Running", deleting=True))
    reg.upsert_pod(_pod("live", {"app": "t"}, phase="Running"))
    assert [p.name for p in reg.pods_for(entry)] == ["live"]


def test_finished_and_oom_ended_pods_are_the_profiles_own_by_its_selector() -> None:
    reg = Registry()
    entry = reg.upsert_profile(
        "ns",
        "p",
        uid="u",
        generation=1,
        spec=_spec(
            {"app": "t"}, matchExpressions=[{"key": "tier", "operator": "NotIn", "values": ["debug"]}]
        ),
    )
    oom = "2026-01-01T00:00:00Z"
    reg.upsert_pod(_pod("done", {"app": "t"}, phase="Succeeded"))
    reg.upsert_pod(_pod("killed", {"app": "t"}, phase="Failed", last_oom_kill=oom))
    reg.upsert_pod(_pod("live", {"app": "t"}, phase="Running", last_oom_kill=oom))  # restarted in place
    reg.upsert_pod(_pod("debug", {"app": "t", "tier": "debug"}, phase="Failed", last_oom_kill=oom))
    reg.upsert_pod(_pod("other", {"app": "x"}, phase="Failed", last_oom_kill=oom))
    reg.upsert_pod(_pod("away", {"app": "t"}, phase="Failed", namespace="elsewhere", last_oom_kill=oom))
    assert [p.name for p in reg.finished_pods_for(entry)] == ["done", "killed"]
    assert [p.name for p in reg.oom_ended_pods_for(entry)] == ["killed"]
    reg.upsert_pod(_pod("killed", {"app": "x"}, phase="Failed", last_oom_kill=oom))  # relabelled
    assert [p.name for p in reg.finished_pods_for(entry)] == ["done"]
    assert reg.oom_ended_pods_for(entry) == []


def test_relabelled_pod_leaves_the_old_index() -> None:
    reg = Registry()
    entry = reg.upsert_profile("ns", "p", uid="u", generation=1, spec=_spec({"app": "t"}))
    reg.upsert_pod(_pod("a", {"app": "t"}))
    reg.upsert_pod(_pod("a", {"app": "x"}))
    assert reg.pods_for(entry) == []
    reg.remove_pod("ns", "a")
    assert reg.pod("ns", "a") is None
    assert reg.pod_count() == 0


def test_pod_info_reads_the_pod_body() -> None:
    body = {
        "metadata": {"name": "a", "namespace": "ns", "uid": "1", "labels": {"app": "t"}},
        "status": {"podIP": "10.0.0.5", "phase": "Running"},
    }
    pod = PodInfo.from_body(body, instrumented=True)
    assert pod.pod_ip == "10.0.0.5" and pod.scrapable
    assert not PodInfo.from_body({**body, "status": {"phase": "Pending"}}, True).scrapable
    # A pod without the injected sidecar is scraped too: a hand-added sidecar is honoured.
    assert PodInfo.from_body(body, instrumented=False).scrapable


def test_listeners_hear_upserts_and_removals_and_revisions_grow() -> None:
    reg = Registry()
    heard: list[tuple[str, str, int]] = []

    def listener(kind: str, entry: ProfileEntry) -> None:
        heard.append((kind, entry.name, entry.revision))

    reg.subscribe(listener)
    first = reg.upsert_profile("ns", "p", uid="u", generation=1, spec=_spec({"app": "t"}))
    second = reg.upsert_profile("ns", "p", uid="u", generation=2, spec=_spec({"app": "t"}))
    reg.remove_profile("ns", "p")
    assert second.revision > first.revision
    assert [h[0] for h in heard] == ["upsert", "upsert", "remove"]
    assert reg.remove_profile("ns", "p") is None
    assert len(reg) == 0


def test_known_status_is_kept_for_the_same_object_and_seeded_for_a_new_one() -> None:
    reg = Registry()
    first = reg.upsert_profile("ns", "p", uid="u", generation=1, spec=None, error="x", status={"a": 1})
    first.status = {"written": True}
    again = reg.upsert_profile("ns", "p", uid="u", generation=2, spec=None, error="x", status={"a": 1})
    assert again.status == {"written": True}
    recreated = reg.upsert_profile(
        "ns", "p", uid="other", generation=1, spec=None, error="x", status={"b": 2}
    )
    assert recreated.status == {"b": 2}


def test_webhook_view_lists_only_valid_profiles_of_the_namespace() -> None:
    reg = Registry()
    reg.upsert_profile("ns", "good", uid="1", generation=1, spec=_spec({"app": "t"}))
    reg.upsert_profile("ns", "bad", uid="2", generation=1, spec=None, error="broken")
    reg.upsert_profile("other", "x", uid="3", generation=1, spec=_spec({"app": "t"}))
    assert [e.name for e in reg.profiles_in("ns")] == ["good"]
    assert [e.name for e in reg.profiles_in("other")] == ["x"]


def test_a_pods_owner_is_its_controllers_uid_not_another_owner_reference() -> None:
    body = {
        "metadata": {
            "namespace": "ns",
            "name": "train-0",
            "uid": "u0",
            "ownerReferences": [
                {"kind": "ConfigMap", "name": "x", "uid": "cm-1"},
                {"kind": "Job", "name": "train", "uid": "job-1", "controller": True},
            ],
        },
        "status": {"phase": "Running"},
    }
    assert PodInfo.from_body(body, instrumented=True).owner == "job-1"
    body["metadata"]["ownerReferences"] = [{"kind": "ConfigMap", "name": "x", "uid": "cm-1"}]
    assert PodInfo.from_body(body, instrumented=True).owner is None
    del body["metadata"]["ownerReferences"]
    assert PodInfo.from_body(body, instrumented=True).owner is None
