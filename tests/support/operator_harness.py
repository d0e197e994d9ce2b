"""The real ``dam operator`` against the real control plane (:mod:`tests.support.kubecluster`),
with the RBAC that ``charts/dam-operator`` renders, and the kubelet's part for a training pod
(real ``dam sidecar`` + real PyTorch training on 127.0.0.1).

- :func:`install_chart` renders the chart with the real Helm engine (helm-python-sdk), applies only
  its ServiceAccount and (Cluster)Roles and bindings, and gives a kubeconfig holding that
  ServiceAccount's token (TokenRequest) plus the operator's ``DAM_*`` settings from the chart's
  Deployment: the operator then runs with exactly the rights and settings the chart gives it.
- :class:`OperatorProcess` runs ``dam operator`` as a child process with a kubeconfig (admin unless
  told otherwise); its webhook listens on 127.0.0.1 and is registered by URL.
- :class:`LocalPod` plays the kubelet for one instrumented pod: ``dam probe-install``, ``dam
  sidecar`` and the training command with the env the webhook injected.

Used by tests/integration/test_operator_*.py and test_webhook_real_server.py.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.support.kubecluster import ControlPlane
from tests.support.procs import free_port, spawn, stop_process, wait_for

__all__ = [
    "BIN",
    "CHART",
    "REPO",
    "ChartInstall",
    "InProcessOperator",
    "LocalPod",
    "OperatorProcess",
    "apply",
    "condition",
    "dumps",
    "ensure_crds",
    "events_for",
    "free_port",
    "install_chart",
    "operator_namespace",
    "profile_of",
    "render_chart",
    "wait_for",
]

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CHART = REPO / "charts" / "dam-operator"
PROBE_DIR_IN_POD = "/dam/probe"  # dam_operator.cluster.steps.injection.PROBE_DIR
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration"}
GROUP_PATH = "/apis/dam.mlsys.dev/v1alpha1"


# ---------------------------------------------------------------- the chart's RBAC on the real server


def render_chart(values: Mapping[str, Any], *, release: str, namespace: str) -> list[dict[str, Any]]:
    """The chart's objects, rendered by the real Helm engine."""
    import helm_python as helm  # optional dev dependency: imported when a test needs it

    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(dict(values), name=release, namespace=namespace, is_install=True)
    objects: list[dict[str, Any]] = []
    for text in manifests.values():
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


def _api_path(obj: Mapping[str, Any]) -> str:
    kind, meta = obj["kind"], obj["metadata"]
    plural = {
        "ServiceAccount": "serviceaccounts",
        "ClusterRole": "clusterroles",
        "ClusterRoleBinding": "clusterrolebindings",
        "Role": "roles",
        "RoleBinding": "rolebindings",
        "MutatingWebhookConfiguration": "mutatingwebhookconfigurations",
    }[kind]
    base = "/api/v1" if obj["apiVersion"] == "v1" else f"/apis/{obj['apiVersion']}"
    if kind in CLUSTER_SCOPED:
        return f"{base}/{plural}/{meta['name']}"
    return f"{base}/namespaces/{meta['namespace']}/{plural}/{meta['name']}"


