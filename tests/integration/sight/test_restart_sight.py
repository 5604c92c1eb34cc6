"""A gateway's sight belongs to the lease that made it (migration 0064; docs/workers.md,
"Blindness"): a gateway back under a lease taken after a drained life, holding nothing of
that life, is a gateway that just appeared — not said blind until `blind_after` into its
lease with none of its flushes applied — while one whose last life was not drained (a
crash, once or in a loop) is blind as ever.

Seen in a rollout of 20,000 nodes (1 run of 3): a gateway drained slowly, its flush
stopped; back at once, no sweep having found it away in between, the controller held the
sight of its last life and, the gateway undrained by its new lease, called it blind,
holding no session, until its first flush was applied.

What is real: PostgreSQL and the sweep (`sweep_once`) on the database's clock, moved 5 s
a sweep as the sweep loop runs them; last, reference gateways on a real nats-server under
a liveness worker, the new life held before its first flush (it ticks only when told).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
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
from tests.integration.heartbeats import seen as _seen
from tests.integration.sight.clocked import SWEEP, S, blind_said, sweep_at, two_gateways
from tests.integration.sight.test_blindness import _events, _last_seq
from tests.integration.support import eventually, make_settings, running
from workers import liveness
from workers.demo.run import fresh_sweep_history
from workers.liveness import blindness
from workers.liveness.decide import Rules
from workers.liveness.seeing import sight_change

NEW_LEASE = """
UPDATE gateways SET lease_epoch = lease_epoch + 1, draining = false,
       lease_expires_at = compute_now() + interval '10 minutes'
 WHERE gateway_id = $1
