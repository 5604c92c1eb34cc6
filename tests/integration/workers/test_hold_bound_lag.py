"""The hold bound and a quarantine that is behind (docs/workers.md, "One clock for sight"):
a session held for the quarantine is released after BCW_QUARANTINE_HOLD_MAX when the
quarantine is down, never while it is alive: not while it has not reached the held Hello
in the bus, and not once it is past it and never had its fact (issue #59: a gateway that
withholds a duplicate's Hello fact gets its session no command).

The replay worker's side reads what the quarantine recorded (`consumer_watermarks`); the
quarantine's side records it from its consumer, a test hook holding its Hellos behind
(handed back to the bus, as a stopped replica would leave them)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas.facts import Fact, Hello
from schemas.subjects import Subjects
from tests.conftest import Clock, Servers
from tests.integration import fleet
from tests.integration.support import eventually, make_settings, publish_fact, running
from tests.integration.workers.replay_steps import enqueue
from tests.integration.workers.test_quarantine import clone_hello
from workers import quarantine, replay
from workers.replay.settings import ReplaySettings
from workers.runtime.bus import streams
from workers.runtime.effects import outcome
from workers.runtime.effects.outcome import Outcome
from workers.runtime.effects.worker import Tx
from workers.settings import Settings

WATERMARK = """
INSERT INTO consumer_watermarks (consumer, applied_through, reported_at, moved_at)
VALUES ('quarantine', compute_now() + $1::interval, compute_now() + $2::interval,
        compute_now() + $3::interval)
ON CONFLICT (consumer) DO UPDATE
   SET applied_through = EXCLUDED.applied_through, reported_at = EXCLUDED.reported_at,
       moved_at = EXCLUDED.moved_at
