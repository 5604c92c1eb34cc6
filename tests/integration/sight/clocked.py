"""Sweeps run one by one on the database's clock (`sweep_once`, the clock moved by
`set_compute_now_offset`) as the sweep loop would run them, and what they said: for the
sight tests that need each sweep's moment exact. gw-a flushes before every sweep (seen
throughout); gw-b is the gateway under test."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import timedelta

import asyncpg

from schemas.subjects import Subjects
from tests.integration import fleet
from tests.integration.support import OUTBOX_MESSAGES
from workers.liveness.decide import Rules
from workers.liveness.sweep import SweepResult, sweep_once

S = timedelta(seconds=1)
SWEEP = 5  # seconds between two sweeps, as BCW_LIVENESS_SWEEP_INTERVAL has it


async def two_gateways(db: asyncpg.Connection) -> None:
    """gw-a and gw-b leased for 10 minutes, each with a flush applied now."""
    for gw in ("gw-a", "gw-b"):
        await fleet.gateway(db, gw, expires_in=timedelta(minutes=10))
        await fleet.flushed(db, gw)


async def sweep_at(
    pool: asyncpg.Pool,
    db: asyncpg.Connection,
    subjects: Subjects,
    at: int,
    before: Callable[[asyncpg.Connection], Awaitable[None]] | None = None,
) -> SweepResult:
    """A sweep at `at` s on the database's clock, gw-a having flushed just before it (and
    `before` run on `db` then, if given); gw-a is never blind."""
    await db.execute("SELECT set_compute_now_offset($1)", at * S)
    await fleet.flushed(db, "gw-a")  # gw-a flushes on
    if before is not None:
        await before(db)
    result = await sweep_once(pool, None, subjects, Rules())
    assert "gw-a" not in result.blind
    return result


async def blind_said(db: asyncpg.Connection) -> list[tuple[str, int]]:
    """(gateway, sessions) of each `gateway.blind` the sweeps wrote to the outbox (no relay
    runs here)."""
    said = []
    for r in await db.fetch(OUTBOX_MESSAGES):
        if json.loads(r["headers"])["Bc-Type"] == "gateway.blind":
            body = json.loads(bytes(r["body"]))
            said.append((body["gatewayId"], body["sessions"]))
    return said