"""


async def _sweeps(
    pool: asyncpg.Pool, db: asyncpg.Connection, subjects: Subjects, at: range, **then: Any
) -> dict[int, tuple[str, ...]]:
    """Sweeps at each of `at` (`clocked.sweep_at`); `then[f"at{t}"]`, a coroutine
    function, runs on `db` just before the sweep at t. The gateways not seen at each."""
    return {t: (await sweep_at(pool, db, subjects, t, then.get(f"at{t}"))).blind for t in at}


async def _drained(db: asyncpg.Connection) -> None:
    """gw-b drained (its sessions, none here, closed; its flush stopped)."""
    await db.execute("UPDATE gateways SET draining = true WHERE gateway_id = 'gw-b'")


@pytest.fixture
async def sweeping(database_url: str, db: asyncpg.Connection) -> AsyncIterator[asyncpg.Pool]:
    """gw-a and gw-b leased for 10 minutes, both flushed at 0 s."""
    await db.execute("SELECT set_compute_now_offset($1)", 0 * S)
    await two_gateways(db)
    made = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    await fresh_sweep_history(made)
    yield made
    await made.close()


async def test_the_lease_start_is_set_by_the_database_whatever_the_writer_says(
    db: asyncpg.Connection, sweeping: asyncpg.Pool
) -> None:
    """The trigger of migration 0064: a lease starts at `compute_now()` of its epoch's
    write, after a drained life or not; the same lease keeps both, whatever a writer sets;
    a new epoch starts anew (7 s later on the database's clock here)."""
    lease_of = (
        "SELECT lease_acquired_at, lease_follows_drain FROM gateways WHERE gateway_id = 'gw-b'"
    )
    start, after_drain = await db.fetchrow(lease_of)
    assert abs(start - await db.fetchval("SELECT compute_now()")) < 3 * S and not after_drain
    await db.execute("SELECT set_compute_now_offset($1)", 7 * S)
    await db.execute(
        "UPDATE gateways SET lease_acquired_at = compute_now() + interval '1 hour', "
        "lease_follows_drain = true, draining = true, "
        "lease_expires_at = compute_now() + interval '1 minute' WHERE gateway_id = 'gw-b'"
    )
    assert tuple(await db.fetchrow(lease_of)) == (start, False)
    await db.execute(NEW_LEASE, "gw-b")  # its last life drained
    moved, after_drain = await db.fetchrow(lease_of)
    assert 7 * S <= moved - start < 10 * S and after_drain
    await db.execute(NEW_LEASE, "gw-b")  # its last life not drained: a crash, a takeover
    assert not (await db.fetchrow(lease_of))["lease_follows_drain"]


async def test_a_gateway_back_from_a_slow_drain_is_not_blind_until_its_lease_is_as_old(
    db: asyncpg.Connection, sweeping: asyncpg.Pool, subjects: Subjects
) -> None:
    """gw-b drained at 1 s, empty, its flush stopped (its last applied at 0 s), its lease
    kept while it stops: gone, nothing said. At 42 s it is back under a new lease — no
    sweep between its old lease's end and its new one's start — and takes a session at
    43 s. Its first flush is not applied: it is held (not seen) but not said blind
    until its lease is `blind_after` (30 s) old: said at the first sweep after 72 s, with
    its one session, and only once."""

    async def back(db: asyncpg.Connection) -> None:
        await db.execute("SELECT set_compute_now_offset($1)", 42 * S)
        await db.execute(NEW_LEASE, "gw-b")
        await db.execute("SELECT set_compute_now_offset($1)", 43 * S)
        await fleet.session(db, "n1", epoch=1, gateway_id="gw-b")  # under its new lease
        await db.execute("SELECT set_compute_now_offset($1)", 45 * S)

    blind = await _sweeps(sweeping, db, subjects, range(0, 90, SWEEP), at5=_drained, at45=back)
    said = await blind_said(db)
    assert said == [("gw-b", 1)]
    late = await db.fetchval(
        "SELECT blind_since FROM liveness_gateways WHERE gateway_id = 'gw-b'"
    ) - await db.fetchval("SELECT lease_acquired_at FROM gateways WHERE gateway_id = 'gw-b'")
    assert 30 * S < late <= 35 * S  # said at the sweep of 75 s, its lease begun at 42 s
    assert all("gw-b" in blind[t] for t in range(45, 90, SWEEP))  # held throughout
    assert await fleet.routing(db, "n1") == (1, "gw-b", None)


async def test_a_gateway_back_from_a_slow_drain_whose_first_flush_is_applied_is_never_blind(
    db: asyncpg.Connection, sweeping: asyncpg.Pool, subjects: Subjects
) -> None:
    """As above, its first flush applied at 48 s: seen at the sweep of 50 s, and nothing
    ever said of it (on f1b1a43 it was said blind at 45 s, holding no session)."""

    async def back(db: asyncpg.Connection) -> None:
        await db.execute("SELECT set_compute_now_offset($1)", 42 * S)
        await db.execute(NEW_LEASE, "gw-b")
        await db.execute("SELECT set_compute_now_offset($1)", 45 * S)

    async def flushed(db: asyncpg.Connection) -> None:
        await db.execute("SELECT set_compute_now_offset($1)", 48 * S)
        await fleet.flushed(db, "gw-b")
        await db.execute("SELECT set_compute_now_offset($1)", 50 * S)

    blind = await _sweeps(
        sweeping, db, subjects, range(0, 70, SWEEP), at5=_drained, at45=back, at50=flushed
    )
    assert await blind_said(db) == []
    assert "gw-b" in blind[45]  # held until its first flush is applied
    assert all("gw-b" not in blind[t] for t in range(50, 70, SWEEP))


@pytest.mark.parametrize("redialled", [False, True], ids=["kept-its-session", "redialled"])
async def test_a_gateway_that_crashed_is_blind_as_ever_under_its_new_leases(
    db: asyncpg.Connection, sweeping: asyncpg.Pool, subjects: Subjects, redialled: bool
) -> None:
    """gw-b holds a session from 0 s, its last flush applied then. It crashes, undrained,
    and is back under a new lease at 10 s and at 20 s: its session still routed to it
    from before (`kept-its-session`), or its node redialled it at once after each restart
    (`redialled`: a crash loop faster than `blind_after`, which holds no session from
    before its lease). Nothing has seen that session since 0 s: blind as ever, said at the
    first sweep past `blind_after` (30 s, or 35 s: the clock runs on between sweeps too),
    its lease 10 to 15 s old. A grace for each new lease would have kept a crash loop quiet
    for as long as it lasted."""
    await fleet.session(db, "n1", epoch=1, gateway_id="gw-b")

    async def crashed_and_back(db: asyncpg.Connection) -> None:
        await db.execute(NEW_LEASE, "gw-b")
        if redialled:
            epoch = await db.fetchval(
                "SELECT session_epoch FROM node_sessions WHERE node_id = 'n1'"
            )
            await fleet.session(db, "n1", epoch=epoch + 1, gateway_id="gw-b")

    blind = await _sweeps(
        sweeping, db, subjects, range(0, 40, SWEEP), at10=crashed_and_back, at20=crashed_and_back
    )
    assert await blind_said(db) == [("gw-b", 1)]
    assert blind[25] == () and blind[35] == ("gw-b",)
    said_at = await db.fetchval(
        "SELECT blind_since - lease_acquired_at FROM liveness_gateways JOIN gateways "
        "USING (gateway_id) WHERE gateway_id = 'gw-b'"
    )
    assert 10 * S <= said_at < 17 * S
    assert (await fleet.routing(db, "n1"))[1:] == ("gw-b", None)  # held, not disconnected


@pytest.mark.parametrize("leased", ["between", "after"])
async def test_a_new_lease_taken_as_a_sweep_runs_is_seen_with_its_undrain_or_not_at_all(
    db: asyncpg.Connection, sweeping: asyncpg.Pool, leased: str
) -> None:
    """The race a rollout of 100,000 nodes found (1 gateway of 25): gw-b, drained and
    empty, its lease given up, its last flush 45 s old; a sweep read its sight and found
    it blind, then — before it judged what to say — gw-b took a new lease, which undrains
    it. Its lease read with its sight and its drain read later, the sweep saw an old
    lease and an undrained gateway: neither gone nor restarted, said blind. Held open
    here between the sweep's two reads: the state it judges by is read in one statement,
    so it sees the new lease with its undrain (`between`: a restart, not said) or neither
    (`after`: gone, not said, forgotten)."""
    await db.execute("UPDATE gateways SET draining = true WHERE gateway_id = 'gw-b'")
    await db.execute("SELECT set_compute_now_offset($1)", 40 * S)
    await db.execute(
        "UPDATE gateways SET lease_expires_at = compute_now() WHERE gateway_id = 'gw-b'"
    )
    await db.execute("SELECT set_compute_now_offset($1)", 45 * S)
    await fleet.flushed(db, "gw-a")  # gw-a flushes on
    rules = Rules()
    async with sweeping.acquire() as conn, conn.transaction():
        now = await conn.fetchval("SELECT compute_now()")
        _rows, sights = await blindness.read_sights(conn, now - rules.gateway_grace)
        changes = [c for s in sights.values() if (c := sight_change(s, now, rules))]
        assert [(c.gateway_id, c.blind) for c in changes] == [("gw-b", True)]
        if leased == "between":
            await db.execute(NEW_LEASE, "gw-b")  # committed on another connection
        said, _held, gone = await blindness.worth_saying(conn, changes, now, rules)
    if leased == "after":
        await db.execute(NEW_LEASE, "gw-b")
    assert said == []
    assert gone == ([] if leased == "between" else ["gw-b"])


# -- the same with reference gateways, a liveness worker and a real nats-server ----------
async def test_a_gateway_restarted_after_a_slow_drain_is_held_until_its_first_flush_unsaid(
    nc: NATS, subjects: Subjects, database_url: str, gateways: Fleet
) -> None:
    """gw-b drained and stopping, held after its sessions ended (the `ended` hook) for
    three times `blind_after` (2 s here) with its lease; released, it is back at once
    under a new lease, and this life does not flush until told: for 1.2 s (its lease
    younger than `blind_after`, the sight of its last life 6 s old) the controller, which
    sweeps every 0.5 s, must not call it blind; then its first flush is applied and it is
    seen. Nothing is said of it; gw-a, seen throughout, neither."""
    held_open = dataclasses.replace(GATEWAY_SETTINGS, lease_ttl=30.0)
    gw_b = await gateways.gateway("gw-b", nc, settings=held_open)
    stopping = HeldStop(gw_b)
    settings = liveness_settings(make_settings(nc.connected_url.geturl(), database_url, subjects))
    async with running(settings, [liveness.build(settings)]), gateways.pool.acquire() as db:
        await both_seen(gateways, nc, gw_b, db)
        mark = await _last_seq(nc, subjects)
        await stopping.drain_and_stop()
        await asyncio.sleep(3 * 2.0)  # its flush stopped: its last life's sight ages
        await stopping.go()  # its lease given up
        back = await gateways.gateway("gw-b", nc, settings=held_open, autotick=None)
        await asyncio.sleep(1.2)  # swept twice at least, its first flush not made
        assert await db.fetchval(  # held: what it applied is its last life's
            "SELECT last_flush_at < compute_now() - interval '5 seconds' "
            "FROM liveness_gateways WHERE gateway_id = 'gw-b'"
        )
        assert await _events(nc, subjects, "gateway.blind", after=mark) == []
        await back.flush()
        await eventually(lambda: _seen(db, "gw-b"), what="gw-b seen under its new lease")
        assert await _seen(db, "gw-a")
    assert await _events(nc, subjects, "gateway.blind", after=mark) == []
