"""The fact recorder on real servers (DESIGN §4 "Facts are not fenced", §6)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas.subjects import Subjects
from tests.conftest import Clock, Servers
from tests.factories import make_fact
from tests.integration import fleet
from tests.integration.driver import Driver, driving
from workers import recorder
from workers.runtime.store import retention


@pytest.fixture
async def drive(servers: Servers, nc: NATS, subjects: Subjects, database_url: str):  # type: ignore[no-untyped-def]
    async with driving(servers, nc, subjects, database_url, recorder.build) as driver:
        yield driver


def events(
    seqs: list[int], node: str = "n1", journal: str = "journal-1", gateway: str = "gw-1"
) -> Any:
    return make_fact(
        "events",
        node_id=node,
        journal_id=journal,
        gateway_id=gateway,
        events=[
            {"seq": s, "kind": "k", "body": {"s": s}, "at": "2026-11-30T00:00:00Z"} for s in seqs
        ],
    )


def status(generation: int, trust: int, digest: str | None = None, epoch: int | None = None) -> Any:
    return make_fact(
        "status",
        node_id="n1",
        epoch=1,
        observed_generation=generation,
        trust_version=trust,
        approver_set_epoch=epoch,
        approver_set_sha256=digest,
    )


async def _acked(db: asyncpg.Connection) -> int:
    return int(await db.fetchval("SELECT acked_event_seq FROM node_sessions WHERE node_id = 'n1'"))


async def test_duplicate_and_overlapping_batches_store_each_event_once(
    drive: Driver, db: asyncpg.Connection
) -> None:
    await fleet.session(db, "n1", epoch=1)
    await drive.send(events([1, 2, 3]))
    await drive.send(events([2, 3, 4, 4]), events([1, 5]))
    first = events([1, 2, 3])
    await drive.send(first)
    await drive.send(first, again=True)  # the same fact again: absorbed by the inbox
    await drive.send(events([1, 2, 3]))  # another fact with the same events: stored once
    seqs = [r["seq"] for r in await db.fetch("SELECT seq FROM node_events ORDER BY seq")]
    assert seqs == [1, 2, 3, 4, 5]
    assert await _acked(db) == 5
    assert drive.settled("duplicate") == 1
    notices = await drive.published("event-ack", stream="notices")
    acks = [a["seq"] for a in notices]
    assert acks[0] == 3 and acks[-1] == 5 and acks == sorted(acks)
    assert {a["_subject"] for a in notices} == {drive.subjects.notice("gw-1", "event-ack")}


async def test_a_gap_keeps_the_ack_at_the_last_contiguous_seq(
    drive: Driver, db: asyncpg.Connection
) -> None:
    await fleet.session(db, "n1", epoch=1)
    await drive.send(events([1, 2, 4, 5]))
    assert await _acked(db) == 2
    await drive.send(events([3]))
    assert await _acked(db) == 5
    assert [a["seq"] for a in await drive.published("event-ack", stream="notices")] == [2, 5]


async def test_an_old_journals_batch_from_its_former_gateway_changes_nothing(
    drive: Driver, db: asyncpg.Connection
) -> None:
    """gw-0 held the node's old journal at epoch 1, on which nothing is stored: its late
    batch takes no seq (the journal is not known to have reached any) — nothing stored,
    no ack, the new journal's ack unmoved."""
    await fleet.session(db, "n1", epoch=2, journal_id="journal-new")
    await fleet.issued(db, "n1", 1, "gw-0", journal_id="journal-old")  # the session before
    await drive.send(events([1, 2], journal="journal-new"))
    await drive.send(events([1, 2, 3, 4, 5, 6], journal="journal-old", gateway="gw-0"))
    assert await _acked(db) == 2
    stored = await db.fetchval("SELECT count(*) FROM node_events WHERE journal_id = 'journal-old'")
    assert stored == 0
    assert drive.settled("stale") == 1
    acks = await drive.published("event-ack", stream="notices")
    assert [(a["journal_id"], a["seq"], a["_subject"].split(".")[2]) for a in acks] == [
        ("journal-new", 2, "gw-1"),
    ]


async def _stored(db: asyncpg.Connection, journal: str) -> dict[int, Any]:
    rows = await db.fetch(
        "SELECT seq, body->>'s' AS s FROM node_events WHERE journal_id = $1 ORDER BY seq", journal
    )
    return {r["seq"]: r["s"] for r in rows}


