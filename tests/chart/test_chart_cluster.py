"""The chart for a cluster and its operations: each worker's own credentials (or a render
that refuses), Secrets mounted key by key, alerts with runbooks, a dashboard per namespace
and pod, per-worker scheduling and extra volumes, a relay Deployment and `helm test`."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import promql_parser
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.chart.test_chart import (
    CHART,
    KUBE_VERSION,
    MINIMAL,
    WORKERS,
    _pod,
    by_kind,
    migration_job,
    production,
    render,
)
from tests.chart.test_monitoring import DASHBOARD, _every_metric_once


def test_secrets_are_mounted_key_by_key() -> None:
    docs = render(production())
    pod = _pod(docs, "Deployment", "fleet-bc-workers-labeler")
    volumes = {v["name"]: v["secret"] for v in pod["volumes"] if "secret" in v}
    assert volumes["nats-credentials"]["items"] == [{"key": "seed.nk", "path": "seed.nk"}]
    assert [i["key"] for i in volumes["nats-tls"]["items"]] == ["ca.crt", "tls.crt", "tls.key"]


@pytest.mark.parametrize(
    ("values", "named"),
    [
        (
            {"database": {"existingSecret": "shared"}, "nats": {"factsGateways": ["gw-1"]}},
            "workers.labeler.database.existingSecret",
        ),
        (
            {
                "database": {"existingSecret": "shared"},
                "nats": {"credentials": {"existingSecret": "all"}, "factsGateways": ["gw-1"]},
                "workers": {w: {"database": {"existingSecret": f"{w}-db"}} for w in WORKERS},
            },
            "workers.labeler.nats.existingSecret",
        ),
    ],
)
def test_a_worker_without_its_own_credentials_does_not_render(
    values: dict[str, Any], named: str
) -> None:
    with pytest.raises(Exception, match=re.escape(named)) as refused:
        render(values)
    assert "allowSharedCredentials" in str(refused.value)
    render({**values, "allowSharedCredentials": True})  # allowed on purpose: it renders


def test_the_prometheus_rule_alerts_on_exported_metrics_with_a_runbook_line_each() -> None:
    assert "fleet-bc-workers" not in by_kind(render(MINIMAL), "PrometheusRule")  # off by default
    values = {**MINIMAL, "prometheusRule": {"enabled": True, "labels": {"release": "kps"}}}
    rule = by_kind(render(values), "PrometheusRule")["fleet-bc-workers"]
    assert rule["metadata"]["labels"]["release"] == "kps"
    [group] = rule["spec"]["groups"]
    alerts = {r["alert"]: r for r in group["rules"]}
    assert set(alerts) == {
        "BcwConsumerLag",
        "BcwFactAgeHigh",
        "BcwGatewayBlind",
        "BcwLivenessBehind",
        "BcwBreakerOpen",
        "BcwQuarantineHeld",
        "BcwHelloProofNotRequired",
        "BcwFactsStreamFilling",
        "BcwDeadLetters",
        "BcwOutboxStuck",
        "BcwLoopUnheld",
        "BcwWorkerAbsent",
    }
    absent = [r for r in group["rules"] if r["alert"] == "BcwWorkerAbsent"]
    assert sorted(r["labels"]["worker"] for r in absent) == sorted(WORKERS)  # one each
    exported = {
        sample.name
        for family in text_string_to_metric_families(_every_metric_once())
        for sample in family.samples
    }
    runbook = (CHART.parents[1] / "docs" / "observability.md").read_text()
    for name, alert in alerts.items():
        assert set(re.findall(r"\bbcw_[a-z_]+", alert["expr"])) <= exported, name
        assert alert["annotations"]["runbook_url"].endswith(f"#{name.lower()}")
        assert f"### {name}\n" in runbook, name


def test_the_dashboard_narrows_every_panel_to_a_namespace_and_pod() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "namespace", "pod"} <= variables
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            for selector in re.findall(r"\bbcw_[a-z_]+(\{[^}]*\})?", target["expr"]):
                assert 'namespace=~"$namespace"' in selector and 'pod=~"$pod"' in selector


def test_a_cluster_install_can_shape_each_worker() -> None:
    """replicas 0 is kept; per-worker scheduling and priority; extra volumes (a CA for
    verify-full) in every pod; a parent chart's global.imageRegistry; as a subchart."""
    values = {
        **MINIMAL,
        "global": {"imageRegistry": "registry.example.com/"},
        "priorityClassName": "fleet-default",
        "extraVolumes": [{"name": "db-ca", "configMap": {"name": "db-ca"}}],
        "extraVolumeMounts": [{"name": "db-ca", "mountPath": "/etc/bcw/ca", "readOnly": True}],
        "workers": {
            "recorder": {"enabled": True, "replicas": 0},
            "replay": {
                "enabled": True,
                "priorityClassName": "fleet-critical",
                "nodeSelector": {"pool": "replay"},
                "tolerations": [{"key": "dedicated", "operator": "Exists"}],
                "affinity": {"podAntiAffinity": {}},
            },
        },
    }
    docs = render(values)
    deployments = by_kind(docs, "Deployment")
    assert deployments["fleet-bc-workers-recorder"]["spec"]["replicas"] == 0
    replay = _pod(docs, "Deployment", "fleet-bc-workers-replay")
    assert replay["priorityClassName"] == "fleet-critical"
    assert (
        replay["nodeSelector"] == {"pool": "replay"}
        and replay["tolerations"][0]["key"] == "dedicated"
    )
    labeler = _pod(docs, "Deployment", "fleet-bc-workers-labeler")
    assert labeler["priorityClassName"] == "fleet-default" and "nodeSelector" not in labeler
    for pod in (replay, labeler, dict(migration_job(docs)["spec"]["template"]["spec"])):
        assert any(v["name"] == "db-ca" for v in pod["volumes"])
        assert all(
            any(m["mountPath"] == "/etc/bcw/ca" for m in c["volumeMounts"])
            for c in pod.get("initContainers", []) + pod["containers"]
        )
        assert pod["containers"][0]["image"].startswith(
            "registry.example.com/bc-fleet/bc-workers:"
        )  # replaced, not prefixed
    for doc in docs:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_a_relay_deployment_takes_the_outbox_off_the_workers_and_helm_test_checks() -> None:
    values = {
        **MINIMAL,
        "relay": {"enabled": True, "replicas": 3},
        "workers": {"recorder": {"enabled": True, "replicas": 0}},
    }
    docs = render(values)
    relay = _pod(docs, "Deployment", "fleet-bc-workers-relay")
    assert relay["containers"][0]["args"] == ["run", "relay"]
    assert by_kind(docs, "Deployment")["fleet-bc-workers-relay"]["spec"]["replicas"] == 3
    for worker in WORKERS:
        env = {
            e["name"]: e.get("value")
            for e in _pod(docs, "Deployment", f"fleet-bc-workers-{worker}")["containers"][0]["env"]
        }
        assert env["BCW_OUTBOX_RELAY"] == "false", worker
    assert "fleet-bc-workers-relay" not in by_kind(render(MINIMAL), "Deployment")
    # helm test: each worker with pods answers /readyz; every stream exists, nothing changed
    test = by_kind(docs, "Pod")["fleet-bc-workers-test"]
    assert test["metadata"]["annotations"]["helm.sh/hook"] == "test"
    urls = test["spec"]["initContainers"][0]["args"][1:]
    assert urls == [f"http://fleet-bc-workers-{w}:8080/readyz" for w in WORKERS if w != "recorder"]
    assert test["spec"]["containers"][0]["args"] == ["provision", "--check"]
    for doc in docs:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    with pytest.raises(Exception, match=r"relay\.database\.existingSecret is empty"):
        render(
            {
                "database": {"existingSecret": "shared"},
                "relay": {"enabled": True},
                "nats": {"factsGateways": ["gw-1"]},
                "workers": {w: {"enabled": False} for w in WORKERS},
            }
        )


