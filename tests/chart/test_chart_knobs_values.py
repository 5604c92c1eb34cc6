"""The values of issue 60, item 8 as values: incoherent retention refused at render in one
line (as the workers would refuse it at start), every value of the schema described, and
values without the new keys (`--reuse-values` from an older release) still rendered."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from tests.chart.test_chart import CHART, MINIMAL, by_kind
from tests.chart.test_chart import render as render_chart


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    return render_chart(values)


def _with(**values: Any) -> dict[str, Any]:
    out = copy.deepcopy(MINIMAL)
    out.update(copy.deepcopy(values))
    return out


RETENTION_REFUSED = {
    "a stream below 2m": (
        {"nats": {"factsGateways": ["gw-1"], "retention": {"notices": "90s"}}},
        r"nats\.retention\.notices \(90s\) is below 2m",
    ),
    "facts as long as the inbox rows": (
        {"nats": {"factsGateways": ["gw-1"], "retention": {"facts": "25h"}}},
        r"nats\.retention\.facts \(25h\) must be below BCW_RETENTION_PROCESSED_FACTS \(25h\)",
    ),
    "facts above a worker's own inbox rows": (
        {
            "nats": {"factsGateways": ["gw-1"], "retention": {"facts": "48h"}},
            "extraEnv": [{"name": "BCW_RETENTION_PROCESSED_FACTS", "value": "3d"}],
            "workers": {
                "replay": {"env": [{"name": "BCW_RETENTION_PROCESSED_FACTS", "value": "30h"}]}
            },
        },
        r"nats\.retention\.facts \(48h\) must be below BCW_RETENTION_PROCESSED_FACTS \(30h\)",
    ),
    "session history below a day": (
        {"extraEnv": [{"name": "BCW_RETENTION_SESSION_HISTORY", "value": "12h"}]},
        r"BCW_RETENTION_SESSION_HISTORY \(12h\) is below 1d",
    ),
}


@pytest.mark.parametrize("case", RETENTION_REFUSED.values(), ids=RETENTION_REFUSED.keys())
def test_incoherent_retention_is_refused_at_render_in_one_line(
    case: tuple[dict[str, Any], str],
) -> None:
    values, message = case
    with pytest.raises(helm.HelmError, match=message):
        render(_with(**values))


@pytest.mark.parametrize(
    "values",
    [
        {
            "nats": {"factsGateways": ["gw-1"], "retention": {"notices": "2m", "facts": "1w"}},
            "extraEnv": [{"name": "BCW_RETENTION_PROCESSED_FACTS", "value": "8d"}],
        },
        {
            "nats": {
                "factsGateways": ["gw-1"],
                "retention": {"events": "120", "deadLetters": "0.5w"},
            }
        },
        {"extraEnv": [{"name": "BCW_RETENTION_NODE_EVENTS", "value": "1d"}]},
    ],
)
def test_coherent_retention_renders(values: dict[str, Any]) -> None:
    assert render(_with(**values))


NEW_KEYS = {
    "": ["commonLabels", "commonAnnotations", "extraObjects"],
    "defaults": ["probes", "revisionHistoryLimit"],
    "relay": ["probes", "podLabels", "podAnnotations"],
    "tests": ["resources", "nats"],
    "podDisruptionBudget": ["minAvailable", "unhealthyPodEvictionPolicy"],
    "serviceMonitor": ["scrapeTimeout", "relabelings", "metricRelabelings"],
    "networkPolicy": ["extraEgress", "extraIngress"],
}


def test_values_without_these_keys_still_render(tmp_path: Path) -> None:
    """`helm upgrade --reuse-values` from a release before these keys gives the templates
    values without them: every template reads them as absent, not as a nil pointer."""
    chart = tmp_path / "bc-workers"
    shutil.copytree(CHART, chart)
    values = yaml.safe_load((chart / "values.yaml").read_text())
    for parent, keys in NEW_KEYS.items():
        for key in keys:
            del (values[parent] if parent else values)[key]
    for spec in values["workers"].values():
        for key in ("probes", "podLabels", "podAnnotations"):
            del spec[key]
    (chart / "values.yaml").write_text(yaml.safe_dump(values))
    on = {"enabled": True}
    rendered = helm.Chart.load(str(chart)).render(
        {**MINIMAL, "relay": on, "serviceMonitor": on, "networkPolicy": on},
        name="fleet",
        namespace="control-plane",
        is_install=True,
    )
    texts = [text for name, text in rendered.items() if not name.endswith(".txt")]
    docs = [d for text in texts for d in yaml.safe_load_all(text) if d]
    deployments = by_kind(docs, "Deployment")
    assert len(deployments) == 6
    assert all(d["spec"]["revisionHistoryLimit"] == 5 for d in deployments.values())


def _undescribed(schema: dict[str, Any]) -> list[str]:
    """Every property of the values schema (at any depth, in its definitions too) that
    has no description."""
    out: list[str] = []

    def walk(node: dict[str, Any], path: str) -> None:
        for key, sub in node.get("properties", {}).items():
            where = f"{path}.{key}" if path else key
            if not str(sub.get("description", "")).strip():
                out.append(where)
            walk(sub, where)
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                walk(node[key], f"{path}[]")

    walk(schema, "")
    for name, definition in schema.get("definitions", {}).items():
        walk(definition, f"#/definitions/{name}")
    return out


def test_every_value_in_the_schema_has_a_description() -> None:
    """An editor or `helm show values` user reads what a value does from the schema."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert _undescribed(schema) == []
    schema["properties"]["logLevel"].pop("description")
    schema["properties"]["nats"]["properties"]["retention"]["properties"]["facts"].pop(
        "description"
    )
    assert _undescribed(schema) == ["logLevel", "nats.retention.facts"]
