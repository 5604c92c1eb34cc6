"""Events' times on one clock (found in review of issue #60): a fact's time, the gateway's
`observed_at` bounded by when the bus stored it, is mapped onto `compute_now()` as
`bus_time` maps the bus's (migration 0043), the clock the sweep's `node.disconnected`,
`gateway.blind`, the breaker, hold ends and dispatch cancels say. Here the fleet's time
is moved an hour (as tests move it, and as a database whose clock is an hour off the
bus's would be): a node said Hello now, and its `node.connected` must not read as an
hour before the sweep's `node.disconnected` of a session decided now."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

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
    # the gateway's clock is right (the Hello happened now): the fact's time mapped onto the
    # fleet's clock, as `bus_time` maps the bus's
    hello = fleet.hello("n1", 3).model_copy(update={"observed_at": datetime.now(UTC)})
    await drive.send(hello)
    [event] = await drive.published("node.connected")
    now = await db.fetchval("SELECT compute_now()")
    connected_at = datetime.fromisoformat(event["connectedAt"])
    # a sweep deciding now would write `disconnectedAt` = compute_now(): a Hello just
    # applied must not read as an hour before it
    assert abs(now - connected_at) < timedelta(minutes=1), (connected_at, now)
