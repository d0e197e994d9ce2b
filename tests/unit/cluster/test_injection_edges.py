"""Injection into pods that are not what the injector expects (issue 17's hostile-input set, builders).

The API-server side of the same cases is tests/integration/test_hostile_webhook.py.
"""

from __future__ import annotations

from typing import Any

import jsonpatch
import pytest

from dam_operator.cluster.steps import status as st
from dam_operator.cluster.steps.injection import (
    ANNOTATION_HOST_NETWORK_PORT,
    ANNOTATION_NOTES,
    INSTALL_CONTAINER,
    NOTE_NO_SHARED_PROCESS_NAMESPACE,
    NOTE_PYTHONPATH_ENV_FROM,
    NOTE_PYTHONPATH_REF,
    NOTE_SKIP_HOST_NETWORK,
    NOTE_SKIP_POLICY,
    NOTE_SKIP_PROBE_PATH,
    OPTED_OUT,
    PROBE_DIR,
    SIDECAR_CONTAINER,
    TOKEN_PATH,
    VOLUME_NAME,
    InjectionError,
    InjectionSettings,
    build_injection,
    pod_notes,
    sidecar_refusals,
)
from dam_operator.cluster.steps.spec import parse_spec

SETTINGS = InjectionSettings(image="ghcr.io/mlsys/dam-operator:0.1.0")
SPEC = parse_spec({"selector": {"matchLabels": {"app": "trainer"}}})
SHARING = parse_spec(
    {"selector": {"matchLabels": {"app": "trainer"}}, "sidecar": {"shareProcessNamespace": True}}
)
SHARE_ALLOWED = SETTINGS.model_copy(update={"allow_share_process_namespace": True})
TENANT_IMAGE = "evil.example/dam:latest"


def _with_image(image: str) -> Any:
    return parse_spec({"selector": {"matchLabels": {"app": "trainer"}}, "sidecar": {"image": image}})


def _pod(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "t", "labels": {"app": "trainer"}},
        "spec": {"containers": [{"name": "train", "image": "pytorch:2"}], **spec},
    }


def _inject(pod: dict[str, Any]) -> tuple[dict[str, Any], list[str], list[str]]:
    made = build_injection(pod, "p", SPEC, SETTINGS)
    return jsonpatch.apply_patch(pod, made.patch), made.warnings, made.notes


def _ours(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in pod["spec"]["initContainers"] if c["name"] in (INSTALL_CONTAINER, SIDECAR_CONTAINER)]


def test_injected_containers_hide_the_api_token_path_and_training_containers_do_not() -> None:
    out, _, _ = _inject(_pod())
    for container in _ours(out):
        mount = next(m for m in container["volumeMounts"] if m["mountPath"] == TOKEN_PATH)
        volume = next(v for v in out["spec"]["volumes"] if v["name"] == mount["name"])
        assert mount["readOnly"] is True
        assert volume == {"name": mount["name"], "emptyDir": {"medium": "Memory", "sizeLimit": "64Ki"}}
    assert all(m["mountPath"] != TOKEN_PATH for m in out["spec"]["containers"][0]["volumeMounts"])


def test_a_pod_gets_no_shared_process_namespace_unless_its_profile_asks() -> None:
    out, warnings, notes = _inject(_pod())
    assert "shareProcessNamespace" not in out["spec"]
    assert notes == [] and not any("shareProcessNamespace" in w for w in warnings)
    # A pod that shares on its own keeps it: the pod's creator chose it, not the profile's writer.
    assert _inject(_pod(shareProcessNamespace=True))[0]["spec"]["shareProcessNamespace"] is True
    asked = build_injection(_pod(), "p", SHARING, SHARE_ALLOWED)
    assert jsonpatch.apply_patch(_pod(), asked.patch)["spec"]["shareProcessNamespace"] is True


