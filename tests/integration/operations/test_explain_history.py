"""`bcw explain`'s timeline on a real PostgreSQL: a transaction's history is one row of
`session_history_packs` naming many nodes, and rows an older release wrote one by one
are still in `session_history`; a node's timeline is its entries from both, in the order
they were written, and nothing of another node's."""

from __future__ import annotations

from datetime import timedelta

import asyncpg

from schemas import Zombie
from schemas.subjects import Subjects
from workers.runtime.effects.batch import OutboxBatch
from workers.tools.explain import HISTORY, timeline


async def test_a_nodes_timeline_is_its_entries_of_the_packs_and_of_the_old_rows(
    db: asyncpg.Connection, subjects: Subjects
) -> None:
    await db.execute(  # an older release's row, written a minute ago
        "INSERT INTO session_history (node_id, at, what, epoch, gateway_id, worker, detail) "
        "VALUES ('n1', compute_now() - interval '1 minute', 'zombie', 1, 'gw-1', 'liveness', "
        """'{"node_id": "n1", "epoch": 1}')"""
    )
    for epochs in ((2, 3), (4, 5)):  # two transactions, each a pack of entries of n1 and n2
        batch = OutboxBatch(worker="liveness")
        for epoch in epochs:
            for node in ("n1", "n2"):
                batch.add(Zombie(node_id=node, epoch=epoch), subjects.notice("gw-1", "zombie"))
        async with db.transaction():
            assert await batch.write(db) == 4
    assert await db.fetchval("SELECT count(*) FROM session_history_packs") == 2
    steps = await timeline(db, "n1", timedelta(hours=1))
    assert [(s.what, s.epoch, s.gateway_id, s.worker) for s in steps] == [
        ("zombie", epoch, "gw-1", "liveness") for epoch in (1, 2, 3, 4, 5)
    ]
    assert [s.epoch for s in await timeline(db, "n2", timedelta(hours=1))] == [2, 3, 4, 5]
    assert await timeline(db, "n3", timedelta(hours=1)) == []
    assert [s.epoch for s in await timeline(db, "n1", timedelta(seconds=30))] == [2, 3, 4, 5]
    counted = await db.fetch(f"SELECT node_id, count(*) FROM {HISTORY} GROUP BY node_id")
    assert {r["node_id"]: r["count"] for r in counted} == {"n1": 5, "n2": 4}
