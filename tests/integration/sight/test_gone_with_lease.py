"""The "gone, not blind" rule (`seeing.gone`) for a drained gateway that holds no session
but still holds its lease (95c58f4): while it stops slowly, or while it stays up, drained,
its flushes no longer reaching the controller. docs/workers.md, "Blindness": such a
gateway is gone — "nothing is said or counted" — and "one that ... holds a session, is
blind as ever".

What is real: PostgreSQL; the sweep (`sweep_once`) run sweep by sweep on the database's
clock, moved 5 s a sweep (`set_compute_now_offset`) as the sweep loop would run them;
and, last, a liveness worker on the real runtime with reference gateways on a real
nats-server, its gauge read through `/metrics` as a scraper does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import urllib.request

import asyncpg
from nats.aio.client import Client as NATS

from schemas.subjects import Subjects
from tests.integration import fleet
from tests.integration.heartbeats import (
    GATEWAY_SETTINGS,
    Fleet,
    HeldStop,
    both_seen,
    liveness_settings,
)
from tests.integration.sight.clocked import SWEEP, S, blind_said, sweep_at, two_gateways
from tests.integration.support import eventually, make_settings, running
from workers import liveness
from workers.demo.run import fresh_sweep_history


async def _drained_empty_with_its_lease(db: asyncpg.Connection) -> None:
    """gw-a, flushing; gw-b, drained, no session, its lease live for 10 minutes, its last
    flush applied now and none after."""
    await two_gateways(db)
    await db.execute("UPDATE gateways SET draining = true WHERE gateway_id = 'gw-b'")


async def _counted_blind(
    pool: asyncpg.Pool, db: asyncpg.Connection, subjects: Subjects
) -> list[int]:
    """The moments (s) of two minutes of sweeps at which gw-b was counted blind."""
    return [
        at
        for at in range(0, 125, SWEEP)
        if "gw-b" in (await sweep_at(pool, db, subjects, at)).blind
    ]


async def test_a_drained_empty_gateway_that_keeps_its_lease_is_counted_blind_by_no_sweep(
    database_url: str, db: asyncpg.Connection, subjects: Subjects
) -> None:
    """gw-b is gone by the rule: drained, no session. On 95c58f4 the sweep that finds it
    blind forgets its sight; the next makes its sight row again (`ENSURE_SIGHTS`: its
    lease is live), a gateway just appeared and not seen — counted blind
    (`SweepResult.blind`, the gauge `bcw_liveness_blind_gateways`, the alert
    BcwGatewayBlind) until `blind_after` later it is found gone again, and so on: counted
    at six sweeps of seven, never said."""
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    try:
        await _drained_empty_with_its_lease(db)
        await fresh_sweep_history(pool)
        counted = await _counted_blind(pool, db, subjects)
        said = await blind_said(db)
    finally:
        await pool.close()
    assert said == []
    assert counted == [], f"gw-b, gone, counted blind at {counted} s"


async def test_a_gone_gateway_undrained_with_a_session_is_said_blind_at_once(
    database_url: str, db: asyncpg.Connection, subjects: Subjects
) -> None:
    """gw-b, gone (drained, empty, its lease live, no flush of it applied since 0 s), is
    undrained on the same lease (`gateway_drain(false)`, as `Gateway.drain(False)`) at
    42 s and takes a session at once. From then it is a gateway known for 42 s, holding a
    session, whose flushes are 42 s old: "blind as ever" — said at the next sweep (45 s).
    (a48bba4 said it blind, empty, as soon as its flushes were `blind_after` old.) Its
    sight forgotten then, and made again at the next sweep, it passes on 95c58f4 for a
    gateway that just appeared: held and not said for `blind_after` more."""
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    try:
        await _drained_empty_with_its_lease(db)
        await fresh_sweep_history(pool)
        for at in range(0, 45, SWEEP):
            await sweep_at(pool, db, subjects, at)
            if at == 40:
                await db.execute("SELECT set_compute_now_offset($1)", 42 * S)
                await db.execute("UPDATE gateways SET draining = false WHERE gateway_id = 'gw-b'")
                await fleet.session(db, "n1", epoch=1, gateway_id="gw-b")
        result = await sweep_at(pool, db, subjects, 45)
        said = await blind_said(db)
    finally:
        await pool.close()
    assert "gw-b" in result.blind  # held: not aged
    assert said == [("gw-b", 1)]


# -- the same, end to end: the gauge as a scraper reads it ----------------------------
async def _gauge(port: int) -> float:
    def fetch() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return str(r.read().decode())

    for line in (await asyncio.to_thread(fetch)).splitlines():
        if line.startswith("bcw_liveness_blind_gateways "):
            return float(line.split()[1])
    return 0.0


async def test_a_gateway_still_stopping_with_its_lease_is_not_in_the_blind_gauge(
    nc: NATS, subjects: Subjects, database_url: str, db: asyncpg.Connection, gateways: Fleet
) -> None:
    """95c58f4's own case (`test_a_drained_gateway_still_stopping_holds_nothing_...`):
    gw-b drained, its sessions closed, its flush stopped, its lease held 6 s more. No
    `gateway.blind` is said of it; the gauge of blind gateways must not count it either,
    or BcwGatewayBlind fires for the rollout the change meant to keep quiet."""
    held_open = dataclasses.replace(GATEWAY_SETTINGS, lease_ttl=30.0)
    gw_b = await gateways.gateway("gw-b", nc, settings=held_open)
    stopping = HeldStop(gw_b)
    settings = liveness_settings(make_settings(nc.connected_url.geturl(), database_url, subjects))
    async with running(settings, [liveness.build(settings)]) as (_runtime, port):
        await both_seen(gateways, nc, gw_b, db)
        await eventually(lambda: _zero(port), what="no gateway blind")
        await stopping.drain_and_stop()
        samples: list[float] = []
        for _ in range(30):  # 6 s: blind_after (2 s here) three times over
            samples.append(await _gauge(port))
            await asyncio.sleep(0.2)
        await stopping.go()
    assert max(samples) == 0, f"gw-b counted blind in {sum(1 for s in samples if s)} of 30 samples"


async def _zero(port: int) -> bool:
    return await _gauge(port) == 0


async def test_a_gateway_away_within_the_grace_is_counted_blind_by_no_sweep(
    database_url: str, db: asyncpg.Connection, subjects: Subjects
) -> None:
    """The rule as a48bba4 had it already: gw-b drained, empty, its lease given up at 0 s.
    Found gone once its last flush is `blind_after` old, and forgotten, its sight row is
    made again at the next sweep for as long as its lease is within the gateway grace
    (120 s), and counted blind there: at six sweeps of seven."""
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    try:
        await _drained_empty_with_its_lease(db)
        await db.execute(
            "UPDATE gateways SET lease_expires_at = compute_now() WHERE gateway_id = 'gw-b'"
        )
        await fresh_sweep_history(pool)
        counted = await _counted_blind(pool, db, subjects)
        said = await blind_said(db)
    finally:
        await pool.close()
    assert said == []
    assert counted == [], f"gw-b, away, counted blind at {counted} s"
