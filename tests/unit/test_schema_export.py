"""The committed JSON Schemas (`schemas/json/`) are exactly what the models export."""

from __future__ import annotations

import json
from pathlib import Path

from schemas.export import JSON_DIR, export, json_schemas, render
from workers.cli.main import main


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


def test_cli_export_asyncapi(tmp_path: Path) -> None:
    from schemas.asyncapi import ASYNCAPI_FILE, document

    assert main(["schemas", "export", "--asyncapi", str(tmp_path / "bus.json")]) == 0
    written = json.loads((tmp_path / "bus.json").read_text())
    assert written == document() == json.loads(ASYNCAPI_FILE.read_text())
    assert written["channels"]["facts.hello"]["address"] == "{root}.facts.{gatewayId}.hello"
    assert written["operations"]["send.events.node.connected"]["action"] == "send"
    # every $ref resolves inside the document
    refs: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                refs.append(node["$ref"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(written)
    for ref in refs:
        target: object = written
        for part in ref.removeprefix("#/").split("/"):
            assert isinstance(target, dict) and part in target, ref
            target = target[part]
    assert main(["schemas", "export"]) == 2


def test_every_command_has_a_description_and_an_example() -> None:
    import argparse

    from workers.cli.main import build_parser

    def leaves(
        parser: argparse.ArgumentParser, path: str
    ) -> list[tuple[str, argparse.ArgumentParser]]:
        nested = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not nested:
            return [(path, parser)]
        return [
            leaf
            for action in nested
            for name, sub in action.choices.items()
            for leaf in leaves(sub, f"{path} {name}".strip())
        ]

    found = leaves(build_parser(), "")
    assert len(found) >= 14
    for path, parser in found:
        help_text = parser.format_help()
        assert parser.description, path
        assert "example:\n  " in help_text and f"bcw {path}" in help_text, path


def test_the_clis_scenario_names_are_the_simulators() -> None:
    from workers.cli.running import SCENARIO_NAMES
    from workers.sim.scenarios import SCENARIOS

    assert sorted(SCENARIO_NAMES) == sorted(SCENARIOS)
