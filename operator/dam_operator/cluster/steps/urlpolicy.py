"""Which Prometheus a DAMProfile may send the operator to: the cluster admin's choice.

``spec.source.prometheus.url`` is written by whoever may write DAMProfiles (a tenant), yet the
request goes out from the operator's pod: without a rule, a tenant aims the operator at the
cloud's metadata endpoint (``http://169.254.169.254/``), at the API server, or at anything on
the operator's own loopback. The rules (docs/operator.md, "Which Prometheus a profile may use"):

1. What the admin named is allowed as named: the cluster's Prometheus (``prometheus_url``) and
   the URL prefixes of ``prometheus_allowed_url_prefixes``. When either is set, a profile may
   name nothing else.
2. Otherwise (nothing named: any Prometheus), the URL's host must not be the Kubernetes API
   server (the ``kubernetes.default`` names, ``KUBERNETES_SERVICE_HOST``, the API server the
   operator itself talks to), and its address must not be loopback (127.0.0.0/8, ::1, and
   0.0.0.0 / ::, which Linux connects to the local host), link-local (169.254.0.0/16,
   fe80::/10: where clouds serve instance metadata and credentials) or another cloud metadata
   address, unless the address is in ``prometheus_allowed_networks``. The API-server rule is
   not lifted by a network: a Prometheus behind the API server's proxy is named by the admin
   (rule 1).

A host name is checked twice: as written, when the spec is validated (a refusal is the spec's
``SpecValid=False``, naming the field, the rule and the setting), and then every address it
resolves to, at connect time (``sources.PolicyResolver``). A check of the name alone, or of
an address looked up once at validation, is beaten by DNS rebinding: the tenant's name answers
a harmless address when it is checked and 169.254.169.254 when the operator connects. Checking
the addresses the connection is actually made to closes that.

Pure: no I/O (no DNS here), no environment reads (the settings carry ``KUBERNETES_SERVICE_HOST``).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from yarl import URL

if TYPE_CHECKING:
    from dam_operator.cluster.settings import OperatorSettings

FIELD = "spec.source.prometheus.url"

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# The chart values and settings that lift a rule, as the messages name them.
SETTING_URL = "DAM_PROMETHEUS_URL (chart: operator.prometheus.url)"
SETTING_PREFIXES = "DAM_PROMETHEUS_ALLOWED_URL_PREFIXES (chart: operator.prometheus.allowedUrlPrefixes)"
SETTING_NETWORKS = "DAM_PROMETHEUS_ALLOWED_NETWORKS (chart: operator.prometheus.allowedNetworks)"

LOOPBACK_NETWORKS: tuple[IPNetwork, ...] = (
    ipaddress.ip_network("127.0.0.0/8"),
    ipaddress.ip_network("::1/128"),
    # 0.0.0.0 and :: as a destination reach the local host on Linux; the rest of 0/8 is "this network".
    ipaddress.ip_network("0.0.0.0/8"),
    ipaddress.ip_network("::/128"),
)
LINK_LOCAL_NETWORKS: tuple[IPNetwork, ...] = (
    ipaddress.ip_network("169.254.0.0/16"),
    ipaddress.ip_network("fe80::/10"),
)
METADATA_NETWORKS: tuple[IPNetwork, ...] = (
    ipaddress.ip_network("fd00:ec2::254/128"),  # AWS instance metadata over IPv6
    ipaddress.ip_network("100.100.100.200/32"),  # Alibaba Cloud instance metadata
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")  # well-known NAT64 prefix: the IPv4 address is embedded

API_SERVER_NAMES = frozenset(
    {
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    }
)
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


def _host(value: str | None) -> str:
    """Lower case, without a trailing dot (``kubernetes.default.svc.`` is the same name)."""
    return (value or "").rstrip(".").lower()


def _address(host: str) -> IPAddress | None:
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])  # an IPv6 zone (fe80::1%eth0) is not the address
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped  # ::ffff:169.254.169.254 connects to 169.254.169.254
        if ip in _NAT64:
            return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip


def _legacy_numeric(host: str) -> bool:
    """``2130706433``, ``127.1``, ``0x7f.0.0.1``: forms the C resolver turns into an address."""
    if _address(host) is not None:
        return False
    try:
        socket.inet_aton(host)  # a pure parse, no lookup
    except OSError:
        return False
    return True


def _port(url: URL) -> int | None:
    return url.port  # yarl gives the scheme's default port when none is written


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
        return cls(str(url.scheme).lower(), _host(url.host), _port(url), path, exact)

    def matches(self, url: URL) -> bool:
        if (str(url.scheme).lower(), _host(url.host), _port(url)) != (self.scheme, self.host, self.port):
            return False
        path = url.path.rstrip("/")
        if self.exact:
            return path == self.path
        return not self.path or path == self.path or path.startswith(self.path + "/")


@dataclass(frozen=True)
class UrlPolicy:
    """The rules above, from the operator's settings; ``api_server`` gives the API server URL the
    operator uses (known once it has logged in; read at each check)."""

    configured_url: str | None = None
    allowed_prefixes: tuple[str, ...] = ()
    allowed_networks: tuple[IPNetwork, ...] = ()
    api_server_hosts: tuple[str, ...] = ()
    api_server: Callable[[], str] = field(default=lambda: "", compare=False)

    @classmethod
    def from_settings(
        cls, settings: OperatorSettings, api_server: Callable[[], str] = lambda: ""
    ) -> UrlPolicy:
        return cls(
            configured_url=settings.prometheus_url,
            allowed_prefixes=tuple(settings.prometheus_allowed_url_prefixes),
            allowed_networks=tuple(
                ipaddress.ip_network(n, strict=False) for n in settings.prometheus_allowed_networks
            ),
            api_server_hosts=tuple(h for h in (settings.kubernetes_service_host,) if h),
            api_server=api_server,
        )

    # ------------------------------------------------------------ what the admin named

    def _named(self) -> list[_Named]:
        out = [_Named.of(self.configured_url, exact=True)] if self.configured_url else []
        return out + [_Named.of(p, exact=False) for p in self.allowed_prefixes]

    @property
    def closed(self) -> bool:
        """Only what the admin named is allowed (a configured URL or prefixes are set)."""
        return bool(self.configured_url or self.allowed_prefixes)

    def named_by_admin(self, url: str) -> bool:
        parsed = URL(url)
        return any(n.matches(parsed) for n in self._named())

    def trusted_endpoint(self, host: str, port: int) -> bool:
        """``host:port`` is one the admin named (its addresses are not checked at connect time)."""
        host = _host(host)
        return any(n.host == host and n.port == port for n in self._named())

    # ------------------------------------------------------------ checks

    def check_url(self, url: str) -> str | None:
        """Why the operator must not query ``url`` (a sentence naming the field, the rule and the
        setting that allows it), or None. No lookup: a host name's addresses are checked when the
        operator connects (``check_address``)."""
        try:
            parsed = URL(url)
        except ValueError:
            return f"{FIELD}: {url!r} is not a URL"
        if parsed.scheme not in ("http", "https") or not parsed.host:
            return f"{FIELD}: {url!r} must be an http(s) URL with a host"
        if self.named_by_admin(url):
            return None
        if self.closed:
            named = ", ".join(x for x in (self.configured_url, *self.allowed_prefixes) if x)
            return (
                f"{FIELD}: {url} is not a Prometheus this cluster's admin allows (allowed: {named}); "
                f"use one of those, or ask the admin to add it to {SETTING_PREFIXES}"
            )
        host = _host(parsed.host)
        port = _port(parsed)
        if _legacy_numeric(host):
            return (
                f"{FIELD}: the host {host!r} is a numeric address in a legacy form; "
                "write the address in dotted-quad or IPv6 form, or use a DNS name"
            )
        problem = self._api_server_rule(host, port)
        if problem is not None:
            return problem
        if host in LOOPBACK_NAMES or host.endswith(".localhost"):
            # Refused as a name even where its addresses are allowed; the fixes that work are the
            # admin naming this URL, or the profile writing the address (not "allow localhost").
            return (
                f"{FIELD}: {url} refused: {host} is loopback (the operator's own pod); the operator "
                "does not send requests there for a profile, and a loopback name is refused even "
                f"where its addresses are allowed. An admin names the URL in {SETTING_URL} or "
                f"{SETTING_PREFIXES}, or allows the address with {SETTING_NETWORKS} (e.g. "
                "127.0.0.1/32) and the profile writes it as an address (http://127.0.0.1:PORT)"
            )
        ip = _address(host)
        if ip is not None:
            return self._address_rule(url, ip)
        return None

    def check_address(self, host: str, port: int, address: str) -> str | None:
        """Why the operator must not connect to ``address``, which ``host`` resolved to (None: it may)."""
        if self.trusted_endpoint(host, port):
            return None
        ip = _address(address)
        if ip is None:
            return None
        problem = self._api_server_rule(str(ip), port, resolved_from=host)
        if problem is not None:
            return problem
        return self._address_rule(f"http://{host}:{port}", ip, resolved_from=host)

    def _api_server_rule(self, host: str, port: int | None, resolved_from: str | None = None) -> str | None:
        api = URL(self.api_server()) if self.api_server() else None
        api_host = _host(api.host) if api is not None else ""
        ip = _address(host)
        hits = (
            host in API_SERVER_NAMES
            or any(_same_host(host, ip, h) for h in self.api_server_hosts)  # the Service: any port
            or (api is not None and _same_host(host, ip, api_host) and port == _port(api))
        )
        if not hits:
            return None
        via = f" ({resolved_from} resolves to it)" if resolved_from else ""
        return (
            f"{FIELD}: {host}{via} is the Kubernetes API server; the operator does not query it on a "
            f"profile's behalf. An admin who serves Prometheus through the API server's proxy names "
            f"that URL in {SETTING_URL} or {SETTING_PREFIXES}"
        )

    def _address_rule(self, url: str, ip: IPAddress, resolved_from: str | None = None) -> str | None:
        if any(ip in net for net in self.allowed_networks if net.version == ip.version):
            return None
        rule = _rule_of(ip)
        if rule is None:
            return None
        return self._refused(url, str(ip), rule, resolved_from)

    def _refused(self, url: str, address: str, rule: str, resolved_from: str | None = None) -> str:
        via = f"{resolved_from} resolves to {address}, which is" if resolved_from else f"{address} is"
        return (
            f"{FIELD}: {url} refused: {via} {rule}; the operator does not send requests there for a "
            f"profile. An admin allows it with {SETTING_NETWORKS} (e.g. {_example_network(address)}) "
            f"or names the cluster's Prometheus in {SETTING_URL}"
        )


def _same_host(host: str, ip: IPAddress | None, other: str) -> bool:
    other = _host(other)
    if not other:
        return False
    other_ip = _address(other)
    if ip is not None and other_ip is not None:
        return ip == other_ip
    return host == other


def _rule_of(ip: IPAddress) -> str | None:
    if any(ip in net for net in LOOPBACK_NETWORKS if net.version == ip.version):
        return "loopback (the operator's own pod)"
    if any(ip in net for net in LINK_LOCAL_NETWORKS if net.version == ip.version):
        return "link-local (169.254.0.0/16, fe80::/10: where clouds serve instance metadata and credentials)"
    if any(ip in net for net in METADATA_NETWORKS if net.version == ip.version):
        return "a cloud instance-metadata address"
    return None


def _example_network(address: str) -> str:
    ip = _address(address)
    return f"{ip}/32" if isinstance(ip, ipaddress.IPv4Address) else f"{ip}/128" if ip else address


def parse_networks(values: Iterable[str]) -> list[str]:
    """Each entry as a network (``127.0.0.1`` becomes ``127.0.0.1/32``); ValueError names a bad one."""
    out = []
    for value in values:
        try:
            out.append(str(ipaddress.ip_network(value.strip(), strict=False)))
        except ValueError:
            raise ValueError(f"{value!r} is not an IP network (e.g. 127.0.0.0/8 or fd00::/8)") from None
    return out


def parse_prefixes(values: Sequence[str]) -> list[str]:
    """Each entry must be an http(s) URL with a host; ValueError names a bad one."""
    for value in values:
        try:
            url = URL(value)
        except ValueError:
            url = None
        if url is None or url.scheme not in ("http", "https") or not url.host:
            raise ValueError(
                f"{value!r} is not an http(s) URL prefix (e.g. http://prometheus.monitoring.svc:9090/)"
            )
    return list(values)
