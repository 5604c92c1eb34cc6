"""The quarantine's operator SQL (`bcw quarantine status|release|dismiss`): the
quarantines the breaker holds for an operator, their release (this worker then revokes
them) and their dismissal (judged no clone: nothing revoked, the node's sessions get
their commands again). Run as the operator's login (`bcw_operator`'s grants, `grants.py`).
"""

from __future__ import annotations

import asyncpg

HELD = """
SELECT node_id, epoch, gateway_id, held, alternations, gateways, serials, decided_at
  FROM quarantines
 WHERE revoked_at IS NULL AND released_at IS NULL AND dismissed_at IS NULL
   AND ($1::text IS NULL OR node_id = $1) AND ($2::text IS NULL OR gateway_id = $2)
 ORDER BY decided_at
"""
RELEASE = """
UPDATE quarantines SET released_at = compute_now(), released_by = $3
 WHERE revoked_at IS NULL AND released_at IS NULL AND dismissed_at IS NULL
   AND ($1::text IS NULL OR node_id = $1) AND ($2::text IS NULL OR gateway_id = $2)
RETURNING node_id
"""
DISMISS = """
UPDATE quarantines SET dismissed_at = compute_now(), dismissed_by = $3
 WHERE revoked_at IS NULL AND released_at IS NULL AND dismissed_at IS NULL
   AND ($1::text IS NULL OR node_id = $1) AND ($2::text IS NULL OR gateway_id = $2)
RETURNING node_id
"""


async def held(
    conn: asyncpg.Connection, node: str | None, gateway: str | None
) -> list[asyncpg.Record]:
    """The held quarantines (of `node`, of those blamed on `gateway`: None, any), oldest first."""
    return list(await conn.fetch(HELD, node, gateway))


async def end(
    conn: asyncpg.Connection, verb: str, node: str | None, gateway: str | None, who: str
) -> list[str]:
    """Release (`verb` "release": this worker revokes them) or dismiss ("dismiss") the held
    quarantines that match, recorded as done by `who`; the nodes they were of. A dismissal
    wakes the dispatch loop: what waited on them may go."""
    statement = RELEASE if verb == "release" else DISMISS
    done = await conn.fetch(statement, node, gateway, who)
    if done and verb == "dismiss":
        await conn.execute("SELECT wake_dispatch()")  # what waits may go
    return [row["node_id"] for row in done]
