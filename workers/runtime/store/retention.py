"""Pruning old rows in bounded batches, by one leased replica at a time.

`prune()` deletes at most `batch` rows per statement, each in its own short transaction
fenced on the lease, so it never holds locks a consumer would wait on for long. Used by
the runtime (the inbox, in every process) and by a worker for its own rows (node events).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

import asyncpg

from workers.runtime.store import leases

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prunable:
    """A table whose rows older than `keep` (by `column`) may go."""

    table: str
    column: str
    keep: timedelta

    @property
    def statement(self) -> str:
        return (
            f"DELETE FROM {self.table} WHERE ctid = ANY(ARRAY("
            f"SELECT ctid FROM {self.table} WHERE {self.column} < compute_now() - $1::interval "
            f"LIMIT $2 FOR UPDATE SKIP LOCKED))"
        )


async def prune(
    pool: asyncpg.Pool, target: Prunable, batch: int, lease: leases.Lease | None
) -> int:
    """Delete what is old, `batch` rows per transaction, until nothing old is left."""
    total = 0
    while True:
        async with pool.acquire() as conn, conn.transaction():
            if lease is not None:
                await leases.fence(conn, lease)
            status = await conn.execute(target.statement, target.keep, batch)
        deleted = int(status.split()[-1])
        total += deleted
        if deleted < batch:
            break
    if total:
        log.info("pruned %d row(s) from %s", total, target.table)
    return total
