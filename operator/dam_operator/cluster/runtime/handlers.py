"""kopf handlers: thin. Parse, hand over to the registry, return.

- DAMProfile events (one ``on.event`` handler: the start-up listing, ADDED, MODIFIED):
  a profile the registry does not know at this uid and ``metadata.generation`` is parsed
  and registered (an invalid spec is registered with its error; the scheduler writes the
  ``SpecValid=False`` condition that names the field and the fix; nothing is raised, so
  kopf never retries a bad spec). Everything else is dropped unparsed: with the status
  subresource the API server bumps ``generation`` on every spec change and on nothing
  else, so the operator's own status writes and metadata edits, which come back as
  MODIFIED events, cost one comparison.
- DAMProfile gone (DELETED, or a ``deletionTimestamp`` while another finalizer holds it):
  unregister (the scheduler drops its state and metric series). No finalizer: the
  operator holds nothing that must be cleaned up before the object goes.
- Pods are not kopf's: ``podwatch.PodWatcher`` feeds the registry's compact pod index
  (kopf's per-object records cost more than the index itself at 10,000 pods).
- Login: the same credentials as the operator's own Kubernetes adapter.

Why not kopf's create/update/resume handlers: they keep their state in the object (an
annotation with the last handled spec, patched on every profile at start) and diff the
whole object on every event; at 5,000 profiles that was 5,000 metadata PATCHes at each
start, each coming back as one more event (docs/performance.md).

Handlers are ``async`` so that kopf runs them on the event loop (sync handlers run in a
thread pool, and the registry and scheduler are single-threaded by design).
No status is written here: the scheduler is the only writer of a profile's status,
so a handler and an evaluation can never race on the conditions list.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import kopf

from dam_operator.cluster.steps import status as st
from dam_operator.cluster.steps.registry import Registry
from dam_operator.cluster.steps.spec import SpecError, parse_spec
from dam_operator.cluster.steps.urlpolicy import UrlPolicy

PROFILE = (st.GROUP, st.VERSION, st.PLURAL)


def build_registry(
    registry: Registry,
    login: Callable[[], kopf.ConnectionInfo | None],
    url_policy: UrlPolicy | None = None,
) -> kopf.OperatorRegistry:
    """A kopf registry with the operator's handlers, bound to ``registry``; specs are parsed
    under ``url_policy`` (the admin's rules on ``spec.source.prometheus.url``)."""
    kopf_registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=kopf_registry, retries=3, id="login")
    def login_handler(**_: Any) -> kopf.ConnectionInfo | None:
        return login()

    @kopf.on.event(*PROFILE, registry=kopf_registry, id="profile")
    async def profile_event(type: str | None, body: kopf.Body, **_: Any) -> None:
        meta = body.get("metadata") or {}
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        if type == "DELETED" or meta.get("deletionTimestamp"):
            registry.remove_profile(namespace, name)
            return
        uid, generation = str(meta.get("uid") or ""), meta.get("generation")
        if registry.knows(namespace, name, uid=uid, generation=generation):
            return
        spec, error = None, None
        try:
            spec = parse_spec(body.get("spec"), url_policy)
        except SpecError as exc:
            error = str(exc)
        registry.upsert_profile(
            namespace,
            name,
            uid=uid,
            generation=generation,
            spec=spec,
            error=error,
            status=body.get("status"),
        )

    return kopf_registry
