"""The SQL entry points of DESIGN §4 (join_node, enqueue_command, nodes_with_capability)."""

from __future__ import annotations

import asyncpg
import pytest

from tests.integration import fleet


async def test_join_node_leaves_node_session_and_certificate(db: asyncpg.Connection) -> None:
    await db.execute("SELECT join_node('node-1', 'worker', 'serial-1', ARRAY['exec'])")
    session = await db.fetchrow("SELECT * FROM node_sessions WHERE node_id = 'node-1'")
    assert session["session_epoch"] == 0 and session["gateway_id"] is None
    cert = await db.fetchrow("SELECT * FROM node_certs WHERE serial = 'serial-1'")
    assert (cert["node_id"], cert["identity_generation"], cert["allowed_kinds"]) == (
        "node-1",
        1,
        ["exec"],
    )
    # the same certificate again changes nothing; a new one raises the generation
    await db.execute("SELECT join_node('node-1', 'worker', 'serial-1', ARRAY['exec'])")
    await db.execute("SELECT join_node('node-1', 'worker', 'serial-2', NULL)")
    generations = await db.fetch(
        "SELECT serial, identity_generation FROM node_certs ORDER BY serial"
    )
    assert [tuple(r) for r in generations] == [("serial-1", 1), ("serial-2", 2)]


async def test_join_node_refuses_another_nodes_certificate(db: asyncpg.Connection) -> None:
    await db.execute("SELECT join_node('node-1', 'worker', 'serial-1', NULL)")
    with pytest.raises(asyncpg.UniqueViolationError, match="belongs to node node-1"):
        await db.execute("SELECT join_node('node-2', 'worker', 'serial-1', NULL)")


async def test_enqueue_command_hands_out_the_next_seq(db: asyncpg.Connection) -> None:
    await db.execute("SELECT join_node('node-1', 'worker', 'serial-1', NULL)")
    first = await db.fetchval("SELECT enqueue_command('node-1', 'exec', '{\"argv\": [\"true\"]}')")
    second = await db.fetchval("SELECT enqueue_command('node-1', 'reboot', NULL, 'system')")
    rows = await db.fetch("SELECT command_id, seq, state, lane FROM commands ORDER BY seq")
    assert [(r["command_id"], r["seq"], r["state"], r["lane"]) for r in rows] == [
        (first, 1, "pending", "default"),
        (second, 2, "pending", "system"),
    ]


async def test_enqueue_command_for_an_unknown_node_fails(db: asyncpg.Connection) -> None:
    with pytest.raises(asyncpg.ForeignKeyViolationError, match="unknown node"):
        await db.execute("SELECT enqueue_command('ghost', 'exec', '{}')")


async def test_nodes_with_capability_counts_system_labels_of_connected_labeled_sessions(
    db: asyncpg.Connection,
) -> None:
    for node in ("node-1", "node-2", "node-3"):
        await fleet.session(db, node, epoch=1)
        # as the labeler writes a session's capabilities (its labels in the same transaction)
        await db.execute(
            "UPDATE node_sessions SET capabilities = '{nvml}' WHERE node_id = $1", node
        )
    await db.execute(
        "INSERT INTO node_labels (node_id, key, value, source) VALUES "
        "('node-1', 'bc.dev/cap.nvml', '1', 'system'), ('node-2', 'bc.dev/cap.nvml', '1', 'operator'), "
        "('node-3', 'bc.dev/cap.nvml', '1', 'system')"
    )

    async def offered() -> list[str]:
        return [r["n"] for r in await db.fetch("SELECT n FROM nodes_with_capability('nvml') n")]

    assert await offered() == ["node-1", "node-3"]  # an operator label never counts
    # node-3 says Hello again; its new session is not labeled yet: offered for nothing
    await fleet.session(db, "node-3", epoch=2)
    assert await offered() == ["node-1"]
    await db.execute("UPDATE node_sessions SET capabilities = '{nvml}' WHERE node_id = 'node-3'")
    assert await offered() == ["node-1", "node-3"]
    # a disconnected session is not offered either
    await db.execute("UPDATE node_sessions SET disconnected_at = now() WHERE node_id = 'node-1'")
    assert await offered() == ["node-3"]
