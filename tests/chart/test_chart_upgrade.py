"""Upgrades from the previous release as Helm computes them (tests/chart/upgrade.py), for
each form users run, from the previous release's defaults and its production example:
every object the release had is still rendered, no image changes registry, and no Job
changes its pod template under one name. Then what the harness found, each fixed: a
value absent under `--reuse-values` (`enabled` first), a repository that names its
registry, the migration Job's name."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from tests.chart import upgrade
from tests.chart.upgrade import CHART, FORMS, Docs, Release

KEPT = (
    "Deployment",
    "StatefulSet",
    "DaemonSet",
    "Service",
    "PodDisruptionBudget",
    "Secret",
    "ServiceAccount",
)
#: What an upgrade may remove, each with the reason (a documented choice). None so far: a
#: kind/name pair listed here must be one the previous release rendered.
REMOVED: dict[tuple[str, str], str] = {}
#: The previous release's user-supplied values: a trial's (its chart test's minimal) and
#: the production example it shipped.
CASES = {
    "defaults": lambda: {
        "database": {"url": "postgresql://bcw@db/bcw"},
        "allowSharedCredentials": True,
    },
    "production": upgrade.previous_production,
}


def old_release(case: str) -> Release:
    return upgrade.install(upgrade.previous_chart(), CASES[case]())


def objects(docs: Docs, kinds: tuple[str, ...] = KEPT) -> set[tuple[str, str]]:
    return {(d["kind"], d["metadata"]["name"]) for d in docs if d["kind"] in kinds}


def pod_specs(docs: Docs) -> dict[str, dict[str, Any]]:
    out = {}
    for doc in docs:
        if doc["kind"] in ("Deployment", "Job"):
            out[f"{doc['kind']}/{doc['metadata']['name']}"] = doc["spec"]["template"]["spec"]
        elif doc["kind"] == "Pod":
            out[f"Pod/{doc['metadata']['name']}"] = doc["spec"]
    return out


def registry(image: str) -> str:
    first, _, rest = image.partition("/")
    named = rest and ("." in first or ":" in first or first == "localhost")
    return first if named else "docker.io"


def registries(docs: Docs) -> set[str]:
    return {
        registry(c["image"])
        for spec in pod_specs(docs).values()
        for c in spec.get("initContainers", []) + spec["containers"]
    }


def jobs(docs: Docs) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d["spec"]["template"] for d in docs if d["kind"] == "Job"}


def before_and_after(case: str, form: str) -> tuple[Docs, Docs]:
    old = old_release(case)
    if form == "rollback":  # from this release (upgraded as Helm does) back to the old
        return upgrade.upgrade(old, "reset-then-reuse-values"), upgrade.upgrade(old, form)
    given = old.config if form == "values-file" else {}  # the user's own file, again
    return old.manifest, upgrade.upgrade(old, form, given)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_an_upgrade_in_every_form_keeps_the_release(case: str, form: str) -> None:
    before, after = before_and_after(case, form)
    assert objects(before)
    lost = objects(before) - objects(after)
    assert lost <= set(REMOVED), f"{form} removes {sorted(lost - set(REMOVED))}"
    assert registries(after) == registries(before), f"{form} moves the image"
    for name, template in jobs(after).items():
        if name in jobs(before):
            assert template == jobs(before)[name], f"{form}: Job {name}'s pod template changed"


def test_the_documented_removals_are_of_objects_the_release_had() -> None:
    had = objects(old_release("defaults").manifest) | objects(old_release("production").manifest)
    assert set(REMOVED) <= had


def _one_job(named: set[tuple[str, str]]) -> set[tuple[str, str]]:
    jobs = {n for n in named if n[0] == "Job"}
    assert len(jobs) == 1, jobs
    return (named - jobs) | {("Job", "migrate")}


def _with_every_feature_on(config: dict[str, Any]) -> dict[str, Any]:
    """`--set` every `enabled: false` of this chart's defaults (new keys included)."""
    values: dict[str, Any] = {}
    for key, block in helm.Chart.load(str(CHART)).values.items():
        if isinstance(block, dict) and block.get("enabled") is False:
            values[key] = {"enabled": True}
    assert {"autoscaling", "relay", "prometheusRule"} <= set(values)
    if not config.get("allowSharedCredentials"):
        values["allowSharedCredentials"] = True  # the relay has no Secrets of its own here
    return values


