"""The node conditions the quarantine enforcer owns (`node_conditions`): `DuplicateIdentity`,
set from a node's first counted duplicate identity (and again by each later one, and by a
revocation), cleared by the release loop once the node holds a good session — connected,
not held, not a takeover attempt, under a certificate not revoked, with no quarantine
holding it — that either came after the condition's epoch (a re-joined machine, a Hello
that was no duplicate) or follows a whole window without a counted duplicate. Readers see
them (`bcw explain`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import asyncpg

DUPLICATE_IDENTITY = "DuplicateIdentity"

SET = """
INSERT INTO node_conditions AS c (node_id, condition, epoch, since, reason)
SELECT t.node_id, $3, t.epoch, compute_now(), $4
  FROM unnest($1::text[], $2::bigint[]) AS t(node_id, epoch)
ON CONFLICT (node_id, condition) DO UPDATE
   SET epoch = greatest(c.epoch, EXCLUDED.epoch), reason = EXCLUDED.reason
"""

CLEAR = """
DELETE FROM node_conditions c
 USING node_sessions s
 WHERE c.condition = $1 AND s.node_id = c.node_id
   AND s.disconnected_at IS NULL AND s.gateway_id IS NOT NULL AND s.held_epoch IS NULL
   AND s.proven IS DISTINCT FROM false AND NOT is_revoked(s.cert_serial)
   AND NOT EXISTS (SELECT 1 FROM quarantines q WHERE q.node_id = c.node_id
                      AND q.revoked_at IS NULL AND q.dismissed_at IS NULL)
   AND (s.session_epoch > c.epoch
        OR NOT EXISTS (SELECT 1 FROM node_alternations a
                        WHERE a.node_id = c.node_id AND NOT a.takeover
                          AND a.issued_at > compute_now() - $2::interval))
"""


async def set_duplicate_identity(
    conn: asyncpg.Connection, duplicates: Sequence[tuple[str, int]], reason: str
) -> None:
    """The nodes given (node, the epoch of a counted duplicate, or of the Hello that
    quarantined it) have the condition, at the latest such epoch."""
    if duplicates:
        latest: dict[str, int] = {}
        for node, epoch in duplicates:
            latest[node] = max(epoch, latest.get(node, 0))
        nodes = sorted(latest)
        await conn.execute(SET, nodes, [latest[n] for n in nodes], DUPLICATE_IDENTITY, reason)


async def clear_recovered(conn: asyncpg.Connection, window: timedelta) -> int:
    """Clear the condition of the nodes that hold a good session again (after its epoch, or
    with no duplicate counted in the last `window`); how many."""
    done = await conn.execute(CLEAR, DUPLICATE_IDENTITY, window)
    return int(done.split()[-1])
