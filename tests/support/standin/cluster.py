"""The stand-in's state and write semantics: what a real API server does around storage."""

from __future__ import annotations

import base64
import datetime
import json
import random
import re
import string
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from . import patching, schema
from .errors import ApiError
from .registry import ResourceType, builtin_types, crd_types
from .selectors import FieldSelector, LabelSelector
from .store import Store

CRD_KEY = ("apiextensions.k8s.io", "customresourcedefinitions")
NS_KEY = ("", "namespaces")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
SERVER_FIELDS = (
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "deletionTimestamp",
    "generation",
    "selfLink",
    "managedFields",
    "deletionGracePeriodSeconds",
)

AdmissionFn = Callable[
    [ResourceType, str, dict[str, Any], dict[str, Any] | None, bool], Awaitable[dict[str, Any]]
]


class _Yaml12Loader(yaml.SafeLoader):
    """YAML with 1.2 booleans (true/false only), as the API server's sigs.k8s.io/yaml reads it."""


_Yaml12Loader.yaml_implicit_resolvers = {
    key: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for key, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def load_yaml(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return yaml.load(body, Loader=_Yaml12Loader)


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Request:
    """Per-request options and the warnings to send back (`Warning:` headers)."""

    params: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @property
    def dry_run(self) -> bool:
        return self.params.get("dryRun") == "All"

    @property
    def field_validation(self) -> str:
        return self.params.get("fieldValidation", "")


class Cluster:
    def __init__(self, history_size: int = 20000) -> None:
        self.history_size = history_size
        self.rv = 0
        self.epoch = 0  # bumped when the set of resource types changes (discovery/OpenAPI hashes)
        self.types: dict[tuple[str, str, str], ResourceType] = {}
        self.stores: dict[tuple[str, str], Store] = {}
        self.applied: dict[tuple[str, str, str, str, str], set[tuple[str, ...]]] = {}
        self.mutate: AdmissionFn | None = None
        self.validate: AdmissionFn | None = None
        for rt in builtin_types():
            self._register(rt)
        for name in ("default", "kube-system", "kube-public", "kube-node-lease"):
            self._insert_namespace(name)

    # -- registry ----------------------------------------------------------------------------
    def _register(self, rt: ResourceType) -> None:
        self.types[(rt.group, rt.version, rt.plural)] = rt
        if rt.storage not in self.stores:
            self.stores[rt.storage] = Store(self.history_size)
        self.epoch += 1

    def resource(self, group: str, version: str, plural: str) -> ResourceType:
        rt = self.types.get((group, version, plural))
        if rt is None:
            raise ApiError(
                404,
                "NotFound",
                "the server could not find the requested resource",
                {"group": group, "kind": plural},
            )
        return rt

    def store(self, rt: ResourceType) -> Store:
        return self.stores[rt.storage]

    def next_rv(self) -> int:
        self.rv += 1
        return self.rv

    def _insert_namespace(self, name: str) -> None:
        rt = self.types[("", "v1", "namespaces")]
        rv = self.next_rv()
        obj = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": name,
                "uid": str(uuid.uuid4()),
                "resourceVersion": str(rv),
                "creationTimestamp": now_rfc3339(),
                "labels": {"kubernetes.io/metadata.name": name},
            },
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Active"},
        }
        self.store(rt).put("", name, obj, "ADDED", rv)

    def namespace_labels(self, namespace: str) -> dict[str, str] | None:
        ns = self.stores[NS_KEY].get("", namespace)
        return None if ns is None else (ns["metadata"].get("labels") or {})

    # -- reads -------------------------------------------------------------------------------
    def get(self, rt: ResourceType, namespace: str, name: str) -> dict[str, Any]:
        obj = self.store(rt).get(namespace if rt.namespaced else "", name)
        if obj is None:
            raise ApiError.not_found(rt.qualified, name)
        return self._as_version(rt, obj)

    @staticmethod
    def _as_version(rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        if obj.get("apiVersion") != rt.api_version:
            return {**obj, "apiVersion": rt.api_version}
        return obj

    def list_objects(self, rt: ResourceType, namespace: str | None, params: dict[str, str]) -> dict[str, Any]:
        labels = LabelSelector.parse(params.get("labelSelector"))
        fields = FieldSelector.parse(params.get("fieldSelector"))
        items = self.store(rt).select(namespace if rt.namespaced else None, labels, fields)
        items.sort(key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
        metadata: dict[str, Any] = {"resourceVersion": str(self.rv)}
        token = params.get("continue")
        if token:
            try:
                state = json.loads(base64.urlsafe_b64decode(token.encode()))
                after = (state["ns"], state["name"])
            except (ValueError, KeyError, TypeError) as e:
                raise ApiError.bad_request(f"continue key is not valid: {e}") from None
            if state.get("rv", 0) < self.store(rt).compacted_rv:
                raise ApiError.gone(
                    "The provided continue parameter is too old to display a consistent list result."
                )
            items = [o for o in items if (o["metadata"].get("namespace", ""), o["metadata"]["name"]) > after]
        limit = int(params.get("limit") or 0)
        if limit > 0 and len(items) > limit:
            last = items[limit - 1]["metadata"]
            state = {"rv": self.rv, "ns": last.get("namespace", ""), "name": last["name"]}
            metadata["continue"] = base64.urlsafe_b64encode(json.dumps(state).encode()).decode()
            metadata["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        return {
            "apiVersion": rt.api_version,
            "kind": f"{rt.kind}List",
            "metadata": metadata,
            "items": [self._as_version(rt, o) for o in items],
        }

    # -- validation helpers -----------------------------------------------------------------
    def _check_schema(
        self, rt: ResourceType, obj: dict[str, Any], req: Request, *, report_unknown: bool
    ) -> None:
        if rt.schema is None:
            return
        unknown, causes = schema.check_object(obj, rt.schema)
        if unknown and report_unknown:
            if req.field_validation == "Strict":
                listed = ", ".join(f'unknown field "{path}"' for path in unknown)
                raise ApiError.bad_request(
                    f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: '
                    f"strict decoding error: {listed}"
                )
            if req.field_validation == "Warn":
                req.warnings.extend(f'unknown field "{path}"' for path in unknown)
        if causes:
            raise ApiError.invalid(rt.kind, rt.group, obj["metadata"].get("name", ""), causes)

    def _check_crd(self, obj: dict[str, Any]) -> None:
        spec = obj.get("spec") or {}
        names = spec.get("names") or {}
        name = obj["metadata"].get("name", "")
        causes = []
        for path, value in (
            ("spec.group", spec.get("group")),
            ("spec.names.plural", names.get("plural")),
            ("spec.names.kind", names.get("kind")),
            ("spec.scope", spec.get("scope")),
        ):
            if not value:
                causes.append({"reason": "FieldValueRequired", "field": path, "message": "Required value"})
        if not spec.get("versions"):
            causes.append(
                {"reason": "FieldValueRequired", "field": "spec.versions", "message": "Required value"}
            )
        expected = f"{names.get('plural')}.{spec.get('group')}"
        if not causes and name != expected:
            causes.append(
                {
                    "reason": "FieldValueInvalid",
                    "field": "metadata.name",
                    "message": f'Invalid value: "{name}": must be spec.names.plural+"."+spec.group',
                }
            )
        if causes:
            raise ApiError.invalid("CustomResourceDefinition", "apiextensions.k8s.io", name, causes)

    # -- create ------------------------------------------------------------------------------
    async def create(
        self, rt: ResourceType, namespace: str | None, body: Any, req: Request
    ) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise ApiError.bad_request("the body of the request must be a JSON object")
        obj: dict[str, Any] = body
        if obj.get("kind") not in (None, "", rt.kind):
            raise ApiError.bad_request(
                f"the API version in the data ({obj.get('apiVersion')}) and kind "
                f"({obj.get('kind')}) do not match the resource {rt.qualified}"
            )
        obj["apiVersion"] = rt.api_version
        obj["kind"] = rt.kind
        meta = obj.get("metadata")
        if meta is None:
            meta = obj["metadata"] = {}
        if not isinstance(meta, dict):
            raise ApiError.bad_request("metadata must be an object")
        if rt.namespaced:
            body_ns = meta.get("namespace")
            if namespace is None:
                namespace = body_ns or "default"
            if body_ns and body_ns != namespace:
                raise ApiError.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = namespace
            if self.stores[NS_KEY].get("", namespace) is None:
                raise ApiError.not_found("namespaces", namespace)
        else:
            meta.pop("namespace", None)
            namespace = ""
        for key in SERVER_FIELDS:
            meta.pop(key, None)
        name = meta.get("name")
        if not name:
            prefix = meta.get("generateName")
            if not prefix:
                raise ApiError.invalid(
                    rt.kind,
                    rt.group,
                    "",
                    [
                        {
                            "reason": "FieldValueRequired",
                            "field": "metadata.name",
                            "message": "Required value: name or generateName is required",
                        }
                    ],
                )
            name = prefix + "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
            meta["name"] = name
        if len(name) > 253 or not DNS_SUBDOMAIN.match(name):
            raise ApiError.invalid(
                rt.kind,
                rt.group,
                name,
                [
                    {
                        "reason": "FieldValueInvalid",
                        "field": "metadata.name",
                        "message": f'Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist '
                        "of lower case alphanumeric characters, '-' or '.', and must start and end "
                        "with an alphanumeric character",
                    }
                ],
            )
        store = self.store(rt)
        if store.get(namespace, name) is not None:
            raise ApiError.already_exists(rt.qualified, name)

        if not rt.builtin and rt.status_subresource:
            obj.pop("status", None)
        if rt.storage == ("", "pods"):
            obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
        if rt.storage == NS_KEY:
            meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = name
            obj["status"] = {"phase": "Active"}
        if rt.storage == CRD_KEY:
            self._check_crd(obj)
        self._check_schema(rt, obj, req, report_unknown=True)

        if self.mutate is not None:
            obj = await self.mutate(rt, "CREATE", obj, None, req.dry_run)
            self._check_schema(rt, obj, req, report_unknown=False)
        if self.validate is not None:
            await self.validate(rt, "CREATE", obj, None, req.dry_run)
        if store.get(namespace, name) is not None:  # created meanwhile (admission awaited)
            raise ApiError.already_exists(rt.qualified, name)

        meta = obj["metadata"]
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339()
        meta["generation"] = 1
        if rt.storage == CRD_KEY:
            obj["status"] = self._crd_status(obj)
        if req.dry_run:
            meta["resourceVersion"] = str(self.rv)
            return obj
        rv = self.next_rv()
        meta["resourceVersion"] = str(rv)
        store.put(namespace, name, obj, "ADDED", rv)
        if rt.storage == CRD_KEY:
            self._register_crd(obj)
        return obj

    # -- update / patch ----------------------------------------------------------------------
    def _current(self, rt: ResourceType, namespace: str | None, name: str) -> tuple[str, dict[str, Any]]:
        ns = (namespace or "") if rt.namespaced else ""
        cur = self.store(rt).get(ns, name)
        if cur is None:
            raise ApiError.not_found(rt.qualified, name)
        return ns, cur

    async def update(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        obj: Any,
        *,
        subresource: str | None,
        req: Request,
    ) -> dict[str, Any]:
        if not isinstance(obj, dict):
            raise ApiError.bad_request("the body of the request must be a JSON object")
        ns, cur = self._current(rt, namespace, name)
        meta = obj.get("metadata") or {}
        if meta.get("name") and meta["name"] != name:
            raise ApiError.bad_request(
                f"the name of the object ({meta['name']}) does not match the name on the URL ({name})"
            )
        wanted = meta.get("resourceVersion")
        if wanted and wanted != cur["metadata"]["resourceVersion"]:
            raise ApiError.conflict(
                rt.qualified,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            )
        return await self._commit(rt, ns, cur, obj, subresource=subresource, req=req)

    async def patch(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        body: bytes,
        content_type: str,
        *,
        subresource: str | None,
        req: Request,
    ) -> tuple[int, dict[str, Any]]:
        if content_type == "application/apply-patch+yaml":
            return await self.apply(rt, namespace, name, body, subresource=subresource, req=req)
        try:
            patch = json.loads(body)
        except ValueError as e:
            raise ApiError.bad_request(f"error decoding patch: {e}") from None
        ns, cur = self._current(rt, namespace, name)
        doc = patching.deepcopy(cur)
        if content_type == "application/merge-patch+json":
            new = patching.merge_patch(doc, patch)
        elif content_type == "application/json-patch+json":
            new = patching.json_patch(doc, patch)
        elif content_type == "application/strategic-merge-patch+json" and rt.builtin:
            new = patching.strategic_merge(doc, patch)
        else:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types include: "
                "application/json-patch+json, application/merge-patch+json, "
                "application/apply-patch+yaml"
                + (", application/strategic-merge-patch+json" if rt.builtin else ""),
            )
        if not isinstance(new, dict):
            raise ApiError.bad_request("the patch made the object not an object")
        wanted = (new.get("metadata") or {}).get("resourceVersion")
        if wanted and wanted != cur["metadata"]["resourceVersion"]:
            raise ApiError.conflict(
                rt.qualified,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            )
        return 200, await self._commit(rt, ns, cur, new, subresource=subresource, req=req)

    async def apply(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        body: bytes,
        *,
        subresource: str | None,
        req: Request,
    ) -> tuple[int, dict[str, Any]]:
        manager = req.params.get("fieldManager")
        if not manager:
            raise ApiError.bad_request("PATCH with apply requires a fieldManager query parameter")
        try:
            applied = load_yaml(body)
        except yaml.YAMLError as e:
            raise ApiError.bad_request(f"error decoding YAML: {e}") from None
        if not isinstance(applied, dict):
            raise ApiError.bad_request("the applied configuration must be an object")
        meta = applied.get("metadata") or {}
        if meta.get("name") not in (None, name):
            raise ApiError.bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on the URL ({name})"
            )
        owned = patching.leaf_paths(applied)
        ns = (namespace or "") if rt.namespaced else ""
        key = (rt.group, rt.plural, ns, name, f"{manager}/{subresource or ''}")
        cur = self.store(rt).get(ns, name)
        if cur is None:
            if subresource:
                raise ApiError.not_found(rt.qualified, name)
            applied.setdefault("metadata", {})["name"] = name
            created = await self.create(rt, namespace, applied, req)
            if not req.dry_run:
                self.applied[key] = owned
            return 201, created
        new = patching.strategic_merge(patching.deepcopy(cur), patching.deepcopy(applied), apply=True)
        for path in self.applied.get(key, set()) - owned:
            if path[0] != "metadata" or path[1] in ("labels", "annotations"):
                patching.remove_path(new, path)
        result = await self._commit(rt, ns, cur, new, subresource=subresource, req=req)
        if not req.dry_run:
            self.applied[key] = owned
        return 200, result

    async def _commit(
        self,
        rt: ResourceType,
        ns: str,
        cur: dict[str, Any],
        new: dict[str, Any],
        *,
        subresource: str | None,
        req: Request,
    ) -> dict[str, Any]:
        name = cur["metadata"]["name"]
        if subresource == "status":
            status = new.get("status")
            new = patching.deepcopy(cur)
            if status is None:
                new.pop("status", None)
            else:
                new["status"] = status
        elif subresource:
            raise ApiError(
                404, "NotFound", f"the server could not find the requested resource ({subresource})"
            )
        else:
            if rt.status_subresource:
                if "status" in cur:
                    new["status"] = patching.deepcopy(cur["status"])
                else:
                    new.pop("status", None)
            meta = new.get("metadata")
            if not isinstance(meta, dict):
                meta = new["metadata"] = {}
            cmeta = cur["metadata"]
            for key in (
                "name",
                "namespace",
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
            ):
                if key in cmeta:
                    meta[key] = cmeta[key]
                else:
                    meta.pop(key, None)
            meta.pop("managedFields", None)
            meta.pop("selfLink", None)
        new["apiVersion"] = rt.api_version
        new["kind"] = rt.kind
        meta = new["metadata"]
        meta["resourceVersion"] = cur["metadata"]["resourceVersion"]
        if rt.storage == CRD_KEY and not subresource:
            self._check_crd(new)
            new["status"] = self._crd_status(new)
        self._check_schema(rt, new, req, report_unknown=not subresource)
        if not subresource and self.mutate is not None:
            new = await self.mutate(rt, "UPDATE", new, cur, req.dry_run)
            self._check_schema(rt, new, req, report_unknown=False)
        if not subresource and self.validate is not None:
            await self.validate(rt, "UPDATE", new, cur, req.dry_run)
        if self.store(rt).get(ns, name) is not cur:  # changed while admission was awaited
            raise ApiError.conflict(
                rt.qualified,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            )

        skip = ("metadata", "status") if rt.status_subresource else ("metadata",)
        if any(new.get(k) != cur.get(k) for k in set(new) | set(cur) if k not in skip):
            meta["generation"] = int(cur["metadata"].get("generation", 1)) + 1
        if new == cur:
            return cur  # a no-op write changes nothing: no new resourceVersion, no event
        if req.dry_run:
            return new
        rv = self.next_rv()
        meta["resourceVersion"] = str(rv)
        store = self.store(rt)
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            store.remove(ns, name, new, rv)
            self._after_delete(rt, new)
        else:
            store.put(ns, name, new, "MODIFIED", rv)
            if rt.storage == CRD_KEY:
                self._register_crd(new)
        return new

    # -- delete ------------------------------------------------------------------------------
    async def delete(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        options: Any,
        *,
        req: Request,
    ) -> dict[str, Any]:
        ns, cur = self._current(rt, namespace, name)
        preconditions = (options or {}).get("preconditions") or {} if isinstance(options, dict) else {}
        meta = cur["metadata"]
        if preconditions.get("uid") and preconditions["uid"] != meta["uid"]:
            raise ApiError.conflict(
                rt.qualified,
                name,
                f"Precondition failed: UID in precondition: "
                f"{preconditions['uid']}, UID in object meta: {meta['uid']}",
            )
        if (
            preconditions.get("resourceVersion")
            and preconditions["resourceVersion"] != meta["resourceVersion"]
        ):
            raise ApiError.conflict(
                rt.qualified,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            )
        if req.dry_run:
            return cur
        return self._delete(rt, ns, cur)

    def _delete(self, rt: ResourceType, ns: str, cur: dict[str, Any]) -> dict[str, Any]:
        meta = cur["metadata"]
        store = self.store(rt)
        if meta.get("finalizers"):
            if meta.get("deletionTimestamp"):
                return cur
            new = patching.deepcopy(cur)
            rv = self.next_rv()
            new["metadata"].update(
                deletionTimestamp=now_rfc3339(),
                deletionGracePeriodSeconds=0,
                resourceVersion=str(rv),
                generation=int(meta.get("generation", 1)) + 1,
            )
            store.put(ns, meta["name"], new, "MODIFIED", rv)
            return dict(new)
        rv = self.next_rv()
        final = {**cur, "metadata": {**meta, "resourceVersion": str(rv)}}
        store.remove(ns, meta["name"], final, rv)
        self._after_delete(rt, final)
        return final

    async def delete_collection(
        self, rt: ResourceType, namespace: str | None, req: Request
    ) -> dict[str, Any]:
        listed = self.list_objects(rt, namespace, req.params)
        if not req.dry_run:
            for obj in listed["items"]:
                cur = self.store(rt).get(obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
                if cur is not None:
                    self._delete(rt, cur["metadata"].get("namespace", ""), cur)
        return listed

    def _after_delete(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        if rt.storage == NS_KEY:
            namespace = obj["metadata"]["name"]
            for key, store in self.stores.items():
                if key == NS_KEY:
                    continue
                owner = next(t for t in self.types.values() if t.storage == key)
                for item in list(store.iter(namespace)):
                    self._delete(owner, namespace, item)
        elif rt.storage == CRD_KEY:
            self._unregister_crd(obj)

    # -- CRDs --------------------------------------------------------------------------------
    @staticmethod
    def _crd_status(crd: dict[str, Any]) -> dict[str, Any]:
        spec = crd.get("spec") or {}
        stamp = now_rfc3339()
        storage = [v["name"] for v in spec.get("versions") or [] if v.get("storage")]
        conditions = [
            {"type": t, "status": "True", "reason": r, "message": m, "lastTransitionTime": stamp}
            for t, r, m in (
                ("NamesAccepted", "NoConflicts", "no conflicts found"),
                ("Established", "InitialNamesAccepted", "the initial names have been accepted"),
            )
        ]
        return {
            "acceptedNames": dict(spec.get("names") or {}),
            "conditions": conditions,
            "storedVersions": storage,
        }

    def _register_crd(self, crd: dict[str, Any]) -> None:
        name = crd["metadata"]["name"]
        for key in [k for k, t in self.types.items() if t.crd_name == name]:
            del self.types[key]
        for rt in crd_types(crd):
            self._register(rt)
        self.epoch += 1

    def _unregister_crd(self, crd: dict[str, Any]) -> None:
        name = crd["metadata"]["name"]
        gone = [k for k, t in self.types.items() if t.crd_name == name]
        storages = {self.types[k].storage for k in gone}
        for key in gone:
            del self.types[key]
        for storage in storages:
            store = self.stores.pop(storage, None)
            if store is None:
                continue
            for obj in list(store.iter(None)):
                rv = self.next_rv()
                final = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(rv)}}
                store.remove(obj["metadata"].get("namespace", ""), obj["metadata"]["name"], final, rv)
            for watcher in store.all_watchers():
                watcher.queue.put_nowait("close")
        self.epoch += 1

    # -- test controls -----------------------------------------------------------------------
    def compact(self) -> None:
        for store in self.stores.values():
            store.compact(self.rv)

    def all_watchers(self) -> list[Any]:
        return [w for store in self.stores.values() for w in store.all_watchers()]

    def stats(self) -> dict[str, Any]:
        return {
            "resourceVersion": self.rv,
            "objects": sum(s.count for s in self.stores.values()),
            "watchers": len(self.all_watchers()),
            "types": len(self.types),
        }
