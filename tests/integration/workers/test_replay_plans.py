"""The dispatch loop's searches, planned as the replay worker plans them on a fresh
install: a generic plan (its prepared statements), on tables never analyzed. Each must
read what it looks for, not the fleet, whatever the statistics say yet (a first power-on
is exactly when they say nothing). The lost-Hello search's own is in
tests/integration/faults/test_lost_facts.py."""

from __future__ import annotations

import asyncpg

from workers.replay.dispatch import READY_NODES


async def _fleet_at_rest(db: asyncpg.Connection) -> None:
    """2,000 connected sessions, each with a command in flight; none pending."""
    await db.execute(
        "SELECT join_node('r' || i, 'worker', 'r-serial-' || i, NULL) FROM generate_series(1, 2000) i"
    )
    await db.execute(
        "UPDATE node_sessions SET session_epoch = 1, gateway_id = 'gw-1', "
        "connected_at = compute_now() - interval '1 hour'"
    )
    await db.execute(
        "INSERT INTO commands (node_id, seq, kind, state, session_epoch, delivery_attempt) "
        "SELECT node_id, 1, 'exec', 'dispatched', 0, 1 FROM nodes"
    )
    await db.execute("SET plan_cache_mode = force_generic_plan")


async def _plan(db: asyncpg.Connection, statement: str, *args: object) -> str:
    explain = await db.prepare(f"EXPLAIN (ANALYZE, BUFFERS) {statement}")
    return "\n".join(row[0] for row in await explain.fetch(*args))


async def test_the_search_for_ready_nodes_reads_the_pending_commands_not_the_fleets(
    db: asyncpg.Connection,
) -> None:
    """None pending (a herd replayed them all): the search, poked by each replay, finds no
    node by reading the pending commands' index of node ids — not every command after its
    cursor."""
    await _fleet_at_rest(db)
    plan = await _plan(db, READY_NODES, 64, "")
    assert "commands_pending_by_node" in plan, plan
    assert "commands_node_state_seq" not in plan, plan
