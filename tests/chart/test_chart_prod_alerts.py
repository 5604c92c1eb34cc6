"""KEDA and the alerts of the production example (issue 60, items 6 and 8): KEDA's
endpoint where the official NATS chart serves the monitoring port, and alerts that need
no label only the chart's ServiceMonitor sets. Rendered by real Helm."""

from __future__ import annotations

import re

from tests.chart.test_chart import MINIMAL, WORKERS, by_kind, production, render
from tests.chart.test_chart_prod import DOCS, KUBERNETES_MD

# -- KEDA's endpoint ----------------------------------------------------------------------


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
