"""Which Prometheus a profile may send the operator to is the cluster admin's choice, closed by
default (dam_operator.cluster.steps.urlpolicy): with nothing set, every profile-chosen URL is
refused naming the chart values; otherwise only what the admin named, allowed as named; a named
DNS name is refused, when the operator connects, where it resolves to a sensitive address
(loopback, link-local, cloud metadata, the API server's endpoints, the operator's own Pod and
Services), unless the admin lists the network. A refused URL is never asked."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from aiohttp.abc import AbstractResolver, ResolveResult
from pydantic import ValidationError

from dam_operator.cluster.adapters import sources as src
from dam_operator.cluster.adapters.clusteraddrs import service_ips, slice_endpoints
from dam_operator.cluster.adapters.sources import (
    AddressRefusedError,
    PodTarget,
    PolicyResolver,
    PrometheusSource,
    RefusedSource,
    SourceError,
    SourceFactory,
)
from dam_operator.cluster.runtime.main import url_policy
from dam_operator.cluster.settings import OperatorSettings
from dam_operator.cluster.steps.spec import SpecError, parse_spec
from dam_operator.cluster.steps.urlpolicy import ClusterAddresses, UrlPolicy, ip_of
from tests.support.procs import Listener

FIELD = "spec.source.prometheus.url"
DEFAULTS = url_policy(OperatorSettings())  # the chart's defaults: nothing named
NAMED = "http://prometheus.monitoring.svc:9090/"


def _policy(**settings: Any) -> UrlPolicy:
    return url_policy(OperatorSettings(**settings))


ELSEWHERE = _policy(prometheus_allowed_url_prefixes=NAMED)  # an admin who named one Prometheus


@pytest.mark.parametrize(
    "url",
    [
        "http://prometheus-operated.monitoring.svc:9090",
        "https://prometheus.example.com/prom",
        "http://10.0.12.34:9090",
        "http://8.8.8.8:9090",
        "http://[2001:db8::1]:9090",
    ],
)
def test_with_the_charts_defaults_every_profile_chosen_prometheus_is_refused_naming_the_chart_values(
    url: str,
) -> None:
    problem = DEFAULTS.check_url(url)
    assert problem is not None and problem.startswith(FIELD), url
    assert "operator.prometheus.url" in problem and "operator.prometheus.allowedUrlPrefixes" in problem
    assert "DAM_PROMETHEUS_URL" in problem and "DAM_PROMETHEUS_ALLOWED_URL_PREFIXES" in problem


@pytest.mark.parametrize(
    ("url", "rule"),
    [
        ("http://169.254.169.254/latest/meta-data", "metadata"),
        ("http://169.254.1.1/", "link-local"),
        ("http://[fe80::1]:9090", "link-local"),
        ("http://[::ffff:169.254.169.254]/", "metadata"),  # IPv4-mapped
        ("http://[::169.254.169.254]/", "metadata"),  # deprecated IPv4-compatible ::a.b.c.d
        ("http://[::127.0.0.1]:9090/", "loopback"),
        ("http://[64:ff9b::a9fe:a9fe]/", "metadata"),  # NAT64 of 169.254.169.254
        ("http://[2002:a9fe:a9fe::1]/", "metadata"),  # 6to4 of 169.254.169.254
        ("http://[fd00:ec2::254]/latest/meta-data", "metadata"),  # AWS IPv6
        ("http://[fd20:ce::254]/", "metadata"),  # GCP IPv6
        ("http://168.63.129.16/", "metadata"),  # Azure WireServer
        ("http://100.100.100.200/", "metadata"),  # Alibaba
        ("http://192.0.0.192/", "metadata"),  # Oracle (older)
        ("http://metadata.google.internal/", "metadata"),
        ("http://10.1.2.3:9090", "private"),
        ("http://172.20.0.5:9090", "private"),
        ("http://192.168.1.1:9090", "private"),
        ("http://100.64.0.9:9090", "private"),  # CGNAT
        ("http://[fd12::34]:9090", "private"),  # ULA
        ("http://127.0.0.1:9090", "loopback"),
        ("http://[::1]:9090", "loopback"),
        ("http://0.0.0.0:9090", "loopback"),
        ("http://localhost:9090", "loopback"),
        ("http://LOCALHOST.:9090", "loopback"),
        ("http://prometheus.localhost:9090", "loopback"),
        ("https://kubernetes.default.svc", "Kubernetes API server"),
    ],
)
def test_internal_addresses_are_refused_naming_the_field_the_rule_and_the_setting(
    url: str, rule: str
) -> None:
    for policy in (DEFAULTS, ELSEWHERE):
        problem = policy.check_url(url)
        assert problem is not None, url
        assert problem.startswith(FIELD) and rule in problem, problem
        assert "operator.prometheus.allowedUrlPrefixes" in problem, problem


@pytest.mark.parametrize(
    ("text", "v4"),
    [
        ("::169.254.169.254", "169.254.169.254"),
        ("::ffff:10.0.0.1", "10.0.0.1"),
        ("64:ff9b::7f00:1", "127.0.0.1"),
        ("2002:a9fe:a9fe::", "169.254.169.254"),
        ("[::a9fe:a9fe]", "169.254.169.254"),
    ],
)
def test_ipv4_embedded_in_ipv6_is_checked_as_the_ipv4_address(text: str, v4: str) -> None:
    assert str(ip_of(text)) == v4
    assert str(ip_of("::1")) == "::1" and str(ip_of("::")) == "::"  # IPv6's own, not 0.0.0.1


@pytest.mark.parametrize("host", ["2130706433", "127.1", "0x7f.0.0.1", "017700000001"])
def test_numeric_hosts_in_legacy_forms_are_refused(host: str) -> None:
    problem = ELSEWHERE.check_url(f"http://{host}:9090/")
    assert problem is not None and "legacy form" in problem, problem


def test_the_api_server_is_named_as_such_in_the_refusal() -> None:
    policy = url_policy(
        OperatorSettings(kubernetes_service_host="10.96.0.1", prometheus_allowed_url_prefixes=NAMED),
        api_server=lambda: "https://127.0.0.1:6443",
    )
    for url in ("https://10.96.0.1/api/v1/namespaces", "https://127.0.0.1:6443/", "http://kubernetes:80"):
        problem = policy.check_url(url)
        assert problem is not None and "Kubernetes API server" in problem, (url, problem)


def test_the_kubernetes_service_host_is_read_from_the_pods_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.43.0.1")
    policy = url_policy(OperatorSettings(prometheus_allowed_url_prefixes="http://prom.example:9090/"))
    assert policy.check_address("prom.example", 9090, "10.43.0.1") is not None
    assert "Kubernetes API server" in str(policy.check_address("prom.example", 9090, "10.43.0.1"))


def test_with_prefixes_set_only_urls_under_them_are_allowed() -> None:
    policy = _policy(
        prometheus_allowed_url_prefixes="http://prometheus.monitoring.svc:9090/,https://thanos.example.com/tenant-a"
    )
    assert policy.check_url("http://prometheus.monitoring.svc:9090") is None
    assert policy.check_url("http://PROMETHEUS.monitoring.svc.:9090/") is None
    assert policy.check_url("https://thanos.example.com/tenant-a/") is None
    assert policy.check_url("https://thanos.example.com/tenant-a/sub") is None
    for refused in (
        "http://prometheus.monitoring.svc.evil.example:9090",  # a string prefix would match this
        "http://prometheus.monitoring.svc:9091",
        "https://prometheus.monitoring.svc:9090",
        "https://thanos.example.com/tenant-ab",
        "https://thanos.example.com/tenant-b",
        "http://prometheus-operated.monitoring.svc:9090",
    ):
        problem = policy.check_url(refused)
        assert problem is not None and "DAM_PROMETHEUS_ALLOWED_URL_PREFIXES" in problem, refused


def test_the_configured_prometheus_is_the_only_one_and_is_allowed_as_named() -> None:
    policy = _policy(prometheus_url="http://127.0.0.1:9090")  # the admin's: a loopback is their choice
    assert policy.check_url("http://127.0.0.1:9090") is None
    assert policy.check_url("http://127.0.0.1:9090/") is None
    assert policy.check_address("127.0.0.1", 9090, "127.0.0.1") is None  # a literal is allowed as written
    problem = policy.check_url("http://prometheus.monitoring.svc:9090")
    assert problem is not None and "http://127.0.0.1:9090" in problem


def test_a_named_dns_name_may_resolve_to_a_private_address_but_not_to_a_sensitive_one() -> None:
    """Allowed as named: an in-cluster Service's ClusterIP is private; the name may not be
    re-pointed at metadata, loopback or link-local (DNS rebinding, an ExternalName Service)."""
    host, port = "prometheus.monitoring.svc", 9090
    assert ELSEWHERE.check_address(host, port, "10.96.12.34") is None
    assert ELSEWHERE.check_address(host, port, "fd12::34") is None
    for address, rule in [
        ("169.254.169.254", "metadata"),
        ("::ffff:169.254.169.254", "metadata"),
        ("::169.254.169.254", "metadata"),
        ("168.63.129.16", "metadata"),
        ("fd00:ec2::254", "metadata"),
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("169.254.7.7", "link-local"),
    ]:
        problem = ELSEWHERE.check_address(host, port, address)
        assert problem is not None and rule in problem, (address, problem)
        assert f"{host} resolves to" in problem and "operator.prometheus.allowedNetworks" in problem
    assert ELSEWHERE.check_address("other.example", 80, "10.1.2.3") is not None  # not named: refused


def test_an_allowed_network_lifts_the_sensitive_rule_for_its_addresses_only() -> None:
    policy = _policy(
        prometheus_allowed_url_prefixes="http://prom.local:9090/", prometheus_allowed_networks="127.0.0.1/32"
    )
    assert policy.check_address("prom.local", 9090, "127.0.0.1") is None
    assert policy.check_address("prom.local", 9090, "127.0.0.2") is not None
    assert policy.check_address("prom.local", 9090, "169.254.169.254") is not None


def test_the_api_servers_endpoints_and_the_operators_own_addresses_are_refused_for_a_named_name() -> None:
    cluster = ClusterAddresses(
        api_server=frozenset({("10.96.0.1", None), ("192.168.10.4", 6443)}),
        operator=frozenset({("10.96.44.5", None)}),
    )
    policy = url_policy(
        OperatorSettings(
            prometheus_allowed_url_prefixes="http://prom.example:6443/,http://prom.example:9090/",
            prometheus_allowed_networks="10.0.0.0/8,192.168.0.0/16",
            pod_ips="10.244.0.7",
        ),
        cluster=lambda: cluster,
    )
    for address, port, rule in [
        ("10.96.0.1", 9090, "Kubernetes API server"),  # the Service's ClusterIP: any port
        ("192.168.10.4", 6443, "Kubernetes API server"),  # an endpoint, on its port
        ("10.96.44.5", 9090, "operator's own"),
        ("10.244.0.7", 9090, "operator's own"),
    ]:
        problem = policy.check_address("prom.example", port, address)
        if rule == "operator's own":  # the admin listed its network: lifted
            assert problem is None, (address, problem)
            continue
        assert problem is not None and rule in problem, (address, problem)  # a network never lifts it
    assert policy.check_address("prom.example", 9090, "192.168.10.4") is None  # another port of that node
    strict = url_policy(
        OperatorSettings(prometheus_allowed_url_prefixes="http://prom.example:9090/", pod_ips="10.244.0.7"),
        cluster=lambda: cluster,
    )
    for address in ("10.96.44.5", "10.244.0.7"):
        problem = strict.check_address("prom.example", 9090, address)
        assert problem is not None and "operator's own" in problem, (address, problem)


def test_the_addresses_of_the_api_server_are_read_from_its_service_and_endpoint_slices() -> None:
    service = {"spec": {"clusterIP": "10.96.0.1", "clusterIPs": ["10.96.0.1", "fd00:10:96::1"]}}
    assert service_ips(service) == ["10.96.0.1", "fd00:10:96::1"]
    assert service_ips({"spec": {"clusterIP": "None"}}) == []
    slices = [
        {
            "endpoints": [{"addresses": ["192.168.10.4"]}, {"addresses": ["192.168.10.5"]}],
            "ports": [{"port": 6443}],
        }
    ]
    assert slice_endpoints(slices) == {("192.168.10.4", 6443), ("192.168.10.5", 6443)}


def test_bad_settings_name_the_entry() -> None:
    with pytest.raises(ValidationError, match="'nope' is not an IP network"):
        OperatorSettings(prometheus_allowed_networks="127.0.0.0/8,nope")
    with pytest.raises(ValidationError, match="is not an http"):
        OperatorSettings(prometheus_allowed_url_prefixes="prometheus:9090")
    with pytest.raises(ValidationError, match="is not an IP address"):
        OperatorSettings(pod_ips="10.0.0.0/8")
    assert OperatorSettings(prometheus_allowed_networks="127.0.0.1").prometheus_allowed_networks == [
        "127.0.0.1/32"
    ]


def test_a_refused_url_makes_the_spec_invalid_at_the_field() -> None:
    raw = {
        "selector": {"matchLabels": {"app": "t"}},
        "source": {"prometheus": {"url": "http://169.254.169.254/"}},
    }
    with pytest.raises(SpecError) as info:
        parse_spec(raw, DEFAULTS)
    assert info.value.paths == [FIELD]
    assert "metadata" in str(info.value) and "operator.prometheus.url" in str(info.value)
    assert parse_spec(raw).prometheus_url() == "http://169.254.169.254/"  # no policy given: syntax only


# ---------------------------------------------------------------- no request is sent


@pytest.fixture
def listener() -> Iterator[Listener]:
    lst = Listener()
    try:
        yield lst
    finally:
        lst.close()


def _target() -> PodTarget:
    return PodTarget("ns", "pod-a", "10.0.0.1", 9450)


class RebindingDns(AbstractResolver):
    """The attacker's DNS: answers ``name`` with ``address`` (what a rebinding name does at connect time)."""

    def __init__(self, name: str, address: str) -> None:
        self.name, self.address = name, address

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        assert host == self.name
        return [
            ResolveResult(
                hostname=host, host=self.address, port=port, family=socket.AF_INET, proto=0, flags=0
            )
        ]

    async def close(self) -> None:
        pass


