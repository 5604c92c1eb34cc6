"""Floods any login can send, bounded in what they cost the others (issue #41, "a quota
per gateway"): a NOTIFY storm on the workers' channels, and a node's epoch churn."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from tests.integration import fleet
from workers.replay.apply import DISPATCH_CHANNEL
from workers.runtime.base.runtime_settings import DatabaseSettings
from workers.runtime.store.notify import DEBOUNCE, Listener

pytestmark = pytest.mark.slow


async def test_a_notify_storm_wakes_the_dispatch_loop_a_bounded_number_of_times(
    logins: dict[str, str], database_url: str
) -> None:
    """The labeler's login NOTIFYs `bcw_dispatch` 20,000 times in a few seconds (any login
    may: PostgreSQL has no right on a channel). The dispatch loop's listener is woken at
    most once per `DEBOUNCE`, and still at once for the first of a quiet spell."""
    wake, stopping = asyncio.Event(), asyncio.Event()
    listener = Listener(DatabaseSettings(url=database_url), [DISPATCH_CHANNEL], wake)
    listening = asyncio.create_task(listener.run(stopping))
    rounds = 0
    ticked = asyncio.Event()

    async def loop() -> None:  # as the dispatch loop: a round per wake-up
        nonlocal rounds
        while not stopping.is_set():
            await wake.wait()
            wake.clear()
            rounds += 1
            ticked.set()

    looping = asyncio.create_task(loop())
    attacker = await asyncpg.connect(logins["bcw_labeler"])
    try:
        for _ in range(100):
            if listener.listening:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.1)
        rounds = 0
        ticked.clear()
        # one quiet notification: woken at once
        started = time.monotonic()
        await attacker.execute(f"SELECT pg_notify('{DISPATCH_CHANNEL}', 'first')")
        await asyncio.wait_for(ticked.wait(), 5)
        assert time.monotonic() - started < DEBOUNCE
        await asyncio.sleep(DEBOUNCE * 2)
        rounds, woken = 0, listener.woken
        started = time.monotonic()
        for batch in range(200):  # distinct payloads: PostgreSQL folds equal ones
            await attacker.execute(
                f"SELECT pg_notify('{DISPATCH_CHANNEL}', '{batch}:' || i) "
                "FROM generate_series(1, 100) AS i"
            )
        await asyncio.sleep(DEBOUNCE * 3)
        elapsed = time.monotonic() - started
        assert listener.notified >= 20_000
        bound = elapsed / DEBOUNCE + 2
        assert listener.woken - woken <= bound, (listener.woken - woken, elapsed)
        assert rounds <= bound
    finally:
        stopping.set()
        wake.set()
        await attacker.close()
        for task in (listening, looping):
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_a_nodes_hello_prunes_its_epochs_without_reading_its_history(
    db: asyncpg.Connection,
) -> None:
    """20,000 Hellos of one node in a day: each Hello's prune of the node's old epochs
    finds them by (node_id, issued_at) — the rows to delete only — not by scanning every
    earlier epoch of the node (which made its Hello 12 times slower)."""
    await fleet.session(db, "n1", epoch=1, gateway_id="gw-1")
    await db.execute(
        "INSERT INTO session_epochs (node_id, epoch, gateway_id, issued_at) "
        "SELECT 'n1', e, 'gw-1', compute_now() - interval '1 second' * e "
        "FROM generate_series(2, 20001) AS e"
    )
    await db.execute("ANALYZE session_epochs")
    plan = "\n".join(
        r[0]
        for r in await db.fetch(
            "EXPLAIN (ANALYZE, BUFFERS) DELETE FROM session_epochs WHERE node_id = 'n1' "
            "AND issued_at < compute_now() - interval '1 day' AND epoch < 20002"
        )
    )
    assert "session_epochs_node_issued" in plan, plan
    assert "Rows Removed by Filter" not in plan, plan
