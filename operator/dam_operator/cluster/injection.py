"""Pod injection: pure builders of the JSON patch the mutating webhook returns.

The patch adds to a matched training pod:

- ``dam-probe-install``: a plain init container that copies the automatic
  instrumentation into the shared volume (``dam probe-install /dam/probe``);
- ``dam-sidecar``: the sidecar as a *native* sidecar (an init container with
  ``restartPolicy: Always``, Kubernetes ≥ 1.29) so Jobs still complete; with
  ``native_sidecar=False`` a plain container instead (older clusters);
- ``dam-probe``: a small in-memory ``emptyDir`` mounted at ``/dam/probe`` in the
  training containers and the sidecar;
- on every training container ``DAM_PROBE_DIR`` and ``PYTHONPATH`` (``/dam/probe``
  prepended to a literal value already in the pod spec);
- ``shareProcessNamespace: true`` (the sidecar reads the training process's CPU);
- annotations ``dam.mlsys.dev/injected`` and ``dam.mlsys.dev/profile``;
- with ``spec.actions.mode`` Apply or InPlace (``ActionOverrides``, derived from the profile's
  ``status.actions`` by ``actions.desired_for``): ``DAM_LOADER_OVERRIDES`` on every training
  container that gets the probe, a higher CPU limit on the training container, and the
  annotation ``dam.mlsys.dev/action`` saying which action the pod carries. Nothing of it goes to
  a pod (or container) the probe cannot reach.

Every container it adds meets the *restricted* Pod Security Standard. The patch
is computed as a difference against the pod: each piece is added only where it
is missing, so re-running the builder on a patched pod yields ``[]``. No I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from dam_operator.cluster.spec import DAMProfileSpec, quantity_value
from dam_probe.overrides import loader_override_env

__all__ = [
    "ANNOTATION_ACTION",
    "ANNOTATION_DEFAULT_CONTAINER",
    "ANNOTATION_INJECT",
    "ANNOTATION_INJECTED",
    "ANNOTATION_PROFILE",
    "INSTALL_CONTAINER",
    "LABEL_INJECT",
    "PROBE_DIR",
    "SIDECAR_CONTAINER",
    "VOLUME_NAME",
    "ActionOverrides",
    "InjectionError",
    "InjectionSettings",
    "build_injection_patch",
    "is_instrumented",
    "opted_out",
    "resize_patch",
    "restricted_security_context",
    "should_inject",
    "training_container_index",
]

ANNOTATION_INJECT = "dam.mlsys.dev/inject"  # "false" opts a pod out
LABEL_INJECT = "dam.mlsys.dev/inject"  # the same as a label: the webhook's objectSelector sees labels only
ANNOTATION_INJECTED = "dam.mlsys.dev/injected"
ANNOTATION_PROFILE = "dam.mlsys.dev/profile"
ANNOTATION_ACTION = "dam.mlsys.dev/action"  # "ID:applied" / "ID:withheld": the action the pod carries
ANNOTATION_DEFAULT_CONTAINER = "kubectl.kubernetes.io/default-container"
SIDECAR_CONTAINER = "dam-sidecar"
INSTALL_CONTAINER = "dam-probe-install"
VOLUME_NAME = "dam-probe"
PROBE_DIR = "/dam/probe"
METRICS_PORT_NAME = "dam-metrics"

_OPT_OUT_VALUES = frozenset({"false", "no", "off", "0", "disabled"})


@dataclass(frozen=True)
class ActionOverrides:
    """What the webhook applies to a new pod for ``spec.actions`` (``actions.desired_for``)."""

    label: str
    """The ``dam.mlsys.dev/action`` annotation: ``"ID:applied"`` or ``"ID:withheld"``."""
    loader: Mapping[str, int | bool] = field(default_factory=dict)
    """DataLoader settings for ``DAM_LOADER_OVERRIDES`` (empty: none)."""
    cpu: str | None = None
    """CPU limit of the training container, a quantity (None: unchanged)."""


class InjectionError(ValueError):
    """The pod cannot take the sidecar as it is (e.g. its port is taken); the message says why."""


class InjectionSettings(BaseModel):
    """What the operator decides about injection, from its own settings (not the profile)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    image: Annotated[str, Field(min_length=1, max_length=512)]
    image_pull_policy: str | None = None
    operator_namespace: Annotated[str, Field(min_length=1, max_length=63)] = "dam-system"
    excluded_namespaces: tuple[str, ...] = ("kube-system",)
    run_as_user: Annotated[int, Field(ge=1, le=2**31 - 1)] = 65532
    run_as_group: Annotated[int, Field(ge=1, le=2**31 - 1)] = 65532
    native_sidecar: bool = True
    probe_volume_size_limit: str = "16Mi"
    requests: Mapping[str, str] = Field(default_factory=lambda: {"cpu": "20m", "memory": "48Mi"})
    limits: Mapping[str, str] = Field(default_factory=lambda: {"cpu": "200m", "memory": "128Mi"})

    def never_inject_namespaces(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((*self.excluded_namespaces, "kube-system", self.operator_namespace)))


