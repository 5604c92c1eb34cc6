"""Monitoring as the chart ships it (issue 60, items 6 and 8): KEDA's endpoint where the
official NATS chart serves the monitoring port and a ScaledObject that scales each listed
worker on its consumer's lag, alerts that need no label only the chart's ServiceMonitor
sets, and the Grafana dashboard with a panel for every metric the workers export.
Rendered by real Helm."""

from __future__ import annotations

import json
import re

import jsonschema
import kubernetes_validate
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.chart.test_chart import (
    CHART,
    KUBE_VERSION,
    MINIMAL,
    WORKERS,
    by_kind,
    production,
    render,
)
from tests.chart.test_chart_prod import DOCS, KUBERNETES_MD

# -- KEDA: its endpoint and its ScaledObjects ---------------------------------------------


def test_kedas_default_endpoint_is_the_headless_service_of_the_documented_nats_release() -> None:
    """docs/kubernetes.md installs the official chart as release R in namespace N: its
    monitoring port is on `R-headless` (the client Service has none), whose pod names
    KEDA's scaler needs in a cluster."""
    install = re.search(r"helm -n (\S+) install (\S+) nats/nats", KUBERNETES_MD)
    assert install is not None
    namespace, release = install.groups()
    docs = render({**MINIMAL, "autoscaling": {"enabled": True}})
    for name, scaled in by_kind(docs, "ScaledObject").items():
        [trigger] = scaled["spec"]["triggers"]
        assert trigger["metadata"]["natsServerMonitoringEndpoint"] == (
            f"{release}-headless.{namespace}.svc.cluster.local:8222"
        ), name
    assert "leader" in KUBERNETES_MD and "useHttps" in KUBERNETES_MD


#: what KEDA's ScaledObject CRD (keda.sh/v1alpha1) requires of the fields the chart sets:
#: a target by name, int32 counts, triggers each with a type and string-only metadata
SCALED_OBJECT = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "spec": {
            "type": "object",
            "required": ["scaleTargetRef", "triggers"],
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {"name": {"type": "string"}},
                },
                **{
                    k: {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}
                    for k in (
                        "minReplicaCount",
                        "maxReplicaCount",
                        "pollingInterval",
                        "cooldownPeriod",
                    )
                },
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["type", "metadata"],
                        "properties": {
                            "type": {"type": "string"},
                            "metadata": {
                                "type": "object",
                                "additionalProperties": {"type": "string"},
                            },
                        },
                    },
                },
            },
        },
    },
}
#: what the nats-jetstream scaler reads (its documented parameters)
JETSTREAM_TRIGGER = {
    "natsServerMonitoringEndpoint",
    "account",
    "stream",
    "consumer",
    "lagThreshold",
}


