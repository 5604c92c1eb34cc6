"""The production example as it runs (issue 60, items 3 and 6, and the alerts of item 8):
PostgreSQL's CA where every pod that reaches PostgreSQL reads it, by the names asyncpg
reads; the objects of CRDs only where the cluster serves their APIs; every object the
example names made by the chart or by a step of docs/kubernetes.md; `helm test` that
fails when the relay does not publish (KEDA and the alerts: test_chart_prod_alerts.py).
Rendered by real Helm; the relay check and asyncpg's reading of the variables run for
real."""

from __future__ import annotations

import asyncio
import re
import shutil
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import certifi
import kubernetes_validate
import pytest
import yaml
from asyncpg import connect_utils

from tests.chart.rendering import CRD_APIS, render_in
from tests.chart.test_chart import (
    CHART,
    KUBE_VERSION,
    MINIMAL,
    WORKERS,
    by_kind,
    production,
    render,
)
from tests.chart.test_chart_lifecycle import allowed, labels_of, pods
from workers.runtime.observability.health import HealthServer
from workers.runtime.observability.metrics import Metrics

DOCS = CHART.parents[1] / "docs"
KUBERNETES_MD = (DOCS / "kubernetes.md").read_text()
PG_TLS = "/etc/bcw/pg-tls"
PG_ENV = ("PGSSLROOTCERT", "PGSSLCERT", "PGSSLKEY", "PGSSLMODE")