def test_explicit_share_process_namespace_false_is_kept_and_said_when_the_profile_asks() -> None:
    pod = _pod(shareProcessNamespace=False)
    made = build_injection(pod, "p", SHARING, SHARE_ALLOWED)
    out, warnings, notes = jsonpatch.apply_patch(pod, made.patch), made.warnings, made.notes
    assert out["spec"]["shareProcessNamespace"] is False
    assert notes == [NOTE_NO_SHARED_PROCESS_NAMESPACE]
    assert out["metadata"]["annotations"][ANNOTATION_NOTES] == NOTE_NO_SHARED_PROCESS_NAMESPACE
    assert any("shareProcessNamespace: false" in w and "probe" in w for w in warnings)
    # Not asked: nothing to say (not sharing is the default).
    assert _inject(_pod(shareProcessNamespace=False))[2] == []


def test_a_profile_asking_for_a_shared_namespace_the_admin_does_not_allow_instruments_nothing() -> None:
    (refusal,) = sidecar_refusals(SHARING, SETTINGS)
    assert "spec.sidecar.shareProcessNamespace" in refusal
    assert (
        "sidecar.allowShareProcessNamespace" in refusal
        and "DAM_SIDECAR_ALLOW_SHARE_PROCESS_NAMESPACE" in refusal
    )
    with pytest.raises(InjectionError) as raised:
        build_injection(_pod(), "p", SHARING, SETTINGS)
    assert raised.value.note == NOTE_SKIP_POLICY
    assert "spec.sidecar.shareProcessNamespace" in str(raised.value)
    assert sidecar_refusals(SHARING, SHARE_ALLOWED) == ()


def test_a_tenant_image_is_refused_and_never_reaches_a_pod() -> None:
    spec = _with_image(TENANT_IMAGE)
    (refusal,) = sidecar_refusals(spec, SETTINGS)
    assert "spec.sidecar.image" in refusal and TENANT_IMAGE in refusal
    assert "sidecar.allowedImages" in refusal and "DAM_SIDECAR_ALLOWED_IMAGES" in refusal
    with pytest.raises(InjectionError) as raised:
        build_injection(_pod(), "p", spec, SETTINGS)
    assert raised.value.note == NOTE_SKIP_POLICY
    # A tag or digest of its own is another image: the list is matched exactly.
    listed = SETTINGS.model_copy(update={"allowed_images": ("evil.example/dam:1.0",)})
    assert sidecar_refusals(spec, listed)
    # Naming the admin's own image is no choice at all; an image the admin listed is used.
    assert sidecar_refusals(_with_image(SETTINGS.image), SETTINGS) == ()
    allowed = SETTINGS.model_copy(update={"allowed_images": (TENANT_IMAGE,)})
    assert sidecar_refusals(spec, allowed) == ()
    out = jsonpatch.apply_patch(_pod(), build_injection(_pod(), "p", spec, allowed).patch)
    assert {c["image"] for c in _ours(out)} == {TENANT_IMAGE}
    # A profile that injects nothing chooses nothing.
    off = parse_spec(
        {"selector": {"matchLabels": {"app": "trainer"}}, "sidecar": {"inject": False, "image": TENANT_IMAGE}}
    )
    assert sidecar_refusals(off, SETTINGS) == ()


def test_every_string_the_injection_writes_into_a_pod_is_the_admins_or_a_bounded_number() -> None:
    """Each field of spec.sidecar that reaches the pod, with a tenant's values: no tenant text in a
    command, an environment value, an image or a security context (docs/security.md)."""
    spec = parse_spec(
        {
            "selector": {"matchLabels": {"app": "trainer"}},
            "sampling": {"intervalSeconds": 0.5},
            "sidecar": {
                "imagePullPolicy": "Never",
                "port": 40000,
                "resources": {"requests": {"cpu": "10m"}, "limits": {"memory": "64Mi"}},
            },
        }
    )
    out = jsonpatch.apply_patch(_pod(), build_injection(_pod(), "p", spec, SETTINGS).patch)
    installer, sidecar = _ours(out)
    assert {installer["image"], sidecar["image"]} == {SETTINGS.image}
    assert installer["command"] == ["dam", "probe-install", PROBE_DIR]
    assert sidecar["command"] == [
        "dam",
        "sidecar",
        "--port",
        "40000",
        "--interval",
        "0.5",
        "--probe-dir",
        PROBE_DIR,
    ]
    for container in (installer, sidecar):
        ctx = container["securityContext"]
        assert (
            ctx["runAsNonRoot"]
            and not ctx["allowPrivilegeEscalation"]
            and ctx["capabilities"] == {"drop": ["ALL"]}
        )
    assert "shareProcessNamespace" not in out["spec"] and "hostPID" not in out["spec"]


