"""A range fact's sight without a row per session (`BCW_LIVENESS_RANGE_SIGHT`, migration
0039), on a real PostgreSQL: a session row is written once when a range fact first
names it, once when one no longer does (its sight then from the row that did, never
later), and when its credits change — never for being seen again; zombies and stale
facts as ever; the sweep judges ranged sessions by their range rows, and never by a row
a flush is replacing."""

from __future__ import annotations

import itertools
import json
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import pytest

from schemas.facts import HASH_SPACE, Liveness, node_hash
from schemas.subjects import Subjects
from tests.factories import make_fact
from tests.integration import fleet
from tests.integration.direct import of_type, take_outbox
from workers.liveness.apply import make_handler
from workers.liveness.decide import Rules
from workers.liveness.sweep import sweep_once
from workers.runtime.effects.worker import Tx

S = timedelta(seconds=1)
HALF = HASH_SPACE // 2


def ranged(
    gateway: str,
    *entries: tuple[str, int, int] | dict[str, Any],
    start: int = 0,
    end: int = HASH_SPACE,
) -> Liveness:
    fact = make_fact(
        "liveness",
        gateway_id=gateway,
        range_start=start,
        range_end=end,
        entries=[
            e if isinstance(e, dict) else dict(zip(("node_id", "epoch", "age_ms"), e, strict=True))
            for e in entries
        ],
    )
    assert isinstance(fact, Liveness)
    return fact


async def apply(
    db: asyncpg.Connection,
    subjects: Subjects,
    *facts: tuple[Liveness, int],
    stored_at: datetime | None = None,
) -> None:
    """Apply `facts` in one batch, each at the stream sequence given (stored by the stream
    at `stored_at`), sight by range rows."""
    sequence = {fact.fact_id: seq for fact, seq in facts}
    async with db.transaction():
        tx = Tx(
            db,
            subjects,
            {},
            sequence=lambda f: sequence.get(f.fact_id),
            stored_at=lambda _f: stored_at,
        )
        await make_handler(10, range_sight=True)(tx, [fact for fact, _ in facts])
        await tx.outbox.write(db)


async def state(db: asyncpg.Connection, node: str) -> dict[str, Any]:
    row = await db.fetchrow(
        "SELECT xmin::text AS version, ranged_epoch = session_epoch AS ranged, last_seen,"
        " last_sight(last_seen, node_id, session_epoch, gateway_id) AS sight, lane_credits"
        " FROM node_sessions WHERE node_id = $1",
        node,
    )
    assert row is not None
    return dict(row)


async def row_time(db: asyncpg.Connection, gateway: str = "gw-1") -> Any:
    return await db.fetchval(
        "SELECT applied_at FROM liveness_ranges WHERE gateway_id = $1", gateway
    )


async def test_a_session_row_is_written_when_first_named_and_when_left_never_for_being_seen(
    db: asyncpg.Connection, subjects: Subjects
) -> None:
    await fleet.session(db, "n1", epoch=2, gateway_id="gw-1", seen_ago=60 * S)
    await fleet.session(db, "n2", epoch=1, gateway_id="gw-1", seen_ago=60 * S)
    await apply(db, subjects, (ranged("gw-1", ("n1", 2, 1_000), ("n2", 1, 2_000)), 1))
    first = {n: await state(db, n) for n in ("n1", "n2")}
    assert all(s["ranged"] for s in first.values())
    assert first["n2"]["last_seen"] == await row_time(db) - 2 * S  # written, as a flush does
    # seen again: no session row written; the range row is their sight
    await apply(db, subjects, (ranged("gw-1", ("n1", 2, 0), ("n2", 1, 0)), 2))
    again = {n: await state(db, n) for n in ("n1", "n2")}
    assert [again[n]["version"] for n in ("n1", "n2")] == [
        first[n]["version"] for n in ("n1", "n2")
    ]
    assert again["n1"]["sight"] == await row_time(db) > again["n1"]["last_seen"]
    named_it = await row_time(db)
    # n2 left the gateway: unranged, its last sight written from the row that named it
    await apply(db, subjects, (ranged("gw-1", ("n1", 2, 0)), 3))
    left, kept = await state(db, "n2"), await state(db, "n1")
    assert not left["ranged"] and left["last_seen"] == left["sight"] == named_it
    assert kept["version"] == again["n1"]["version"] and kept["ranged"]


