"""Which Prometheus a DAMProfile may send the operator to: the cluster admin's choice, closed by default.

``spec.source.prometheus.url`` is written by whoever may write DAMProfiles (a tenant), yet the
request goes out from the operator's pod: without a rule, a tenant aims the operator at the
cloud's metadata endpoint (``http://169.254.169.254/``), at the API server, at in-cluster
services, or at anything on the operator's own loopback, and maps the network by the answers.
The rules (docs/operator.md, "Which Prometheus a profile may use"):

1. **Closed by default.** With neither ``prometheus_url`` (chart: ``operator.prometheus.url``)
   nor ``prometheus_allowed_url_prefixes`` (``operator.prometheus.allowedUrlPrefixes``) set, a
   profile may name no Prometheus at all: every ``spec.source.prometheus.url`` is refused,
   naming those two chart values.
2. **Only what the admin named.** Otherwise a profile's URL must be the configured URL, or lie
   under one of the prefixes (same scheme, host and port; the path under the prefix's path).
3. **Allowed as named.** The host and port the admin wrote are the admin's choice: a literal
   address there (``http://10.0.0.5:9090/``, even ``http://127.0.0.1:9090``) is allowed as
   written, and a DNS name there (``prometheus.monitoring.svc``) may resolve to a private
   address (an in-cluster Service's ClusterIP is one). Naming never lifts more than that host
   and port.
4. **Even a named DNS name** is refused, when the operator connects, if it resolves to a
   sensitive address: loopback (the operator's own pod), link-local, a cloud instance-metadata
   address (``METADATA_NETWORKS``), the operator's own Pod or Service addresses, or the
   Kubernetes API server (its Service's ClusterIP, every endpoint of ``default/kubernetes``,
   the API server the operator talks to). A name is re-pointed more easily than an address
   is retyped (an ExternalName Service in a namespace a tenant controls, a DNS record outside
   the admin's hands), and these are the addresses that such a re-pointing aims at. An admin
   lifts this for addresses listed in ``prometheus_allowed_networks``
   (``operator.prometheus.allowedNetworks``), except for the API server, which a network never
   lifts (a Prometheus behind the API server's proxy is named by the API server's name or address).

Addresses are compared after unwrapping IPv4 embedded in IPv6: ``::ffff:a.b.c.d`` (mapped),
``::a.b.c.d`` (the deprecated IPv4-compatible form), NAT64 ``64:ff9b::/96`` and 6to4
``2002::/16`` are checked as the IPv4 address they carry.

A URL is checked when the spec is validated, before any connection (a refusal is the spec's
``SpecValid=False``, naming the field, the rule and the chart value), and the addresses a named
DNS name resolves to are checked when the operator connects (``sources.PolicyResolver``): a
check of the name alone, or of an address looked up once at validation, is beaten by DNS
rebinding (harmless when checked, 169.254.169.254 when connected to).

Pure: no I/O (no DNS here), no environment reads. The addresses that only the API server knows
(the ``default/kubernetes`` endpoints, the operator's Services) are read by the kube adapter and
passed in through ``cluster`` (``ClusterAddresses``).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from yarl import URL

FIELD = "spec.source.prometheus.url"

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# The chart values and settings that lift a rule, as the messages name them.
SETTING_URL = "DAM_PROMETHEUS_URL (chart: operator.prometheus.url)"
SETTING_PREFIXES = "DAM_PROMETHEUS_ALLOWED_URL_PREFIXES (chart: operator.prometheus.allowedUrlPrefixes)"
SETTING_NETWORKS = "DAM_PROMETHEUS_ALLOWED_NETWORKS (chart: operator.prometheus.allowedNetworks)"


def _nets(*cidrs: str) -> tuple[IPNetwork, ...]:
    return tuple(ipaddress.ip_network(c) for c in cidrs)


LOOPBACK_NETWORKS = _nets(
    "127.0.0.0/8",
    "::1/128",
    # 0.0.0.0 and :: as a destination reach the local host on Linux; the rest of 0/8 is "this network".
    "0.0.0.0/8",
    "::/128",
)
LINK_LOCAL_NETWORKS = _nets("169.254.0.0/16", "fe80::/10")
# Instance-metadata services of the major clouds (each provider's documentation). Most serve on
# 169.254.169.254 (AWS, GCP, Azure IMDS, OpenStack, DigitalOcean, Oracle, IBM, Hetzner, Linode,
# Huawei), inside link-local; these are the ones outside it, or on IPv6:
METADATA_NETWORKS = _nets(
    "169.254.169.254/32",  # the common one (also link-local)
    "169.254.170.2/32",  # AWS ECS task metadata and credentials (link-local)
    "169.254.0.23/32",  # Tencent Cloud (metadata.tencentyun.com; link-local)
    "fd00:ec2::254/128",  # AWS instance metadata over IPv6 (Nitro)
    "fd00:ec2::23/128",  # AWS EKS Pod Identity agent over IPv6
    "fd20:ce::254/128",  # GCP metadata server on IPv6-only instances
    "168.63.129.16/32",  # Azure WireServer / host agent (a public address)
    "100.100.100.200/32",  # Alibaba Cloud instance metadata (inside CGNAT 100.64/10)
    "192.0.0.192/32",  # Oracle Cloud's older metadata address (inside 192.0.0.0/24)
)
METADATA_NAMES = frozenset(
    {
        "metadata",
        "metadata.google.internal",
        "metadata.goog",
        "metadata.tencentyun.com",
        "instance-data",
        "instance-data.ec2.internal",
    }
)
# Private and other non-global ranges: RFC 1918, CGNAT (RFC 6598), IETF protocol assignments,
# benchmarking, unique local and the old site-local IPv6, NAT64 local use (RFC 8215).
PRIVATE_NETWORKS = _nets(
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "192.0.0.0/24",
    "198.18.0.0/15",
    "fc00::/7",
    "fec0::/10",
    "64:ff9b:1::/48",
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")  # well-known NAT64 prefix: the IPv4 address is embedded
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")  # deprecated ::a.b.c.d (RFC 4291 2.5.5.1)

API_SERVER_NAMES = frozenset(
    {
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    }
)
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})

RULE_LOOPBACK = "loopback (the operator's own pod)"
RULE_LINK_LOCAL = (
    "link-local (169.254.0.0/16, fe80::/10: where clouds serve instance metadata and credentials)"
)
RULE_METADATA = "a cloud instance-metadata address"
RULE_PRIVATE = "a private address (RFC 1918, CGNAT 100.64.0.0/10, fc00::/7 and the like: in-cluster services)"
RULE_API_SERVER = "the Kubernetes API server"
RULE_OPERATOR = "the operator's own Pod or Service"

Endpoint = tuple[str, int | None]
"""An address and a port (None: any port)."""


@dataclass(frozen=True)
class ClusterAddresses:
    """Addresses only the API server knows, read by the kube adapter (``kube.cluster_addresses``)
    and passed in: the API server's (its Service's ClusterIP, any port, and each endpoint of
    ``default/kubernetes`` with its port) and the operator's own (its Services' ClusterIPs)."""

    api_server: frozenset[Endpoint] = frozenset()
    operator: frozenset[Endpoint] = frozenset()


NO_CLUSTER_ADDRESSES = ClusterAddresses()


def _host(value: str | None) -> str:
    """Lower case, without a trailing dot (``kubernetes.default.svc.`` is the same name)."""
    return (value or "").rstrip(".").lower()


def ip_of(host: str) -> IPAddress | None:
    """The address ``host`` is, IPv4 embedded in IPv6 unwrapped (None: a DNS name)."""
    try:
        ip = ipaddress.ip_address(host.strip("[]").split("%", 1)[0])  # an IPv6 zone is not the address
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped  # ::ffff:169.254.169.254 connects to 169.254.169.254
        if ip in _IPV4_COMPATIBLE and int(ip) > 1:  # not :: or ::1, which are IPv6's own
            return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if ip in _NAT64:
            return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if ip.sixtofour is not None:
            return ip.sixtofour
    return ip


def _in(ip: IPAddress, networks: Iterable[IPNetwork]) -> bool:
    return any(ip in net for net in networks if net.version == ip.version)


def _legacy_numeric(host: str) -> bool:
    """``2130706433``, ``127.1``, ``0x7f.0.0.1``: forms the C resolver turns into an address."""
    if ip_of(host) is not None:
        return False
    try:
        socket.inet_aton(host)  # a pure parse, no lookup
    except OSError:
        return False
    return True


@dataclass(frozen=True)
class _Named:
    """A URL the admin named: scheme, host, port, and a path that the profile's must start with."""

    scheme: str
    host: str
    port: int | None
    path: str
    exact: bool

    @classmethod
    def of(cls, text: str, exact: bool) -> _Named:
        url = URL(text)
        path = url.path.rstrip("/")
        return cls(str(url.scheme).lower(), _host(url.host), url.port, path, exact)

    def matches(self, url: URL) -> bool:
        if (str(url.scheme).lower(), _host(url.host), url.port) != (self.scheme, self.host, self.port):
            return False
        path = url.path.rstrip("/")
        if self.exact:
            return path == self.path
        return not self.path or path == self.path or path.startswith(self.path + "/")


