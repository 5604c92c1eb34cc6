"""PostgreSQL's CPU told apart by who asked for it: each backend's CPU seconds (from
/proc) summed by its client's `application_name` (`bcw-liveness`, the bench's gateways …)
or, for the server's own processes, its `backend_type` (walwriter, autovacuum worker …).
Read every `every` seconds, so a backend that comes and goes between two readings is
missed: pools here keep theirs. Only where PostgreSQL runs on this machine."""

from __future__ import annotations

import asyncio
import math

import asyncpg

from workers.bench.costs import cpu_seconds

WHO = """
SELECT pid, coalesce(nullif(application_name, ''), backend_type) AS who FROM pg_stat_activity
"""


class BackendCpu:
    def __init__(self) -> None:
        self.spent: dict[str, float] = {}  # CPU seconds by client since `reset`
        self._last: dict[int, float] = {}

    async def read(self, conn: asyncpg.Connection) -> None:
        for row in await conn.fetch(WHO):
            now = cpu_seconds(row["pid"])
            if math.isnan(now):  # gone, or not a process of this machine
                continue
            before = self._last.get(row["pid"])
            self._last[row["pid"]] = now
            if before is not None:
                self.spent[row["who"]] = self.spent.get(row["who"], 0.0) + now - before

    def reset(self) -> None:
        self.spent.clear()

    async def follow(self, conn: asyncpg.Connection, every: float = 2.0) -> None:
        while True:
            await self.read(conn)
            await asyncio.sleep(every)

    def lines(self, seconds: float, hellos: int) -> list[str]:
        """Cores by client over `seconds`, and ms of CPU a Hello."""
        total = sum(self.spent.values())
        out = [f"PostgreSQL's CPU by client ({total / seconds:.2f} cores of its backends):"]
        for who, spent in sorted(self.spent.items(), key=lambda item: -item[1]):
            if spent / seconds < 0.005:
                continue
            a_hello = 1000.0 * spent / hellos if hellos else math.nan
            out.append(f"  {spent / seconds:6.2f} cores  {a_hello:6.3f} ms/Hello  {who}")
        return out
