"""The liveness worker's lock order (`workers/liveness/lastsight/locks.py`) against the
statements as they run, on a real PostgreSQL: after every statement of a flush batch (each
way of keeping last sight) and of a sweep, another connection looks which rows of the
ordered tables the transaction holds (those it cannot lock itself, skipping locked ones),
and the locks, in the order taken, must keep `LOCK_ORDER`: a lock on a table earlier in
the order than one already held is taken only without waiting (SKIP LOCKED)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any, cast

import asyncpg
import pytest

from schemas.facts import HASH_SPACE, Fact, Liveness
from schemas.subjects import Subjects
from tests.factories import hello, make_fact
from tests.integration import fleet
from workers.liveness.apply import make_handler
from workers.liveness.decide import Rules
from workers.liveness.lastsight.locks import (
    LOCK_ORDER,
    RANGES,
    SESSIONS,
    SIGHTS,
    SWEEP_STATE,
    out_of_order,
    waits,
)
from workers.liveness.sweep import sweep_once
from workers.runtime.effects.worker import Tx

S = timedelta(seconds=1)

#: rows of `{table}` the transaction under watch holds: the visible ones less those another
#: transaction may lock (a row it inserted is not visible, and held by nobody else either)
HELD = """
SELECT (SELECT count(*) FROM {table})
     - (SELECT count(*) FROM (SELECT 1 FROM {table} FOR UPDATE SKIP LOCKED) AS free)
