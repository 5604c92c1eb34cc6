"""The Helm chart, rendered by real Helm (the helm-python-sdk wheel: Helm's Go SDK, no
binary), linted, and every manifest validated against the Kubernetes schemas; then the
essentials asserted. What is real here: Helm and the Kubernetes API schemas; no cluster."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from tests.chart.rendering import CRD_APIS, render_in

CHART = Path(__file__).resolve().parents[2] / "charts" / "bc-workers"
PRODUCTION = CHART / "ci" / "production-values.yaml"
KUBE_VERSION = "1.31"
WORKERS = ["labeler", "liveness", "quarantine", "recorder", "replay"]
MINIMAL = {
    "database": {"url": "postgresql://bcw@db/bcw"},
    "allowSharedCredentials": True,
    "nats": {"factsGateways": ["gw-1"]},  # a new install lists its gateways
}


def render(
    values: dict[str, Any], api_versions: tuple[str, ...] = CRD_APIS
) -> list[dict[str, Any]]:
    rendered = render_in(CHART, values, api_versions)  # prometheus-operator and KEDA served
    docs = []
    for name, text in rendered.items():
        if name.endswith(".txt"):
            continue
        docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def production() -> dict[str, Any]:
    return dict(yaml.safe_load(PRODUCTION.read_text()))


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def migration_job(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The one migration Job (its name ends with a digest of what it runs)."""
    [job] = [d for d in docs if d["kind"] == "Job"]
    assert re.fullmatch(r".+-migrate-[0-9a-f]{10}", job["metadata"]["name"])
    return job


@pytest.mark.parametrize("values", [MINIMAL, production()], ids=["defaults", "production"])
def test_lint_is_clean(values: dict[str, Any]) -> None:
    report = helm.lint(str(CHART), values, strict=True, kube_version=f"v{KUBE_VERSION}.0")
    problems = [m for m in report["messages"] if m["severity"] >= 2] + report.get("errors", [])
    assert not problems, problems


@pytest.mark.parametrize("values", [MINIMAL, production()], ids=["defaults", "production"])
def test_every_manifest_is_valid_for_kubernetes(values: dict[str, Any]) -> None:
    docs = render(values)
    assert docs
    for doc in docs:
        if doc["apiVersion"].startswith("monitoring.coreos.com"):
            continue  # a CRD's kind: not in the core schemas
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


@pytest.mark.parametrize("values", [MINIMAL, production()], ids=["defaults", "production"])
def test_each_worker_deployment(values: dict[str, Any]) -> None:
    docs = render(values)
    deployments = by_kind(docs, "Deployment")
    relay = ["relay"] if values.get("relay", {}).get("enabled") else []
    assert sorted(deployments) == sorted(f"fleet-bc-workers-{w}" for w in [*WORKERS, *relay])
    for worker in WORKERS:
        deployment = deployments[f"fleet-bc-workers-{worker}"]
        pod = deployment["spec"]["template"]["spec"]
        [container] = pod["containers"]
        assert container["args"] == ["run", worker]
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        env = {e["name"]: e for e in container["env"]}
        assert env["BCW_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"]
        assert env["OTEL_SERVICE_NAME"]["value"] == f"bcw-{worker}"
        assert {
            "BCW_NATS_URL",
            "BCW_SUBJECT_ROOT",
            "BCW_HEALTH_PORT",
            "OTEL_RESOURCE_ATTRIBUTES",
        } <= set(env)
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"]["drop"] == ["ALL"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        spread = pod["topologySpreadConstraints"][0]
        assert spread["topologyKey"] == "kubernetes.io/hostname"
        assert (
            spread["labelSelector"]["matchLabels"]["app.kubernetes.io/component"]
            == f"worker-{worker}"
        )
    assert sorted(by_kind(docs, "PodDisruptionBudget")) == sorted(deployments)


