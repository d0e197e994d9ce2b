"""Settings of the operator process: one object (``DAM_`` prefix), built once in ``main``.

Command-line flags of ``dam operator`` override these (they are passed as keyword
arguments, which take precedence over the environment).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from typing import Annotated, Literal

from pydantic import AfterValidator, AliasChoices, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from yarl import URL

CertMode = Literal["self-signed", "files"]

DEFAULT_SIDECAR_IMAGE = "ghcr.io/mlsys/dam-operator:0.1.0"


def parse_networks(values: Iterable[str]) -> list[str]:
    """Each entry as a network (``127.0.0.1`` becomes ``127.0.0.1/32``); ValueError names a bad one."""
    out = []
    for value in values:
        try:
            out.append(str(ipaddress.ip_network(value.strip(), strict=False)))
        except ValueError:
            raise ValueError(f"{value!r} is not an IP network (e.g. 127.0.0.0/8 or fd00::/8)") from None
    return out


def parse_prefixes(values: Sequence[str]) -> list[str]:
    """Each entry must be an http(s) URL with a host; ValueError names a bad one."""
    for value in values:
        try:
            url = URL(value)
        except ValueError:
            url = None
        if url is None or url.scheme not in ("http", "https") or not url.host:
            raise ValueError(
                f"{value!r} is not an http(s) URL prefix (e.g. http://prometheus.monitoring.svc:9090/)"
            )
    return list(values)


def parse_addresses(values: Iterable[str]) -> list[str]:
    """Each entry an IP address (``10.1.2.3``, ``fd00::5``); ValueError names a bad one."""
    out = []
    for value in values:
        try:
            out.append(str(ipaddress.ip_address(value.strip())))
        except ValueError:
            raise ValueError(f"{value!r} is not an IP address (e.g. 10.244.0.7)") from None
    return out


class _ScopeSettings(BaseSettings):
    """The first block of ``OperatorSettings``: where the operator looks and how it runs (a base
    class only to keep each class short; the fields stay first in the documented order)."""

    model_config = SettingsConfigDict(env_prefix="DAM_", extra="ignore", populate_by_name=True)

    namespace: str | None = Field(
        default=None,
        description="Watch DAMProfiles and pods in this namespace only; unset: cluster-wide.",
    )
    operator_namespace: str = Field(
        default="dam-system",
        description="Namespace of the operator itself (its webhook Service and certificate Secret).",
    )
    standalone: bool = Field(
        default=True,
        description="Run without kopf peering (one replica; no KopfPeering resources needed).",
    )

    peering_name: str | None = Field(
        default=None,
        description="kopf peering object name when standalone is off (several replicas, one active).",
    )

    # --- sharding over several active replicas (docs/operator.md) -------------------
    sharding: bool = Field(
        default=False,
        description=(
            "Share the profiles among every replica that runs with sharding on: each holds a "
            "Lease in operator_namespace and evaluates only its share (the chart turns it on). "
            "Excludes kopf peering (standalone must stay on)."
        ),
    )
    shard_identity: str | None = Field(
        default=None,
        description=(
            "This replica's name among the shards (unset: HOSTNAME, the Pod's name). Unique per "
            "process: two live processes with one name would evaluate the same profiles."
        ),
    )
    shard_group: str = Field(
        default="dam-operator",
        pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
        description=(
            "The replicas that share the profiles: their Leases carry this label value and "
            "name prefix (the chart: the release's name)."
        ),
    )
    shard_lease_duration_seconds: float = Field(
        default=15.0,
        ge=1.0,
        le=300.0,
        description=(
            "A replica whose Lease is not renewed for this long is gone: the others take its "
            "profiles over. Keep it under the profiles' windows (a profile is evaluated again "
            "within one Lease duration and a renew period of its owner's SIGKILL)."
        ),
    )
    shard_renew_seconds: float = Field(
        default=2.0,
        gt=0.0,
        le=60.0,
        description=(
            "How often a replica renews its Lease and reads the others' (at most a quarter of the "
            "Lease duration); a hand-over takes about two of these. A replica that could not renew "
            "for two thirds of the Lease duration stops evaluating until it can."
        ),
    )

    @model_validator(mode="after")
    def _sharding(self) -> _ScopeSettings:
        if self.sharding and not self.standalone:
            raise ValueError("sharding and kopf peering (standalone off) exclude each other; choose one")
        if self.sharding and self.shard_renew_seconds * 4 > self.shard_lease_duration_seconds:
            raise ValueError(
                "shard_renew_seconds must be at most a quarter of shard_lease_duration_seconds "
                "(a replica that cannot renew must stop a renew period before the others take over)"
            )
        return self


class OperatorSettings(_ScopeSettings):
    """Everything ``dam operator`` reads from its environment; see docs/operator.md."""

    # --- evaluation --------------------------------------------------------------
    evaluation_concurrency: int = Field(
        default=32, ge=1, le=1024, description="Profiles evaluated at the same time, at most."
    )
    event_concurrency: int = Field(
        default=4,
        ge=1,
        le=256,
        description=(
            "Events posted at the same time, at most. Events are posted after the window's status "
            "write, off the evaluation workers: when many profiles change at once the status goes first."
        ),
    )
    scrape_concurrency: int = Field(
        default=128, ge=1, le=4096, description="Sidecar scrapes (or Prometheus queries) in flight, at most."
    )
    scrape_timeout_seconds: float = Field(
        default=2.0, gt=0, le=60, description="A sidecar that does not answer in this time is not reporting."
    )
    scrape_max_bytes: int = Field(
        default=1024 * 1024,
        ge=1024,
        description=(
            "A sidecar's /metrics body larger than this is not read past this size (the pod does not "
            "report; counted in dam_operator_source_body_too_large_total). A sidecar with 8 GPUs "
            "and 8 ranks answers 31 KB (docs/performance.md)."
        ),
    )
    max_baseline_windows: float = Field(
        default=3.0,
        ge=1.0,
        le=100.0,
        description="A pod's previous scrape older than this many windows is too old to difference against.",
    )
    # --- Prometheus (spec.source.prometheus; docs/operator.md) ----------------------
    prometheus_url: str | None = Field(
        default=None,
        description=(
            "The cluster's Prometheus (base URL). Profiles without spec.source read their pods "
            "through it, and a profile may name it. Neither it nor prefixes below set (the "
            "default): no profile may name a Prometheus. Allowed as named (see the prefixes)."
        ),
    )
    prometheus_allowed_url_prefixes: Annotated[list[str], NoDecode, AfterValidator(parse_prefixes)] = Field(
        default_factory=list,
        description=(
            "Prometheus URLs a profile may name in spec.source.prometheus.url (comma-separated "
            "prefixes: scheme, host, port, then a path prefix). Empty (and no prometheus_url): "
            "none. Allowed as named: a literal address is allowed as written, a DNS name may "
            "resolve to a private address but not to a sensitive one (prometheus_allowed_networks)."
        ),
    )
    prometheus_allowed_networks: Annotated[list[str], NoDecode, AfterValidator(parse_networks)] = Field(
        default_factory=list,
        description=(
            "Networks (comma-separated CIDRs, e.g. 127.0.0.0/8) a named Prometheus DNS name may "
            "resolve to although loopback, link-local (169.254.0.0/16, fe80::/10), a cloud metadata "
            "address or the operator's own Pod or Services, refused otherwise. Never lifts the "
            "API-server rule."
        ),
    )
    prometheus_timeout_seconds: float = Field(
        default=5.0,
        gt=0,
        le=60,
        description="Timeout of one query to prometheus_url (a profile sets its own).",
    )
    prometheus_max_answer_bytes: int = Field(
        default=16 * 1024 * 1024,
        ge=64 * 1024,
        description=(
            "A Prometheus answer larger than this is not read past this size (the profile's pods do "
            "not report: Reporting=False, SourceAnswerTooLarge). One pod's series weigh 18 KB (1 GPU) "
            "to 87 KB (8 GPUs, 8 ranks): 16 MiB holds about 190 such pods, and a query asks for 64 "
            "pods at most (a bigger profile's pods in several queries; docs/performance.md)."
        ),
    )
    prometheus_concurrency: int = Field(
        default=8,
        ge=1,
        le=1024,
        description=(
            "Prometheus answers read at the same time, at most (each up to prometheus_max_answer_bytes; "
            "it sizes the operator's memory limit)."
        ),
    )
    kubernetes_service_host: str | None = Field(
        default=None,
        validation_alias=AliasChoices(
            "kubernetes_service_host", "DAM_KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_HOST"
        ),
        description=(
            "Address of the API server's Service (Kubernetes sets KUBERNETES_SERVICE_HOST in every "
            "pod): a profile's Prometheus URL may not point there."
        ),
    )
    pod_ips: Annotated[list[str], NoDecode, AfterValidator(parse_addresses)] = Field(
        default_factory=list,
        description=(
            "The operator's own Pod IPs (comma-separated; the chart sets them from the downward "
            "API, status.podIPs): a profile's Prometheus may not resolve to them."
        ),
    )
    prometheus_namespace_label: str = Field(
        default="namespace", description="Label that carries the pod's namespace in Prometheus."
    )
    prometheus_pod_label: str = Field(default="pod", description="Label that carries the pod's name.")

    # --- Kubernetes API ----------------------------------------------------------
    api_timeout_seconds: float = Field(default=10.0, gt=0, le=300, description="Timeout of one API call.")
    api_retries: int = Field(
        default=4, ge=0, le=20, description="Retries of an API call on 429, 5xx or a connection error."
    )
    api_backoff_seconds: float = Field(
        default=0.5, gt=0, le=60, description="First retry delay; doubles per retry (Retry-After wins)."
    )
    api_max_connections: int = Field(
        default=16,
        ge=2,
        le=256,
        description=(
            "Connections to the API server the operator's own client keeps, at most (status writes, "
            "Events, the pod watch): each TLS connection holds a 128 KiB buffer, and 16 carry more "
            "writes than the API server takes (docs/performance.md)."
        ),
    )

    list_chunk_size: int = Field(
        default=500,
        ge=0,
        le=100_000,
        description=(
            "Objects per page when DAMProfiles (kopf's chunked list) and pods (the operator's "
            "pod watcher) are listed, at start and after a 410 Gone; 0: one unpaginated list, "
            "the whole cluster's pods in one answer."
        ),
    )

    # --- memory --------------------------------------------------------------------
    heap_trim_interval_seconds: float = Field(
        default=60.0,
        ge=0,
        le=86_400,
        description=(
            "Give the C heap's free memory back to the system this often (glibc malloc_trim; "
            "0: never). The start-up listing frees far more than the steady state needs."
        ),
    )

    gc_young_threshold: int = Field(
        default=10_000,
        ge=100,
        le=1_000_000,
        description=(
            "Allocations between two young collections of Python's cyclic garbage collector "
            "(gc.set_threshold; Python's default 700). Each older generation is collected as much "
            "less often: at 5,000 profiles the collector took 7.8 % of a core with 700."
        ),
    )
    gc_freeze_after_seconds: float = Field(
        default=60.0,
        ge=0,
        le=86_400,
        description=(
            "This long after start, move every object then alive to the garbage collector's "
            "permanent generation (gc.freeze; 0: never): the modules and the state of the profiles "
            "and pods listed at start are not walked again by each full collection."
        ),
    )

    # --- the operator's own endpoints --------------------------------------------
    metrics_host: str = Field(default="0.0.0.0", description="Address of the operator's /metrics.")
    metrics_port: int = Field(
        default=8081, ge=0, le=65535, description="Port of the operator's /metrics and /healthz (0: off)."
    )
    liveness_endpoint: str | None = Field(
        default="http://0.0.0.0:8080/healthz",
        description="kopf's liveness endpoint (unset or empty: off).",
    )

    # --- acting on a stall (spec.actions.onStall) -----------------------------------
    stall_restart_enabled: bool = Field(
        default=False,
        description="onStall Restart may delete Pods (the chart's rbac.stallRestart).",
    )

    # --- the pod webhook ---------------------------------------------------------
    webhook_enabled: bool = Field(default=True, description="Serve the mutating pod webhook.")
    webhook_host: str = Field(default="0.0.0.0", description="Address the webhook listens on.")
    webhook_port: int = Field(default=9443, ge=0, le=65535, description="Port the webhook listens on.")
    webhook_service_name: str = Field(
        default="dam-operator-webhook", description="Service in front of the webhook (in operator_namespace)."
    )
    webhook_service_port: int = Field(default=443, ge=1, le=65535, description="Port of that Service.")
    webhook_url: str | None = Field(
        default=None,
        description="Register the webhook by URL instead of by Service (e.g. https://127.0.0.1:9443).",
    )
    webhook_configuration_name: str = Field(
        default="dam-operator", description="Name of the MutatingWebhookConfiguration."
    )
    webhook_manage_configuration: bool = Field(
        default=True,
        description="Create/update the MutatingWebhookConfiguration "
        "(off: Helm owns it; only its caBundle is patched; the chart sets false).",
    )
    webhook_timeout_seconds: int = Field(default=5, ge=1, le=5, description="timeoutSeconds of the webhook.")
    cert_mode: CertMode = Field(
        default="self-signed",
        description="self-signed: the operator makes a CA and serving cert and keeps them in a Secret; "
        "files: read tls.crt/tls.key/ca.crt from cert_dir (cert-manager).",
    )
    cert_secret_name: str = Field(
        default="dam-operator-webhook-cert", description="Secret that holds the self-signed webhook cert."
    )
    cert_dir: str = Field(
        default="/etc/dam/webhook-certs", description="Directory of the files (cert_mode=files)."
    )

    # --- injection defaults ------------------------------------------------------
    default_sidecar_image: str = Field(
        default=DEFAULT_SIDECAR_IMAGE,
        description=(
            "Image of the injected sidecar and probe installer (the chart's sidecar.image, by default "
            "the operator's own): the code that runs in, and is installed into, the training pods."
        ),
    )
    sidecar_allowed_images: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description=(
            "Other images (comma-separated, matched exactly) a DAMProfile may name in "
            "spec.sidecar.image. Empty: none; a profile naming another image is refused "
            "(SpecValid=False) and its pods are not instrumented. Whoever may write a DAMProfile "
            "chooses among these the code that runs in the selected pods."
        ),
    )
    sidecar_allow_share_process_namespace: bool = Field(
        default=False,
        description=(
            "Let a DAMProfile ask for shareProcessNamespace: true in its pods "
            "(spec.sidecar.shareProcessNamespace); off: such a profile is refused. A shared process "
            "namespace shows every container's processes, environment and root file system to the "
            "others (a root training container reads the other sidecars' credentials)."
        ),
    )
    sidecar_image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        default=None, description="imagePullPolicy of the injected containers when a profile names none."
    )
    excluded_namespaces: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["kube-system"],
        description="Namespaces (comma-separated) the webhook never touches, besides the operator's own.",
    )
    native_sidecar: bool = Field(
        default=True,
        description="Inject a native sidecar (init container, restartPolicy Always; Kubernetes >= 1.29).",
    )

    # --- logging -----------------------------------------------------------------
    verbose: bool = Field(default=False, description="Debug logging.")
    quiet: bool = Field(default=False, description="Warnings and errors only.")

    @field_validator(
        "excluded_namespaces",
        "prometheus_allowed_url_prefixes",
        "prometheus_allowed_networks",
        "pod_ips",
        "sidecar_allowed_images",
        mode="before",
    )
    @classmethod
    def _split(cls, value: object) -> object:
        if isinstance(value, str):
            return [p.strip() for p in value.split(",") if p.strip()]
        return value

    @field_validator("prometheus_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        return parse_prefixes([value.strip()])[0]

    @model_validator(mode="after")
    def _consistent(self) -> OperatorSettings:
        if self.namespace is not None and not self.namespace.strip():
            self.namespace = None
        if self.liveness_endpoint is not None and not self.liveness_endpoint.strip():
            self.liveness_endpoint = None
        if self.verbose and self.quiet:
            raise ValueError("verbose and quiet exclude each other; choose one")
        return self

    @property
    def clusterwide(self) -> bool:
        return self.namespace is None
