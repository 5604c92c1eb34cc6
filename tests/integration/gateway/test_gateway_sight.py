"""A session's last sight, as every reader reads it (migration 0038): its row's
`last_seen`, or its gateway's range row naming it at its epoch. The Hello transaction's
"was the previous session live" reads it so: a duplicate identity is told by it."""

from __future__ import annotations

from datetime import timedelta

import asyncpg

from schemas.facts import HASH_SPACE
from tests.integration import fleet
from tests.integration.gateway.hellos import request
from workers.gateway import Gateway
from workers.tools import explain

RANGE_ROW = """
INSERT INTO liveness_ranges
       (gateway_id, range_start, range_end, stream_seq, applied_at, oldest_at, sessions, entries)
VALUES ($1, $2, $3, $4, compute_now(), compute_now(), 1, $5::json)
"""


async def seen_in_a_range_row(
    db: asyncpg.Connection,
    gateway: str,
    node: str,
    epoch: int,
    seq: int,
    start: int = 0,
    end: int = HASH_SPACE,
) -> None:
    entry = f'[["{node}", {epoch}, 500]]'  # [node_id, epoch, age_ms]
    await db.execute(RANGE_ROW, gateway, start, end, seq, entry)


async def test_a_session_seen_only_by_its_range_row_is_live_to_the_next_hello(
    gateway: Gateway, db: asyncpg.Connection
) -> None:
    """Four routed sessions whose rows were last seen 31 s ago (past the 30 s live
    window): the one its gateway's range row names at its epoch is live, and another
    boot's Hello of it is a duplicate identity; not one named at another epoch, by
    another gateway, or by a row whose range does not hold its hash."""
    nodes = ("by-its-row", "old-epoch", "other-gateway", "wrong-range")
    for node in nodes:
        await fleet.join(db, node)
        await fleet.say_hello(gateway, request(node_id=node, cert_serial=f"{node}-serial"))
    await db.execute("UPDATE node_sessions SET last_seen = compute_now() - interval '31 seconds'")
    entries = '[["by-its-row", 1, 500], ["old-epoch", 0, 0]]'
    await db.execute(RANGE_ROW, "gw-a", 0, HASH_SPACE, 1, entries)  # all of gw-a's hashes
    await seen_in_a_range_row(db, "gw-z", "other-gateway", 1, 2)
    # a row of gw-a naming it, whose range does not hold its hash (the one above does, and
    # does not name it)
    h = await db.fetchval("SELECT node_hash('wrong-range')")
    elsewhere = (h + 1, h + 2) if h + 2 <= HASH_SPACE else (h - 2, h - 1)
    await seen_in_a_range_row(db, "gw-a", "wrong-range", 1, 3, *elsewhere)
    for node in nodes:
        await fleet.say_hello(
            gateway, request(node_id=node, cert_serial=f"{node}-serial", boot_id="another-boot")
        )
    rows = await db.fetch(
        "SELECT node_id, previous_live FROM session_epochs WHERE epoch = 2 ORDER BY node_id"
    )
    assert {r["node_id"]: r["previous_live"] for r in rows} == {
        "by-its-row": True,
        "old-epoch": False,
        "other-gateway": False,
        "wrong-range": False,
    }
    held = await db.fetch("SELECT node_id FROM node_sessions WHERE held_epoch IS NOT NULL")
    assert [r["node_id"] for r in held] == ["by-its-row"]


async def test_explain_shows_the_last_sight_of_the_range_row_when_it_is_later(
    gateway: Gateway, db: asyncpg.Connection
) -> None:
    await fleet.join(db, "n1")
    await fleet.say_hello(gateway, request(node_id="n1", cert_serial="n1-serial"))
    await db.execute("UPDATE node_sessions SET last_seen = compute_now() - interval '5 minutes'")
    before = await explain.session(db, "n1")
    assert before is not None and before["now"] - before["last_seen"] >= timedelta(minutes=5)
    await seen_in_a_range_row(db, "gw-a", "n1", 1, 1)
    after = await explain.session(db, "n1")
    assert after is not None
    assert after["now"] - after["last_seen"] < timedelta(seconds=5)
    assert explain.state_line(after).endswith("last seen 0s ago")
    # once it has no gateway, its row's sight is all there is
    await db.execute(
        "UPDATE node_sessions SET gateway_id = NULL, disconnected_at = compute_now(),"
        " disconnect_reason = 'stream-closed'"
    )
    gone = await explain.session(db, "n1")
    assert gone is not None and gone["last_seen"] == before["last_seen"]


async def test_the_live_window_is_measured_before_what_the_liveness_controller_applied(
    gateway: Gateway, db: asyncpg.Connection
) -> None:
    """Sights are when the bus stored a flush (migration 0043): a controller 20 s behind
    its flushes last saw a live session 20 s late. A clone's Hello 40 s after that sight
    is still a duplicate identity (counted, its session held), as it would be had the
    controller been caught up; with the controller caught up — or having said it was
    behind two minutes ago and nothing since (down: its sights stopped) — the same sight
    is a session gone quiet, superseded without counting."""
    nodes = {"behind": (20, 0), "caught-up": (0, 0), "said-long-ago": (20, 120)}
    for node in nodes:
        await fleet.join(db, node)
        await fleet.say_hello(gateway, request(node_id=node, cert_serial=f"{node}-serial"))
    await db.execute("UPDATE node_sessions SET last_seen = compute_now() - interval '40 seconds'")
    watermark = (
        "INSERT INTO consumer_watermarks (consumer, applied_through, reported_at, moved_at) "
        "VALUES ('liveness', compute_now() - $1::interval - $2::interval, "
        "compute_now() - $2::interval, compute_now()) "
        "ON CONFLICT (consumer) DO UPDATE SET applied_through = EXCLUDED.applied_through, "
        "reported_at = EXCLUDED.reported_at"
    )
    for node, (behind, said_ago) in nodes.items():
        await db.execute(watermark, timedelta(seconds=behind), timedelta(seconds=said_ago))
        await fleet.say_hello(
            gateway, request(node_id=node, cert_serial=f"{node}-serial", boot_id="another-boot")
        )
    rows = await db.fetch(
        "SELECT node_id, previous_live FROM session_epochs WHERE epoch = 2 ORDER BY node_id"
    )
    assert [(r["node_id"], r["previous_live"]) for r in rows] == [
        ("behind", True),
        ("caught-up", False),
        ("said-long-ago", False),
    ]
    held = await db.fetch("SELECT node_id FROM node_sessions WHERE held_epoch IS NOT NULL")
    assert [r["node_id"] for r in held] == ["behind"]
