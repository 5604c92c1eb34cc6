"""The chart through a release's life (issue "a release's whole life"): `helm test` under
the chart's own NetworkPolicy, a private registry with pull secrets on every pod, the
relay as a first-class pod, a migration Job named after what it runs (GitOps renders are
always revision 1), the chart as a conditional dependency, extraEnv that replaces, and
NOTES.txt that tells the truth. Rendered by real Helm, validated against the Kubernetes
schemas; the NetworkPolicies evaluated as the API defines them."""

from __future__ import annotations

from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest

from tests.chart.test_chart import (
    CHART,
    KUBE_VERSION,
    MINIMAL,
    WORKERS,
    by_kind,
    migration_job,
    production,
    render,
)

PODS = ("Deployment", "Job", "Pod")


def pods(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every pod spec the chart renders, by its owner's kind and name."""
    out = {}
    for doc in docs:
        if doc["kind"] in ("Deployment", "Job"):
            out[f"{doc['kind']}/{doc['metadata']['name']}"] = doc["spec"]["template"]
        elif doc["kind"] == "Pod":
            out[f"Pod/{doc['metadata']['name']}"] = doc
    return out


def labels_of(pod: dict[str, Any]) -> dict[str, str]:
    return dict(pod["metadata"]["labels"])


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def _port_ok(rule: dict[str, Any], port: int) -> bool:
    return "ports" not in rule or any(p.get("port") == port for p in rule["ports"])


def _peer_ok(peers: list[dict[str, Any]] | None, labels: dict[str, str]) -> bool:
    """A peer list admits a pod of this namespace with these labels (none: everyone)."""
    if peers is None:
        return True
    return any(
        "podSelector" in p and "namespaceSelector" not in p and _selects(p["podSelector"], labels)
        for p in peers
    )


def allowed(
    policies: list[dict[str, Any]], source: dict[str, str], dest: dict[str, str], port: int
) -> bool:
    """Whether a connection from a pod labeled `source` to a pod labeled `dest` on `port`
    (same namespace) is allowed: policies add up, a pod no policy selects for a direction
    is open in it (networking.k8s.io/v1 semantics)."""
    egress = [
        p
        for p in policies
        if "Egress" in p["spec"]["policyTypes"] and _selects(p["spec"]["podSelector"], source)
    ]
    ingress = [
        p
        for p in policies
        if "Ingress" in p["spec"]["policyTypes"] and _selects(p["spec"]["podSelector"], dest)
    ]
    out_ok = not egress or any(
        _port_ok(r, port) and _peer_ok(r.get("to"), dest)
        for p in egress
        for r in p["spec"].get("egress", [])
    )
    in_ok = not ingress or any(
        _port_ok(r, port) and _peer_ok(r.get("from"), source)
        for p in ingress
        for r in p["spec"].get("ingress", [])
    )
    return out_ok and in_ok


def test_helm_test_passes_under_the_charts_own_network_policy() -> None:
    docs = render(production())
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    rendered = pods(docs)
    test = labels_of(rendered["Pod/fleet-bc-workers-test"])
    health = production().get("healthPort", 8080)
    for worker in WORKERS:
        target = labels_of(rendered[f"Deployment/fleet-bc-workers-{worker}"])
        assert allowed(policies, test, target, health), worker  # its /readyz
        other = labels_of(rendered["Deployment/fleet-bc-workers-labeler"])
        if worker != "labeler":  # and no worker reaches another's health port
            assert not allowed(policies, other, target, health), worker
    assert allowed(policies, test, {"app": "nats"}, 4222)  # `bcw provision --check`
    assert not allowed(policies, test, {"app": "nats"}, 22)
    # the scrape still comes only from the monitoring namespace: a pod here may not
    assert not allowed(policies, {"app": "curious"}, target, health)


def test_every_pod_pulls_from_the_private_registry_with_every_pull_secret() -> None:
    docs = render(production())
    rendered = pods(docs)
    assert {"Deployment/fleet-bc-workers-relay", "Pod/fleet-bc-workers-test"} <= set(rendered)
    assert any(name.startswith("Job/") for name in rendered)
    for name, pod in rendered.items():
        spec = pod["spec"]
        secrets = [s["name"] for s in spec.get("imagePullSecrets", [])]
        assert secrets == ["registry-credentials", "platform-pull"], name
        for container in spec.get("initContainers", []) + spec["containers"]:
            assert container["image"] == "registry.example.com/platform/bc-workers:0.4.0", name


# one case a row, read down its columns: kept out of the formatter (fmt: skip)
@pytest.mark.parametrize(
    ("image", "global_registry", "expected"),
    [
        ({}, "", "ghcr.io/bc-fleet/bc-workers:0.4.0"),
        ({}, "registry.local:5000", "registry.local:5000/bc-fleet/bc-workers:0.4.0"),
        ({"registry": "quay.io"}, "", "quay.io/bc-fleet/bc-workers:0.4.0"),
        ({"registry": "quay.io"}, "registry.local:5000/", "registry.local:5000/bc-fleet/bc-workers:0.4.0"),
        # a repository that still names its registry (0.3's values) keeps it, or has it replaced
        ({"repository": "registry.example.com/platform/bc-workers"}, "", "registry.example.com/platform/bc-workers:0.4.0"),
        ({"repository": "registry.example.com/platform/bc-workers"}, "registry.local:5000", "registry.local:5000/platform/bc-workers:0.4.0"),
        ({"registry": "", "repository": "localhost/bcw"}, "", "localhost/bcw:0.4.0"),
        ({"registry": "", "repository": "bcw"}, "", "bcw:0.4.0"),
        ({"tag": "0.4.1"}, "", "ghcr.io/bc-fleet/bc-workers:0.4.1"),
        ({"tag": "0.4.1", "digest": "sha256:" + "a" * 64}, "", "ghcr.io/bc-fleet/bc-workers@sha256:" + "a" * 64),
    ],
)  # fmt: skip
def test_the_image_has_one_registry_and_a_digest_pins_it(
    image: dict[str, str], global_registry: str, expected: str
) -> None:
    values = {**MINIMAL, "image": {**{"repository": "bc-fleet/bc-workers"}, **image}}
    if global_registry:
        values["global"] = {"imageRegistry": global_registry}
    for name, pod in pods(render(values)).items():
        for container in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]:
            assert container["image"] == expected, name