async def test_credits_are_written_when_they_change_and_only_then_with_the_load(
    db: asyncpg.Connection, subjects: Subjects
) -> None:
    """The load is kept as docs/contract.md says: with range sight, the one of the
    session row's last write — when first named, and when its credits change — never
    for a change of load alone (a write per session per flush is what range sight ends)."""
    await fleet.session(db, "n1", epoch=1, gateway_id="gw-1")

    def entry(credits: dict[str, int] | None, load: float) -> dict[str, Any]:
        return {"node_id": "n1", "epoch": 1, "age_ms": 0, "credits": credits, "load": load}

    await apply(db, subjects, (ranged("gw-1", entry({"default": 2}, 0.5)), 1))  # first named
    assert json.loads((await state(db, "n1"))["lane_credits"]) == {"default": 2}
    versions = [(await state(db, "n1"))["version"]]
    loads = [await db.fetchval("SELECT load FROM node_sessions")]  # and its load
    for seq, (credits, load) in enumerate(
        [
            (None, 0.625),
            ({"default": 2}, 0.75),
            ({"default": 2}, 0.875),
            ({"default": 1}, 1.0),
            ({"default": 1}, 1.125),
        ],
        start=2,
    ):
        await apply(db, subjects, (ranged("gw-1", entry(credits, load)), seq))
        versions.append((await state(db, "n1"))["version"])
        loads.append(await db.fetchval("SELECT load FROM node_sessions"))
    # none said keeps the last known (no write); the next said after none is written once
    # (its row kept none to compare with); then only a change is
    assert [a != b for a, b in itertools.pairwise(versions)] == [False, True, False, True, False]
    assert json.loads((await state(db, "n1"))["lane_credits"]) == {"default": 1}
    assert loads == [0.5, 0.5, 0.75, 0.75, 1.0, 1.0]  # the load of each write, not of each flush


async def test_zombies_are_named_and_a_stale_fact_writes_nothing(
    db: asyncpg.Connection, subjects: Subjects
) -> None:
    await fleet.session(db, "n1", epoch=3, gateway_id="gw-1", seen_ago=60 * S)
    await fleet.session(db, "theirs", epoch=1, gateway_id="gw-2", seen_ago=60 * S)
    await apply(db, subjects, (ranged("gw-1", ("n1", 3, 0)), 10))
    n1 = await state(db, "n1")
    await take_outbox(db)
    # older than the row: refused whole (else it would leave n1, which it does not name)
    await apply(db, subjects, (ranged("gw-1", ("ghost", 1, 0)), 9))
    assert await state(db, "n1") == n1 and of_type(await take_outbox(db), "zombie") == []
    # what is not the gateway's session at that epoch in that range is a zombie, written nowhere
    theirs = await state(db, "theirs")
    await apply(
        db,
        subjects,
        (ranged("gw-1", ("n1", 3, 0), ("n1", 2, 0), ("theirs", 1, 0), ("ghost", 1, 0)), 11),
    )
    zombies = of_type(await take_outbox(db), "zombie")
    assert sorted((z["node_id"], z["epoch"]) for z in zombies) == [
        ("ghost", 1),
        ("n1", 2),
        ("theirs", 1),
    ]
    assert (
        await state(db, "theirs") == theirs and (await state(db, "n1"))["version"] == n1["version"]
    )


def _ids_in_each_half() -> tuple[str, str]:
    ids = (f"node-{i}" for i in itertools.count())
    low = next(i for i in ids if node_hash(i) < HALF)
    high = next(i for i in ids if node_hash(i) >= HALF)
    return low, high


async def test_a_re_cut_in_one_batch_leaves_no_session_the_new_cut_names(
    db: asyncpg.Connection, subjects: Subjects
) -> None:
    low, high = _ids_in_each_half()
    for node in (low, high):
        await fleet.session(db, node, epoch=1, gateway_id="gw-1")
    await apply(db, subjects, (ranged("gw-1", (low, 1, 0), (high, 1, 0)), 1))
    before = {n: (await state(db, n))["version"] for n in (low, high)}
    # the gateway now cuts in two: each half's fact replaces the one row, in one batch
    await apply(
        db,
        subjects,
        (ranged("gw-1", (low, 1, 0), end=HALF), 2),
        (ranged("gw-1", (high, 1, 0), start=HALF), 3),
    )
    after = {n: await state(db, n) for n in (low, high)}
    assert {n: s["version"] for n, s in after.items()} == before  # no write: still ranged
    assert all(s["ranged"] and s["sight"] > s["last_seen"] for s in after.values())
    # and one at a time: the first half's fact leaves the other half's session unranged,
    # its last sight from the row; the second half's names it again
    await apply(db, subjects, (ranged("gw-1", (low, 1, 0), (high, 1, 0)), 4))
    await apply(db, subjects, (ranged("gw-1", (low, 1, 0), end=HALF), 5))
    assert not (await state(db, high))["ranged"]
    await apply(db, subjects, (ranged("gw-1", (high, 1, 0), start=HALF), 6))
    assert (await state(db, high))["ranged"] and (await state(db, low))["ranged"]


@pytest.fixture
async def pool(database_url: str):  # type: ignore[no-untyped-def]
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=3)
    yield pool
    await pool.close()


