"""Issue 60, items 1 and 8 (the chart's knobs and the `--reuse-values` fill), attacked as
someone who writes a values file (a GitOps repository's contributor) or upgrades with the
docs' commands: what can the values make the release do that is not documented, and does
an upgrade's fill turn a security setting off?

Held (pinned): an upgrade from 0.3.0's production example with `--reuse-values` or
`--reset-then-reuse-values` renders every pod with the security a fresh install of the
same values has (pod and container security contexts, service account, no token mounted,
the NetworkPolicies and PDBs); the test Pod, filled with `tests.nats.existingSecret: ""`,
mounts no other principal's Secret (0.3.0's mounted the admin's) and fails saying why.

Found: `podLabels` (chart-wide, a worker's, the relay's) take the chart's own
`app.kubernetes.io/*` keys that `commonLabels` refuses: the pod template then carries the
key twice (the selector's and the values'); `extraObjects`' strings go through `tpl`,
where `lookup` reads the cluster with the installer's credentials (a Secret of another
namespace copied into a ConfigMap by a values file) — the README said `tpl`, not that.
Both fixed: the schema refuses those keys in every `podLabels`, and the README says what
`lookup` reads."""

from __future__ import annotations

from typing import Any

import helm_python as helm
import pytest
import yaml

from tests.chart import upgrade
from tests.chart.rendering import render_in
from tests.chart.upgrade import CHART

pytestmark = pytest.mark.slow

SECURITY_KINDS = ("NetworkPolicy", "PodDisruptionBudget", "ServiceAccount", "Role", "RoleBinding")


def _security(docs: upgrade.Docs) -> dict[tuple[str, str], Any]:
    """What of each object decides what its pods may do, by (kind, name); the migration
    Job by kind alone (its name is a digest of its values)."""
    out: dict[tuple[str, str], Any] = {}
    for doc in docs:
        kind, name = doc["kind"], doc["metadata"]["name"]
        if kind in ("Deployment", "Job", "Pod"):
            spec = doc["spec"] if kind == "Pod" else doc["spec"]["template"]["spec"]
            containers = [*spec.get("initContainers", []), *spec["containers"]]
            secrets = {v["secret"]["secretName"] for v in spec.get("volumes", []) if "secret" in v}
            secrets |= {
                e["valueFrom"]["secretKeyRef"]["name"]
                for c in containers
                for e in c.get("env", [])
                if "secretKeyRef" in e.get("valueFrom", {})
            }
            out[(kind, "" if kind == "Job" else name)] = (
                spec.get("securityContext"),
                spec.get("serviceAccountName"),
                spec.get("automountServiceAccountToken"),
                spec.get("hostNetwork"),
                [c.get("securityContext") for c in containers],
                sorted(secrets),
            )
        elif kind in SECURITY_KINDS:
            out[(kind, name)] = doc.get("spec", doc.get("automountServiceAccountToken"))
    return out


@pytest.mark.parametrize("form", ["reuse-values", "reset-then-reuse-values"])
def test_an_upgrade_from_the_previous_release_keeps_every_security_setting(form: str) -> None:
    old = upgrade.install(upgrade.previous_chart(), upgrade.previous_production())
    fresh = _security(upgrade.upgrade(old, "values-file", upgrade.previous_production()))
    assert _security(upgrade.upgrade(old, form)) == fresh
    [(_, test_pod)] = [(k, v) for k, v in _security(old.manifest).items() if k[0] == "Pod"]
    [(_, now)] = [(k, v) for k, v in fresh.items() if k[0] == "Pod"]
    assert any("admin" in s for s in test_pod[-1])  # 0.3.0's test Pod: the admin's login
    assert not any("admin" in s for s in now[-1])  # this one: no other principal's


def _values(**extra: Any) -> dict[str, Any]:
    base = dict(yaml.safe_load((CHART / "ci" / "production-values.yaml").read_text()))
    return base | extra


def _labelled(where: str) -> dict[str, Any]:
    """The production example with a chart's own label key in `where`'s podLabels."""
    values = _values()
    if where == "chart-wide":
        values["podLabels"] = {"app.kubernetes.io/component": "relay"}
    elif where == "a worker's":
        values["workers"]["labeler"] = values["workers"].get("labeler", {}) | {
            "podLabels": {"app.kubernetes.io/name": "nats"}
        }
    else:
        values["relay"] = values.get("relay", {}) | {
            "enabled": True,
            "podLabels": {"app.kubernetes.io/instance": "x"},
        }
    return values


def test_common_labels_refuse_the_charts_own_keys() -> None:
    """Held: the schema's guard on `commonLabels`."""
    with pytest.raises(helm.HelmError):
        render_in(CHART, _values(commonLabels={"app.kubernetes.io/component": "relay"}))


@pytest.mark.parametrize("where", ["chart-wide", "a worker's", "the relay's"])
def test_pod_labels_refuse_the_charts_own_keys(where: str) -> None:
    with pytest.raises(helm.HelmError):
        render_in(CHART, _labelled(where))


LOOKUP = (
    "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: copied}\n"
    'data: {found: \'{{ lookup "v1" "Secret" "nats" "nats-admin" | toJson }}\'}'
)


def test_extra_objects_reach_lookup_through_tpl() -> None:
    """As it is: a string of `extraObjects` calls `lookup` (offline it answers `{}`; in a
    cluster, the Secret as the installer may read it)."""
    rendered = render_in(CHART, _values(extraObjects=[LOOKUP]))
    [copied] = [
        d
        for name, text in rendered.items()
        if not name.endswith(".txt")
        for d in yaml.safe_load_all(text)
        if d and d.get("metadata", {}).get("name") == "copied"
    ]
    assert copied["data"]["found"] == "{}"


def test_the_readme_says_extra_objects_read_the_cluster_as_the_installer() -> None:
    readme = (CHART / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `extraObjects`"))
    assert "lookup" in row
