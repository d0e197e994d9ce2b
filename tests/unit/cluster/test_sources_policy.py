"""Which Prometheus a profile may send the operator to is the cluster admin's choice
(dam_operator.cluster.steps.urlpolicy): internal addresses are refused with a message naming the field,
the rule and the setting that allows it, and a refused URL is never asked. Host names are checked
again at connect time, on the addresses they really resolve to (DNS rebinding)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from pydantic import ValidationError

from dam_operator.cluster.adapters import sources as src
from dam_operator.cluster.adapters.sources import (
    AddressRefusedError,
    PodTarget,
    PolicyResolver,
    PrometheusSource,
    RefusedSource,
    SourceError,
    SourceFactory,
)
from dam_operator.cluster.settings import OperatorSettings
from dam_operator.cluster.steps.spec import SpecError, parse_spec
from dam_operator.cluster.steps.urlpolicy import UrlPolicy
from tests.support.procs import Listener

FIELD = "spec.source.prometheus.url"
OPEN = UrlPolicy()  # no URL named by the admin: any Prometheus but the internal addresses


def _policy(**settings: Any) -> UrlPolicy:
    return UrlPolicy.from_settings(OperatorSettings(**settings))


@pytest.mark.parametrize(
    ("url", "rule"),
    [
        ("http://169.254.169.254/latest/meta-data", "link-local"),
        ("http://[fe80::1]:9090", "link-local"),
        ("http://[::ffff:169.254.169.254]/", "link-local"),  # IPv4-mapped
        ("http://[64:ff9b::a9fe:a9fe]/", "link-local"),  # NAT64 of 169.254.169.254
        ("http://[fd00:ec2::254]/latest/meta-data", "metadata"),
        ("http://127.0.0.1:9090", "loopback"),
        ("http://127.9.8.7:9090", "loopback"),
        ("http://[::1]:9090", "loopback"),
        ("http://0.0.0.0:9090", "loopback"),
        ("http://localhost:9090", "loopback"),
        ("http://LOCALHOST.:9090", "loopback"),
        ("http://prometheus.localhost:9090", "loopback"),
    ],
)
def test_internal_addresses_are_refused_naming_the_field_the_rule_and_the_setting(
    url: str, rule: str
) -> None:
    problem = OPEN.check_url(url)
    assert problem is not None, url
    assert problem.startswith(FIELD) and rule in problem, problem
    assert "DAM_PROMETHEUS_ALLOWED_NETWORKS" in problem and "operator.prometheus.allowedNetworks" in problem


@pytest.mark.parametrize("host", ["2130706433", "127.1", "0x7f.0.0.1", "017700000001"])
def test_numeric_hosts_in_legacy_forms_are_refused(host: str) -> None:
    problem = OPEN.check_url(f"http://{host}:9090/")
    assert problem is not None and "legacy form" in problem, problem


@pytest.mark.parametrize(
    "url",
    [
        "https://kubernetes.default.svc",
        "https://kubernetes.default.svc.cluster.local.:443/api",
        "http://kubernetes:80",
        "https://10.96.0.1/api/v1/namespaces",  # KUBERNETES_SERVICE_HOST, any port
        "http://10.96.0.1:9090",
        "https://127.0.0.1:6443/",  # the API server the operator uses (host and port)
    ],
)
def test_the_api_server_is_refused_even_where_its_network_is_allowed(url: str) -> None:
    policy = UrlPolicy.from_settings(
        OperatorSettings(
            kubernetes_service_host="10.96.0.1", prometheus_allowed_networks="127.0.0.0/8,10.0.0.0/8"
        ),
        api_server=lambda: "https://127.0.0.1:6443",
    )
    problem = policy.check_url(url)
    assert problem is not None and "Kubernetes API server" in problem, (url, problem)
    assert "DAM_PROMETHEUS_URL" in problem


def test_the_kubernetes_service_host_is_read_from_the_pods_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.43.0.1")
    problem = UrlPolicy.from_settings(OperatorSettings()).check_url("https://10.43.0.1:443")
    assert problem is not None and "Kubernetes API server" in problem


def test_an_allowed_network_lifts_the_loopback_rule_for_its_addresses_only() -> None:
    policy = _policy(prometheus_allowed_networks="127.0.0.1/32")
    assert policy.check_url("http://127.0.0.1:9090") is None
    assert policy.check_url("http://127.0.0.2:9090") is not None
    assert policy.check_url("http://169.254.169.254/") is not None


@pytest.mark.parametrize("url", ["http://localhost:9090", "http://prometheus.localhost:9090"])
def test_a_loopback_name_is_refused_naming_fixes_that_work(url: str) -> None:
    """The refusal's fixes work: the admin naming the URL lets it through; the network it gives as
    an example is a value the setting takes (not "localhost") and lets the address through; the
    name itself stays refused where its addresses are allowed."""
    problem = OPEN.check_url(url)
    assert problem is not None and "loopback" in problem
    assert "DAM_PROMETHEUS_URL" in problem and "DAM_PROMETHEUS_ALLOWED_URL_PREFIXES" in problem
    assert _policy(prometheus_url=url).check_url(url) is None
    example = problem.split("(e.g. ")[1].split(")")[0]
    allowing = _policy(prometheus_allowed_networks=example)  # a valid value
    assert allowing.check_url("http://127.0.0.1:9090") is None
    assert allowing.check_url(url) is not None


@pytest.mark.parametrize(
    "url",
    [
        "http://prometheus-operated.monitoring.svc:9090",
        "https://prometheus.example.com/prom",
        "http://10.0.12.34:9090",
        "http://[fd12::34]:9090",
    ],
)
def test_ordinary_prometheus_urls_are_allowed_when_the_admin_named_none(url: str) -> None:
    assert OPEN.check_url(url) is None


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
    problem = policy.check_url("http://prometheus.monitoring.svc:9090")
    assert problem is not None and "http://127.0.0.1:9090" in problem


def test_addresses_a_name_resolves_to_are_checked_unless_the_admin_named_it() -> None:
    assert OPEN.check_address("rebind.example", 80, "169.254.169.254") is not None
    assert "rebind.example resolves to 169.254.169.254" in str(
        OPEN.check_address("rebind.example", 80, "169.254.169.254")
    )
    assert OPEN.check_address("rebind.example", 80, "10.1.2.3") is None
    named = _policy(prometheus_url="http://prom.internal:9090")
    assert named.check_address("prom.internal", 9090, "127.0.0.1") is None
    assert named.check_address("prom.internal", 9091, "127.0.0.1") is not None


def test_bad_settings_name_the_entry() -> None:
    with pytest.raises(ValidationError, match="'nope' is not an IP network"):
        OperatorSettings(prometheus_allowed_networks="127.0.0.0/8,nope")
    with pytest.raises(ValidationError, match="is not an http"):
        OperatorSettings(prometheus_allowed_url_prefixes="prometheus:9090")
    assert OperatorSettings(prometheus_allowed_networks="127.0.0.1").prometheus_allowed_networks == [
        "127.0.0.1/32"
    ]


def test_a_refused_url_makes_the_spec_invalid_at_the_field() -> None:
    raw = {
        "selector": {"matchLabels": {"app": "t"}},
        "source": {"prometheus": {"url": "http://169.254.169.254/"}},
    }
    with pytest.raises(SpecError) as info:
        parse_spec(raw, OPEN)
    assert info.value.paths == [FIELD]
    assert "link-local" in str(info.value) and "DAM_PROMETHEUS_ALLOWED_NETWORKS" in str(info.value)
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


def test_a_name_that_resolves_to_loopback_is_refused_when_connecting(listener: Listener) -> None:
    """``localhost`` passes no static check here (the source is made directly): the resolver, with
    the real lookup (/etc/hosts), sees 127.0.0.1 and refuses before any connection."""

    async def scenario() -> SourceError:
        connector = src.query_connector(4, OPEN)
        async with aiohttp.ClientSession(connector=connector) as session:
            source = PrometheusSource(session, f"http://localhost:{listener.port}")
            try:
                await source.fetch(_target())
            except SourceError as exc:
                return exc
        raise AssertionError("expected a SourceError")

    err = asyncio.run(scenario())
    assert err.reason == src.REASON_REFUSED, err.message
    assert "localhost resolves to" in err.message and "loopback" in err.message
    assert listener.connections == 0


def test_the_resolver_refuses_a_name_if_any_of_its_addresses_is_refused() -> None:
    async def scenario() -> None:
        resolver = PolicyResolver(OPEN)
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
            factory = SourceFactory(session, OperatorSettings())
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
