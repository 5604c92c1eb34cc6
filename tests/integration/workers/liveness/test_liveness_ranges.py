"""A flush cut by ranges of node hashes, on real servers: the liveness worker keeps the
newest fact of each range as one row (migration 0037) — beside the session rows, which it
still moves as before — and a fact older than its range's row, or than the rows of a
newer cut it overlaps, replaces nothing."""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nats.aio.client import Client as NATS

from schemas.facts import HASH_SPACE, Liveness, node_hash
from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.factories import make_fact
from tests.integration import fleet
from tests.integration.driver import Driver, driving
from tests.integration.support import eventually
from workers import liveness
from workers.liveness import ranges
from workers.liveness.apply import make_handler
from workers.liveness.decide import replaces
from workers.runtime.effects.worker import Tx

S = timedelta(seconds=1)
HALF = HASH_SPACE // 2


@pytest.fixture
async def drive(servers: Servers, nc: NATS, subjects: Subjects, database_url: str):  # type: ignore[no-untyped-def]
    async with driving(servers, nc, subjects, database_url, liveness.build) as driver:
        yield driver


def ranged(gateway: str, start: int, end: int, *entries: tuple[str, int, int]) -> Liveness:
    fact = make_fact(
        "liveness",
        gateway_id=gateway,
        entries=[{"node_id": n, "epoch": e, "age_ms": a} for n, e, a in entries],
        range_start=start,
        range_end=end,
    )
    assert isinstance(fact, Liveness)
    return fact


async def rows(db: asyncpg.Connection, gateway: str = "gw-1") -> list[dict[str, Any]]:
    found = await db.fetch(
        "SELECT * FROM liveness_ranges WHERE gateway_id = $1 ORDER BY range_start", gateway
    )
    return [{**r, "entries": json.loads(r["entries"])} for r in found]


async def apply_published(
    db: asyncpg.Connection,
    subjects: Subjects,
    *facts: tuple[Liveness, int],
    stored_at: datetime | None = None,
) -> None:
    """Apply `facts` with the worker's handler in one batch, each as if published at the
    stream sequence given (the bus would give them in that order; a test gives any), and
    stored by the stream at `stored_at` (None: not known)."""
    sequence = {fact.fact_id: seq for fact, seq in facts}
    async with db.transaction():
        tx = Tx(
            db,
            subjects,
            {},
            sequence=lambda f: sequence.get(f.fact_id),
            stored_at=lambda _f: stored_at,
        )
        await make_handler(10)(tx, [fact for fact, _ in facts])


async def test_a_range_fact_is_kept_as_its_ranges_row_and_moves_the_sessions_as_before(
    drive: Driver, db: asyncpg.Connection
) -> None:
    await fleet.session(db, "n1", epoch=2, gateway_id="gw-1", seen_ago=60 * S)
    await fleet.session(db, "n2", epoch=1, gateway_id="gw-1", seen_ago=60 * S)
    before = await db.fetchval("SELECT max(last_seen) FROM node_sessions")
    await drive.send(ranged("gw-1", 0, HASH_SPACE, ("n1", 2, 1_500), ("n2", 1, 250)))
    [row] = await rows(db)
    assert row["range_end"] == HASH_SPACE and row["sessions"] == 2
    assert row["entries"] == [["n1", 2, 1_500], ["n2", 1, 250]]  # [node_id, epoch, age_ms]
    assert row["oldest_at"] == row["applied_at"] - timedelta(milliseconds=1_500)
    # the session rows, as a flush without a range moves them
    assert await db.fetchval("SELECT min(last_seen) FROM node_sessions") > before
    # the next one replaces it: later in the stream, and empty now
    first = row["stream_seq"]
    await drive.send(ranged("gw-1", 0, HASH_SPACE))
    [row] = await rows(db)
    assert row["stream_seq"] > first and row["entries"] == [] and row["sessions"] == 0
    assert row["oldest_at"] == row["applied_at"]
    # a flush without a range keeps no row, and leaves the gateway's rows as they are
    await drive.send(make_fact("liveness", gateway_id="gw-1", entries=[]))
    assert [r["stream_seq"] for r in await rows(db)] == [row["stream_seq"]]


async def test_a_range_fact_older_than_its_ranges_row_replaces_nothing(
    db: asyncpg.Connection, subjects: Subjects
) -> None:
    await fleet.session(db, "n1", epoch=1, gateway_id="gw-1", seen_ago=60 * S)
    newer = ranged("gw-1", 0, HASH_SPACE, ("n1", 1, 0))
    older = ranged("gw-1", 0, HASH_SPACE, ("n1", 1, 30_000))
    await apply_published(db, subjects, (newer, 20))
    seen = await db.fetchval("SELECT last_seen FROM node_sessions WHERE node_id = 'n1'")
    await apply_published(db, subjects, (older, 10))  # redelivered, or applied late
    [row] = await rows(db)
    assert (row["stream_seq"], row["entries"]) == (20, [["n1", 1, 0]])
    assert await db.fetchval("SELECT last_seen FROM node_sessions WHERE node_id = 'n1'") == seen


