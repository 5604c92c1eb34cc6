"""The committed JSON Schemas (`schemas/json/`) are exactly what the models export."""

from __future__ import annotations

import json
from pathlib import Path

from schemas.export import JSON_DIR, export, json_schemas, render
from workers.cli import main


def test_committed_json_schemas_are_up_to_date() -> None:
    wanted = json_schemas()
    committed = {path.name for path in JSON_DIR.glob("*.json")}
    assert committed == set(wanted), "run: bcw schemas export schemas/json"
    for name, schema in wanted.items():
        assert (JSON_DIR / name).read_text() == render(schema), (
            f"{name} is stale: run bcw schemas export"
        )


def test_export_writes_and_prunes(tmp_path: Path) -> None:
    (tmp_path / "old.v1.json").write_text("{}")
    written = export(tmp_path)
    assert not (tmp_path / "old.v1.json").exists()
    hello = json.loads((tmp_path / "hello.v1.json").read_text())
    assert hello["x-bc-type"] == "hello"
    assert "boot_id" in hello["properties"]
    assert len(written) == len(json_schemas())


def test_cli_export(tmp_path: Path, capsys: object) -> None:
    assert main(["schemas", "export", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "node.connected.v1.json").exists()
    connected = json.loads((tmp_path / "out" / "node.connected.v1.json").read_text())
    assert "nodeId" in connected["properties"]