@dataclass
class ChartInstall:
    """What :func:`install_chart` put on the server, and how to run the operator as the chart would."""

    cp: ControlPlane
    release: str
    namespace: str
    objects: list[dict[str, Any]]
    kubeconfig: Path
    applied: list[dict[str, Any]] = field(default_factory=list)

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    @property
    def service_account(self) -> str:
        return str(self.of_kind("ServiceAccount")[0]["metadata"]["name"])

    @property
    def username(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"

    def env(self) -> dict[str, str]:
        """The ``DAM_*`` variables the chart's Deployment gives the operator (fieldRefs resolved)."""
        (deployment,) = self.of_kind("Deployment")
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        env: dict[str, str] = {}
        for item in container.get("env", []):
            name = item["name"]
            if not name.startswith("DAM_"):
                continue
            if "value" in item:
                env[name] = str(item["value"])
            elif item.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.namespace":
                env[name] = self.namespace
        return env

    def webhook_configuration(self, url: str) -> dict[str, Any]:
        """The chart's MutatingWebhookConfiguration, pointed at ``url`` instead of its Service.

        The only change: there is no Service routing on a control plane without nodes, and an
        API server refuses Endpoints on loopback, so the webhook is reached by URL.
        """
        (mwc,) = self.of_kind("MutatingWebhookConfiguration")
        mwc = copy.deepcopy(mwc)
        for hook in mwc["webhooks"]:
            hook["clientConfig"] = {"url": url}
        return mwc

    def apply(self, obj: Mapping[str, Any]) -> None:
        self.cp.kubectl("apply", "-f", "-", input=json.dumps(obj))
        self.applied.append(dict(obj))

    def uninstall(self) -> None:
        """Delete what was applied (cluster-scoped objects would outlive the test's namespaces)."""
        for obj in reversed(self.applied):
            self.cp.api("DELETE", _api_path(obj), ok=(200, 202, 404))
        self.applied.clear()


def install_chart(
    cp: ControlPlane,
    namespace: str,
    values: Mapping[str, Any] | None = None,
    *,
    release: str | None = None,
    without: Mapping[tuple[str, str], set[str]] | None = None,
) -> ChartInstall:
    """Render the chart (release namespace ``namespace``), apply its RBAC objects as admin, and
    write a kubeconfig with a token of the chart's ServiceAccount.

    ``release`` defaults to a fresh name, so that the ClusterRole and its binding of one test never
    meet another's. ``without={(apiGroup, resource): {verbs}}`` removes verbs from the rendered
    rules (to show that a missing verb is noticed).
    """
    release = release or f"dam-{secrets.token_hex(3)}"
    objects = render_chart(values or {}, release=release, namespace=namespace)
    install = ChartInstall(cp, release, namespace, objects, kubeconfig=Path())
    for rendered in objects:
        if rendered["kind"] not in RBAC_KINDS:
            continue
        obj = copy.deepcopy(rendered)
        for rule in obj.get("rules", []):
            for (group, resource), verbs in (without or {}).items():
                if group in rule["apiGroups"] and resource in rule["resources"]:
                    rule["verbs"] = [v for v in rule["verbs"] if v not in verbs]
        if "rules" in obj:
            obj["rules"] = [r for r in obj["rules"] if r["verbs"]]
        install.apply(obj)
    install.kubeconfig = cp.service_account_kubeconfig(namespace, install.service_account, create=False)
    return install


# ---------------------------------------------------------------- the operator as a child process


class OperatorProcess:
    """``dam operator`` as a child process: standalone, its webhook on 127.0.0.1 registered by URL.

    ``namespace``: the watched namespace (None: cluster-wide). ``kubeconfig``: whose rights it has
    (default the admin's). ``env``: more ``DAM_*`` settings (e.g. :meth:`ChartInstall.env`).
    The MutatingWebhookConfiguration gets a name of its own unless ``env`` names one.
    """

    def __init__(
        self,
        cp: ControlPlane,
        workdir: Path,
        *,
        namespace: str | None,
        operator_namespace: str,
        kubeconfig: Path | None = None,
        webhook: bool = True,
        env: Mapping[str, str] | None = None,
        python_args: tuple[str, ...] = (),
    ) -> None:
        self.cp = cp
        self.workdir = workdir
        self.namespace = namespace
        self.operator_namespace = operator_namespace
        self.kubeconfig = kubeconfig or cp.kubeconfig
        self.webhook = webhook
        self.webhook_port = free_port()
        self.metrics_port = free_port()
        self.extra_env = dict(env or {})
        self.webhook_configuration = self.extra_env.setdefault(
            "DAM_WEBHOOK_CONFIGURATION_NAME", f"dam-test-{secrets.token_hex(3)}"
        )
        self.python_args = python_args
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def webhook_url(self) -> str:
        return f"https://127.0.0.1:{self.webhook_port}/mutate-pods"

    @property
    def log_path(self) -> Path:
        return self.workdir / f"operator-{self.starts}.log"

    def command(self) -> list[str]:
        cmd = [sys.executable, *self.python_args, "-m", "dam_operator.cli", "operator"]
        cmd += ["-n", self.namespace] if self.namespace else ["-A"]
        cmd += ["--standalone", "--metrics-port", str(self.metrics_port), "--liveness", ""]
        if self.webhook:
            cmd += ["--webhook-url", self.webhook_url, "--webhook-host", "127.0.0.1"]
            cmd += ["--webhook-port", str(self.webhook_port)]
        else:
            cmd += ["--no-webhook"]
        return cmd

    def environment(self) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith("DAM_")}
        return {
            **base,
            "KUBECONFIG": str(self.kubeconfig),
            "DAM_OPERATOR_NAMESPACE": self.operator_namespace,
            "DAM_DEFAULT_SIDECAR_IMAGE": "ghcr.io/mlsys/dam-operator:test",
            "PYTHONUNBUFFERED": "1",
            **self.extra_env,
        }

    def start(self, wait: bool = True) -> OperatorProcess:
        self.starts += 1
        log = open(self.log_path, "wb")  # noqa: SIM115 - closed with the process
        self.proc = spawn(
            self.command(), cwd=REPO, env=self.environment(), stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        if wait:
            self.wait_ready()
        return self

    def webhook_registered(self) -> bool:
        """The MutatingWebhookConfiguration exists and carries a caBundle (read as admin)."""
        mwc = self.cp.api(
            "GET",
            f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{self.webhook_configuration}",
            ok=(200, 404),
        )
        hooks = (mwc or {}).get("webhooks") or []
        return bool(hooks and hooks[0].get("clientConfig", {}).get("caBundle"))

    def wait_ready(self, timeout: float = 60.0) -> None:
        def ready() -> bool:
            self.assert_alive()
            r = httpx.get(f"http://127.0.0.1:{self.metrics_port}/healthz", timeout=2)
            return r.status_code == 200 and (not self.webhook or self.webhook_registered())

        wait_for(ready, timeout, "the operator to serve /healthz (and register its webhook)")
        # kopf is watching once it has listed the profiles and pods: a short grace for that.
        time.sleep(1.0)

    def assert_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"the operator exited ({self.proc.returncode}):\n{self.log()}")

    def metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).text

    def log(self) -> str:
        return "\n".join(
            p.read_text(errors="replace")[-8000:] for p in sorted(self.workdir.glob("operator-*.log"))
        )

    def kill(self) -> None:
        """SIGKILL: no clean-up, like an OOM kill or a node loss."""
        if self.proc is not None:
            stop_process(self.proc, signal.SIGKILL)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)

    def remove_webhook_configuration(self) -> None:
        """Delete this operator's MutatingWebhookConfiguration (cluster-scoped: it would outlive
        the test and send other tests' pods to a closed port)."""
        self.cp.api(
            "DELETE",
            f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{self.webhook_configuration}",
            ok=(200, 404),
        )

    def close(self) -> None:
        self.stop()
        self.remove_webhook_configuration()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid


