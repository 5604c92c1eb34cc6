"""The fleet breaker's operator side: `bcw liveness release --gateway G`.

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
