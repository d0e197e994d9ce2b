"""A real one-node Kubernetes cluster on this machine: etcd + kube-apiserver (from
:mod:`dam_cluster.controlplane`) + kube-controller-manager + kube-scheduler + containerd + a CNI
bridge + kubelet, all bound to 127.0.0.1, Pods on a bridge this module makes.

Used by ``make cluster`` / ``make cluster-down`` (``python -m dam_cluster up|down|status``, with
tools/node on ``PYTHONPATH``) and by the tests' session fixture ``node_cluster``
(tests/support/node_fixtures.py). One node per machine at a time (the bridge, the relay namespace and
the cgroup root have fixed names); its state is in ``/run/dam-node/state.json`` so that ``down`` can
remove everything without the process that started it, and what it removes is checked against a
listing of the machine before the start (:mod:`dam_cluster.footprint`).

The network (no traffic to any address but 127.0.0.0/8 and the Pods' own bridge):

    host netns                      bridge damnode0 (10.244.0.254/24)   netns dam-node-relay
    kube-apiserver 127.0.0.1:P  <-- relay process  -------------------  10.244.0.1/24 (the Pods' gateway)
    kubelet 127.0.0.1:K                                                 10.0.0.1:443 (`kubernetes` Service)
                                    Pods 10.244.0.10-250 (CNI bridge)   10.0.0.10:53 (cluster DNS)

- No kube-proxy: the one Service address Pods need, the `kubernetes` Service's ClusterIP (what the
  kubelet puts in KUBERNETES_SERVICE_HOST/PORT), is a local address of the relay namespace, the
  Pods' default gateway; tools/node/relay.py accepts there and connects to the API server on the
  host's 127.0.0.1 (one process, sockets in both namespaces). The API server's serving certificate
  names 10.0.0.1 and kubernetes.default.svc (controlplane._make_pki).
- The relay namespace does not forward (a new namespace starts with ip_forward=0) and the host's
  ip_forward stays as it is: a packet for any other address goes nowhere.
- The API server reaches webhook Pods by their address (``--enable-aggregator-routing=true``: a
  Service is resolved to an endpoint, not its ClusterIP) from the host's address on the bridge.

Facts of this machine kind it relies on (tested by hand first, issue 18): kubelet refuses
``--node-ip=127.0.0.1``, and ``--hostname-override=127.0.0.1`` without ``--node-ip`` gives the node
InternalIP 127.0.0.1; cgroup v1 needs ``failCgroupV1: false`` and ``cgroupDriver: cgroupfs``; the
VM's capability bounding set lacks CAP_SYS_RESOURCE, so runc cannot raise oom_score_adj and
containerd's CRI needs ``restrict_oom_score_adj = true``; containerd 1.6 lacks the RuntimeConfig
call, so the kubelet uses its configured cgroup driver; no registry: images are imported from OCI
archives (tools/image/build.sh), the pause image included, under the name ``sandbox_image`` gives.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from dam_cluster.controlplane import (
    REPO,
    ControlPlane,
    KubeBinaries,
    KubeBinariesMissingError,
    find_kube_binaries,
)
from dam_cluster.procs import free_port, wait_for

BUILD_SCRIPT = REPO / "tools" / "kube-bin" / "build.sh"
IMAGE_SCRIPT = REPO / "tools" / "image" / "build.sh"
RELAY_SCRIPT = REPO / "tools" / "node" / "relay.py"
STATE_FILE = Path("/run/dam-node/state.json")
CLUSTER_DIR = Path(os.environ.get("DAM_CLUSTER_DIR", "/var/lib/dam-node"))  # `make cluster`'s

NODE_NAME = "127.0.0.1"
BRIDGE = "damnode0"
RELAY_NETNS = "dam-node-relay"
RELAY_VETH = "damrelay0"
RELAY_VETH_PEER = "damrelay1"
POD_SUBNET = "10.244.0.0/24"
POD_GATEWAY = "10.244.0.1"  # the relay namespace's address on the bridge
HOST_ON_BRIDGE = "10.244.0.254"  # the host's address on the bridge (API server -> webhook, kubelet probes)
KUBERNETES_SERVICE_IP = "10.0.0.1"  # first address of controlplane.SERVICE_CLUSTER_IP_RANGE
CLUSTER_DNS_IP = "10.0.0.10"
CLUSTER_DOMAIN = "cluster.local"
CGROUP_ROOT = "dam-node"  # /sys/fs/cgroup/<controller>/dam-node/kubepods/...
SANDBOX_IMAGE = "registry.k8s.io/pause:3.10.1"  # tools/image/build.sh names the pause image so
CNI_NETWORK = "dam-node"
# What kubelet's setupKernelTunables writes (pkg/kubelet/cm/container_manager_linux.go): restored on down.
KUBELET_SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
# Directories the kubelet, containerd's CRI and libcni use whatever they are told: removed on down when
# they were not there before and are empty then.
HARD_CODED_DIRS = ("/var/log/containers", "/var/lib/cni/results", "/var/lib/cni", "/var/run/netns")
# Trees the kubelet and containerd write into whatever they are told (their paths are compiled in):
# what is in them after the start and was not before is removed on down.
# - /var/lib/kubelet/device-plugins/: the device-plugin registration socket and its checkpoint
#   (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1 DevicePluginPath, not under --root-dir).
# - /run/containerd/s/: the runc shims' sockets (containerd 1.6 runtime/v2/shim: socketRoot is
#   defaults.DefaultStateDir, not the configured state). runc's own state goes to the shim's Root
#   option, set in config.toml under the node's directory.
HARD_CODED_TREES = ("/var/lib/kubelet", "/run/containerd")
# The chains the kubelet makes for "other components" when makeIPTablesUtilChains is true (kubelet's
# pkg/kubelet/kubelet_network_linux.go: KUBE-IPTABLES-HINT in mangle, KUBE-FIREWALL in filter, hooked
# into INPUT and OUTPUT with a DROP of non-local sources to 127.0.0.0/8, and the KUBE-KUBELET-CANARY it
# monitors in mangle, nat and filter, for iptables and ip6tables). The node sets it false (there is no
# kube-proxy to read them); down removes any that a run made anyway.
KUBELET_CHAINS = ("KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT")
IPTABLES_TABLES = ("filter", "nat", "mangle")
READY_TIMEOUT_S = 120.0
HOW_TO_GET = "build them once with `make kube-bin` and `make image` (run `make system-deps` first)"


class NodeUnavailableError(RuntimeError):
    """A node cannot be started here (what is missing is in the message)."""


@dataclass(frozen=True)
class NodeBinaries:
    kube: KubeBinaries
    containerd: Path
    ctr: Path
    runc: Path
    cni_bin_dir: Path

    def of(self, name: str) -> Path:
        return self.kube.directory / name


def find_node_binaries() -> NodeBinaries:
    """The five Kubernetes binaries (``build.sh --no-build --node``), containerd, runc, the CNI plugins."""
    if os.geteuid() != 0:
        raise NodeUnavailableError("a node needs root (kubelet, containerd, network namespaces, cgroups)")
    done = subprocess.run(
        [str(BUILD_SCRIPT), "--no-build", "--node"], capture_output=True, text=True, timeout=120, check=False
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        why = (done.stderr.strip().splitlines() or [f"{BUILD_SCRIPT} exited {done.returncode}"])[-1]
        raise NodeUnavailableError(why.removeprefix("kube-bin: "))
    try:
        kube = find_kube_binaries()
    except KubeBinariesMissingError as exc:
        raise NodeUnavailableError(str(exc)) from exc
    kube = KubeBinaries(directory=Path(lines[-1]), kubectl=kube.kubectl)
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    found: dict[str, Path] = {}
    for name in ("containerd", "ctr", "runc"):
        where = shutil.which(name, path=path)
        if where is None:
            raise NodeUnavailableError(f"no {name}: run `make system-deps` (Debian's containerd, runc)")
        found[name] = Path(where)
    cni = Path("/usr/lib/cni")
    for plugin in ("bridge", "host-local", "loopback"):
        if not os.access(cni / plugin, os.X_OK):
            raise NodeUnavailableError(f"no CNI plugin {cni / plugin}: run `make system-deps`")
    return NodeBinaries(kube, found["containerd"], found["ctr"], found["runc"], cni)


def find_images() -> dict[str, Path]:
    """The OCI archives of the base (training), pause and operator images (``build.sh --no-build all``).

    ``DAM_IMAGE_ARCHIVES="BASE PAUSE OPERATOR"`` (what ``tools/image/build.sh all`` printed) uses those
    archives instead of the ones built for the working tree as it is now.
    """
    given = os.environ.get("DAM_IMAGE_ARCHIVES", "").split()
    if given:
        if len(given) != 3 or not all(Path(p).is_file() for p in given):
            raise NodeUnavailableError(
                f"DAM_IMAGE_ARCHIVES must name 3 archives (base pause operator): {given}"
            )
        return dict(zip(("base", "pause", "operator"), map(Path, given), strict=True))
    done = subprocess.run(
        [str(IMAGE_SCRIPT), "--no-build", "all"], capture_output=True, text=True, timeout=120, check=False
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or len(lines) != 3:
        why = (done.stderr.strip().splitlines() or [f"{IMAGE_SCRIPT} exited {done.returncode}"])[-1]
        raise NodeUnavailableError(why.removeprefix("image: "))
    return dict(zip(("base", "pause", "operator"), map(Path, lines), strict=True))


def _run(*cmd: str, check: bool = True, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


def _read_sysctl(name: str) -> str | None:
    try:
        return Path("/proc/sys", name).read_text().strip()
    except OSError:
        return None


def _alive(pid: int, needle: str) -> bool:
    """``pid`` runs and its command line contains ``needle`` (a pid is never trusted alone)."""
    try:
        return needle in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace"
        )
    except OSError:
        return False


def _kill(pid: int, needle: str, timeout_s: float = 20.0) -> None:
    if not _alive(pid, needle):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and _alive(pid, needle):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.1)
    if _alive(pid, needle):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, 0)


class NodeCluster(ControlPlane):
    """The control plane of :class:`ControlPlane` plus everything a Pod needs to run on this machine.

    After ``start()``: what ControlPlane gives (``url``, ``kubeconfig``, ``kubectl()``, ``api()``),
    ``node_ready_s`` (kubelet start to Node Ready), ``workdir`` (logs: ``*.log``), ``images``.
    ``detached=True`` (``make cluster``): the processes outlive this Python process; ``down()`` from
    the state file stops them.
    """

    def __init__(
        self,
        binaries: NodeBinaries,
        workdir: Path,
        images: dict[str, Path],
        *,
        detached: bool = False,
        apiserver_port: int = 0,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(
            binaries.kube,
            workdir,
            extra_apiserver_args=(
                # A webhook (or aggregated API) Service is called at its endpoint's address: there is
                # no kube-proxy to make a ClusterIP lead anywhere.
                "--enable-aggregator-routing=true",
            ),
        )
        self.node_binaries = binaries
        self.images = images
        self.detached = detached
        self.apiserver_port = apiserver_port
        self.node_ready_s = 0.0
        self.progress = progress or (lambda _line: None)
        self.state: dict[str, Any] = {}
        self._children: list[subprocess.Popen[bytes]] = []

    # -- paths

    @property
    def containerd_socket(self) -> Path:
        return self.workdir / "containerd" / "containerd.sock"

    @property
    def kubelet_root(self) -> Path:
        return self.workdir / "kubelet"

    def _spawn(self, cmd: list[str], log_path: Path) -> subprocess.Popen[bytes]:
        if not self.detached:
            proc = super()._spawn(cmd, log_path)
        else:  # no PR_SET_PDEATHSIG: the process outlives `make cluster`
            log = log_path.open("ab")
            log.write(f"\n==== {' '.join(cmd)}\n".encode())
            log.flush()
            env = {k: v for k, v in os.environ.items() if not k.startswith(("ETCD_", "KUBECONFIG"))}
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                env=env,
                start_new_session=True,
            )
            log.close()
        self._children.append(proc)
        name = Path(cmd[1] if cmd[0] == sys.executable else cmd[0]).name
        needle = cmd[1] if cmd[0] == sys.executable else cmd[0]
        self.state.setdefault("processes", []).append({"pid": proc.pid, "needle": needle, "name": name})
        self._save_state()
        return proc

    def _save_state(self) -> None:
        STATE_FILE.parent.mkdir(parents=True, exist_ok=True)
        STATE_FILE.write_text(json.dumps(self.state, indent=1))

    # -- lifecycle

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        remove_stale_node()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.state = {
            "workdir": str(self.workdir),
            "started_at": time.time(),
            "sysctls": {name: _read_sysctl(name) for name in KUBELET_SYSCTLS},
            "netns_before": sorted(os.listdir("/var/run/netns")) if os.path.isdir("/var/run/netns") else [],
            "dirs_before": [d for d in HARD_CODED_DIRS if os.path.exists(d)],
            "trees_before": {d: _tree(Path(d)) for d in HARD_CODED_TREES if os.path.exists(d)},
            "chains_before": _kubelet_chains(),
            "state_dir_before": STATE_FILE.parent.exists(),
            "processes": [],
        }
        self._save_state()
        try:
            steps: list[tuple[str, Callable[[], None]]] = [
                ("etcd and kube-apiserver", lambda: super(NodeCluster, self).start(timeout_s)),
                ("the Pod network (bridge, relay namespace)", self._start_network),
                ("containerd", lambda: self._start_containerd(timeout_s)),
                (
                    f"importing {len(self.images)} images into containerd",
                    self._import_images,
                ),
                ("kube-controller-manager and kube-scheduler", self._start_controllers),
                ("kubelet, until the Node is Ready", lambda: self._start_kubelet(timeout_s)),
            ]
            began = time.monotonic()
            for number, (what, step) in enumerate(steps, 1):
                self.progress(f"[{number}/{len(steps)}] {what} ({time.monotonic() - began:.1f} s)")
                step()
                if number == 1:  # etcd + kube-apiserver + the admin kubeconfig
                    self.state["apiserver_port"] = self.apiserver_port
                    self._save_state()
        except BaseException:
            self.stop()
            raise
        if self.detached:
            import atexit

            atexit.unregister(self.stop)

    def stop(self) -> None:
        problems = down(self.state)  # kubelet first; the API server before etcd
        super().stop()  # reaps etcd and kube-apiserver (already stopped)
        for proc in self._children:  # reap the rest (down() stopped them by pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        self._children.clear()
        self.state = {}
        if problems:
            raise AssertionError(f"the node was not removed cleanly: {problems}")

    # -- the parts

    def _start_network(self) -> None:
        ip = "ip"
        _run(ip, "link", "add", BRIDGE, "type", "bridge")
        _run(ip, "addr", "add", f"{HOST_ON_BRIDGE}/24", "dev", BRIDGE)
        _run(ip, "link", "set", BRIDGE, "up")
        _run(ip, "netns", "add", RELAY_NETNS)
        _run(ip, "link", "add", RELAY_VETH, "type", "veth", "peer", "name", RELAY_VETH_PEER)
        _run(ip, "link", "set", RELAY_VETH_PEER, "netns", RELAY_NETNS)
        _run(ip, "link", "set", RELAY_VETH, "master", BRIDGE, "up")
        ns = ("ip", "-n", RELAY_NETNS)
        _run(*ns, "link", "set", "lo", "up")
        _run(*ns, "addr", "add", f"{KUBERNETES_SERVICE_IP}/32", "dev", "lo")
        _run(*ns, "addr", "add", f"{CLUSTER_DNS_IP}/32", "dev", "lo")
        _run(*ns, "addr", "add", f"{POD_GATEWAY}/24", "dev", RELAY_VETH_PEER)
        _run(*ns, "link", "set", RELAY_VETH_PEER, "up")
        relay = [
            sys.executable,
            str(RELAY_SCRIPT),
            f"--netns=/var/run/netns/{RELAY_NETNS}",
            f"--listen={KUBERNETES_SERVICE_IP}:443",
            f"--to=127.0.0.1:{self.apiserver_port}",
            f"--dns={CLUSTER_DNS_IP}",
            f"--domain={CLUSTER_DOMAIN}",
        ]
        proc = self._spawn(relay, self.workdir / "relay.log")
        wait_for(
            lambda: proc.poll() is None and "relay:" in (self.workdir / "relay.log").read_text(),
            15,
            "the relay to listen",
            interval=0.1,
        )

    def _start_containerd(self, timeout_s: float) -> None:
        base = self.workdir / "containerd"
        cni_conf = self.workdir / "cni" / "net.d"
        cni_conf.mkdir(parents=True, exist_ok=True)
        (base / "root").mkdir(parents=True, exist_ok=True)
        conflist = {
            "cniVersion": "0.4.0",
            "name": CNI_NETWORK,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    # The host is not the Pods' gateway and forwards nothing: the relay namespace is.
                    "isGateway": False,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [
                            [
                                {
                                    "subnet": POD_SUBNET,
                                    "rangeStart": "10.244.0.10",
                                    "rangeEnd": "10.244.0.250",
                                    "gateway": POD_GATEWAY,
                                }
                            ]
                        ],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.workdir / "cni" / "ipam"),
                    },
                },
                {"type": "loopback"},
            ],
        }
        (cni_conf / "10-dam-node.conflist").write_text(json.dumps(conflist, indent=1))
        config = f"""version = 2