# ---------------------------------------------------------------- decisions


def _meta(pod: Mapping[str, Any], key: str) -> Mapping[str, str]:
    value = (pod.get("metadata") or {}).get(key) or {}
    return value if isinstance(value, Mapping) else {}


def _spec(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    value = pod.get("spec") or {}
    return value if isinstance(value, Mapping) else {}


def _containers(pod: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    value = _spec(pod).get(key) or []
    return [c for c in value if isinstance(c, Mapping)] if isinstance(value, list) else []


def is_instrumented(pod: Mapping[str, Any]) -> bool:
    """True when the pod carries the dam sidecar (native or plain), whoever added it."""
    return any(
        c.get("name") == SIDECAR_CONTAINER
        for key in ("initContainers", "containers")
        for c in _containers(pod, key)
    )


def opted_out(pod: Mapping[str, Any]) -> bool:
    for source in (_meta(pod, "annotations"), _meta(pod, "labels")):
        value = source.get(ANNOTATION_INJECT)
        if isinstance(value, str) and value.strip().lower() in _OPT_OUT_VALUES:
            return True
    return False


def should_inject(pod: Mapping[str, Any], namespace: str, settings: InjectionSettings) -> tuple[bool, str]:
    """Whether the webhook may inject this pod at all (before any profile matches), and why not.

    Reasons: ``excluded-namespace``, ``opted-out``, ``already-injected``,
    ``windows-pod``; ``eligible`` when it may.
    """
    if namespace in settings.never_inject_namespaces():
        return False, "excluded-namespace"
    if opted_out(pod):
        return False, "opted-out"
    if is_instrumented(pod) or _meta(pod, "annotations").get(ANNOTATION_INJECTED) == "true":
        return False, "already-injected"
    os_name = (_spec(pod).get("os") or {}).get("name") if isinstance(_spec(pod).get("os"), Mapping) else None
    if os_name == "windows":
        return False, "windows-pod"
    return True, "eligible"


# ---------------------------------------------------------------- containers


def restricted_security_context(settings: InjectionSettings) -> dict[str, Any]:
    """The container security context of the restricted Pod Security Standard."""
    return {
        "runAsNonRoot": True,
        "runAsUser": settings.run_as_user,
        "runAsGroup": settings.run_as_group,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _resources(pod: Mapping[str, Any], spec: DAMProfileSpec, settings: InjectionSettings) -> dict[str, Any]:
    if spec.sidecar.resources is not None:
        out: dict[str, Any] = spec.sidecar.resources.to_k8s()
    else:
        out = {"requests": dict(settings.requests), "limits": dict(settings.limits)}
    limits = out.get("limits") or {}
    if _is_guaranteed(pod) and {"cpu", "memory"} <= set(limits):
        # Keep the pod's Guaranteed QoS class (CPU pinning, eviction order): requests = limits.
        out["requests"] = dict(limits)
    return out


def _is_guaranteed(pod: Mapping[str, Any]) -> bool:
    containers = _containers(pod, "containers") + _containers(pod, "initContainers")
    if not containers:
        return False
    for c in containers:
        res = c.get("resources") or {}
        limits = res.get("limits") or {}
        requests = res.get("requests") or limits  # requests default to limits
        for key in ("cpu", "memory"):
            if key not in limits or key not in requests:
                return False
            try:
                if quantity_value(str(requests[key])) != quantity_value(str(limits[key])):
                    return False
            except ValueError:
                return False
    return True


def _probe_mount(read_only: bool) -> dict[str, Any]:
    return {"name": VOLUME_NAME, "mountPath": PROBE_DIR, "readOnly": read_only}


def _sidecar(
    pod: Mapping[str, Any], spec: DAMProfileSpec, settings: InjectionSettings, native: bool
) -> dict[str, Any]:
    port = spec.sidecar.port
    interval = spec.sampling.interval_seconds
    probe = {"httpGet": {"path": "/healthz", "port": port}, "timeoutSeconds": 2}
    container: dict[str, Any] = {
        "name": SIDECAR_CONTAINER,
        "image": spec.sidecar.image or settings.image,
        "command": [
            "dam",
            "sidecar",
            "--port",
            str(port),
            "--interval",
            f"{interval:g}",
            "--probe-dir",
            PROBE_DIR,
        ],
        "ports": [{"name": METRICS_PORT_NAME, "containerPort": port, "protocol": "TCP"}],
        "env": [
            {"name": "DAM_PROBE_DIR", "value": PROBE_DIR},
            {"name": "DAM_PORT", "value": str(port)},
            {"name": "DAM_INTERVAL_SECONDS", "value": f"{interval:g}"},
        ],
        "resources": _resources(pod, spec, settings),
        "readinessProbe": {**probe, "periodSeconds": 10, "failureThreshold": 3},
        "livenessProbe": {**probe, "initialDelaySeconds": 10, "periodSeconds": 20, "failureThreshold": 3},
        "volumeMounts": [_probe_mount(read_only=True)],
        "securityContext": restricted_security_context(settings),
    }
    if native:
        container["restartPolicy"] = "Always"
    pull = spec.sidecar.image_pull_policy or settings.image_pull_policy
    if pull:
        container["imagePullPolicy"] = pull
    return container


def _installer(pod: Mapping[str, Any], spec: DAMProfileSpec, settings: InjectionSettings) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": INSTALL_CONTAINER,
        "image": spec.sidecar.image or settings.image,
        "command": ["dam", "probe-install", PROBE_DIR],
        "resources": _resources(pod, spec, settings),
        "volumeMounts": [_probe_mount(read_only=False)],
        "securityContext": restricted_security_context(settings),
    }
    pull = spec.sidecar.image_pull_policy or settings.image_pull_policy
    if pull:
        container["imagePullPolicy"] = pull
    return container


# ---------------------------------------------------------------- the patch


def _escape(segment: str) -> str:
    return segment.replace("~", "~0").replace("/", "~1")


def _declared_ports(pod: Mapping[str, Any]) -> set[int]:
    ports: set[int] = set()
    for key in ("containers", "initContainers"):
        for c in _containers(pod, key):
            for p in c.get("ports") or []:
                if isinstance(p, Mapping) and isinstance(p.get("containerPort"), int):
                    ports.add(p["containerPort"])
    return ports


def _takes_probe(container: Mapping[str, Any]) -> bool:
    """The probe gets onto this container's PYTHONPATH (one taken from a Secret/ConfigMap cannot)."""
    env = container.get("env")
    for e in env if isinstance(env, list) else []:
        if isinstance(e, Mapping) and e.get("name") == "PYTHONPATH" and "valueFrom" in e:
            return False
    return True


def _env_ops(
    base: str, container: Mapping[str, Any], extra: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    env = container.get("env")
    env_list: list[Any] = list(env) if isinstance(env, list) else []
    index = {e.get("name"): i for i, e in enumerate(env_list) if isinstance(e, Mapping)}
    ops: list[dict[str, Any]] = []
    wanted: list[dict[str, Any]] = []

    if "DAM_PROBE_DIR" in index:
        i = index["DAM_PROBE_DIR"]
        if env_list[i] != {"name": "DAM_PROBE_DIR", "value": PROBE_DIR}:
            ops.append(
                {
                    "op": "replace",
                    "path": f"{base}/env/{i}",
                    "value": {"name": "DAM_PROBE_DIR", "value": PROBE_DIR},
                }
            )
    else:
        wanted.append({"name": "DAM_PROBE_DIR", "value": PROBE_DIR})

    if "PYTHONPATH" in index:
        i = index["PYTHONPATH"]
        entry = env_list[i]
        value = entry.get("value")
        if "valueFrom" not in entry:
            parts = (value or "").split(":") if value else []
            if PROBE_DIR not in parts:
                new = PROBE_DIR if not value else f"{PROBE_DIR}:{value}"
                ops.append(
                    {
                        "op": "replace",
                        "path": f"{base}/env/{i}",
                        "value": {"name": "PYTHONPATH", "value": new},
                    }
                )
        # A PYTHONPATH taken from a Secret/ConfigMap cannot be extended here; left as it is.
    else:
        wanted.append({"name": "PYTHONPATH", "value": PROBE_DIR})

    # The user's own value of a variable wins (e.g. their DAM_LOADER_OVERRIDES).
    wanted.extend({"name": k, "value": v} for k, v in (extra or {}).items() if k not in index)

    if wanted:
        if env is None or not isinstance(env, list):
            ops.append({"op": "add", "path": f"{base}/env", "value": wanted})
        else:
            ops.extend({"op": "add", "path": f"{base}/env/-", "value": w} for w in wanted)
    return ops


def _mount_ops(base: str, container: Mapping[str, Any]) -> list[dict[str, Any]]:
    mounts = container.get("volumeMounts")
    mount_list: list[Any] = list(mounts) if isinstance(mounts, list) else []
    if any(
        isinstance(m, Mapping) and (m.get("mountPath") == PROBE_DIR or m.get("name") == VOLUME_NAME)
        for m in mount_list
    ):
        return []
    mount = _probe_mount(read_only=False)
    if not isinstance(mounts, list):
        return [{"op": "add", "path": f"{base}/volumeMounts", "value": [mount]}]
    return [{"op": "add", "path": f"{base}/volumeMounts/-", "value": mount}]


def build_injection_patch(
    pod: Mapping[str, Any],
    profile_name: str,
    spec: DAMProfileSpec,
    settings: InjectionSettings,
    actions: ActionOverrides | None = None,
) -> list[dict[str, Any]]:
    """RFC 6902 operations that instrument ``pod`` for ``profile_name``; ``[]`` when nothing is missing.

    ``actions`` (None in mode Recommend, or with no action yet) adds the action's settings
    to the containers the probe reaches, and the ``dam.mlsys.dev/action`` annotation.

    Raises ``InjectionError`` when the pod cannot take the sidecar (a container
    already declares the sidecar's port); the webhook then admits the pod unchanged
    with a warning, and the profile's status reports it as not instrumented.
    """
    pod_spec = _spec(pod)
    ops: list[dict[str, Any]] = []

    # Annotations first: they are what marks the pod injected.
    annotations = (pod.get("metadata") or {}).get("annotations")
    wanted_annotations = {ANNOTATION_INJECTED: "true", ANNOTATION_PROFILE: profile_name}
    if is_instrumented(pod) and annotations and annotations.get(ANNOTATION_INJECTED) == "true":
        return []
    if is_instrumented(pod):
        # A sidecar someone else put there: only mark the pod, change nothing else.
        return _annotation_ops(annotations, {ANNOTATION_INJECTED: "true"})
    if spec.sidecar.port in _declared_ports(pod):
        raise InjectionError(
            f"a container already uses port {spec.sidecar.port}; "
            "set spec.sidecar.port of the DAMProfile to a free port"
        )
    ops.extend(_annotation_ops(annotations, wanted_annotations))

    if not pod_spec.get("hostPID") and pod_spec.get("shareProcessNamespace") is not True:
        # hostPID pods see every process already (and may not set both).
        ops.append({"op": "add", "path": "/spec/shareProcessNamespace", "value": True})

    volumes = pod_spec.get("volumes")
    if not (
        isinstance(volumes, list)
        and any(isinstance(v, Mapping) and v.get("name") == VOLUME_NAME for v in volumes)
    ):
        volume = {
            "name": VOLUME_NAME,
            "emptyDir": {"medium": "Memory", "sizeLimit": settings.probe_volume_size_limit},
        }
        if isinstance(volumes, list):
            ops.append({"op": "add", "path": "/spec/volumes/-", "value": volume})
        else:
            ops.append({"op": "add", "path": "/spec/volumes", "value": [volume]})

    containers = _containers(pod, "containers")
    loader_env = loader_override_env(actions.loader) if actions is not None and actions.loader else {}
    cpu_index = training_container_index(pod)
    carried = False
    for i, container in enumerate(containers):
        base = f"/spec/containers/{i}"
        probe = _takes_probe(container)
        carried = carried or probe
        ops.extend(_env_ops(base, container, loader_env if probe else None))
        ops.extend(_mount_ops(base, container))
        if probe and i == cpu_index and actions is not None and actions.cpu is not None:
            ops.extend(_cpu_ops(base, container, actions.cpu))
    if actions is not None and carried:
        ops.extend(_annotation_ops(annotations, {ANNOTATION_ACTION: actions.label}, after_add=True))

    installer = _installer(pod, spec, settings)
    init_names = {c.get("name") for c in _containers(pod, "initContainers")}
    new_init: list[dict[str, Any]] = []
    if INSTALL_CONTAINER not in init_names:
        new_init.append(installer)
    if settings.native_sidecar:
        new_init.append(_sidecar(pod, spec, settings, native=True))
    else:
        ops.append(
            {"op": "add", "path": "/spec/containers/-", "value": _sidecar(pod, spec, settings, native=False)}
        )
    if new_init:
        if isinstance(pod_spec.get("initContainers"), list):
            # In front, in order: the probe is installed before anything else runs.
            ops.extend(
                {"op": "add", "path": f"/spec/initContainers/{i}", "value": c} for i, c in enumerate(new_init)
            )
        else:
            ops.append({"op": "add", "path": "/spec/initContainers", "value": new_init})
    return ops


def _annotation_ops(
    annotations: Any, wanted: Mapping[str, str], *, after_add: bool = False
) -> list[dict[str, Any]]:
    """Ops that set ``wanted``; ``after_add``: an earlier op of the patch created the mapping."""
    if not isinstance(annotations, Mapping):
        if after_add:
            return [
                {"op": "add", "path": f"/metadata/annotations/{_escape(k)}", "value": v}
                for k, v in wanted.items()
            ]
        return [{"op": "add", "path": "/metadata/annotations", "value": dict(wanted)}]
    return [
        {"op": "add", "path": f"/metadata/annotations/{_escape(k)}", "value": v}
        for k, v in wanted.items()
        if annotations.get(k) != v
    ]


# ---------------------------------------------------------------- CPU (actions)


def training_container_index(pod: Mapping[str, Any]) -> int:
    """The container whose CPU an action raises: the one ``kubectl.kubernetes.io/default-container``
    names, else the first container that is not the dam sidecar."""
    containers = _containers(pod, "containers")
    named = _meta(pod, "annotations").get(ANNOTATION_DEFAULT_CONTAINER)
    for i, c in enumerate(containers):
        if named and c.get("name") == named:
            return i
    return next((i for i, c in enumerate(containers) if c.get("name") != SIDECAR_CONTAINER), 0)


def _cpu_change(container: Mapping[str, Any], cpu: str) -> tuple[bool, bool]:
    """(raise the limit, raise the request too). Only a CPU limit below ``cpu`` is raised (a
    container without a limit is not limited, and an action never lowers one); the request
    follows when it equals the limit (Guaranteed QoS stays Guaranteed)."""
    resources = container.get("resources")
    resources = resources if isinstance(resources, Mapping) else {}
    limits: Mapping[str, Any] = resources.get("limits") or {}
    requests: Mapping[str, Any] = resources.get("requests") or {}
    if not isinstance(limits, Mapping) or not isinstance(requests, Mapping):
        return False, False
    try:
        if "cpu" not in limits or quantity_value(str(limits["cpu"])) >= quantity_value(cpu):
            return False, False
        request_follows = "cpu" in requests and quantity_value(str(requests["cpu"])) == quantity_value(
            str(limits["cpu"])
        )
    except ValueError:
        return False, False
    return True, request_follows


def _cpu_ops(base: str, container: Mapping[str, Any], cpu: str) -> list[dict[str, Any]]:
    limit, request = _cpu_change(container, cpu)
    ops = []
    if limit:
        ops.append({"op": "replace", "path": f"{base}/resources/limits/cpu", "value": cpu})
    if request:
        ops.append({"op": "replace", "path": f"{base}/resources/requests/cpu", "value": cpu})
    return ops


def resize_patch(pod: Mapping[str, Any], cpu: str) -> dict[str, Any] | None:
    """The strategic merge patch of ``pods/resize`` that gives the training container ``cpu``
    (the same rules as at creation); None when there is nothing to raise."""
    containers = _containers(pod, "containers")
    if not containers:
        return None
    container = containers[training_container_index(pod)]
    limit, request = _cpu_change(container, cpu)
    if not limit:
        return None
    resources: dict[str, Any] = {"limits": {"cpu": cpu}}
    if request:
        resources["requests"] = {"cpu": cpu}
    return {"spec": {"containers": [{"name": container.get("name"), "resources": resources}]}}
