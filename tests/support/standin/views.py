"""Read-only views kubectl needs: discovery (legacy and aggregated), OpenAPI v3, Tables."""

from __future__ import annotations

import datetime
import hashlib
import re
from collections.abc import Iterable
from typing import Any

from .cluster import Cluster
from .patching import deepcopy
from .registry import SUB_VERBS, ResourceType

SERVER_VERSION = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.0-standin",
    "gitCommit": "standin",
    "gitTreeState": "clean",
    "buildDate": "2025-01-01T00:00:00Z",
    "goVersion": "go1.23",
    "compiler": "gc",
    "platform": "linux/amd64",
}
AGGREGATED = "application/json;g=apidiscovery.k8s.io;v={v};as=APIGroupDiscoveryList"


# -- discovery -----------------------------------------------------------------------------------
def _groups(cluster: Cluster) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for group, version, _ in cluster.types:
        versions = groups.setdefault(group, [])
        if version not in versions:
            versions.append(version)
    for versions in groups.values():
        versions.sort(key=_version_priority)
    return groups


def _version_priority(version: str) -> tuple[int, int, int]:
    """Kubernetes version priority: GA > beta > alpha, higher numbers first."""
    m = re.match(r"^v(\d+)(?:(alpha|beta)(\d+))?$", version)
    if not m:
        return (3, 0, 0)
    stage = {"": 0, "beta": 1, "alpha": 2}[m.group(2) or ""]
    return (stage, -int(m.group(1)), -int(m.group(3) or 0))


def api_versions() -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
    }


def _group_entry(group: str, versions: list[str]) -> dict[str, Any]:
    return {
        "name": group,
        "versions": [{"groupVersion": f"{group}/{v}", "version": v} for v in versions],
        "preferredVersion": {"groupVersion": f"{group}/{versions[0]}", "version": versions[0]},
    }


def api_group_list(cluster: Cluster) -> dict[str, Any]:
    groups = _groups(cluster)
    return {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [_group_entry(g, vs) for g, vs in sorted(groups.items()) if g],
    }


def api_group(cluster: Cluster, group: str) -> dict[str, Any] | None:
    versions = _groups(cluster).get(group)
    if not versions:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group_entry(group, versions)}


def _types_of(cluster: Cluster, group: str, version: str) -> list[ResourceType]:
    return sorted(
        (t for (g, v, _), t in cluster.types.items() if g == group and v == version), key=lambda t: t.plural
    )


def api_resource_list(cluster: Cluster, group: str, version: str) -> dict[str, Any] | None:
    types = _types_of(cluster, group, version)
    if not types:
        return None
    resources: list[dict[str, Any]] = []
    for rt in types:
        entry: dict[str, Any] = {
            "name": rt.plural,
            "singularName": rt.singular,
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": list(rt.verbs),
        }
        if rt.short_names:
            entry["shortNames"] = list(rt.short_names)
        if rt.categories:
            entry["categories"] = list(rt.categories)
        resources.append(entry)
        if rt.status_subresource:
            resources.append(
                {
                    "name": f"{rt.plural}/status",
                    "singularName": "",
                    "namespaced": rt.namespaced,
                    "kind": rt.kind,
                    "verbs": list(SUB_VERBS),
                }
            )
    gv = f"{group}/{version}" if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}


def aggregated(cluster: Cluster, *, core: bool, version: str) -> dict[str, Any]:
    """APIGroupDiscoveryList (apidiscovery.k8s.io/v2 or v2beta1) for /api or /apis."""
    items = []
    for group, versions in sorted(_groups(cluster).items()):
        if (group == "") != core:
            continue
        version_entries = []
        for gv_version in versions:
            resources = []
            for rt in _types_of(cluster, group, gv_version):
                kind = {"group": group, "version": gv_version, "kind": rt.kind}
                entry: dict[str, Any] = {
                    "resource": rt.plural,
                    "responseKind": kind,
                    "scope": "Namespaced" if rt.namespaced else "Cluster",
                    "singularResource": rt.singular,
                    "verbs": list(rt.verbs),
                }
                if rt.short_names:
                    entry["shortNames"] = list(rt.short_names)
                if rt.categories:
                    entry["categories"] = list(rt.categories)
                if rt.status_subresource:
                    entry["subresources"] = [
                        {"subresource": "status", "responseKind": kind, "verbs": list(SUB_VERBS)}
                    ]
                resources.append(entry)
            version_entries.append({"version": gv_version, "resources": resources, "freshness": "Current"})
        items.append({"metadata": {"name": group, "creationTimestamp": None}, "versions": version_entries})
    return {
        "kind": "APIGroupDiscoveryList",
        "apiVersion": f"apidiscovery.k8s.io/{version}",
        "metadata": {},
        "items": items,
    }


