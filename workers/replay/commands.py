"""The command entry point for the rest of the control plane, in Python: a thin wrapper
of the SQL function `enqueue_command()` and a listing for `bcw commands NODE`."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

import asyncpg


async def enqueue_command(
    conn: asyncpg.Connection,
    node_id: str,
    kind: str,
    payload: Mapping[str, Any] | None = None,
    lane: str = "default",
) -> uuid.UUID:
    """A pending command with the node's next seq; wakes the dispatcher. Safe under concurrent callers."""
    command_id: uuid.UUID = await conn.fetchval(
        "SELECT enqueue_command($1, $2, $3::jsonb, $4)",
        node_id,
        kind,
        json.dumps(dict(payload or {})),
        lane,
    )
    return command_id


async def list_commands(
    conn: asyncpg.Connection, node_id: str, limit: int = 100
) -> list[asyncpg.Record]:
    """The node's latest commands, newest last."""
    rows = await conn.fetch(
        """
        SELECT seq, command_id, kind, lane, state, session_epoch, delivery_attempt, busy_attempts,
               not_before, failure_reason, updated_at
          FROM (SELECT * FROM commands WHERE node_id = $1 ORDER BY seq DESC LIMIT $2) c
         ORDER BY seq
        """,
        node_id,
        limit,
    )
    return list(rows)