"""


class Watched:
    """A connection whose every statement is followed by a look, from `probe`, at the rows
    of the ordered tables it holds: `taken` lists each table it took rows of anew, with
    whether that statement waits for rows held elsewhere, in the order taken."""

    def __init__(self, conn: asyncpg.Connection, probe: asyncpg.Connection) -> None:
        self._conn = conn
        self._probe = probe
        self._held = dict.fromkeys(LOCK_ORDER, 0)
        self.taken: list[tuple[str, bool]] = []
        self.statements: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    async def _look(self, sql: str) -> None:
        async with self._probe.transaction():  # its own locks go at once
            held = {t: await self._probe.fetchval(HELD.format(table=t)) for t in LOCK_ORDER}
        for table in LOCK_ORDER:
            if held[table] > self._held[table]:
                self.taken.append((table, waits(sql)))
                self.statements.append(sql)
        self._held = held

    async def fetch(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        found = await self._conn.fetch(sql, *args, **kwargs)
        await self._look(sql)
        return found

    async def fetchrow(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        found = await self._conn.fetchrow(sql, *args, **kwargs)
        await self._look(sql)
        return found

    async def fetchval(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        found = await self._conn.fetchval(sql, *args, **kwargs)
        await self._look(sql)
        return found

    async def execute(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        done = await self._conn.execute(sql, *args, **kwargs)
        await self._look(sql)
        return done

    async def executemany(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        done = await self._conn.executemany(sql, *args, **kwargs)
        await self._look(sql)
        return done

    def explained(self) -> str:
        return "\n".join(
            f"{table} ({'waits' if waited else 'skips'}): {' '.join(sql.split())[:90]}"
            for (table, waited), sql in zip(self.taken, self.statements, strict=True)
        )


class OnePool:
    """A pool of the one watched connection, for the sweep (which acquires its own)."""

    def __init__(self, conn: Watched) -> None:
        self.conn = conn

    @asynccontextmanager
    async def acquire(self) -> AsyncIterator[Watched]:
        yield self.conn


def ranged(gateway: str, *nodes: tuple[str, int]) -> Liveness:
    """A range fact of `gateway` over the whole hash space naming `nodes` (id, age ms)."""
    entries = [{"node_id": n, "epoch": 1, "age_ms": age} for n, age in nodes]
    fact = make_fact(
        "liveness", gateway_id=gateway, range_start=0, range_end=HASH_SPACE, entries=entries
    )
    assert isinstance(fact, Liveness)
    return fact


def whole(gateway: str, *nodes: str) -> Liveness:
    """A flush of `gateway` that names no range."""
    entries = [{"node_id": n, "epoch": 1, "age_ms": 0} for n in nodes]
    fact = make_fact("liveness", gateway_id=gateway, entries=entries)
    assert isinstance(fact, Liveness)
    return fact


async def batch(
    conn: Any, subjects: Subjects, range_sight: bool, facts: list[Fact], seq: int
) -> None:
    """`facts` applied as one batch of the liveness handler, range facts at `seq`."""
    async with conn.transaction():
        tx = Tx(conn, subjects, {}, "liveness", sequence=lambda _fact: seq)
        await make_handler(10, range_sight=range_sight)(tx, facts)
        await tx.outbox.write(conn)


@pytest.fixture
async def probe(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(database_url)
    yield conn
    await conn.close()


@pytest.mark.parametrize("range_sight", [False, True], ids=["by-session-rows", "by-range-rows"])
async def test_a_flush_batch_locks_range_rows_then_session_rows_then_sight_rows(
    db: asyncpg.Connection, probe: asyncpg.Connection, subjects: Subjects, range_sight: bool
) -> None:
    """A batch with a Hello, a range fact, a whole flush and a `closed` fact, each over
    rows that exist (a first batch made them), either way of keeping last sight."""
    for gateway in ("gw-1", "gw-2"):
        await fleet.gateway(db, gateway, expires_in=30 * S)
    for node in ("n1", "n2", "n3", "n4"):
        await fleet.session(db, node, epoch=1, gateway_id="gw-1", seen_ago=60 * S)
    await fleet.session(db, "n5", epoch=1, gateway_id="gw-2", seen_ago=60 * S)
    first = [ranged("gw-1", ("n1", 0), ("n2", 0), ("n3", 0)), whole("gw-2", "n5")]
    await batch(db, subjects, range_sight, list(first), seq=1)

    watched = Watched(db, probe)
    facts: list[Fact] = [
        hello("n4", 1),
        ranged("gw-1", ("n1", 0), ("n2", 0)),  # n3 no longer named
        whole("gw-2", "n5"),
        make_fact("closed", node_id="n4", epoch=1, gateway_id="gw-1", reason="stream-closed"),
    ]
    await batch(watched, subjects, range_sight, facts, seq=2)

    assert out_of_order(watched.taken) == [], watched.explained()
    first_taken = list(dict.fromkeys(table for table, _ in watched.taken))
    assert first_taken == [RANGES, SESSIONS, SIGHTS], watched.explained()


async def test_the_sweep_locks_its_state_then_sight_rows_and_the_rest_without_waiting(
    db: asyncpg.Connection, probe: asyncpg.Connection, subjects: Subjects
) -> None:
    """A sweep that loses a gateway and takes stale sessions, ranged and not."""
    await fleet.gateway(db, "gw-1", expires_in=30 * S)
    await fleet.gateway(db, "gw-lost", expires_in=-200 * S)
    await fleet.session(db, "fresh", epoch=1, gateway_id="gw-1", seen_ago=60 * S)
    await fleet.session(db, "quiet", epoch=1, gateway_id="gw-1", seen_ago=60 * S)
    await fleet.session(db, "unranged", epoch=1, gateway_id="gw-1", seen_ago=60 * S)
    await fleet.session(db, "gone", epoch=1, gateway_id="gw-lost", seen_ago=60 * S)
    await batch(db, subjects, True, [ranged("gw-1", ("fresh", 0), ("quiet", 60_000))], seq=1)
    await db.execute(
        "UPDATE liveness_sweeps SET last_sweep_at = compute_now() - interval '5 seconds',"
        " grace_until = NULL"
    )

    watched = Watched(db, probe)
    result = await sweep_once(cast(asyncpg.Pool, OnePool(watched)), None, subjects, Rules())

    assert (result.gateway_lost, result.stale) == (1, 2)  # gone; quiet (ranged), unranged
    assert out_of_order(watched.taken) == [], watched.explained()
    first_taken = list(dict.fromkeys(table for table, _ in watched.taken))
    assert first_taken == [SWEEP_STATE, SIGHTS, SESSIONS, RANGES], watched.explained()
    assert [waited for table, waited in watched.taken if table in (RANGES, SESSIONS)] == [
        False
    ] * sum(1 for table, _ in watched.taken if table in (RANGES, SESSIONS))