async def test_the_sweep_judges_ranged_sessions_by_their_rows_and_never_a_row_being_replaced(
    pool: asyncpg.Pool, db: asyncpg.Connection, subjects: Subjects, database_url: str
) -> None:
    nodes = {"stale": "gw-1", "fresh": "gw-2", "left": "gw-2", "locked": "gw-3"}
    for node, gateway in nodes.items():
        await fleet.gateway(db, gateway, expires_in=60 * S)
        await fleet.session(db, node, epoch=1, gateway_id=gateway, seen_ago=60 * S)
    await apply(
        db,
        subjects,
        (ranged("gw-1", ("stale", 1, 0)), 1),
        (ranged("gw-2", ("fresh", 1, 0), ("left", 1, 0)), 2),
        (ranged("gw-3", ("locked", 1, 0)), 3),
    )
    await apply(db, subjects, (ranged("gw-2", ("fresh", 1, 0)), 4))  # "left" leaves gw-2
    # a minute on: gw-1's and gw-3's rows saw their sessions a minute ago, gw-2's just now
    await db.execute(
        "UPDATE node_sessions SET last_seen = compute_now() - interval '60 seconds';"
        "UPDATE liveness_ranges SET applied_at = applied_at - interval '60 seconds',"
        " oldest_at = oldest_at - interval '60 seconds' WHERE gateway_id <> 'gw-2';"
        "UPDATE liveness_sweeps SET last_sweep_at = compute_now(), grace_until = NULL"
    )
    for gateway in ("gw-1", "gw-2", "gw-3"):
        await fleet.flushed(db, gateway)  # each still flushing: seen
    holder = await asyncpg.connect(database_url)
    try:
        async with holder.transaction():  # a flush replacing gw-3's row right now
            await holder.execute(
                "SELECT 1 FROM liveness_ranges WHERE gateway_id = 'gw-3' FOR UPDATE"
            )
            await sweep_once(pool, None, subjects, Rules())
            gone = await db.fetch("SELECT node_id FROM node_sessions WHERE gateway_id IS NULL")
            assert sorted(r["node_id"] for r in gone) == ["left", "stale"]
    finally:
        await holder.close()
    await sweep_once(pool, None, subjects, Rules())
    assert (
        await db.fetchval("SELECT gateway_id FROM node_sessions WHERE node_id = 'locked'") is None
    )
    assert (
        await db.fetchval("SELECT gateway_id FROM node_sessions WHERE node_id = 'fresh'") == "gw-2"
    )


@pytest.mark.parametrize("from_0_3", [False, True])
async def test_auto_range_sight_is_off_while_this_release_upgrades_a_schema_from_0_3(
    db: asyncpg.Connection, subjects: Subjects, from_0_3: bool
) -> None:
    """`auto` reads the ledger once: a fresh schema gets range sight; one this release took
    from 0.3 (whose migrations recorded no release) does not — a 0.3 sweep may still run."""
    if from_0_3:
        await db.execute("UPDATE schema_migrations SET release = NULL WHERE name < '0037'")
    await fleet.session(db, "n1", epoch=1, gateway_id="gw-1", seen_ago=60 * S)
    handler = make_handler(10, range_sight="auto")
    for seq in (1, 2):
        async with db.transaction():
            tx = Tx(db, subjects, {}, sequence=lambda _fact, seq=seq: seq)
            await handler(tx, [ranged("gw-1", ("n1", 1, 0))])
            await tx.outbox.write(db)
        if seq == 1:
            first = await state(db, "n1")
    again = await state(db, "n1")
    assert bool(again["ranged"]) is (not from_0_3)
    # off: every flush moves the session row, as a 0.3 sweep reads it
    assert (again["version"] != first["version"]) is from_0_3
    assert again["last_seen"] == again["sight"] if from_0_3 else again["last_seen"] < again["sight"]


async def test_after_the_stream_is_made_anew_its_facts_still_move_the_sight(
    db: asyncpg.Connection, subjects: Subjects
) -> None:
    """A facts stream provisioned again numbers from 1: by sequence alone its facts would
    all be older than the rows, and the ranged sessions' sight would stop (migration 0040)."""
    t = await db.fetchval("SELECT now() - interval '40 seconds'")  # the bus's clock
    await fleet.session(db, "n1", epoch=1, gateway_id="gw-1", seen_ago=60 * S)
    await apply(db, subjects, (ranged("gw-1", ("n1", 1, 0)), 90_000), stored_at=t)
    before = await state(db, "n1")
    await apply(db, subjects, (ranged("gw-1", ("n1", 1, 0)), 1), stored_at=t + 15 * S)
    after = await state(db, "n1")
    assert after["ranged"] and after["version"] == before["version"]  # no session write
    assert after["sight"] == await row_time(db) > before["sight"]
