"""A real Kubernetes control plane on 127.0.0.1 for tests and scripts: etcd + kube-apiserver, as
controller-runtime's envtest runs them (no kubelet, no controller-manager, no scheduler).

The binaries come from ``tools/kube-bin/build.sh`` (``make kube-bin``), or from ``KUBEBUILDER_ASSETS``.
This module has no pytest in it, so scripts (benchmarks) can use it too::

    with ControlPlane(find_kube_binaries(), Path(tempfile.mkdtemp())) as cp:
        cp.kubectl("apply", "-f", "crds/")

What a test must know about a control plane without the other components:
- Nothing runs Pods: create a Pod, then call :meth:`ControlPlane.mark_pod_running`
  (it writes ``status`` through the ``pods/status`` subresource, as envtest users do).
- No controller creates a namespace's ``default`` ServiceAccount, and the ServiceAccount admission
  plugin (kept on) refuses Pods whose ServiceAccount is missing: :meth:`ControlPlane.create_namespace`
  creates it.
- No token controller: ServiceAccount tokens come from the TokenRequest API
  (:meth:`ControlPlane.service_account_token`, what ``kubectl create token`` does).
- No namespace controller: :meth:`ControlPlane.delete_namespace` empties and finalizes the namespace itself.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import datetime as dt
import ipaddress
import json
import os
import re
import secrets
import shutil
import signal
import ssl
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from dam_cluster.procs import free_port, stop_process, wait_for

REPO = Path(__file__).resolve().parents[3]  # tools/node/dam_cluster/controlplane.py
BUILD_SCRIPT = REPO / "tools" / "kube-bin" / "build.sh"
HOW_TO_GET = "build them once with `make kube-bin` (or set KUBEBUILDER_ASSETS to a directory holding them)"
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
ADMIN_USER = "dam-test-admin"
START_TIMEOUT_S = 120.0  # generous: a first start on 2 busy cores takes 10-30 s
_LOG_TAIL_LINES = 40


class KubeBinariesMissingError(RuntimeError):
    """kube-apiserver and etcd cannot be had without building them (or at all)."""


@dataclass(frozen=True)
class KubeBinaries:
    """Where the control-plane binaries and the kubectl to drive them are."""

    directory: Path
    kubectl: Path

    @property
    def kube_apiserver(self) -> Path:
        return self.directory / "kube-apiserver"

    @property
    def etcd(self) -> Path:
        return self.directory / "etcd"


def find_kube_binaries(*, build: bool = False, timeout_s: float = 3600.0) -> KubeBinaries:
    """The directory ``tools/kube-bin/build.sh`` prints last, and a kubectl.

    With ``build=False`` (the default) nothing is compiled: only ``KUBEBUILDER_ASSETS`` or the cache
    of an earlier ``make kube-bin`` count. Raises :class:`KubeBinariesMissingError` with the reason.
    """
    cmd = [str(BUILD_SCRIPT)] + ([] if build else ["--no-build"])
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KubeBinariesMissingError(f"{BUILD_SCRIPT} did not run: {exc}") from exc
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        why = (done.stderr.strip().splitlines() or [f"{BUILD_SCRIPT} exited with status {done.returncode}"])[
            -1
        ]
        raise KubeBinariesMissingError(why.removeprefix("kube-bin: "))
    directory = Path(lines[-1])
    for name in ("kube-apiserver", "etcd"):
        if not os.access(directory / name, os.X_OK):
            raise KubeBinariesMissingError(f"{directory / name} is not an executable")
    kubectl = directory / "kubectl"
    if not os.access(kubectl, os.X_OK):
        found = shutil.which("kubectl")
        if found is None:
            raise KubeBinariesMissingError("no kubectl on PATH (nor in the binaries' directory)")
        kubectl = Path(found)
    return KubeBinaries(directory=directory, kubectl=kubectl)


# --- certificates and keys -------------------------------------------------------------------------


def _pem_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@dataclass(frozen=True)
class _Pki:
    ca_pem: bytes
    serving_cert_pem: bytes
    serving_key_pem: bytes
    sa_key_pem: bytes  # signs and verifies ServiceAccount tokens


def _make_pki() -> _Pki:
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dam-test-kube-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=7))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.DNSName("kubernetes"),
        x509.DNSName("kubernetes.default"),
        x509.DNSName("kubernetes.default.svc"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("10.0.0.1")),  # the `kubernetes` Service's ClusterIP
    ]
    serving = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=7))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return _Pki(
        ca_pem=ca.public_bytes(serialization.Encoding.PEM),
        serving_cert_pem=serving.public_bytes(serialization.Encoding.PEM),
        serving_key_pem=_pem_key(key),
        sa_key_pem=_pem_key(sa_key),
    )


# --- the API over HTTP -----------------------------------------------------------------------------


class ApiError(RuntimeError):
    """The API server answered with an error status."""

    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        self.status = status
        self.body = body
        try:
            self.message = str(json.loads(body).get("message", body))
        except (ValueError, AttributeError):
            self.message = body
        super().__init__(f"{method} {path} -> {status}: {self.message}")


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


def _set_pdeathsig() -> None:  # runs in the child between fork and exec
    """Have Linux kill the child when the test process dies, even by SIGKILL."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _dns_label(text: str, limit: int) -> str:
    label = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return label[:limit].rstrip("-") or "x"