@pytest.mark.parametrize(
    "volume",
    [
        {"name": VOLUME_NAME, "configMap": {"name": "cfg"}},  # read-only
        {"name": VOLUME_NAME, "persistentVolumeClaim": {"claimName": "data"}},
        {"name": VOLUME_NAME, "hostPath": {"path": "/srv"}},
    ],
)
def test_a_user_volume_named_dam_probe_is_never_used_for_the_probe(volume: dict[str, Any]) -> None:
    pod = _pod(volumes=[volume])
    out, warnings, _ = _inject(pod)
    assert out["spec"]["volumes"][0] == volume  # untouched
    ours = {m["name"] for c in _ours(out) for m in c["volumeMounts"] if m["mountPath"] == PROBE_DIR}
    assert ours == {f"{VOLUME_NAME}-1"}
    assert next(v for v in out["spec"]["volumes"] if v["name"] == f"{VOLUME_NAME}-1")["emptyDir"]
    train = out["spec"]["containers"][0]
    assert [m["name"] for m in train["volumeMounts"]] == [f"{VOLUME_NAME}-1"]
    assert any(VOLUME_NAME in w and "left alone" in w for w in warnings)


def test_a_user_container_named_like_the_installer_keeps_its_name_and_ours_is_renamed() -> None:
    pod = _pod(initContainers=[{"name": INSTALL_CONTAINER, "image": "busybox"}])
    out, warnings, _ = _inject(pod)
    names = [c["name"] for c in out["spec"]["initContainers"]]
    assert names == [f"{INSTALL_CONTAINER}-1", SIDECAR_CONTAINER, INSTALL_CONTAINER]
    assert out["spec"]["initContainers"][2] == {"name": INSTALL_CONTAINER, "image": "busybox"}
    assert warnings


def test_a_mount_at_the_probe_directory_moves_ours_and_everything_follows() -> None:
    pod = _pod()
    pod["spec"]["volumes"] = [{"name": "mine", "emptyDir": {}}]
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "mine", "mountPath": PROBE_DIR}]
    out, warnings, _ = _inject(pod)
    moved = f"{PROBE_DIR}-1"
    train = out["spec"]["containers"][0]
    assert train["volumeMounts"][0] == {"name": "mine", "mountPath": PROBE_DIR}
    assert {"name": VOLUME_NAME, "mountPath": moved, "readOnly": False} in train["volumeMounts"]
    env = {e["name"]: e["value"] for e in train["env"]}
    assert env == {
        "DAM_PROBE_DIR": moved,
        "PYTHONPATH": moved,
        "DAM_PROBE_EXIT_RECORD": "/dev/termination-log",
    }
    installer, sidecar = _ours(out)
    assert installer["command"] == ["dam", "probe-install", moved]
    assert sidecar["command"][-2:] == ["--probe-dir", moved]
    assert any(moved in w for w in warnings)


def test_no_free_probe_directory_skips_the_pod_with_a_note() -> None:
    pod = _pod()
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "mine", "mountPath": "/dam"}]
    with pytest.raises(InjectionError) as caught:
        build_injection(pod, "p", SPEC, SETTINGS)
    assert caught.value.note == NOTE_SKIP_PROBE_PATH