def wants_aggregated(accept: str) -> str | None:
    """The aggregated discovery version the client accepts first (v2 or v2beta1), if any."""
    for part in accept.split(","):
        params = dict(p.strip().split("=", 1) for p in part.split(";")[1:] if "=" in p)
        if (
            params.get("as") == "APIGroupDiscoveryList"
            and params.get("g") == "apidiscovery.k8s.io"
            and params.get("v") in ("v2", "v2beta1")
        ):
            return params["v"]
    return None


# -- OpenAPI v3 ----------------------------------------------------------------------------------
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
LIST_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta"
PATCH = "io.k8s.apimachinery.pkg.apis.meta.v1.Patch"
STATUS = "io.k8s.apimachinery.pkg.apis.meta.v1.Status"
COMMON = {
    OBJECT_META: {
        "description": "ObjectMeta is metadata that all persisted resources must have, which includes all "
        "objects users must create.",
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "Name must be unique within a namespace."},
            "generateName": {
                "type": "string",
                "description": "An optional prefix to generate a unique name.",
            },
            "namespace": {"type": "string", "description": "The namespace of the object."},
            "labels": {
                "type": "object",
                "additionalProperties": {"type": "string", "default": ""},
                "description": "Map of string keys and values to organize and categorize objects.",
            },
            "annotations": {
                "type": "object",
                "additionalProperties": {"type": "string", "default": ""},
                "description": "Unstructured key value map stored with a resource.",
            },
            "uid": {
                "type": "string",
                "description": "UID is the unique in time and space value for this object.",
            },
            "resourceVersion": {"type": "string", "description": "An opaque value for concurrency control."},
            "generation": {
                "type": "integer",
                "format": "int64",
                "description": "A sequence number representing a specific generation of the desired state.",
            },
            "creationTimestamp": {
                "type": "string",
                "format": "date-time",
                "description": "When this object was created.",
            },
            "deletionTimestamp": {
                "type": "string",
                "format": "date-time",
                "description": "When this object will be deleted.",
            },
            "finalizers": {
                "type": "array",
                "items": {"type": "string", "default": ""},
                "x-kubernetes-list-type": "set",
                "description": "Must be empty before the object is deleted from the registry.",
            },
            "ownerReferences": {
                "type": "array",
                "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                "x-kubernetes-list-map-keys": ["uid"],
                "x-kubernetes-list-type": "map",
                "description": "List of objects depended by this object.",
            },
        },
    },
    LIST_META: {
        "type": "object",
        "description": "ListMeta describes metadata that synthetic resources must have.",
        "properties": {
            "resourceVersion": {"type": "string"},
            "continue": {"type": "string"},
            "remainingItemCount": {"type": "integer", "format": "int64"},
        },
    },
    PATCH: {
        "type": "object",
        "description": "Patch is provided to give a concrete name and type to the "
        "Kubernetes PATCH request body.",
    },
    STATUS: {
        "type": "object",
        "description": "Status is a return value for calls that don't return other objects.",
        "x-kubernetes-preserve-unknown-fields": True,
    },
}
QUERY_PARAMS = ("dryRun", "fieldManager", "fieldValidation", "force", "pretty")


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _resource_schema(rt: ResourceType) -> dict[str, Any]:
    if rt.schema is not None:
        body = deepcopy(rt.schema)
    else:
        body = {
            "type": "object",
            "description": f"{rt.kind} (schema not modelled by the stand-in).",
            "properties": {
                "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            },
        }
    properties = body.setdefault("properties", {})
    properties["apiVersion"] = {
        "type": "string",
        "description": "APIVersion defines the versioned schema of this representation of an object.",
    }
    properties["kind"] = {
        "type": "string",
        "description": "Kind is a string value representing the REST resource this object represents.",
    }
    properties["metadata"] = {
        "allOf": [_ref(OBJECT_META)],
        "default": {},
        "description": "Standard object's metadata.",
    }
    body["type"] = "object"
    body["x-kubernetes-group-version-kind"] = [{"group": rt.group, "version": rt.version, "kind": rt.kind}]
    return dict(body)


def _operation(rt: ResourceType, action: str, verb: str, schema_name: str, patchable: bool) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "operationId": f"{verb}{rt.kind}",
        "description": f"{verb} {rt.kind}",
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": {"group": rt.group, "version": rt.version, "kind": rt.kind},
        "parameters": [
            {"name": p, "in": "query", "schema": {"type": "string", "uniqueItems": True}}
            for p in QUERY_PARAMS
        ],
        "responses": {
            "200": {"description": "OK", "content": {"application/json": {"schema": _ref(schema_name)}}}
        },
    }
    if patchable:
        types = [
            "application/json-patch+json",
            "application/merge-patch+json",
            "application/apply-patch+yaml",
        ]
        operation["requestBody"] = {"content": {t: {"schema": _ref(PATCH)} for t in types}, "required": True}
    elif action in ("put", "post"):
        operation["requestBody"] = {"content": {"*/*": {"schema": _ref(schema_name)}}, "required": True}
    return operation