def test_production_values_reach_the_pods() -> None:
    docs = render(production())
    labeler = by_kind(docs, "Deployment")["fleet-bc-workers-labeler"]
    pod = labeler["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["BCW_NATS_NKEY_SEED_FILE"] == "/etc/bcw/nats/seed.nk"
    assert "BCW_NATS_CREDS_FILE" not in env
    assert env["BCW_NATS_TLS_CERT_FILE"] == "/etc/bcw/tls/tls.crt"
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.observability:4318"
    assert "deployment.environment=production" in env["OTEL_RESOURCE_ATTRIBUTES"]
    assert env["BCW_DATABASE_STATEMENT_CACHE_SIZE"] == "0"
    assert env["BCW_CONSUMER_BATCH_SIZE"] == "256"
    # the worker that says how full each gateway's facts stream is, and the Job that makes them
    assert env["BCW_NATS_FACTS_GATEWAYS"] == "gw-eu-1,gw-eu-2,gw-us-1"
    job = migration_job(docs)
    containers = job["spec"]["template"]["spec"]["containers"]
    [provision] = [c for c in containers if c["name"] == "provision"]
    listed = {"name": "BCW_NATS_FACTS_GATEWAYS", "value": "gw-eu-1,gw-eu-2,gw-us-1"}
    assert listed in provision["env"]
    [migrate] = job["spec"]["template"]["spec"]["initContainers"]  # Hellos proven (#59)
    assert {"name": "BCW_HELLO_PROOF", "value": "require"} in migrate["env"]
    assert labeler["spec"]["replicas"] == 3
    assert pod["containers"][0]["resources"]["limits"]["cpu"] == "2"
    assert by_kind(docs, "ServiceMonitor") and by_kind(docs, "NetworkPolicy")
    assert not by_kind(docs, "Secret")  # the database URL comes from an existing Secret
    replay = by_kind(docs, "Deployment")["fleet-bc-workers-replay"]
    assert {"name": "BCW_REPLAY_CREDITS", "value": "8"} in replay["spec"]["template"]["spec"][
        "containers"
    ][0]["env"]


def test_no_object_is_an_install_hook_and_every_pod_waits_for_the_schema() -> None:
    docs = render({**MINIMAL, "relay": {"enabled": True}})
    hooks = [d["kind"] for d in docs if "helm.sh/hook" in d["metadata"].get("annotations", {})]
    assert hooks == ["Pod"]  # `helm test` only: the Secret and the ServiceAccount go with
    # `helm uninstall`, and Helm installs them before the Job (by kind)
    secret = by_kind(docs, "Secret")["fleet-bc-workers-database"]
    assert secret["stringData"]["url"] == "postgresql://bcw@db/bcw"
    assert by_kind(docs, "ServiceAccount")
    job = migration_job(docs)  # named after what it runs
    assert job["spec"]["ttlSecondsAfterFinished"] == 86400
    pod = job["spec"]["template"]["spec"]
    assert [c["args"] for c in pod["initContainers"]] == [["migrate"]]
    assert [c["args"] for c in pod["containers"]] == [["provision"]]
    for name, deployment in by_kind(docs, "Deployment").items():
        spec = deployment["spec"]["template"]["spec"]
        [wait] = spec["initContainers"]
        assert wait["args"] == ["migrate", "--wait", "10m"], name
        env = {e["name"]: e for e in wait["env"]}
        main = {e["name"]: e for e in spec["containers"][0]["env"]}
        assert env["BCW_DATABASE_URL"] == main["BCW_DATABASE_URL"], name  # as the worker
        assert not {n for n in env if n.startswith("BCW_NATS_")}, name
    off = render({**MINIMAL, "migrations": {"waitForSchema": False}})
    assert not any(
        "initContainers" in d["spec"]["template"]["spec"]
        for d in by_kind(off, "Deployment").values()
    )


def test_disabling_a_worker_removes_its_objects() -> None:
    docs = render({**MINIMAL, "workers": {"quarantine": {"enabled": False}}})
    names = {d["metadata"]["name"] for d in docs}
    assert not any(name.endswith("-quarantine") for name in names)
    assert "fleet-bc-workers-liveness" in names


@pytest.mark.parametrize(
    "values",
    [
        {**MINIMAL, "workerz": {}},
        {**MINIMAL, "workers": {"liveness": {"enabled": True, "replica": 3}}},
        {**MINIMAL, "logFormat": "xml"},
        {**MINIMAL, "subjectRoot": "bad.root"},
        {**MINIMAL, "nats": {"streamReplicas": 7}},
    ],
    ids=["typo-top-level", "typo-in-a-worker", "bad-enum", "bad-subject-root", "too-many-replicas"],
)
def test_a_bad_value_is_refused_by_the_schema(values: dict[str, Any]) -> None:
    chart = helm.Chart.load(str(CHART))
    with pytest.raises(helm.HelmValuesError):
        chart.validate_schema(values)


def test_a_database_is_required() -> None:
    with pytest.raises(helm.HelmError, match=r"database\.existingSecret"):
        render({"nats": {"factsGateways": ["gw-1"]}})


def test_every_value_is_documented_in_the_chart_readme() -> None:
    readme = (CHART / "README.md").read_text()

    def keys(tree: dict[str, Any], prefix: str = "") -> list[str]:
        out = []
        for key, value in tree.items():
            path = f"{prefix}{key}"
            if (
                isinstance(value, dict)
                and value
                and key
                not in {"resources", "podSecurityContext", "securityContext", "requests", "limits"}
            ):
                out += keys(value, path + ".")
            else:
                out.append(path)
        return out

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    missing = [key for key in keys(values) if f"`{key}`" not in readme]
    assert not missing, missing


def _pod(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return dict(by_kind(docs, kind)[name]["spec"]["template"]["spec"])


def _secrets_of(
    container: dict[str, Any], pod: dict[str, Any]
) -> tuple[str | None, str | None, str]:
    """(database Secret, NATS Secret mounted, the NATS login variable) of a container."""
    env = {e["name"]: e for e in container["env"]}
    database = env.get("BCW_DATABASE_URL", {}).get("valueFrom", {}).get("secretKeyRef", {})
    mounted = {m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"] if v["name"] in mounted}
    nats = volumes.get("nats-credentials", {}).get("secret", {}).get("secretName")
    login = [n for n in env if n in ("BCW_NATS_NKEY_SEED_FILE", "BCW_NATS_CREDS_FILE")]
    return database.get("name"), nats, ",".join(login)


def test_each_worker_logs_in_as_itself_and_each_job_container_gets_only_what_it_uses() -> None:
    docs = render(production())
    for worker in WORKERS:
        pod = _pod(docs, "Deployment", f"fleet-bc-workers-{worker}")
        expected = (f"bcw-{worker}-database", f"bcw-{worker}-nats", "BCW_NATS_NKEY_SEED_FILE")
        assert _secrets_of(pod["containers"][0], pod) == expected, worker
    job = dict(migration_job(docs)["spec"]["template"]["spec"])
    [migrate], [provision] = job["initContainers"], job["containers"]
    assert _secrets_of(migrate, job) == ("bc-workers-database-owner", None, "")
    assert _secrets_of(provision, job) == (None, "bcw-admin-nats", "BCW_NATS_NKEY_SEED_FILE")
    assert not {e["name"] for e in migrate["env"]} & {"BCW_NATS_URL", "BCW_NATS_TLS_CA_FILE"}


@pytest.mark.parametrize("values", [MINIMAL, production()], ids=["defaults", "production"])
def test_no_annotation_carries_a_digest_of_a_secret(values: dict[str, Any]) -> None:
    docs = render(values)
    for doc in docs:
        templates = [doc.get("spec", {}).get("template", {}).get("metadata", {})]
        for meta in (doc["metadata"], *templates):
            for key, value in (meta.get("annotations") or {}).items():
                assert not key.startswith("checksum/"), (doc["metadata"]["name"], key)
                assert "postgresql://" not in str(value)
                assert not re.search(r"\b[0-9a-f]{16,}\b", str(value)), (key, value)
    labeler = by_kind(docs, "Deployment")["fleet-bc-workers-labeler"]
    names = labeler["spec"]["template"]["metadata"]["annotations"]["bc.dev/secrets"]
    assert names == (
        "bcw-labeler-database,bcw-labeler-nats"
        if values is not MINIMAL
        else "fleet-bc-workers-database"
    )


def test_the_otlp_endpoint_and_protocol_reach_every_worker() -> None:
    values = {**MINIMAL, "otel": {"endpoint": "http://tempo:4317", "protocol": "grpc"}}
    for name in WORKERS:
        container = _pod(render(values), "Deployment", f"fleet-bc-workers-{name}")["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://tempo:4317"
        assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "grpc"
    with pytest.raises(Exception, match="protocol"):
        render({**MINIMAL, "otel": {"endpoint": "x", "protocol": "http/json"}})
    sampled = {**MINIMAL, "otel": {"endpoint": "http://tempo:4318", "samplerRatio": "0.1"}}
    env = {
        e["name"]: e.get("value")
        for e in _pod(render(sampled), "Deployment", "fleet-bc-workers-replay")["containers"][0][
            "env"
        ]
    }
    assert (env["OTEL_TRACES_SAMPLER"], env["OTEL_TRACES_SAMPLER_ARG"]) == (
        "parentbased_traceidratio",
        "0.1",
    )
    every = {
        **MINIMAL,
        "otel": {"endpoint": "http://tempo:4318", "sampler": "parentbased_always_on"},
    }
    env = {
        e["name"]: e.get("value")
        for e in _pod(render(every), "Deployment", "fleet-bc-workers-replay")["containers"][0][
            "env"
        ]
    }
    assert (
        env["OTEL_TRACES_SAMPLER"] == "parentbased_always_on"
        and "OTEL_TRACES_SAMPLER_ARG" not in env
    )
    with pytest.raises(Exception, match="samplerRatio"):
        render({**MINIMAL, "otel": {"samplerRatio": "10%"}})


def test_the_hello_proof_policy_reaches_bcw_migrate_only_when_set() -> None:
    def migrate_env(values: dict[str, Any]) -> dict[str, Any]:
        job = migration_job(render(values))
        [migrate] = job["spec"]["template"]["spec"]["initContainers"]
        return {e["name"]: e.get("value") for e in migrate["env"]}

    assert "BCW_HELLO_PROOF" not in migrate_env(MINIMAL)  # the database keeps its policy
    set_ = migrate_env({**MINIMAL, "migrations": {"helloProof": "require"}})
    assert set_["BCW_HELLO_PROOF"] == "require"
    with pytest.raises(Exception, match="helloProof"):
        render({**MINIMAL, "migrations": {"helloProof": "sometimes"}})


def test_the_legacy_gateway_role_is_granted_only_when_asked() -> None:
    def migrate_args(values: dict[str, Any]) -> list[str]:
        job = migration_job(render(values))
        [migrate] = job["spec"]["template"]["spec"]["initContainers"]
        return list(migrate["args"])

    assert migrate_args(MINIMAL) == ["migrate"]
    legacy = {**MINIMAL, "migrations": {"legacyGatewayRole": True}}
    assert migrate_args(legacy) == ["migrate", "--legacy-gateway-role"]
