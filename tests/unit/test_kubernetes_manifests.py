"""deploy/kubernetes/ against the Kubernetes API's schemas and against pgjobs itself.

Every Kubernetes resource is validated by ``kubernetes-validate`` (the API's JSON schemas, bundled
in the package: no cluster, no network) in strict mode, which refuses unknown fields, for the
oldest and the newest Kubernetes version checked. KEDA's ScaledObject is not in those schemas: it
is checked against ``SCALED_OBJECT``, a schema of the ScaledObject fields KEDA documents, written
here (strict as well). Then what no schema knows: the commands' options exist, the probes ask the
worker's own paths on its port, the termination period outlasts the worker's drain, the KEDA
target and the secrets named exist, and kustomization.yaml lists every manifest.

Every pod spec (of a Deployment, a Job, whatever holds one) passes the Pod Security Standards'
"restricted" profile, each rule checked (``tests.support.pod_security``, which is shown to catch
each one), runs as the Dockerfile's numeric user with no service-account token, gives every probe
a timeout, period and threshold, and is selected by a NetworkPolicy that lets in only its ports
and out only PostgreSQL and DNS."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import kubernetes_validate.utils
import pytest
import yaml

from pgjobs.cli import cli, completion
from pgjobs.worker.http import PATHS
from tests.support.helpers import REPO
from tests.support.pod_security import containers, restricted_violations

MANIFESTS = REPO / "deploy" / "kubernetes"
#: The Kubernetes versions the manifests are valid for: the oldest checked and the newest the
#: installed kubernetes-validate knows.
VERSIONS = ("1.29.0", kubernetes_validate.utils.latest_version())
#: Seconds a worker needs after its grace period to give back what still runs and exit.
DRAIN_MARGIN = 10

_INT = {"type": "integer", "minimum": 0}
_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
_POLICY = {
    "type": "object",
    "additionalProperties": False,
    "required": ["type", "value", "periodSeconds"],
    "properties": {
        "type": {"enum": ["Pods", "Percent"]},
        "value": {"type": "integer", "minimum": 1},
        "periodSeconds": {"type": "integer", "minimum": 1, "maximum": 1800},
    },
}
_RULES = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "stabilizationWindowSeconds": {"type": "integer", "minimum": 0, "maximum": 3600},
        "selectPolicy": {"enum": ["Max", "Min", "Disabled"]},
        "policies": {"type": "array", "items": _POLICY},
    },
}
#: keda.sh/v1alpha1 ScaledObject: the fields of KEDA's documentation (spec.scaleTargetRef,
#: polling and cooldown, replica bounds, fallback, advanced HPA behavior, triggers whose metadata
#: are strings), unknown ones refused.
SCALED_OBJECT: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                "namespace": {"type": "string"},
                "labels": _STRINGS,
                "annotations": _STRINGS,
            },
            "additionalProperties": False,
        },
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["scaleTargetRef", "triggers"],
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["name"],
                    "properties": {
                        "name": {"type": "string", "minLength": 1},
                        "kind": {"type": "string"},
                        "apiVersion": {"type": "string"},
                        "envSourceContainerName": {"type": "string"},
                    },
                },
                "pollingInterval": _INT,
                "cooldownPeriod": _INT,
                "initialCooldownPeriod": _INT,
                "idleReplicaCount": _INT,
                "minReplicaCount": _INT,
                "maxReplicaCount": {"type": "integer", "minimum": 1},
                "fallback": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["failureThreshold", "replicas"],
                    "properties": {"failureThreshold": _INT, "replicas": _INT},
                },
                "advanced": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "restoreToOriginalReplicaCount": {"type": "boolean"},
                        "horizontalPodAutoscalerConfig": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {
                                "name": {"type": "string"},
                                "behavior": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "properties": {"scaleUp": _RULES, "scaleDown": _RULES},
                                },
                            },
                        },
                    },
                },
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["type", "metadata"],
                        "properties": {
                            "type": {"type": "string", "minLength": 1},
                            "name": {"type": "string"},
                            "metadata": _STRINGS,
                            "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                            "useCachedMetrics": {"type": "boolean"},
                            "authenticationRef": {
                                "type": "object",
                                "additionalProperties": False,
                                "required": ["name"],
                                "properties": {
                                    "name": {"type": "string"},
                                    "kind": {
                                        "enum": [
                                            "TriggerAuthentication",
                                            "ClusterTriggerAuthentication",
                                        ]
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}


def _files() -> list[Path]:
    return sorted(MANIFESTS.rglob("*.yaml"))


def _resources(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]


def _all() -> dict[tuple[str, str], dict[str, Any]]:
    """Every resource of deploy/kubernetes/ by (kind, name); the two ScaledObjects, which are
    alternatives of one another, by their file."""
    found = {}
    for path in _files():
        for resource in _resources(path):
            key = resource["kind"], resource.get("metadata", {}).get("name", path.stem)
            if resource["kind"] == "ScaledObject":
                key = resource["kind"], path.stem
            assert key not in found, f"{key} twice"
            found[key] = resource
    return found


def validate(resource: dict[str, Any]) -> None:
    """Raise if ``resource`` is not a valid manifest (see the module's docstring)."""
    if resource["apiVersion"].startswith("keda.sh/"):
        jsonschema.Draft202012Validator(SCALED_OBJECT).validate(resource)
        return
    for version in VERSIONS:
        kubernetes_validate.validate(resource, version, strict=True)


@pytest.mark.parametrize("path", _files(), ids=lambda p: str(p.relative_to(MANIFESTS)))
def test_every_manifest_is_valid(path: Path) -> None:
    resources = _resources(path)
    assert resources, f"{path} holds no resource"
    if path.name == "kustomization.yaml":
        (kustomization,) = resources
        listed = {MANIFESTS / name for name in kustomization["resources"]}
        top = {p for p in MANIFESTS.glob("*.yaml")} - {path, MANIFESTS / "secret.example.yaml"}
        assert listed == top, "kustomization.yaml lists every manifest but the secrets' template"
        return
    for resource in resources:
        validate(resource)


@pytest.mark.parametrize(
    ("where", "breakage"),
    [
        ("worker", lambda r: r["spec"].__setitem__("replicas", "two")),
        ("worker", lambda r: _container(r).__setitem__("livenessProbe", {"httpGet": {}})),
        ("worker", lambda r: _container(r).__setitem__("gracePeriod", 30)),  # strict: unknown
        ("migrate", lambda r: r["spec"]["template"]["spec"].__setitem__("restartPolicy", 7)),
        ("keda", lambda r: r["spec"].pop("scaleTargetRef")),
        ("keda", lambda r: r["spec"]["triggers"][0]["metadata"].__setitem__("targetQueryValue", 8)),
        ("keda", lambda r: r["spec"].__setitem__("maxReplicas", 10)),
    ],
)
def test_an_invalid_manifest_is_refused(where: str, breakage: Any) -> None:
    resources = _all()
    resource = copy.deepcopy(
        {
            "worker": resources["Deployment", "pgjobs-worker"],
            "migrate": resources["Job", "pgjobs-migrate"],
            "keda": resources["ScaledObject", "scaledobject-postgresql"],
        }[where]
    )
    validate(resource)
    breakage(resource)
    with pytest.raises(jsonschema.ValidationError):
        validate(resource)


def _container(resource: dict[str, Any]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = resource["spec"]["template"]["spec"]["containers"]
    (container,) = containers
    return container


def _parse(args: list[str]) -> dict[str, Any]:
    """The options `pgjobs ARGS` parses to (nothing runs); a bad option raises."""
    group: Any = completion.command(cli)
    command = group.get_command(group.make_context("pgjobs", [], resilient_parsing=True), args[0])
    assert command is not None, f"no command {args[0]}"
    with command.make_context(args[0], args[1:]) as context:
        params: dict[str, Any] = context.params
        return params


def test_the_commands_and_probes_agree_with_pgjobs() -> None:
    resources = _all()
    for kind, name in (("Job", "pgjobs-migrate"), ("Deployment", "pgjobs-serve")):
        _parse(_container(resources[kind, name])["args"])
    worker = resources["Deployment", "pgjobs-worker"]
    container = _container(worker)
    options = _parse(container["args"])
    host, port = options["http"].rsplit(":", 1)
    assert host == "0.0.0.0"
    (named,) = container["ports"]
    assert (named["containerPort"], named["name"]) == (int(port), "http")
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert container[probe]["httpGet"] == {"path": path, "port": "http"}
        assert path in PATHS
    grace = worker["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace >= options["grace"] + DRAIN_MARGIN, "Kubernetes kills before the drain ends"

    secrets = {
        name: set(r["stringData"]) for (kind, name), r in resources.items() if kind == "Secret"
    }
    for (kind, name), resource in resources.items():
        for ref in _secret_refs(resource):
            assert ref[1] in secrets.get(ref[0], set()), f"{kind} {name} reads a missing {ref}"
    for key, scaled in resources.items():
        if key[0] == "ScaledObject":
            target = scaled["spec"]["scaleTargetRef"]["name"]
            assert ("Deployment", target) == ("Deployment", worker["metadata"]["name"])
            env = {e["name"] for e in container["env"]}
            from_env = scaled["spec"]["triggers"][0]["metadata"].get("connectionFromEnv")
            assert from_env is None or from_env in env


def _secret_refs(node: Any) -> list[tuple[str, str]]:
    """(secret, key) of every secretKeyRef and secret volume item under ``node``."""
    found: list[tuple[str, str]] = []
    if isinstance(node, dict):
        ref = node.get("secretKeyRef")
        if isinstance(ref, dict):
            found.append((ref["name"], ref["key"]))
        secret = node.get("secret")
        if isinstance(secret, dict) and "secretName" in secret:
            found += [(secret["secretName"], item["key"]) for item in secret.get("items", [])]
        for value in node.values():
            found += _secret_refs(value)
    elif isinstance(node, list):
        for value in node:
            found += _secret_refs(value)
    return found


# --- Pod Security "restricted", the image's user, probes, network policies -----------------

#: Where a pod template sits in each kind of workload resource.
_TEMPLATES: dict[str, tuple[str, ...]] = {
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}
#: The Dockerfile's user, as its USER line names it.
_USER = re.compile(r"^USER\s+(\S+)\s*$", re.MULTILINE)


def _pods() -> dict[str, dict[str, Any]]:
    """The pod template (metadata and spec) of every resource that runs pods, by kind/name."""
    pods = {}
    for (kind, name), resource in _all().items():
        if kind == "Pod":
            pods[f"{kind}/{name}"] = resource
        elif kind in _TEMPLATES:
            template: Any = resource
            for key in _TEMPLATES[kind]:
                template = template[key]
            pods[f"{kind}/{name}"] = template
    return pods


def test_the_pods_are_found():
    expected = {"Deployment/pgjobs-worker", "Deployment/pgjobs-serve", "Job/pgjobs-migrate"}
    assert set(_pods()) == expected


@pytest.mark.parametrize("pod", sorted(_pods()))
def test_every_pod_meets_pod_security_restricted(pod: str) -> None:
    template = _pods()[pod]
    annotations = template.get("metadata", {}).get("annotations")
    assert restricted_violations(template["spec"], annotations) == []


def _worker_spec(resource: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = resource["spec"]["template"]["spec"]
    return spec


def _context(resource: dict[str, Any]) -> dict[str, Any]:
    context: dict[str, Any] = _container(resource).setdefault("securityContext", {})
    return context


def _pod_context(resource: dict[str, Any]) -> dict[str, Any]:
    context: dict[str, Any] = _worker_spec(resource).setdefault("securityContext", {})
    return context


#: One breakage per rule of the profile, and the rule that must be named.
BREAKAGES: list[tuple[str, Callable[[dict[str, Any]], Any]]] = [
    ("host namespaces", lambda r: _worker_spec(r).__setitem__("hostNetwork", True)),
    ("host namespaces", lambda r: _worker_spec(r).__setitem__("hostPID", True)),
    ("host namespaces", lambda r: _worker_spec(r).__setitem__("hostIPC", True)),
    ("HostProcess", lambda r: _context(r).__setitem__("windowsOptions", {"hostProcess": True})),
    ("privileged containers", lambda r: _context(r).__setitem__("privileged", True)),
    ("capabilities", lambda r: _context(r)["capabilities"].__setitem__("add", ["SYS_ADMIN"])),
    ("capabilities", lambda r: _context(r)["capabilities"].__setitem__("add", ["CHOWN"])),
    ("capabilities", lambda r: _context(r)["capabilities"].__setitem__("drop", ["NET_RAW"])),
    ("capabilities", lambda r: _context(r).pop("capabilities")),
    (
        "hostPath volumes",
        lambda r: _worker_spec(r)["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
    ),
    (
        "volume types",
        lambda r: _worker_spec(r)["volumes"].append(
            {"name": "n", "nfs": {"server": "nfs", "path": "/"}}
        ),
    ),
    ("host ports", lambda r: _container(r)["ports"][0].__setitem__("hostPort", 9090)),
    (
        "AppArmor",
        lambda r: (
            r["spec"]["template"]["metadata"]
            .setdefault("annotations", {})
            .__setitem__(APPARMOR_KEY, "unconfined")
        ),
    ),
    ("AppArmor", lambda r: _context(r).__setitem__("appArmorProfile", {"type": "Unconfined"})),
    ("SELinux", lambda r: _context(r).__setitem__("seLinuxOptions", {"type": "spc_t"})),
    ("SELinux", lambda r: _pod_context(r).__setitem__("seLinuxOptions", {"user": "root"})),
    ("/proc mount type", lambda r: _context(r).__setitem__("procMount", "Unmasked")),
    (
        "sysctls",
        lambda r: _pod_context(r).__setitem__("sysctls", [{"name": "kernel.msgmax", "value": "1"}]),
    ),
    ("privilege escalation", lambda r: _context(r).__setitem__("allowPrivilegeEscalation", True)),
    ("privilege escalation", lambda r: _context(r).pop("allowPrivilegeEscalation")),
    ("running as non-root", lambda r: _pod_context(r).pop("runAsNonRoot")),
    ("running as non-root", lambda r: _context(r).__setitem__("runAsNonRoot", False)),
    ("running as non-root user", lambda r: _pod_context(r).__setitem__("runAsUser", 0)),
    ("running as non-root user", lambda r: _context(r).__setitem__("runAsUser", 0)),
    ("seccomp", lambda r: _pod_context(r).pop("seccompProfile")),
    (
        "seccomp",
        lambda r: _context(r).__setitem__("seccompProfile", {"type": "Unconfined"}),
    ),
    (
        "seccomp",
        lambda r: _pod_context(r).__setitem__("seccompProfile", {"type": "Unconfined"}),
    ),
    # An init container is a container too: it must meet every rule on its own.
    (
        "privilege escalation",
        lambda r: _worker_spec(r).__setitem__(
            "initContainers", [{"name": "init", "image": "busybox"}]
        ),
    ),
]
APPARMOR_KEY = "container.apparmor.security.beta.kubernetes.io/worker"


@pytest.mark.parametrize(
    ("rule", "breakage"), BREAKAGES, ids=[f"{i}-{rule}" for i, (rule, _) in enumerate(BREAKAGES)]
)
def test_the_restricted_check_refuses_each_breakage(
    rule: str, breakage: Callable[[dict[str, Any]], Any]
) -> None:
    worker = copy.deepcopy(_all()["Deployment", "pgjobs-worker"])
    template = worker["spec"]["template"]
    assert restricted_violations(template["spec"], template["metadata"].get("annotations")) == []
    breakage(worker)
    found = restricted_violations(template["spec"], template["metadata"].get("annotations"))
    assert any(f.startswith(f"{rule}: ") for f in found), found


def _dockerfile_user() -> tuple[int, int]:
    """(uid, gid) of the Dockerfile's USER, which must be numeric, and created by it."""
    text = (REPO / "Dockerfile").read_text(encoding="utf-8")
    users = _USER.findall(text)
    assert users, "the Dockerfile sets no USER"
    user = users[-1]
    assert re.fullmatch(r"\d+:\d+", user), f"USER {user}: a numeric uid:gid, for runAsNonRoot"
    uid, gid = (int(n) for n in user.split(":"))
    assert uid > 0 and gid > 0
    assert re.search(rf"useradd\b[^\n]*--uid {uid}\b[^\n]*--gid {gid}\b", text), "USER is created"
    assert re.search(rf"groupadd\b[^\n]*--gid {gid}\b", text), "its group is created"
    return uid, gid


@pytest.mark.parametrize("pod", sorted(_pods()))
def test_every_pod_runs_as_the_images_numeric_user_without_an_api_token(pod: str) -> None:
    spec = _pods()[pod]["spec"]
    uid, gid = _dockerfile_user()
    context = spec["securityContext"]
    assert (context["runAsUser"], context["runAsGroup"]) == (uid, gid)
    assert context["runAsNonRoot"] is True
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["automountServiceAccountToken"] is False
    mounts = {v["name"]: v for v in spec.get("volumes", [])}
    for where, container in containers(spec):
        own = container.get("securityContext", {})
        assert "runAsUser" not in own and "runAsGroup" not in own, f"{where}: the pod's user"
        if own.get("readOnlyRootFilesystem"):
            # The one place a process may write: an emptyDir at /tmp.
            (tmp,) = [m for m in container.get("volumeMounts", []) if m["mountPath"] == "/tmp"]
            assert "emptyDir" in mounts[tmp["name"]] and not tmp.get("readOnly")


@pytest.mark.parametrize("pod", sorted(_pods()))
def test_every_probe_has_a_timeout_period_and_thresholds(pod: str) -> None:
    for where, container in containers(_pods()[pod]["spec"]):
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            probe = container.get(kind)
            if probe is None:
                continue
            for field in ("timeoutSeconds", "periodSeconds", "failureThreshold"):
                assert isinstance(probe.get(field), int), f"{where} {kind}: no {field}"
            assert 1 <= probe["timeoutSeconds"] < probe["periodSeconds"], f"{where} {kind}"
            assert probe.get("successThreshold", 1) == 1, "liveness and startup need 1"
    if pod.startswith("Deployment/"):
        (container,) = _pods()[pod]["spec"]["containers"]
        assert {"livenessProbe", "readinessProbe"} <= set(container)


def _selects(policy: dict[str, Any], labels: dict[str, str]) -> bool:
    selector = policy["spec"]["podSelector"]
    assert set(selector) <= {"matchLabels"}, "matchLabels only, which this test reads"
    wanted: dict[str, str] = selector.get("matchLabels", {})
    return wanted.items() <= labels.items()


def _database_port() -> int:
    secret = _all()["Secret", "pgjobs-database"]
    return urlsplit(secret["stringData"]["url"]).port or 5432


def test_every_pod_has_a_network_policy_that_lets_in_only_its_ports():
    policies = {name: r for (kind, name), r in _all().items() if kind == "NetworkPolicy"}
    assert policies, "no NetworkPolicy"
    kustomization = _resources(MANIFESTS / "kustomization.yaml")[0]
    files = {MANIFESTS / name for name in kustomization["resources"]}
    assert any(r["kind"] == "NetworkPolicy" for path in files for r in _resources(path)), (
        "kubectl apply -k applies the policies"
    )
    used = set()
    for pod, template in _pods().items():
        labels = template["metadata"]["labels"]
        selecting = [name for name, policy in policies.items() if _selects(policy, labels)]
        assert len(selecting) == 1, f"{pod}: selected by {selecting}"
        (name,) = selecting
        used.add(name)
        policy = policies[name]["spec"]
        assert set(policy["policyTypes"]) == {"Ingress", "Egress"}, f"{pod}: both directions"
        ports = {
            (p.get("protocol", "TCP"), n)
            for _, c in containers(template["spec"])
            for p in c.get("ports", [])
            for n in (p["containerPort"], p.get("name"))
        }
        let_in = [
            (p.get("protocol", "TCP"), p["port"])
            for rule in policy.get("ingress", [])
            for p in rule.get("ports") or [{"port": None}]
        ]
        assert set(let_in) <= ports, f"{pod}: lets in {let_in}, not only its ports {ports}"
        if ports:
            assert let_in, f"{pod}: its port is not let in"
        let_out = {
            (p.get("protocol", "TCP"), p["port"])
            for rule in policy["egress"]
            for p in rule.get("ports") or [{"port": None}]
        }
        assert let_out == {("TCP", _database_port()), ("UDP", 53), ("TCP", 53)}, pod
    assert used == set(policies), "a policy that selects no pod of the manifests"