def test_a_named_name_that_rebinds_to_loopback_is_refused_when_connecting(listener: Listener) -> None:
    """The admin named ``prom.example``; at connect time it answers 127.0.0.1 (where the listener
    is): the resolver refuses before any connection."""
    policy = _policy(prometheus_allowed_url_prefixes=f"http://prom.example:{listener.port}/")

    async def scenario() -> SourceError:
        resolver = PolicyResolver(policy, inner=RebindingDns("prom.example", "127.0.0.1"))
        connector = aiohttp.TCPConnector(resolver=resolver)
        async with aiohttp.ClientSession(connector=connector) as session:
            source = PrometheusSource(session, f"http://prom.example:{listener.port}")
            try:
                await source.fetch(_target())
            except SourceError as exc:
                return exc
        raise AssertionError("expected a SourceError")

    err = asyncio.run(scenario())
    assert err.reason == src.REASON_REFUSED, err.message
    assert "prom.example resolves to 127.0.0.1" in err.message and "loopback" in err.message
    assert listener.connections == 0


def test_the_resolver_refuses_a_name_the_admin_did_not_name() -> None:
    async def scenario() -> None:
        resolver = PolicyResolver(ELSEWHERE)
        try:
            with pytest.raises(AddressRefusedError):
                await resolver.resolve("localhost", 80)
        finally:
            await resolver.close()

    asyncio.run(scenario())


