"""The Helm chart, rendered and linted by the real Helm engine (helm-python-sdk: Helm's Go SDK)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

helm = pytest.importorskip("helm_python", reason="helm-python-sdk (the Helm engine) is not installed")

from dam_operator.cluster.runtime.webhook import (  # noqa: E402
    MUTATE_PATH,
    WEBHOOK_NAME,
    WebhookLimits,
    webhook_configuration,
)
from dam_operator.cluster.settings import OperatorSettings  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "dam-operator"
RELEASE, NAMESPACE = "dam-operator", "dam-system"

ALL_FEATURES: dict[str, Any] = {
    "operator": {"replicas": 2, "peering": {"enabled": True}},
    "webhook": {"certManager": {"enabled": True}, "excludeNamespaces": ["monitoring"]},
    "metrics": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}},
    "prometheusRule": {"enabled": True},
    "grafanaDashboard": {"enabled": True},
    "rbac": {"stallRestart": True},
}
NAMESPACED: dict[str, Any] = {"operator": {"watchNamespace": "ml-team", "peering": {"enabled": True}}}
SHARDED: dict[str, Any] = {"operator": {"replicas": 3}}
VARIANTS = {
    "defaults": {},
    "all-features": ALL_FEATURES,
    "single-namespace": NAMESPACED,
    "sharded": SHARDED,
}

# Which verbs the operator needs is not listed here: tests/integration/test_operator_rbac.py and
# test_operator_e2e.py run the operator on a real API server with exactly the chart's RBAC, and any
# request the server refuses fails them.


@pytest.fixture(scope="module")
def chart() -> Iterator[Any]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def render(
    chart: Any, values: dict[str, Any] | None = None, namespace: str = NAMESPACE
) -> list[dict[str, Any]]:
    manifests = chart.render(values or {}, name=RELEASE, namespace=namespace, is_install=True)
    objects: list[dict[str, Any]] = []
    for text in manifests.values():
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = of_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def env_of(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


# ------------------------------------------------------------------ lint and schema


@pytest.mark.parametrize("values", VARIANTS.values(), ids=VARIANTS.keys())
def test_chart_lints_clean_in_strict_mode(values: dict[str, Any]) -> None:
    report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not report["errors"] and not problems, report


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"replicaCount": 2}, "replicaCount"),
        ({"operator": {"replica": 2}}, "replica"),
        ({"webhook": {"certManager": {"enable": True}}}, "enable"),
        ({"webhook": {"timeoutSeconds": 10}}, "timeoutSeconds"),
        ({"operator": {"replicas": 0}}, "replicas"),
        ({"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
        ({"image": {"digest": "latest"}}, "digest"),
        ({"operator": {"resources": {"limits": {"memory": "a lot"}}}}, "memory"),
        ({"operator": {"watchNamespace": "Not_A_Namespace"}}, "watchNamespace"),
        ({"webhook": {"excludeNamespaces": "kube-public"}}, "excludeNamespaces"),
        ({"rbac": {"stallRestart": "yes"}}, "stallRestart"),
    ],
    ids=lambda v: json.dumps(v) if isinstance(v, dict) else v,
)
def test_values_that_break_the_schema_are_rejected(
    chart: Any, values: dict[str, Any], complaint: str
) -> None:
    with pytest.raises(helm.HelmValuesError, match=complaint):
        render(chart, values)


def test_valid_overrides_pass_the_schema(chart: Any) -> None:
    values = {
        "image": {"digest": "sha256:" + "a" * 64},
        "operator": {
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": 0.5e9}},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
            "extraEnv": [{"name": "DAM_API_RETRIES", "value": "6"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}},
        },
    }
    chart.validate_schema(values)
    deployment = one(render(chart, values), "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "ghcr.io/mlsys/dam-operator@sha256:" + "a" * 64
    assert container["resources"]["requests"] == {"cpu": "100m", "memory": "128Mi"}
    assert env_of(deployment)["DAM_API_RETRIES"] == "6"


def _object_schemas(node: Any, path: str = "$") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        if node.get("type") == "object":
            yield path, node
        for key, child in node.items():
            if key == "properties":
                for name, sub in child.items():
                    yield from _object_schemas(sub, f"{path}.{name}")
            elif isinstance(child, dict | list):
                yield from _object_schemas(child, f"{path}.{key}")
    elif isinstance(node, list):
        for i, child in enumerate(node):
            yield from _object_schemas(child, f"{path}[{i}]")


# Objects whose inner structure is Kubernetes' own (validated by the API server), and Helm's globals.
PASS_THROUGH = {
    "$.global",
    "$.operator.affinity.nodeAffinity",
    "$.operator.affinity.podAffinity",
    "$.operator.affinity.podAntiAffinity",
}


def test_schema_closes_every_object_level() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    open_objects = [
        path
        for path, node in _object_schemas(schema)
        if path not in PASS_THROUGH and node.get("additionalProperties", True) is True
    ]
    assert not open_objects, f"objects that accept unknown keys: {open_objects}"


def _leaf_paths(node: Any, prefix: str = "") -> set[str]:
    if isinstance(node, dict) and node:
        return {p for k, v in node.items() for p in _leaf_paths(v, f"{prefix}.{k}" if prefix else k)}
    return {prefix}


def _schema_paths(node: dict[str, Any], prefix: str = "") -> set[str]:
    props = node.get("properties")
    if not props:
        return {prefix}
    return {p for k, v in props.items() for p in _schema_paths(v, f"{prefix}.{k}" if prefix else k)}


def test_values_and_schema_name_the_same_keys(chart: Any) -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    in_values = _leaf_paths(yaml.safe_load((CHART / "values.yaml").read_text()))
    in_schema = _schema_paths(schema) - {"global"}
    # Maps with typed free-form keys (resources, labels, ...) end at their own key in the schema.
    # An empty map in values.yaml (resources: {}) is covered by the keys the schema gives it.
    uncovered = {
        p
        for p in in_values
        if not any(p == s or p.startswith(s + ".") or s.startswith(p + ".") for s in in_schema)
    }
    assert not uncovered, f"values.yaml keys missing from values.schema.json: {uncovered}"
    undocumented = {
        s
        for s in in_schema
        if not any(v == s or v.startswith(s + ".") or s.startswith(v + ".") for v in in_values)
    }
    assert not undocumented, f"schema keys without a default in values.yaml: {undocumented}"


def test_every_value_is_documented_in_values_yaml() -> None:
    lines = (CHART / "values.yaml").read_text().splitlines()
    undocumented = []
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)([A-Za-z][\w]*):\s*(\S.*)?$", line)
        if not m:
            continue
        is_parent = m.group(3) is None
        if is_parent:
            continue
        previous = lines[i - 1].strip() if i else ""
        if not previous.startswith("#"):
            undocumented.append(m.group(2))
    assert not undocumented, f"values without a comment line above them: {undocumented}"


# ------------------------------------------------------------------ what gets rendered


def test_default_render_has_the_operator_its_webhook_and_rbac(chart: Any) -> None:
    kinds = sorted(o["kind"] for o in render(chart))
    assert kinds == sorted(
        [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "Role",  # default/kubernetes: the API server's addresses (urlpolicy)
            "RoleBinding",
            "Role",  # the operator's own Services (urlpolicy)
            "RoleBinding",
            "Deployment",
            "Service",
            "Service",
            "MutatingWebhookConfiguration",
        ]
    )


def test_optional_objects_appear_only_when_switched_on(chart: Any) -> None:
    default = {o["kind"] for o in render(chart)}
    everything = {o["kind"] for o in render(chart, ALL_FEATURES)}
    optional = {"ServiceMonitor", "PodMonitor", "PrometheusRule", "ConfigMap", "Certificate", "Issuer"}
    assert not optional & default
    assert optional | {"CustomResourceDefinition", "ClusterKopfPeering"} <= everything


@pytest.mark.parametrize("values", VARIANTS.values(), ids=VARIANTS.keys())
def test_every_object_is_labelled_and_namespaced_objects_are_placed(
    chart: Any, values: dict[str, Any]
) -> None:
    cluster_scoped = {
        "ClusterRole",
        "ClusterRoleBinding",
        "MutatingWebhookConfiguration",
        "CustomResourceDefinition",
        "ClusterKopfPeering",
    }
    for obj in render(chart, values):
        meta = obj["metadata"]
        assert meta["labels"]["app.kubernetes.io/instance"] == RELEASE, obj["kind"]
        assert len(meta["name"]) <= 63
        if obj["kind"] in cluster_scoped:
            assert "namespace" not in meta, obj["kind"]
        else:
            assert meta.get("namespace"), f"{obj['kind']} {meta['name']} has no namespace"


# ------------------------------------------------------------------ security


@pytest.mark.parametrize("values", VARIANTS.values(), ids=VARIANTS.keys())
def test_operator_pod_is_restricted_and_unprivileged(chart: Any, values: dict[str, Any]) -> None:
    deployment = one(render(chart, values), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        assert not pod.get(key), key
    assert not [v for v in pod.get("volumes", []) if "hostPath" in v]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in pod["containers"] + pod.get("initContainers", []):
        sc = container["securityContext"]
        assert sc["runAsNonRoot"] is True
        assert isinstance(sc["runAsUser"], int) and sc["runAsUser"] > 0
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc.get("privileged", False) is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
        assert not [p for p in container.get("ports", []) if "hostPort" in p]
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"  # serves, not only lives
        # A memory limit sized for 5,000 profiles plus every body read at its cap (values.yaml).
        assert container["resources"]["limits"]["memory"] == "1280Mi"
        assert container["resources"]["requests"]["memory"] == "256Mi"


def test_memory_limit_holds_the_measured_peak_and_every_capped_read_at_once(chart: Any) -> None:
    """The limit is what 5,000 profiles x 2 pods peaked at (docs/performance.md: 195 MiB) plus
    every read at its cap at once and one Prometheus answer decoded (3.6 x its bytes, measured
    at 5 x for margin), and the webhook's server full (every connection open with its request's
    bytes in flight, 0.64 MiB each measured, and its body budget taken, 2.3 x its bytes
    measured); a cap or a concurrency raised without the limit fails here."""
    deployment = one(render(chart), "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = env_of(deployment)
    settings = OperatorSettings.model_validate(
        {k[4:].lower(): v for k, v in env.items() if k.startswith("DAM_") and isinstance(v, str)}
    )
    mib = 1024 * 1024
    limit = container["resources"]["limits"]["memory"]
    assert limit.endswith("Mi")
    needed = (
        195 * mib
        + settings.scrape_concurrency * settings.scrape_max_bytes
        + settings.prometheus_concurrency * settings.prometheus_max_answer_bytes
        + 5 * settings.prometheus_max_answer_bytes
        + WebhookLimits().max_connections * 0.7 * mib
        + 2.5 * WebhookLimits().max_buffered_bytes
    )
    assert int(limit[:-2]) * mib >= needed, f"{limit} < {needed / mib:.0f} MiB"
    assert env["DAM_PROMETHEUS_MAX_ANSWER_BYTES"] == "16777216"  # an integer, not 1.6777216e+07
    assert env["DAM_SCRAPE_MAX_BYTES"] == "1048576"


def test_prometheus_allow_lists_reach_the_operator(chart: Any) -> None:
    values = {
        "operator": {
            "prometheus": {
                "url": "http://prometheus-operated.monitoring.svc:9090",
                "allowedUrlPrefixes": ["https://thanos.example.com/a", "http://p.monitoring.svc:9090/"],
                "allowedNetworks": ["127.0.0.0/8"],
            }
        }
    }
    env = env_of(one(render(chart, values), "Deployment"))
    settings = OperatorSettings.model_validate(
        {k[4:].lower(): v for k, v in env.items() if k.startswith("DAM_") and isinstance(v, str)}
    )
    assert settings.prometheus_url == "http://prometheus-operated.monitoring.svc:9090"
    assert settings.prometheus_allowed_url_prefixes == [
        "https://thanos.example.com/a",
        "http://p.monitoring.svc:9090/",
    ]
    assert settings.prometheus_allowed_networks == ["127.0.0.0/8"]
    defaults = env_of(one(render(chart), "Deployment"))
    assert "DAM_PROMETHEUS_URL" not in defaults and "DAM_PROMETHEUS_ALLOWED_NETWORKS" not in defaults


def test_the_injected_image_and_a_shared_process_namespace_are_the_admins_choice(chart: Any) -> None:
    def settings_of(values: dict[str, Any] | None = None) -> OperatorSettings:
        env = env_of(one(render(chart, values), "Deployment"))
        return OperatorSettings.model_validate(
            {k[4:].lower(): v for k, v in env.items() if k.startswith("DAM_") and isinstance(v, str)}
        )

    defaults = settings_of()  # secure by default: no other image, no sharing
    assert defaults.sidecar_allowed_images == [] and defaults.sidecar_allow_share_process_namespace is False
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert defaults.default_sidecar_image == f"ghcr.io/mlsys/dam-operator:{app_version}"
    pinned = settings_of({"image": {"digest": "sha256:" + "b" * 64}})
    assert pinned.default_sidecar_image == "ghcr.io/mlsys/dam-operator@sha256:" + "b" * 64  # by digest
    loosened = settings_of(
        {"sidecar": {"allowedImages": ["r.example/a:1", "r.example/b:2"], "allowShareProcessNamespace": True}}
    )
    assert loosened.sidecar_allowed_images == ["r.example/a:1", "r.example/b:2"]
    assert loosened.sidecar_allow_share_process_namespace is True


def test_operator_probes_and_ports_match_the_operator_settings(chart: Any) -> None:
    deployment = one(render(chart), "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    defaults = OperatorSettings()
    assert ports["metrics"] == defaults.metrics_port
    assert ports["webhook"] == defaults.webhook_port
    assert f":{ports['health']}/" in str(defaults.liveness_endpoint)
    assert container["livenessProbe"]["httpGet"]["port"] == "health"
    assert container["readinessProbe"]["httpGet"]["port"] == "metrics"


@pytest.mark.parametrize("values", VARIANTS.values(), ids=VARIANTS.keys())
def test_operator_environment_names_only_real_settings(chart: Any, values: dict[str, Any]) -> None:
    fields = {f"DAM_{name.upper()}" for name in OperatorSettings.model_fields}
    env = env_of(one(render(chart, values), "Deployment"))
    unknown = {k for k in env if k.startswith("DAM_")} - fields
    assert not unknown, f"the chart sets DAM_ variables the operator does not read: {unknown}"
    OperatorSettings.model_validate(
        {k[4:].lower(): v for k, v in env.items() if k.startswith("DAM_") and isinstance(v, str)}
    )


def _rules(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [rule for role in of_kind(objects, kind) for rule in role["rules"]]


def _verbs(rules: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
    verbs: dict[tuple[str, str], set[str]] = {}
    for rule in rules:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                verbs.setdefault((group, resource), set()).update(rule["verbs"])
    return verbs


@pytest.mark.parametrize("values", VARIANTS.values(), ids=VARIANTS.keys())
def test_rbac_has_no_wildcards(chart: Any, values: dict[str, Any]) -> None:
    objects = render(chart, values)
    for rule in _rules(objects, "ClusterRole") + _rules(objects, "Role"):
        for key in ("apiGroups", "resources", "verbs", "resourceNames"):
            assert not [v for v in rule.get(key, []) if "*" in v], rule
        assert "nonResourceURLs" not in rule


def test_webhook_configuration_access_is_limited_to_the_charts_own(chart: Any) -> None:
    objects = render(chart)
    (mwc_rule,) = [
        r for r in _rules(objects, "ClusterRole") if "mutatingwebhookconfigurations" in r["resources"]
    ]
    assert mwc_rule["resourceNames"] == [one(objects, "MutatingWebhookConfiguration")["metadata"]["name"]]
    assert "create" not in mwc_rule["verbs"] and "delete" not in mwc_rule["verbs"]


def test_secrets_are_granted_only_in_the_release_namespace(chart: Any) -> None:
    objects = render(chart)
    assert not [r for r in _rules(objects, "ClusterRole") if "secrets" in r["resources"]]
    (role,) = [r for r in of_kind(objects, "Role") if any("secrets" in x["resources"] for x in r["rules"])]
    assert role["metadata"]["namespace"] == NAMESPACE
    assert _verbs(role["rules"]) == {("", "secrets"): {"get", "create", "update"}}
    named = [r for r in role["rules"] if set(r["verbs"]) & {"get", "update", "patch"}]
    secret_name = env_of(one(objects, "Deployment"))["DAM_CERT_SECRET_NAME"]
    assert all(r["resourceNames"] == [secret_name] for r in named)
    (binding,) = [
        b for b in of_kind(objects, "RoleBinding") if b["roleRef"]["name"] == role["metadata"]["name"]
    ]
    assert binding["subjects"][0]["name"] == one(objects, "ServiceAccount")["metadata"]["name"]


def test_cert_manager_mode_needs_no_secret_access(chart: Any) -> None:
    objects = render(chart, {"webhook": {"certManager": {"enabled": True}}})
    assert not [
        r for r in _rules(objects, "Role") + _rules(objects, "ClusterRole") if "secrets" in r["resources"]
    ]


def test_peering_adds_only_peering_access(chart: Any) -> None:
    without = _verbs(_rules(render(chart), "ClusterRole"))
    with_peering = _verbs(_rules(render(chart, {"operator": {"peering": {"enabled": True}}}), "ClusterRole"))
    assert with_peering == {**without, ("kopf.dev", "clusterkopfpeerings"): {"get", "list", "watch", "patch"}}


def test_single_namespace_mode_keeps_watch_rights_in_that_namespace(chart: Any) -> None:
    objects = render(chart, NAMESPACED)
    cluster = _verbs(_rules(objects, "ClusterRole"))
    assert set(cluster) == {
        ("apiextensions.k8s.io", "customresourcedefinitions"),
        ("admissionregistration.k8s.io", "mutatingwebhookconfigurations"),
        ("", "namespaces"),  # kopf follows the namespaces it serves
    }
    assert cluster[("", "namespaces")] == {"list", "watch"}
    (watch_role,) = [r for r in of_kind(objects, "Role") if r["metadata"]["namespace"] == "ml-team"]
    assert ("dam.mlsys.dev", "damprofiles") in _verbs(watch_role["rules"])
    assert ("kopf.dev", "kopfpeerings") in _verbs(watch_role["rules"])
    assert env_of(one(objects, "Deployment"))["DAM_NAMESPACE"] == "ml-team"
    assert one(objects, "KopfPeering")["metadata"]["namespace"] == "ml-team"


def _pod_verbs(objects: list[dict[str, Any]]) -> set[str]:
    rules = _rules(objects, "ClusterRole") + _rules(objects, "Role")
    return {verb for rule in rules if "pods" in rule["resources"] for verb in rule["verbs"]}


def _stall_restart_setting(objects: list[dict[str, Any]]) -> bool:
    """What the operator would read: OperatorSettings from the rendered DAM_ variables."""
    env = env_of(one(objects, "Deployment"))
    given = {k[4:].lower(): v for k, v in env.items() if k.startswith("DAM_") and isinstance(v, str)}
    return OperatorSettings.model_validate(given).stall_restart_enabled


@pytest.mark.parametrize("values", [{}, NAMESPACED], ids=["cluster-wide", "single-namespace"])
def test_pods_are_never_deleted_unless_the_admin_grants_it(chart: Any, values: dict[str, Any]) -> None:
    objects = render(chart, values)
    assert "delete" not in _pod_verbs(objects)
    assert "DAM_STALL_RESTART_ENABLED" not in env_of(one(objects, "Deployment"))
    assert _stall_restart_setting(objects) is False


def test_stall_restart_adds_only_pod_deletion_cluster_wide_and_enables_it(chart: Any) -> None:
    without = render(chart)
    granted = render(chart, {"rbac": {"stallRestart": True}})
    before = _verbs(_rules(without, "ClusterRole"))
    pods = ("", "pods")
    assert _verbs(_rules(granted, "ClusterRole")) == {**before, pods: before[pods] | {"delete"}}
    assert _verbs(_rules(granted, "Role")) == _verbs(_rules(without, "Role"))
    assert env_of(one(granted, "Deployment"))["DAM_STALL_RESTART_ENABLED"] == "true"
    assert _stall_restart_setting(granted) is True


def test_stall_restart_in_single_namespace_mode_deletes_only_in_that_namespace(chart: Any) -> None:
    objects = render(chart, {**NAMESPACED, "rbac": {"stallRestart": True}})
    assert ("", "pods") not in _verbs(_rules(objects, "ClusterRole"))
    deleting = [
        r for r in of_kind(objects, "Role") if "delete" in _verbs(r["rules"]).get(("", "pods"), set())
    ]
    assert [r["metadata"]["namespace"] for r in deleting] == ["ml-team"]
    assert _stall_restart_setting(objects) is True


def test_more_than_one_replica_without_sharding_or_peering_is_refused(chart: Any) -> None:
    with pytest.raises(helm.HelmError, match=r"sharding\.enabled or operator\.peering\.enabled"):
        render(chart, {"operator": {"replicas": 3, "sharding": {"enabled": False}}})


def test_a_lease_shorter_than_four_renewals_is_refused(chart: Any) -> None:
    with pytest.raises(helm.HelmError, match="leaseDurationSeconds"):
        render(
            chart, {"operator": {"replicas": 3, "sharding": {"leaseDurationSeconds": 7, "renewSeconds": 2}}}
        )


def test_replicas_share_the_profiles_each_with_a_lease_in_the_release_namespace_only(chart: Any) -> None:
    objects = render(chart, SHARDED)
    deployment = one(objects, "Deployment")
    env = env_of(deployment)
    assert deployment["spec"]["replicas"] == 3
    assert env["DAM_SHARDING"] == "true" and env["DAM_STANDALONE"] == "true"
    assert env["DAM_SHARD_IDENTITY"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["DAM_SHARD_GROUP"] == RELEASE
    # Lease rights: in the release namespace, nowhere else.
    lease_roles = [
        r for r in of_kind(objects, "Role") if ("coordination.k8s.io", "leases") in _verbs(r["rules"])
    ]
    (role,) = lease_roles
    assert role["metadata"]["namespace"] == NAMESPACE
    assert _verbs(role["rules"]) == {
        ("coordination.k8s.io", "leases"): {"get", "list", "create", "update", "delete"}
    }
    assert not [r for r in _rules(objects, "ClusterRole") if "leases" in r["resources"]]
    # A replica taking a profile over reads it once (its status as the previous owner left it).
    assert _verbs(_rules(objects, "ClusterRole"))[("dam.mlsys.dev", "damprofiles")] == {
        "list",
        "watch",
        "get",
    }
    assert _verbs(_rules(render(chart), "ClusterRole"))[("dam.mlsys.dev", "damprofiles")] == {"list", "watch"}
    (binding,) = [
        b for b in of_kind(objects, "RoleBinding") if b["roleRef"]["name"] == role["metadata"]["name"]
    ]
    assert binding["subjects"][0]["name"] == one(objects, "ServiceAccount")["metadata"]["name"]
    # One replica down at a time by a voluntary disruption; a rollout adds one before it stops one.
    pdb = one(objects, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }


def test_one_replica_is_not_sharded_unless_asked_and_peering_replaces_sharding(chart: Any) -> None:
    for values in ({}, {"operator": {"replicas": 2, "peering": {"enabled": True}}}):
        objects = render(chart, values)
        assert "DAM_SHARDING" not in env_of(one(objects, "Deployment"))
        assert not of_kind(objects, "PodDisruptionBudget")
        assert not [r for r in _rules(objects, "Role") if "leases" in r["resources"]]
    single = render(chart, {"operator": {"sharding": {"singleReplica": True}}})
    assert env_of(one(single, "Deployment"))["DAM_SHARDING"] == "true"
    assert not of_kind(single, "PodDisruptionBudget")  # one replica: a PDB would block every drain


def test_rollout_never_runs_two_unpeered_operators(chart: Any) -> None:
    assert one(render(chart), "Deployment")["spec"]["strategy"]["type"] == "Recreate"
    peered = one(render(chart, ALL_FEATURES), "Deployment")
    assert peered["spec"]["strategy"]["type"] == "RollingUpdate"
    assert env_of(peered)["DAM_STANDALONE"] == "false"


# ------------------------------------------------------------------ webhook


def _webhook(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (hook,) = one(objects, "MutatingWebhookConfiguration")["webhooks"]
    assert isinstance(hook, dict)
    return hook


@pytest.mark.parametrize("namespace", [NAMESPACE, "observability"])
def test_webhook_fails_open_fast_and_never_touches_system_namespaces(chart: Any, namespace: str) -> None:
    hook = _webhook(render(chart, namespace=namespace))
    assert hook["failurePolicy"] == "Ignore"
    assert 1 <= hook["timeoutSeconds"] <= 5
    assert hook["sideEffects"] == "None"
    assert hook["admissionReviewVersions"] == ["v1"]
    (expression,) = hook["namespaceSelector"]["matchExpressions"]
    assert expression["key"] == "kubernetes.io/metadata.name"
    assert expression["operator"] == "NotIn"
    assert {namespace, "kube-system"} <= set(expression["values"])
    assert hook["objectSelector"]["matchExpressions"] == [
        {"key": "dam.mlsys.dev/inject", "operator": "NotIn", "values": ["false"]}
    ]
    assert "caBundle" not in hook["clientConfig"]


def test_webhook_is_the_one_the_operator_would_register(chart: Any) -> None:
    objects = render(chart, {"webhook": {"excludeNamespaces": ["monitoring"]}})
    service = next(s for s in of_kind(objects, "Service") if s["metadata"]["name"].endswith("-webhook"))
    env = env_of(one(objects, "Deployment"))
    expected = webhook_configuration(
        name=env["DAM_WEBHOOK_CONFIGURATION_NAME"],
        service_name=service["metadata"]["name"],
        namespace=NAMESPACE,
        exclude_namespaces=["monitoring"],
    )
    chart_hook = _webhook(objects)
    operator_hook = expected["webhooks"][0]
    chart_hook["namespaceSelector"]["matchExpressions"][0]["values"].sort()
    operator_hook["namespaceSelector"]["matchExpressions"][0]["values"].sort()
    assert chart_hook == operator_hook
    assert chart_hook["name"] == WEBHOOK_NAME
    assert chart_hook["clientConfig"]["service"]["path"] == MUTATE_PATH
    assert env["DAM_WEBHOOK_SERVICE_NAME"] == service["metadata"]["name"]
    assert env["DAM_WEBHOOK_MANAGE_CONFIGURATION"] == "false"
    assert env["DAM_EXCLUDED_NAMESPACES"].split(",") == ["kube-system", "monitoring"]
    target = service["spec"]["ports"][0]["targetPort"]
    container_ports = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert target in {p["name"] for p in container_ports}


def test_cert_manager_issues_the_certificate_and_injects_the_ca(chart: Any) -> None:
    objects = render(chart, {"webhook": {"certManager": {"enabled": True}}})
    certificate = one(objects, "Certificate")
    mwc = one(objects, "MutatingWebhookConfiguration")
    assert mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
        f"{NAMESPACE}/{certificate['metadata']['name']}"
    )
    service = _webhook(objects)["clientConfig"]["service"]["name"]
    assert f"{service}.{NAMESPACE}.svc" in certificate["spec"]["dnsNames"]
    assert certificate["spec"]["issuerRef"]["name"] == one(objects, "Issuer")["metadata"]["name"]
    deployment = one(objects, "Deployment")
    env = env_of(deployment)
    assert env["DAM_CERT_MODE"] == "files"
    pod = deployment["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if "secret" in v]
    assert volume["secret"]["secretName"] == certificate["spec"]["secretName"]
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["mountPath"] == env["DAM_CERT_DIR"] and mount["readOnly"] is True


def test_cert_manager_with_an_existing_issuer_makes_no_issuer(chart: Any) -> None:
    values = {
        "webhook": {
            "certManager": {"enabled": True, "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}}
        }
    }
    objects = render(chart, values)
    assert not of_kind(objects, "Issuer")
    assert one(objects, "Certificate")["spec"]["issuerRef"]["kind"] == "ClusterIssuer"


# ------------------------------------------------------------------ shared files: CRD, rules, dashboard


def test_chart_crd_is_the_repository_crd(chart: Any) -> None:
    link = CHART / "crds"
    assert link.is_symlink() and link.resolve() == (ROOT / "crds").resolve(), (
        "the CRD must live once, in crds/"
    )
    repo_crds = sorted((ROOT / "crds").glob("*.yaml"))
    assert repo_crds, "crds/ is empty"
    by_name = {Path(c["name"]).name: c["data"] for c in chart.crds}
    assert by_name == {p.name: p.read_text() for p in repo_crds}
    names = [yaml.safe_load(c["data"])["metadata"]["name"] for c in chart.crds]
    assert "damprofiles.dam.mlsys.dev" in names


def test_prometheus_rule_is_the_alert_file(chart: Any) -> None:
    rule = one(
        render(chart, {"prometheusRule": {"enabled": True, "labels": {"release": "kps"}}}), "PrometheusRule"
    )
    assert rule["spec"] == yaml.safe_load((ROOT / "alerts" / "dam-alerts.yaml").read_text())
    assert rule["metadata"]["labels"]["release"] == "kps"


def test_dashboard_config_map_carries_the_dashboard_for_grafana(chart: Any) -> None:
    values = {
        "grafanaDashboard": {"enabled": True, "namespace": "grafana", "annotations": {"grafana_folder": "ML"}}
    }
    config_map = one(render(chart, values), "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["namespace"] == "grafana"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "ML"}
    dashboard_file = CHART / "dashboards" / "dam.json"
    assert json.loads(config_map["data"]["dam.json"]) == json.loads(dashboard_file.read_text())


def test_monitors_scrape_the_operator_and_the_sidecar_ports(chart: Any) -> None:
    objects = render(chart, ALL_FEATURES)
    service_monitor, pod_monitor = one(objects, "ServiceMonitor"), one(objects, "PodMonitor")
    (endpoint,) = service_monitor["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True  # the operator's namespace/profile labels must survive
    metrics_service = next(
        s for s in of_kind(objects, "Service") if s["metadata"]["name"].endswith("-metrics")
    )
    assert endpoint["port"] in {p["name"] for p in metrics_service["spec"]["ports"]}
    selector = service_monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= metrics_service["metadata"]["labels"].items()
    (pod_endpoint,) = pod_monitor["spec"]["podMetricsEndpoints"]
    from dam_operator.cluster.steps.injection import METRICS_PORT_NAME

    assert pod_endpoint["port"] == METRICS_PORT_NAME
