"""Pod injection: native sidecar, environment, idempotence, opt-outs, restricted PSS."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest

from dam_operator.cluster.steps.injection import (
    ANNOTATION_INJECTED,
    ANNOTATION_PROFILE,
    INSTALL_CONTAINER,
    PROBE_DIR,
    SIDECAR_CONTAINER,
    TOKEN_VOLUME_NAME,
    VOLUME_NAME,
    InjectionError,
    InjectionSettings,
    build_injection,
    is_instrumented,
    should_inject,
)
from dam_operator.cluster.steps.spec import DAMProfileSpec, parse_spec
from tests.support.pss import violations

SETTINGS = InjectionSettings(image="ghcr.io/mlsys/dam-operator:0.1.0", operator_namespace="dam-system")


def _spec(**extra: Any) -> DAMProfileSpec:
    return parse_spec({"selector": {"matchLabels": {"app": "trainer"}}, **extra})


def _pod(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "train-", "labels": {"app": "trainer"}},
        "spec": {
            "containers": [{"name": "train", "image": "pytorch:2", "command": ["python", "train.py"]}],
            **spec,
        },
    }


def _inject(
    pod: dict[str, Any], spec: DAMProfileSpec | None = None, settings: InjectionSettings = SETTINGS
) -> dict[str, Any]:
    patch = build_injection(pod, "train-profile", spec or _spec(), settings).patch
    result: dict[str, Any] = jsonpatch.apply_patch(pod, patch)
    return result


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def test_sidecar_is_a_native_sidecar_after_the_probe_installer() -> None:
    pod = _inject(_pod())
    init = pod["spec"]["initContainers"]
    assert [c["name"] for c in init] == [INSTALL_CONTAINER, SIDECAR_CONTAINER]
    sidecar = init[1]
    assert sidecar["restartPolicy"] == "Always"
    assert "restartPolicy" not in init[0]  # the installer runs to completion before the sidecar starts
    assert init[0]["command"] == ["dam", "probe-install", PROBE_DIR]
    assert sidecar["command"][:4] == ["dam", "sidecar", "--port", "9450"]
    assert sidecar["ports"][0]["containerPort"] == 9450
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": 9450}
    assert sidecar["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert _env(sidecar)["DAM_PROBE_DIR"] == PROBE_DIR
    assert [c["name"] for c in pod["spec"]["containers"]] == ["train"]  # a Job can still complete
    assert "shareProcessNamespace" not in pod["spec"]  # not asked for: not shared
    assert pod["metadata"]["annotations"] == {
        ANNOTATION_INJECTED: "true",
        ANNOTATION_PROFILE: "train-profile",
    }


def test_training_container_gets_the_probe_dir_volume_and_pythonpath() -> None:
    pod = _inject(_pod())
    train = pod["spec"]["containers"][0]
    assert _env(train) == {
        "DAM_PROBE_DIR": PROBE_DIR,
        "PYTHONPATH": PROBE_DIR,
        "DAM_PROBE_EXIT_RECORD": "/dev/termination-log",  # core/v1's default path
    }
    assert {"name": VOLUME_NAME, "mountPath": PROBE_DIR, "readOnly": False} in train["volumeMounts"]
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == VOLUME_NAME)
    assert volume["emptyDir"]["medium"] == "Memory"
    assert volume["emptyDir"]["sizeLimit"] == SETTINGS.probe_volume_size_limit


def test_existing_pythonpath_is_kept_behind_the_probe_dir() -> None:
    pod = _pod()
    pod["spec"]["containers"][0]["env"] = [
        {"name": "PYTHONPATH", "value": "/app:/lib"},
        {"name": "X", "value": "1"},
    ]
    train = _inject(pod)["spec"]["containers"][0]
    assert _env(train)["PYTHONPATH"] == f"{PROBE_DIR}:/app:/lib"
    assert _env(train)["X"] == "1"


@pytest.mark.parametrize(
    ("container", "said"),
    [
        ({"terminationMessagePath": "/var/run/last-words"}, "/var/run/last-words"),
        (
            {"terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"},
            "/dev/termination-log",
        ),
        # Its users want the log's tail there: anything in the file would replace it.
        ({"terminationMessagePolicy": "FallbackToLogsOnError"}, None),
        ({"env": [{"name": "DAM_PROBE_EXIT_RECORD", "value": ""}]}, ""),  # the user's own value wins
    ],
    ids=["its-own-path", "the-default", "fallback-to-logs", "the-users-value"],
)
def test_the_probe_leaves_its_last_words_in_the_containers_own_termination_message(
    container: dict[str, Any], said: str | None
) -> None:
    pod = _pod()
    pod["spec"]["containers"][0].update(container)
    train = _inject(pod)["spec"]["containers"][0]
    assert _env(train).get("DAM_PROBE_EXIT_RECORD") == said


def test_pythonpath_from_a_configmap_is_left_alone() -> None:
    pod = _pod()
    ref = {"name": "PYTHONPATH", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "pp"}}}
    pod["spec"]["containers"][0]["env"] = [ref]
    train = _inject(pod)["spec"]["containers"][0]
    assert ref in train["env"]
    assert _env(train)["DAM_PROBE_DIR"] == PROBE_DIR


def test_every_training_container_is_prepared_and_user_init_containers_keep_their_order() -> None:
    pod = _pod(initContainers=[{"name": "fetch", "image": "busybox"}])
    pod["spec"]["containers"].append(
        {"name": "eval", "image": "pytorch:2", "volumeMounts": [{"name": "d", "mountPath": "/d"}]}
    )
    pod["spec"]["volumes"] = [{"name": "d", "emptyDir": {}}]
    out = _inject(pod)
    assert [c["name"] for c in out["spec"]["initContainers"]] == [
        INSTALL_CONTAINER,
        SIDECAR_CONTAINER,
        "fetch",
    ]
    for container in out["spec"]["containers"]:
        assert _env(container)["PYTHONPATH"] == PROBE_DIR
        assert any(m["name"] == VOLUME_NAME for m in container["volumeMounts"])
    assert [v["name"] for v in out["spec"]["volumes"]] == ["d", VOLUME_NAME, TOKEN_VOLUME_NAME]


def test_injection_is_idempotent() -> None:
    pod = _pod()
    once = _inject(pod)
    assert build_injection(once, "train-profile", _spec(), SETTINGS).patch == []
    assert _inject(once) == once
    assert should_inject(once, "ml", SETTINGS) == (False, "already-injected")


def test_a_user_volume_named_like_ours_is_never_reused_and_env_already_set_is_kept() -> None:
    pod = _pod()
    pod["spec"]["volumes"] = [{"name": VOLUME_NAME, "emptyDir": {}}]
    pod["spec"]["containers"][0]["env"] = [{"name": "DAM_PROBE_DIR", "value": PROBE_DIR}]
    out = _inject(pod)
    assert [v["name"] for v in out["spec"]["volumes"]] == [VOLUME_NAME, f"{VOLUME_NAME}-1", TOKEN_VOLUME_NAME]
    assert out["spec"]["volumes"][0] == {"name": VOLUME_NAME, "emptyDir": {}}
    assert [e["name"] for e in out["spec"]["containers"][0]["env"]] == [
        "DAM_PROBE_DIR",
        "PYTHONPATH",
        "DAM_PROBE_EXIT_RECORD",
    ]


def test_sidecar_added_by_hand_only_marks_the_pod() -> None:
    pod = _pod()
    pod["spec"]["containers"].append({"name": SIDECAR_CONTAINER, "image": "dam"})
    assert is_instrumented(pod)
    out = _inject(pod)
    assert out["spec"] == pod["spec"]
    assert out["metadata"]["annotations"][ANNOTATION_INJECTED] == "true"


def test_fallback_adds_a_plain_sidecar_container_for_old_clusters() -> None:
    out = _inject(_pod(), settings=SETTINGS.model_copy(update={"native_sidecar": False}))
    assert [c["name"] for c in out["spec"]["initContainers"]] == [INSTALL_CONTAINER]
    sidecar = out["spec"]["containers"][-1]
    assert sidecar["name"] == SIDECAR_CONTAINER and "restartPolicy" not in sidecar
    assert is_instrumented(out)


def test_spec_sidecar_settings_reach_the_container() -> None:
    settings = SETTINGS.model_copy(update={"allowed_images": ("registry.local/dam:dev",)})
    spec = _spec(
        sampling={"intervalSeconds": 2},
        sidecar={
            "image": "registry.local/dam:dev",
            "port": 9500,
            "imagePullPolicy": "Always",
            "resources": {"requests": {"cpu": "50m"}, "limits": {"memory": "256Mi"}},
        },
    )
    installer, sidecar = _inject(_pod(), spec, settings=settings)["spec"]["initContainers"]
    assert sidecar["image"] == installer["image"] == "registry.local/dam:dev"  # one the admin listed
    assert sidecar["imagePullPolicy"] == "Always"
    assert sidecar["command"] == [
        "dam",
        "sidecar",
        "--port",
        "9500",
        "--interval",
        "2",
        "--probe-dir",
        PROBE_DIR,
    ]
    assert sidecar["resources"] == {"requests": {"cpu": "50m"}, "limits": {"memory": "256Mi"}}


def test_guaranteed_pod_keeps_its_qos_class() -> None:
    pod = _pod()
    pod["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "8", "memory": "64Gi"}}
    out = _inject(pod)
    for c in out["spec"]["initContainers"]:
        assert c["resources"]["requests"] == c["resources"]["limits"]
    burstable = _inject(_pod())["spec"]["initContainers"][1]["resources"]
    assert burstable["requests"] != burstable["limits"]


def test_pod_using_the_sidecar_port_is_refused_with_the_fix() -> None:
    pod = _pod()
    pod["spec"]["containers"][0]["ports"] = [{"containerPort": 9450}]
    with pytest.raises(InjectionError, match=r"spec\.sidecar\.port"):
        build_injection(pod, "train-profile", _spec(), SETTINGS)


def test_host_pid_pod_does_not_get_share_process_namespace() -> None:
    # The API server rejects hostPID together with shareProcessNamespace.
    settings = SETTINGS.model_copy(update={"allow_share_process_namespace": True})
    out = _inject(_pod(hostPID=True), _spec(sidecar={"shareProcessNamespace": True}), settings=settings)
    assert "shareProcessNamespace" not in out["spec"]


@pytest.mark.parametrize(
    ("pod_update", "namespace", "reason"),
    [
        ({}, "kube-system", "excluded-namespace"),
        ({}, "dam-system", "excluded-namespace"),
        ({"metadata": {"annotations": {"dam.mlsys.dev/inject": "false"}}}, "ml", "opted-out"),
        ({"metadata": {"labels": {"dam.mlsys.dev/inject": "false"}}}, "ml", "opted-out"),
        ({"spec": {"os": {"name": "windows"}, "containers": []}}, "ml", "windows-pod"),
    ],
)
def test_pods_that_must_not_be_injected_say_why(
    pod_update: dict[str, Any], namespace: str, reason: str
) -> None:
    pod = _pod()
    for key, value in pod_update.items():
        pod[key] = {**pod[key], **value}
    assert should_inject(pod, namespace, SETTINGS) == (False, reason)


def test_ordinary_pod_is_eligible() -> None:
    assert should_inject(_pod(), "ml", SETTINGS) == (True, "eligible")
    assert (
        should_inject(_pod(), "ml", SETTINGS.model_copy(update={"excluded_namespaces": ("ml",)}))[0] is False
    )


def _restricted_pod() -> dict[str, Any]:
    pod = _pod()
    pod["spec"]["securityContext"] = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    pod["spec"]["containers"][0]["securityContext"] = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsUser": 1000,
    }
    return pod


def test_injected_pod_still_meets_the_restricted_pod_security_standard() -> None:
    pod = _restricted_pod()
    assert violations(pod) == []
    assert violations(_inject(pod)) == []


def test_added_containers_are_restricted_even_in_a_permissive_pod() -> None:
    out = _inject(_pod())
    added = [c for c in out["spec"]["initContainers"]]
    bare = {"metadata": {}, "spec": {"containers": added, "volumes": out["spec"]["volumes"]}}
    assert violations(bare) == []
    for c in added:
        sc = c["securityContext"]
        assert sc["runAsUser"] > 0 and sc["readOnlyRootFilesystem"] is True


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda p: p["spec"].update(hostNetwork=True), "hostNetwork"),
        (lambda p: p["spec"].update(hostPID=True), "hostPID"),
        (lambda p: p["spec"].update(hostIPC=True), "hostIPC"),
        (lambda p: p["spec"]["containers"][0]["securityContext"].update(privileged=True), "privileged"),
        (
            lambda p: p["spec"]["containers"][0]["securityContext"].update(allowPrivilegeEscalation=True),
            "allowPrivilegeEscalation",
        ),
        (
            lambda p: p["spec"]["containers"][0]["securityContext"].update(
                capabilities={"add": ["SYS_ADMIN"], "drop": ["ALL"]}
            ),
            "capabilities",
        ),
        (
            lambda p: p["spec"]["containers"][0]["securityContext"].update(capabilities={}),
            "drop must include ALL",
        ),
        (lambda p: p["spec"]["securityContext"].pop("runAsNonRoot"), "runAsNonRoot"),
        (
            lambda p: p["spec"]["containers"][0]["securityContext"].update(runAsUser=0),
            "runAsUser must not be 0",
        ),
        (
            lambda p: p["spec"]["securityContext"].update(seccompProfile={"type": "Unconfined"}),
            "seccompProfile",
        ),
        (lambda p: p["spec"].update(volumes=[{"name": "h", "hostPath": {"path": "/"}}]), "hostPath"),
        (
            lambda p: p["spec"].update(volumes=[{"name": "n", "nfs": {"server": "x", "path": "/"}}]),
            "type not allowed",
        ),
        (
            lambda p: p["spec"]["containers"][0].update(ports=[{"containerPort": 80, "hostPort": 80}]),
            "hostPort",
        ),
    ],
)
def test_pss_checker_catches_each_restricted_violation(mutate: Any, expected: str) -> None:
    pod = copy.deepcopy(_restricted_pod())
    mutate(pod)
    found = violations(pod)
    assert any(expected in v for v in found), found
