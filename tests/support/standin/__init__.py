"""A Kubernetes API stand-in for tests, built on kmock, faithful enough for kubectl v1.32 and kopf.

    with StandIn.running() as api:           # or StandIn.running(subprocess=True)
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        api.kubectl("apply", "-f", "crds/damprofile.yaml", check=True)
        api.create("pods", {"metadata": {"name": "p", "labels": {"app": "x"}}, "spec": {...}})
        api.patch("damp", "default", "p", {"status": {...}}, subresource="status")
        api.inject_fault(r"/damprofiles", status=503, count=2)

See docs/testing.md for what it emulates and what it does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess as _subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from .errors import ApiError
from .server import ApiHandler, start, stop

__all__ = ["ApiError", "ApiHandler", "StandIn", "StandInError"]

REPO_ROOT = Path(__file__).resolve().parents[3]
PATCH_TYPES = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "apply": "application/apply-patch+yaml",
}


class StandInError(Exception):
    """An API error answered by the stand-in, with its Status body."""

    def __init__(self, code: int, status: dict[str, Any]) -> None:
        super().__init__(f"{code} {status.get('reason')}: {status.get('message')}")
        self.code = code
        self.status = status
        self.reason: str = status.get("reason", "")


class _Thread:
    """Runs the server on its own event loop in a daemon thread."""

    def __init__(self, host: str, port: int, options: dict[str, Any]) -> None:
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self.url = ""
        self.handler: ApiHandler | None = None
        self._thread = threading.Thread(
            target=self._run, args=(host, port, options), name="standin", daemon=True
        )
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise RuntimeError("the stand-in failed to start") from self._error
        if not self.url:
            raise RuntimeError("the stand-in did not start within 30 s")

    def _run(self, host: str, port: int, options: dict[str, Any]) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            try:
                runner, handler, url = await start(host, port, **options)
            except BaseException as e:
                self._error = e
                self._ready.set()
                return
            self.handler, self.url = handler, url
            self._ready.set()
            try:
                await self._stop.wait()
            finally:
                await stop(runner, handler)

        asyncio.run(main())

    def close(self) -> None:
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)


class StandIn:
    """A client of a running stand-in: kubeconfig, real kubectl, direct accessors, fault controls."""

    def __init__(self, url: str, workdir: Path) -> None:
        self.url = url
        self.workdir = workdir
        self.kubeconfig = self.write_kubeconfig(workdir / "kubeconfig")
        self.handler: ApiHandler | None = None  # set in thread mode: the in-process kmock handler
        self._http = httpx.Client(base_url=url, timeout=30.0)
        self._types: dict[str, dict[str, Any]] = {}

    @classmethod
    @contextlib.contextmanager
    def running(
        cls,
        *,
        subprocess: bool = False,
        host: str = "127.0.0.1",
        port: int = 0,
        history_size: int = 20000,
        bookmark_seconds: float = 30.0,
    ) -> Iterator[StandIn]:
        """Serve on `host:port` (0: a free port) in a thread, or in a child process."""
        options = {"history_size": history_size, "bookmark_seconds": bookmark_seconds}
        with tempfile.TemporaryDirectory(prefix="standin-") as tmp:
            if subprocess:
                command = [
                    sys.executable,
                    "-m",
                    "tests.support.standin",
                    "--host",
                    host,
                    "--port",
                    str(port),
                    "--history-size",
                    str(history_size),
                    "--bookmark-seconds",
                    str(bookmark_seconds),
                    "--print-url",
                ]
                proc = _subprocess.Popen(command, cwd=REPO_ROOT, stdout=_subprocess.PIPE, text=True)
                try:
                    assert proc.stdout is not None
                    url = proc.stdout.readline().strip()
                    if not url.startswith("http"):
                        raise RuntimeError(f"the stand-in process did not print its URL (got {url!r})")
                    api = cls(url, Path(tmp))
                    try:
                        yield api
                    finally:
                        api.close()
                finally:
                    proc.terminate()
                    try:
                        proc.wait(10)
                    except _subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
                    if proc.stdout is not None:
                        proc.stdout.close()
            else:
                thread = _Thread(host, port, options)
                try:
                    api = cls(thread.url, Path(tmp))
                    api.handler = thread.handler
                    try:
                        yield api
                    finally:
                        api.close()
                finally:
                    thread.close()

    def close(self) -> None:
        self._http.close()

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    # -- kubectl -----------------------------------------------------------------------------
    def write_kubeconfig(self, path: str | os.PathLike[str], namespace: str = "default") -> Path:
        """A kubeconfig for kubectl, kopf and the operator: one cluster, one context, `namespace`."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "standin", "cluster": {"server": self.url}}],
            "users": [{"name": "standin", "user": {"token": "standin"}}],
            "contexts": [
                {
                    "name": "standin",
                    "context": {"cluster": "standin", "user": "standin", "namespace": namespace},
                }
            ],
            "current-context": "standin",
            "preferences": {},
        }
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(config, indent=2))
        return target

    def env(self) -> dict[str, str]:
        """Environment for a child process (kubectl, kopf) that talks to this stand-in."""
        return {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "KUBECACHEDIR": str(self.workdir / "kube-cache"),
        }

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = False, timeout: float = 60.0
    ) -> _subprocess.CompletedProcess[str]:
        """Run the real kubectl against this stand-in."""
        return _subprocess.run(
            ["kubectl", *args],
            input=input,
            capture_output=True,
            text=True,
            env=self.env(),
            timeout=timeout,
            check=check,
        )

    # -- direct accessors --------------------------------------------------------------------
    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return self._http.request(method, path, **kwargs)

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._http.request(method, path, **kwargs)
        body = response.json() if response.content else {}
        if response.status_code >= 400:
            raise StandInError(response.status_code, body if isinstance(body, dict) else {})
        return body

    def resource(self, spec: str) -> dict[str, Any]:
        """Resolve `pods`, `po`, `damp`, `damprofiles.dam.mlsys.dev`, `v1/pods`, `g/v/plural`."""
        if spec not in self._types:
            self._types[spec] = self._call("POST", "/_standin/resolve", json={"resource": spec})
        return self._types[spec]

    def path(
        self, spec: str, namespace: str | None = None, name: str | None = None, subresource: str | None = None
    ) -> str:
        rt = self.resource(spec)
        base = f"/apis/{rt['group']}/{rt['version']}" if rt["group"] else f"/api/{rt['version']}"
        if rt["namespaced"] and namespace is not None:
            base += f"/namespaces/{namespace}"
        base += f"/{rt['plural']}"
        if name is not None:
            base += f"/{name}"
        if subresource is not None:
            base += f"/{subresource}"
        return base

    def get(self, resource: str, namespace: str | None, name: str) -> dict[str, Any]:
        return dict(self._call("GET", self.path(resource, namespace, name)))

    def list(
        self,
        resource: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        params = {
            k: v for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector)) if v
        }
        return list(self._call("GET", self.path(resource, namespace), params=params)["items"])

    def create(self, resource: str, body: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
        rt = self.resource(resource)
        if rt["namespaced"]:
            namespace = namespace or (body.get("metadata") or {}).get("namespace") or "default"
        body = {
            "apiVersion": f"{rt['group']}/{rt['version']}" if rt["group"] else rt["version"],
            "kind": rt["kind"],
            **body,
        }
        return dict(self._call("POST", self.path(resource, namespace), json=body))

    def replace(
        self,
        resource: str,
        namespace: str | None,
        name: str,
        body: dict[str, Any],
        *,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        return dict(self._call("PUT", self.path(resource, namespace, name, subresource), json=body))

    def patch(
        self,
        resource: str,
        namespace: str | None,
        name: str,
        patch: Any,
        *,
        subresource: str | None = None,
        patch_type: str = "merge",
        field_manager: str | None = None,
    ) -> dict[str, Any]:
        params = {"fieldManager": field_manager} if field_manager else {}
        return dict(
            self._call(
                "PATCH",
                self.path(resource, namespace, name, subresource),
                content=json.dumps(patch),
                params=params,
                headers={"Content-Type": PATCH_TYPES[patch_type]},
            )
        )

    def delete(self, resource: str, namespace: str | None, name: str) -> dict[str, Any]:
        return dict(self._call("DELETE", self.path(resource, namespace, name)))

    # -- faults and controls -----------------------------------------------------------------
    def inject_fault(
        self,
        path_pattern: str,
        *,
        status: int = 500,
        count: int = 1,
        method: str | None = None,
        delay: float = 0.0,
        retry_after: int = 1,
    ) -> None:
        """Answer the next `count` requests whose path+query matches the regex `path_pattern` with
        `status` (429 gets `Retry-After`; 0 drops the connection without an answer; count=-1: until
        `clear_faults`). `delay` seconds pass before answering."""
        self._call(
            "POST",
            "/_standin/faults",
            json={
                "path": path_pattern,
                "status": status,
                "count": count,
                "method": method,
                "delay": delay,
                "retryAfter": retry_after,
            },
        )

    def clear_faults(self) -> None:
        self._call("POST", "/_standin/faults/clear")

    def drop_watches(self, resource: str | None = None, *, abrupt: bool = False) -> int:
        """End open watch streams (cleanly, like a server timeout, or abruptly by closing the socket)."""
        return int(
            self._call("POST", "/_standin/watches/drop", json={"abrupt": abrupt, "resource": resource})[
                "dropped"
            ]
        )

    def expire_watches(self, resource: str | None = None) -> int:
        """Forget the watch history and end open watches with `410 Gone`: clients must relist."""
        return int(self._call("POST", "/_standin/watches/gone", json={"resource": resource})["expired"])

    def compact(self) -> int:
        """Forget the watch history: resuming from any older resourceVersion gets 410 Gone."""
        return int(self._call("POST", "/_standin/compact")["resourceVersion"])

    def register_service(self, namespace: str, name: str, host: str, port: int) -> None:
        """Route webhook calls for `service: {namespace, name}` to host:port (TLS name stays name.ns.svc)."""
        self._call(
            "POST",
            "/_standin/services",
            json={"namespace": namespace, "name": name, "host": host, "port": port},
        )

    def stats(self) -> dict[str, Any]:
        return dict(self._call("GET", "/_standin/stats"))
