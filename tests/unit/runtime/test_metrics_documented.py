"""The metrics table of docs/runtime.md is the code's: every `bcw_*` metric a process
registers — the runtime's and each worker's own — is in it, with its type and labels, and
the table names no other."""

from __future__ import annotations

import re
from pathlib import Path

from workers.registry import WORKERS
from workers.runtime.observability.metrics import Metrics
from workers.settings import Settings

DOC = Path(__file__).resolve().parents[3] / "docs" / "runtime.md"


def fleet_metrics(version: str = "") -> Metrics:
    """A process's metrics with each worker's own made, as in a process running them all."""
    metrics = Metrics(version)
    settings = Settings()
    for build in WORKERS.values():
        for kind in build(settings).metrics:
            metrics.of(kind)
    return metrics


def _table() -> dict[str, tuple[str, str]]:
    """metric name → (type, labels cell) of the table under "## Metrics (`/metrics`)"."""
    text = DOC.read_text()
    section = text[text.index("## Metrics (`/metrics`)") :]
    section = section[: section.index("\n## ", 1)]
    out = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`bcw_"):
            continue
        for name in re.findall(r"`(bcw_\w+)`", cells[0]):
            out[name] = (cells[1], cells[2])
    return out


def _registered() -> dict[str, tuple[str, tuple[str, ...]]]:
    """metric name as scraped (a counter with `_total`) → (type, label names)."""
    out = {}
    for family in fleet_metrics("0.0.0").registry.collect():
        if not family.name.startswith("bcw_"):
            continue
        name = f"{family.name}_total" if family.type == "counter" else family.name
        labels = {k for s in family.samples for k in s.labels if k not in ("le", "quantile")}
        out[name] = (family.type, tuple(sorted(labels)))
    return out


def _labels_declared() -> dict[str, tuple[str, ...]]:
    """Label names of every family, children made or not (a family with none shows no
    sample: `_registered` would see no label)."""
    metrics = fleet_metrics("0.0.0")
    out = {}
    for value in [v for owner in (metrics, *metrics.sets()) for v in vars(owner).values()]:
        metric = getattr(value, "_metric", None)
        if metric is not None and metric._name.startswith("bcw_"):
            name = metric._name + ("_total" if metric._type == "counter" else "")
            out[name] = tuple(metric._labelnames)
    return out


def test_every_registered_metric_is_in_the_table_and_the_table_names_no_other() -> None:
    table, code = _table(), _registered()
    assert sorted(set(code) - set(table)) == [], "registered, not in docs/runtime.md"
    assert sorted(set(table) - set(code)) == [], "in docs/runtime.md, not registered"


def test_each_documented_metric_has_its_type_and_labels() -> None:
    table, code, labels = _table(), _registered(), _labels_declared()
    for name, (kind, _) in code.items():
        assert table[name][0] == kind, name
        for label in labels[name]:
            assert f"`{label}`" in table[name][1], f"{name}: label {label} not in the table"


def test_a_workers_own_metrics_are_its_own_and_made_once_per_process() -> None:
    from workers.liveness.metrics import SweepMetrics

    metrics = Metrics()
    assert "bcw_liveness_" not in metrics.render()  # the runtime's own name no worker
    swept = metrics.of(SweepMetrics)
    assert metrics.of(SweepMetrics) is swept  # made again, its names would clash
    assert metrics.sets() == [swept]
    assert 'bcw_liveness_held_sessions{reason="lag"} 0.0' in metrics.render()
