"""A subscriber in another language from the docs alone (issue 60, item 7): the Node.js
recipes of docs/contract.md, "Subscribing to session events" — the very scripts
`tests/interop/subscribe.mjs` and `durable.mjs`, checked equal to the docs' code blocks —
run against a nats-server that admits only the principals `bcw auth nats` writes, with
the streams and the durable `sub-siem` `bcw provision` makes, each logged in with its own
nkey seed. The events are published as the relay publishes them (its own login), a
revocation and a re-publication among them."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from schemas import REGISTRY, NodeConnected, Revocations
from schemas.export import JSON_DIR
from schemas.subjects import Subjects
from tests.integration.security.conftest import client_as
from tests.integration.upgrades.conftest import INTEROP
from workers.embedded.servers import EmbeddedNats

pytestmark = pytest.mark.slow

CONTRACT = Path(__file__).resolve().parents[3] / "docs" / "contract.md"
RECIPES = ("subscribe.mjs", "durable.mjs")
SUBJECTS = Subjects("bc")


def recipe_in_docs(name: str) -> str | None:
    """The code block that follows `<!-- tests/interop/<name> -->` in docs/contract.md."""
    text = CONTRACT.read_text()
    marker = f"<!-- tests/interop/{name} -->"
    if marker not in text:
        return None
    found = re.match(r"\s*```[a-z]*\n(.*?)^```", text.split(marker, 1)[1], re.S | re.M)
    return found.group(1) if found else None


def test_the_docs_recipes_are_the_scripts_the_interop_tests_run() -> None:
    for name in RECIPES:
        assert recipe_in_docs(name) == (INTEROP / name).read_text(), f"docs/contract.md: {name}"


@pytest.fixture
def production(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """(URL, keys): a nats-server with `bcw auth nats`'s auth.conf (gateway gw-1, subscriber
    application siem) and the streams and durables of `bcw provision`."""
    keys = tmp_path / "auth"
    cli = [sys.executable, "-m", "workers.cli"]
    subprocess.run(
        [*cli, "auth", "nats", "--gateways", "gw-1", "--subscribers", "siem", "--out", str(keys)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    conf = keys / "server.conf"
    conf.write_text('include "auth.conf"\n')
    server = EmbeddedNats(tmp_path / "nats", extra=["-c", str(conf)]).start()
    try:
        env = {
            **os.environ,
            "BCW_NATS_URL": server.url,
            "BCW_SUBJECT_ROOT": SUBJECTS.root,
            "BCW_NATS_NKEY_SEED_FILE": str(keys / "admin.nk"),
            "BCW_NATS_GATEWAYS": "gw-1",
            "BCW_NATS_SUBSCRIBERS": "siem",
        }
        done = subprocess.run(
            [*cli, "provision"], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stdout + done.stderr
        yield server.url, keys
    finally:
        server.stop()


def _event(n: int, **changes: Any) -> tuple[str, bytes, dict[str, str]]:
    """A `node.connected` of node n<n> as a worker of this release says it, with `changes`
    to its body (a key given None: left out); (subject, body, headers)."""
    event = NodeConnected(
        node_id=f"n{n}",
        epoch=n,
        gateway_id="gw-1",
        boot_id="b1",
        journal_changed=False,
        boot_changed=False,
        duplicate_identity=False,
        connected_at=datetime.now(UTC),
    )
    body, headers = REGISTRY.encode(event)
    payload = {**json.loads(body), **changes}
    payload = {k: v for k, v in payload.items() if v is not None}
    sent = {**headers, "Nats-Msg-Id": str(uuid.uuid4())}  # as the outbox gives each
    return SUBJECTS.event(event.BC_TYPE), json.dumps(payload).encode(), sent


async def _publish_as_relay(
    url: str, keys: Path, messages: list[tuple[str, bytes, dict[str, str]]]
) -> None:
    async with client_as(keys, url, "relay") as (nc, errors):
        js = nc.jetstream()
        for subject, body, headers in messages:
            await js.publish(subject, body, headers=headers)
        assert errors == []


async def _node(
    script: str, within: float = 60, stdin: bytes | None = None, **env: str
) -> tuple[int, list[dict[str, Any]], str]:
    """Run a script of tests/interop with `env`; (exit code, its JSON lines, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        "node",
        str(INTEROP / script),
        *([str(JSON_DIR)] if stdin is not None else []),
        env={**os.environ, **env},
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(stdin), within)
    lines = [json.loads(line) for line in out.decode().splitlines() if line.strip()]
    return proc.returncode or 0, lines, err.decode()


