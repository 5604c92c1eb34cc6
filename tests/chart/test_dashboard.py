"""The Grafana dashboard the chart ships: its ConfigMap, and a panel for every metric the
workers export, each query naming an exported metric."""

from __future__ import annotations

import json
import re

from prometheus_client.parser import text_string_to_metric_families

from tests.chart.test_chart import CHART, MINIMAL, by_kind, render

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
    from workers.runtime.observability.metrics import Metrics

    m = Metrics()
    m.facts.inc("w", "hello", "applied")
    m.fencing_misses.inc("w", "hello")
    m.batch_seconds.observe(0.1, "w")
    m.liveness_sweep_seconds.observe(0.2)
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
    m.hello_proof_policy.set(1, "warn")
    m.nats_disconnects.inc("bcw w")
    m.nats_reconnects.inc("bcw w")
    return m.render()
