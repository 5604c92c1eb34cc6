"""Review of issue #60 (shows a defect; expected to FAIL until fixed): events' times on
two clocks. `node.connected`'s `connectedAt` (and `disconnectedAt` of a `closed` fact,
`at` of command and quarantine events) is the facts stream's raw timestamp, the bus's
clock; the sweep's `node.disconnected`, `gateway.blind`, the breaker, hold ends and
dispatch cancels say `compute_now()`, the database's. The project has one clock for
every time comparison (migration 0001: `compute_now()`), and reads the bus's time on it
only through `bus_time()` (migration 0043: mapped onto `compute_now()`, never later
than now). Here the fleet's time is moved an hour (as tests move it, and as a database
whose clock is an hour off the bus's would be): a node said Hello at compute_now(), its
row says so, and its `node.connected` says an hour earlier than the sweep's
`node.disconnected` of the session before it would."""

from __future__ import annotations

from datetime import datetime, timedelta

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas.subjects import Subjects
from tests.conftest import Clock, Servers
from tests.integration import fleet
from tests.integration.driver import Driver, driving
from workers import liveness


@pytest.fixture
async def drive(servers: Servers, nc: NATS, subjects: Subjects, database_url: str):  # type: ignore[no-untyped-def]
    async with driving(servers, nc, subjects, database_url, liveness.build) as driver:
        yield driver


async def test_connected_at_is_on_the_clock_of_the_sweeps_disconnected_at(
    drive: Driver, db: asyncpg.Connection, clock: Clock
) -> None:
    await clock.advance(timedelta(hours=1))
    await fleet.session(db, "n1", epoch=3, gateway_id="gw-1")
    await drive.send(fleet.hello("n1", 3))
    [event] = await drive.published("node.connected")
    now = await db.fetchval("SELECT compute_now()")
    connected_at = datetime.fromisoformat(event["connectedAt"])
    # a sweep deciding now would write `disconnectedAt` = compute_now(): a Hello just
    # applied must not read as an hour before it
    assert abs(now - connected_at) < timedelta(minutes=1), (connected_at, now)
