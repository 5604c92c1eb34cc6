"""Clones refused in time: a session whose Hello was a duplicate identity gets nothing
until the quarantine enforcer has counted it; the quarantined clone never gets a command,
and its revocation closes it.

What is real: nats-server, PostgreSQL, two reference gateways, the liveness, quarantine
and replay workers on the real runtime; two "machines" sharing one certificate say Hello
in turn, each while the other's session is live.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration import fleet
from tests.integration.streams import RecordingStream
from tests.integration.support import eventually, make_settings, running
from workers import explain, liveness, quarantine, replay
from workers.gateway import Code, Gateway, GatewaySettings, HelloRequest, Refused
from workers.runtime.bus import streams


@pytest.mark.parametrize("serial", ["n1-serial", "unrecorded"])
async def test_the_quarantined_clone_gets_no_command(
    serial: str,
    servers: Servers,
    nc: NATS,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
    pool: asyncpg.Pool,
) -> None:
    await streams.provision_streams(nc.jetstream(), subjects)
    await fleet.join(db, "n1")
    settings = make_settings(servers.nats_url, database_url, subjects)
    workers = [build(settings) for build in (liveness.build, quarantine.build, replay.build)]
    gateways = [Gateway(g, pool, nc, subjects) for g in ("gw-a", "gw-b")]
    for gateway in gateways:
        await gateway.start()
    try:
        async with running(settings, workers):

            async def hello(turn: int, stream: RecordingStream | None = None) -> RecordingStream:
                stream = stream or RecordingStream()
                request = HelloRequest(node_id="n1", cert_serial=serial, role="worker",
                                       boot_id=f"machine-{turn % 2}", journal_id="j1")  # fmt: skip
                await gateways[turn % 2].hello(request, stream)
                return stream

            await hello(0)
            for turn in range(1, 4):  # three alternations: counted, not quarantined
                stream = await hello(turn)
                await eventually(lambda: _released(db), what=f"alternation {turn} counted")
            command = await db.fetchval("SELECT enqueue_command('n1', 'noop', '{}')")
            await eventually(lambda: _delivered(stream), what="a counted session gets its work")
            assert [d.command_id for d in stream.delivered] == [command]

            # the fourth alternation: quarantined. The gateway waits for the verdict, and
            # the Hello is refused once the revocation has committed (the seed's words)
            clone = RecordingStream()
            with pytest.raises(Refused) as refused:
                await hello(4, clone)
            assert refused.value.code is Code.UNAUTHENTICATED
            assert refused.value.reason == "certificate quarantined: duplicate identity"
            assert await _revoked(db, serial)
            await asyncio.sleep(1.0)  # a dispatch round or two, had it been sent anything
            assert clone.delivered == [] and clone.dropped == ["revoked"]
            row = await db.fetchrow("SELECT session_epoch, held_epoch FROM node_sessions")
            assert row["held_epoch"] == row["session_epoch"] == 5
            state = await db.fetchval("SELECT state FROM commands WHERE command_id = $1", command)
            assert state == "pending"  # taken back from the clone, waiting for a real session
            with pytest.raises(Refused) as refused:  # the serial is refused from now on
                await hello(5)
            assert refused.value.code is Code.UNAUTHENTICATED
            # a serial with no record was admitted, and is now recorded revoked
            assert await db.fetchval(
                "SELECT count(*) FROM node_certs WHERE revoked_at IS NULL"
            ) == (1 if serial == "unrecorded" else 0)
            # the node's DuplicateIdentity condition, as readers see it
            condition = await db.fetchrow("SELECT condition, epoch FROM node_conditions")
            assert tuple(condition) == ("DuplicateIdentity", 5)
            state = await db.fetchrow(explain.SESSION, "n1")
            assert explain.state_fields(state)["conditions"] == ["DuplicateIdentity"]  # type: ignore[index]
            assert "condition DuplicateIdentity" in explain.state_line(state)
            # re-joined with a new certificate, one machine says Hello: the condition clears
            await fleet.join(db, "n1", serial="n1-serial-2")
            await gateways[0].hello(
                HelloRequest(node_id="n1", cert_serial="n1-serial-2", role="worker",
                             boot_id="machine-new", journal_id="j1"),
                RecordingStream(),
            )  # fmt: skip

            async def cleared() -> bool:
                return await db.fetchval("SELECT count(*) FROM node_conditions") == 0

            await eventually(cleared, what="the condition cleared by the quarantine worker")
    finally:
        for gateway in gateways:
            if gateway.alive:
                await gateway.stop(graceful=False)


async def _released(db: asyncpg.Connection) -> bool:
    return await db.fetchval("SELECT held_epoch IS NULL FROM node_sessions") is True


async def _delivered(stream: RecordingStream) -> bool:
    return bool(stream.delivered)


async def _revoked(db: asyncpg.Connection, serial: str) -> bool:
    query = "SELECT revoked_at IS NOT NULL FROM node_certs WHERE serial = $1"
    return bool(await db.fetchval(query, serial))


async def _dropped(stream: RecordingStream) -> bool:
    return bool(stream.dropped)


async def test_with_the_quarantine_down_a_duplicates_hello_is_welcomed_held_after_the_wait(
    nc: NATS, subjects: Subjects, db: asyncpg.Connection, pool: asyncpg.Pool
) -> None:
    """No verdict comes (the quarantine worker is down): the Hello waits `verdict_wait`,
    then is welcomed, its session held — the hold bound rules from there."""
    await streams.provision_streams(nc.jetstream(), subjects)
    await fleet.join(db, "n1")
    gateway = Gateway("gw-a", pool, nc, subjects, settings=GatewaySettings(verdict_wait=0.5))
    await gateway.start()
    try:
        first = HelloRequest(node_id="n1", cert_serial="n1-serial", role="worker",
                             boot_id="machine-0", journal_id="j1")  # fmt: skip
        await gateway.hello(first, RecordingStream())
        started = asyncio.get_running_loop().time()
        welcome = await gateway.hello(replace(first, boot_id="machine-1"), RecordingStream())
        waited = asyncio.get_running_loop().time() - started
        assert welcome.epoch == 2 and 0.5 <= waited < 3.0
        assert await db.fetchval("SELECT held_epoch FROM node_sessions") == 2
    finally:
        await gateway.stop(graceful=False)