def _no_cluster_addresses() -> ClusterAddresses:
    return NO_CLUSTER_ADDRESSES


@dataclass(frozen=True)
class UrlPolicy:
    """The rules above. Built where the operator is wired (``runtime.main.url_policy``).

    ``api_server`` gives the API server URL the operator uses and ``cluster`` the addresses
    read from the API server (both read at each check: known once the operator has logged in
    and listed them). ``own_addresses``: the operator's Pod IPs (the downward API)."""

    configured_url: str | None = None
    allowed_prefixes: tuple[str, ...] = ()
    allowed_networks: tuple[IPNetwork, ...] = ()
    api_server_hosts: tuple[str, ...] = ()
    own_addresses: tuple[str, ...] = ()
    api_server: Callable[[], str] = field(default=lambda: "", compare=False)
    cluster: Callable[[], ClusterAddresses] = field(default=_no_cluster_addresses, compare=False)

    # ------------------------------------------------------------ what the admin named

    def _named(self) -> list[_Named]:
        out = [_Named.of(self.configured_url, exact=True)] if self.configured_url else []
        return out + [_Named.of(p, exact=False) for p in self.allowed_prefixes]

    @property
    def closed(self) -> bool:
        """No profile may name a Prometheus: the admin named none (the chart's default)."""
        return not (self.configured_url or self.allowed_prefixes)

    def named_by_admin(self, url: str) -> bool:
        parsed = URL(url)
        return any(n.matches(parsed) for n in self._named())

    def _named_host(self, host: str, port: int) -> str | None:
        """The host as the admin named it with ``port``, if any URL or prefix did."""
        host = _host(host)
        return next((n.host for n in self._named() if n.host == host and n.port == port), None)

    # ------------------------------------------------------------ checks

    def check_url(self, url: str) -> str | None:
        """Why the operator must not query ``url`` for a profile (a sentence naming the field, the
        rule and the chart value that allows it), or None. No lookup: the addresses of a DNS name
        are checked when the operator connects (``check_address``)."""
        try:
            parsed = URL(url)
        except ValueError:
            return f"{FIELD}: {url!r} is not a URL"
        if parsed.scheme not in ("http", "https") or not parsed.host:
            return f"{FIELD}: {url!r} must be an http(s) URL with a host"
        host = _host(parsed.host)
        if _legacy_numeric(host):
            return (
                f"{FIELD}: the host {host!r} is a numeric address in a legacy form; "
                "write the address in dotted-quad or IPv6 form, or use a DNS name"
            )
        if self.closed:
            return (
                f"{FIELD}: {url} refused: this cluster's admin allows no Prometheus chosen by a "
                f"profile (the chart's default){self._what(host, parsed.port)}. Remove spec.source to "
                f"scrape the sidecars, or ask the admin to name the cluster's Prometheus in {SETTING_URL} "
                f"or the URLs profiles may use in {SETTING_PREFIXES}"
            )
        if not self.named_by_admin(url):
            named = ", ".join(x for x in (self.configured_url, *self.allowed_prefixes) if x)
            return (
                f"{FIELD}: {url} is not a Prometheus this cluster's admin allows (allowed: {named})"
                f"{self._what(host, parsed.port)}; use one of those, or ask the admin to add it to "
                f"{SETTING_PREFIXES} ({SETTING_URL} is the cluster's own)"
            )
        return None

    def _what(self, host: str, port: int | None) -> str:
        """``; <host> is <rule>``, when the host is, as written, an internal address or name."""
        rule = self.rule_of_host(host, port)
        return f"; {host} is {rule}" if rule else ""

    def rule_of_host(self, host: str, port: int | None) -> str | None:
        """The class of ``host`` as written (an address, or a name known to be internal), if any."""
        host = _host(host)
        if host in API_SERVER_NAMES:
            return RULE_API_SERVER
        if host in LOOPBACK_NAMES or host.endswith(".localhost"):
            return RULE_LOOPBACK
        if host in METADATA_NAMES:
            return RULE_METADATA
        ip = ip_of(host)
        if ip is None:
            return RULE_API_SERVER if self._api_server_name(host, port) else None
        return self._sensitive_rule(ip, port) or (RULE_PRIVATE if _in(ip, PRIVATE_NETWORKS) else None)

    def check_address(self, host: str, port: int, address: str) -> str | None:
        """Why the operator must not connect to ``address``, which ``host`` resolved to (None: it
        may). Only hosts the admin named reach a connection (``check_url``); another is refused."""
        named = self._named_host(host, port)
        ip = ip_of(address)
        if named is None:
            return (
                f"{FIELD}: {host}:{port} is not a Prometheus this cluster's admin allows ({SETTING_PREFIXES})"
            )
        if ip is None or ip_of(named) is not None:
            return None  # a literal address the admin wrote is allowed as written
        rule = self._sensitive_rule(ip, port)
        if rule is None:
            return None
        if rule == RULE_API_SERVER:
            if named in API_SERVER_NAMES or self._api_server_name(named, port):
                return None  # the admin named the API server itself (its proxy)
            return (
                f"{FIELD}: {host} resolves to {ip}, which is {rule}; the operator does not query it on a "
                f"profile's behalf. An admin who serves Prometheus through the API server's proxy names "
                f"the API server itself in {SETTING_URL} or {SETTING_PREFIXES}"
            )
        if rule == RULE_LOOPBACK and (named in LOOPBACK_NAMES or named.endswith(".localhost")):
            return None  # the admin named the loopback itself
        if _in(ip, self.allowed_networks):
            return None
        return (
            f"{FIELD}: {host} resolves to {ip}, which is {rule}; the operator does not connect there "
            f"for a profile, even to a name the admin allowed. An admin allows it with {SETTING_NETWORKS} "
            f"(e.g. {_example_network(ip)}), or names the address itself in {SETTING_PREFIXES}"
        )

    def _api_server_name(self, host: str, port: int | None) -> bool:
        """``host`` is, as written, the API server's Service host or the URL the operator uses."""
        host = _host(host)
        if any(_host(h) == host for h in self.api_server_hosts):
            return True
        api = URL(self.api_server()) if self.api_server() else None
        return api is not None and _host(api.host) == host and port == api.port

    def _sensitive_rule(self, ip: IPAddress, port: int | None) -> str | None:
        """The class of a sensitive address (rule 4), if ``ip`` (with ``port``) is one."""
        cluster = self.cluster()
        api = URL(self.api_server()) if self.api_server() else None
        api_endpoints: set[Endpoint] = set(cluster.api_server)
        api_endpoints.update((h, None) for h in self.api_server_hosts)
        if api is not None and api.host:
            api_endpoints.add((api.host, api.port))
        if _hits(ip, port, api_endpoints):
            return RULE_API_SERVER
        if _in(ip, METADATA_NETWORKS):
            return RULE_METADATA
        if _in(ip, LOOPBACK_NETWORKS):
            return RULE_LOOPBACK
        if _in(ip, LINK_LOCAL_NETWORKS):
            return RULE_LINK_LOCAL
        if _hits(ip, port, set(cluster.operator) | {(a, None) for a in self.own_addresses}):
            return RULE_OPERATOR
        return None


def _hits(ip: IPAddress, port: int | None, endpoints: Iterable[Endpoint]) -> bool:
    for address, endpoint_port in endpoints:
        if ip_of(address) == ip and (endpoint_port is None or port is None or endpoint_port == port):
            return True
    return False


def _example_network(ip: IPAddress) -> str:
    return f"{ip}/32" if isinstance(ip, ipaddress.IPv4Address) else f"{ip}/128"