root = "{base / "root"}"
state = "{base / "state"}"
[grpc]
  address = "{self.containerd_socket}"
[ttrpc]
  address = "{base / "containerd.sock.ttrpc"}"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{base / "opt"}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{SANDBOX_IMAGE}"
  # The VM's bounding set lacks CAP_SYS_RESOURCE: runc may not raise oom_score_adj.
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{self.node_binaries.runc}"
        # runc's state (default /run/containerd/runc/<namespace>) under the node's directory.
        Root = "{base / "runc"}"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{self.node_binaries.cni_bin_dir}"
    conf_dir = "{cni_conf}"
    max_conf_num = 1
"""
        (base / "config.toml").write_text(config)
        proc = self._spawn(
            [str(self.node_binaries.containerd), f"--config={base / 'config.toml'}", "--log-level=warn"],
            self.workdir / "containerd.log",
        )
        self.state["containerd_socket"] = str(self.containerd_socket)
        self._save_state()
        self._wait(
            proc,
            name="containerd",
            ready=lambda: self.ctr("version", check=False).returncode == 0,
            timeout_s=timeout_s,
            log_path=self.workdir / "containerd.log",
        )

    def ctr(
        self, *args: str, check: bool = True, timeout_s: float = 300.0
    ) -> subprocess.CompletedProcess[str]:
        """containerd's ``ctr`` on this node's containerd, namespace ``k8s.io`` (the CRI's)."""
        cmd = [str(self.node_binaries.ctr), f"--address={self.containerd_socket}", "-n", "k8s.io", *args]
        return _run(*cmd, check=check, timeout=timeout_s)

    def _import_images(self) -> None:
        for archive in self.images.values():
            self.ctr("images", "import", str(archive))

    def _start_controllers(self) -> None:
        pki = self.workdir / "pki"
        kcm = [
            str(self.node_binaries.of("kube-controller-manager")),
            f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={self.ca_file}",  # kube-root-ca.crt in every namespace (projected tokens)
            "--use-service-account-credentials=false",
            "--leader-elect=false",
            f"--service-cluster-ip-range={KUBERNETES_SERVICE_IP.rsplit('.', 1)[0]}.0/24",
            "--controllers=*,-cloud-node-lifecycle,-service-lb-controller,-node-route-controller",
            "--node-monitor-grace-period=20s",
            "--v=1",
        ]
        self._spawn(kcm, self.workdir / "kube-controller-manager.log")
        scheduler = [
            str(self.node_binaries.of("kube-scheduler")),
            f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}",
            "--leader-elect=false",
            "--v=1",
        ]
        self._spawn(scheduler, self.workdir / "kube-scheduler.log")

    def _start_kubelet(self, timeout_s: float) -> None:
        root = self.kubelet_root
        root.mkdir(parents=True, exist_ok=True)
        for controller in Path("/sys/fs/cgroup").iterdir():  # cgroupRoot must exist in every hierarchy
            if controller.is_dir() and not controller.is_symlink() and (controller / "cgroup.procs").exists():
                (controller / CGROUP_ROOT).mkdir(exist_ok=True)
        resolv = self.workdir / "resolv.conf"
        resolv.write_text(f"nameserver {CLUSTER_DNS_IP}\n")
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": "127.0.0.1",
            "port": free_port(),
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": free_port(),
            # Bound to 127.0.0.1 only; the API server (kubectl logs/exec) is its only client.
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{CGROUP_ROOT}",
            "failCgroupV1": False,
            "failSwapOn": False,
            "clusterDNS": [CLUSTER_DNS_IP],
            "clusterDomain": CLUSTER_DOMAIN,
            "resolvConf": str(resolv),
            "podLogsDir": str(self.workdir / "pod-logs"),
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
            },
            "serializeImagePulls": False,
            "nodeStatusUpdateFrequency": "2s",
            "syncFrequency": "10s",
            "fileCheckFrequency": "10s",
            "maxPods": 50,
            # No KUBE-FIREWALL, KUBE-KUBELET-CANARY, KUBE-IPTABLES-HINT chains (see KUBELET_CHAINS).
            "makeIPTablesUtilChains": False,
        }
        (self.workdir / "kubelet.yaml").write_text(yaml.safe_dump(config))
        self.state["kubelet_root"] = str(root)
        self.state["pod_logs"] = str(self.workdir / "pod-logs")
        self._save_state()
        env_path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
        os.environ["PATH"] = env_path  # kubelet finds mount, runc's helpers through PATH
        started = time.monotonic()
        proc = self._spawn(
            [
                str(self.node_binaries.of("kubelet")),
                f"--config={self.workdir / 'kubelet.yaml'}",
                f"--kubeconfig={self.kubeconfig}",
                f"--root-dir={root}",
                f"--cert-dir={root / 'pki'}",  # its default is /var/lib/kubelet/pki, not under --root-dir
                f"--hostname-override={NODE_NAME}",
                "--v=1",
            ],
            self.workdir / "kubelet.log",
        )
        self._wait(
            proc,
            name="kubelet",
            ready=self.node_ready,
            timeout_s=timeout_s,
            log_path=self.workdir / "kubelet.log",
        )
        self.node_ready_s = time.monotonic() - started

    def node_ready(self) -> bool:
        status, text = self._request("GET", f"/api/v1/nodes/{NODE_NAME}", timeout_s=5.0)
        if status != 200:
            return False
        conditions = json.loads(text).get("status", {}).get("conditions", [])
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


