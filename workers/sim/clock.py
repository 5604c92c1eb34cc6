"""The simulator's clock: wall time plus the offset that `compute_now()` also adds, so
the gateways' in-memory ages and the database's comparisons agree when time is moved."""

from __future__ import annotations

import time

import asyncpg


class SimClock:
    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset

    async def advance(self, conn: asyncpg.Connection, seconds: float) -> None:
        self.offset += seconds
        await conn.execute("SELECT set_compute_now_offset(make_interval(secs => $1))", self.offset)

    async def reset(self, conn: asyncpg.Connection) -> None:
        self.offset = 0.0
        await conn.execute("SELECT set_compute_now_offset(interval '0')")
