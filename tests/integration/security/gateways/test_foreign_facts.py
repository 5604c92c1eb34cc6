"""Facts bound to the gateway that holds the node: a second gateway forging facts about a
node held by the first changes nothing; a result replayed through the node's next
gateway after a reconnect still completes its command.

What is real: nats-server, PostgreSQL, two reference gateways (gw-a holds the node, gw-c
takes it over), all five workers in one process, and a forging gateway (gw-b) publishing
well-formed facts on its own subjects, as a buggy or hostile gateway could.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
from nats.aio.client import Client as NATS

from schemas.facts import Fact
from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.factories import hello, make_fact
from tests.integration import fleet
from tests.integration.fleet import Provisioned
from tests.integration.security.gateways.forgery import FOREIGN, counted, forged_facts, state
from tests.integration.streams import RecordingStream
from tests.integration.support import (
    eventually,
    make_settings,
    outbox_empty,
    publish_fact,
    running,
    stream_messages,
)
from workers.gateway import Gateway, HelloRequest
from workers.registry import WORKERS
from workers.runtime.bus import streams
from workers.runtime.effects.provenance import KnownBindings, foreign
from workers.runtime.effects.worker import Runtime


@contextlib.asynccontextmanager
async def _two_gateways(
    servers: Servers,
    nc: NATS,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
    pool: asyncpg.Pool,
) -> AsyncIterator[tuple[Runtime, Gateway, Gateway]]:
    """n1 joined; all five workers in one process; gw-a (holds the node) and gw-c (takes
    it over) started, and stopped at the end."""
    await streams.provision_streams(nc.jetstream(), subjects)
    await fleet.join(db, "n1")
    settings = make_settings(servers.nats_url, database_url, subjects)
    workers = [WORKERS[name](settings) for name in sorted(WORKERS)]
    holder = Provisioned("gw-a", pool, nc, subjects)
    successor = Provisioned("gw-c", pool, nc, subjects)
    await holder.start()
    await successor.start()
    try:
        async with running(settings, workers) as (runtime, _port):
            yield runtime, holder, successor
    finally:
        for gateway in (holder, successor):
            if gateway.alive:
                await gateway.stop(graceful=False)


def _request(**kw: Any) -> HelloRequest:
    fields: dict[str, Any] = {
        "node_id": "n1",
        "cert_serial": "n1-serial",
        "role": "worker",
        "boot_id": "boot-real",
        "journal_id": "journal-1",
        "capabilities": ["gpu", "ssd"],
    }
    return HelloRequest(**{**fields, **kw})


def _counted(runtime: Runtime, result: str) -> dict[tuple[str, str], int]:
    return counted([runtime], result)


async def _bodies(nc: NATS, stream: str, bc_type: str) -> list[dict[str, Any]]:
    return [
        json.loads(m.data)
        for m in await stream_messages(nc.jetstream(), stream)
        if m.headers and m.headers.get("Bc-Type") == bc_type
    ]


async def test_a_gateway_forging_facts_about_a_node_it_does_not_hold_changes_nothing(
    servers: Servers,
    nc: NATS,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
    pool: asyncpg.Pool,
) -> None:
    async with _two_gateways(servers, nc, subjects, database_url, db, pool) as (
        runtime,
        holder,
        successor,
    ):
        stream = RecordingStream()
        welcome = await fleet.say_hello(holder, _request(), stream)
        command = await db.fetchval("SELECT enqueue_command('n1', 'noop', '{}')")
        await eventually(lambda: _delivered(stream, 1), what="the command dispatched to gw-a")
        await eventually(
            lambda: _settled(runtime, "applied", 3), what="the Hello applied by 3 workers"
        )
        # and its events published (the relay's, after the commit) before they are counted
        await eventually(lambda: outbox_empty(database_url), what="the Hello's events out")
        before = await state(db)
        notices_before = len(await _bodies(nc, subjects.gateway_stream, "dispatch"))
        events_before = {
            t: len(await _bodies(nc, subjects.events_stream, t))
            for t in ("node.connected", "node.capabilities-changed", "node.disconnected")
        }

        # gw-b forges facts about n1, which gw-a holds
        js = nc.jetstream()
        for fact in forged_facts("gw-b", "gw-a", welcome.epoch, command):
            await publish_fact(js, subjects, fact)
        expected = FOREIGN
        await eventually(
            lambda: _counted_is(runtime, expected), what="every forged fact counted foreign"
        )
        assert await state(db) == before  # capabilities, count, certs, commands, events
        assert len(await _bodies(nc, subjects.gateway_stream, "dispatch")) == notices_before
        assert {
            t: len(await _bodies(nc, subjects.events_stream, t)) for t in events_before
        } == events_before
        for security in ("security.node.duplicate-session", "security.node.quarantined"):
            assert await _bodies(nc, subjects.events_stream, security) == []
        assert len(stream.delivered) == 1

        # the node moves to gw-c; its result, replayed there at the new epoch, counts
        moved = await fleet.say_hello(successor, _request(running_command_ids=[str(command)]))
        await successor.result("n1", moved.epoch, uuid.UUID(str(command)), "done", {}, None)
        await eventually(
            lambda: _command_done(db, command), what="the replayed result completed it"
        )
        assert _counted(runtime, "foreign") == expected  # nothing more was foreign


async def _delivered(stream: RecordingStream, n: int) -> bool:
    return len(stream.delivered) >= n


async def _settled(runtime: Runtime, outcome: str, n: int) -> bool:
    return sum(1 for (_w, t), v in _counted(runtime, outcome).items() if t == "hello" and v) >= n


async def _counted_is(runtime: Runtime, expected: dict[tuple[str, str], int]) -> bool:
    return _counted(runtime, "foreign") == expected


async def _command_done(db: asyncpg.Connection, command: uuid.UUID) -> bool:
    state = await db.fetchval("SELECT state FROM commands WHERE command_id = $1", command)
    return bool(state == "done")


async def test_one_epoch_one_hello_a_former_holder_cannot_count_its_epoch_again(
    servers: Servers,
    nc: NATS,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
    pool: asyncpg.Pool,
) -> None:
    """gw-a held n1 at epoch 1; the node moved to gw-c (epoch 2). gw-a re-publishes Hello
    facts for epoch 1 with other boot ids (each a "duplicate identity"): every Hello worker
    finds them foreign — the epoch's Hello transaction recorded its one Hello fact — so the
    quarantine counts none of them and the node keeps its certificate and session."""
    async with _two_gateways(servers, nc, subjects, database_url, db, pool) as (
        runtime,
        holder,
        successor,
    ):
        first = await fleet.say_hello(holder, _request())
        await fleet.say_hello(successor, _request())
        [hello] = [h for h in await _bodies(nc, subjects.facts_stream, "hello") if h["epoch"] == 1]
        recorded = await db.fetchval(
            "SELECT hello_fact_id FROM session_epochs WHERE node_id = 'n1' AND epoch = 1"
        )
        assert str(recorded) == hello["fact_id"]
        forged = [
            make_fact(
                "hello",
                **{
                    **hello,
                    "fact_id": str(uuid.uuid4()),
                    "boot_id": f"clone-{i}",
                    "previous": {**hello["previous"], "boot_id": "boot-real", "live": True},
                    "duplicate": True,
                },
            )
            for i in range(5)
        ]
        for fact in forged:
            await publish_fact(nc.jetstream(), subjects, fact)
        expected = {(w, "hello"): 5 for w in ("labeler", "liveness", "quarantine", "replay")}
        await eventually(
            lambda: _counted_is(runtime, expected), what="every second Hello of epoch 1 foreign"
        )
        assert first.epoch == 1
        assert await db.fetchval("SELECT duplicate_hellos FROM node_sessions") == 0
        assert await db.fetchval("SELECT count(*) FROM node_alternations") == 0
        assert await db.fetchval("SELECT bool_or(revoked_at IS NOT NULL) FROM node_certs") is False
        assert await _bodies(nc, subjects.events_stream, "security.node.duplicate-session") == []


async def test_a_binding_confirmed_lately_is_not_asked_again_and_a_forgery_always_is(
    db: asyncpg.Connection,
) -> None:
    """A consumer remembers the bindings the database confirmed (`KnownBindings`): the
    same session's next facts are not checked one by one; another gateway's are, a fact
    found foreign is asked again (its Hello may have committed since), and so is each
    Hello (one epoch, one Hello)."""
    await fleet.join(db, "n1")
    await fleet.join(db, "n2")
    issue = "INSERT INTO session_epochs (node_id, epoch, gateway_id, hello_fact_id) VALUES ($1, $2, $3, $4)"
    await db.execute(issue, "n1", 1, "gw-a", None)
    known = KnownBindings()

    def status(gateway: str) -> Fact:
        return make_fact("status", node_id="n1", gateway_id=gateway, epoch=1)

    assert await foreign(db, [status("gw-a")], known) == set()
    forged = status("gw-b")
    assert await foreign(db, [forged], known) == {forged.fact_id}

    # the database stops confirming it: remembered, it is not asked; not remembered, or
    # remembered no more, it is
    await db.execute("DELETE FROM session_epochs WHERE node_id = 'n1'")
    again = status("gw-a")
    assert await foreign(db, [again], known) == set()
    assert await foreign(db, [again]) == {again.fact_id}
    assert await foreign(db, [again], KnownBindings(ttl=0.0)) == {again.fact_id}

    # foreign is never remembered: once its epoch is issued, the same fact is bound
    early = make_fact("closed", node_id="n2", gateway_id="gw-c", epoch=2)
    assert await foreign(db, [early], known) == {early.fact_id}
    first = hello("n2", 3, gateway_id="gw-c")
    await db.execute(issue, "n2", 2, "gw-c", None)
    await db.execute(issue, "n2", 3, "gw-c", first.fact_id)
    assert await foreign(db, [early], known) == set()

    # a Hello is asked each time: the epoch's own Hello is bound, another one never
    second = hello("n2", 3, gateway_id="gw-c")
    assert await foreign(db, [first, second], known) == {second.fact_id}
    assert await foreign(db, [second], known) == {second.fact_id}
