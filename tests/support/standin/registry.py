"""Resource types the stand-in serves: the built-in table and resources made from CRDs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
SUB_VERBS = ("get", "patch", "update")


@dataclass(eq=False)
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str = ""
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    verbs: tuple[str, ...] = ALL_VERBS
    status_subresource: bool = False
    schema: dict[str, Any] | None = None  # openAPIV3Schema of a CRD version
    printer_columns: list[dict[str, Any]] = field(default_factory=list)
    crd_name: str | None = None  # the CRD that defines it
    builtin: bool = True
    # Storage key shared by all versions of one resource (group, plural).
    storage: tuple[str, str] = ("", "")

    def __post_init__(self) -> None:
        if not self.singular:
            self.singular = self.kind.lower()
        self.storage = (self.group, self.plural)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_version(self) -> str:
        return self.api_version

    @property
    def qualified(self) -> str:
        """`pods`, `damprofiles.dam.mlsys.dev`: how the API server names it in messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def schema_name(self) -> str:
        """The OpenAPI component name: io.k8s.api.core.v1.Pod or dev.mlsys.dam.v1alpha1.DAMProfile."""
        if self.builtin:
            group = self.group.split(".")[0] if self.group else "core"
            if self.group == "apiextensions.k8s.io":
                return f"io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.{self.version}.{self.kind}"
            return f"io.k8s.api.{group}.{self.version}.{self.kind}"
        return ".".join(reversed(self.group.split("."))) + f".{self.version}.{self.kind}"


def _builtin(  # noqa: PLR0917 (a table of positional rows)
    group: str,
    version: str,
    plural: str,
    kind: str,
    namespaced: bool,
    short: tuple[str, ...] = (),
    categories: tuple[str, ...] = (),
    status: bool = False,
) -> ResourceType:
    return ResourceType(
        group=group,
        version=version,
        plural=plural,
        kind=kind,
        namespaced=namespaced,
        short_names=short,
        categories=categories,
        status_subresource=status,
    )


def builtin_types() -> list[ResourceType]:
    return [
        _builtin("", "v1", "namespaces", "Namespace", False, ("ns",), status=True),
        _builtin("", "v1", "pods", "Pod", True, ("po",), ("all",), status=True),
        _builtin("", "v1", "events", "Event", True, ("ev",)),
        _builtin("", "v1", "secrets", "Secret", True),
        _builtin("", "v1", "configmaps", "ConfigMap", True, ("cm",)),
        _builtin("", "v1", "services", "Service", True, ("svc",), ("all",), status=True),
        _builtin("", "v1", "serviceaccounts", "ServiceAccount", True, ("sa",)),
        _builtin("", "v1", "endpoints", "Endpoints", True, ("ep",)),
        _builtin("", "v1", "nodes", "Node", False, ("no",), status=True),
        _builtin("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", True, ("pvc",), status=True),
        _builtin("events.k8s.io", "v1", "events", "Event", True, ("ev",)),
        _builtin(
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
            "CustomResourceDefinition",
            False,
            ("crd", "crds"),
            ("api-extensions",),
            status=True,
        ),
        _builtin(
            "admissionregistration.k8s.io",
            "v1",
            "mutatingwebhookconfigurations",
            "MutatingWebhookConfiguration",
            False,
            (),
            ("api-extensions",),
        ),
        _builtin(
            "admissionregistration.k8s.io",
            "v1",
            "validatingwebhookconfigurations",
            "ValidatingWebhookConfiguration",
            False,
            (),
            ("api-extensions",),
        ),
        _builtin("coordination.k8s.io", "v1", "leases", "Lease", True),
        _builtin("apps", "v1", "deployments", "Deployment", True, ("deploy",), ("all",), status=True),
        _builtin("apps", "v1", "daemonsets", "DaemonSet", True, ("ds",), ("all",), status=True),
        _builtin("apps", "v1", "statefulsets", "StatefulSet", True, ("sts",), ("all",), status=True),
        _builtin("apps", "v1", "replicasets", "ReplicaSet", True, ("rs",), ("all",), status=True),
        _builtin("batch", "v1", "jobs", "Job", True, (), ("all",), status=True),
        _builtin("rbac.authorization.k8s.io", "v1", "roles", "Role", True),
        _builtin("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True),
        _builtin("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False),
        _builtin("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False),
        ResourceType(
            group="authorization.k8s.io",
            version="v1",
            plural="selfsubjectaccessreviews",
            kind="SelfSubjectAccessReview",
            namespaced=False,
            verbs=("create",),
        ),
        _builtin("monitoring.coreos.com", "v1", "servicemonitors", "ServiceMonitor", True, ("smon",)),
    ]


def crd_types(crd: dict[str, Any]) -> list[ResourceType]:
    """One resource type per served version of a CustomResourceDefinition."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    group = spec.get("group", "")
    result = []
    for version in spec.get("versions") or []:
        if not version.get("served", True):
            continue
        subresources = version.get("subresources") or {}
        schema = (version.get("schema") or {}).get("openAPIV3Schema")
        result.append(
            ResourceType(
                group=group,
                version=version["name"],
                plural=names.get("plural", ""),
                kind=names.get("kind", ""),
                singular=names.get("singular") or names.get("kind", "").lower(),
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                short_names=tuple(names.get("shortNames") or ()),
                categories=tuple(names.get("categories") or ()),
                status_subresource="status" in subresources,
                schema=schema,
                printer_columns=list(version.get("additionalPrinterColumns") or []),
                crd_name=(crd.get("metadata") or {}).get("name"),
                builtin=False,
            )
        )
    return result
