"""Pod injection: pure builders of the JSON patch the mutating webhook returns.

The patch adds to a matched training pod:

- ``dam-probe-install``: a plain init container that copies the automatic
  instrumentation into the shared volume (``dam probe-install /dam/probe``);
- ``dam-sidecar``: the sidecar as a *native* sidecar (an init container with
  ``restartPolicy: Always``, Kubernetes ≥ 1.29) so Jobs still complete; with
  ``native_sidecar=False`` a plain container instead (older clusters);
- ``dam-probe``: a small in-memory ``emptyDir`` mounted at ``/dam/probe`` in the
  training containers and the sidecar (names and path of our own: a pod that already has a
  ``dam-probe`` volume, a ``dam-probe-install`` container or a mount at ``/dam/probe`` gets
  ``dam-probe-1``, ``dam-probe-install-1``, ``/dam/probe-1``, with a warning; ``choose_names``);
- ``dam-no-token``: an empty in-memory volume over the API token's path in the sidecar and
  the installer, so that the ServiceAccount admission plugin mounts no token there
  (``_token_mount``);
- on every training container ``DAM_PROBE_DIR`` and ``PYTHONPATH`` (``/dam/probe``
  prepended to a literal value already in the pod spec; ``/dam/probe:$(PYTHONPATH)`` where
  ``envFrom`` may set it; left alone, with a warning, where it comes from ``valueFrom``), and
  where the probe loads ``DAM_PROBE_EXIT_RECORD``, the container's own termination-message file
  (``exit_record_env``);
- ``shareProcessNamespace: true`` only where the profile asks for it
  (``spec.sidecar.shareProcessNamespace``) and the cluster admin allows it
  (``InjectionSettings.allow_share_process_namespace``, the chart's
  ``sidecar.allowShareProcessNamespace``); never by default: the probe publishes the CPU, memory and
  run-queue figures the sidecar would read in ``/proc``. A pod that says ``false`` keeps it (with a
  warning and a note, when the profile asked);
- annotations ``dam.mlsys.dev/injected``, ``dam.mlsys.dev/profile`` and, when there is a
  caveat, ``dam.mlsys.dev/injection-notes`` (what the profile's status reports);
- with ``spec.actions.mode`` Apply or InPlace (``ActionOverrides``, derived from the profile's
  ``status.actions`` by ``actions.desired_for``): ``DAM_LOADER_OVERRIDES`` on every training
  container that gets the probe, a higher CPU limit on the training container, and the
  annotation ``dam.mlsys.dev/action`` saying which action the pod carries. Nothing of it goes to
  a pod (or container) the probe cannot reach.

What runs in the pod is the cluster admin's (``sidecar_refusals``): the image of both added
containers is ``InjectionSettings.image`` (the chart's ``sidecar.image``), or one the admin listed
in ``allowed_images`` (``sidecar.allowedImages``); a profile that names another image, or asks for
a shared process namespace the admin does not allow, gets no container in any pod: the pod is
admitted as it is but for the note ``not-injected:sidecar-not-allowed`` (``InjectionError``), and
the profile's ``SpecValid`` says why. No other string of the profile reaches a command, an
environment value or a security context (docs/security.md lists each field).

A hostNetwork pod is injected only when its ``dam.mlsys.dev/host-network-port`` annotation
names the profile's sidecar port (the sidecar listens on the node itself); otherwise, like a
pod whose port is taken, it is admitted with only a note saying why (``skip_patch``).

Every container it adds meets the *restricted* Pod Security Standard. The patch
is computed as a difference against the pod: each piece is added only where it
is missing, so re-running the builder on a patched pod yields ``[]``. No I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from dam_operator.cluster.steps.spec import DAMProfileSpec, quantity_value
from dam_probe.lastwords import ENV_EXIT_RECORD
from dam_probe.overrides import loader_override_env

__all__ = [
    "ANNOTATION_ACTION",
    "ANNOTATION_DEFAULT_CONTAINER",
    "ANNOTATION_HOST_NETWORK_PORT",
    "ANNOTATION_INJECT",
    "ANNOTATION_INJECTED",
    "ANNOTATION_NOTES",
    "ANNOTATION_PROFILE",
    "INSTALL_CONTAINER",
    "LABEL_INJECT",
    "NOTE_NO_SHARED_PROCESS_NAMESPACE",
    "NOTE_PYTHONPATH_ENV_FROM",
    "NOTE_PYTHONPATH_REF",
    "NOTE_SKIP_HOST_NETWORK",
    "NOTE_SKIP_POLICY",
    "NOTE_SKIP_PORT",
    "NOTE_SKIP_PROBE_PATH",
    "OPTED_OUT",
    "PROBE_DIR",
    "SIDECAR_CONTAINER",
    "TOKEN_PATH",
    "TOKEN_VOLUME_NAME",
    "VOLUME_NAME",
    "ActionOverrides",
    "Injection",
    "InjectionError",
    "InjectionSettings",
    "Names",
    "build_injection",
    "choose_names",
    "injection_notes",
    "is_instrumented",
    "opted_out",
    "pod_notes",
    "resize_patch",
    "restricted_security_context",
    "should_inject",
    "sidecar_refusals",
    "skip_patch",
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
PROBE_DIR_CHOICES = (PROBE_DIR, f"{PROBE_DIR}-1", f"{PROBE_DIR}-2", f"{PROBE_DIR}-3")
METRICS_PORT_NAME = "dam-metrics"
TOKEN_VOLUME_NAME = "dam-no-token"
# The ServiceAccount admission plugin's DefaultAPITokenMountPath.
TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_VOLUME_SIZE_LIMIT = "64Ki"
ANNOTATION_HOST_NETWORK_PORT = "dam.mlsys.dev/host-network-port"  # a hostNetwork pod's consent: the node port
ANNOTATION_NOTES = "dam.mlsys.dev/injection-notes"  # comma-separated NOTE_* codes the webhook recorded

# Notes (stable codes in ANNOTATION_NOTES). Injected, with a caveat:
NOTE_NO_SHARED_PROCESS_NAMESPACE = "process-namespace-not-shared"
NOTE_PYTHONPATH_REF = "pythonpath-from-reference"  # valueFrom: the probe cannot load there
NOTE_PYTHONPATH_ENV_FROM = "pythonpath-from-env-from"  # extended through $(PYTHONPATH)
# Not injected (the pod is admitted as it is, but for the note):
NOTE_SKIP_PORT = "not-injected:port-taken"
NOTE_SKIP_HOST_NETWORK = "not-injected:host-network"
NOTE_SKIP_PROBE_PATH = "not-injected:probe-path-taken"
NOTE_SKIP_POLICY = "not-injected:sidecar-not-allowed"  # the profile asks for what the admin does not allow

# The chart values (and operator settings) of the admin's rules, as the refusals name them.
CHART_IMAGE = "sidecar.image"
CHART_ALLOWED_IMAGES = "sidecar.allowedImages"
SETTING_ALLOWED_IMAGES = "DAM_SIDECAR_ALLOWED_IMAGES"
CHART_ALLOW_SHARE = "sidecar.allowShareProcessNamespace"
SETTING_ALLOW_SHARE = "DAM_SIDECAR_ALLOW_SHARE_PROCESS_NAMESPACE"
OPTED_OUT = "opted-out"  # not a webhook note: what ``pod_notes`` adds for an opted-out pod

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
    """The pod cannot take the sidecar as it is (e.g. its port is taken); the message says why,
    ``note`` (a ``NOTE_SKIP_*`` code) is what the pod's annotation records."""

    def __init__(self, message: str, note: str = NOTE_SKIP_PORT) -> None:
        super().__init__(message)
        self.note = note