async def test_a_subscriber_reads_and_resumes_from_a_sequence_under_the_production_permissions(
    node_packages: Path,
    production: tuple[str, Path],
) -> None:
    url, keys = production
    current = _event(1)
    republished = _event(5)
    revocation = Revocations(node_id="n9", serials=["s1"], reason="duplicate-identity")
    rbody, rheaders = REGISTRY.encode(revocation)
    rheaders = {**rheaders, "Nats-Msg-Id": str(uuid.uuid4())}
    await _publish_as_relay(
        url,
        keys,
        [
            current,
            _event(2, connectedAt=None),  # as a 0.3 worker says it: no time
            (SUBJECTS.revocations, rbody, dict(rheaders)),  # in BC_EVENTS, not an event
            _event(3, zone="eu-1", placement={"rack": 7}),  # fields a later minor adds
            _event(4, nodeId=None),  # control: a required field missing
            republished,
            republished,  # the relay's retry: the same Nats-Msg-Id, one copy kept
        ],
    )
    as_subscriber = {"NATS_URL": url, "NKEY_SEED_FILE": str(keys / "subscriber.nk")}
    code, first, err = await _node("subscribe.mjs", START_SEQ="1", COUNT="2", **as_subscriber)
    assert code == 0, err
    assert [line["seq"] for line in first] == [1, 2]
    resume = str(first[-1]["seq"] + 1)
    code, rest, err = await _node("subscribe.mjs", START_SEQ=resume, COUNT="3", **as_subscriber)
    assert code == 0, err
    assert [line["seq"] for line in rest] == [4, 5, 6]  # the revocation (3) is not an event
    lines = first + rest
    assert [line["event"].get("nodeId") for line in lines] == ["n1", "n2", "n3", None, "n5"]
    assert len({line["msgId"] for line in lines}) == 5
    assert "connectedAt" in lines[0]["event"] and "connectedAt" not in lines[1]["event"]
    async with client_as(keys, url, "admin") as (nc, _):  # the retry was not stored again
        assert (await nc.jetstream().stream_info("BC_EVENTS")).state.last_seq == 6
    stdin = "\n".join(json.dumps(line) for line in lines).encode()
    code, verdicts, err = await _node("validate-events.mjs", stdin=stdin)
    assert code == 0, err
    assert [v["valid"] for v in verdicts] == [True, True, True, False, True], verdicts


#: the natural way, which docs/contract.md says is refused ("No ordered consumer")
ORDERED = """
import { readFileSync } from "node:fs";
import { connect, nkeyAuthenticator, nkeys } from "@nats-io/transport-node";
import { jetstream } from "@nats-io/jetstream";
const seed = new TextEncoder().encode(readFileSync(process.env.NKEY_SEED_FILE, "utf8").trim());
const nc = await connect({ servers: process.env.NATS_URL, authenticator: nkeyAuthenticator(seed),
  inboxPrefix: `_INBOX.${nkeys.fromSeed(seed).getPublicKey()}` });
const consumer = await jetstream(nc).consumers.get("BC_EVENTS", { opt_start_seq: 1 });
console.log(JSON.stringify({ got: (await consumer.next({ expires: 2000 }))?.seq ?? null }));
"""


async def test_an_ordered_consumer_is_refused_to_the_subscriber(
    node_packages: Path,
    production: tuple[str, Path],
) -> None:
    url, keys = production
    await _publish_as_relay(url, keys, [_event(1)])
    proc = await asyncio.create_subprocess_exec(
        "node",
        "--input-type=module",
        "-e",
        ORDERED,
        cwd=INTEROP,
        env={**os.environ, "NATS_URL": url, "NKEY_SEED_FILE": str(keys / "subscriber.nk")},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode != 0 and out == b""
    assert 'Permissions Violation for Publish to "$JS.API.CONSUMER.CREATE.BC_EVENTS' in err.decode()
    async with client_as(keys, url, "admin") as (nc, _):
        names = [c.name for c in await nc.jetstream().consumers_info("BC_EVENTS")]
    assert names == ["sub-siem"]  # nothing was made


async def test_a_subscriber_follows_new_events_from_now_on(
    node_packages: Path,
    production: tuple[str, Path],
) -> None:
    url, keys = production
    await _publish_as_relay(url, keys, [_event(1)])
    proc = await asyncio.create_subprocess_exec(
        "node",
        str(INTEROP / "subscribe.mjs"),
        stdout=asyncio.subprocess.PIPE,
        env={
            **os.environ,
            "NATS_URL": url,
            "NKEY_SEED_FILE": str(keys / "subscriber.nk"),
            "COUNT": "1",
        },
    )
    assert proc.stdout is not None
    read = asyncio.ensure_future(proc.stdout.readline())
    n = 1
    while not read.done() and n < 60:  # until it has started: a new event each half second
        n += 1
        await _publish_as_relay(url, keys, [_event(n)])
        await asyncio.wait([read], timeout=0.5)
    line = json.loads(await asyncio.wait_for(read, 10))
    assert line["seq"] > 1 and line["event"]["nodeId"] != "n1"  # not the one before it began
    assert await asyncio.wait_for(proc.wait(), 10) == 0


async def test_a_subscriber_application_resumes_from_its_durable(
    node_packages: Path,
    production: tuple[str, Path],
) -> None:
    url, keys = production
    await _publish_as_relay(url, keys, [_event(n) for n in range(1, 6)])
    as_siem = {"NATS_URL": url, "NKEY_SEED_FILE": str(keys / "subscriber-siem.nk"), "APP": "siem"}
    code, first, err = await _node("durable.mjs", COUNT="2", **as_siem)
    assert code == 0, err
    code, rest, err = await _node("durable.mjs", COUNT="3", **as_siem)
    assert code == 0, err
    assert [line["seq"] for line in first + rest] == [1, 2, 3, 4, 5]
    assert not any(line["redelivered"] for line in first + rest)
    # the control: the production permissions hold (another login may not pull `sub-siem`)
    other = {**as_siem, "NKEY_SEED_FILE": str(keys / "subscriber.nk")}
    code, lines, err = await _node("durable.mjs", COUNT="1", **other)
    assert code != 0 and lines == [], err
