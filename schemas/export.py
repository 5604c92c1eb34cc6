"""JSON Schema export of every registered message (`bcw schemas export DIR`).

The committed `schemas/json/` is what non-Python producers and consumers read; a test
checks it is up to date with the models.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from schemas.registry import REGISTRY, Registry

JSON_DIR = Path(__file__).parent / "json"


def json_schemas(registry: Registry = REGISTRY) -> dict[str, dict[str, Any]]:
    """File name → JSON Schema, for every registered model, with wire field names."""
    out: dict[str, dict[str, Any]] = {}
    for (bc_type, version), model in sorted(registry.models.items()):
        schema = model.model_json_schema(by_alias=True, mode="validation")
        schema["$id"] = f"urn:bc:{bc_type}:v{version}"
        schema["x-bc-type"] = bc_type
        schema["x-bc-schema"] = version
        out[f"{bc_type}.v{version}.json"] = schema
    return out


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def export(directory: Path, registry: Registry = REGISTRY) -> list[Path]:
    """Write every schema to `directory`, removing stale `*.json` files there."""
    directory.mkdir(parents=True, exist_ok=True)
    wanted = json_schemas(registry)
    for stale in directory.glob("*.json"):
        if stale.name not in wanted:
            stale.unlink()
    written = []
    for name, schema in wanted.items():
        path = directory / name
        path.write_text(render(schema), encoding="utf-8")
        written.append(path)
    return written