# --- teardown, from the state alone --------------------------------------------------------------


def _mounts_under(prefixes: list[str]) -> list[str]:
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4].encode().decode("unicode_escape")
            if any(point == p or point.startswith(p.rstrip("/") + "/") for p in prefixes):
                found.append(point)
    return sorted(set(found), key=len, reverse=True)


def _cgroup_dirs(root: Path) -> list[Path]:
    """``root`` and every cgroup below it; a cgroup the kernel removes during the walk (a
    container's, as its last process exits) is skipped, not an error (``Path.rglob`` raised)."""
    found: list[Path] = []
    for directory, _, _ in os.walk(root, onerror=lambda _exc: None):
        found.append(Path(directory))
    return found


def _kill_cgroup_tree(name: str) -> None:
    """SIGKILL every process in the node's cgroups (the containers), then remove the cgroups."""
    roots = [c / name for c in Path("/sys/fs/cgroup").iterdir() if (c / name).is_dir()]
    for _ in range(20):
        pids: set[int] = set()
        for root in roots:
            for directory in _cgroup_dirs(root):
                with contextlib.suppress(OSError):
                    pids.update(int(p) for p in (directory / "cgroup.procs").read_text().split())
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
    for root in roots:
        for directory in sorted(_cgroup_dirs(root), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                directory.rmdir()
        with contextlib.suppress(OSError):
            root.rmdir()


def _tree(root: Path) -> list[str]:
    """Every path below ``root`` (relative, links not followed), sorted."""
    found: list[str] = []
    for directory, dirs, files in os.walk(root, onerror=lambda _exc: None):
        rel = os.path.relpath(directory, root)
        found += [os.path.normpath(os.path.join(rel, name)) for name in dirs + files]
    return sorted(found)


def _remove_new(root: Path, before: list[str] | None) -> list[str]:
    """Remove what is below ``root`` and not in ``before`` (``None``: ``root`` was not there, so it
    goes too); never below a mount. Returns what could not be removed."""
    if not root.exists():
        return []
    real = os.path.realpath(root)
    mounts = [m for m in _mounts_under([real]) if m != real or before is None]
    if mounts:
        return [f"{root}: not removed, still mounted: {mounts[:5]}"]
    kept = set(before or [])
    problems: list[str] = []
    for rel in sorted(set(_tree(root)) - kept, key=lambda r: r.count("/"), reverse=True):
        path = root / rel
        try:
            if path.is_dir() and not path.is_symlink():
                path.rmdir()  # its new entries went first (deepest first); an old one keeps it
            else:
                path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            if not any(k.startswith(rel + "/") for k in kept):
                problems.append(f"{path}: {exc}")
    if before is None:
        with contextlib.suppress(OSError):
            root.rmdir()
    return problems


def _iptables_save(tool: str) -> dict[str, list[str]]:
    """``<tool>-save`` as {table: its lines}; empty when the tool is not there."""
    found = shutil.which(f"{tool}-save", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    if found is None:
        return {}
    done = _run(found, check=False)
    tables: dict[str, list[str]] = {}
    current: list[str] = []
    for line in done.stdout.splitlines():
        if line.startswith("*"):
            current = tables.setdefault(line[1:], [])
        elif line and not line.startswith(("#", "COMMIT")):
            current.append(line)
    return tables


def _kubelet_chains() -> dict[str, dict[str, list[str]]]:
    """{tool: {table: the KUBELET_CHAINS in it}} as iptables-save and ip6tables-save list them."""
    return {
        tool: {
            table: sorted(c for c in KUBELET_CHAINS if any(line.split()[0] == f":{c}" for line in lines))
            for table, lines in _iptables_save(tool).items()
        }
        for tool in ("iptables", "ip6tables")
    }


def _remove_kubelet_chains(before: dict[str, dict[str, list[str]]]) -> list[str]:
    """Remove the KUBELET_CHAINS that were not there before the start, and the rules that jump to
    them (KUBE-FIREWALL from INPUT and OUTPUT). Returns what could not be removed."""
    problems: list[str] = []
    for tool in ("iptables", "ip6tables"):
        for table, lines in _iptables_save(tool).items():
            if table not in IPTABLES_TABLES:
                continue
            had = set(before.get(tool, {}).get(table, []))
            ours = [c for c in KUBELET_CHAINS if c not in had and f":{c}" in (ln.split()[0] for ln in lines)]
            for line in lines:  # "-A INPUT -j KUBE-FIREWALL": delete it as it was added
                words = shlex.split(line)
                if (
                    words[:1] == ["-A"]
                    and words[1] not in ours
                    and any(words[i] in ("-j", "-g") and words[i + 1] in ours for i in range(len(words) - 1))
                ):
                    _run(tool, "-w", "-t", table, "-D", *words[1:], check=False)
            for chain in ours:
                _run(tool, "-w", "-t", table, "-F", chain, check=False)
                done = _run(tool, "-w", "-t", table, "-X", chain, check=False)
                if done.returncode != 0:
                    problems.append(f"{tool} -t {table} chain {chain}: {done.stderr.strip()}")
    return problems


def remove_stale_node() -> list[str]:
    """Removes what a node whose processes all ended left on the machine (a run killed before its
    teardown: its state file, sysctls, chains, mounts; ``down``), and returns what it could not
    remove; nothing to do without a state file. Raises ``NodeUnavailableError`` while one of that
    node's processes still runs: one node a machine."""
    if not STATE_FILE.exists():
        return []
    try:
        old = json.loads(STATE_FILE.read_text() or "{}")
    except (OSError, ValueError):
        old = {}
    old = old if isinstance(old, dict) else {}
    if any(_alive(p["pid"], p["needle"]) for p in old.get("processes", [])):
        raise NodeUnavailableError(
            f"a node already runs here (state {STATE_FILE}, workdir {old.get('workdir')}): "
            "stop it first with `make cluster-down`"
        )
    problems = down(old)
    STATE_FILE.unlink(missing_ok=True)  # down keeps a file that is not its workdir's
    return problems


def down(state: dict[str, Any]) -> list[str]:
    """Remove everything a node made, from its state: processes, containers, mounts, cgroups, the
    bridge, the relay namespace, the Pods' network namespaces, the sysctls kubelet changed, the
    directories kubelet and CNI hard-code. Returns what it could not remove (empty when clean)."""
    problems: list[str] = []
    procs = list(state.get("processes", []))
    by_name: dict[str, list[dict[str, Any]]] = {}
    for p in procs:
        by_name.setdefault(p["name"], []).append(p)

    def stop(name: str, timeout_s: float = 10.0) -> None:
        for p in by_name.get(name, []):
            _kill(p["pid"], p["needle"], timeout_s)

    # The kubelet first (nothing restarts containers then), the containers by their cgroups, containerd
    # and its shims, then the API server before etcd (an API server without etcd waits for it).
    for name in ("kubelet", "kube-scheduler", "kube-controller-manager"):
        stop(name)
    _kill_cgroup_tree(CGROUP_ROOT)
    stop("containerd")
    socket_path = state.get("containerd_socket")
    if socket_path:  # containerd's shims: their command line names our socket
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and _alive(int(entry.name), f"-address {socket_path}"):
                _kill(int(entry.name), f"-address {socket_path}", timeout_s=5)
    stop("relay.py")
    stop("kube-apiserver", timeout_s=5.0)  # graceful shutdown would wait for its watchers
    stop("etcd")
    workdir = state.get("workdir")
    prefixes = [d for d in (workdir, state.get("kubelet_root")) if d]
    before = set(state.get("netns_before", []))
    netns_dir = Path("/var/run/netns")
    pod_netns = [
        n
        for n in (os.listdir(netns_dir) if netns_dir.is_dir() else [])
        if n.startswith("cni-") and n not in before
    ]
    for point in _mounts_under(prefixes) + [str(netns_dir / n) for n in pod_netns]:
        if _run("umount", point, check=False).returncode != 0:
            _run("umount", "-l", point, check=False)
    for n in pod_netns:
        with contextlib.suppress(OSError):
            (netns_dir / n).unlink()
    _run("ip", "link", "del", BRIDGE, check=False)
    if (netns_dir / RELAY_NETNS).exists():
        _run("ip", "netns", "del", RELAY_NETNS, check=False)
    _run("ip", "link", "del", RELAY_VETH, check=False)
    for name, value in (state.get("sysctls") or {}).items():
        if value is not None and _read_sysctl(name) != value:
            try:
                Path("/proc/sys", name).write_text(value)
            except OSError as exc:
                problems.append(f"sysctl {name}: {exc}")
    logs = state.get("pod_logs")
    if logs and Path("/var/log/containers").is_dir():  # kubelet's hard-coded symlinks into podLogsDir
        for link in Path("/var/log/containers").iterdir():
            with contextlib.suppress(OSError):
                if link.is_symlink() and os.readlink(link).startswith(logs):
                    link.unlink()
    results = Path("/var/lib/cni/results")  # libcni's cache (hard-coded in containerd 1.6's CRI)
    if results.is_dir():  # ours: our network's, and the loopback plug-in's of sandboxes made since start
        for entry in [*results.glob(f"{CNI_NETWORK}-*"), *results.glob("cni-loopback-*")]:
            with contextlib.suppress(OSError):
                if entry.name.startswith(CNI_NETWORK) or entry.stat().st_mtime >= state.get("started_at", 0):
                    entry.unlink()
    for directory in HARD_CODED_DIRS:
        if directory not in state.get("dirs_before", HARD_CODED_DIRS) and os.path.isdir(directory):
            real = os.path.realpath(directory)  # /var/run is a link to /run; mountinfo names /run
            if not os.listdir(directory) and _mounts_under([real]) == [real]:
                _run("umount", real, check=False)  # `ip netns add` makes /var/run/netns a mount
            with contextlib.suppress(OSError):
                os.rmdir(directory)  # only when empty
    problems += _remove_kubelet_chains(state.get("chains_before") or {})
    if "trees_before" in state:  # (a state written before the trees were recorded: left alone)
        for tree in HARD_CODED_TREES:
            problems += _remove_new(Path(tree), state["trees_before"].get(tree))
    if workdir and Path(workdir).exists():
        leftover = _mounts_under([workdir])
        if leftover:
            problems.append(f"still mounted: {leftover[:5]}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    for p in procs:
        if _alive(p["pid"], p["needle"]):
            problems.append(f"{p['name']} (pid {p['pid']}) still runs")
    if any((c / CGROUP_ROOT).exists() for c in Path("/sys/fs/cgroup").iterdir()):
        problems.append(f"cgroup {CGROUP_ROOT} still there")
    with contextlib.suppress(OSError):
        if STATE_FILE.exists() and json.loads(STATE_FILE.read_text() or "{}").get("workdir") in (
            workdir,
            None,
        ):
            STATE_FILE.unlink()
    if not state.get("state_dir_before", True):
        with contextlib.suppress(OSError):
            STATE_FILE.parent.rmdir()  # only when empty
    return problems
