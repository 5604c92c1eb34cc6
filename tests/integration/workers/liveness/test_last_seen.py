"""A session's last sight as the rest of the control plane reads it: `node_last_seen`
(migration 0050) — every node's current session, its gateway and its last sight, which
with range sight is its entry in its gateway's range row and not its row's `last_seen`.
On a real PostgreSQL: the view reads as `last_sight()` does, case by case; a disconnect
keeps a ranged session's last sight, whichever path clears its gateway. With the
liveness worker and reference gateways running: after their flushes every session's
last sight is within a flush period of its gateway's last, with range sight and without,
and a node whose gateway shut down or was lost keeps the last sight it had."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas.facts import HASH_SPACE
from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration import fleet
from tests.integration.heartbeats import GATEWAY_SETTINGS, Fleet
from tests.integration.support import eventually, make_settings, running
from workers import liveness
from workers.demo.run import fresh_sweep_history
from workers.liveness import breaker
from workers.liveness.settings import LivenessSettings
from workers.runtime.bus import streams
from workers.tools import explain

S = timedelta(seconds=1)
FLUSH = timedelta(seconds=GATEWAY_SETTINGS.flush_period)

RANGE_ROW = """
INSERT INTO liveness_ranges
       (gateway_id, range_start, range_end, stream_seq, applied_at, oldest_at, sessions, entries)