async def test_a_re_cut_replaces_every_row_its_new_ranges_overlap_and_an_old_cut_none(
    db: asyncpg.Connection, subjects: Subjects
) -> None:
    quarter = HASH_SPACE // 4
    await apply_published(db, subjects, (ranged("gw-1", 0, HASH_SPACE), 1))
    await apply_published(db, subjects, (ranged("gw-2", 0, HASH_SPACE), 2))  # not gw-1's
    # the gateway's sessions pass a power of two: two ranges, one published at a time
    await apply_published(db, subjects, (ranged("gw-1", 0, HALF), 3))
    # the rest of the old row stays, naming no session, at its place and time, until the
    # new cut names it: the gateway's rows still tile the hash space
    assert [
        (r["range_start"], r["range_end"], r["stream_seq"], r["entries"]) for r in await rows(db)
    ] == [(0, HALF, 3, []), (HALF, HASH_SPACE, 1, [])]
    await apply_published(db, subjects, (ranged("gw-1", HALF, HASH_SPACE), 4))
    assert [(r["range_start"], r["stream_seq"]) for r in await rows(db)] == [(0, 3), (HALF, 4)]
    # a fact of the old cut, late: a newer row overlaps it — refused whole
    await apply_published(db, subjects, (ranged("gw-1", 0, HASH_SPACE), 2))
    assert [r["stream_seq"] for r in await rows(db)] == [3, 4]
    # in one batch, two cuts: the newer wins where they overlap, the older's others stay
    await apply_published(
        db,
        subjects,
        (ranged("gw-1", 0, quarter), 7),
        (ranged("gw-1", quarter, HALF), 8),
        (ranged("gw-1", 0, HALF), 9),  # newer than both quarters
        (ranged("gw-1", HALF, HALF + quarter), 6),
    )
    found = [(r["range_start"], r["range_end"], r["stream_seq"]) for r in await rows(db)]
    # (and what the quarter leaves of the half it replaced, until named anew)
    assert found == [(0, HALF, 9), (HALF, HALF + quarter, 6), (HALF + quarter, HASH_SPACE, 4)]
    # late, older than one row it overlaps and newer than the others: refused whole, and
    # the older rows stay (no range is left without the newest fact that named it)
    await apply_published(db, subjects, (ranged("gw-1", 0, HASH_SPACE), 8))
    assert [r["stream_seq"] for r in await rows(db)] == [9, 6, 4]
    assert [r["stream_seq"] for r in await rows(db, "gw-2")] == [2]


async def test_a_range_fact_naming_another_gateways_session_moves_nothing_of_it(
    drive: Driver, db: asyncpg.Connection
) -> None:
    await fleet.session(db, "theirs", epoch=1, gateway_id="gw-2", seen_ago=60 * S)
    await drive.send(ranged("gw-2", 0, HASH_SPACE, ("theirs", 1, 5_000)))
    seen = await db.fetchval("SELECT last_seen FROM node_sessions")
    theirs = await rows(db, "gw-2")
    await drive.send(ranged("gw-1", 0, HASH_SPACE, ("theirs", 1, 0)))  # seen later, says gw-1
    [zombie] = await drive.published("zombie", stream="notices")
    assert (zombie["node_id"], zombie["_subject"]) == (
        "theirs",
        drive.subjects.notice("gw-1", "zombie"),
    )
    assert await db.fetchval("SELECT last_seen FROM node_sessions") == seen
    # its row is gw-1's own claim; gw-2's row is its own gateway's fact, untouched
    assert [e[0] for r in await rows(db) for e in r["entries"]] == ["theirs"]
    assert await rows(db, "gw-2") == theirs


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=40),
        max_size=30,
    )
)
async def test_postgresql_hashes_a_node_id_as_the_gateway_does(
    db: asyncpg.Connection, ids: Sequence[str]
) -> None:
    """`node_hash(text)` in SQL and `schemas.facts.node_hash` agree on every id: the set
    check of a range will find sessions by the SQL one."""
    found = await db.fetch("SELECT i, node_hash(i) AS h FROM unnest($1::text[]) AS i", list(ids))
    assert [(r["i"], r["h"]) for r in found] == [(i, node_hash(i)) for i in ids]


async def test_range_rows_no_fact_replaced_for_an_hour_are_pruned(
    drive: Driver, db: asyncpg.Connection
) -> None:
    """A gateway gone for good leaves its rows; the replica that sweeps prunes them. A
    gateway that still holds a session keeps its rows, however old: its sessions' sight."""
    await fleet.session(db, "n1", epoch=1, gateway_id="gw-quiet")
    await drive.send(
        ranged("gw-gone", 0, HASH_SPACE),
        ranged("gw-quiet", 0, HASH_SPACE, ("n1", 1, 0)),
        ranged("gw-1", 0, HASH_SPACE),
    )
    await db.execute(
        "UPDATE liveness_ranges SET applied_at = applied_at - $1::interval"
        " WHERE gateway_id <> 'gw-1'",
        ranges.RETENTION + S,
    )

    async def gateways() -> list[str]:
        found = await db.fetch("SELECT gateway_id FROM liveness_ranges ORDER BY 1")
        return [r["gateway_id"] for r in found]

    await eventually(lambda: _equal(gateways(), ["gw-1", "gw-quiet"]), what="gw-gone's row pruned")


