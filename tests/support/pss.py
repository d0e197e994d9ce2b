"""A checker for the *restricted* Pod Security Standard (baseline controls included).

It follows the control list of https://kubernetes.io/docs/concepts/security/pod-security-standards/
for a pod spec (not the pod-security admission plugin's version pinning):

baseline: no hostNetwork/hostPID/hostIPC, no privileged containers, no Windows
HostProcess, capabilities added only from the baseline list, no hostPath volumes,
no hostPort, /proc mount Default, seccomp not Unconfined, no custom SELinux
user/role, AppArmor not unconfined, only safe sysctls;
restricted: volume types limited, allowPrivilegeEscalation false, runAsNonRoot true,
runAsUser not 0, seccomp RuntimeDefault or Localhost, capabilities drop ALL and add
at most NET_BIND_SERVICE.

``violations(pod)`` lists what breaks the standard as "container NAME: ..." or
"pod: ..." sentences; an empty list means the pod passes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
RESTRICTED_VOLUME_TYPES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})


def _all_containers(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    out: list[Mapping[str, Any]] = []
    for key in ("initContainers", "containers", "ephemeralContainers"):
        out.extend(spec.get(key) or [])
    return out


def _effective(container: Mapping[str, Any], pod_sc: Mapping[str, Any], key: str) -> Any:
    sc = container.get("securityContext") or {}
    return sc[key] if key in sc and sc[key] is not None else pod_sc.get(key)


def violations(pod: Mapping[str, Any]) -> list[str]:
    spec: Mapping[str, Any] = pod.get("spec") or {}
    pod_sc: Mapping[str, Any] = spec.get("securityContext") or {}
    out: list[str] = []

    # ---- baseline, pod level
    for host in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(host):
            out.append(f"pod: {host} must not be true")
    if (pod_sc.get("windowsOptions") or {}).get("hostProcess"):
        out.append("pod: windowsOptions.hostProcess must not be true")
    for sysctl in pod_sc.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            out.append(f"pod: sysctl {sysctl.get('name')} is not in the safe set")
    for volume in spec.get("volumes") or []:
        kinds = [k for k in volume if k != "name"]
        if "hostPath" in kinds:
            out.append(f"pod: volume {volume.get('name')} is a hostPath volume")
        elif not set(kinds) <= RESTRICTED_VOLUME_TYPES:
            out.append(f"pod: volume {volume.get('name')} has a type not allowed ({', '.join(kinds)})")
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type")
    if pod_seccomp == "Unconfined":
        out.append("pod: seccompProfile.type must not be Unconfined")
    out.extend(f"pod: {m}" for m in _selinux(pod_sc))
    if (pod_sc.get("appArmorProfile") or {}).get("type") == "Unconfined":
        out.append("pod: appArmorProfile.type must not be Unconfined")
    if pod_sc.get("runAsUser") == 0:
        out.append("pod: runAsUser must not be 0")

    # ---- per container (init, regular and ephemeral)
    for c in _all_containers(spec):
        name = c.get("name", "?")
        sc: Mapping[str, Any] = c.get("securityContext") or {}
        where = f"container {name}"
        if sc.get("privileged"):
            out.append(f"{where}: privileged must not be true")
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            out.append(f"{where}: windowsOptions.hostProcess must not be true")
        for port in c.get("ports") or []:
            if port.get("hostPort"):
                out.append(f"{where}: hostPort must be 0 or unset")
        if sc.get("procMount") not in (None, "Default"):
            out.append(f"{where}: procMount must be Default")
        out.extend(f"{where}: {m}" for m in _selinux(sc))
        if (sc.get("appArmorProfile") or {}).get("type") == "Unconfined":
            out.append(f"{where}: appArmorProfile.type must not be Unconfined")

        caps = sc.get("capabilities") or {}
        added = set(caps.get("add") or [])
        if added - BASELINE_CAPABILITIES:
            extra = sorted(added - BASELINE_CAPABILITIES)
            out.append(f"{where}: adds capabilities outside the baseline set: {extra}")
        if added - {"NET_BIND_SERVICE"}:
            out.append(f"{where}: may add only NET_BIND_SERVICE, adds {sorted(added)}")
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{where}: capabilities.drop must include ALL")

        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{where}: allowPrivilegeEscalation must be false")
        if _effective(c, pod_sc, "runAsNonRoot") is not True:
            out.append(f"{where}: runAsNonRoot must be true (container or pod)")
        if sc.get("runAsUser") == 0:
            out.append(f"{where}: runAsUser must not be 0")
        seccomp = (_effective(c, pod_sc, "seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{where}: seccompProfile.type must be RuntimeDefault or Localhost (container or pod)")
    return out


def _selinux(sc: Mapping[str, Any]) -> list[str]:
    options = sc.get("seLinuxOptions") or {}
    out = []
    if options.get("type", "") not in SELINUX_TYPES:
        out.append(f"seLinuxOptions.type {options.get('type')} is not allowed")
    for key in ("user", "role"):
        if options.get(key):
            out.append(f"seLinuxOptions.{key} must not be set")
    return out


def is_restricted(pod: Mapping[str, Any]) -> bool:
    return not violations(pod)
