"""The webhook's TLS certificates, made with ``cryptography``.

kopf's self-signed certificate builder fails with OpenSSL 3, so the operator
keeps its own small CA: a CA certificate (long-lived, its PEM is the webhook
configuration's ``caBundle``) and a serving certificate for the webhook
Service's DNS names, signed by that CA and renewed well before it expires.
Renewing the serving certificate keeps the CA, so ``caBundle`` does not change
and the API server never sees an unknown certificate.

Everything here is pure except ``CertManager`` (which talks to the cluster
through an injected ``CertStore``) and ``write_pem_files``.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "CA_CRT",
    "CA_KEY",
    "TLS_CRT",
    "TLS_KEY",
    "CertManager",
    "CertStore",
    "KeyPair",
    "WebhookCertificates",
    "bundle_from_secret",
    "ca_bundle_patch",
    "generate_ca",
    "generate_serving_cert",
    "issue",
    "needs_rotation",
    "secret_body",
    "service_dns_names",
    "verify_chain",
    "write_pem_files",
]

CA_VALIDITY = dt.timedelta(days=3650)
SERVING_VALIDITY = dt.timedelta(days=365)
RENEW_BEFORE = dt.timedelta(days=30)
_CLOCK_SKEW = dt.timedelta(minutes=5)

TLS_CRT = "tls.crt"
TLS_KEY = "tls.key"
CA_CRT = "ca.crt"
CA_KEY = "ca.key"


@dataclass(frozen=True)
class KeyPair:
    cert_pem: bytes
    key_pem: bytes


@dataclass(frozen=True)
class WebhookCertificates:
    ca: KeyPair
    serving: KeyPair

    @property
    def ca_bundle(self) -> bytes:
        """The PEM the API server trusts (``clientConfig.caBundle``, base64-encoded there)."""
        return self.ca.cert_pem


def _utc(now: dt.datetime | None) -> dt.datetime:
    now = now or dt.datetime.now(dt.UTC)
    return now if now.tzinfo else now.replace(tzinfo=dt.UTC)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def service_dns_names(service: str, namespace: str, cluster_domain: str = "cluster.local") -> list[str]:
    """The names the API server may use for ``<service>.<namespace>``; it dials ``<svc>.<ns>.svc``."""
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.{cluster_domain}",
    ]


def _key_usage(*, signs_certificates: bool) -> x509.KeyUsage:
    """Digital signatures (ECDSA), and certificates and CRLs for a CA: nothing else."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=signs_certificates,
        crl_sign=signs_certificates,
        encipher_only=False,
        decipher_only=False,
    )


