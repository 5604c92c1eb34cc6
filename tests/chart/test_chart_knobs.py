"""The chart's knobs of issue 60, item 8 (probes, revision history, common labels and
annotations, extra objects, per-component pod metadata, the disruption budget, the
ServiceMonitor's scrape, extra network rules, the test Pod's resources and login, the
retention checked at render), rendered by real Helm and validated against the Kubernetes
schemas as test_chart.py does."""

from __future__ import annotations

import copy
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest

from tests.chart.test_chart import CHART, KUBE_VERSION, MINIMAL, WORKERS, by_kind, production
from tests.chart.test_chart import render as render_chart

EVERYTHING: dict[str, Any] = {
    **MINIMAL,
    "commonLabels": {"team": "fleet"},
    "commonAnnotations": {"owner": "platform"},
    "relay": {"enabled": True, "podLabels": {"tier": "relay"}, "podAnnotations": {"r": "1"}},
    "serviceMonitor": {
        "enabled": True,
        "scrapeTimeout": "10s",
        "relabelings": [{"action": "replace", "targetLabel": "cluster", "replacement": "a"}],
        "metricRelabelings": [{"action": "drop", "sourceLabels": ["__name__"], "regex": "x"}],
    },
    "prometheusRule": {"enabled": True},
    "grafanaDashboard": {"enabled": True},
    "autoscaling": {"enabled": True},
    "networkPolicy": {
        "enabled": True,
        "extraEgress": [{"ports": [{"port": 6432, "protocol": "TCP"}]}],
        "extraIngress": [{"ports": [{"port": 9999, "protocol": "TCP"}]}],
    },
    "podDisruptionBudget": {"minAvailable": 1, "unhealthyPodEvictionPolicy": "AlwaysAllow"},
    "extraObjects": [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": '{{ include "bcw.fullname" . }}-critical'},
            "value": 1000000,
        },
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: extra\n"
        "  namespace: {{ .Release.Namespace }}\ndata: {release: {{ .Release.Name | quote }}}\n",
    ],
}


def render(values: dict[str, Any], tests: bool = False) -> list[dict[str, Any]]:
    """The manifests (the `helm test` Pod included when `tests`)."""
    docs = render_chart(values)
    return docs if tests else [d for d in docs if d["kind"] != "Pod"]


def _with(**values: Any) -> dict[str, Any]:
    out = copy.deepcopy(MINIMAL)
    out.update(copy.deepcopy(values))
    return out


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc["spec"]
    pod = spec if doc["kind"] == "Pod" else spec["template"]["spec"]
    return [*pod.get("initContainers", []), *pod["containers"]]


