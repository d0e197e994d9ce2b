"""The HTTP face of the stand-in: a kmock handler that serves the Kubernetes REST API.

kmock (`RawHandler`) gives the request entry point and its DSL: reactions added with
`handler[...] << ...` still take precedence over the emulation (useful for one-off oddities).
The emulation itself (storage, watches, discovery) is ours, because kmock's emulator scans every
object per request and keeps unbounded history (see DESIGN §7).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import traceback
from dataclasses import dataclass
from typing import Any

import attrs
import kmock
from aiohttp import web

from . import views
from .admission import Admission
from .cluster import Cluster, Request
from .errors import ApiError
from .registry import ResourceType
from .selectors import FieldSelector, LabelSelector
from .store import Event, Watcher

log = logging.getLogger("standin")
JSON = "application/json"
DEFAULT_WATCH_SECONDS = 1800.0


def _dumps(body: Any) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def _response(
    body: Any, status: int = 200, *, warnings: list[str] | None = None, content_type: str = JSON
) -> web.Response:
    response = web.Response(body=_dumps(body), status=status)
    response.headers["Content-Type"] = content_type
    for warning in warnings or []:
        response.headers.add("Warning", '299 - "' + warning.replace('"', '\\"') + '"')
    return response


@dataclass
class Fault:
    """Serve `status` (0: drop the connection) for the next `count` requests whose path matches."""

    pattern: re.Pattern[str]
    status: int = 500
    count: int = 1  # -1: until cleared
    method: str | None = None
    delay: float = 0.0
    retry_after: int = 1

    def matches(self, method: str, path_qs: str) -> bool:
        if self.count == 0:
            return False
        if self.method is not None and self.method.upper() != method:
            return False
        return self.pattern.search(path_qs) is not None


REASONS = {
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
    409: "Conflict",
    410: "Expired",
    403: "Forbidden",
    404: "NotFound",
}


@attrs.define(kw_only=True)
class ApiHandler(kmock.RawHandler):
    cluster: Cluster = attrs.field(factory=Cluster)
    admission: Admission | None = None
    bookmark_seconds: float = 30.0
    faults: list[Fault] = attrs.field(factory=list)
    served: int = 0
    writes: int = 0
    _streams: dict[Watcher, web.BaseRequest] = attrs.field(factory=dict)

    def __attrs_post_init__(self) -> None:
        if self.admission is None:
            self.admission = Admission(self.cluster)
        self.cluster.mutate = self.admission.mutate
        self.cluster.validate = self.admission.validate

    async def __call__(self, raw: web.BaseRequest) -> web.StreamResponse:
        self.served += 1
        try:
            if self.faults and not raw.path.startswith("/_standin"):
                fault = next((f for f in self.faults if f.matches(raw.method, raw.path_qs)), None)
                if fault is not None:
                    return await self._serve_fault(raw, fault)
            if self._payloads:  # kmock DSL reactions, when a test added any, take precedence
                try:
                    request = await kmock.Request._parse(raw, id=len(self._requests))
                except ValueError:  # kmock 0.8 cannot parse some paths (/api/v1/namespaces)
                    request = None
                if request is not None:
                    self._requests.append(request)
                    try:
                        return await self._handle(request)
                    except NotImplementedError:
                        pass
            return await self._dispatch(raw)
        except ApiError as e:
            return _response(e.status(), e.code)
        except Exception as e:
            log.error("stand-in failed on %s %s:\n%s", raw.method, raw.path_qs, traceback.format_exc())
            failure = ApiError(500, "InternalError", f"Internal error occurred: {e!r}")
            return _response(failure.status(), 500)

    async def _serve_fault(self, raw: web.BaseRequest, fault: Fault) -> web.StreamResponse:
        if fault.count > 0:
            fault.count -= 1
        if fault.delay:
            await asyncio.sleep(fault.delay)
        if fault.status == 0:
            if raw.transport is not None:
                raw.transport.close()
            return web.Response(status=500)
        reason = REASONS.get(fault.status, "InternalError")
        error = ApiError(fault.status, reason, f"injected fault: {reason}")
        response = _response(error.status(), fault.status)
        if fault.status == 429:
            response.headers["Retry-After"] = str(fault.retry_after)
        return response

    # -- routing -----------------------------------------------------------------------------
    async def _dispatch(self, raw: web.BaseRequest) -> web.StreamResponse:
        path = raw.path.rstrip("/") or "/"
        parts = path.strip("/").split("/")
        method = raw.method
        accept = raw.headers.get("Accept", "")
        cluster = self.cluster
        if parts[0] == "_standin":
            return await self._control(raw, parts[1:])
        if method == "GET" and path in ("/healthz", "/livez", "/readyz"):
            return web.Response(text="ok")
        if method == "GET" and path == "/version":
            return _response(views.SERVER_VERSION)
        if parts[0] == "openapi":
            return self._openapi(parts[1:])
        if (parts[0] == "api" and len(parts) <= 2) or (parts[0] == "apis" and len(parts) <= 3):
            return self._discovery(parts, accept)
        if parts[0] not in ("api", "apis"):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")

        group, version, rest = (
            ("", parts[1], parts[2:]) if parts[0] == "api" else (parts[1], parts[2], parts[3:])
        )
        params = dict(raw.query)
        if rest and rest[0] == "watch":
            rest = rest[1:]
            params["watch"] = "true"
        namespace: str | None = None
        if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in ("status", "finalize"):
            namespace, rest = rest[1], rest[2:]
        plural = rest[0]
        name = rest[1] if len(rest) > 1 else None
        subresource = "/".join(rest[2:]) or None
        rt = cluster.resource(group, version, plural)
        if subresource is not None and not (subresource == "status" and rt.status_subresource):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if not rt.namespaced and namespace is not None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        req = Request(params)

        if method == "GET":
            if params.get("watch") in ("true", "1"):
                if name is not None:
                    selector = params.get("fieldSelector")
                    params["fieldSelector"] = f"metadata.name={name}" + (f",{selector}" if selector else "")
                table = views.wants_table(accept)
                return await self._watch(raw, rt, namespace, params, table=table)
            if name is None:
                listed = cluster.list_objects(rt, namespace, params)
                if views.wants_table(accept):
                    return _response(
                        views.table(
                            rt, listed["items"], params.get("includeObject", "Metadata"), listed["metadata"]
                        )
                    )
                return _response(listed)
            obj = cluster.get(rt, namespace or "", name)
            if views.wants_table(accept):
                meta = {"resourceVersion": obj["metadata"]["resourceVersion"]}
                return _response(views.table(rt, [obj], params.get("includeObject", "Metadata"), meta))
            return _response(obj)

        body = await raw.read()
        self.writes += 1
        if method == "POST" and rt.storage == ("authorization.k8s.io", "selfsubjectaccessreviews"):
            review = self._json(body) or {}
            review["status"] = {"allowed": True, "reason": "the stand-in authorizes everything"}
            return _response(review, 201)
        if method == "POST" and name is None:
            obj = await cluster.create(rt, namespace, self._json(body), req)
            return _response(obj, 201, warnings=req.warnings)
        if method == "PUT" and name is not None:
            obj = await cluster.update(
                rt, namespace, name, self._json(body), subresource=subresource, req=req
            )
            return _response(obj, 200, warnings=req.warnings)
        if method == "PATCH" and name is not None:
            content_type = raw.headers.get("Content-Type", "").split(";")[0].strip()
            status, obj = await cluster.patch(
                rt, namespace, name, body, content_type, subresource=subresource, req=req
            )
            return _response(obj, status, warnings=req.warnings)
        if method == "DELETE":
            options = self._json(body) if body.strip() else None
            if name is None:
                return _response(await cluster.delete_collection(rt, namespace, req))
            return _response(await cluster.delete(rt, namespace, name, options, req=req))
        raise ApiError(
            405,
            "MethodNotAllowed",
            f"the server does not allow this method on the requested resource ({method})",
        )

    @staticmethod
    def _json(body: bytes) -> Any:
        if body.startswith(b"k8s\x00"):
            raise ApiError(
                415,
                "UnsupportedMediaType",
                "the stand-in serves JSON only: send application/json (protobuf bodies are not supported)",
            )
        try:
            return json.loads(body) if body else None
        except ValueError as e:
            raise ApiError.bad_request(f"the body of the request is not valid JSON: {e}") from None

    def _discovery(self, parts: list[str], accept: str) -> web.Response:
        cluster = self.cluster
        if parts in (["api"], ["apis"]):
            aggregated = views.wants_aggregated(accept)
            if aggregated:
                body = views.aggregated(cluster, core=parts == ["api"], version=aggregated)
                return _response(body, content_type=views.AGGREGATED.format(v=aggregated))
            return _response(views.api_versions() if parts == ["api"] else views.api_group_list(cluster))
        if parts[0] == "apis" and len(parts) == 2:
            group_doc = views.api_group(cluster, parts[1])
            if group_doc is None:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            return _response(group_doc)
        group, version = ("", parts[1]) if parts[0] == "api" else (parts[1], parts[2])
        resource_list = views.api_resource_list(cluster, group, version)
        if resource_list is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return _response(resource_list)

    def _openapi(self, parts: list[str]) -> web.Response:
        if parts == ["v3"]:
            return _response(views.openapi_index(self.cluster))
        if len(parts) >= 3 and parts[0] == "v3":
            if parts[1] == "api" and len(parts) == 3:
                doc = views.openapi_group_version(self.cluster, "", parts[2])
            elif parts[1] == "apis" and len(parts) == 4:
                doc = views.openapi_group_version(self.cluster, parts[2], parts[3])
            else:
                doc = None
            if doc is not None:
                return _response(doc)
        raise ApiError(404, "NotFound", "the server could not find the requested resource")

    # -- watches -----------------------------------------------------------------------------
    async def _watch(
        self,
        raw: web.BaseRequest,
        rt: ResourceType,
        namespace: str | None,
        params: dict[str, str],
        *,
        table: bool = False,
    ) -> web.StreamResponse:
        cluster = self.cluster
        store = cluster.store(rt)
        labels = LabelSelector.parse(params.get("labelSelector"))
        fields = FieldSelector.parse(params.get("fieldSelector"))
        since = params.get("resourceVersion", "")
        initial = params.get("sendInitialEvents") == "true"
        bookmarks = params.get("allowWatchBookmarks") == "true"
        timeout = float(params.get("timeoutSeconds") or DEFAULT_WATCH_SECONDS)
        deadline = time.monotonic() + timeout
        watcher = Watcher(namespace if rt.namespaced else None, labels, fields)

        backlog: list[Event] = []
        gone = False
        if since in ("", "0") or initial:
            for obj in store.select(watcher.namespace, labels, fields):
                backlog.append(Event("ADDED", obj, int(obj["metadata"]["resourceVersion"])))
        else:
            try:
                since_rv = int(since)
            except ValueError:
                raise ApiError.bad_request(f"invalid resource version: {since!r}") from None
            events = store.since(since_rv)
            if events is None:
                gone = True
            else:
                backlog = [e for e in events if watcher.wants(e.obj)]
        store.subscribe(watcher)  # no await since the snapshot: nothing is missed or doubled
        self._streams[watcher] = raw
        initial_end_rv = cluster.rv
        include = params.get("includeObject", "Metadata")
        first_table = [True]

        def line(event: Event) -> bytes:
            if not table:
                return self._line(rt, event)
            obj = self.cluster._as_version(rt, event.obj)
            doc = views.table(rt, [obj], include, {"resourceVersion": obj["metadata"]["resourceVersion"]})
            if not first_table[0]:
                doc["columnDefinitions"] = []
            first_table[0] = False
            return _dumps({"type": event.type, "object": doc}) + b"\n"

        try:
            response = web.StreamResponse(status=200, headers={"Content-Type": JSON})
            response.enable_chunked_encoding()
            await response.prepare(raw)
            if gone:
                await response.write(self._gone_line(since))
                return response
            if backlog:
                await response.write(b"".join(line(e) for e in backlog))
            if initial and bookmarks:
                await response.write(self._bookmark(rt, initial_end_rv, initial_end=True))
            await response.write(b"")
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                wait = min(left, self.bookmark_seconds) if bookmarks else left
                try:
                    item = await asyncio.wait_for(watcher.queue.get(), wait)
                except TimeoutError:
                    if bookmarks and deadline - time.monotonic() > 0:
                        await response.write(self._bookmark(rt, cluster.rv))
                    continue
                if isinstance(item, str):
                    if item == "gone":
                        await response.write(self._gone_line(str(cluster.rv)))
                    elif item == "drop" and raw.transport is not None:
                        raw.transport.close()
                        return response
                    break
                chunk = [line(item)]
                while not watcher.queue.empty() and len(chunk) < 1000:
                    more = watcher.queue.get_nowait()
                    if isinstance(more, str):
                        watcher.queue.put_nowait(more)  # handled on the next round
                        break
                    chunk.append(line(more))
                await response.write(b"".join(chunk))
            await response.write_eof()
            return response
        except (ConnectionResetError, ConnectionError):
            return web.Response(status=200)
        finally:
            store.unsubscribe(watcher)
            self._streams.pop(watcher, None)

    @staticmethod
    def _line(rt: ResourceType, event: Event) -> bytes:
        if event.obj.get("apiVersion") == rt.api_version:
            return event.line()
        converted = {**event.obj, "apiVersion": rt.api_version}
        return _dumps({"type": event.type, "object": converted}) + b"\n"

    @staticmethod
    def _bookmark(rt: ResourceType, rv: int, *, initial_end: bool = False) -> bytes:
        metadata: dict[str, Any] = {"resourceVersion": str(rv)}
        if initial_end:
            metadata["annotations"] = {"k8s.io/initial-events-end": "true"}
        obj = {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": metadata}
        return _dumps({"type": "BOOKMARK", "object": obj}) + b"\n"

    @staticmethod
    def _gone_line(since: str) -> bytes:
        status = ApiError.gone(f"too old resource version: {since}").status()
        return _dumps({"type": "ERROR", "object": status}) + b"\n"

    # -- test controls -----------------------------------------------------------------------
    async def _control(self, raw: web.BaseRequest, parts: list[str]) -> web.Response:
        body = await raw.read()
        data: dict[str, Any] = json.loads(body) if body else {}
        action = "/".join(parts)
        cluster = self.cluster
        assert self.admission is not None
        if action == "stats":
            return _response(
                {
                    **cluster.stats(),
                    "served": self.served,
                    "writes": self.writes,
                    "admissionCalls": self.admission.calls,
                    "faultsLeft": sum(max(f.count, 0) for f in self.faults),
                }
            )
        if action == "faults":
            self.faults.append(
                Fault(
                    pattern=re.compile(data.get("path", "")),
                    status=int(data.get("status", 500)),
                    count=int(data.get("count", 1)),
                    method=data.get("method"),
                    delay=float(data.get("delay", 0.0)),
                    retry_after=int(data.get("retryAfter", 1)),
                )
            )
            return _response({"faults": len(self.faults)})
        if action == "faults/clear":
            self.faults.clear()
            return _response({"faults": 0})
        if action == "watches/drop":
            signal = "drop" if data.get("abrupt") else "close"
            return _response({"dropped": self._signal_watchers(signal, data.get("resource"))})
        if action == "watches/gone":
            cluster.compact()
            return _response({"expired": self._signal_watchers("gone", data.get("resource"))})
        if action == "compact":
            cluster.compact()
            return _response({"resourceVersion": cluster.rv})
        if action == "services":
            self.admission.service_endpoints[(data["namespace"], data["name"])] = (
                data["host"],
                int(data["port"]),
            )
            return _response({"services": len(self.admission.service_endpoints)})
        if action == "resolve":
            return _response(self._resolve(data.get("resource", "")))
        raise ApiError(404, "NotFound", f"unknown stand-in control: {action}")

    def _signal_watchers(self, signal: str, resource: str | None) -> int:
        count = 0
        for watcher in list(self._streams):
            if resource:
                rt = self._resolve_type(resource)
                if watcher not in self.cluster.store(rt).all_watchers():
                    continue
            watcher.queue.put_nowait(signal)
            count += 1
        return count

    def _resolve_type(self, spec: str) -> ResourceType:
        """`pods`, `po`, `Pod`, `damp`, `damprofiles.dam.mlsys.dev`, `dam.mlsys.dev/v1alpha1/damprofiles`."""
        spec = spec.strip()
        group: str | None = None
        version: str | None = None
        name = spec
        if "/" in spec:
            pieces = spec.split("/")
            if len(pieces) == 2:  # v1/pods
                group, version, name = "", pieces[0], pieces[1]
            else:
                group, version, name = "/".join(pieces[:-2]), pieces[-2], pieces[-1]
        elif "." in spec:
            name, group = spec.split(".", 1)
        candidates = []
        for rt in self.cluster.types.values():
            if group is not None and rt.group != group:
                continue
            if version is not None and rt.version != version:
                continue
            if (
                name in (rt.plural, rt.singular, rt.kind)
                or name in rt.short_names
                or name.lower() == rt.kind.lower()
            ):
                candidates.append(rt)
        if not candidates:
            raise ApiError(404, "NotFound", f'the server doesn\'t have a resource type "{spec}"')
        # Prefer core, then the preferred (highest) version.
        candidates.sort(key=lambda t: (t.group != "", views._version_priority(t.version)))
        return candidates[0]

    def _resolve(self, spec: str) -> dict[str, Any]:
        rt = self._resolve_type(spec)
        return {
            "group": rt.group,
            "version": rt.version,
            "plural": rt.plural,
            "kind": rt.kind,
            "namespaced": rt.namespaced,
        }


async def start(
    host: str = "127.0.0.1", port: int = 0, *, history_size: int = 20000, bookmark_seconds: float = 30.0
) -> tuple[web.ServerRunner, ApiHandler, str]:
    """Start serving; return the runner (for `stop`), the handler and the base URL."""
    handler = ApiHandler(cluster=Cluster(history_size=history_size), bookmark_seconds=bookmark_seconds)
    await handler.__aenter__()
    server = web.Server(handler, handler_cancellation=True, access_log=None)
    runner = web.ServerRunner(server, handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1]
    return runner, handler, f"http://{host}:{bound}"


async def stop(runner: web.ServerRunner, handler: ApiHandler) -> None:
    for watcher in list(handler._streams):
        watcher.queue.put_nowait("close")
    await asyncio.sleep(0)
    await runner.cleanup()
    if handler.admission is not None:
        await handler.admission.close()
    await handler.__aexit__(None, None, None)