def containers(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(owner/container, container, pod spec) of every container the chart renders."""
    for owner, template in pods(docs).items():
        spec = template["spec"]
        for c in [*spec.get("initContainers", []), *spec["containers"]]:
            yield f"{owner}/{c['name']}", c, spec


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


# -- PostgreSQL TLS (item 3, the chart) ---------------------------------------------------


def test_postgres_tls_reaches_every_container_that_reaches_postgres_and_no_other() -> None:
    values = {
        **MINIMAL,
        "relay": {"enabled": True},
        "database": {**MINIMAL["database"], "tls": {"existingSecret": "pg-ca", "mutual": True}},
    }
    docs = render(values)
    reaching = []
    for name, container, spec in containers(docs):
        env = env_of(container)
        mounts = {m["name"]: m for m in container.get("volumeMounts", [])}
        if "BCW_DATABASE_URL" not in env:  # provision, the test pod's checks: NATS only
            assert not set(PG_ENV) & set(env), name
            assert "pg-tls" not in mounts, name
            continue
        reaching.append(name)
        assert env["PGSSLROOTCERT"] == f"{PG_TLS}/ca.crt", name
        assert env["PGSSLCERT"] == f"{PG_TLS}/tls.crt", name
        assert env["PGSSLKEY"] == f"{PG_TLS}/tls.key", name
        assert env["PGSSLMODE"] == "verify-full", name
        assert mounts["pg-tls"] == {"name": "pg-tls", "mountPath": PG_TLS, "readOnly": True}
        [volume] = [v for v in spec["volumes"] if v["name"] == "pg-tls"]
        assert volume["secret"]["secretName"] == "pg-ca"
        assert volume["secret"]["defaultMode"] == 0o400
        assert [i["key"] for i in volume["secret"]["items"]] == ["ca.crt", "tls.crt", "tls.key"]
    # each worker and its wait-for-schema, the relay and its own, the Job's `bcw migrate`
    expected = {
        *(f"Deployment/fleet-bc-workers-{w}/{c}" for w in WORKERS for c in (w, "wait-for-schema")),
        "Deployment/fleet-bc-workers-relay/relay",
        "Deployment/fleet-bc-workers-relay/wait-for-schema",
    }
    assert expected <= set(reaching)
    assert (
        [n for n in reaching if n.startswith("Job/")]
        == [n for n in reaching if n.startswith("Job/") and n.endswith("/migrate")]
        != []
    )
    # the test pod reaches NATS only: it mounts no PostgreSQL key
    assert not [
        v
        for v in by_kind(docs, "Pod")["fleet-bc-workers-test"]["spec"]["volumes"]
        if v["name"] == "pg-tls"
    ]
    for doc in docs:
        if doc["apiVersion"].startswith("monitoring.coreos.com"):
            continue
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_without_postgres_tls_nothing_is_mounted_and_the_mode_is_the_urls() -> None:
    for name, container, spec in containers(render(MINIMAL)):
        assert not set(PG_ENV) & set(env_of(container)), name
        assert all(v["name"] != "pg-tls" for v in spec["volumes"]), name
    # only a CA, and the URL's own sslmode: PGSSLROOTCERT alone
    values = {
        **MINIMAL,
        "database": {**MINIMAL["database"], "tls": {"existingSecret": "pg-ca", "mode": ""}},
    }
    docs = render(values)
    liveness = by_kind(docs, "Deployment")["fleet-bc-workers-liveness"]["spec"]["template"]["spec"]
    env = env_of(liveness["containers"][0])
    assert env["PGSSLROOTCERT"] == f"{PG_TLS}/ca.crt"
    assert not {"PGSSLCERT", "PGSSLKEY", "PGSSLMODE"} & set(env)
    [volume] = [v for v in liveness["volumes"] if v["name"] == "pg-tls"]
    assert [i["key"] for i in volume["secret"]["items"]] == ["ca.crt"]
    with pytest.raises(Exception, match="mode"):
        render({**MINIMAL, "database": {**MINIMAL["database"], "tls": {"mode": "verify_full"}}})


def test_asyncpg_verifies_the_docs_verify_full_url_with_the_charts_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The docs' URL (`sslmode=verify-full`, no sslrootcert) with the env the chart gives a
    worker: asyncpg (the installed one) takes the CA from PGSSLROOTCERT and verifies the
    server's name; without the file it fails at once (the runtime says so in one line)."""
    docs = render({**production(), "allowSharedCredentials": True})
    worker = by_kind(docs, "Deployment")["fleet-bc-workers-recorder"]["spec"]["template"]["spec"]
    env = {k: v for k, v in env_of(worker["containers"][0]).items() if k in PG_ENV}
    assert env == {"PGSSLROOTCERT": f"{PG_TLS}/ca.crt", "PGSSLMODE": "verify-full"}
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.postgresql/root.crt to fall back on
    for name in PG_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():  # the mount, moved under tmp_path
        monkeypatch.setenv(name, value.replace(PG_TLS, str(tmp_path)))
    url = re.search(r"url='(postgresql://[^']+verify-full)'", KUBERNETES_MD)
    assert url is not None
    dsn = url.group(1).replace("…", "secret")

    def parse() -> Any:
        _addrs, params, _config = connect_utils._parse_connect_arguments(
            dsn=dsn,
            host=None,
            port=None,
            user=None,
            password=None,
            passfile=None,
            database=None,
            command_timeout=None,
            statement_cache_size=100,
            max_cached_statement_lifetime=300,
            max_cacheable_statement_size=15360,
            ssl=None,
            direct_tls=None,
            server_settings=None,
            target_session_attrs=None,
            krbsrvname=None,
            gsslib=None,
            service=None,
            servicefile=None,
        )
        return params.ssl

    with pytest.raises(FileNotFoundError):
        parse()  # the Secret not mounted: asyncpg does read that name
    shutil.copy(certifi.where(), tmp_path / "ca.crt")
    context = parse()
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert context.get_ca_certs()  # the mounted CA, loaded


# -- the objects of CRDs, only where the cluster serves them ------------------------------


def _notes(values: dict[str, Any], api_versions: tuple[str, ...]) -> str:
    return render_in(CHART, values, api_versions)["bc-workers/templates/NOTES.txt"]


@pytest.mark.parametrize(
    "apis",
    [CRD_APIS, (), ("monitoring.coreos.com/v1",), ("keda.sh/v1alpha1",)],
    ids=["both", "none", "monitoring", "keda"],
)
def test_servicemonitor_rule_and_scaledobject_render_only_where_their_api_is(
    apis: tuple[str, ...],
) -> None:
    values = {
        **MINIMAL,
        "serviceMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True},
        "autoscaling": {"enabled": True, "workers": ["labeler", "recorder"]},
    }
    docs = render(values, api_versions=apis)
    kinds = {d["kind"] for d in docs}
    monitoring = "monitoring.coreos.com/v1" in apis
    keda = "keda.sh/v1alpha1" in apis
    assert ("ServiceMonitor" in kinds) == monitoring
    assert ("PrometheusRule" in kinds) == monitoring
    assert sorted(by_kind(docs, "ScaledObject")) == (
        ["fleet-bc-workers-labeler", "fleet-bc-workers-recorder"] if keda else []
    )
    for name, deployment in by_kind(docs, "Deployment").items():
        scaled = keda and name.rsplit("-", 1)[1] in ("labeler", "recorder")
        # without KEDA nothing scales a worker: it keeps its own replica count
        assert ("replicas" in deployment["spec"]) == (not scaled), name
    notes = _notes(values, apis)
    assert ("no monitoring.coreos.com/v1" in notes) == (not monitoring)
    assert ("no keda.sh/v1alpha1" in notes) == (not keda)
    assert "WARNING" not in _notes(MINIMAL, ())  # nothing asked, nothing to warn of


# -- the production example: every object it names is made --------------------------------


def _sh_blocks() -> list[str]:
    return re.findall(r"```sh\n(.*?)```", KUBERNETES_MD, re.S)


def _documented_priority_classes() -> set[str]:
    names = set()
    for block in _sh_blocks():
        for heredoc in re.findall(r"<<'(\w+)'\n(.*?)\n\1\n", block, re.S):
            doc = yaml.safe_load(heredoc[1])
            if doc.get("kind") == "PriorityClass":
                names.add(doc["metadata"]["name"])
    return names


def _documented_secrets() -> set[str]:
    """Every Secret a `kubectl create secret` line of the docs makes, a loop's expanded."""
    names = set()
    for block in _sh_blocks():
        loop: list[str] = []
        for line in block.splitlines():
            if m := re.match(r"\s*for w in ([^;]+);", line):
                loop = m.group(1).split()
            if m := re.search(r"create secret [\w-]+ (\S+)", line):
                name = m.group(1)
                expanded = (
                    [name.replace("${w}", w).replace("$w", w) for w in loop]
                    if "$w" in name or "${w}" in name
                    else [name]
                )
                names.update(expanded)
    return names


def _documented_node_labels() -> set[str]:
    return {
        label
        for block in _sh_blocks()
        for m in re.finditer(r"kubectl label nodes? ([^\n]+)", block)
        for label in m.group(1).split()
        if "=" in label
    }


def test_the_production_example_names_only_objects_the_chart_or_the_docs_make() -> None:
    docs = render(production())
    rendered_classes = set(by_kind(docs, "PriorityClass"))
    documented = _documented_priority_classes()
    assert "fleet-critical" in documented  # the parser does read the step
    secrets = set(by_kind(docs, "Secret")) | _documented_secrets()
    labels = _documented_node_labels()
    for owner, template in pods(docs).items():
        spec = template["spec"]
        if name := spec.get("priorityClassName"):
            assert name in rendered_classes | documented, (owner, name)
        for key, value in spec.get("nodeSelector", {}).items():
            assert f"{key}={value}" in labels, (owner, key)
        for pull in spec.get("imagePullSecrets", []):
            assert pull["name"] in secrets or f"[{pull['name']}]" in KUBERNETES_MD, (owner, pull)
        for volume in spec.get("volumes", []):
            if "secret" in volume:
                assert volume["secret"]["secretName"] in secrets, (owner, volume)
        for c in [*spec.get("initContainers", []), *spec["containers"]]:
            for e in c.get("env", []):
                if ref := e.get("valueFrom", {}).get("secretKeyRef"):
                    assert ref["name"] in secrets, (owner, ref)
    # the CRDs of what it renders: a step installs them
    groups = {d["apiVersion"].split("/")[0] for d in docs if "." in d["apiVersion"].split("/")[0]}
    crd_steps = {
        "monitoring.coreos.com": "prometheus-community/kube-prometheus-stack",
        "keda.sh": "kedacore/keda",
    }
    for group in groups - {
        "apps",
        "batch",
        "policy",
        "networking.k8s.io",
        "rbac.authorization.k8s.io",
    }:
        assert crd_steps[group] in KUBERNETES_MD, group
    # the example turns the alerts on, for the Prometheus its ServiceMonitor feeds
    [rule] = by_kind(docs, "PrometheusRule").values()
    [monitor] = by_kind(docs, "ServiceMonitor").values()
    assert rule["metadata"]["labels"]["release"] == monitor["metadata"]["labels"]["release"]


def test_the_production_example_publishes_through_its_relay() -> None:
    docs = render(production())
    deployments = by_kind(docs, "Deployment")
    relay = deployments["fleet-bc-workers-relay"]
    assert relay["spec"]["replicas"] >= 1
    for worker in WORKERS:  # the workers leave the outbox to it
        env = env_of(
            deployments[f"fleet-bc-workers-{worker}"]["spec"]["template"]["spec"]["containers"][0]
        )
        assert env["BCW_OUTBOX_RELAY"] == "false", worker
    # helm test asks the relay, through its Service, under the chart's NetworkPolicy
    test = by_kind(docs, "Pod")["fleet-bc-workers-test"]
    [check] = [c for c in test["spec"]["initContainers"] if c["name"] == "relay"]
    base, bound = check["args"][1:]
    service = by_kind(docs, "Service")["fleet-bc-workers-relay"]
    assert base == f"http://fleet-bc-workers-relay:{service['spec']['ports'][0]['port']}"
    assert float(bound) == production().get("prometheusRule", {}).get("outboxAgeSeconds", 60)
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    rendered = pods(docs)
    assert allowed(
        policies,
        labels_of(rendered["Pod/fleet-bc-workers-test"]),
        labels_of(rendered["Deployment/fleet-bc-workers-relay"]),
        8080,
    )
    # no relay, no such check
    assert [
        c["name"]
        for c in by_kind(render(MINIMAL), "Pod")["fleet-bc-workers-test"]["spec"]["initContainers"]
    ] == ["ready"]


@contextmanager
def _relay_health(ready: bool, oldest: float) -> Iterator[str]:
    """A real health server, as a relay serves it: /readyz as `ready`, /metrics with the
    oldest outbox row `oldest` seconds old."""
    metrics = Metrics()
    metrics.outbox_oldest_seconds.set(oldest)
    loop = asyncio.new_event_loop()

    async def probe() -> dict[str, bool]:
        return {"nats": ready, "database": True}

    server = HealthServer(0, probe, metrics.exposition, host="127.0.0.1")
    loop.run_until_complete(server.start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


@pytest.mark.parametrize(
    ("ready", "oldest", "passes", "says"),
    [
        (True, 0.0, True, "ready"),
        (True, 12.0, True, "waits 12 s"),
        (True, 600.0, False, "nothing is published"),
        (False, 0.0, False, "503"),
    ],
    ids=["idle", "moving", "stuck", "unready"],
)
def test_helm_tests_relay_check_fails_when_the_relay_does_not_publish(
    ready: bool, oldest: float, passes: bool, says: str
) -> None:
    """The test pod's relay check, run as the pod runs it, against a real health server."""
    test = by_kind(render(production()), "Pod")["fleet-bc-workers-test"]
    [check] = [c for c in test["spec"]["initContainers"] if c["name"] == "relay"]
    assert check["command"] == ["python", "-c"]
    script, _, bound = check["args"]
    with _relay_health(ready, oldest) as base:
        done = subprocess.run(
            [sys.executable, "-c", script, base, bound], capture_output=True, text=True, timeout=30
        )
    assert (done.returncode == 0) == passes, done.stderr
    assert says in done.stdout + done.stderr
