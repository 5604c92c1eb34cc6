"""Issue 59, finding 13: 10,000 Hello transactions in 13 s from one gateway login grew
`session_epochs` by 10,000 rows, kept a day (67 million a day at that rate). A node's
epochs are now bounded (migration 0057, docs/contract.md "What `session_epochs` keeps"):
past its newest 64, an epoch goes once the quarantine enforcer has applied its Hello
(its watermark a minute past the epoch's issue), and past its newest 10,000 whatever;
the epoch just before the newest and the node's newest that was not a takeover attempt
stay. What the fences bind facts by is in test_fences.py, run on this rule.

The epochs are issued here by the owner's bumps of the session row (the trigger that
records them fires whoever bumps): the Hello transaction's own bound per node and minute
is another rule's, and would refuse most of 10,000 Hellos of one node.
"""

from __future__ import annotations

from datetime import timedelta

import asyncpg
import pytest

from tests.conftest import Clock
from tests.factories import make_fact
from tests.integration import fleet
from workers.runtime.effects import provenance

pytestmark = pytest.mark.slow

KEEP = 64
CAP = 10_000

BUMPS = """
DO $$ BEGIN
    FOR i IN 1..{n} LOOP
        UPDATE node_sessions SET session_epoch = session_epoch + 1 WHERE node_id = 'n1';
        COMMIT;  -- a transaction each, as Hellos are
    END LOOP;
END $$
"""


async def _bump(db: asyncpg.Connection, n: int) -> int:
    await db.execute(BUMPS.format(n=n))
    return int(await db.fetchval("SELECT session_epoch FROM node_sessions WHERE node_id = 'n1'"))


async def _rows(db: asyncpg.Connection) -> int:
    return int(await db.fetchval("SELECT count(*) FROM session_epochs WHERE node_id = 'n1'"))


async def _applied(db: asyncpg.Connection) -> None:
    """The quarantine enforcer says it has applied every fact the bus stored until now."""
    await db.execute(
        "INSERT INTO consumer_watermarks (consumer, applied_through, reported_at, moved_at) "
        "VALUES ('quarantine', compute_now(), compute_now(), compute_now()) "
        "ON CONFLICT (consumer) DO UPDATE SET applied_through = EXCLUDED.applied_through, "
        "reported_at = EXCLUDED.reported_at, moved_at = EXCLUDED.moved_at"
    )


async def test_ten_thousand_hellos_of_a_node_keep_its_epochs_bounded(
    db: asyncpg.Connection, clock: Clock
) -> None:
    """10,000 epochs of n1 in ten rounds; after each the quarantine has applied them and a
    minute and more passes: the node keeps at most its newest 64 (+ the one before the
    newest), not 10,000; an epoch whose Hello the quarantine has not applied stays, and so
    does the node's last honest session before a run of takeover attempts."""
    await fleet.session(db, "n1", epoch=1, gateway_id="gw-1")
    # epoch 2 is the node's last honest session; the rest of this test's are takeovers
    epoch = await _bump(db, 1)
    await db.execute("SET bcw.hello_proven = 'false'")  # as the Hello transaction says
    for i in range(10):
        before = epoch
        epoch = await _bump(db, 1000)
        # not applied yet: every one stays, for the quarantine to count
        assert await _rows(db) >= epoch - before
        if i == 0:
            await db.execute("ANALYZE session_epochs")  # as autovacuum would
        await clock.advance(timedelta(minutes=2))
        await _applied(db)
        epoch = await _bump(db, 1)
        assert await _rows(db) <= KEEP + 3, epoch
    await db.execute("RESET bcw.hello_proven")
    assert epoch > 10_000
    kept = {
        r["epoch"] for r in await db.fetch("SELECT epoch FROM session_epochs WHERE node_id = 'n1'")
    }
    assert set(range(epoch - KEEP, epoch + 1)) <= kept  # the newest 64 and the new one
    assert 2 in kept  # the last session that was not a takeover attempt
    # the fences: a late fact of a kept epoch is its gateway's, of a pruned one foreign
    late = make_fact("closed", node_id="n1", epoch=epoch - 10, gateway_id="gw-1")
    gone = make_fact("closed", node_id="n1", epoch=epoch - 1000, gateway_id="gw-1")
    assert await provenance.foreign(db, [late, gone]) == {gone.fact_id}


async def test_a_quarantine_that_applied_nothing_keeps_the_newest_ten_thousand(
    db: asyncpg.Connection,
) -> None:
    """With no quarantine watermark (it never said, or is down), every epoch it could still
    count stays — but no more than 10,000 of a node, whatever."""
    await fleet.session(db, "n1", epoch=1, gateway_id="gw-1")
    epoch = await _bump(db, 500)
    await db.execute("ANALYZE session_epochs")  # as autovacuum would: plans by the key
    for _ in range(20):
        epoch = await _bump(db, 500)
    rows = await _rows(db)
    assert CAP <= rows <= CAP + 2, rows
    oldest = await db.fetchval("SELECT min(epoch) FROM session_epochs WHERE node_id = 'n1'")
    assert oldest == epoch - CAP
