"""A gateway restarted again and again (drained and stopped, or crashed, and back at once
or a moment later) under a running liveness controller: each life flushes at its first
tick, never under a lease it does not hold, and the gateway is never called blind, nor is a
session it holds disconnected. Periods as in `test_blindness` (blind after 2 s), the
gateway's flush period 1.5 s: a flush period's wait after a start would be called blind."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from typing import Any

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas.facts import Liveness
from schemas.subjects import Subjects
from tests.integration import fleet
from tests.integration.fleet import Provisioned
from tests.integration.heartbeats import GATEWAY_SETTINGS, Fleet, liveness_settings
from tests.integration.heartbeats import seen as _seen
from tests.integration.sight.test_blindness import _events, _last_seq
from tests.integration.support import eventually, make_settings, running
from workers import liveness
from workers.gateway import Gateway

SLOW = dataclasses.replace(GATEWAY_SETTINGS, flush_period=1.5)
LEASE = """
SELECT lease_epoch = $2 AND lease_expires_at > compute_now() FROM gateways WHERE gateway_id = $1
"""


class Watched:
    """Each liveness fact a gateway life publishes, and whether it held its lease then."""

    def __init__(self) -> None:
        self.flushes: list[tuple[int, bool]] = []  # (life, lease held)

    async def life(self, gateways: Fleet, nc: NATS, n: int) -> Gateway:
        gateway = Provisioned("gw-b", gateways.pool, nc, gateways.subjects, settings=SLOW)
        publish = gateway.facts.publish

        async def watched(fact: Any) -> None:
            if isinstance(fact, Liveness):
                async with gateways.pool.acquire() as conn:
                    held = await conn.fetchval(LEASE, "gw-b", gateway.lease_epoch)
                self.flushes.append((n, bool(held)))
            await publish(fact)

        gateway.facts.publish = watched  # type: ignore[method-assign]
        await gateway.start(autotick=0.2)
        gateways.gateways[f"gw-b#{n}"] = gateway
        return gateway


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_a_gateway_restarted_again_and_again_is_never_blind_nor_flushes_without_its_lease(
    nc: NATS, subjects: Subjects, database_url: str, db: asyncpg.Connection, gateways: Fleet
) -> None:
    watched = Watched()
    nodes = ["gw-b-r0", "gw-b-r1"]
    async with gateways.pool.acquire() as conn:
        for node in nodes:
            await fleet.join(conn, node)
    seeing = await gateways.gateway("gw-a", nc)
    await gateways.connect(seeing, 1)  # the control
    settings = liveness_settings(make_settings(nc.connected_url.geturl(), database_url, subjects))
    lives = itertools.count()
    async with running(settings, [liveness.build(settings)]):
        gw = await watched.life(gateways, nc, next(lives))
        await gateways.say(gw, nodes)
        await eventually(lambda: _seen(db, "gw-b"), what="gw-b seen")
        mark = await _last_seq(nc, subjects)
        # (how it ends, how long it is away): drained rollouts, crashes, at once or not
        for how, away in [
            ("drain", 0.0),
            ("drain", 0.6),
            ("crash", 0.0),
            ("drain", 1.2),
            ("crash", 0.4),
            ("drain", 0.0),
            ("crash", 0.0),
        ]:
            await asyncio.sleep(1.6)  # a flush of this life applied
            if how == "drain":
                await gw.drain()
                await gw.stop()  # its sessions closed, its lease released
            else:
                await gw.stop(graceful=False)  # its sessions still routed to it
            await asyncio.sleep(away)
            gw = await watched.life(gateways, nc, next(lives))
            await gateways.say(gw, nodes)  # the daemons redial it
        await asyncio.sleep(5.0)  # its flushes and the sweeps (every 0.5 s)
        assert await _seen(db, "gw-b")
        swept = await db.fetch(
            "SELECT node_id, disconnect_reason FROM node_sessions "
            "WHERE disconnect_reason IN ('liveness-timeout', 'gateway-lost')"
        )
    assert await _events(nc, subjects, "gateway.blind", after=mark) == []
    assert [dict(r) for r in swept] == []
    assert [life for life, held in watched.flushes if not held] == []
    # every life flushed at its start: the first fact of each life
    assert {life for life, _ in watched.flushes} == set(range(next(lives)))