@contextlib.contextmanager
def log_on_failure(op: OperatorProcess) -> Iterator[OperatorProcess]:
    """The block with ``op`` running: an AssertionError in it prints the operator's log first; the
    operator is closed after it, whatever happened."""
    try:
        yield op
    except AssertionError:
        print(op.log())
        raise
    finally:
        op.close()


@contextlib.contextmanager
def operator_namespace(cp: ControlPlane) -> Iterator[str]:
    """A fresh namespace for the operator itself (its certificate Secret), deleted afterwards."""
    name = cp.create_namespace(cp.namespace_name_for("dam-system"))
    try:
        yield name
    finally:
        if cp.running:
            cp.delete_namespace(name)


# ---------------------------------------------------------------- the operator in this process


class InProcessOperator:
    """``run_operator`` on its own event loop in a thread of the test process, so that a test can
    replace a function the operator calls (``monkeypatch``). A context manager; ``stop()`` ends it
    as a signal would (kopf's ``stop_flag``)."""

    def __init__(self, settings: Any, cp: ControlPlane, kubeconfig: Path | None = None) -> None:
        self.settings = settings
        self.cp = cp
        self.kubeconfig = kubeconfig or cp.kubeconfig
        self._thread = threading.Thread(target=self._run, name="dam-operator", daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self.error: BaseException | None = None

    def login(self) -> Any:
        import kopf

        config = yaml.safe_load(self.kubeconfig.read_text())
        cluster = config["clusters"][0]["cluster"]
        user = config["users"][0]["user"]
        return kopf.ConnectionInfo(
            server=cluster["server"],
            ca_data=base64.b64decode(cluster["certificate-authority-data"])
            if "certificate-authority-data" in cluster
            else None,
            token=user.get("token"),
        )

    def _run(self) -> None:
        from dam_operator.cluster.runtime.main import run_operator

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            ready = asyncio.Event()
            waiter = asyncio.create_task(ready.wait())
            waiter.add_done_callback(lambda _: self._ready.set())
            try:
                await run_operator(self.settings, login=self.login, stop_flag=self._stop, ready_flag=ready)
            finally:
                waiter.cancel()
                # TLS connections the API server kept open to the webhook are closed with a
                # close_notify exchange: let it finish before the loop closes (no leaked sockets).
                await asyncio.sleep(0.5)

        try:
            asyncio.run(main())
        except BaseException as exc:
            self.error = exc
        finally:
            self._ready.set()

    def __enter__(self) -> InProcessOperator:
        self._thread.start()
        if not self._ready.wait(60) or self.error is not None:
            raise AssertionError(f"the operator did not start: {self.error!r}")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.settings.metrics_port}/metrics", timeout=5).text


