"""The node conditions the quarantine enforcer owns (`node_conditions`): `DuplicateIdentity`,
set when it revokes a node's certificate for a duplicate identity, cleared once the node
holds a session again after that epoch under a certificate not revoked. Readers see them
(`bcw explain`)."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

DUPLICATE_IDENTITY = "DuplicateIdentity"

SET = """
INSERT INTO node_conditions AS c (node_id, condition, epoch, since, reason)
SELECT t.node_id, $3, t.epoch, compute_now(), $4
  FROM unnest($1::text[], $2::bigint[]) AS t(node_id, epoch)
ON CONFLICT (node_id, condition) DO UPDATE
   SET epoch = greatest(c.epoch, EXCLUDED.epoch), reason = EXCLUDED.reason
"""

# a session after the condition's epoch, connected, not held, its certificate not revoked
CLEAR = """
DELETE FROM node_conditions c
 USING node_sessions s
 WHERE c.condition = $1 AND s.node_id = c.node_id AND s.session_epoch > c.epoch
   AND s.disconnected_at IS NULL AND s.gateway_id IS NOT NULL AND s.held_epoch IS NULL
   AND NOT is_revoked(s.cert_serial)
"""


async def set_duplicate_identity(
    conn: asyncpg.Connection, quarantined: Sequence[tuple[str, int]], reason: str
) -> None:
    """The nodes quarantined (node, the epoch of the Hello that did it) have the condition."""
    if quarantined:
        nodes = sorted(set(quarantined))
        await conn.execute(
            SET, [n for n, _ in nodes], [e for _, e in nodes], DUPLICATE_IDENTITY, reason
        )


async def clear_recovered(conn: asyncpg.Connection) -> int:
    """Clear the condition of the nodes that hold a good session again; how many."""
    done = await conn.execute(CLEAR, DUPLICATE_IDENTITY)
    return int(done.split()[-1])