async def test_a_former_holder_fills_its_old_journals_gaps_and_never_passes_its_end(
    drive: Driver, db: asyncpg.Connection
) -> None:
    """The seed: events are true whichever session carried them. gw-0 held journal-old
    (epoch 1); the daemon lost it and reconnected on journal-new through gw-1. gw-0's
    late batch fills the gap journal-old left (seq 3: the daemon's true event, which
    nobody else can send now), but not past the highest seq stored on it (5): a seq the
    journal is not known to have reached is not its to take. It moves no ack."""
    await fleet.session(db, "n1", epoch=1, gateway_id="gw-0", journal_id="journal-old")
    await drive.send(events([1, 2, 4], journal="journal-old", gateway="gw-0"))
    await fleet.session(db, "n1", epoch=2, gateway_id="gw-1", journal_id="journal-new")
    await db.execute("UPDATE node_sessions SET acked_event_seq = 0")  # as the Hello leaves it
    await drive.send(events([3, 5], journal="journal-old", gateway="gw-0"))
    assert sorted(await _stored(db, "journal-old")) == [1, 2, 3, 4]
    assert await _acked(db) == 0
    acks = await drive.published("event-ack", stream="notices")
    assert [(a["journal_id"], a["seq"]) for a in acks] == [("journal-old", 2)]  # gw-0's, then


async def test_a_former_holder_takes_no_seq_the_journal_of_now_has_not_acked(
    drive: Driver, db: asyncpg.Connection
) -> None:
    """gw-0 held journal-1 at epoch 1; gw-1 holds it now (epoch 2) and has 1-3 and 5
    stored (ack 3). gw-0's batch — a late true one, or a forged one — counts only up to
    the ack: it stores nothing new, cannot take 4 or 6 before the daemon's own copies
    come through gw-1, and gets no ack. The holder's copies then store the true events."""
    await fleet.session(db, "n1", epoch=2, gateway_id="gw-1")
    await fleet.issued(db, "n1", 1, "gw-0")
    await drive.send(events([1, 2, 3, 5]))
    assert await _acked(db) == 3
    forged = make_fact(
        "events",
        node_id="n1",
        journal_id="journal-1",
        gateway_id="gw-0",
        events=[
            {"seq": s, "kind": "k", "body": {"s": "forged"}, "at": "2026-11-30T00:00:00Z"}
            for s in (2, 4, 6)
        ],
    )
    await drive.send(forged)
    await drive.send(events([4, 6]))
    assert await _stored(db, "journal-1") == {s: str(s) for s in (1, 2, 3, 4, 5, 6)}
    assert await _acked(db) == 6
    acks = await drive.published("event-ack", stream="notices")
    assert {a["_subject"].split(".")[2] for a in acks} == {"gw-1"}


async def _status_row(db: asyncpg.Connection) -> tuple[Any, ...]:
    row = await db.fetchrow(
        "SELECT observed_generation, trust_version, approver_set_epoch, approver_set_sha256 "
        "FROM node_sessions WHERE node_id = 'n1'"
    )
    return tuple(row)


async def _spec(db: asyncpg.Connection, generation: int) -> None:
    """The node's spec at `generation` (what `set_node_spec` leaves, without a spec)."""
    await db.execute("UPDATE nodes SET spec_generation = $1 WHERE node_id = 'n1'", generation)


async def test_out_of_order_status_never_lowers_or_mispairs(
    drive: Driver, db: asyncpg.Connection
) -> None:
    await fleet.session(db, "n1", epoch=1)
    await _spec(db, 12)
    d6, d7 = "6" * 64, "7" * 64
    await drive.send(status(10, 7, d7, 70))
    await drive.send(status(8, 6, d6, 60))  # late and older in every way
    assert await _status_row(db) == (10, 7, 70, d7)
    await drive.send(status(12, 0, d6, 60))  # version 0: unchanged, and no pairing
    assert await _status_row(db) == (12, 7, 70, d7)
    await drive.send(status(12, 8, "", 80))  # an empty digest clears both
    assert await _status_row(db) == (12, 8, None, None)


async def test_a_batch_of_reports_in_any_order_ends_the_same(
    drive: Driver, db: asyncpg.Connection
) -> None:
    await fleet.session(db, "n1", epoch=1)
    await _spec(db, 9)
    d = {v: f"{v:064x}" for v in range(1, 6)}
    await drive.send(*(status(g, v, d[v], v) for g, v in [(5, 3), (9, 5), (2, 1), (7, 4)]))
    assert await _status_row(db) == (9, 5, 5, d[5])