def test_a_bad_digest_is_refused_by_the_schema() -> None:
    with pytest.raises(Exception, match="digest"):
        render({**MINIMAL, "image": {"repository": "x", "digest": "latest"}})


def test_the_relay_is_scheduled_scraped_and_budgeted_like_a_worker() -> None:
    values = production()
    values["relay"] = {
        **values["relay"],
        "nodeSelector": {"pool": "relay"},
        "tolerations": [{"key": "dedicated", "operator": "Exists"}],
        "affinity": {"podAntiAffinity": {}},
    }
    docs = render(values)
    relay = by_kind(docs, "Deployment")["fleet-bc-workers-relay"]["spec"]["template"]
    spec = relay["spec"]
    assert (
        spec["nodeSelector"] == {"pool": "relay"} and spec["tolerations"][0]["key"] == "dedicated"
    )
    assert (
        spec["affinity"] == {"podAntiAffinity": {}}
        and spec["priorityClassName"] == "fleet-critical"
    )
    assert (
        spec["topologySpreadConstraints"][0]["labelSelector"]["matchLabels"][
            "app.kubernetes.io/component"
        ]
        == "relay"
    )
    service = by_kind(docs, "Service")["fleet-bc-workers-relay"]
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "relay"
    assert service["spec"]["ports"][0]["name"] == "http"
    [monitor] = by_kind(docs, "ServiceMonitor").values()
    assert all(
        service["metadata"]["labels"][k] == v
        for k, v in monitor["spec"]["selector"]["matchLabels"].items()
    )
    assert monitor["spec"]["endpoints"][0]["port"] == "http"
    budget = by_kind(docs, "PodDisruptionBudget")["fleet-bc-workers-relay"]
    assert budget["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "relay"
    # without its own: the chart-wide scheduling, as a worker
    values["relay"] = {**production()["relay"], "priorityClassName": ""}
    spec = by_kind(render(values), "Deployment")["fleet-bc-workers-relay"]["spec"]["template"][
        "spec"
    ]
    assert spec["nodeSelector"] == production()["nodeSelector"]
    for doc in docs:
        if not doc["apiVersion"].startswith("monitoring.coreos.com"):
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_the_migration_job_is_named_after_what_it_runs() -> None:
    name = lambda values: migration_job(render(values))["metadata"]["name"]  # noqa: E731
    first = name({**MINIMAL, "image": {"repository": "bc-fleet/bc-workers", "tag": "0.4.0"}})
    assert first == name(
        {**MINIMAL, "image": {"repository": "bc-fleet/bc-workers", "tag": "0.4.0"}}
    )
    assert first != name(
        {**MINIMAL, "image": {"repository": "bc-fleet/bc-workers", "tag": "0.4.1"}}
    )
    assert first != name(
        {
            **MINIMAL,
            "image": {"repository": "bc-fleet/bc-workers", "tag": "0.4.0"},
            "migrations": {"helloProof": "require"},
        }
    )
    # not after a secret: the database URL is no part of the name
    assert first == name(
        {
            **MINIMAL,
            "database": {"url": "postgresql://other@db/bcw"},
            "image": {"repository": "bc-fleet/bc-workers", "tag": "0.4.0"},
        }
    )
    long = {**MINIMAL, "fullnameOverride": "f" * 63}
    assert len(name(long)) <= 63


def test_enabled_false_renders_nothing_and_true_renders_the_chart() -> None:
    assert render({**MINIMAL, "enabled": False}) == []
    chart = helm.Chart.load(str(CHART))
    notes = chart.render(
        {**MINIMAL, "enabled": False}, name="fleet", namespace="cp", is_install=True
    )
    assert not any(text.strip() for text in notes.values())
    docs = render({**MINIMAL, "enabled": True})
    assert len(by_kind(docs, "Deployment")) == len(WORKERS)


def test_extra_env_replaces_what_the_chart_sets_and_a_workers_own_env_wins() -> None:
    values = {
        **MINIMAL,
        "extraEnv": [
            {"name": "BCW_LOG_LEVEL", "value": "DEBUG"},
            {"name": "BCW_CONSUMER_BATCH_SIZE", "value": "256"},
        ],
        "workers": {"replay": {"env": [{"name": "BCW_CONSUMER_BATCH_SIZE", "value": "64"}]}},
        "relay": {"enabled": True},
    }
    for name, pod in pods(render(values)).items():
        for container in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]:
            if "env" not in container:
                continue
            names = [e["name"] for e in container["env"]]
            assert len(names) == len(set(names)), (name, container["name"])
            env = {e["name"]: e.get("value") for e in container["env"]}
            assert env["BCW_LOG_LEVEL"] == "DEBUG"
            expected = "64" if name.endswith("-replay") and container["name"] == "replay" else "256"
            assert env["BCW_CONSUMER_BATCH_SIZE"] == expected, name
            if (
                name.startswith("Deployment/")
                and not name.endswith("-relay")
                and container["name"] != "wait-for-schema"
            ):
                assert env["BCW_OUTBOX_RELAY"] == "false"