def injection_notes(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """The ``NOTE_*`` codes the webhook recorded on ``pod`` (empty when none)."""
    raw = _meta(pod, "annotations").get(ANNOTATION_NOTES)
    if not isinstance(raw, str):
        return ()
    return tuple(n.strip() for n in raw.split(",") if n.strip())


def pod_notes(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """What the status needs to know of how the pod was (not) instrumented: the webhook's notes,
    and ``OPTED_OUT`` when the pod opts out (the webhook never saw it then)."""
    notes = injection_notes(pod)
    return (*notes, OPTED_OUT) if opted_out(pod) else notes


class InjectionSettings(BaseModel):
    """What the operator decides about injection, from its own settings (not the profile)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    image: Annotated[str, Field(min_length=1, max_length=512)]
    """The image of the sidecar and the probe installer (the chart's ``sidecar.image``)."""
    image_pull_policy: str | None = None
    allowed_images: tuple[str, ...] = ()
    """Other images a profile may name in ``spec.sidecar.image``, exactly as written (the chart's
    ``sidecar.allowedImages``); empty: none but ``image``."""
    allow_share_process_namespace: bool = False
    """Whether a profile may ask for ``shareProcessNamespace: true`` in its pods."""
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


def sidecar_refusals(spec: DAMProfileSpec, settings: InjectionSettings) -> tuple[str, ...]:
    """What of ``spec.sidecar`` the cluster admin's settings do not allow, one sentence each naming
    the field, the chart value (and setting) that would allow it, and the fix; empty when nothing.

    The image becomes code in other people's pods (the installer copies the probe onto their
    training containers' ``PYTHONPATH``; the sidecar runs beside them), so it is the admin's; a
    shared process namespace exposes every container's processes and root file system
    (``/proc/PID/root``) to the others. A profile with a refusal instruments no pod."""
    out: list[str] = []
    if not spec.sidecar.inject:
        return ()  # nothing of spec.sidecar goes into a pod
    image = spec.sidecar.image
    if image is not None and image != settings.image and image not in settings.allowed_images:
        out.append(
            f"spec.sidecar.image: {image!r} is not an image the cluster admin allows: it would run in, and "
            "install code into, every pod this profile selects. Remove spec.sidecar.image to use the "
            f"cluster's sidecar image (chart value {CHART_IMAGE}), or ask the cluster admin to list it in "
            f"the chart value {CHART_ALLOWED_IMAGES} ({SETTING_ALLOWED_IMAGES})"
        )
    if spec.sidecar.share_process_namespace and not settings.allow_share_process_namespace:
        out.append(
            "spec.sidecar.shareProcessNamespace: the cluster admin does not allow a shared process "
            "namespace (it shows every container's processes, environment and files to the others). "
            "Remove it: the probe publishes the training processes' CPU time, memory and run-queue wait "
            f"without it; or ask the cluster admin to set the chart value {CHART_ALLOW_SHARE}: true "
            f"({SETTING_ALLOW_SHARE})"
        )
    return tuple(out)


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


@dataclass(frozen=True)
class Names:
    """What the injection adds under which name: ours, never one the pod already uses."""

    volume: str = VOLUME_NAME
    token_volume: str = TOKEN_VOLUME_NAME
    installer: str = INSTALL_CONTAINER
    probe_dir: str = PROBE_DIR


def _probe_mount(names: Names, read_only: bool) -> dict[str, Any]:
    return {"name": names.volume, "mountPath": names.probe_dir, "readOnly": read_only}


def _token_mount(names: Names) -> dict[str, Any]:
    """An empty in-memory volume over the API token's path in *our* containers.

    The ServiceAccount admission plugin (plugin/pkg/admission/serviceaccount/admission.go,
    ``mountServiceAccountToken``) adds the token's volumeMount to every container and init container
    that has no volumeMount at ``/var/run/secrets/kubernetes.io/serviceaccount`` already, and it is
    re-run after webhooks that changed the object (reinvocation), so the sidecar and the installer
    would get the Pod's token. A mount of ours at that path makes it skip them; the user's containers
    keep theirs. Neither container talks to the API server.
    """
    return {"name": names.token_volume, "mountPath": TOKEN_PATH, "readOnly": True}


def _image(spec: DAMProfileSpec, settings: InjectionSettings) -> str:
    """The profile's image where the admin allows it, else the admin's (``build_injection`` has
    refused the pod already then; this keeps a builder called alone from using it either)."""
    chosen = spec.sidecar.image
    return chosen if chosen is not None and chosen in settings.allowed_images else settings.image


def _sidecar(
    pod: Mapping[str, Any], spec: DAMProfileSpec, settings: InjectionSettings, native: bool, names: Names
) -> dict[str, Any]:
    port = spec.sidecar.port
    interval = spec.sampling.interval_seconds
    probe = {"httpGet": {"path": "/healthz", "port": port}, "timeoutSeconds": 2}
    container: dict[str, Any] = {
        "name": SIDECAR_CONTAINER,
        "image": _image(spec, settings),
        "command": [
            "dam",
            "sidecar",
            "--port",
            str(port),
            "--interval",
            f"{interval:g}",
            "--probe-dir",
            names.probe_dir,
        ],
        "ports": [{"name": METRICS_PORT_NAME, "containerPort": port, "protocol": "TCP"}],
        "env": [
            {"name": "DAM_PROBE_DIR", "value": names.probe_dir},
            {"name": "DAM_PORT", "value": str(port)},
            {"name": "DAM_INTERVAL_SECONDS", "value": f"{interval:g}"},
        ],
        "resources": _resources(pod, spec, settings),
        "readinessProbe": {**probe, "periodSeconds": 10, "failureThreshold": 3},
        "livenessProbe": {**probe, "initialDelaySeconds": 10, "periodSeconds": 20, "failureThreshold": 3},
        "volumeMounts": [_probe_mount(names, read_only=True), _token_mount(names)],
        "securityContext": restricted_security_context(settings),
    }
    if native:
        container["restartPolicy"] = "Always"
    pull = spec.sidecar.image_pull_policy or settings.image_pull_policy
    if pull:
        container["imagePullPolicy"] = pull
    return container


def _installer(
    pod: Mapping[str, Any], spec: DAMProfileSpec, settings: InjectionSettings, names: Names
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": names.installer,
        "image": _image(spec, settings),
        "command": ["dam", "probe-install", names.probe_dir],
        "resources": _resources(pod, spec, settings),
        "volumeMounts": [_probe_mount(names, read_only=False), _token_mount(names)],
        "securityContext": restricted_security_context(settings),
    }
    pull = spec.sidecar.image_pull_policy or settings.image_pull_policy
    if pull:
        container["imagePullPolicy"] = pull
    return container


# ---------------------------------------------------------------- names and edge pods


def _all_containers(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [
        c for key in ("initContainers", "containers", "ephemeralContainers") for c in _containers(pod, key)
    ]


def _free(base: str, taken: set[str]) -> str:
    """``base``, or ``base-1``, ``base-2``… : the first name the pod does not use."""
    if base not in taken:
        return base
    return next(f"{base}-{i}" for i in range(1, len(taken) + 2) if f"{base}-{i}" not in taken)


def _overlaps(a: str, b: str) -> bool:
    a, b = a.rstrip("/") or "/", b.rstrip("/") or "/"
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


def _mount_paths(pod: Mapping[str, Any]) -> list[str]:
    paths = []
    for c in _all_containers(pod):
        for m in c.get("volumeMounts") or []:
            if isinstance(m, Mapping) and isinstance(m.get("mountPath"), str):
                paths.append(m["mountPath"])
    return paths


def choose_names(pod: Mapping[str, Any]) -> tuple[Names, list[str]]:
    """Our volume, container and probe-directory names for ``pod``, and a warning per rename.

    A volume of the pod named ``dam-probe`` (read-only, a PVC, a hostPath…) is never reused: ours
    gets a free name. A mount at (or above, or below) ``/dam/probe`` in any container moves our
    directory to ``/dam/probe-N``. Raises ``InjectionError`` when no such path is free.
    """
    volumes = {str(v.get("name")) for v in _spec(pod).get("volumes") or [] if isinstance(v, Mapping)}
    containers = {str(c.get("name")) for c in _all_containers(pod)}
    mounts = _mount_paths(pod)
    probe_dir = next(
        (p for p in PROBE_DIR_CHOICES if not any(_overlaps(p, m) for m in mounts)),
        None,
    )
    if probe_dir is None:
        raise InjectionError(
            f"every probe directory ({', '.join(PROBE_DIR_CHOICES)}) overlaps a volumeMount of the pod; "
            "move the mount away from /dam",
            NOTE_SKIP_PROBE_PATH,
        )
    volume = _free(VOLUME_NAME, volumes)
    names = Names(
        volume=volume,
        token_volume=_free(TOKEN_VOLUME_NAME, volumes | {volume}),
        installer=_free(INSTALL_CONTAINER, containers),
        probe_dir=probe_dir,
    )
    warnings = []
    if names.volume != VOLUME_NAME:
        warnings.append(
            f"the pod already has a volume named {VOLUME_NAME}; it is left alone and the probe uses "
            f"its own in-memory volume {names.volume}"
        )
    if names.installer != INSTALL_CONTAINER:
        warnings.append(f"a container is named {INSTALL_CONTAINER}; the probe installer is {names.installer}")
    if names.probe_dir != PROBE_DIR:
        warnings.append(
            f"a container already mounts something at or around {PROBE_DIR}; the probe directory is "
            f"{names.probe_dir} (DAM_PROBE_DIR and PYTHONPATH say so)"
        )
    return names, warnings


def _host_network(pod: Mapping[str, Any], spec: DAMProfileSpec) -> None:
    """A hostNetwork pod binds the sidecar's port on the node itself: only with the pod's consent.

    The pod's ``dam.mlsys.dev/host-network-port`` annotation must name the profile's
    ``spec.sidecar.port`` (the port the operator scrapes). With hostNetwork a containerPort is also a
    hostPort, so the scheduler's NodePorts filter keeps two such pods off one node.
    """
    if _spec(pod).get("hostNetwork") is not True:
        return
    chosen = _meta(pod, "annotations").get(ANNOTATION_HOST_NETWORK_PORT)
    port = spec.sidecar.port
    if chosen is None:
        raise InjectionError(
            f"the pod uses hostNetwork, so the sidecar would listen on port {port} of the node itself; "
            f'to accept that, annotate the pod {ANNOTATION_HOST_NETWORK_PORT}: "{port}" '
            "(or set spec.sidecar.port of the DAMProfile to a node port you chose and annotate that)",
            NOTE_SKIP_HOST_NETWORK,
        )
    if str(chosen).strip() != str(port):
        raise InjectionError(
            f"the pod's {ANNOTATION_HOST_NETWORK_PORT} is {chosen!r} but the DAMProfile's spec.sidecar.port "
            f"is {port}; make them the same node port",
            NOTE_SKIP_HOST_NETWORK,
        )


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
    base: str,
    container: Mapping[str, Any],
    probe_dir: str,
    extra: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    env = container.get("env")
    env_list: list[Any] = list(env) if isinstance(env, list) else []
    index = {e.get("name"): i for i, e in enumerate(env_list) if isinstance(e, Mapping)}
    ops: list[dict[str, Any]] = []
    wanted: list[dict[str, Any]] = []

    if "DAM_PROBE_DIR" in index:
        i = index["DAM_PROBE_DIR"]
        if env_list[i] != {"name": "DAM_PROBE_DIR", "value": probe_dir}:
            ops.append(
                {
                    "op": "replace",
                    "path": f"{base}/env/{i}",
                    "value": {"name": "DAM_PROBE_DIR", "value": probe_dir},
                }
            )
    else:
        wanted.append({"name": "DAM_PROBE_DIR", "value": probe_dir})

    if "PYTHONPATH" in index:
        i = index["PYTHONPATH"]
        entry = env_list[i]
        value = entry.get("value")
        if "valueFrom" not in entry:
            parts = (value or "").split(":") if value else []
            if probe_dir not in parts:
                new = probe_dir if not value else f"{probe_dir}:{value}"
                ops.append(
                    {
                        "op": "replace",
                        "path": f"{base}/env/{i}",
                        "value": {"name": "PYTHONPATH", "value": new},
                    }
                )
        # A PYTHONPATH taken from a Secret/ConfigMap cannot be extended here; left as it is (warned).
    elif container.get("envFrom"):
        # envFrom may hold a PYTHONPATH the webhook cannot read. A literal value would replace it (env wins
        # over envFrom); "$(PYTHONPATH)" keeps it: the kubelet resolves envFrom first, then expands $(VAR)
        # references in env values against what it resolved so far (pkg/kubelet/kubelet_pods.go,
        # makeEnvironmentVariables), and leaves a reference it cannot resolve as it is.
        wanted.append({"name": "PYTHONPATH", "value": f"{probe_dir}:$(PYTHONPATH)"})
    else:
        wanted.append({"name": "PYTHONPATH", "value": probe_dir})

    # The user's own value of a variable wins (e.g. their DAM_LOADER_OVERRIDES).
    wanted.extend({"name": k, "value": v} for k, v in (extra or {}).items() if k not in index)

    if wanted:
        if env is None or not isinstance(env, list):
            ops.append({"op": "add", "path": f"{base}/env", "value": wanted})
        else:
            ops.extend({"op": "add", "path": f"{base}/env/-", "value": w} for w in wanted)
    return ops


def _mount_ops(base: str, container: Mapping[str, Any], names: Names) -> list[dict[str, Any]]:
    """Our volume at our path (``choose_names`` made sure that neither is the pod's)."""
    mounts = container.get("volumeMounts")
    mount = _probe_mount(names, read_only=False)
    if not isinstance(mounts, list):
        return [{"op": "add", "path": f"{base}/volumeMounts", "value": [mount]}]
    if any(isinstance(m, Mapping) and m.get("name") == names.volume for m in mounts):
        return []
    return [{"op": "add", "path": f"{base}/volumeMounts/-", "value": mount}]


def _pythonpath_notes(containers: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[str]]:
    """(warnings, notes) about training containers whose PYTHONPATH the webhook cannot see whole."""
    warnings, notes = [], []
    by_ref = [str(c.get("name")) for c in containers if not _takes_probe(c)]
    if by_ref:
        notes.append(NOTE_PYTHONPATH_REF)
        warnings.append(
            f"container(s) {', '.join(by_ref)} take PYTHONPATH from a Secret or ConfigMap (valueFrom), which "
            "the webhook cannot read or extend: the probe will not load there (no data-wait figures); "
            "set PYTHONPATH as a literal value, or add the probe directory to the referenced value"
        )
    env_from = [
        str(c.get("name"))
        for c in containers
        if _takes_probe(c)
        and c.get("envFrom")
        and not any(isinstance(e, Mapping) and e.get("name") == "PYTHONPATH" for e in c.get("env") or [])
    ]
    if env_from:
        notes.append(NOTE_PYTHONPATH_ENV_FROM)
        warnings.append(
            f"container(s) {', '.join(env_from)} use envFrom, which may set PYTHONPATH: the probe directory "
            "is prepended to it as $(PYTHONPATH), which the kubelet expands from envFrom"
        )
    return warnings, notes


@dataclass
class Injection:
    """What the webhook answers for one pod: the patch, the warnings kubectl prints, and the notes
    recorded in the pod's ``dam.mlsys.dev/injection-notes`` annotation (read back into the status)."""

    patch: list[dict[str, Any]]
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _raw_annotations(pod: Mapping[str, Any]) -> Any:
    """The pod's annotations as they are (None, a mapping, or anything else: ``_annotation_ops``)."""
    return (pod.get("metadata") or {}).get("annotations")


def _already_instrumented(pod: Mapping[str, Any]) -> Injection | None:
    """A pod that carries the sidecar already: nothing to do, or (a sidecar someone else put
    there) only the mark that it is injected; None for a pod without the sidecar."""
    if not is_instrumented(pod):
        return None
    annotations = _raw_annotations(pod)
    if annotations and annotations.get(ANNOTATION_INJECTED) == "true":
        return Injection([])
    return Injection(_annotation_ops(annotations, {ANNOTATION_INJECTED: "true"}))


def _check_admissible(pod: Mapping[str, Any], spec: DAMProfileSpec) -> None:
    """Raises ``InjectionError`` when the sidecar's port is the pod's, or for a hostNetwork pod
    without its consent."""
    if spec.sidecar.port in _declared_ports(pod):
        raise InjectionError(
            f"a container already uses port {spec.sidecar.port}; "
            "set spec.sidecar.port of the DAMProfile to a free port",
            NOTE_SKIP_PORT,
        )
    _host_network(pod, spec)


def _process_namespace(
    pod_spec: Mapping[str, Any], asked: bool
) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    """(ops, warnings, notes): a shared process namespace only where the profile ``asked`` (and the
    admin allowed it: ``sidecar_refusals``); then not when the pod said no (kept, and noted) or sees
    every process already (hostPID). Without it the probe publishes what the sidecar would read."""
    if not asked:
        return [], [], []
    if pod_spec.get("shareProcessNamespace") is False:
        # The pod's explicit choice wins: a shared namespace lets same-uid processes read each other's
        # environment and root file system. The probe publishes what the sidecar would read in /proc.
        warning = (
            "the pod sets shareProcessNamespace: false, which is kept although the DAMProfile asks for a "
            "shared one (spec.sidecar.shareProcessNamespace): the sidecar cannot see the training "
            "processes, so their CPU time and memory come from the probe (processes without the probe, "
            "e.g. a non-Python launcher, are not counted)"
        )
        return [], [warning], [NOTE_NO_SHARED_PROCESS_NAMESPACE]
    if not pod_spec.get("hostPID") and pod_spec.get("shareProcessNamespace") is not True:
        # hostPID pods see every process already (and may not set both).
        return [{"op": "add", "path": "/spec/shareProcessNamespace", "value": True}], [], []
    return [], [], []


def _volume_ops(
    pod_spec: Mapping[str, Any], names: Names, settings: InjectionSettings
) -> list[dict[str, Any]]:
    """The probe's in-memory volume, and the empty one over the API token's path (``_token_mount``)."""
    new_volumes = [
        {
            "name": names.volume,
            "emptyDir": {"medium": "Memory", "sizeLimit": settings.probe_volume_size_limit},
        },
        # Holds nothing: it only hides the API token's path from our containers (``_token_mount``).
        {"name": names.token_volume, "emptyDir": {"medium": "Memory", "sizeLimit": TOKEN_VOLUME_SIZE_LIMIT}},
    ]
    if isinstance(pod_spec.get("volumes"), list):
        return [{"op": "add", "path": "/spec/volumes/-", "value": v} for v in new_volumes]
    return [{"op": "add", "path": "/spec/volumes", "value": new_volumes}]


DEFAULT_TERMINATION_MESSAGE_PATH = "/dev/termination-log"
"""core/v1's default ``terminationMessagePath`` (the API server sets it before admission)."""


def exit_record_env(container: Mapping[str, Any]) -> dict[str, str]:
    """``DAM_PROBE_EXIT_RECORD``: the container's own termination-message file, where the probe
    leaves its last words (``dam_probe.lastwords``: the loader's workers and their kills, for a
    process that dies before any scrape). None for ``terminationMessagePolicy:
    FallbackToLogsOnError``: a file with anything in it replaces the log's tail that its users want
    in the message. The path is the Pod's own (its container writes there anyway)."""
    if container.get("terminationMessagePolicy") == "FallbackToLogsOnError":
        return {}
    path = container.get("terminationMessagePath")
    return {
        ENV_EXIT_RECORD: path
        if isinstance(path, str) and path.startswith("/")
        else DEFAULT_TERMINATION_MESSAGE_PATH
    }


def _training_container_ops(
    pod: Mapping[str, Any],
    containers: Sequence[Mapping[str, Any]],
    names: Names,
    actions: ActionOverrides | None,
) -> list[dict[str, Any]]:
    """Each of the pod's containers gets the probe (environment, volume); where the probe loads, the
    action's loader settings, and its CPU on the training container; then the action's annotation,
    when a container carries it."""
    loader_env = loader_override_env(actions.loader) if actions is not None and actions.loader else {}
    cpu_index = training_container_index(pod)
    ops: list[dict[str, Any]] = []
    carried = False
    for i, container in enumerate(containers):
        base = f"/spec/containers/{i}"
        probe = _takes_probe(container)
        carried = carried or probe
        extra = {**loader_env, **exit_record_env(container)} if probe else None
        ops.extend(_env_ops(base, container, names.probe_dir, extra))
        ops.extend(_mount_ops(base, container, names))
        if probe and i == cpu_index and actions is not None and actions.cpu is not None:
            ops.extend(_cpu_ops(base, container, actions.cpu))
    if actions is not None and carried:
        annotations = _raw_annotations(pod)
        ops.extend(_annotation_ops(annotations, {ANNOTATION_ACTION: actions.label}, after_add=True))
    return ops


def _added_container_ops(
    pod: Mapping[str, Any], spec: DAMProfileSpec, settings: InjectionSettings, names: Names
) -> list[dict[str, Any]]:
    """The installer in front of the init containers, and the sidecar: a native one (an init
    container that keeps running) right after it, else the last container."""
    ops: list[dict[str, Any]] = []
    new_init: list[dict[str, Any]] = [_installer(pod, spec, settings, names)]
    if settings.native_sidecar:
        new_init.append(_sidecar(pod, spec, settings, True, names))
    else:
        ops.append(
            {
                "op": "add",
                "path": "/spec/containers/-",
                "value": _sidecar(pod, spec, settings, False, names),
            }
        )
    if isinstance(_spec(pod).get("initContainers"), list):
        # In front, in order: the probe is installed before anything else runs.
        ops.extend(
            {"op": "add", "path": f"/spec/initContainers/{i}", "value": c} for i, c in enumerate(new_init)
        )
    else:
        ops.append({"op": "add", "path": "/spec/initContainers", "value": new_init})
    return ops


def build_injection(
    pod: Mapping[str, Any],
    profile_name: str,
    spec: DAMProfileSpec,
    settings: InjectionSettings,
    actions: ActionOverrides | None = None,
) -> Injection:
    """The injection of ``pod`` for ``profile_name``: its ``patch``, RFC 6902 operations that
    instrument the pod (``[]`` when nothing is missing), and the warnings and notes that go with it.

    ``actions`` (None in mode Recommend, or with no action yet) adds the action's settings
    to the containers the probe reaches, and the ``dam.mlsys.dev/action`` annotation.

    Raises ``InjectionError`` when the pod cannot take the sidecar (a container already declares
    the sidecar's port, a hostNetwork pod without consent, no free probe directory) or the profile
    asks for what the cluster admin does not allow (``sidecar_refusals``); its ``note`` says why.
    The webhook then admits the pod unchanged but for the ``dam.mlsys.dev/injection-notes``
    annotation, with a warning, and the profile's status reports it as not instrumented and why.
    """
    done = _already_instrumented(pod)
    if done is not None:
        return done
    refused = sidecar_refusals(spec, settings)
    if refused:
        raise InjectionError("; ".join(refused), NOTE_SKIP_POLICY)
    _check_admissible(pod, spec)
    names, warnings = choose_names(pod)
    containers = _containers(pod, "containers")
    more, notes = _pythonpath_notes(containers)
    namespace_ops, namespace_warnings, namespace_notes = _process_namespace(
        _spec(pod), spec.sidecar.share_process_namespace
    )
    warnings += more + namespace_warnings
    notes += namespace_notes
    wanted_annotations = {ANNOTATION_INJECTED: "true", ANNOTATION_PROFILE: profile_name}
    if notes:
        wanted_annotations[ANNOTATION_NOTES] = ",".join(notes)
    ops = [
        # Annotations first: they are what marks the pod injected.
        *_annotation_ops(_raw_annotations(pod), wanted_annotations),
        *namespace_ops,
        *_volume_ops(_spec(pod), names, settings),
        *_training_container_ops(pod, containers, names, actions),
        *_added_container_ops(pod, spec, settings, names),
    ]
    return Injection(ops, warnings, notes)


def skip_patch(pod: Mapping[str, Any], note: str) -> list[dict[str, Any]]:
    """The only change made to a pod the webhook does not instrument: a note saying why (so that the
    profile's status can say what to do), unless it is there already (reinvocation)."""
    return _annotation_ops(_raw_annotations(pod), {ANNOTATION_NOTES: note})


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
