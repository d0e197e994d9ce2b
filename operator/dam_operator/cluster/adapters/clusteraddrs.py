"""The addresses a profile's Prometheus must not resolve to that only the API server knows
(``urlpolicy.ClusterAddresses``): the API server's own (the ``default/kubernetes`` Service's
ClusterIP and every endpoint of its EndpointSlice, with their ports) and the operator's Services
(every ClusterIP in the operator's namespace). Read at start and every ``interval_seconds``;
the pure policy reads the latest through ``current``.

A read that fails (no RBAC, the API down) keeps what was read before and is logged; the other
rules (loopback, link-local, metadata, ``KUBERNETES_SERVICE_HOST``, the API server the operator
talks to) hold without it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote

from dam_operator.cluster.adapters.kube import ApiError, KubeClient
from dam_operator.cluster.steps.urlpolicy import NO_CLUSTER_ADDRESSES, ClusterAddresses, Endpoint

log = logging.getLogger(__name__)

API_SERVICE_NAMESPACE = "default"
API_SERVICE_NAME = "kubernetes"


def service_ips(service: Mapping[str, Any]) -> list[str]:
    """A Service's ClusterIPs (``None`` and headless left out)."""
    spec = service.get("spec") or {}
    ips = list(spec.get("clusterIPs") or []) or [spec.get("clusterIP")]
    return [str(ip) for ip in ips if ip and ip != "None"]


def slice_endpoints(slices: Iterable[Mapping[str, Any]]) -> set[Endpoint]:
    """Every (address, port) of EndpointSlices (a slice without ports: any port)."""
    out: set[Endpoint] = set()
    for item in slices:
        ports = [p.get("port") for p in item.get("ports") or [] if isinstance(p.get("port"), int)]
        for endpoint in item.get("endpoints") or []:
            for address in endpoint.get("addresses") or []:
                out.update((str(address), port) for port in (ports or [None]))
    return out


class ClusterAddressWatch:
    """The latest ``ClusterAddresses`` read from the API server."""

    def __init__(self, kube: KubeClient, operator_namespace: str) -> None:
        self._kube = kube
        self._operator_namespace = operator_namespace
        self._current = NO_CLUSTER_ADDRESSES

    def current(self) -> ClusterAddresses:
        return self._current

    async def refresh(self) -> ClusterAddresses:
        api: set[Endpoint] = set()
        operator: set[Endpoint] = set()
        ns = quote(API_SERVICE_NAMESPACE)
        try:
            service = await self._kube.request("GET", f"/api/v1/namespaces/{ns}/services/{API_SERVICE_NAME}")
            api.update((ip, None) for ip in service_ips(service or {}))
            slices = await self._kube.request(
                "GET",
                f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices",
                params={"labelSelector": f"kubernetes.io/service-name={API_SERVICE_NAME}"},
            )
            api.update(slice_endpoints((slices or {}).get("items") or []))
            services = await self._kube.request(
                "GET", f"/api/v1/namespaces/{quote(self._operator_namespace)}/services"
            )
            for item in (services or {}).get("items") or []:
                operator.update((ip, None) for ip in service_ips(item))
        except ApiError as exc:
            log.warning(
                "could not read the API server's endpoints or the operator's Services (%s); "
                "keeping the addresses read before",
                exc,
            )
            return self._current
        self._current = ClusterAddresses(api_server=frozenset(api), operator=frozenset(operator))
        return self._current

    async def run(self, interval_seconds: float) -> None:
        """Reads again every ``interval_seconds`` (the first read is the caller's ``refresh``)."""
        while True:
            await asyncio.sleep(interval_seconds)
            await self.refresh()
