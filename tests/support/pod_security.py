"""The Pod Security Standards' "restricted" profile (kubernetes.io/docs/concepts/security/
pod-security-standards/, the baseline's controls and the restricted ones on top), as checks of a
pod spec: what the admission controller of a namespace labelled
``pod-security.kubernetes.io/enforce: restricted`` would refuse, without a cluster.

``restricted_violations(spec, annotations)`` names every rule a pod spec breaks (an empty list
when it passes): each one once per place, as "rule: where: what".
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

#: Capabilities the baseline lets a container add; the restricted profile only the first.
RESTRICTED_ADD = frozenset({"NET_BIND_SERVICE"})
#: Volume types the restricted profile allows (a volume is its name and one of these).
ALLOWED_VOLUMES = frozenset(
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
#: The sysctls the baseline calls safe.
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
SELINUX_TYPES = frozenset(
    {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
)
SECCOMP_TYPES = frozenset({"RuntimeDefault", "Localhost"})
APPARMOR_TYPES = frozenset({"RuntimeDefault", "Localhost"})
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"


def containers(spec: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, container) of every container of a pod spec: init, regular and ephemeral."""
    for field in ("initContainers", "containers", "ephemeralContainers"):
        for container in spec.get(field) or []:
            yield f"{field}[{container.get('name')}]", container


def restricted_violations(
    spec: dict[str, Any], annotations: dict[str, str] | None = None
) -> list[str]:
    """Every rule of the restricted profile that the pod ``spec`` (with its metadata's
    ``annotations``) breaks."""
    found = _pod_rules(spec, annotations or {})
    for where, container in containers(spec):
        found += _container_rules(where, container, spec.get("securityContext") or {})
    return found


def _pod_rules(spec: dict[str, Any], annotations: dict[str, str]) -> list[str]:
    """The rules of the pod's own fields: host namespaces, HostProcess, volumes, sysctls,
    SELinux, AppArmor, its user and its seccomp profile."""
    found: list[str] = []
    pod = spec.get("securityContext") or {}
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            found.append(f"host namespaces: the pod: {field} is true")
    if (pod.get("windowsOptions") or {}).get("hostProcess"):
        found.append("HostProcess: the pod: windowsOptions.hostProcess is true")
    for volume in spec.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if "hostPath" in kinds:
            found.append(f"hostPath volumes: volume {volume.get('name')}")
        if not kinds <= ALLOWED_VOLUMES or len(kinds) != 1:
            found.append(f"volume types: volume {volume.get('name')}: {sorted(kinds)}")
    for sysctl in pod.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            found.append(f"sysctls: the pod: {sysctl.get('name')} is not a safe sysctl")
    found += _selinux("the pod", pod)
    found += _apparmor("the pod", pod)
    for key, value in annotations.items():
        if key.startswith(APPARMOR_ANNOTATION) and not (
            value == "runtime/default" or value.startswith("localhost/")
        ):
            found.append(f"AppArmor: annotation {key}: {value}")
    if pod.get("runAsUser") == 0:
        found.append("running as non-root user: the pod: runAsUser is 0")
    seccomp = (pod.get("seccompProfile") or {}).get("type")
    if seccomp is not None and seccomp not in SECCOMP_TYPES:
        found.append(f"seccomp: the pod: seccompProfile.type is {seccomp}")
    return found


def _container_rules(where: str, container: dict[str, Any], pod: dict[str, Any]) -> list[str]:
    """The rules of one container, given the pod's ``securityContext`` (``pod``), whose
    runAsNonRoot and seccomp profile a container that sets none inherits."""
    found: list[str] = []
    context = container.get("securityContext") or {}
    if (context.get("windowsOptions") or {}).get("hostProcess"):
        found.append(f"HostProcess: {where}: windowsOptions.hostProcess is true")
    if context.get("privileged"):
        found.append(f"privileged containers: {where}: privileged is true")
    if context.get("procMount", "Default") != "Default":
        found.append(f"/proc mount type: {where}: procMount is {context['procMount']}")
    for port in container.get("ports") or []:
        if port.get("hostPort"):
            found.append(f"host ports: {where}: hostPort {port['hostPort']}")
    found += _selinux(where, context)
    found += _apparmor(where, context)
    if context.get("allowPrivilegeEscalation") is not False:
        found.append(f"privilege escalation: {where}: allowPrivilegeEscalation is not false")
    non_root = context.get("runAsNonRoot", pod.get("runAsNonRoot"))
    if non_root is not True:
        found.append(f"running as non-root: {where}: runAsNonRoot is not true")
    if context.get("runAsUser") == 0:
        found.append(f"running as non-root user: {where}: runAsUser is 0")
    own = (context.get("seccompProfile") or {}).get("type")
    if own is not None and own not in SECCOMP_TYPES:
        found.append(f"seccomp: {where}: seccompProfile.type is {own}")
    elif own is None and (pod.get("seccompProfile") or {}).get("type") not in SECCOMP_TYPES:
        found.append(f"seccomp: {where}: no RuntimeDefault or Localhost profile")
    capabilities = context.get("capabilities") or {}
    if "ALL" not in (capabilities.get("drop") or []):
        found.append(f"capabilities: {where}: does not drop ALL")
    added = set(capabilities.get("add") or []) - RESTRICTED_ADD
    if added:
        found.append(f"capabilities: {where}: adds {sorted(added)}")
    return found


def _selinux(where: str, context: dict[str, Any]) -> list[str]:
    options = context.get("seLinuxOptions") or {}
    found = []
    if options.get("type", "") not in SELINUX_TYPES:
        found.append(f"SELinux: {where}: type {options['type']}")
    for field in ("user", "role"):
        if options.get(field):
            found.append(f"SELinux: {where}: {field} is set")
    return found


def _apparmor(where: str, context: dict[str, Any]) -> list[str]:
    kind = (context.get("appArmorProfile") or {}).get("type")
    if kind is not None and kind not in APPARMOR_TYPES:
        return [f"AppArmor: {where}: appArmorProfile.type is {kind}"]
    return []
