"""The contract as a team in another language meets it: the AsyncAPI document validates
against the AsyncAPI 3 JSON Schema, and names what a subscriber needs besides the
messages (the streams, the nkey login, the resume and duplicate rules). The subscribers
themselves: test_interop_subscribers.py.

Node.js and the packages of `tests/interop/package-lock.json` (installed once, with
`npm ci`: conftest.py) are the other language."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

from schemas.asyncapi import ASYNCAPI_FILE, document
from tests.integration.upgrades.conftest import INTEROP


def _validate(document_: dict[str, Any], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "asyncapi.json"
    path.write_text(json.dumps(document_))
    return subprocess.run(
        ["node", str(INTEROP / "validate-asyncapi.mjs"), str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_asyncapi_document_validates_and_a_broken_one_does_not(
    node_packages: Path, tmp_path: Path
) -> None:
    doc = json.loads(ASYNCAPI_FILE.read_text())
    assert doc == document(), "stale: run bcw schemas export --asyncapi schemas/asyncapi.json"
    # what a subscriber needs besides the messages: the streams, the login, the rules
    assert doc["components"]["securitySchemes"]["nkey"]["type"] == "asymmetricEncryption"
    assert doc["servers"]["nats"]["security"] == [{"$ref": "#/components/securitySchemes/nkey"}]
    streams = {c["address"].split(".")[1]: c["x-bc-stream"] for c in doc["channels"].values()}
    assert streams == {
        "facts": "BC_FACTS",
        "events": "BC_EVENTS",
        "revocations": "BC_EVENTS",
        "gw": "BC_GATEWAY",
    }
    for rule in ("Resume", "Duplicates", "Nats-Msg-Id", "sub-<app>"):
        assert rule in doc["channels"]["events.node.connected"]["description"], rule
    checked = _validate(doc, tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # the validator is not a yes-machine: an AsyncAPI 2 verb and a missing info are refused
    broken = copy.deepcopy(doc)
    broken["operations"]["send.events.node.connected"]["action"] = "publish"
    del broken["info"]
    refused = _validate(broken, tmp_path)
    assert refused.returncode == 1 and json.loads(refused.stdout)["valid"] is False