def generate_ca(
    common_name: str = "dam-operator-webhook-ca",
    now: dt.datetime | None = None,
    validity: dt.timedelta = CA_VALIDITY,
) -> KeyPair:
    now = _utc(now)
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(signs_certificates=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def generate_serving_cert(
    ca: KeyPair,
    dns_names: Sequence[str],
    ip_addresses: Sequence[str] = (),
    now: dt.datetime | None = None,
    validity: dt.timedelta = SERVING_VALIDITY,
) -> KeyPair:
    """A server certificate for ``dns_names`` (and IP SANs, e.g. 127.0.0.1 in tests), signed by ``ca``."""
    if not dns_names and not ip_addresses:
        raise ValueError("a serving certificate needs at least one DNS name or IP address")
    now = _utc(now)
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key must be an EC private key")
    key = _new_key()
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    not_after = min(now + validity, ca_cert.not_valid_after_utc)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, (list(dns_names) or list(ip_addresses))[0])])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(_key_usage(signs_certificates=False), critical=True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def issue(
    dns_names: Sequence[str],
    ip_addresses: Sequence[str] = (),
    now: dt.datetime | None = None,
    ca: KeyPair | None = None,
) -> WebhookCertificates:
    """A serving certificate for the names, with ``ca`` or a new CA."""
    ca = ca or generate_ca(now=now)
    return WebhookCertificates(ca=ca, serving=generate_serving_cert(ca, dns_names, ip_addresses, now=now))


def needs_rotation(
    cert_pem: bytes | None,
    now: dt.datetime | None = None,
    renew_before: dt.timedelta = RENEW_BEFORE,
    dns_names: Sequence[str] = (),
) -> bool:
    """True when the certificate is missing, unreadable, not yet valid, expires within
    ``renew_before``, or lacks one of ``dns_names``."""
    if not cert_pem:
        return True
    now = _utc(now)
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        return True
    if now < cert.not_valid_before_utc or cert.not_valid_after_utc - now <= renew_before:
        return True
    if dns_names:
        try:
            san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        except x509.ExtensionNotFound:
            return True
        if not set(dns_names) <= set(san.get_values_for_type(x509.DNSName)):
            return True
    return False


def verify_chain(serving_pem: bytes, ca_pem: bytes) -> bool:
    """True when ``serving_pem`` is signed by the key of ``ca_pem`` and names it as issuer."""
    try:
        cert = x509.load_pem_x509_certificate(serving_pem)
        ca = x509.load_pem_x509_certificate(ca_pem)
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


# ---------------------------------------------------------------- Kubernetes bodies


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def secret_body(name: str, namespace: str, certs: WebhookCertificates) -> dict[str, Any]:
    """A ``kubernetes.io/tls`` Secret holding the serving pair and the CA (key included, to renew)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": "dam-operator", "app.kubernetes.io/component": "webhook"},
        },
        "data": {
            TLS_CRT: _b64(certs.serving.cert_pem),
            TLS_KEY: _b64(certs.serving.key_pem),
            CA_CRT: _b64(certs.ca.cert_pem),
            CA_KEY: _b64(certs.ca.key_pem),
        },
    }


def bundle_from_secret(secret: Mapping[str, Any] | None) -> WebhookCertificates | None:
    """The certificates in a Secret made by ``secret_body``; None when absent or incomplete."""
    if not secret:
        return None
    data = secret.get("data") or {}
    try:
        raw = {k: base64.b64decode(data[k], validate=True) for k in (TLS_CRT, TLS_KEY, CA_CRT, CA_KEY)}
    except (KeyError, TypeError, ValueError):
        return None
    return WebhookCertificates(
        ca=KeyPair(raw[CA_CRT], raw[CA_KEY]), serving=KeyPair(raw[TLS_CRT], raw[TLS_KEY])
    )


def ca_bundle_patch(
    configuration: Mapping[str, Any], ca_pem: bytes, webhook_names: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """JSON patch setting ``clientConfig.caBundle`` on the configuration's webhooks (all, or those
    named); each change is guarded by a ``test`` of the webhook's name, so a concurrent reorder
    fails the patch instead of writing the wrong entry. ``[]`` when already current."""
    encoded = _b64(ca_pem)
    ops: list[dict[str, Any]] = []
    for i, hook in enumerate(configuration.get("webhooks") or []):
        name = hook.get("name")
        if webhook_names and name not in webhook_names:
            continue
        if (hook.get("clientConfig") or {}).get("caBundle") == encoded:
            continue
        ops.append({"op": "test", "path": f"/webhooks/{i}/name", "value": name})
        ops.append({"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": encoded})
    return ops


def write_pem_files(
    certs: WebhookCertificates, directory: str | os.PathLike[str] | None = None
) -> tuple[Path, Path]:
    """Write the serving certificate and key (mode 0600) for ``ssl.load_cert_chain``; returns (cert, key)."""
    folder = Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="dam-webhook-"))
    folder.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = folder / TLS_CRT, folder / TLS_KEY
    for path, data in ((cert_path, certs.serving.cert_pem), (key_path, certs.serving.key_pem)):
        tmp = path.with_suffix(path.suffix + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    return cert_path, key_path


# ---------------------------------------------------------------- the one stateful part


class CertStore(Protocol):
    """What ``CertManager`` needs from the Kubernetes adapter."""

    async def get_secret(self, namespace: str, name: str) -> Mapping[str, Any] | None: ...

    async def put_secret(self, namespace: str, name: str, body: Mapping[str, Any]) -> None:
        """Create the Secret, or replace its data."""

    async def patch_webhook_ca(self, configuration_name: str, ca_bundle_pem: bytes) -> None:
        """Set ``caBundle`` on the MutatingWebhookConfiguration's webhooks (see ``ca_bundle_patch``)."""


class CertManager:
    """Keeps the webhook Secret valid and the webhook configuration's caBundle in step.

    ``ensure()`` reads the Secret; when it is missing, unreadable, close to expiry
    or lacks a DNS name it issues a new serving certificate (reusing the CA while
    the CA itself is not due), writes the Secret, re-reads it (several replicas
    converge on whatever was stored last) and patches the caBundle.
    """

    def __init__(
        self,
        store: CertStore,
        *,
        namespace: str,
        secret_name: str,
        service_name: str,
        webhook_configuration_name: str,
        renew_before: dt.timedelta = RENEW_BEFORE,
        extra_dns_names: Sequence[str] = (),
        ip_addresses: Sequence[str] = (),
    ) -> None:
        self.store = store
        self.namespace = namespace
        self.secret_name = secret_name
        self.webhook_configuration_name = webhook_configuration_name
        self.renew_before = renew_before
        self.dns_names = [*service_dns_names(service_name, namespace), *extra_dns_names]
        self.ip_addresses = list(ip_addresses)

    def _current(self, certs: WebhookCertificates | None, now: dt.datetime) -> bool:
        return (
            certs is not None
            and verify_chain(certs.serving.cert_pem, certs.ca.cert_pem)
            and not needs_rotation(certs.serving.cert_pem, now, self.renew_before, self.dns_names)
        )

    async def ensure(self, now: dt.datetime | None = None) -> tuple[WebhookCertificates, bool]:
        """The valid certificates, and whether they were (re)issued by this call."""
        now = _utc(now)
        certs = bundle_from_secret(await self.store.get_secret(self.namespace, self.secret_name))
        issued = False
        if certs is None or not self._current(certs, now):
            ca = (
                certs.ca
                if certs is not None and not needs_rotation(certs.ca.cert_pem, now, self.renew_before * 2)
                else None
            )
            fresh = issue(self.dns_names, self.ip_addresses, now=now, ca=ca)
            await self.store.put_secret(
                self.namespace, self.secret_name, secret_body(self.secret_name, self.namespace, fresh)
            )
            stored = bundle_from_secret(await self.store.get_secret(self.namespace, self.secret_name))
            certs = stored if stored is not None and self._current(stored, now) else fresh
            issued = True
        await self.store.patch_webhook_ca(self.webhook_configuration_name, certs.ca_bundle)
        return certs, issued