def test_the_factory_gives_a_refused_url_a_source_that_asks_nothing(listener: Listener) -> None:
    url = f"http://127.0.0.1:{listener.port}"
    raw = {"selector": {"matchLabels": {"app": "t"}}, "source": {"prometheus": {"url": url}}}

    async def scenario() -> dict[str, Any]:
        async with aiohttp.ClientSession() as session:
            factory = SourceFactory(session, OperatorSettings(), policy=DEFAULTS)
            source = factory(parse_spec(raw))  # parsed without the policy: the factory still refuses
            assert isinstance(source, RefusedSource)
            return await source.fetch_all([_target()], asyncio.Semaphore(1))

    results = asyncio.run(scenario())
    err = results["pod-a"]
    assert isinstance(err, SourceError) and err.reason == src.REASON_REFUSED and "loopback" in err.message
    assert listener.connections == 0


def test_profiles_without_a_source_read_the_configured_prometheus() -> None:
    async def scenario() -> Any:
        async with aiohttp.ClientSession() as session:
            settings = OperatorSettings(prometheus_url="http://prometheus.monitoring.svc:9090")
            return SourceFactory(session, settings)(parse_spec({"selector": {"matchLabels": {"app": "t"}}}))

    assert isinstance(asyncio.run(scenario()), PrometheusSource)
