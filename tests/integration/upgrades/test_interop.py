"""The contract as a team in another language meets it: the AsyncAPI document validates
against the AsyncAPI 3 JSON Schema, and a NATS.js subscriber validating each event with
the exported JSON Schemas accepts one that carries a field added by a later minor.

Node.js and the packages of `tests/interop/package-lock.json` (installed here, once, with
`npm ci`) are the other language."""

from __future__ import annotations

import asyncio
import copy
import fcntl
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client as NATS

from schemas import REGISTRY, NodeConnected
from schemas.asyncapi import ASYNCAPI_FILE, document
from schemas.export import JSON_DIR
from schemas.subjects import Subjects
from tests.conftest import Servers
from workers.runtime.bus import streams

INTEROP = Path(__file__).resolve().parents[2] / "interop"


@pytest.fixture(scope="session")
def node_packages() -> Path:
    """`tests/interop/node_modules`, installed from the lock file (once, whichever test
    process gets here first)."""
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is not installed: the interop tests need Node.js 18+ and npm")
    with (INTEROP / ".install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        installed = INTEROP / "node_modules" / ".package-lock.json"
        if (
            not installed.exists()
            or installed.stat().st_mtime < (INTEROP / "package-lock.json").stat().st_mtime
        ):
            subprocess.run(
                ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                cwd=INTEROP, check=True, timeout=300,
            )  # fmt: skip
    return INTEROP


def _validate(document_: dict[str, Any], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "asyncapi.json"
    path.write_text(json.dumps(document_))
    return subprocess.run(
        ["node", str(INTEROP / "validate-asyncapi.mjs"), str(path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_the_asyncapi_document_validates_and_a_broken_one_does_not(
    node_packages: Path, tmp_path: Path
) -> None:
    doc = json.loads(ASYNCAPI_FILE.read_text())
    assert doc == document(), "stale: run bcw schemas export --asyncapi schemas/asyncapi.json"
    checked = _validate(doc, tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # the validator is not a yes-machine: an AsyncAPI 2 verb and a missing info are refused
    broken = copy.deepcopy(doc)
    broken["operations"]["send.events.node.connected"]["action"] = "publish"
    del broken["info"]
    refused = _validate(broken, tmp_path)
    assert refused.returncode == 1 and json.loads(refused.stdout)["valid"] is False


async def test_a_nats_js_subscriber_accepts_an_event_with_a_field_added_later(
    node_packages: Path, servers: Servers, nc: NATS, subjects: Subjects
) -> None:
    js = nc.jetstream()
    await streams.provision_streams(js, subjects)
    subscriber = await asyncio.create_subprocess_exec(
        "node", str(INTEROP / "subscribe.mjs"), servers.nats_url, subjects.events_stream,
        str(JSON_DIR), "3", stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert subscriber.stdout is not None
    assert json.loads(await asyncio.wait_for(subscriber.stdout.readline(), 30)) == {"ready": True}
    event = NodeConnected(
        node_id="n1", epoch=1, gateway_id="gw-1", boot_id="b1",
        journal_changed=False, boot_changed=False, duplicate_identity=False,
    )  # fmt: skip
    body, headers = REGISTRY.encode(event)
    later = {**json.loads(body), "zone": "eu-1", "placement": {"rack": 7}}
    missing = {k: v for k, v in json.loads(body).items() if k != "nodeId"}
    subject = subjects.event(event.BC_TYPE)
    for n, payload in enumerate([json.loads(body), later, missing]):
        sent = {**headers, "Nats-Msg-Id": f"interop-{n}"}
        if n == 1:
            sent["Bc-Schema"] = "1.3"  # and a producer that says its minor
        await js.publish(subject, json.dumps(payload).encode(), headers=sent)
    out, _ = await asyncio.wait_for(subscriber.communicate(), 30)
    verdicts = [json.loads(line) for line in out.decode().splitlines()]
    assert [(v["type"], v["valid"]) for v in verdicts] == [
        ("node.connected", True),
        ("node.connected", True),  # the field added later
        ("node.connected", False),  # control: a required field missing is still refused
    ]
    assert subscriber.returncode == 0
