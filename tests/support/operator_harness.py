"""Runs the real ``dam operator`` as a child process against the API stand-in, and plays
the kubelet for a training pod (real ``dam sidecar`` + real PyTorch training).

Used by tests/integration/test_operator_e2e.py, test_operator_faults.py and
benchmarks/operator_scale.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx

from tests.support.procs import free_port, stop_process, wait_for
from tests.support.standin import StandIn

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
OPERATOR_NAMESPACE = "dam-system"
PROBE_DIR_IN_POD = "/dam/probe"  # dam_operator.cluster.injection.PROBE_DIR

T = TypeVar("T")


def ensure_namespace(api: StandIn, name: str) -> None:
    with contextlib.suppress(Exception):
        api.create("namespaces", {"metadata": {"name": name}})


class OperatorProcess:
    """``dam operator`` against the stand-in: standalone, one namespace, webhook on 127.0.0.1."""

    def __init__(
        self,
        api: StandIn,
        workdir: Path,
        *,
        namespace: str = "default",
        webhook: bool = True,
        env: dict[str, str] | None = None,
        python_args: tuple[str, ...] = (),
    ) -> None:
        self.api = api
        self.workdir = workdir
        self.namespace = namespace
        self.webhook = webhook
        self.webhook_port = free_port()
        self.metrics_port = free_port()
        self.extra_env = env or {}
        self.python_args = python_args
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        ensure_namespace(api, OPERATOR_NAMESPACE)

    @property
    def webhook_url(self) -> str:
        return f"https://127.0.0.1:{self.webhook_port}/mutate-pods"

    @property
    def log_path(self) -> Path:
        return self.workdir / f"operator-{self.starts}.log"

    def command(self) -> list[str]:
        cmd = [sys.executable, *self.python_args, "-m", "dam_operator.cli", "operator", "-n", self.namespace]
        cmd += ["--standalone", "--metrics-port", str(self.metrics_port), "--liveness", ""]
        if self.webhook:
            cmd += ["--webhook-url", self.webhook_url, "--webhook-host", "127.0.0.1"]
            cmd += ["--webhook-port", str(self.webhook_port)]
        else:
            cmd += ["--no-webhook"]
        return cmd

    def start(self, wait: bool = True) -> OperatorProcess:
        self.starts += 1
        env = {
            **self.api.env(),
            "DAM_OPERATOR_NAMESPACE": OPERATOR_NAMESPACE,
            "DAM_DEFAULT_SIDECAR_IMAGE": "ghcr.io/mlsys/dam-operator:test",
            "PYTHONUNBUFFERED": "1",
            **self.extra_env,
        }
        log = open(self.log_path, "wb")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(self.command(), cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"the operator exited ({self.proc.returncode}):\n{self.log()}")
            r = httpx.get(f"http://127.0.0.1:{self.metrics_port}/healthz", timeout=2)
            if r.status_code != 200:
                return False
            if self.webhook:
                return self.api.kubectl("get", "mutatingwebhookconfiguration", "dam-operator").returncode == 0
            return True

        wait_for(ready, timeout, "the operator to serve /healthz")
        # kopf is watching once it has seen the profiles list; a short grace for its first listing.
        time.sleep(1.0)

    def metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).text

    def log(self) -> str:
        return "\n".join(
            p.read_text(errors="replace")[-6000:] for p in sorted(self.workdir.glob("operator-*.log"))
        )

    def kill(self) -> None:
        """SIGKILL: no cleanup, like an OOM kill or a node loss."""
        if self.proc is not None:
            stop_process(self.proc, signal.SIGKILL)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid


@contextlib.contextmanager
def operator_running(api: StandIn, workdir: Path, **kw: Any) -> Iterator[OperatorProcess]:
    op = OperatorProcess(api, workdir, **kw).start()
    try:
        yield op
    finally:
        op.stop()


# ---------------------------------------------------------------- playing the kubelet


def container_env(pod: dict[str, Any], container: str) -> dict[str, str]:
    for c in pod["spec"].get("containers", []):
        if c["name"] == container:
            return {e["name"]: e.get("value", "") for e in c.get("env", [])}
    raise KeyError(container)


def set_pod_running(api: StandIn, namespace: str, name: str, ip: str = "127.0.0.1") -> None:
    api.patch(
        "pods",
        namespace,
        name,
        {"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}},
        subresource="status",
    )


class LocalPod:
    """Runs an instrumented pod's processes here: ``dam probe-install``, ``dam sidecar`` and the
    training command, with the injected env and the pod's probe directory mapped to a local one."""

    def __init__(
        self, pod: dict[str, Any], workdir: Path, sidecar_port: int, container: str = "train"
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
            subprocess.Popen(
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
            subprocess.Popen(
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
        )

    def stop(self) -> None:
        for proc in reversed(self.procs):
            stop_process(proc)


def events_for(api: StandIn, namespace: str, name: str, reason: str | None = None) -> list[dict[str, Any]]:
    items = api.list("events", namespace)
    return [
        e
        for e in items
        if (e.get("involvedObject") or {}).get("name") == name
        and (e.get("involvedObject") or {}).get("kind") == "DAMProfile"
        and (reason is None or e.get("reason") == reason)
    ]


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return dict(c)
    return None


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=1, sort_keys=True)[:4000]
