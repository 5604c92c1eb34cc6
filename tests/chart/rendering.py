"""The chart rendered as `helm install` renders it in a cluster: the wheel's `Chart.render`
takes no API versions, its native render does (the options' `api_versions`, as Helm's
`--api-versions`), so that `.Capabilities.APIVersions.Has` answers as the cluster would."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import helm_python as helm
from helm_python import _native

# a cluster with prometheus-operator's CRDs and KEDA's
CRD_APIS = ("monitoring.coreos.com/v1", "keda.sh/v1alpha1")


def render_in(
    chart_dir: Path,
    values: dict[str, Any],
    api_versions: tuple[str, ...] = CRD_APIS,
    **release: Any,
) -> dict[str, str]:
    """Every template's output by its path, NOTES.txt included (`release`: Helm's render
    options over an install's, e.g. `revision`, `is_install`, `is_upgrade`)."""
    chart = helm.Chart.load(str(chart_dir))
    options = {"name": "fleet", "namespace": "control-plane", "is_install": True} | release
    options["api_versions"] = list(api_versions)
    rendered: dict[str, str] = json.loads(
        _native.call_string("helm_render", chart._raw(), json.dumps(values), json.dumps(options))
    )
    return rendered