async def _equal(value: Awaitable[Any], expected: Any) -> bool:
    return await value == expected


async def test_a_stream_made_anew_numbers_from_1_and_its_facts_still_replace_the_rows(
    db: asyncpg.Connection, subjects: Subjects
) -> None:
    """A facts stream deleted and provisioned again (its storage lost) numbers its facts
    from 1: a fact the stream stored more than 10 s after a row's replaces it whatever its
    sequence; otherwise the sequence decides, as within one stream (migration 0040)."""
    t = datetime(2026, 12, 3, tzinfo=UTC)
    await apply_published(db, subjects, (ranged("gw-1", 0, HASH_SPACE), 5000), stored_at=t)
    steps = [(1, 5), (2, 20), (1, 2), (3, 25), (4, 5), (3, 25), (5, 6)]
    kept = []
    for seq, after in steps:
        at = t + after * S
        await apply_published(db, subjects, (ranged("gw-1", 0, HASH_SPACE), seq), stored_at=at)
        [row] = await rows(db)
        kept.append((row["stream_seq"], (row["stored_at"] - t) // S))
    assert kept == [
        (5000, 0),  # a lower sequence within 10 s: an older fact of the same stream
        (2, 20),  # a lower sequence stored 20 s later: the stream made anew
        (2, 20),  # a lower sequence stored earlier: older both ways
        (3, 25),  # within 10 s: by sequence
        (4, 5),  # a later sequence stored 20 s "earlier" (the leader's clock stepped back)
        (3, 25),  # the price: the fact from before the step, redelivered, wins once …
        (5, 6),  # … and the next flush, a later sequence, puts the row right
    ]


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.integers(1, 10),
    st.one_of(st.none(), st.integers(-30_000, 30_000)),
    st.integers(1, 10),
    st.one_of(st.none(), st.integers(-30_000, 30_000)),
)
async def test_postgresql_orders_a_range_fact_and_a_row_as_the_worker_does(
    db: asyncpg.Connection, f_seq: int, f_ms: int | None, r_seq: int, r_ms: int | None
) -> None:
    """`range_fact_replaces` (SQL, the rows' writes) and `decide.replaces` (the range-sight
    check) agree, at the 10 s boundary too and with a time unknown; unless the fact was
    stored more than 10 s after the row's, the sequence alone decides."""
    t = datetime(2026, 12, 3, tzinfo=UTC)
    f_at = None if f_ms is None else t + f_ms * timedelta(milliseconds=1)
    r_at = None if r_ms is None else t + r_ms * timedelta(milliseconds=1)
    sql = await db.fetchval("SELECT range_fact_replaces($1, $2, $3, $4)", f_seq, f_at, r_seq, r_at)
    assert sql is replaces(f_seq, f_at, r_seq, r_at)
    if f_ms is None or r_ms is None or f_ms - r_ms <= 10_000:
        assert sql is (f_seq > r_seq)
    else:
        assert sql


async def test_a_worker_after_its_facts_stream_was_deleted_and_provisioned_anew(
    servers: Servers, nc: NATS, subjects: Subjects, database_url: str, db: asyncpg.Connection
) -> None:
    """The fault itself: the facts stream deleted (its storage lost) and made again by the
    next worker to start, numbering from 1. The range row the old stream's third fact
    left is replaced by the new stream's first, and the ranged session's sight moves on
    (range sight on: a fresh schema). The minute the outage took is moved, not slept."""
    await fleet.session(db, "n1", epoch=1, gateway_id="gw-1", seen_ago=60 * S)
    named = ranged("gw-1", 0, HASH_SPACE, ("n1", 1, 0))
    async with driving(servers, nc, subjects, database_url, liveness.build) as drive:
        for _ in range(3):
            await drive.send(named.model_copy(update={"fact_id": uuid.uuid4()}))
    [old] = await rows(db)
    await nc.jetstream().delete_stream(subjects.facts_stream)
    await db.execute("UPDATE liveness_ranges SET stored_at = stored_at - interval '1 minute'")
    sight = "SELECT last_sight(last_seen, node_id, session_epoch, gateway_id) FROM node_sessions"
    before, version = (
        await db.fetchval(sight),
        await db.fetchval("SELECT xmin::text FROM node_sessions"),
    )
    async with driving(servers, nc, subjects, database_url, liveness.build) as drive:
        await drive.send(named.model_copy(update={"fact_id": uuid.uuid4()}))
    [new] = await rows(db)
    assert (old["stream_seq"], new["stream_seq"]) == (3, 1)
    assert new["applied_at"] > old["applied_at"] and await db.fetchval(sight) > before
    assert await db.fetchval("SELECT xmin::text FROM node_sessions") == version  # ranged: no write