MWC_PATH = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


@contextlib.contextmanager
def webhook_operator(cp: ControlPlane, timeout_seconds: int) -> Iterator[InProcessOperator]:
    """A cluster-wide operator in this process serving the Pod webhook on 127.0.0.1 (a self-signed
    certificate, ``timeout_seconds`` for the API server's call); its MutatingWebhookConfiguration
    is deleted afterwards, and it must have ended without an error."""
    from dam_operator.cluster.settings import OperatorSettings

    ensure_crds(cp)
    port = free_port()
    with operator_namespace(cp) as system:
        settings = OperatorSettings(
            namespace=None,
            operator_namespace=system,
            webhook_url=f"https://127.0.0.1:{port}/mutate-pods",
            webhook_host="127.0.0.1",
            webhook_port=port,
            webhook_configuration_name=f"{system}-webhook",
            webhook_timeout_seconds=timeout_seconds,
            cert_mode="self-signed",
            metrics_host="127.0.0.1",
            metrics_port=free_port(),
            liveness_endpoint=None,
            default_sidecar_image="ghcr.io/mlsys/dam-operator:test",
        )
        running = InProcessOperator(settings, cp)
        try:
            with running:
                yield running
        finally:
            cp.api("DELETE", f"{MWC_PATH}/{settings.webhook_configuration_name}", ok=(200, 404))
            assert running.error is None, running.error


# ---------------------------------------------------------------- reading the API


def ensure_crds(cp: ControlPlane) -> None:
    """``kubectl apply -f crds/`` (idempotent) and wait until the CRDs are Established."""
    cp.kubectl("apply", "-f", str(REPO / "crds"))
    wait_established(cp, "damprofiles.dam.mlsys.dev")