def test_the_alerting_rules_parse_as_prometheus_reads_them(tmp_path: Path) -> None:
    """Every expression parses as PromQL (promql-parser, the Rust parser); where promtool
    is installed, `promtool check rules` passes the rendered groups as well."""
    values = {**production(), "prometheusRule": {"enabled": True}}
    [rule] = by_kind(render(values), "PrometheusRule").values()
    for alert in rule["spec"]["groups"][0]["rules"]:
        promql_parser.parse(alert["expr"])  # raises ValueError on a syntax error
        assert re.fullmatch(r"[0-9]+[smhdwy]", alert.get("for", "0s")), alert["alert"]
    with pytest.raises(ValueError):
        promql_parser.parse("sum(up{")  # the parser does refuse
    promtool = shutil.which("promtool")
    if promtool is None:
        return
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(rule["spec"]))
    done = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_no_worker_has_a_cpu_limit_unless_given_one() -> None:
    """A throttled liveness controller falls behind its facts (docs/kubernetes.md): the
    chart requests CPU and limits memory, and leaves a CPU limit to whoever sets one."""
    docs = render({**MINIMAL, "workers": {"labeler": {"resources": {"limits": {"cpu": "2"}}}}})
    for name in ("liveness", "quarantine", "replay", "recorder"):
        resources = _pod(docs, "Deployment", f"fleet-bc-workers-{name}")["containers"][0][
            "resources"
        ]
        assert "cpu" not in resources["limits"] and resources["limits"]["memory"], name
        assert resources["requests"]["cpu"], name
    labeler = _pod(docs, "Deployment", "fleet-bc-workers-labeler")["containers"][0]["resources"]
    assert labeler["limits"]["cpu"] == "2"


