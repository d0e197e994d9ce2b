"""What a node leaves on this machine: a listing taken before ``make cluster`` and after
``make cluster-down`` (``python -m dam_cluster footprint > before.txt``) whose difference must be empty,
and which the node tier's teardown test compares the same way.

Each category is a sorted list of lines that name a thing and not its moment (no pids, counters,
interface indexes, inode numbers), so that two listings of the same machine are equal:

- ``iptables``, ``ip6tables``: ``*-save`` without its comments and packet counters (every table)
- ``mounts``: mount point, type and source of the mounts below the directories a node writes to,
  its own directory and /sys/fs/cgroup, and of every namespace file (``/proc/self/mountinfo``)
- ``links``, ``netns``: the names of network interfaces and of network namespaces
- ``files``: every path below the directories a node writes to (``NODE_PATHS``)
- ``processes``: the command lines of the node's processes (``PROGRAMS``, ``PROCESS_WORDS``, the
  node's directory, its cgroup)
- ``cgroups``: the node's cgroup root in each hierarchy, and what is below it
- ``sysctls``: the kernel settings the kubelet sets, and forwarding
- with ``broad=True``: every mount, and ``toplevel``: the names in /run, /var/lib, /var/run, /etc,
  /var/log, /opt (a shared machine's other users change these, so the tests leave them out)
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path

from dam_cluster.node import CGROUP_ROOT, CLUSTER_DIR, HARD_CODED_TREES, KUBELET_SYSCTLS

# Where the kubelet, containerd, CNI and this tool write (hard-coded or by the node's configuration).
NODE_PATHS = (
    *HARD_CODED_TREES,
    str(CLUSTER_DIR),
    "/run/dam-node",
    "/var/lib/cni",
    "/etc/cni",
    "/opt/cni",
    "/var/log/containers",
    "/var/log/pods",
    "/run/netns",
    "/etc/kubernetes",
)
TOPLEVEL = ("/run", "/var/lib", "/var/run", "/etc", "/var/log", "/opt")
SYSCTLS = (*KUBELET_SYSCTLS, "net/ipv4/ip_forward", "net/ipv4/conf/all/route_localnet")
# A process is the node's when its program is one of these, or its command line names the relay's
# namespace, /var/lib/dam-node or the node's directory, or it is in the node's cgroup (the containers).
# (Not "dam-node" alone: `flock /tmp/dam-node.lock ...` of a test run waiting for the node is not one.)
PROGRAMS = ("kubelet", "containerd", "containerd-shim", "containerd-shim-runc-v2", "runc", "pause")
PROCESS_WORDS = ("dam-node-relay", str(CLUSTER_DIR))
_COUNTERS = re.compile(r"\[\d+:\d+\]")
PATH = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"


def _out(*cmd: str) -> str:
    try:
        done = subprocess.run(
            list(cmd),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={**os.environ, "PATH": PATH},
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout


def _iptables(tool: str) -> list[str]:
    lines = []
    table = ""
    for line in _out(f"{tool}-save").splitlines():
        if not line or line.startswith(("#", "COMMIT")):
            continue
        if line.startswith("*"):
            table = line[1:]
            continue
        lines.append(f"{table} {_COUNTERS.sub('', line).rstrip()}")
    return sorted(lines)


def _mounts(under: Sequence[str] | None) -> list[str]:
    """Every mount (``under=None``), or those below one of ``under`` and the namespace files."""
    prefixes = [os.path.realpath(p).rstrip("/") for p in under or ()]
    found = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            after = fields.index("-")
            point = fields[4].encode().decode("unicode_escape")
            kind = fields[after + 1]
            if (
                under is None
                or kind == "nsfs"
                or any(point == p or point.startswith(p + "/") for p in prefixes)
            ):
                found.add(f"{point} {kind} {fields[after + 2]}")
    return sorted(found)


def _links() -> list[str]:
    found = []
    for line in _out("ip", "-o", "link", "show").splitlines():  # "7: damnode0: <...> mtu ..."
        parts = line.split(":", 2)
        if len(parts) == 3:
            found.append(parts[1].strip().split("@")[0])
    return sorted(found)


def _netns() -> list[str]:
    return sorted(line.split()[0] for line in _out("ip", "netns", "list").splitlines() if line.strip())


def _files(roots: Iterable[str]) -> list[str]:
    found = []
    for root in roots:
        if not os.path.lexists(root):
            continue
        found.append(root)
        for directory, dirs, files in os.walk(root, onerror=lambda _exc: None):
            found += [os.path.join(directory, name) for name in dirs + files]
    return sorted(set(found))


def _in_node_cgroup(pid: str) -> bool:
    try:
        return f"/{CGROUP_ROOT}/" in Path(f"/proc/{pid}/cgroup").read_text() + "/"
    except OSError:
        return False


def _processes(words: Sequence[str]) -> list[str]:
    found = []
    me = str(os.getpid())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or entry.name == me:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if not cmdline:  # a kernel thread
            continue
        program = os.path.basename(cmdline.split()[0])
        if program in PROGRAMS or any(w in cmdline for w in words) or _in_node_cgroup(entry.name):
            found.append(cmdline)
    return sorted(found)


def _cgroups() -> list[str]:
    found = []
    base = Path("/sys/fs/cgroup")
    with contextlib.suppress(OSError):
        for hierarchy in base.iterdir():
            root = hierarchy / CGROUP_ROOT
            if root.is_dir():
                found += [
                    str(Path(d).relative_to(base)) for d, _, _ in os.walk(root, onerror=lambda _e: None)
                ]
    return sorted(found)


def _toplevel() -> list[str]:
    found = []
    for directory in TOPLEVEL:
        with contextlib.suppress(OSError):
            found += [os.path.join(directory, name) for name in os.listdir(directory)]
    return sorted(found)


def _sysctls() -> list[str]:
    found = []
    for name in SYSCTLS:
        with contextlib.suppress(OSError):
            found.append(f"{name} = {Path('/proc/sys', name).read_text().strip()}")
    return found


def snapshot(*, workdirs: Sequence[str] = (), broad: bool = False) -> dict[str, list[str]]:
    """The listing, by category. ``workdirs``: a node's directory (a test's), listed as ``files`` and
    matched in command lines beside ``NODE_PATHS`` and ``PROCESS_WORDS``."""
    listing = {
        "iptables": _iptables("iptables"),
        "ip6tables": _iptables("ip6tables"),
        # All mounts with broad=True; else the node's (an image build's overlays come and go).
        "mounts": _mounts(None if broad else [*NODE_PATHS, *workdirs, "/sys/fs/cgroup"]),
        "links": _links(),
        "netns": _netns(),
        "files": _files([*NODE_PATHS, *workdirs]),
        "processes": _processes([*PROCESS_WORDS, *workdirs]),
        "cgroups": _cgroups(),
        "sysctls": _sysctls(),
    }
    if broad:
        listing["toplevel"] = _toplevel()
    return listing


def added(before: dict[str, list[str]], after: dict[str, list[str]]) -> list[str]:
    """The lines of ``after`` that ``before`` lacks, as ``category: line``."""
    return [
        f"{category}: {line}"
        for category, lines in after.items()
        for line in lines
        if line not in set(before.get(category, []))
    ]


def render(listing: dict[str, list[str]]) -> str:
    """One ``category: line`` a line (``diff`` two of them)."""
    return "".join(f"{category}: {line}\n" for category, lines in listing.items() for line in lines)