def test_a_host_network_pod_needs_its_consent_annotation_naming_the_sidecar_port() -> None:
    pod = _pod(hostNetwork=True)
    with pytest.raises(InjectionError, match=ANNOTATION_HOST_NETWORK_PORT) as caught:
        build_injection(pod, "p", SPEC, SETTINGS)
    assert caught.value.note == NOTE_SKIP_HOST_NETWORK
    pod["metadata"]["annotations"] = {ANNOTATION_HOST_NETWORK_PORT: "9999"}
    with pytest.raises(InjectionError, match=r"spec\.sidecar\.port"):
        build_injection(pod, "p", SPEC, SETTINGS)
    pod["metadata"]["annotations"] = {ANNOTATION_HOST_NETWORK_PORT: "9450"}
    out, _, _ = _inject(pod)
    assert out["spec"]["hostNetwork"] is True
    assert _ours(out)[1]["ports"][0]["containerPort"] == 9450


def test_pythonpath_from_a_reference_is_left_alone_and_warned() -> None:
    pod = _pod()
    ref = {"name": "PYTHONPATH", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "pp"}}}
    pod["spec"]["containers"][0]["env"] = [ref]
    out, warnings, notes = _inject(pod)
    assert out["spec"]["containers"][0]["env"][0] == ref
    assert NOTE_PYTHONPATH_REF in notes
    assert any("valueFrom" in w and "train" in w for w in warnings)


def test_pythonpath_that_env_from_may_set_is_extended_not_replaced() -> None:
    pod = _pod()
    pod["spec"]["containers"][0]["envFrom"] = [{"configMapRef": {"name": "cfg"}}]
    out, warnings, notes = _inject(pod)
    env = {e["name"]: e["value"] for e in out["spec"]["containers"][0]["env"]}
    assert env["PYTHONPATH"] == f"{PROBE_DIR}:$(PYTHONPATH)"
    assert NOTE_PYTHONPATH_ENV_FROM in notes and any("envFrom" in w for w in warnings)


def test_injection_stays_idempotent_for_every_edge_pod() -> None:
    pods = [
        _pod(shareProcessNamespace=False),
        _pod(volumes=[{"name": VOLUME_NAME, "hostPath": {"path": "/x"}}]),
    ]
    for pod in pods:
        once, _, _ = _inject(pod)
        assert build_injection(once, "p", SPEC, SETTINGS).patch == []


def test_pod_notes_read_the_annotation_and_the_opt_out() -> None:
    pod = _pod()
    pod["metadata"]["annotations"] = {ANNOTATION_NOTES: "a, b", "dam.mlsys.dev/inject": "false"}
    assert pod_notes(pod) == ("a", "b", OPTED_OUT)


def test_the_instrumented_condition_says_per_cause_what_to_do() -> None:
    notes = {"a": (OPTED_OUT,), "b": (NOTE_SKIP_HOST_NETWORK,)}
    cond = st.instrumented_condition(3, ["a", "b", "c"], 1, notes=notes)
    assert (cond["status"], cond["reason"]) == ("False", st.REASON_NOT_INSTRUMENTED)
    message = cond["message"]
    assert "a: opted out with dam.mlsys.dev/inject=false" in message and "remove it" in message
    assert "b: use hostNetwork" in message and ANNOTATION_HOST_NETWORK_PORT in message
    assert "c: created while the webhook was down" in message and "kubectl delete pod" in message
    assert "recreate them" not in message


def test_pods_without_a_shared_namespace_or_with_an_unknown_pythonpath_are_reported() -> None:
    cond = st.instrumented_condition(2, [], 1, notes={"a": (NOTE_NO_SHARED_PROCESS_NAMESPACE,)})
    assert (cond["status"], cond["reason"]) == ("True", st.REASON_ALL_INSTRUMENTED)
    assert "shareProcessNamespace: false" in cond["message"] and "probe" in cond["message"]
    cond = st.instrumented_condition(2, [], 1, notes={"b": (NOTE_PYTHONPATH_REF,)})
    assert (cond["status"], cond["reason"]) == ("Unknown", st.REASON_PROBE_UNCERTAIN)
    assert "b" in cond["message"] and "literal value" in cond["message"]