VALUES ($1, $2, $3, 1, compute_now() - $4::interval, compute_now(), 1, $5::json)
"""
VIEW = "SELECT node_id, session_epoch, gateway_id, last_seen FROM node_last_seen"


async def _row(
    db: asyncpg.Connection,
    gateway: str,
    start: int,
    end: int,
    entries: str,
    applied_ago: timedelta = timedelta(0),
) -> None:
    await db.execute(RANGE_ROW, gateway, start, end, applied_ago, entries)


async def _ranged(db: asyncpg.Connection, *nodes: str) -> None:
    await db.execute(
        "UPDATE node_sessions SET ranged_epoch = session_epoch WHERE node_id = ANY($1)", nodes
    )


async def test_the_view_reads_each_nodes_session_as_last_sight_does(
    db: asyncpg.Connection,
) -> None:
    """Every node once, at its current epoch: its entry in a range row of its gateway
    whose range holds its hash, at its epoch, when later than its row's `last_seen` (of
    two overlapping rows, the later sight); its row's otherwise; none for a node never
    connected. The same as `last_sight()` of every row, the whole fleet or one node."""
    old = 10 * 60 * S
    cases = ("named", "old-epoch", "other-gateway", "wrong-range", "overlap", "row-later", "gone")
    for node in cases:
        await fleet.session(db, node, epoch=2 if node == "old-epoch" else 1, seen_ago=old)
    await fleet.session(db, "row-later", epoch=1)  # its row: seen now
    await _ranged(db, "named", "overlap")
    await db.execute("UPDATE node_sessions SET gateway_id = NULL WHERE node_id = 'gone'")
    await fleet.join(db, "never")
    entries = (
        '[["named", 1, 500], ["old-epoch", 1, 0], ["overlap", 1, 5000], ["row-later", 1, 0],'
        ' ["gone", 1, 0]]'
    )
    await _row(db, "gw-1", 0, HASH_SPACE, entries, applied_ago=30 * S)  # all of gw-1's hashes
    await _row(db, "gw-2", 0, HASH_SPACE, '[["other-gateway", 1, 0]]')
    h = await db.fetchval("SELECT node_hash('wrong-range')")
    elsewhere = (h + 1, h + 2) if h + 2 <= HASH_SPACE else (h - 2, h - 1)
    await _row(db, "gw-1", *elsewhere, '[["wrong-range", 1, 0]]')
    h = await db.fetchval("SELECT node_hash('overlap')")
    await _row(db, "gw-1", h, h + 1, '[["overlap", 1, 100]]')  # a second cut's row, for a moment
    times = "SELECT applied_at FROM liveness_ranges WHERE gateway_id = 'gw-1' AND range_start = $1"
    row_time, second_row = await db.fetchval(times, 0), await db.fetchval(times, h)
    rows = {r["node_id"]: r for r in await db.fetch(VIEW)}
    assert len(rows) == len(cases) + 1  # one row a node, overlapping rows or not
    seen = {node: r["last_seen"] for node, r in rows.items()}
    assert seen["named"] == row_time - 500 * timedelta(milliseconds=1)
    assert seen["overlap"] == second_row - 100 * timedelta(milliseconds=1)  # the later of two
    assert seen["row-later"] > row_time  # its row's, later than the range row's entry
    now = await db.fetchval("SELECT compute_now()")
    for node in ("old-epoch", "other-gateway", "wrong-range", "gone"):
        assert now - seen[node] >= old, node  # its row's only
    assert (rows["never"]["session_epoch"], rows["never"]["gateway_id"], seen["never"]) == (
        0,
        None,
        None,
    )
    assert rows["gone"]["gateway_id"] is None and rows["old-epoch"]["session_epoch"] == 2
    assert (
        await db.fetchval(
            "SELECT count(*) FROM node_sessions s JOIN node_last_seen v USING (node_id)"
            " WHERE v.last_seen IS DISTINCT FROM"
            " last_sight(s.last_seen, s.node_id, s.session_epoch, s.gateway_id)"
        )
        == 0
    )
    for node in rows:  # one node, as `bcw explain` reads it
        one = await db.fetch(VIEW + " WHERE node_id = $1", node)
        assert [tuple(r) for r in one] == [tuple(rows[node])]


async def test_a_disconnect_keeps_a_ranged_sessions_last_sight_whoever_clears_its_gateway(
    db: asyncpg.Connection,
) -> None:
    """Once its gateway is cleared no reader looks in the range rows for a session: its
    row takes the sight its range row holds, and it is no longer ranged — through the
    trigger (a gateway's own close, a direct write) and the liveness worker's batch
    (`liveness_disconnect`) alike. An unranged session's row is its sight already; a new
    epoch is not a disconnect."""
    nodes = ("by-trigger", "by-batch", "unranged", "superseded")
    for node in nodes:
        await fleet.session(db, node, epoch=1, seen_ago=10 * 60 * S)
    await _ranged(db, "by-trigger", "by-batch", "superseded")
    entries = ",".join(f'["{node}", 1, 2000]' for node in nodes)
    await _row(db, "gw-1", 0, HASH_SPACE, f"[{entries}]")
    sight = await db.fetchval("SELECT applied_at - interval '2 seconds' FROM liveness_ranges")
    before = await db.fetchval("SELECT last_seen FROM node_sessions WHERE node_id = 'unranged'")
    await db.execute(
        "UPDATE node_sessions SET gateway_id = NULL, disconnected_at = compute_now(),"
        " disconnect_reason = 'stream-closed' WHERE node_id IN ('by-trigger', 'unranged')"
    )
    gone = await db.fetch(
        "SELECT liveness_disconnect(ARRAY['by-batch'], ARRAY[1::bigint], ARRAY['gw-1'],"
        " ARRAY['liveness-timeout'], NULL)"
    )
    assert len(gone) == 1
    await db.execute(  # a Hello elsewhere: a new epoch, unranged by itself
        "UPDATE node_sessions SET session_epoch = 2, gateway_id = 'gw-2', ranged_epoch = NULL,"
        " last_seen = compute_now() WHERE node_id = 'superseded'"
    )
    rows = {
        r["node_id"]: r
        for r in await db.fetch(
            "SELECT node_id, gateway_id, last_seen, ranged_epoch FROM node_sessions"
        )
    }
    for node in ("by-trigger", "by-batch"):
        assert rows[node]["gateway_id"] is None and rows[node]["ranged_epoch"] is None
        assert rows[node]["last_seen"] == sight, node
    assert rows["unranged"]["last_seen"] == before
    assert rows["superseded"]["last_seen"] > sight and rows["superseded"]["gateway_id"] == "gw-2"
    view = {r["node_id"]: r["last_seen"] for r in await db.fetch(VIEW)}
    assert view["by-trigger"] == view["by-batch"] == sight


def _settings(servers: Servers, database_url: str, subjects: Subjects, sight: bool) -> Any:
    base = make_settings(servers.nats_url, database_url, subjects)
    return base.model_copy(
        update={
            "liveness": LivenessSettings(
                sweep_interval=0.5,
                heartbeat_interval=1 * S,
                missed_heartbeats=3,
                flush_period=FLUSH,
                range_sight=sight,
                gateway_grace=1 * S,
            )
        }
    )


#: each session's last sight against its gateway's last applied flush, and its row's
SIGHTS = """
SELECT v.node_id, v.gateway_id, v.last_seen, s.last_seen AS row_seen, s.ranged_epoch,
       l.last_flush_at
  FROM node_last_seen v JOIN node_sessions s USING (node_id)
  JOIN liveness_gateways l ON l.gateway_id = v.gateway_id
"""


async def _sights(db: asyncpg.Connection) -> list[asyncpg.Record]:
    return await db.fetch(SIGHTS)


@pytest.mark.slow
@pytest.mark.parametrize("sight", [True, False], ids=["range-sight", "row-sight"])
async def test_after_flushes_every_session_is_seen_within_a_flush_period_and_kept_when_gone(
    servers: Servers,
    nc: NATS,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
    pool: asyncpg.Pool,
    sight: bool,
) -> None:
    """Two reference gateways of heartbeating sessions, flushing every second, the
    liveness worker applying their flushes. Every session's last sight in the view is
    within one flush period of its gateway's last applied flush — with range sight while
    the column `last_seen` of the ranged sessions stays where their first flush left it.
    Then gw-a shuts down (it closes its sessions itself) and gw-b is lost (the sweep
    disconnects its sessions once its lease is gone): each node keeps the last sight it
    had, within a flush period of its gateway's last flush, without a gateway."""
    await streams.provision_streams(nc.jetstream(), subjects)
    await fresh_sweep_history(pool)
    gateways = Fleet(pool, subjects)
    settings = _settings(servers, database_url, subjects, sight)
    try:
        async with running(settings, [liveness.build(settings)]):
            a, b = await gateways.gateway("gw-a", nc), await gateways.gateway("gw-b", nc)
            await gateways.connect(a, 6)
            await gateways.connect(b, 6)
            # a gateway flushes at its start, before its sessions: a flush counts from now
            connected = await db.fetchval("SELECT compute_now()")

            async def settled() -> bool:  # every session flushed, and some flushes since
                rows = await _sights(db)
                return len(rows) == 12 and all(
                    r["last_flush_at"] is not None
                    and r["last_flush_at"] - connected > 3 * FLUSH
                    and (r["last_flush_at"] - r["row_seen"] > 3 * FLUSH or not sight)
                    for r in rows
                )

            await eventually(settled, within=30, what="every session flushed a few times")
            rows = await _sights(db)
            for r in rows:
                assert r["last_seen"] >= r["last_flush_at"] - FLUSH, dict(r)
                if sight:  # its column: where its first flush left it, not its sight
                    assert r["ranged_epoch"] is not None and r["row_seen"] < r["last_seen"]
            # what `bcw liveness status` and `bcw explain` show is the view's
            [status] = await breaker.status(db, "gw-a")  # its sessions' oldest sight: recent
            assert status["connected"] == 6
            assert status["oldest_sight"] >= status["last_flush_at"] - FLUSH
            shown = await explain.session(db, rows[0]["node_id"])
            assert shown is not None and shown["last_seen"] >= rows[0]["last_seen"]
            # gw-a shuts down, closing each session itself; gw-b is lost (a crash)
            await b.stop(graceful=False)
            await a.stop(graceful=True)
            await db.execute(  # its lease gone at once: the sweep's grace (1 s) runs from now
                "UPDATE gateways SET lease_expires_at = compute_now() - interval '1 second'"
                " WHERE gateway_id = 'gw-b'"
            )

            async def all_gone() -> bool:
                gone = "SELECT count(*) FROM node_sessions WHERE gateway_id IS NULL"
                return bool(await db.fetchval(gone) == 12)

            await eventually(all_gone, within=30, what="every session disconnected")
            flushed = {
                r["gateway_id"]: r["last_flush_at"]
                for r in await db.fetch("SELECT gateway_id, last_flush_at FROM liveness_gateways")
            }
    finally:
        await gateways.stop()
    gone = await db.fetch(
        "SELECT v.node_id, v.gateway_id, v.last_seen, s.disconnect_reason, s.ranged_epoch,"
        " e.gateway_id AS held_by FROM node_last_seen v JOIN node_sessions s USING (node_id)"
        " JOIN session_epochs e ON e.node_id = v.node_id AND e.epoch = v.session_epoch"
    )
    assert sorted({(r["held_by"], r["disconnect_reason"]) for r in gone}) == [
        ("gw-a", "gateway-shutdown"),
        ("gw-b", "gateway-lost"),
    ]
    for r in gone:
        assert r["gateway_id"] is None and r["ranged_epoch"] is None
        # the last flush that named it, or one after (that no longer did): two periods
        assert r["last_seen"] >= flushed[r["held_by"]] - 2 * FLUSH, dict(r)