def test_defaults_replicas_apply_and_notes_tell_the_real_counts_and_streams() -> None:
    values = {
        **MINIMAL,
        "defaults": {"replicas": 3},
        "subjectRoot": "my-fleet",
        "workers": {"replay": {"replicas": 5}, "recorder": {"replicas": 0}},
        "nats": {"factsGateways": ["gw-1"]},
        "relay": {"enabled": True},
        "logLevel": "CRITICAL",
    }
    deployments = by_kind(render(values), "Deployment")
    replicas = {
        n.removeprefix("fleet-bc-workers-"): d["spec"]["replicas"] for n, d in deployments.items()
    }
    assert replicas == {
        "labeler": 3,
        "liveness": 3,
        "quarantine": 3,
        "replay": 5,
        "recorder": 0,
        "relay": 2,
    }
    chart = helm.Chart.load(str(CHART))
    rendered = chart.render(values, name="fleet", namespace="cp", is_install=True)
    [notes] = [text for name, text in rendered.items() if name.endswith("NOTES.txt")]
    for worker, n in replicas.items():
        assert f"  - {worker}: {n} replica(s)" in notes
    assert (
        "MY_FLEET_FACTS, MY_FLEET_EVENTS, MY_FLEET_GATEWAY, MY_FLEET_DEAD, MY_FLEET_FACTS_gw-1"
        in notes
    )
    env = {
        e["name"]: e["value"]
        for e in deployments["fleet-bc-workers-replay"]["spec"]["template"]["spec"]["containers"][
            0
        ]["env"]
        if "value" in e
    }
    assert env["BCW_LOG_LEVEL"] == "CRITICAL"  # the schema accepts what the application does