def openapi_index(cluster: Cluster) -> dict[str, Any]:
    digest = hashlib.sha256(f"{id(cluster)}-{cluster.epoch}".encode()).hexdigest()[:32].upper()
    paths = {}
    for group, versions in _groups(cluster).items():
        for version in versions:
            key = f"api/{version}" if not group else f"apis/{group}/{version}"
            paths[key] = {"serverRelativeURL": f"/openapi/v3/{key}?hash={digest}"}
    return {"paths": paths}


def openapi_group_version(cluster: Cluster, group: str, version: str) -> dict[str, Any] | None:
    types = _types_of(cluster, group, version)
    if not types:
        return None
    prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
    schemas: dict[str, Any] = dict(deepcopy(COMMON))
    paths: dict[str, Any] = {}
    for rt in types:
        name = rt.schema_name
        schemas[name] = _resource_schema(rt)
        schemas[f"{name}List"] = {
            "type": "object",
            "description": f"{rt.kind}List is a list of {rt.kind}",
            "required": ["items"],
            "properties": {
                "apiVersion": {"type": "string"},
                "kind": {"type": "string"},
                "items": {"type": "array", "items": _ref(name)},
                "metadata": {"allOf": [_ref(LIST_META)], "default": {}},
            },
            "x-kubernetes-group-version-kind": [
                {"group": rt.group, "version": rt.version, "kind": f"{rt.kind}List"}
            ],
        }
        base = f"{prefix}/namespaces/{{namespace}}/{rt.plural}" if rt.namespaced else f"{prefix}/{rt.plural}"
        paths[base] = {
            "get": _operation(rt, "list", "list", f"{name}List", False),
            "post": _operation(rt, "post", "create", name, False),
        }
        item = {
            "get": _operation(rt, "get", "read", name, False),
            "put": _operation(rt, "put", "replace", name, False),
            "patch": _operation(rt, "patch", "patch", name, True),
            "delete": _operation(rt, "delete", "delete", STATUS, False),
        }
        paths[f"{base}/{{name}}"] = item
        if rt.status_subresource:
            paths[f"{base}/{{name}}/status"] = {
                "get": _operation(rt, "get", "read", name, False),
                "put": _operation(rt, "put", "replace", name, False),
                "patch": _operation(rt, "patch", "patch", name, True),
            }
        if rt.namespaced:
            paths[f"{prefix}/{rt.plural}"] = {"get": _operation(rt, "list", "list", f"{name}List", False)}
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": SERVER_VERSION["gitVersion"]},
        "paths": paths,
        "components": {"schemas": schemas},
    }


# -- Tables --------------------------------------------------------------------------------------
_SEGMENT = re.compile(
    r"""\.([A-Za-z0-9_-]+)|\[(\d+)\]|\[\?\(@\.([A-Za-z0-9_.-]+)\s*==\s*["']([^"']*)["']\)\]|\[['"]([^'"]+)['"]\]"""
)