def test_a_new_install_gives_each_gateway_its_own_facts_stream_and_an_upgrade_keeps_its_layout() -> (
    None
):
    """`helm install` without `nats.factsGateways` does not render: a new install lists its
    gateways (each its own facts stream, bounded in bytes and messages) or chooses one
    facts stream for all (`nats.oneFactsStream`). An upgrade of a release with the list
    empty renders as before: its one facts stream keeps working."""
    bare = {k: v for k, v in MINIMAL.items() if k != "nats"}
    with pytest.raises(Exception, match=r"nats\.factsGateways is empty"):
        render(bare)
    chart = helm.Chart.load(str(CHART))
    upgraded = chart.render(
        bare, name="fleet", namespace="control-plane", is_install=False, is_upgrade=True
    )
    assert any("BCW_NATS_FACTS_GATEWAYS" in text for text in upgraded.values())
    one = render({**bare, "nats": {"oneFactsStream": True}})
    job = migration_job(one)
    [provision] = [
        c for c in job["spec"]["template"]["spec"]["containers"] if c["name"] == "provision"
    ]
    env = {e["name"]: e.get("value") for e in provision["env"]}
    assert (
        env["BCW_NATS_FACTS_GATEWAYS"] == "" and env["BCW_NATS_FACTS_MSGS_PER_GATEWAY"] == "5000000"
    )
    with pytest.raises(Exception, match="choose one"):
        render({**MINIMAL, "nats": {"factsGateways": ["gw-1"], "oneFactsStream": True}})


def test_the_job_provisions_the_gateways_and_the_subscriber_applications_consumers() -> None:
    nats = {**MINIMAL.get("nats", {}), "gateways": ["gw-1", "gw-2"], "subscribers": ["siem"]}
    job = migration_job(render({**MINIMAL, "nats": nats}))  # they may make none
    [provision] = [
        c for c in job["spec"]["template"]["spec"]["containers"] if c["name"] == "provision"
    ]
    assert {"name": "BCW_NATS_GATEWAYS", "value": "gw-1,gw-2"} in provision["env"]
    assert {"name": "BCW_NATS_SUBSCRIBERS", "value": "siem"} in provision["env"]
