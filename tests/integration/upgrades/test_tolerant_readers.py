"""A newer producer on the real servers (docs/contract.md, "Compatibility"): facts with
fields this release does not know take effect; a fact of a schema major it does not speak
is parked, intact, for a redrive after the upgrade — never applied, never lost."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import asyncpg
from nats.aio.client import Client as NATS

from schemas import REGISTRY, Fact
from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.factories import make_fact
from tests.integration import fleet
from tests.integration.support import eventually, make_settings, publish_raw, running
from workers import labeler, liveness, replay
from workers.runtime.bus import deadletter

S = timedelta(seconds=1)


def newer(fact: Fact, nested: tuple[str, ...] = (), **extra: Any) -> bytes:
    """`fact` as a gateway one minor ahead sends it: with fields added at the top and in
    the `nested` objects (or each object of a nested list)."""
    body = json.loads(REGISTRY.encode(fact)[0])
    for name in nested:
        value = body[name]
        for one in value if isinstance(value, list) else [value]:
            one["added_in_a_later_minor"] = [1, "two", {"three": None}]
    return json.dumps({**body, **extra}).encode()


async def publish(nc: NATS, subjects: Subjects, fact: Fact, body: bytes, schema: str) -> None:
    await publish_raw(
        nc.jetstream(),
        subjects.fact(fact.gateway_id, fact.BC_TYPE),
        body,
        {"Bc-Type": fact.BC_TYPE, "Bc-Schema": schema},
    )


async def test_a_hello_a_flush_and_a_result_with_unknown_fields_each_take_effect(
    servers: Servers, nc: NATS, subjects: Subjects, database_url: str, db: asyncpg.Connection
) -> None:
    await fleet.session(db, "n1", epoch=1, seen_ago=60 * S)
    command = await db.fetchval(
        "INSERT INTO commands (node_id, seq, kind, state, session_epoch, delivery_attempt) "
        "VALUES ('n1', 1, 'exec', 'dispatched', 1, 1) RETURNING command_id"
    )
    await db.execute("UPDATE nodes SET last_command_seq = 1 WHERE node_id = 'n1'")
    seen_before = await db.fetchval("SELECT last_seen FROM node_sessions WHERE node_id = 'n1'")
    settings = make_settings(servers.nats_url, database_url, subjects)
    hello = fleet.hello("n1", 1, capabilities=["nvml"], running_command_ids=[str(command)])
    flush = make_fact("liveness", entries=[{"node_id": "n1", "epoch": 1, "age_ms": 0}])
    result = make_fact(
        "result",
        node_id="n1",
        epoch=1,
        command_id=str(command),
        outcome="done",
        result={"exit": 0},
        error=None,
    )
    workers = [labeler.build(settings), liveness.build(settings), replay.build(settings)]
    async with running(settings, workers):
        # one says its minor in Bc-Schema too ("1.4"): the major is what a reader checks
        await publish(nc, subjects, hello, newer(hello, ("cert", "previous"), zone="eu-1"), "1")
        await publish(nc, subjects, flush, newer(flush, ("entries",)), "1.4")
        await publish(nc, subjects, result, newer(result, duration_ms=12), "1")

        async def applied() -> bool:
            labels = await db.fetchval(
                "SELECT array_agg(key) FROM node_labels WHERE node_id = 'n1' AND source = 'system'"
            )
            row = await db.fetchrow(
                "SELECT s.last_seen, c.state FROM node_sessions s JOIN commands c USING (node_id)"
            )
            return (
                labels == ["bc.dev/cap.nvml"]
                and row["last_seen"] > seen_before
                and row["state"] == "done"
            )

        await eventually(applied, what="the three newer facts applied")
    assert await deadletter.list_dead_letters(nc.jetstream(), subjects) == []


async def test_a_fact_of_a_major_this_release_does_not_speak_is_parked_intact(
    servers: Servers, nc: NATS, subjects: Subjects, database_url: str, db: asyncpg.Connection
) -> None:
    await fleet.session(db, "n1", epoch=1)
    settings = make_settings(servers.nats_url, database_url, subjects)
    hello = fleet.hello("n1", 1, capabilities=["nvml"])
    body = REGISTRY.encode(hello)[0]
    async with running(settings, [labeler.build(settings)]):
        await publish(nc, subjects, hello, body, "2")

        async def parked() -> bool:
            return bool(await deadletter.list_dead_letters(nc.jetstream(), subjects))

        await eventually(parked, what="the major-2 Hello parked")
    [letter] = await deadletter.list_dead_letters(nc.jetstream(), subjects)
    assert (letter.worker, letter.cause, letter.subject) == (
        "labeler",
        "unsupported-major",
        subjects.fact("gw-1", "hello"),
    )
    assert "hello schema major 2 is not spoken here (this release speaks 1)" in letter.reason
    assert letter.data == body  # intact: a redrive after the upgrade applies it as sent
    assert letter.headers["Bc-Schema"] == "2"
    assert await db.fetchval("SELECT count(*) FROM node_labels WHERE node_id = 'n1'") == 0
    only_unsupported = await deadletter.list_dead_letters(nc.jetstream(), subjects, cause="invalid")
    assert only_unsupported == []