def jsonpath(obj: Any, path: str) -> Any:
    """The JSONPath subset used by printer columns: .a.b, [0], [?(@.type=="X")], ['a.b']."""
    path = path.strip()
    if path.startswith("{") and path.endswith("}"):
        path = path[1:-1]
    path = path.lstrip("$")
    value = obj
    pos = 0
    while pos < len(path):
        m = _SEGMENT.match(path, pos)
        if m is None:
            return None
        pos = m.end()
        key, index, filter_key, filter_value, quoted = m.groups()
        if key is not None or quoted is not None:
            value = value.get(key if key is not None else quoted) if isinstance(value, dict) else None
        elif index is not None:
            value = value[int(index)] if isinstance(value, list) and int(index) < len(value) else None
        else:
            found = None
            if isinstance(value, list):
                for item in value:
                    probe = item
                    for part in filter_key.split("."):
                        probe = probe.get(part) if isinstance(probe, dict) else None
                    if probe is not None and str(probe) == filter_value:
                        found = item
                        break
            value = found
        if value is None:
            return None
    return value


def human_duration(seconds: float) -> str:
    """k8s.io/apimachinery/pkg/util/duration.HumanDuration."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m" if s % 60 == 0 else f"{minutes}m{s % 60}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        return f"{hours}h" if minutes % 60 == 0 else f"{hours}h{minutes % 60}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d" if hours % 24 == 0 else f"{hours // 24}d{hours % 24}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        return f"{hours // 24 // 365}y" if days == 0 else f"{hours // 24 // 365}y{days}d"
    return f"{hours // 24 // 365}y"


def _age(stamp: Any) -> Any:
    if not isinstance(stamp, str):
        return None
    try:
        then = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return stamp
    return human_duration((datetime.datetime.now(datetime.UTC) - then).total_seconds())


def _column(
    name: str, type_: str = "string", fmt: str = "", priority: int = 0, description: str = ""
) -> dict[str, Any]:
    return {
        "name": name,
        "type": type_,
        "format": fmt,
        "description": description or name,
        "priority": priority,
    }


def _pod_cells(obj: dict[str, Any]) -> list[Any]:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    containers = spec.get("containers") or []
    statuses = status.get("containerStatuses") or []
    ready = sum(1 for s in statuses if s.get("ready"))
    restarts = sum(int(s.get("restartCount", 0)) for s in statuses)
    phase = "Terminating" if obj["metadata"].get("deletionTimestamp") else status.get("phase", "Unknown")
    return [f"{ready}/{len(containers)}", phase, restarts]


def table(
    rt: ResourceType, objects: Iterable[dict[str, Any]], include: str, list_meta: dict[str, Any]
) -> dict[str, Any]:
    """A meta.k8s.io/v1 Table, like the API server's table convertors."""
    name_column = _column("Name", fmt="name", description="Name must be unique within a namespace.")
    extra: list[tuple[dict[str, Any], Any]] = []
    if rt.printer_columns:
        for column in rt.printer_columns:
            definition = _column(
                column["name"],
                column.get("type", "string"),
                column.get("format", ""),
                int(column.get("priority", 0)),
                column.get("description", ""),
            )
            extra.append((definition, column.get("jsonPath", "")))
    elif rt.storage == ("", "pods"):
        for definition in (_column("Ready"), _column("Status"), _column("Restarts", "string")):
            extra.append((definition, None))
        extra.append((_column("Age", "string"), ".metadata.creationTimestamp"))
    elif rt.storage == ("", "namespaces"):
        extra = [(_column("Status"), ".status.phase"), (_column("Age"), ".metadata.creationTimestamp")]
    else:
        extra = [(_column("Age"), ".metadata.creationTimestamp")]
    rows = []
    for obj in objects:
        cells: list[Any] = [obj["metadata"]["name"]]
        pod_cells = _pod_cells(obj) if rt.storage == ("", "pods") and not rt.printer_columns else []
        for i, (definition, path) in enumerate(extra):
            if path is None:
                cells.append(pod_cells[i])
                continue
            value = jsonpath(obj, path)
            if definition["type"] == "date" or (definition["name"] == "Age" and not rt.printer_columns):
                value = _age(value)
            elif isinstance(value, dict | list):
                value = str(value)
            cells.append(value)
        row: dict[str, Any] = {"cells": cells}
        if include == "Object":
            row["object"] = obj
        elif include != "None":
            row["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj["metadata"],
            }
        rows.append(row)
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta,
        "columnDefinitions": [name_column] + [d for d, _ in extra],
        "rows": rows,
    }


def wants_table(accept: str) -> bool:
    first = accept.split(",", maxsplit=1)[0]
    return "as=Table" in first and "g=meta.k8s.io" in first
