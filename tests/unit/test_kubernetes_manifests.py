"""deploy/kubernetes/ against the Kubernetes API's schemas and against pgjobs itself.

Every Kubernetes resource is validated by ``kubernetes-validate`` (the API's JSON schemas, bundled
in the package: no cluster, no network) in strict mode, which refuses unknown fields, for the
oldest and the newest Kubernetes version checked. KEDA's ScaledObject is not in those schemas: it
is checked against ``SCALED_OBJECT``, a schema of the ScaledObject fields KEDA documents, written
here (strict as well). Then what no schema knows: the commands' options exist, the probes ask the
worker's own paths on its port, the termination period outlasts the worker's drain, the KEDA
target and the secrets named exist, and kustomization.yaml lists every manifest."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import kubernetes_validate.utils
import pytest
import yaml

from pgjobs.cli import cli, completion
from pgjobs.worker.http import PATHS
from tests.support.helpers import REPO

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