@pytest.mark.parametrize("features", ["as-released", "every-feature-on"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_reuse_values_renders_what_the_new_defaults_render(case: str, features: str) -> None:
    """Every value added since the previous release absent (as `--reuse-values` renders):
    no template is gated so that an absent value renders nothing or fails, and a value
    added since may be `--set` (its siblings absent)."""
    old = old_release(case)
    given = _with_every_feature_on(old.config) if features == "every-feature-on" else {}
    reused = upgrade.upgrade(old, "reuse-values", given)
    fresh = upgrade.upgrade(old, "reset-then-reuse-values", given)
    everything = tuple({d["kind"] for d in fresh})
    # the Job is named by its pod template, which differs where `--reuse-values` keeps the
    # previous release's defaults (0.3's CPU limit on the migration containers): one Job each
    assert _one_job(objects(reused, everything)) == _one_job(objects(fresh, everything))
    if features == "every-feature-on":
        assert {"ScaledObject", "PrometheusRule", "NetworkPolicy"} <= set(everything)


def _leaves(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict) and value:
            out.update(_leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def test_the_values_filled_in_are_every_added_one_with_its_default() -> None:
    text = (CHART / "templates" / "_upgrade.tpl").read_text()
    [block] = re.findall(r'define "bcw.addedValues" -}}\n(.*?)\{\{- end', text, re.S)
    added = _leaves(yaml.safe_load(block))
    defaults = _leaves(helm.Chart.load(str(CHART)).values)
    previous = helm.Chart.load(str(upgrade.previous_chart())).values
    assert {k: defaults.get(k, "(not in values.yaml)") for k in added} == added
    had = _leaves(previous)
    missing = sorted(k for k in defaults if k not in had and k not in added)
    assert not missing, f"add to bcw.addedValues (templates/_upgrade.tpl): {missing}"


def test_every_template_starts_by_filling_in_the_values_added_since() -> None:
    """Helm shares one values map between templates: one that read `.Values` before
    `bcw.enabled` filled it in would pass the render above by the others' fill alone."""
    templates = [
        p for p in (CHART / "templates").rglob("*") if p.is_file() and not p.name.startswith("_")
    ]
    assert len(templates) > 5
    for path in templates:
        first = path.read_text().splitlines()[0]
        assert first == '{{- if include "bcw.enabled" . }}', path.name


def test_enabled_absent_is_on_and_false_is_off() -> None:
    old = old_release("defaults")
    assert objects(upgrade.upgrade(old, "reuse-values"))
    assert upgrade.upgrade(old, "reuse-values", {"enabled": False}) == []


@pytest.mark.parametrize(
    ("image", "global_registry", "expected"),
    [
        (
            {"repository": "registry.example.com/platform/bc-workers"},
            "",
            "registry.example.com/platform/bc-workers:0.4.0",
        ),
        (
            {"registry": "quay.io", "repository": "registry.example.com/platform/bc-workers"},
            "",
            "registry.example.com/platform/bc-workers:0.4.0",
        ),
        (
            {"repository": "registry.example.com/platform/bc-workers"},
            "mirror.local:5000",
            "mirror.local:5000/platform/bc-workers:0.4.0",
        ),
        ({"repository": "localhost:5000/bcw"}, "", "localhost:5000/bcw:0.4.0"),
        ({"repository": "localhost/bcw"}, "", "localhost/bcw:0.4.0"),
        ({"repository": "platform/bc-workers"}, "", "ghcr.io/platform/bc-workers:0.4.0"),
    ],
)
def test_a_repository_that_names_its_registry_keeps_it(
    image: dict[str, str], global_registry: str, expected: str
) -> None:
    values: dict[str, Any] = {**CASES["defaults"](), "image": image}
    values["nats"] = {"factsGateways": ["gw-1"]}
    if global_registry:
        values["global"] = {"imageRegistry": global_registry}
    docs = upgrade.install(CHART, values).manifest
    images = {
        c["image"]
        for spec in pod_specs(docs).values()
        for c in spec.get("initContainers", []) + spec["containers"]
    }
    assert images == {expected}


def _job(values: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    base = {**CASES["defaults"](), "nats": {"factsGateways": ["gw-1"]}}
    [(name, template)] = jobs(
        upgrade.install(CHART, upgrade.coalesce(values, base)).manifest
    ).items()
    return name, template


@pytest.mark.parametrize(
    "change",
    [
        {"image": {"pullPolicy": "Always"}},
        {"imagePullSecrets": ["registry-credentials"]},
        {"global": {"imagePullSecrets": ["platform-pull"]}},
        {"extraVolumes": [{"name": "ca", "configMap": {"name": "ca-bundle"}}]},
        {"extraVolumeMounts": [{"name": "tmp", "mountPath": "/var/tmp"}]},
        {"podSecurityContext": {"fsGroup": 2000}},
        {"securityContext": {"readOnlyRootFilesystem": False}},
        {"serviceAccount": {"name": "migrator"}},
        {"otel": {"endpoint": "http://otel-collector:4318"}},
        {"otel": {"resourceAttributes": "deployment.environment=staging"}},
        {"logFormat": "console"},
        {"healthPort": 9090},
        {"migrations": {"resources": {"requests": {"cpu": "75m"}}}},
    ],
    ids=lambda change: ".".join(_leaves(change)),
)
def test_the_migration_job_is_a_new_job_when_anything_of_its_pod_changes(
    change: dict[str, Any],
) -> None:
    name, template = _job({})
    assert _job({}) == (name, template)  # the same render, the same Job (GitOps)
    changed_name, changed_template = _job(change)
    assert changed_template != template, "the change does not reach the Job's pod"
    assert changed_name != name


def test_the_rollback_runbook_renders_the_previous_chart() -> None:
    """docs/kubernetes.md "Back to 0.3": the previous chart with the values that release
    had (`helm get values --revision`) as `-f`, its init containers' check off."""
    old = old_release("production")
    current = Release(
        CHART,
        old.config,
        helm.Chart.load(str(CHART)).merge_values(old.config),
        upgrade.upgrade(old, "reset-then-reuse-values"),
    )
    runbook = upgrade.coalesce({"migrations": {"waitForSchema": False}}, old.config)
    docs = upgrade.rollback_upgrade(current, old.chart, "values-file", runbook)
    assert objects(docs) == objects(old.manifest)
    for name, spec in pod_specs(docs).items():
        if name.startswith("Deployment/"):
            assert "initContainers" not in spec, name
    # what the runbook said before: 0.4's values into 0.3's strict schema
    with pytest.raises(Exception, match=r"additional properties|not allowed"):
        upgrade.rollback_upgrade(current, old.chart, "reuse-values", runbook)


#: The forms of an upgrade to the previous release's chart that are tested (above).
ROLLBACK_FORMS = ("rollback-to-values-file",)
DOCS = [
    CHART / "README.md",
    CHART / "templates" / "NOTES.txt",
    upgrade.REPO / "README.md",
    *sorted((upgrade.REPO / "docs").glob("*.md")),
]
INLINE_RE = re.compile(r"(?<!`)`[^`]+`(?!`)")  # an inline command may wrap a line
HELM_RE = re.compile(r"helm(?:\s+-n\s+\S+)?\s+(upgrade|rollback)\b((?:\\\n|[^`\n])*)")


def documented_commands() -> list[tuple[Path, str, list[str]]]:
    found = []
    for path in DOCS:
        text = INLINE_RE.sub(lambda m: m.group(0).replace("\n", " "), path.read_text())
        for match in HELM_RE.finditer(text):
            args = match.group(2).replace("\\\n", " ").split()
            found.append((path, match.group(1), args))
    return found


def form_of(verb: str, args: list[str]) -> str | None:
    """The tested form a documented command is, None for prose (`helm upgrade` alone) or
    another chart (`nats/nats`); "untested" for any other."""
    positional = [a for a in args if not a.startswith("-") and not a.startswith("'")]
    if verb == "rollback":
        return "rollback" if positional else None
    if len(positional) < 2 or positional[1].startswith("nats/"):
        return None
    # an upgrade to an earlier release's chart is a rollback, tested in its own forms
    back = "rollback-to-" if "--version" in args else ""
    if "--reuse-values" in args:
        return back + "reuse-values"
    if "--reset-then-reuse-values" in args:
        return back + "reset-then-reuse-values"
    if "-f" in args or "--values" in args:
        return back + "values-file"
    return "untested"  # --set alone drops every value the release had


def test_every_documented_upgrade_command_is_a_tested_form() -> None:
    commands = documented_commands()
    forms = {(p.name, " ".join(a)): form_of(v, a) for p, v, a in commands}
    assert any(f == "reuse-values" for f in forms.values()) or any(
        f == "reset-then-reuse-values" for f in forms.values()
    )
    tested = {*FORMS, *ROLLBACK_FORMS}
    untested = {k: f for k, f in forms.items() if f is not None and f not in tested}
    assert not untested, untested


@pytest.mark.parametrize(
    ("command", "form"),
    [
        ("upgrade fleet charts/bc-workers --set a=b", "untested"),
        ("upgrade fleet charts/bc-workers --reuse-values", "reuse-values"),
        ("upgrade fleet bc-workers --reset-then-reuse-values", "reset-then-reuse-values"),
        ("upgrade fleet bc-workers -f my-values.yaml", "values-file"),
        ("upgrade nats nats/nats --set x=y", None),
        ("upgrade", None),
        ("rollback fleet 3", "rollback"),
        ("upgrade fleet bc-workers --version 0.3.0 --reuse-values", "rollback-to-reuse-values"),
    ],
)
def test_the_command_classifier_tells_the_forms_apart(command: str, form: str | None) -> None:
    verb, *args = command.split()
    assert form_of(verb, args) == form
