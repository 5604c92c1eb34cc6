"""Leases of singleton loops on a real PostgreSQL: acquire, renew, lose, fence; a standby
takes over within one lease period; a paused ex-leader's writes match nothing."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import asyncpg
import pytest

from tests.conftest import Clock
from workers.runtime.store import leases

TTL = timedelta(seconds=15)


async def test_acquire_renew_and_standby(db: asyncpg.Connection) -> None:
    first = await leases.try_acquire(db, "sweep", "a", TTL)
    assert first == leases.Lease("sweep", "a", 1)
    assert await leases.try_acquire(db, "sweep", "b", TTL) is None  # b stands by
    assert await leases.try_acquire(db, "sweep", "a", TTL) == first  # a renews, same epoch
    assert await leases.renew(db, first, TTL)


async def test_expiry_hands_over_with_a_new_epoch_and_fences_the_old_leader(
    db: asyncpg.Connection, clock: Clock
) -> None:
    old = await leases.try_acquire(db, "sweep", "a", TTL)
    assert old is not None
    await clock.advance(TTL + timedelta(seconds=1))  # a paused: its lease ran out
    new = await leases.try_acquire(db, "sweep", "b", TTL)
    assert new == leases.Lease("sweep", "b", 2)
    assert not await leases.renew(db, old, TTL)  # a wakes up: cannot renew
    async with db.transaction():
        with pytest.raises(leases.LeaseLost):
            await leases.fence(db, old)
    async with db.transaction():
        await leases.fence(db, new)
    # a comes back later and tries again: it is a standby now
    assert await leases.try_acquire(db, "sweep", "a", TTL) is None


async def test_a_holder_that_comes_back_after_expiry_gets_a_new_epoch(
    db: asyncpg.Connection, clock: Clock
) -> None:
    old = await leases.try_acquire(db, "sweep", "a", TTL)
    await clock.advance(TTL + timedelta(seconds=1))
    again = await leases.try_acquire(db, "sweep", "a", TTL)
    assert old is not None and again is not None and again.epoch == old.epoch + 1


async def test_release_lets_a_standby_take_over_at_once(db: asyncpg.Connection) -> None:
    lease = await leases.try_acquire(db, "sweep", "a", TTL)
    assert lease is not None
    await leases.release(db, lease)
    assert await leases.try_acquire(db, "sweep", "b", TTL) == leases.Lease("sweep", "b", 2)


async def test_fence_blocks_a_takeover_until_the_fenced_transaction_ends(database_url: str) -> None:
    leader = await asyncpg.connect(database_url)
    rival = await asyncpg.connect(database_url)
    try:
        lease = await leases.try_acquire(leader, "sweep", "a", timedelta(milliseconds=300))
        assert lease is not None
        tx = leader.transaction()
        await tx.start()
        await leases.fence(leader, lease)
        await asyncio.sleep(0.4)  # the lease expires while the fenced transaction is open
        takeover = asyncio.create_task(leases.try_acquire(rival, "sweep", "b", TTL))
        await asyncio.sleep(0.3)
        assert not takeover.done()  # waits for the leader's transaction
        await tx.commit()
        assert await asyncio.wait_for(takeover, 5) == leases.Lease("sweep", "b", 2)
    finally:
        await leader.close()
        await rival.close()


async def test_run_leased_runs_in_one_replica_and_fails_over(database_url: str) -> None:
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=4)
    runs: dict[str, list[int]] = {"a": [], "b": []}
    stop_a, stop_b = asyncio.Event(), asyncio.Event()

    def body(name: str):  # type: ignore[no-untyped-def]
        async def tick(lease: leases.Lease) -> None:
            async with pool.acquire() as conn, conn.transaction():
                await leases.fence(conn, lease)
            runs[name].append(lease.epoch)

        return tick

    ttl = timedelta(seconds=1)
    try:
        a = asyncio.create_task(
            leases.run_leased(pool, "loop", "a", body("a"), period=0.1, ttl=ttl, stopping=stop_a)
        )
        await asyncio.sleep(0.3)
        b = asyncio.create_task(
            leases.run_leased(pool, "loop", "b", body("b"), period=0.1, ttl=ttl, stopping=stop_b)
        )
        await asyncio.sleep(0.5)
        assert runs["a"] and not runs["b"]  # b is a standby
        stop_a.set()  # a stops (and releases): b takes over within a lease period
        await a
        await asyncio.sleep(1.2)
        assert runs["b"] and min(runs["b"]) > max(runs["a"])
    finally:
        stop_a.set()
        stop_b.set()
        await asyncio.gather(*(t for t in (a, b) if not t.done()), return_exceptions=True)
        await pool.close()


async def test_a_leader_that_loses_its_lease_withdraws_what_only_a_leader_says(
    database_url: str, db: asyncpg.Connection
) -> None:
    """The liveness sweep's gauges (blind gateways, open breakers) are the leader's to
    say: taken over, the former leader sets them back to 0 at once."""
    from workers.liveness.metrics import SweepMetrics
    from workers.liveness.sweep import _withdraw
    from workers.runtime.observability.metrics import Metrics

    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    metrics = Metrics()
    swept = metrics.of(SweepMetrics)
    runtime = type("R", (), {"metrics": metrics})()
    stopping = asyncio.Event()

    async def lead(lease: leases.Lease) -> None:  # what the sweep says while it leads
        swept.blind_gateways.set(2.0)
        swept.breakers_open.set(1.0)

    task = asyncio.create_task(
        leases.run_leased(
            pool,
            "liveness",
            "a",
            lead,
            period=0.1,
            ttl=timedelta(seconds=30),
            stopping=stopping,
            held=metrics.lease_held,
            on_lost=lambda: _withdraw(runtime),  # type: ignore[arg-type]
        )
    )
    try:
        await asyncio.sleep(0.4)
        assert swept.blind_gateways.value() == 2.0
        # another replica takes the lease over (this one was paused past its expiry, say)
        await db.execute(
            "UPDATE controller_leases SET holder = 'b', epoch = epoch + 1,"
            " expires_at = now() + interval '1 hour' WHERE name = 'liveness'"
        )
        await asyncio.sleep(0.4)
        assert swept.blind_gateways.value() == 0.0
        assert swept.breakers_open.value() == 0.0
        assert metrics.lease_held.value("liveness") == 0.0
    finally:
        stopping.set()
        await task
        await pool.close()
