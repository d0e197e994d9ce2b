"""``make cluster`` / ``make cluster-down`` as a user runs them (``python -m dam_cluster up|down``, the
Makefile's commands, in a directory of the test's own): a second ``up`` leaves the running node as it
is and says so in one line; ``down`` leaves nothing of the node on the machine — the listing of
:mod:`dam_cluster.footprint` (iptables and ip6tables rules and chains, mounts, links, network
namespaces, the files below every directory a node writes to, its processes, cgroups and sysctls)
after ``down`` has nothing that the listing before ``up`` lacks.

This module's name sorts first in the node tier: it runs before the session's node (fixture
``node_cluster``) starts, as one node a machine is all there can be.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dam_cluster import footprint
from dam_cluster.node import STATE_FILE, down, remove_stale_node
from tests.support.nodecluster import HOW_TO_GET, NodeUnavailableError, find_images, find_node_binaries
from tests.support.operator_harness import REPO

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

KUBE_TOOLS = REPO / "tools" / "kube-tools" / "build.sh"


def _cli(cluster_dir: Path, *args: str, timeout_s: float = 300.0) -> subprocess.CompletedProcess[str]:
    """The Makefile's ``$(DAM_CLUSTER)``: ``PYTHONPATH=tools/node python -m dam_cluster``."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "tools" / "node"), "DAM_CLUSTER_DIR": str(cluster_dir)}
    return subprocess.run(
        [sys.executable, "-m", "dam_cluster", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def _kubectl() -> tuple[str, bool]:
    """`make tools`' kubectl (the cluster's release) when it is built (True), else the tests' one."""
    done = subprocess.run([str(KUBE_TOOLS), "--no-build"], capture_output=True, text=True, check=False)
    if done.returncode == 0 and done.stdout.strip():
        return str(Path(done.stdout.strip().splitlines()[-1]) / "kubectl"), True
    return str(find_node_binaries().kube.kubectl), False


@pytest.fixture
def cluster_dir(tmp_path: Path) -> Iterator[Path]:
    try:
        find_node_binaries()
        find_images()
    except NodeUnavailableError as exc:
        message = f"NO REAL KUBERNETES NODE: {exc}; {HOW_TO_GET}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    try:
        remove_stale_node()  # what a killed run left; a node that runs stops the test
    except NodeUnavailableError as exc:
        pytest.fail(f"{exc}: the lifecycle test needs the machine to itself", pytrace=False)
    directory = tmp_path / "cluster"
    try:
        yield directory
    finally:  # whatever the test did, no node is left running
        if STATE_FILE.exists():
            down(json.loads(STATE_FILE.read_text() or "{}"))


def test_a_second_make_cluster_keeps_the_running_node_and_make_cluster_down_leaves_nothing(
    cluster_dir: Path,
) -> None:
    before = footprint.snapshot(workdirs=[str(cluster_dir)])

    first = _cli(cluster_dir, "up")
    assert first.returncode == 0, first.stderr
    kubeconfig = first.stdout.strip().splitlines()[-1]
    assert kubeconfig == str(cluster_dir / "admin.kubeconfig")
    # Progress while it starts: each step named, with the time so far.
    assert "[1/6] etcd and kube-apiserver" in first.stderr and "[6/6] kubelet" in first.stderr, first.stderr

    running = footprint.snapshot(workdirs=[str(cluster_dir)])
    made = footprint.added(before, running)
    # The listing sees the node (else an empty difference after down would prove nothing).
    for thing in ("links: damnode0", "netns: dam-node-relay", f"files: {cluster_dir / 'admin.kubeconfig'}"):
        assert thing in made, made
    assert any(line.startswith("processes: ") and "kubelet" in line for line in made), made
    assert any(line.startswith("cgroups: ") for line in made), made
    files_before = set(running["files"])

    second = _cli(cluster_dir, "up", timeout_s=60)
    assert second.returncode == 0, second.stderr
    assert second.stderr.count("\n") == 1 and "already running" in second.stderr, second.stderr
    assert kubeconfig in second.stderr and second.stdout.strip() == kubeconfig
    assert "Traceback" not in second.stderr
    # Nothing of the running node removed: its PKI, etcd's data, containerd's state are all still there
    # (files come and go while it runs: logs, etcd's WAL; the node's directory keeps what it had).
    still = set(footprint.snapshot(workdirs=[str(cluster_dir)])["files"])
    gone = {f for f in files_before - still if f.startswith(str(cluster_dir))}
    assert not {f for f in gone if "/pki/" in f or f.endswith((".kubeconfig", "config.toml"))}, sorted(gone)
    assert len(gone) < 0.05 * len(files_before), sorted(gone)[:20]
    kubectl, same_release = _kubectl()
    nodes = subprocess.run(
        [kubectl, f"--kubeconfig={kubeconfig}", "get", "nodes", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert nodes.returncode == 0, nodes.stderr
    if same_release:  # no version skew: `make tools`' kubectl is the cluster's release
        assert nodes.stderr == "", nodes.stderr
    (node,) = json.loads(nodes.stdout)["items"]
    assert any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])

    gone_down = _cli(cluster_dir, "down", timeout_s=120)
    assert gone_down.returncode == 0, gone_down.stderr
    assert "cluster: removed" in gone_down.stderr, gone_down.stderr
    left = footprint.added(before, footprint.snapshot(workdirs=[str(cluster_dir)]))
    assert left == [], "make cluster-down left these behind:\n" + "\n".join(left)

    again = _cli(cluster_dir, "down", timeout_s=60)
    assert again.returncode == 0 and "nothing to remove" in again.stderr, again.stderr


# What kubelet v1.34's syncIPTablesRules and its canary monitor make (pkg/kubelet/kubelet_network_linux.go,
# pkg/util/iptables Monitor) when makeIPTablesUtilChains is true, command for command.
KUBELET_IPTABLES = """
set -e
for t in mangle nat filter; do
  iptables -w -t $t -N KUBE-KUBELET-CANARY
  ip6tables -w -t $t -N KUBE-KUBELET-CANARY
done
iptables -w -t mangle -N KUBE-IPTABLES-HINT
ip6tables -w -t mangle -N KUBE-IPTABLES-HINT
iptables -w -t filter -N KUBE-FIREWALL
iptables -w -t filter -I OUTPUT -j KUBE-FIREWALL
iptables -w -t filter -I INPUT -j KUBE-FIREWALL
iptables -w -t filter -A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" \\
  --dst 127.0.0.0/8 ! --src 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
"""


def _in_netns(netns: str, *cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", "netns", "exec", netns, *cmd], capture_output=True, text=True, timeout=60, check=False
    )


def test_cluster_down_removes_the_iptables_chains_a_kubelet_makes_and_keeps_those_it_found() -> None:
    if os.geteuid() != 0 or shutil.which("iptables-save", path=os.environ["PATH"] + ":/usr/sbin") is None:
        pytest.skip("needs root and iptables")
    netns = f"dam-test-iptables-{os.getpid()}"  # a network namespace of its own: the host's rules untouched
    netns_dir = Path("/run/netns")  # `ip netns add` makes it (a mount) when it is not there
    had_netns_dir = netns_dir.exists()
    subprocess.run(["ip", "netns", "add", netns], check=True, timeout=30)
    remove = (
        "import json, sys; from dam_cluster.node import _kubelet_chains, _remove_kubelet_chains; "
        "print(json.dumps(_remove_kubelet_chains(json.loads(sys.argv[1]))))"
    )
    env_cmd = ("env", f"PYTHONPATH={REPO / 'tools' / 'node'}", sys.executable, "-c", remove)
    try:
        made = _in_netns(netns, "bash", "-c", KUBELET_IPTABLES)
        assert made.returncode == 0, made.stderr
        saved = _in_netns(netns, "iptables-save").stdout + _in_netns(netns, "ip6tables-save").stdout
        assert saved.count(":KUBE-") == 9 and "-A INPUT -j KUBE-FIREWALL" in saved, saved

        # A KUBE-FIREWALL that was there before the node started stays, with its rules.
        kept = _in_netns(netns, *env_cmd, json.dumps({"iptables": {"filter": ["KUBE-FIREWALL"]}}))
        assert kept.returncode == 0 and json.loads(kept.stdout) == [], kept.stderr
        saved = _in_netns(netns, "iptables-save").stdout + _in_netns(netns, "ip6tables-save").stdout
        assert re.findall(r"^:(KUBE-\S+)", saved, re.MULTILINE) == ["KUBE-FIREWALL"], saved
        assert "-A INPUT -j KUBE-FIREWALL" in saved and "block incoming localnet connections" in saved

        removed = _in_netns(netns, *env_cmd, "{}")
        assert removed.returncode == 0 and json.loads(removed.stdout) == [], removed.stderr
        saved = _in_netns(netns, "iptables-save").stdout + _in_netns(netns, "ip6tables-save").stdout
        assert "KUBE-" not in saved and "-A " not in saved, saved
    finally:
        subprocess.run(["ip", "netns", "del", netns], check=False, timeout=30)
        if not had_netns_dir and netns_dir.exists() and not any(netns_dir.iterdir()):
            subprocess.run(["umount", str(netns_dir)], check=False, timeout=30)
            netns_dir.rmdir()
