"""kopf handlers: thin. Parse, hand over to the registry, return.

- DAMProfile create/update/resume: parse the spec (an invalid one is registered
  with its error; the scheduler writes the ``SpecValid=False`` condition that names
  the field and the fix; nothing is raised, so kopf never retries a bad spec).
- DAMProfile gone (the DELETED watch event, or a deletion kopf sees in progress):
  unregister (the scheduler drops its state and metric series). No finalizer: the
  operator holds nothing that must be cleaned up before the object goes.
- Pods are not kopf's: ``podwatch.PodWatcher`` feeds the registry's compact pod index
  (kopf's per-object records cost more than the index itself at 10,000 pods).
- Login: the same credentials as the operator's own Kubernetes adapter.

Handlers are ``async`` so that kopf runs them on the event loop (sync handlers run in a
thread pool, and the registry and scheduler are single-threaded by design).
No status is written here: the scheduler is the only writer of a profile's status,
so a handler and an evaluation can never race on the conditions list.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import kopf

from dam_operator.cluster import status as st
from dam_operator.cluster.registry import Registry
from dam_operator.cluster.spec import SpecError, parse_spec

PROFILE = (st.GROUP, st.VERSION, st.PLURAL)


def build_registry(
    registry: Registry, login: Callable[[], kopf.ConnectionInfo | None]
) -> kopf.OperatorRegistry:
    """A kopf registry with the operator's handlers, bound to ``registry``."""
    kopf_registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=kopf_registry, retries=3, id="login")
    def login_handler(**_: Any) -> kopf.ConnectionInfo | None:
        return login()

    @kopf.on.resume(*PROFILE, registry=kopf_registry, id="register")
    @kopf.on.create(*PROFILE, registry=kopf_registry, id="register")
    @kopf.on.update(*PROFILE, registry=kopf_registry, id="register")
    async def register_profile(body: kopf.Body, **_: Any) -> None:
        meta = body.get("metadata") or {}
        spec, error = None, None
        try:
            spec = parse_spec(body.get("spec"))
        except SpecError as exc:
            error = str(exc)
        registry.upsert_profile(
            meta.get("namespace", ""),
            meta.get("name", ""),
            uid=meta.get("uid", ""),
            generation=meta.get("generation"),
            spec=spec,
            error=error,
            status=body.get("status"),
        )

    @kopf.on.delete(*PROFILE, registry=kopf_registry, optional=True, id="unregister")
    async def deleting_profile(name: str, namespace: str | None, **_: Any) -> None:
        registry.remove_profile(namespace or "", name)

    @kopf.on.event(*PROFILE, registry=kopf_registry, id="profile-gone")
    async def profile_event(type: str, name: str, namespace: str | None, **_: Any) -> None:
        if type == "DELETED":
            registry.remove_profile(namespace or "", name)

    return kopf_registry
