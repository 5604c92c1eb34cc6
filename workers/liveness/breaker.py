"""The fleet breaker's operator side: `bcw liveness status` and `bcw liveness release`.

Called by the CLI. It records who released which open breaker and when; the next sweep
(in `workers.liveness.sweep`) honours it, logs it, and closes the breaker. Nothing is
disconnected here.
"""

from __future__ import annotations

import logging
from datetime import datetime

import asyncpg

log = logging.getLogger(__name__)

RELEASE = """
UPDATE liveness_gateways
   SET breaker_released_at = compute_now(), breaker_released_by = $2
 WHERE gateway_id = $1 AND breaker_opened_at IS NOT NULL
RETURNING breaker_released_at
"""


async def release(conn: asyncpg.Connection, gateway_id: str, who: str) -> datetime | None:
    """Release the open breaker of `gateway_id`; when, or None if none was open."""
    released: datetime | None = await conn.fetchval(RELEASE, gateway_id, who)
    if released is not None:
        log.warning("breaker of gateway %s released by %s at %s", gateway_id, who, released)
    return released


# Each gateway's connected sessions and the oldest of their last sights, as the rest of
# the control plane reads a sight (`node_last_seen`, migration 0050: with range sight a
# session's `last_seen` is only a lower bound) — for one gateway, read through its keys
# (`{only}` names it inside the view's query); for every gateway, every range row parsed
# once.
STATUS = """
SELECT g.gateway_id, coalesce(c.connected, 0) AS connected, l.last_flush_at,
       extract(epoch FROM compute_now() - l.last_flush_at)::float8 AS last_flush_age_seconds,
       c.oldest_sight,
       extract(epoch FROM compute_now() - c.oldest_sight)::float8 AS oldest_sight_age_seconds,
       l.blind_since, l.blind_reason, l.breaker_opened_at, l.breaker_released_at,
       l.breaker_released_by,
       gw.lease_expires_at, coalesce(gw.lease_expires_at > compute_now(), false) AS lease_live,
       coalesce(gw.draining, false) AS draining
  FROM (SELECT gateway_id FROM gateways UNION SELECT gateway_id FROM liveness_gateways) g
  LEFT JOIN liveness_gateways l USING (gateway_id)
  LEFT JOIN gateways gw USING (gateway_id)
  LEFT JOIN (SELECT gateway_id, count(*) AS connected, min(last_seen) AS oldest_sight
               FROM node_last_seen
              WHERE gateway_id IS NOT NULL {only}
              GROUP BY gateway_id) c USING (gateway_id)
 WHERE $1::text IS NULL OR g.gateway_id = $1
 ORDER BY g.gateway_id
"""
STATUS_ALL = STATUS.format(only="")
STATUS_ONE = STATUS.format(only="AND gateway_id = $1")


async def status(
    conn: asyncpg.Connection, gateway_id: str | None = None
) -> list[dict[str, object]]:
    """What the liveness controller knows of each gateway (or of one): its connected
    sessions and the oldest of their last sights, its last applied flush and how old it
    is (on the bus's clock), whether it is blind and why (`lag`, `no-flush`), whether its
    breaker is open or was released (by whom), its lease. Read-only: `bcw liveness
    status`."""
    rows = await conn.fetch(STATUS_ALL if gateway_id is None else STATUS_ONE, gateway_id)
    return [
        {
            **dict(row),
            "blind": row["blind_since"] is not None,
            "breaker_open": row["breaker_opened_at"] is not None,
        }
        for row in rows
    ]