def _main(docs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return dict(by_kind(docs, "Deployment")[f"fleet-bc-workers-{name}"]["spec"]["template"])


def test_every_knob_at_once_renders_valid_manifests() -> None:
    docs = render_chart(EVERYTHING)
    kinds = {d["kind"] for d in docs}
    assert {"PriorityClass", "ConfigMap", "ServiceMonitor", "ScaledObject", "Pod"} <= kinds
    for doc in docs:
        if doc["apiVersion"].split("/")[0] in ("monitoring.coreos.com", "keda.sh"):
            continue  # a CRD's kind: not in the core schemas
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    report = helm.lint(str(CHART), EVERYTHING, strict=True, kube_version=f"v{KUBE_VERSION}.0")
    problems = [m for m in report["messages"] if m["severity"] >= 2] + report.get("errors", [])
    assert not problems, problems


def test_common_labels_and_annotations_are_on_every_object_the_chart_renders() -> None:
    docs = render_chart(EVERYTHING)
    ours = [d for d in docs if d["metadata"]["name"] not in ("extra", "fleet-bc-workers-critical")]
    assert len(ours) > 20
    for doc in ours:
        meta = doc["metadata"]
        assert meta["labels"]["team"] == "fleet", (doc["kind"], meta["name"])
        assert meta["annotations"]["owner"] == "platform", (doc["kind"], meta["name"])
        assert meta["labels"]["app.kubernetes.io/name"] == "bc-workers"
    for name in [*WORKERS, "relay"]:
        assert _main(docs, name)["metadata"]["labels"]["team"] == "fleet"
    pod = by_kind(docs, "Pod")["fleet-bc-workers-test"]  # its hook annotations kept
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    account = by_kind(docs, "ServiceAccount")["fleet-bc-workers"]["metadata"]["annotations"]
    plain = render(_with(serviceAccount={"annotations": {"iam": "role"}}))
    assert by_kind(plain, "ServiceAccount")["fleet-bc-workers"]["metadata"]["annotations"] == {
        "iam": "role"
    }
    assert account == {"owner": "platform"}
    assert "annotations" not in by_kind(plain, "Deployment")["fleet-bc-workers-labeler"]["metadata"]


def test_common_labels_are_a_new_migration_job_whose_pod_template_cannot_change() -> None:
    def job(values: dict[str, Any]) -> str:
        [name] = [d["metadata"]["name"] for d in render(values) if d["kind"] == "Job"]
        return name

    assert job(_with(commonLabels={"team": "a"})) != job(_with(commonLabels={"team": "b"}))
    assert job(_with(commonAnnotations={"a": "1"})) == job(MINIMAL)  # not in its pods


def test_common_labels_may_not_replace_the_charts_own() -> None:
    chart = helm.Chart.load(str(CHART))
    with pytest.raises(helm.HelmValuesError):
        chart.validate_schema({"commonLabels": {"app.kubernetes.io/name": "other"}})


def test_extra_objects_are_rendered_through_tpl() -> None:
    docs = render(EVERYTHING)
    assert by_kind(docs, "PriorityClass")["fleet-bc-workers-critical"]["value"] == 1000000
    extra = by_kind(docs, "ConfigMap")["extra"]
    assert extra["metadata"]["namespace"] == "control-plane"
    assert extra["data"] == {"release": "fleet"}


def test_each_component_gets_its_own_pod_labels_and_annotations_over_the_charts() -> None:
    docs = render(
        _with(
            podLabels={"team": "fleet", "tier": "all"},
            podAnnotations={"a": "global"},
            workers={"labeler": {"podLabels": {"tier": "labeler"}, "podAnnotations": {"b": "own"}}},
            relay={"enabled": True, "podAnnotations": {"a": "relay"}},
        )
    )
    labeler = _main(docs, "labeler")["metadata"]
    assert labeler["labels"]["tier"] == "labeler" and labeler["labels"]["team"] == "fleet"
    assert labeler["annotations"]["a"] == "global" and labeler["annotations"]["b"] == "own"
    assert labeler["annotations"]["bc.dev/secrets"]  # the chart's own kept
    replay = _main(docs, "replay")["metadata"]
    assert replay["labels"]["tier"] == "all" and "b" not in replay["annotations"]
    relay = _main(docs, "relay")["metadata"]  # the relay gets the chart-wide ones too
    assert relay["labels"]["tier"] == "all" and relay["annotations"]["a"] == "relay"
    assert labeler["labels"]["app.kubernetes.io/component"] == "worker-labeler"


def _probes(docs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    [container] = _main(docs, name)["spec"]["containers"]
    return {k: container.get(k) for k in ("startupProbe", "livenessProbe", "readinessProbe")}


def test_a_slow_start_is_given_minutes_before_the_liveness_probe_may_restart_it() -> None:
    docs = render(_with(relay={"enabled": True}))
    for name in [*WORKERS, "relay"]:
        probes = _probes(docs, name)
        startup = probes["startupProbe"]
        assert startup["httpGet"] == {"path": "/healthz", "port": "http"}
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 300
        assert probes["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert probes["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert "initialDelaySeconds" not in probes["livenessProbe"]  # the startup probe waits


def test_probes_merge_chart_then_defaults_then_the_components_own() -> None:
    docs = render(
        _with(
            defaults={"probes": {"liveness": {"timeoutSeconds": 3, "failureThreshold": 5}}},
            workers={
                "liveness": {
                    "probes": {
                        "liveness": {"failureThreshold": 6},
                        "readiness": {"tcpSocket": {"port": "http"}},
                        "startup": {"enabled": False},
                    }
                }
            },
            relay={"enabled": True, "probes": {"startup": {"failureThreshold": 120}}},
        )
    )
    liveness = _probes(docs, "liveness")
    assert liveness["livenessProbe"] == {
        "httpGet": {"path": "/healthz", "port": "http"},
        "periodSeconds": 10,
        "timeoutSeconds": 3,
        "failureThreshold": 6,
    }
    assert liveness["readinessProbe"] == {
        "tcpSocket": {"port": "http"},
        "periodSeconds": 5,
        "failureThreshold": 3,
    }
    assert liveness["startupProbe"] is None
    labeler = _probes(docs, "labeler")
    assert labeler["livenessProbe"]["failureThreshold"] == 5
    assert labeler["startupProbe"]["failureThreshold"] == 60
    assert _probes(docs, "relay")["startupProbe"]["failureThreshold"] == 120
    for doc in docs:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_revision_history_is_a_value_with_a_components_own_winning() -> None:
    deployments = by_kind(render(_with(relay={"enabled": True})), "Deployment")
    assert {d["spec"]["revisionHistoryLimit"] for d in deployments.values()} == {5}
    values = _with(
        defaults={"revisionHistoryLimit": 2},
        workers={"replay": {"revisionHistoryLimit": 0}},
        relay={"enabled": True, "revisionHistoryLimit": 7},
    )
    deployments = by_kind(render(values), "Deployment")
    limits = {
        n.removeprefix("fleet-bc-workers-"): d["spec"]["revisionHistoryLimit"]
        for n, d in deployments.items()
    }
    assert limits == {
        "labeler": 2,
        "liveness": 2,
        "quarantine": 2,
        "recorder": 2,
        "replay": 0,
        "relay": 7,
    }


def test_the_disruption_budget_takes_min_available_or_max_unavailable_not_both() -> None:
    budgets = by_kind(render(_with(relay={"enabled": True})), "PodDisruptionBudget")
    assert len(budgets) == 6
    assert all(b["spec"].keys() == {"maxUnavailable", "selector"} for b in budgets.values())
    assert {b["spec"]["maxUnavailable"] for b in budgets.values()} == {1}
    budgets = by_kind(
        render(_with(podDisruptionBudget={"maxUnavailable": "50%"})), "PodDisruptionBudget"
    )
    assert {b["spec"]["maxUnavailable"] for b in budgets.values()} == {"50%"}
    budgets = by_kind(render(EVERYTHING), "PodDisruptionBudget")
    for budget in budgets.values():
        assert budget["spec"]["minAvailable"] == 1 and "maxUnavailable" not in budget["spec"]
        assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    chart = helm.Chart.load(str(CHART))
    for bad in ({"minAvailable": 1, "maxUnavailable": 1}, {"unhealthyPodEvictionPolicy": "No"}):
        with pytest.raises(helm.HelmValuesError):
            chart.validate_schema({"podDisruptionBudget": bad})


def test_the_service_monitor_takes_a_scrape_timeout_and_relabelings() -> None:
    [monitor] = by_kind(render(EVERYTHING), "ServiceMonitor").values()
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["scrapeTimeout"] == "10s"
    assert endpoint["relabelings"] == EVERYTHING["serviceMonitor"]["relabelings"]
    assert endpoint["metricRelabelings"] == EVERYTHING["serviceMonitor"]["metricRelabelings"]
    [plain] = by_kind(render(_with(serviceMonitor={"enabled": True})), "ServiceMonitor").values()
    assert plain["spec"]["endpoints"][0].keys() == {"port", "path", "interval"}


def test_the_network_policy_takes_extra_egress_and_ingress_rules() -> None:
    policy = by_kind(render(EVERYTHING), "NetworkPolicy")["fleet-bc-workers"]["spec"]
    assert policy["egress"][-1] == {"ports": [{"port": 6432, "protocol": "TCP"}]}
    assert policy["ingress"][-1] == {"ports": [{"port": 9999, "protocol": "TCP"}]}
    assert len(policy["egress"]) == 3  # DNS, the chart's ports, the extra one


@pytest.mark.parametrize("values", [MINIMAL, production()], ids=["defaults", "production"])
def test_no_container_has_a_cpu_limit_by_default(values: dict[str, Any]) -> None:
    """A throttled liveness controller falls behind its facts; a throttled Python start
    (the wait for the schema, the migration Job) is slow: requests, never a CPU limit
    (docs/kubernetes.md, "CPU: requests, not limits"). The production example's labeler
    sets one well above its request, as the docs say to where a policy requires it."""
    for doc in render(values, tests=True):
        if doc["kind"] not in ("Deployment", "Job", "Pod"):
            continue
        for container in _containers(doc):
            if doc["metadata"]["name"].endswith("-labeler") and values is not MINIMAL:
                continue
            resources = container.get("resources", {})
            assert "cpu" in resources.get("requests", {}), (doc["metadata"]["name"], container)
            assert "cpu" not in resources.get("limits", {}), (doc["metadata"]["name"], container)


def _test_pod(values: dict[str, Any]) -> dict[str, Any]:
    return by_kind(render(values, tests=True), "Pod")["fleet-bc-workers-test"]


def test_the_test_pod_has_resources_and_logs_in_as_the_tester_only() -> None:
    pod = _test_pod(production())
    containers = _containers(pod)
    assert all(c["resources"]["requests"]["memory"] for c in containers)
    [streams] = pod["spec"]["containers"]
    assert streams["args"] == ["provision", "--check"]
    env = {e["name"]: e for e in streams["env"]}
    assert "BCW_DATABASE_URL" not in env
    assert env["BCW_NATS_NKEY_SEED_FILE"]["value"] == "/etc/bcw/nats/seed.nk"
    secrets = {v["secret"]["secretName"] for v in pod["spec"]["volumes"] if "secret" in v}
    assert "bcw-tester-nats" in secrets
    assert not secrets & {"bcw-admin-nats", "bc-workers-database-owner"}
    values = production()
    values["tests"]["resources"] = {"requests": {"cpu": "5m", "memory": "32Mi"}}
    for container in _containers(_test_pod(values)):
        assert container["resources"]["requests"] == {"cpu": "5m", "memory": "32Mi"}


def test_without_its_own_login_the_test_pod_takes_no_other_and_says_so() -> None:
    values = production()
    del values["tests"]["nats"]
    pod = _test_pod(values)
    [streams] = pod["spec"]["containers"]
    assert "tests.nats.existingSecret is empty" in streams["args"][0]
    env = {e["name"] for e in streams["env"]}
    assert not env & {"BCW_NATS_NKEY_SEED_FILE", "BCW_NATS_CREDS_FILE", "BCW_DATABASE_URL"}
    assert not [v for v in pod["spec"]["volumes"] if v["name"] == "nats-credentials"]
    # a trial without NATS logins checks the streams with none
    [plain] = _test_pod(MINIMAL)["spec"]["containers"]
    assert plain["args"] == ["provision", "--check"]
