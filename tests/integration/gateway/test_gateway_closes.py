"""A close is known at once (docs/contract.md, "As of the Hello"): the reference gateway
writes a normal close, fenced, in its own transaction, so the node's next Hello on any
gateway reads the previous session as not live — whether or not the liveness worker has
got to the `closed` fact yet. The liveness worker still publishes `node.disconnected`."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration import fleet
from tests.integration.driver import driving
from tests.integration.fleet import Provisioned
from tests.integration.gateway.hellos import request
from tests.integration.streams import RecordingStream
from tests.integration.support import eventually, stream_messages
from workers import liveness, quarantine
from workers.gateway import Code, Gateway, GatewaySettings, Refused
from workers.runtime.bus import streams


async def _row(db: asyncpg.Connection) -> tuple[object, ...]:
    row = await db.fetchrow(
        "SELECT session_epoch, gateway_id, disconnect_reason, disconnected_at IS NOT NULL AS gone,"
        " held_epoch FROM node_sessions WHERE node_id = 'n1'"
    )
    return tuple(row)


async def test_a_clean_close_is_written_by_its_gateway_and_announced_by_the_liveness_worker(
    gateway: Gateway,
    db: asyncpg.Connection,
    servers: Servers,
    nc: NATS,
    subjects: Subjects,
    database_url: str,
) -> None:
    await fleet.join(db, "n1")
    welcome = await fleet.say_hello(gateway, request())
    await gateway.disconnect("n1", welcome.epoch, "stream-closed")
    assert await _row(db) == (welcome.epoch, None, "stream-closed", True, None)
    async with driving(servers, nc, subjects, database_url, liveness.build) as drive:
        await eventually(lambda: _settled(drive, 2), what="the Hello and the close applied")
        [event] = await drive.published("node.disconnected")
    assert (event["nodeId"], event["epoch"], event["reason"]) == (
        "n1",
        welcome.epoch,
        "stream-closed",
    )
    assert await _row(db) == (welcome.epoch, None, "stream-closed", True, None)  # as written


async def test_three_quick_reboots_with_clean_closes_count_nothing(
    gateway: Gateway,
    db: asyncpg.Connection,
    servers: Servers,
    nc: NATS,
    subjects: Subjects,
    database_url: str,
) -> None:
    """No liveness worker runs: only the gateways' own writes say the sessions ended."""
    await fleet.join(db, "n1")
    for boot in ("boot-1", "boot-2", "boot-3", "boot-4"):
        welcome = await fleet.say_hello(gateway, request(boot_id=boot))
        if boot != "boot-4":
            await gateway.disconnect("n1", welcome.epoch, "stream-closed")
    assert (await _row(db))[4] is None  # never held for the quarantine
    hellos = [
        json.loads(m.data)
        for m in await stream_messages(nc.jetstream(), subjects.facts_stream)
        if m.headers.get("Bc-Type") == "hello"
    ]
    assert [h["previous"]["live"] for h in hellos] == [False] * 4
    async with driving(servers, nc, subjects, database_url, quarantine.build) as drive:
        await eventually(lambda: _settled(drive, 4), what="four Hellos seen")
        assert drive.settled("ignored") == 4  # no duplicate identity: nothing to count
        assert await drive.published("security.node.duplicate-session") == []
    assert await db.fetchval("SELECT duplicate_hellos FROM node_sessions") == 0


async def _settled(drive: object, n: int) -> bool:
    return drive.settled() >= n  # type: ignore[attr-defined, no-any-return]


async def test_a_started_gateway_renews_its_lease_and_flushes_by_itself_on_a_monotonic_clock(
    pool: asyncpg.Pool, db: asyncpg.Connection, nc: NATS, subjects: Subjects
) -> None:
    """Nobody calls tick(): the gateway's own liveness loop renews its lease and flushes;
    a step of the host's wall clock (an NTP correction of an hour) drops no stream, since
    silence is measured on the monotonic clock."""
    await streams.provision_streams(nc.jetstream(), subjects)
    settings = GatewaySettings(renew_every=0.2, flush_period=0.3, lease_ttl=2.0)
    gateway = Provisioned("gw-m", pool, nc, subjects, settings=settings)
    await gateway.start(autotick=0.1)
    try:
        await fleet.join(db, "n1")
        stream = RecordingStream()
        await fleet.say_hello(gateway, request(), stream)
        expires = await db.fetchval("SELECT lease_expires_at FROM gateways")
        gateway.wall = lambda: time.time() + 3600  # the host's clock steps an hour ahead
        await asyncio.sleep(1.0)
        assert await db.fetchval("SELECT lease_expires_at FROM gateways") > expires
        flushes = [
            m
            for m in await stream_messages(nc.jetstream(), subjects.facts_stream)
            if m.headers["Bc-Type"] == "liveness"
        ]
        assert len(flushes) >= 2
        assert "n1" in gateway.sessions and stream.dropped == []
    finally:
        await gateway.stop(graceful=False)


async def test_a_hello_whose_fact_the_bus_refuses_is_closed_and_refused_and_the_next_one_opens(
    gateway: Gateway, db: asyncpg.Connection, nc: NATS, subjects: Subjects
) -> None:
    """A Hello the bus cannot take (here: its done results pass the server's max payload)
    was already committed: its epoch stays raised, but its session is closed, written as
    closed, and the Hello refused UNAVAILABLE with a pushback — never a session no worker
    hears of. The daemon's next Hello (its results acked by then, or fewer) opens."""
    await fleet.join(db, "n1")
    big = [
        {"command_id": str(uuid.uuid4()), "outcome": "done", "result": {"out": "x" * 1500}}
        for _ in range(1000)
    ]  # about 1.6 MB: above nats-server's 1 MiB
    with pytest.raises(Refused) as refused:
        await fleet.say_hello(gateway, request(results=big), RecordingStream())
    assert refused.value.code is Code.UNAVAILABLE  # its own back-off: no pushback
    assert "n1" not in gateway.sessions
    assert await _row(db) == (1, None, "stream-closed", True, None)
    assert not await stream_messages(nc.jetstream(), subjects.facts_stream, None)
    welcome = await fleet.say_hello(gateway, request(boot_id="b2"), RecordingStream())
    assert welcome.epoch == 2 and "n1" in gateway.sessions


async def test_a_stopping_gateway_closes_its_sessions_in_one_write_each_at_its_epoch(
    gateway: Gateway, db: asyncpg.Connection
) -> None:
    """A drain's stop: every session's close written first (`gateway_close_many`: fenced on
    the gateway, its lease and each session's epoch), then each stream dropped with
    `gateway-shutdown`. A session the node has since opened elsewhere is left alone."""
    streams = {}
    for node in ("n1", "n2", "n3"):
        await fleet.join(db, node)
        streams[node] = RecordingStream()
        await fleet.say_hello(
            gateway, request(node_id=node, cert_serial=f"{node}-serial"), streams[node]
        )
    await db.execute(  # n3 is someone else's now (a newer epoch on another gateway)
        "UPDATE node_sessions SET session_epoch = session_epoch + 1, gateway_id = NULL "
        "WHERE node_id = 'n3'"
    )
    await gateway.stop()
    rows = await db.fetch(
        "SELECT node_id, gateway_id, disconnect_reason FROM node_sessions ORDER BY node_id"
    )
    assert [tuple(r) for r in rows] == [
        ("n1", None, "gateway-shutdown"),
        ("n2", None, "gateway-shutdown"),
        ("n3", None, None),
    ]
    assert all(s.dropped and s.dropped[0] == "gateway-shutdown" for s in streams.values())
