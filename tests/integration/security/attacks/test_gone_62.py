"""Issue 62: the liveness "gone, not blind" rule (`seeing.gone`, `blindness.forget`) as the
liveness worker's own login runs it (`bcw_liveness`, its grants from
`workers/liveness/grants.py`), not as the schema's owner the other tests run it as.

A gateway's login alone makes its gateway gone: it drains (`gateway_drain`), closes its
sessions (`gateway_close_many`) and gives its lease up (`gateway_release`), and stops
flushing. The sweep then forgets its sight — a DELETE of its `liveness_gateways` row,
which the worker's group must be allowed, or every sweep fails from then on (its
transaction rolled back: no session of any gateway is aged out, no gateway called blind)
for as long as the gone gateway's lease is recent enough to get its sight row back.
"""

from __future__ import annotations

from datetime import timedelta

import asyncpg
import pytest

from schemas.subjects import Subjects
from tests.integration import fleet
from workers.liveness.decide import Rules
from workers.liveness.sweep import sweep_once

pytestmark = pytest.mark.slow

TTL = timedelta(seconds=30)


async def test_a_gateway_that_leaves_gracefully_does_not_stop_the_liveness_sweep(
    logins: dict[str, str], db: asyncpg.Connection, subjects: Subjects
) -> None:
    await fleet.join(db, "n1")
    gw1 = await asyncpg.connect(logins["bcw_gateway_bound"])
    lease = await gw1.fetchval("SELECT gateway_acquire('gw-1', $1)", TTL)
    # gw-1 held n1 and flushed, an hour ago (as the liveness worker wrote it)
    await db.execute(
        "UPDATE node_sessions SET gateway_id = 'gw-1', session_epoch = 1 WHERE node_id = 'n1'"
    )
    await db.execute(
        "INSERT INTO liveness_gateways (gateway_id, known_since, last_flush_at, whole_flush_at) "
        "VALUES ('gw-1', compute_now() - interval '1 hour', compute_now() - interval '1 hour', "
        "compute_now() - interval '1 hour')"
    )
    await db.execute(
        "INSERT INTO liveness_ranges VALUES ('gw-1', 0, 4294967296, 1, "
        "compute_now() - interval '1 hour', compute_now() - interval '1 hour', 1, "
        """'[["n1", 1, 0]]')"""
    )
    # gw-1's login alone: drained, its sessions closed, its lease given up
    try:
        assert await gw1.fetchval("SELECT gateway_drain('gw-1', $1, true)", lease)
        closed = await gw1.fetch(
            "SELECT gateway_close_many('gw-1', $1, '{n1}', '{1}', 'gateway-stopping')", lease
        )
        assert len(closed) == 1
        assert await gw1.fetchval("SELECT gateway_release('gw-1', $1)", lease)
    finally:
        await gw1.close()

    pool = await asyncpg.create_pool(logins["bcw_liveness"], min_size=1, max_size=2)
    try:
        result = await sweep_once(pool, None, subjects, Rules())  # refused on main
        assert "gw-1" not in result.blind
        # and the next sweep too (the sight row may be made again: the lease is recent)
        await sweep_once(pool, None, subjects, Rules())
    finally:
        await pool.close()
    assert not await db.fetchval("SELECT count(*) FROM liveness_ranges WHERE gateway_id = 'gw-1'")