def wait_established(cp: ControlPlane, name: str, timeout_s: float = 60.0) -> None:
    """Polls the CRD until its Established condition is True. Not ``kubectl wait``: v1.34's fails
    at once (".status.conditions accessor error: <nil>") when it reads the CRD before the API
    server's controller wrote any condition, which a busy machine makes likely (make test, right
    after the node tier)."""

    def established() -> bool:
        crd = cp.api("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        conditions = (crd.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)

    wait_for(established, timeout_s, f"crd/{name} Established")


def apply(cp: ControlPlane, namespace: str, manifest: str) -> None:
    """``kubectl apply -n namespace -f -`` as admin; fails the test when kubectl does."""
    cp.kubectl("apply", "-n", namespace, "-f", "-", input=manifest)


def damprofile(
    name: str,
    labels: Mapping[str, str],
    *,
    port: int,
    window_seconds: float = 5,
    hysteresis_windows: int | None = 1,
    inject: bool = True,
    evaluation: Mapping[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A DAMProfile selecting pods by ``labels``, scraped every second on ``port``; ``evaluation``
    adds to (or, with ``hysteresis_windows=None``, stands without) the window and hysteresis;
    ``spec`` adds top-level spec fields (``actions=...``)."""
    judged: dict[str, Any] = {"windowSeconds": window_seconds}
    if hysteresis_windows is not None:
        judged["hysteresisWindows"] = hysteresis_windows
    sidecar: dict[str, Any] = {"port": port} if inject else {"inject": False, "port": port}
    return {
        "apiVersion": "dam.mlsys.dev/v1alpha1",
        "kind": "DAMProfile",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": dict(labels)},
            "sampling": {"intervalSeconds": 1},
            "evaluation": {**judged, **(evaluation or {})},
            **spec,
            "sidecar": sidecar,
        },
    }


def profile_of(cp: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = cp.api("GET", f"{GROUP_PATH}/namespaces/{namespace}/damprofiles/{name}")
    return found


def events_for(
    cp: ControlPlane, namespace: str, name: str, reason: str | None = None
) -> list[dict[str, Any]]:
    """The core/v1 Events about DAMProfile ``name`` (with ``reason``, if given)."""
    selector = f"involvedObject.name={name},involvedObject.kind=DAMProfile"
    if reason is not None:
        selector += f",reason={reason}"
    listed = cp.api("GET", f"/api/v1/namespaces/{namespace}/events?fieldSelector={selector}")
    return list(listed.get("items", []))


def condition(obj: Mapping[str, Any], type_: str) -> dict[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return dict(c)
    return None


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=1, sort_keys=True)[:4000]


# ---------------------------------------------------------------- playing the kubelet


def container_env(pod: Mapping[str, Any], container: str) -> dict[str, str]:
    for c in pod["spec"].get("containers", []):
        if c["name"] == container:
            return {e["name"]: e.get("value", "") for e in c.get("env", [])}
    raise KeyError(container)


class LocalPod:
    """Runs an instrumented pod's processes here: ``dam probe-install``, ``dam sidecar`` and the
    training command, with the injected env and the pod's probe directory mapped to a local one."""

    def __init__(
        self, pod: Mapping[str, Any], workdir: Path, sidecar_port: int, container: str = "train"
    ) -> None:
        self.pod = pod
        self.workdir = workdir
        self.port = sidecar_port
        self.container = container
        self.probe_dir = workdir / "probe"
        self.procs: list[subprocess.Popen[bytes]] = []

    def _map(self, value: str) -> str:
        return value.replace(PROBE_DIR_IN_POD, str(self.probe_dir))

    def env(self) -> dict[str, str]:
        injected = {k: self._map(v) for k, v in container_env(self.pod, self.container).items()}
        return {**os.environ, **injected}

    def start(self, train_args: list[str]) -> None:
        self.probe_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run([str(BIN / "dam"), "probe-install", str(self.probe_dir), "-q"], check=True, timeout=60)
        sidecar_log = open(self.workdir / "sidecar.log", "wb")  # noqa: SIM115
        self.procs.append(
            spawn(
                [
                    *(str(BIN / "dam"), "sidecar", "--host", "127.0.0.1", "--port", str(self.port)),
                    *("--probe-dir", str(self.probe_dir), "--interval", "1"),
                ],
                stdout=sidecar_log,
                stderr=subprocess.STDOUT,
            )
        )
        train_log = open(self.workdir / "train.log", "wb")  # noqa: SIM115
        self.procs.append(
            spawn(
                [sys.executable, *train_args],
                cwd=REPO,
                env=self.env(),
                stdout=train_log,
                stderr=subprocess.STDOUT,
            )
        )
        sidecar_log.close()
        train_log.close()

    def wait_reporting(self, timeout: float = 90.0) -> None:
        """Until the sidecar serves the probe's step counter (the training loop is running)."""

        def steps() -> bool:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise AssertionError(f"a pod process exited early:\n{self.logs()}")
            text = httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=2).text
            return any(
                line.startswith("dam_steps_total") and not line.endswith(" 0.0") for line in text.splitlines()
            )

        wait_for(steps, timeout, "the sidecar to report training steps", interval=0.5)

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted(self.workdir.glob("*.log"))
            if not p.name.startswith("operator-")
        )

    def stop(self) -> None:
        for proc in reversed(self.procs):
            stop_process(proc)


@dataclass(frozen=True)
class RankProcesses:
    trainer: subprocess.Popen[bytes]
    sidecar: subprocess.Popen[bytes]


def start_rank(
    workdir: Path,
    *,
    rank: int,
    world_size: int,
    master_port: int,
    command: list[str],
    host: str,
    sidecar_port: int,
    log_name: str,
) -> RankProcesses:
    """One rank of a ``torch.distributed`` job run here as its "pod" would run it: the probe
    installed in its own directory, the training ``command`` (RANK, WORLD_SIZE, MASTER_ADDR/PORT)
    and a real ``dam sidecar`` on ``host`` (a loopback address of its own, the pod IP the test
    reports through pods/status); both log to ``workdir/LOG_NAME.log``."""
    probe_dir = workdir / f"probe-{rank}"
    subprocess.run(
        [sys.executable, "-m", "dam_operator.cli", "probe-install", str(probe_dir), "-q"],
        check=True,
        timeout=60,
    )
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("DAM_")},
        "PYTHONPATH": str(probe_dir),
        "DAM_PROBE_DIR": str(probe_dir),
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(master_port),
    }
    with open(workdir / f"{log_name}.log", "wb") as log:
        trainer = spawn(command, env=env, stdout=log, stderr=log)
        sidecar = spawn(
            [
                *(sys.executable, "-m", "dam_operator.cli", "sidecar"),
                *("--host", host, "--port", str(sidecar_port), "--probe-dir", str(probe_dir)),
                *("--interval", "1"),
            ],
            stdout=log,
            stderr=log,
        )
    return RankProcesses(trainer, sidecar)
