"""The liveness controller's facts on real servers: Hello announcements, flushes (zombies,
credits, a 10,000-entry flush, a locked row waited for in node order) and fenced disconnects; the sweep is in
test_liveness_sweep.py."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas.facts import Fact
from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.factories import make_fact
from tests.integration import fleet
from tests.integration.driver import Driver, driving
from tests.integration.support import eventually, publish_fact, stream_messages
from workers import liveness

S = timedelta(seconds=1)


@pytest.fixture
async def drive(servers: Servers, nc: NATS, subjects: Subjects, database_url: str):  # type: ignore[no-untyped-def]
    async with driving(servers, nc, subjects, database_url, liveness.build) as driver:
        yield driver


# -- facts -----------------------------------------------------------------------------
async def test_hello_announces_connected_and_a_late_hello_says_nothing(
    drive: Driver, db: asyncpg.Connection
) -> None:
    await fleet.session(db, "n1", epoch=3, gateway_id="gw-1")
    hello = fleet.hello(
        "n1",
        3,
        boot_id="b2",
        journal_id="journal-1",
        previous={
            "epoch": 2,
            "gateway_id": "gw-0",
            "boot_id": "b1",
            "journal_id": "journal-1",
            "live": True,
        },
    )
    await drive.send(hello)
    await drive.send(fleet.hello("n1", 2))  # late: the row is at epoch 3
    [event] = await drive.published("node.connected")
    assert event == {
        **event,
        "nodeId": "n1",
        "epoch": 3,
        "gatewayId": "gw-1",
        "bootId": "b2",
        "journalChanged": False,
        "bootChanged": True,
        "duplicateIdentity": True,
    }
    assert drive.settled("stale") == 1
    # connected when the Hello happened (its gateway's `observed_at`, days before the bus
    # stored it here), not when the bus stored it nor when it was applied
    assert _at(event["connectedAt"]) == hello.observed_at
    assert _at(event["connectedAt"]) < await _stored_at(drive, hello)


async def test_a_gateway_that_claims_the_future_is_bounded_by_the_bus(
    drive: Driver, db: asyncpg.Connection
) -> None:
    await fleet.session(db, "n1", epoch=3, gateway_id="gw-1")
    ahead = datetime.now(UTC) + timedelta(days=1)
    hello = fleet.hello("n1", 3).model_copy(update={"observed_at": ahead})
    await drive.send(hello)
    [event] = await drive.published("node.connected")
    stored = await _stored_at(drive, hello)
    assert abs(_at(event["connectedAt"]) - stored) < timedelta(milliseconds=1)


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text)


async def _stored_at(drive: Driver, fact: Fact) -> datetime:
    """When the facts stream stored `fact`, to the microsecond (as its events say it)."""
    [msg] = [
        m
        for m in await stream_messages(drive.nc.jetstream(), drive.subjects.facts_stream)
        if m.headers.get("Nats-Msg-Id") == str(fact.fact_id)
    ]
    assert msg.time is not None
    return cast(datetime, msg.time)


def flush(gateway: str, *entries: tuple[str, int, int]) -> Any:
    return make_fact(
        "liveness",
        gateway_id=gateway,
        entries=[{"node_id": n, "epoch": e, "age_ms": a} for n, e, a in entries],
    )


async def test_a_flush_moves_last_seen_forward_and_names_the_zombies(
    drive: Driver, db: asyncpg.Connection
) -> None:
    await fleet.session(db, "ok", epoch=2, gateway_id="gw-1", seen_ago=60 * S)
    await fleet.session(db, "stale-epoch", epoch=5, gateway_id="gw-1", seen_ago=60 * S)
    await fleet.session(db, "other-gw", epoch=1, gateway_id="gw-2", seen_ago=60 * S)
    await fleet.session(db, "rehomed", epoch=4, gateway_id="gw-3", seen_ago=60 * S)
    before = {
        r["node_id"]: r["last_seen"]
        for r in await db.fetch("SELECT node_id, last_seen FROM node_sessions")
    }
    await drive.send(
        flush(
            "gw-1",
            ("ok", 2, 1000),
            ("stale-epoch", 4, 1000),
            ("other-gw", 1, 1000),
            ("rehomed", 3, 500),
            ("ghost", 1, 0),
        )
    )
    after = {
        r["node_id"]: r["last_seen"]
        for r in await db.fetch("SELECT node_id, last_seen FROM node_sessions")
    }
    assert after["ok"] > before["ok"]
    assert {n: after[n] for n in ("stale-epoch", "other-gw", "rehomed")} == {
        n: before[n] for n in ("stale-epoch", "other-gw", "rehomed")
    }
    zombies = await drive.published("zombie", stream="notices")
    assert sorted((z["node_id"], z["epoch"], z["_subject"]) for z in zombies) == [
        ("ghost", 1, drive.subjects.notice("gw-1", "zombie")),
        ("other-gw", 1, drive.subjects.notice("gw-1", "zombie")),
        ("rehomed", 3, drive.subjects.notice("gw-1", "zombie")),
        ("stale-epoch", 4, drive.subjects.notice("gw-1", "zombie")),
    ]


async def test_a_flush_never_moves_last_seen_backwards(
    drive: Driver, db: asyncpg.Connection
) -> None:
    await fleet.session(db, "n1", epoch=1, gateway_id="gw-1")
    await drive.send(flush("gw-1", ("n1", 1, 0)))
    fresh = await db.fetchval("SELECT last_seen FROM node_sessions WHERE node_id = 'n1'")
    await drive.send(flush("gw-1", ("n1", 1, 30_000)))  # an older observation, delivered later
    assert await db.fetchval("SELECT last_seen FROM node_sessions WHERE node_id = 'n1'") == fresh


async def test_a_flush_keeps_the_daemons_credits_and_load_and_one_without_them_the_last(
    drive: Driver, db: asyncpg.Connection
) -> None:
    await fleet.session(db, "n1", epoch=2, gateway_id="gw-1")
    await fleet.session(db, "n2", epoch=1, gateway_id="gw-1")

    def entry(
        node: str, epoch: int, credits: dict[str, int] | None, load: float | None = None
    ) -> dict[str, Any]:
        return {"node_id": node, "epoch": epoch, "age_ms": 0, "credits": credits, "load": load}

    async def credits() -> dict[str, Any]:
        rows = await db.fetch("SELECT node_id, lane_credits::text AS c, load FROM node_sessions")
        return {r["node_id"]: (json.loads(r["c"]) if r["c"] else None, r["load"]) for r in rows}

    reported = {"default": 1, "system": 4}
    await drive.send(
        make_fact(
            "liveness",
            gateway_id="gw-1",
            entries=[entry("n1", 2, reported, 2.5), entry("n2", 1, None)],
        )
    )
    assert await credits() == {"n1": (reported, 2.5), "n2": (None, None)}
    await drive.send(make_fact("liveness", gateway_id="gw-1", entries=[entry("n1", 2, None)]))
    assert await credits() == {"n1": (reported, 2.5), "n2": (None, None)}  # an older gateway's
    await drive.send(
        make_fact("liveness", gateway_id="gw-1", entries=[entry("n1", 1, {"default": 0}, 9.0)])
    )
    assert (await credits())["n1"] == (reported, 2.5)  # fenced: another session's report
    # a heartbeat's whole NodeLoad is kept beside its load average
    load = {
        "load_average": 3.0,
        "memory_available_bytes": 2**34,
        "running_commands": 2,
        "pending_events": 7,
    }
    await drive.send(
        make_fact(
            "liveness",
            gateway_id="gw-1",
            entries=[{**entry("n1", 2, None, 3.0), "node_load": load}],
        )
    )
    assert (
        json.loads(
            await db.fetchval("SELECT node_load::text FROM node_sessions WHERE node_id = 'n1'")
        )
        == load
    )


async def test_a_flush_of_10000_entries(
    servers: Servers, nc: NATS, subjects: Subjects, database_url: str, db: asyncpg.Connection
) -> None:
    await db.execute(
        "SELECT join_node('f' || i, 'worker', 'f-serial-' || i, NULL) FROM generate_series(1, 10000) i"
    )
    await db.execute(
        "UPDATE node_sessions SET session_epoch = 1, gateway_id = 'gw-1', last_seen = compute_now() - interval '1 minute'"
    )
    # the largest flush a gateway may send takes seconds on a loaded 2-core machine: the
    # statement timeout is the production order of magnitude (24 s, the default is 20 s),
    # not the 4 s the other tests use to make their retries quick
    async with driving(servers, nc, subjects, database_url, liveness.build, ack_wait=30.0) as drive:
        sent = await db.fetchval("SELECT compute_now()")
        await drive.send(
            flush("gw-1", *((f"f{i}", 1 if i % 100 else 2, 10) for i in range(1, 10_001)))
        )
        # moved to its transaction's time less the 10 ms age: at least `sent` less 10 ms
        # (not "within the last 10 s" of the check: on a loaded machine the transaction
        # began more than 10 s before it, and every row read stale though moved)
        fresh = await db.fetchval(
            "SELECT count(*) FROM node_sessions WHERE last_seen >= $1::timestamptz - interval '10 milliseconds'",
            sent,
        )
        outcomes = {kind: drive.settled(kind) for kind in ("applied", "retry", "stale", "dead")}
        assert fresh == 9900, outcomes
        assert len(await drive.published("zombie", stream="notices")) == 100
        assert drive.settled("dead") == 0


async def test_a_flush_that_met_a_locked_row_waits_for_it_in_node_order(
    drive: Driver, db: asyncpg.Connection, database_url: str
) -> None:
    """A writer that locks session rows in node order (as the dispatch loop does, FOR
    SHARE) holds n2 when gw-1's flush of n1, n2, n3 comes: the flush skips n2, and must
    not then wait for it while holding n3 — the writer's next row, which would close a
    cycle (a deadlock the soak met at every power-on). The window is held open: the
    writer asks for n3 only once the flush waits for its n2."""
    for node in ("n1", "n2", "n3"):
        await fleet.session(db, node, epoch=1, gateway_id="gw-1", seen_ago=60 * S)
    writer = await asyncpg.connect(database_url)
    try:
        before = drive.settled()
        async with writer.transaction():
            await writer.fetch("SELECT 1 FROM node_sessions WHERE node_id = 'n2' FOR SHARE")
            js = drive.nc.jetstream()
            await publish_fact(
                js, drive.subjects, flush("gw-1", *((n, 1, 0) for n in ("n1", "n2", "n3")))
            )
            await eventually(lambda: _waiting_for(db, writer), what="the flush waiting for n2")
            # the writer's next row: free, since the flush holds no row after the one it
            # waits for (it did: a lock timeout here, a deadlock without one)
            await writer.execute("SET LOCAL lock_timeout = '500ms'")
            await writer.fetch("SELECT 1 FROM node_sessions WHERE node_id = 'n3' FOR SHARE")
        await eventually(lambda: _at_least(drive, before + 1), what="the flush settled")
        assert (drive.settled("applied"), drive.settled("retry")) == (1, 0)
        moved = await db.fetchval(
            "SELECT count(*) FROM node_sessions WHERE last_seen > compute_now() - interval '10 seconds'"
        )
        assert moved == 3
    finally:
        await writer.close()


async def _waiting_for(db: asyncpg.Connection, holder: asyncpg.Connection) -> bool:
    waiting = await db.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
        holder.get_server_pid(),
    )
    return bool(waiting)


async def _at_least(drive: Driver, n: int) -> bool:
    return drive.settled() >= n


async def test_closed_writes_the_fenced_disconnect(drive: Driver, db: asyncpg.Connection) -> None:
    await fleet.session(db, "n1", epoch=3, gateway_id="gw-1")
    await fleet.session(db, "n2", epoch=3, gateway_id="gw-1")
    await fleet.session(db, "n3", epoch=3, gateway_id="gw-1")
    closed = make_fact("closed", node_id="n1", epoch=3, reason="heartbeat-timeout")
    await drive.send(closed)
    await drive.send(
        make_fact("closed", node_id="n2", epoch=2, reason="stream-closed")
    )  # an old epoch
    await drive.send(make_fact("closed", node_id="n3", epoch=3, reason="superseded"))
    assert await fleet.routing(db, "n1") == (3, None, "heartbeat-timeout")
    assert await fleet.routing(db, "n2") == (3, "gw-1", None)
    assert await fleet.routing(db, "n3") == (3, "gw-1", None)
    [event] = await drive.published("node.disconnected")
    assert (event["nodeId"], event["epoch"], event["reason"], event["gatewayId"]) == (
        "n1",
        3,
        "heartbeat-timeout",
        "gw-1",
    )
    assert _at(event["disconnectedAt"]) == closed.observed_at  # when the gateway saw it
    assert (drive.settled("stale"), drive.settled("ignored")) == (1, 1)


async def test_closed_facts_of_one_node_sent_together_disconnect_its_newest_epoch_once(
    drive: Driver, db: asyncpg.Connection
) -> None:
    """Facts published together are applied in one batch (the consumer lingers for them):
    of a node's closes, only its newest epoch's can match its row; the older one is stale,
    and each node's disconnect is said once."""
    await fleet.session(db, "n1", epoch=3, gateway_id="gw-1")
    await fleet.session(db, "n2", epoch=5, gateway_id="gw-1")
    await drive.send(
        make_fact("closed", node_id="n1", epoch=2, reason="stream-closed"),
        make_fact("closed", node_id="n2", epoch=5, reason="gateway-shutdown"),
        make_fact("closed", node_id="n1", epoch=3, reason="gateway-shutdown"),
    )
    assert await fleet.routing(db, "n1") == (3, None, "gateway-shutdown")
    assert await fleet.routing(db, "n2") == (5, None, "gateway-shutdown")
    said = await drive.published("node.disconnected")
    assert sorted((e["nodeId"], e["epoch"]) for e in said) == [("n1", 3), ("n2", 5)]
    assert drive.settled("stale") == 1