def test_keda_scales_each_listed_worker_on_its_consumers_lag() -> None:
    assert not by_kind(render(MINIMAL), "ScaledObject")  # off by default
    values = {
        **MINIMAL,
        "subjectRoot": "my-fleet",
        "autoscaling": {"enabled": True, "workers": ["labeler", "replay"], "maxReplicas": 6},
    }
    docs = render(values)
    scaled = by_kind(docs, "ScaledObject")
    deployments = by_kind(docs, "Deployment")
    assert sorted(scaled) == ["fleet-bc-workers-labeler", "fleet-bc-workers-replay"]
    for name, obj in scaled.items():
        jsonschema.validate(obj, SCALED_OBJECT)
        spec = obj["spec"]
        assert spec["scaleTargetRef"]["name"] == name and name in deployments
        assert "replicas" not in deployments[name]["spec"]  # KEDA's, not the chart's
        assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (2, 6)
        [trigger] = spec["triggers"]
        assert trigger["type"] == "nats-jetstream" and set(trigger["metadata"]) >= JETSTREAM_TRIGGER
        worker = name.removeprefix("fleet-bc-workers-")
        assert (trigger["metadata"]["stream"], trigger["metadata"]["consumer"]) == (
            "MY_FLEET_FACTS",
            worker,
        )
    # liveness is not listed: its replicas are the chart's
    assert deployments["fleet-bc-workers-liveness"]["spec"]["replicas"] == 2
    for doc in docs:
        if doc["kind"] != "ScaledObject" and not doc["apiVersion"].startswith(
            "monitoring.coreos.com"
        ):
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    with pytest.raises(Exception, match="minReplicas"):
        render({**MINIMAL, "autoscaling": {"enabled": True, "minReplicas": 0}})
    with pytest.raises(Exception, match=r"above autoscaling\.maxReplicas"):
        render({**MINIMAL, "autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 3}})


# -- alerts without the chart's ServiceMonitor ---------------------------------------------


def test_the_alerts_use_no_label_only_the_charts_servicemonitor_sets() -> None:
    """Beside the workers' own labels, the rules select on `namespace` and `pod` only —
    labels any Kubernetes scrape sets — never on `job`, which each scrape config names as
    it likes; BcwWorkerAbsent finds each worker's pods by name and no other worker's."""
    docs = render(production())
    [rule] = by_kind(docs, "PrometheusRule").values()
    target_labels = {"namespace", "pod"}
    exported = {"worker", "policy", "loop", "stream", "bound", "cause", "le", "type"}
    pods_of = {name: f"fleet-bc-workers-{name}-7d9f8c6b5d-x2x7q" for name in [*WORKERS, "relay"]}
    absent = {}
    for alert in rule["spec"]["groups"][0]["rules"]:
        expr = alert["expr"]
        assert not re.search(r"\bjob\b", expr), alert["alert"]
        for selector in re.findall(r"\{([^}]*)\}", expr):
            for label in re.findall(r"(\w+)\s*(?:=~|!=|!~|=)", selector):
                assert label in target_labels | exported, (alert["alert"], label)
        if alert["alert"] == "BcwWorkerAbsent":
            absent[alert["labels"]["worker"]] = re.search(r'pod=~"([^"]+)"', expr).group(1)
    assert sorted(absent) == sorted(pods_of)
    for name, pattern in absent.items():
        for other, pod in pods_of.items():  # Prometheus anchors a regex at both ends
            assert bool(re.fullmatch(pattern, pod)) == (name == other), (name, other)
    text = (DOCS / "observability.md").read_text()
    alerts = " ".join(text[text.index("## Alerts") : text.index("### BcwConsumerLag")].split())
    assert "only `namespace` and `pod`" in alerts and "no `job`" in alerts


# -- the dashboard ------------------------------------------------------------------------

DASHBOARD = CHART / "dashboards" / "bc-workers.json"


def test_the_dashboard_configmap_is_off_by_default_and_labeled_for_the_sidecar() -> None:
    assert "fleet-bc-workers-dashboard" not in by_kind(render(MINIMAL), "ConfigMap")
    values = {
        **MINIMAL,
        "grafanaDashboard": {"enabled": True, "annotations": {"grafana_folder": "Fleet"}},
    }
    [config] = [
        c for n, c in by_kind(render(values), "ConfigMap").items() if n.endswith("-dashboard")
    ]
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config["metadata"]["annotations"] == {"grafana_folder": "Fleet"}
    assert json.loads(config["data"]["bc-workers.json"]) == json.loads(DASHBOARD.read_text())


def test_every_dashboard_query_names_an_exported_metric() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    for key in ("uid", "title", "schemaVersion", "panels", "templating"):
        assert key in dashboard, key
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)  # ids unique
    exported = {
        sample.name
        for family in text_string_to_metric_families(_every_metric_once())
        for sample in family.samples
    }
    queried: set[str] = set()
    for panel in panels:
        assert panel["type"] == "timeseries" and panel["description"] and panel["gridPos"]
        assert panel["datasource"]["uid"] == "${datasource}"
        for target in panel["targets"]:
            names = set(re.findall(r"\bbcw_[a-z_]+", target["expr"]))
            assert names, target
            assert names <= exported, (panel["title"], names - exported)
            queried |= names
    families = {
        n.removesuffix("_bucket").removesuffix("_count").removesuffix("_sum")
        for n in exported
        if n.startswith("bcw_")  # the process's own (process_*, python_*) have no panel
    }
    # every metric the workers export has a panel
    assert {n.removesuffix("_bucket") for n in queried} == families, families - queried


def _every_metric_once() -> str:
    """The exposition with one sample of every metric (the registry shows a labeled
    metric only once it has a child)."""
    from tests.unit.runtime.test_metrics_documented import fleet_metrics
    from workers.liveness.metrics import SweepMetrics
    from workers.quarantine.metrics import QuarantineMetrics

    m = fleet_metrics()
    m.facts.inc("w", "hello", "applied")
    m.fencing_misses.inc("w", "hello")
    m.batch_seconds.observe(0.1, "w")
    m.of(SweepMetrics).sweep_seconds.observe(0.2)
    m.batch_retries.inc("w")
    m.batch_splits.inc("w")
    m.fact_age.observe(1.0, "w", "hello")
    m.consumer_pending.set(1, "w")
    m.consumer_ack_pending.set(1, "w")
    m.lease_held.set(1, "sweep")
    m.facts_stream_full.set(0.5, "BC_FACTS", "messages")
    m.dead_letters.inc("w", "invalid")
    m.outbox_published.inc()
    m.outbox_failures.inc()
    m.of(QuarantineMetrics).hello_proof_policy.set(1, "warn")
    m.nats_disconnects.inc("bcw w")
    m.nats_reconnects.inc("bcw w")
    return m.render()
