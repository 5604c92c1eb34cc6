"""Upgrades rendered as Helm 3 computes them, from the previous release's chart.

The previous release is the one CHANGELOG.md records below this version (tests/upgrade/
release.py finds its commit, tag or no tag); its chart is `git archive`d from that commit.
Each form is what Helm's upgrade action (pkg/action/upgrade.go, `reuseValues`) does
with the release it finds, rendered offline by real Helm (the helm-python wheel):

- `--reuse-values`: the chart's defaults are *replaced* by the old release's coalesced
  values (its chart's defaults under its user-supplied values), and the old user-supplied
  values are the values: the new chart's values.yaml is not read at all;
- `--reset-then-reuse-values`, and `helm upgrade` with no values of its own (Helm then
  reuses the old user-supplied values): the new chart's defaults, the old user-supplied
  values on top;
- `-f my-values.yaml`: the new chart's defaults and that file only;
- `helm rollback`: the old revision's manifest, as it was rendered.
"""

from __future__ import annotations

import copy
import fcntl
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

from tests.chart.rendering import render_in
from tests.upgrade.release import CACHE, REPO, previous_release

CHART = REPO / "charts" / "bc-workers"
NAME = "fleet"
NAMESPACE = "control-plane"
#: The forms of `helm upgrade` (and `helm rollback`) the harness renders.
FORMS = ("reuse-values", "reset-then-reuse-values", "values-file", "rollback")

Docs = list[dict[str, Any]]


@dataclass(frozen=True)
class Release:
    """A release as Helm stores it: its chart, user-supplied values, and manifest."""

    chart: Path
    config: dict[str, Any]
    coalesced: dict[str, Any]
    manifest: Docs


def coalesce(over: dict[str, Any], under: dict[str, Any]) -> dict[str, Any]:
    """Helm's CoalesceTables: `over` wins, maps merged key by key, a null in `over`
    deletes the key."""
    out = copy.deepcopy(under)
    for key, value in over.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = coalesce(value, out[key])
        else:
            out[key] = copy.deepcopy(value)
    return out


@cache
def previous_chart() -> Path:
    """The previous release's chart, from its commit (once per checkout)."""
    release = previous_release()
    assert release is not None, "CHANGELOG.md records no earlier release"
    home = CACHE / release.commit
    home.mkdir(parents=True, exist_ok=True)
    chart = home / "chart" / "charts" / "bc-workers"
    with (home / ".chart.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (home / "chart" / "extracted").exists():
            shutil.rmtree(home / "chart", ignore_errors=True)
            (home / "chart").mkdir()
            archive = subprocess.run(
                ["git", "archive", release.commit, "charts/bc-workers"],
                cwd=REPO,
                capture_output=True,
                check=True,
            )
            subprocess.run(
                ["tar", "-x", "-C", str(home / "chart")], input=archive.stdout, check=True
            )
            (home / "chart" / "extracted").touch()
    return chart


def previous_production() -> dict[str, Any]:
    """The previous release's production example (its ci/production-values.yaml)."""
    return dict(yaml.safe_load((previous_chart() / "ci" / "production-values.yaml").read_text()))


def manifest(rendered: dict[str, str]) -> Docs:
    docs: Docs = []
    for name, text in rendered.items():
        if not name.endswith(".txt"):
            docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def install(chart: Path, config: dict[str, Any]) -> Release:
    """`helm install` of `chart` with these user-supplied values (revision 1)."""
    loaded = helm.Chart.load(str(chart))
    rendered = render_in(chart, config, name=NAME, namespace=NAMESPACE, revision=1)
    return Release(chart, config, loaded.merge_values(config), manifest(rendered))


def _upgrade(chart: Path, values: dict[str, Any], defaults: dict[str, Any] | None) -> Docs:
    """Render `chart` as revision 2 of an upgrade; `defaults` replace its values.yaml."""
    with tempfile.TemporaryDirectory() as scratch:
        if defaults is not None:
            chart = Path(shutil.copytree(chart, Path(scratch) / chart.name))
            (chart / "values.yaml").write_text(yaml.safe_dump(defaults))
        rendered = render_in(
            chart,
            values,
            name=NAME,
            namespace=NAMESPACE,
            revision=2,
            is_install=False,
            is_upgrade=True,
        )
    return manifest(rendered)


def _in_form(chart: Path, form: str, values: dict[str, Any], base: Release) -> Docs:
    """`chart`'s manifest as `helm upgrade` in `form` computes it from `base`, with the
    command's own -f/--set `values` (for `values-file`, the file)."""
    if form == "reuse-values":
        return _upgrade(chart, coalesce(values, base.config), base.coalesced)
    if form == "reset-then-reuse-values":
        return _upgrade(chart, coalesce(values, base.config), None)
    if form == "values-file":
        return _upgrade(chart, values, None)
    raise ValueError(form)


def upgrade(old: Release, form: str, values: dict[str, Any] | None = None) -> Docs:
    """This chart's manifest as `helm upgrade` in `form` computes it from `old`
    (`values`: the command's own -f/--set values; for `values-file`, the file)."""
    if form == "rollback":
        return old.manifest
    return _in_form(CHART, form, values or {}, old)


def rollback_upgrade(new: Release, old_chart: Path, form: str, values: dict[str, Any]) -> Docs:
    """The previous release's chart as `helm upgrade --version <previous>` in `form`
    computes it from `new` (a rollback across releases written as an upgrade)."""
    return _in_form(old_chart, form, values, new)