class ControlPlane:
    """etcd + kube-apiserver on 127.0.0.1 with RBAC, an admin token in ``system:masters`` and
    ServiceAccount token signing. ``start()``/``stop()`` or use it as a context manager.

    After ``start()``: ``url`` (https://127.0.0.1:PORT), ``kubeconfig`` (admin), ``ca_file``,
    ``admin_token``, ``etcd_url``, ``workdir`` (logs: ``etcd.log``, ``kube-apiserver.log``).
    """

    def __init__(self, binaries: KubeBinaries, workdir: Path, *, extra_apiserver_args: Sequence[str] = ()):
        self.binaries = binaries
        self.workdir = workdir
        self.extra_apiserver_args = tuple(extra_apiserver_args)
        self.admin_token = secrets.token_hex(24)
        self.etcd_port = 0
        self.etcd_peer_port = 0
        self.apiserver_port = 0
        self._etcd: subprocess.Popen[bytes] | None = None
        self._apiserver: subprocess.Popen[bytes] | None = None
        self._logs: list[IO[bytes]] = []
        self._ssl: ssl.SSLContext | None = None
        self._namespaced_kinds: list[tuple[str, str]] | None = None

    # -- paths and addresses

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.etcd_port}"

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "admin.kubeconfig"

    @property
    def ca_file(self) -> Path:
        return self.workdir / "pki" / "ca.crt"

    @property
    def etcd_log(self) -> Path:
        return self.workdir / "etcd.log"

    @property
    def apiserver_log(self) -> Path:
        return self.workdir / "kube-apiserver.log"

    def pids(self) -> list[int]:
        """Process ids of the running etcd and kube-apiserver."""
        return [p.pid for p in (self._etcd, self._apiserver) if p is not None and p.poll() is None]

    @property
    def running(self) -> bool:
        return all(p is not None and p.poll() is None for p in (self._etcd, self._apiserver))

    # -- lifecycle

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Write the PKI and config, start etcd and kube-apiserver, wait for ``/readyz``."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._write_pki()
        atexit.register(self.stop)
        try:
            self._first_start(self.start_etcd, self.etcd_log, timeout_s, "etcd_port")
            self._first_start(self.start_apiserver, self.apiserver_log, timeout_s, "apiserver_port")
            self._write_kubeconfig(self.kubeconfig, "admin", self.admin_token)
            self.ensure_service_account("default", "default")
        except BaseException:
            self.stop()
            raise

    def _first_start(
        self, start: Callable[[float], None], log_path: Path, timeout_s: float, port: str
    ) -> None:
        """``start``, on other free ports when the ones picked were taken in the meantime."""
        for attempt in range(3):
            try:
                start(timeout_s)
                return
            except AssertionError:
                last_run = _tail(log_path, 10_000).rpartition("\n==== ")[2]
                if attempt == 2 or "address already in use" not in last_run:
                    raise
                setattr(self, port, 0)

    def stop(self) -> None:
        """Stop kube-apiserver, then etcd; nothing of theirs is left running. Safe to call twice."""
        self.stop_apiserver()
        self.stop_etcd()
        for log in self._logs:
            log.close()
        self._logs.clear()
        atexit.unregister(self.stop)

    def start_etcd(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start etcd (on the ports of an earlier start, if any, so a restart keeps its address)."""
        if self._etcd is not None and self._etcd.poll() is None:
            return
        if not self.etcd_port:
            self.etcd_port, self.etcd_peer_port = free_port(), free_port()
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        cmd = [
            str(self.binaries.etcd),
            "--name=default",
            f"--data-dir={self.workdir / 'etcd-data'}",
            f"--listen-client-urls={self.etcd_url}",
            f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}",
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        ]
        self._etcd = self._spawn(cmd, self.etcd_log)

        def healthy() -> bool:
            with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=5) as resp:
                return bool(json.loads(resp.read()).get("health") == "true")

        self._wait(self._etcd, name="etcd", ready=healthy, timeout_s=timeout_s, log_path=self.etcd_log)

    def stop_etcd(self) -> None:
        self._etcd = self._terminate(self._etcd)

    def restart_etcd(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Stop etcd and start it again on the same port with the same data."""
        self.stop_etcd()
        self.start_etcd(timeout_s)

    def start_apiserver(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start kube-apiserver (on the port of an earlier start, if any) and wait for ``/readyz``."""
        if self._apiserver is not None and self._apiserver.poll() is None:
            return
        if not self.apiserver_port:
            self.apiserver_port = free_port()
        pki = self.workdir / "pki"
        cmd = [
            str(self.binaries.kube_apiserver),
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.apiserver_port}",
            f"--cert-dir={pki}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--token-auth-file={pki / 'tokens.csv'}",
            "--authorization-mode=RBAC",
            f"--service-account-issuer={self.url}",
            f"--service-account-key-file={pki / 'sa.key'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--allow-privileged=true",
            "--profiling=false",
            "--v=1",
            *self.extra_apiserver_args,
        ]
        self._apiserver = self._spawn(cmd, self.apiserver_log)

        def ready() -> bool:
            return self._request("GET", "/readyz", timeout_s=10.0)[0] == 200

        self._wait(
            self._apiserver,
            name="kube-apiserver",
            ready=ready,
            timeout_s=timeout_s,
            log_path=self.apiserver_log,
        )

    def stop_apiserver(self) -> None:
        self._apiserver = self._terminate(self._apiserver)

    def restart_apiserver(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Stop kube-apiserver and start it again on the same port (clients keep their kubeconfig)."""
        self.stop_apiserver()
        self.start_apiserver(timeout_s)

    def _spawn(self, cmd: list[str], log_path: Path) -> subprocess.Popen[bytes]:
        log = log_path.open("ab")
        self._logs.append(log)
        log.write(f"\n==== {' '.join(cmd)}\n".encode())
        log.flush()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ETCD_", "KUBECONFIG"))}
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
            env=env,
            start_new_session=True,  # own process group: stop() kills the whole group
            preexec_fn=_set_pdeathsig,  # noqa: PLW1509 - only prctl(); fixtures start it from the main thread
        )

    @staticmethod
    def _terminate(proc: subprocess.Popen[bytes] | None) -> None:
        if proc is None:
            return None
        stop_process(proc, signal.SIGTERM, timeout=20.0)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # anything else left in its group
        return None

    @staticmethod
    def _wait(
        proc: subprocess.Popen[bytes],
        *,
        name: str,
        ready: Callable[[], bool],
        timeout_s: float,
        log_path: Path,
    ) -> None:
        """Poll ``ready`` until it holds; fail at once, with the log's tail, if ``proc`` exits."""
        what = f"{name} to be ready"

        def check() -> str | None:
            if proc.poll() is not None:
                return "exited"
            return "ready" if ready() else None

        try:
            outcome = wait_for(check, timeout_s, what, interval=0.5)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last lines of {log_path}:\n{_tail(log_path)}") from None
        if outcome == "exited":
            raise AssertionError(
                f"{name} exited with status {proc.returncode} before {what}; last lines of {log_path}:\n"
                f"{_tail(log_path)}"
            )

    def _write_pki(self) -> None:
        pki_dir = self.workdir / "pki"
        if (pki_dir / "tokens.csv").exists():
            return
        pki_dir.mkdir(parents=True, exist_ok=True)
        pki = _make_pki()
        (pki_dir / "ca.crt").write_bytes(pki.ca_pem)
        (pki_dir / "apiserver.crt").write_bytes(pki.serving_cert_pem + pki.ca_pem)
        (pki_dir / "apiserver.key").write_bytes(pki.serving_key_pem)
        (pki_dir / "sa.key").write_bytes(pki.sa_key_pem)
        (pki_dir / "tokens.csv").write_text(
            f'{self.admin_token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n'
        )
        for key in ("apiserver.key", "sa.key", "tokens.csv"):
            (pki_dir / key).chmod(0o600)

    def _write_kubeconfig(self, path: Path, user: str, token: str, namespace: str = "default") -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "dam-test",
                    "cluster": {
                        "server": self.url,
                        "certificate-authority-data": base64.b64encode(self.ca_file.read_bytes()).decode(),
                    },
                }
            ],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [
                {"name": user, "context": {"cluster": "dam-test", "user": user, "namespace": namespace}}
            ],
            "current-context": user,
            "preferences": {},
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        path.chmod(0o600)
        return path

    # -- talking to the API

    def ssl_context(self) -> ssl.SSLContext:
        """Trusts the control plane's CA (for Python clients)."""
        if self._ssl is None:
            self._ssl = ssl.create_default_context(cafile=str(self.ca_file))
        return self._ssl

    def _request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        token: str | None = None,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
        timeout_s: float = 30.0,
    ) -> tuple[int, str]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {token or self.admin_token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        for key, value in (headers or {}).items():
            req.add_header(key, value)
        try:
            with urllib.request.urlopen(req, timeout=timeout_s, context=self.ssl_context()) as resp:
                return int(resp.status), resp.read().decode()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read().decode(errors="replace")

    def api(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        token: str | None = None,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
        ok: Sequence[int] = (200, 201, 202),
    ) -> Any:
        """One API call as admin (or with ``token``); the decoded JSON answer. Raises :class:`ApiError`."""
        status, text = self._request(
            method, path, body, token=token, content_type=content_type, headers=headers
        )
        if status not in ok:
            raise ApiError(method, path, status, text)
        return json.loads(text) if text else None

    def kubectl(
        self,
        *args: str,
        kubeconfig: Path | None = None,
        input: str | None = None,
        check: bool = True,
        timeout_s: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run the real kubectl against this control plane (admin unless ``kubeconfig``)."""
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        cmd = [str(self.binaries.kubectl), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args]
        done = subprocess.run(
            cmd, check=False, input=input, capture_output=True, text=True, timeout=timeout_s, env=env
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} failed ({done.returncode}):\n"
                f"{done.stderr.strip()}\n{done.stdout.strip()}"
            )
        return done

    # -- namespaces and identities

    def create_namespace(self, name: str, labels: dict[str, str] | None = None) -> str:
        """Create a namespace and its ``default`` ServiceAccount (no controller makes it here)."""
        meta: dict[str, Any] = {"name": name}
        if labels:
            meta["labels"] = labels
        self.api("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": meta})
        self.ensure_service_account(name, "default")
        return name

    def ensure_service_account(self, namespace: str, name: str) -> None:
        body = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}
        self.api("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", body, ok=(201, 409))

    def delete_namespace(self, name: str) -> None:
        """Delete everything in the namespace and the namespace itself, now.

        There is no namespace controller: this deletes each kind's objects (Pods with no grace
        period, finalizers removed), then finalizes the namespace so that it is really gone and
        watchers of the whole cluster do not keep seeing a test's objects.
        """
        ns = urllib.parse.quote(name)
        for base, plural in self._namespaced_collections():
            path = f"{base}/namespaces/{ns}/{plural}"
            options = {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0}
            deleted = self.api("DELETE", path, options, ok=(200, 404, 405)) or {}
            # The answer lists what was deleted; what has finalizers is still there, marked.
            for item in deleted.get("items", []):
                if item.get("metadata", {}).get("finalizers"):
                    self.api(
                        "PATCH",
                        f"{path}/{urllib.parse.quote(item['metadata']['name'])}",
                        {"metadata": {"finalizers": None}},
                        content_type="application/merge-patch+json",
                        ok=(200, 404),
                    )
        self.api("DELETE", f"/api/v1/namespaces/{ns}", ok=(200, 202, 404))
        current = self.api("GET", f"/api/v1/namespaces/{ns}", ok=(200, 404))
        if current and current.get("kind") == "Namespace":
            current.setdefault("spec", {})["finalizers"] = []
            self.api("PUT", f"/api/v1/namespaces/{ns}/finalize", current, ok=(200, 404, 409))

    def _namespaced_collections(self) -> list[tuple[str, str]]:
        """(group-version base path, plural) of every namespaced kind that can be deleted as a
        collection, from the aggregated discovery document (two requests; CRDs included)."""
        found: list[tuple[str, str]] = []
        accept = {"Accept": "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"}
        for root in ("/api", "/apis"):
            for group in self.api("GET", root, headers=accept).get("items", []):
                versions = group.get("versions") or []
                if not versions:
                    continue
                preferred = versions[0]  # listed in order of preference
                group_name = group.get("metadata", {}).get("name", "")
                base = (
                    f"/apis/{group_name}/{preferred['version']}"
                    if group_name
                    else f"/api/{preferred['version']}"
                )
                for r in preferred.get("resources", []):
                    if r.get("scope") == "Namespaced" and "deletecollection" in r.get("verbs", []):
                        found.append((base, r["resource"]))
        # Pods first, so that nothing that owns them is left to matter.
        found.sort(key=lambda item: (item[1] != "pods", item))
        return found

    def service_account_token(self, namespace: str, name: str, expiration_s: int = 3600) -> str:
        """A bound token for the ServiceAccount from the TokenRequest API (``kubectl create token``)."""
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": expiration_s},
        }
        answer = self.api("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", body)
        return str(answer["status"]["token"])

    def service_account_kubeconfig(
        self,
        namespace: str,
        name: str,
        path: Path | None = None,
        *,
        create: bool = True,
        expiration_s: int = 3600,
    ) -> Path:
        """A kubeconfig that authenticates as ``system:serviceaccount:<namespace>:<name>`` (token).

        Creates the ServiceAccount first unless ``create=False``. Grants nothing: bind Roles yourself.
        """
        if create:
            self.ensure_service_account(namespace, name)
        token = self.service_account_token(namespace, name, expiration_s)
        path = path or self.workdir / "kubeconfigs" / f"{namespace}.{name}.kubeconfig"
        return self._write_kubeconfig(path, f"{namespace}.{name}", token, namespace=namespace)

    # -- pods without a kubelet

    def mark_pod_running(
        self, namespace: str, name: str, *, pod_ip: str = "127.0.0.1", host_ip: str = "127.0.0.1"
    ) -> dict[str, Any]:
        """Write the status a kubelet would write for a started Pod, through ``pods/status``.

        Phase Running, Ready, ``podIP``, a running status for each container (and each sidecar
        init container with ``restartPolicy: Always``; other init containers completed).
        Returns the Pod as the server stored it.
        """
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        pod = self.api("GET", path)
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

        def running(container: dict[str, Any]) -> dict[str, Any]:
            return {
                "name": container["name"],
                "image": container.get("image", ""),
                "imageID": "",
                "containerID": f"containerd://{secrets.token_hex(32)}",
                "ready": True,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": now}},
            }

        def init_status(container: dict[str, Any]) -> dict[str, Any]:
            if container.get("restartPolicy") == "Always":
                return running(container)
            done = running(container) | {"ready": True, "started": False}
            done["state"] = {
                "terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}
            }
            return done

        spec = pod["spec"]
        conditions = [
            {"type": kind, "status": "True", "lastTransitionTime": now}
            for kind in (
                "PodReadyToStartContainers",
                "Initialized",
                "Ready",
                "ContainersReady",
                "PodScheduled",
            )
        ]
        status = {
            "phase": "Running",
            "conditions": conditions,
            "hostIP": host_ip,
            "hostIPs": [{"ip": host_ip}],
            "podIP": pod_ip,
            "podIPs": [{"ip": pod_ip}],
            "startTime": now,
            "qosClass": pod.get("status", {}).get("qosClass", "BestEffort"),
            "containerStatuses": [running(c) for c in spec.get("containers", [])],
            "initContainerStatuses": [init_status(c) for c in spec.get("initContainers", [])],
        }
        result: dict[str, Any] = self.api(
            "PATCH", f"{path}/status", {"status": status}, content_type="application/merge-patch+json"
        )
        return result

    def namespace_name_for(self, text: str) -> str:
        """A fresh, valid namespace name derived from ``text`` (e.g. a test's name)."""
        return f"{_dns_label(text, 50)}-{secrets.token_hex(3)}"

    def objects(self, path: str) -> Iterator[dict[str, Any]]:
        """The items of a list path, e.g. ``/api/v1/namespaces/ns/pods``."""
        yield from self.api("GET", path).get("items", [])