"""
M = timedelta(minutes=1)
S = timedelta(seconds=1)
NOW = timedelta(0)
#: how the quarantine's watermark reads, five minutes and a second after the Hello (or 15):
#: (applied through, said, moved), each from now
WATERMARKS = {
    "behind": (-6 * M, NOW, NOW),  # alive, moving, a minute short of the Hello
    "past-the-hello": (NOW, NOW, NOW),
    "silent-for-the-bound": (-6 * M, -5 * M - 2 * S, -5 * M - 2 * S),  # down
    "stuck-for-the-bound": (-6 * M, NOW, -5 * M - 2 * S),  # says it, never moves
    "behind-three-bounds": (-16 * M, NOW, NOW),  # 15 minutes later, still short of it
}


def _bounded(settings: Settings) -> Settings:
    """Holds bounded at 5 minutes, looked for every 0.2 s."""
    return settings.model_copy(
        update={
            "replay": ReplaySettings(hello_check_interval=0.2, hold_max=timedelta(minutes=5)),
        }
    )


async def _state(db: asyncpg.Connection) -> str:
    return str(await db.fetchval("SELECT state FROM commands"))


@pytest.mark.parametrize(
    ("quarantine_is", "released"),
    [
        ("behind", False),
        ("past-the-hello", False),
        ("silent-for-the-bound", True),
        ("stuck-for-the-bound", True),
        ("behind-three-bounds", True),
        ("absent", True),
    ],
)
async def test_the_hold_bound_waits_for_a_quarantine_behind_never_for_one_down(
    servers: Servers,
    nc: NATS,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
    clock: Clock,
    quarantine_is: str,
    released: bool,
) -> None:
    """Past the bound: a quarantine that said a moment ago, and moved since, that the oldest
    Hello it has not applied was stored a minute before this one keeps the session held;
    so does one past the Hello that never had its fact (withheld by its gateway): held
    until the quarantine is down. One that said nothing or did not move for the bound
    (down, or a replica stuck with the Hello in hand), one that never said anything:
    released, as before; and one still behind at three times the bound."""
    await fleet.session(db, "n1", epoch=1, gateway_id="gw-9")
    await db.execute("UPDATE node_sessions SET held_epoch = 1")  # the Hello transaction held it
    settings = _bounded(make_settings(servers.nats_url, database_url, subjects))
    async with running(settings, [replay.build(settings)]):
        await enqueue(db, "n1")
        later = 15 * M if quarantine_is == "behind-three-bounds" else 5 * M
        await clock.advance(later + S)
        if quarantine_is in WATERMARKS:
            await db.execute(WATERMARK, *WATERMARKS[quarantine_is])
        if released:
            await eventually(lambda: _dispatched(db), what="the released session's command")
            return
        await asyncio.sleep(1.5)  # several looks of the dispatch loop
        assert await _state(db) == "pending"
        assert await db.fetchval("SELECT held_epoch FROM node_sessions") == 1
        await db.execute(WATERMARK, NOW, NOW, NOW)  # it caught up, and never had the fact
        await asyncio.sleep(1.5)
        assert (await _state(db), await db.fetchval("SELECT held_epoch FROM node_sessions")) == (
            "pending",
            1,
        )
        await db.execute(WATERMARK, *WATERMARKS["silent-for-the-bound"])  # then it went down
        await eventually(lambda: _dispatched(db), what="released once the quarantine is down")


async def _dispatched(db: asyncpg.Connection) -> bool:
    return await _state(db) == "dispatched"


@pytest.mark.slow
async def test_the_quarantine_says_as_of_when_it_applied_its_hellos(
    servers: Servers,
    nc: NATS,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
) -> None:
    """While a duplicate identity's Hello waits in its consumer (held behind by the hook),
    the quarantine records that it has applied its Hellos only up to that Hello's stored
    time; once the Hello is applied, up to now."""
    await streams.provision_streams(nc.jetstream(), subjects)
    await fleet.session(db, "n1", epoch=1)
    fact = await clone_hello(db, "n1")  # a duplicate identity's Hello: the quarantine's to count
    await db.execute(
        "UPDATE node_sessions SET session_epoch = $1, held_epoch = $1, gateway_id = $2",
        fact.epoch,
        fact.gateway_id,
    )
    holding = {"until": time.monotonic() + 3600.0}
    settings = make_settings(servers.nats_url, database_url, subjects)
    worker = quarantine.build(settings)
    inner = worker.handle

    async def handle(tx: Tx, facts: Sequence[Fact]) -> Mapping[Any, Outcome]:
        wait = holding["until"] - time.monotonic()
        held = [f for f in facts if isinstance(f, Hello)] if wait > 0 else []
        outcomes = dict(await inner(tx, [f for f in facts if f not in held]) or {})
        # handed back for 2 s at a time: a few deliveries, under max_deliver
        outcomes.update({f.fact_id: outcome.retry_after(min(wait, 2.0)) for f in held})
        return outcomes

    async with running(settings, [dataclasses.replace(worker, handle=handle)]):
        sent_at = await db.fetchval("SELECT now()")
        await publish_fact(nc.jetstream(), subjects, fact)

        async def behind() -> bool:
            row = await db.fetchrow("SELECT * FROM consumer_watermarks")
            return row is not None and row["applied_through"] >= sent_at - timedelta(seconds=1)

        await eventually(behind, what="the quarantine's watermark")
        await asyncio.sleep(2.5)  # a report or two later, still at the Hello
        row = await db.fetchrow("SELECT * FROM consumer_watermarks")
        assert row["applied_through"] <= sent_at + timedelta(seconds=1), row
        assert row["reported_at"] > row["applied_through"] + timedelta(seconds=1), row
        holding["until"] = 0.0  # let it through

        async def past() -> bool:
            row = await db.fetchrow("SELECT * FROM consumer_watermarks")
            return bool(row["applied_through"] > sent_at + timedelta(seconds=1))

        await eventually(past, what="the watermark past the Hello")
    # counted (not quarantined: one alternation): its hold released by the quarantine
    assert await db.fetchval("SELECT held_epoch FROM node_sessions") is None