async def test_a_status_counts_from_the_session_of_now_only_and_never_above_the_spec(
    drive: Driver, db: asyncpg.Connection
) -> None:
    """gw-0 held epoch 1, gw-1 holds epoch 2; the node's spec is at generation 7. gw-0's
    late report changes nothing: an earlier session's word (its generation may have been
    given after gw-0 lost the node; the daemon reports its latest status after every
    Welcome anyway). A report of a generation above 7 — from anyone — changes nothing: no
    such generation was ever given to the node. The session of now's report counts, and
    its last session's still does once it closed (it was sent before the close)."""
    await fleet.session(db, "n1", epoch=2, gateway_id="gw-1")
    await fleet.issued(db, "n1", 1, "gw-0")
    await _spec(db, 7)
    await db.execute("UPDATE node_sessions SET observed_generation = 3, trust_version = 5")

    def report(gateway: str, epoch: int, generation: int, trust: int) -> Any:
        return make_fact(
            "status",
            node_id="n1",
            gateway_id=gateway,
            epoch=epoch,
            observed_generation=generation,
            trust_version=trust,
        )

    await drive.send(report("gw-0", 1, 6, 9))
    assert (await _status_row(db))[:2] == (3, 5)
    await drive.send(report("gw-0", 1, 8, 0), report("gw-1", 2, 9, 6))
    assert (await _status_row(db))[:2] == (3, 5)
    assert drive.settled("stale") == 3
    await drive.send(report("gw-1", 2, 6, 6))
    assert (await _status_row(db))[:2] == (6, 6)
    await db.execute("UPDATE node_sessions SET gateway_id = NULL, disconnected_at = now()")
    await drive.send(report("gw-1", 2, 7, 6))  # sent before its close, applied after
    assert (await _status_row(db))[:2] == (7, 6)


async def test_pruning_removes_only_old_events_while_the_consumer_keeps_going(
    drive: Driver, db: asyncpg.Connection, clock: Clock, database_url: str
) -> None:
    await fleet.session(db, "n1", epoch=1)
    await drive.send(events(list(range(1, 101))))
    await clock.advance(timedelta(days=31))
    await db.execute("UPDATE node_events SET recorded_at = compute_now() - interval '31 days'")
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    try:
        target = retention.Prunable("node_events", "recorded_at", timedelta(days=30))
        # prune in small batches while new events keep arriving
        pruning = asyncio.create_task(retention.prune(pool, target, batch=7, lease=None))
        await drive.send(events(list(range(101, 151))))
        assert await pruning == 100
    finally:
        await pool.close()
    seqs = [r["seq"] for r in await db.fetch("SELECT seq FROM node_events ORDER BY seq")]
    assert seqs == list(range(101, 151))
    assert await _acked(db) == 150


async def test_the_inbox_is_pruned_past_its_retention_under_a_lease(
    database_url: str, db: asyncpg.Connection, clock: Clock
) -> None:
    from workers.runtime.store import leases

    await db.execute(
        "INSERT INTO processed_facts (consumer, fact_id, processed_at) "
        "SELECT 'w', gen_random_uuid(), now() - make_interval(hours => h) FROM generate_series(1, 30) h"
    )
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    try:
        lease = await leases.try_acquire(db, "inbox-retention", "me", timedelta(seconds=30))
        assert lease is not None
        target = retention.Prunable("processed_facts", "processed_at", timedelta(hours=25))
        assert (
            await retention.prune(pool, target, batch=2, lease=lease) == 6
        )  # 25 (by now a bit more) … 30 h old
        await clock.advance(
            timedelta(minutes=1)
        )  # the lease ran out: a paused pruner prunes nothing
        await db.execute(
            "UPDATE controller_leases SET expires_at = compute_now() - interval '1 second'"
        )
        with pytest.raises(leases.LeaseLost):
            await retention.prune(pool, target, batch=2, lease=lease)
    finally:
        await pool.close()
    assert await db.fetchval("SELECT count(*) FROM processed_facts") == 24


async def test_events_sent_before_a_clean_close_are_stored_and_acked_after_it(
    drive: Driver, db: asyncpg.Connection
) -> None:
    """The seed: events are accepted from any epoch. A daemon's last events, sent to its
    gateway just before it closed the stream, are applied after the close was written (the
    gateway writes a close at once): they are still its last session's, stored and acked
    as its gateway of now's would be — not capped at the ack as a former holder's."""
    await fleet.session(db, "n1", epoch=1, gateway_id="gw-1")
    await db.execute(
        "UPDATE node_sessions SET journal_id = 'journal-1', gateway_id = NULL, "
        "disconnected_at = now(), disconnect_reason = 'stream-closed'"
    )
    await drive.send(events([1, 2, 3]))
    stored = await db.fetchval("SELECT count(*) FROM node_events WHERE node_id = 'n1'")
    acked = await db.fetchval("SELECT acked_event_seq FROM node_sessions WHERE node_id = 'n1'")
    assert (stored, acked) == (3, 3)
