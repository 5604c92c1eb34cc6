"""PostgreSQL connections: the pool every worker process shares, and one-off connections.

Called by the entry point and the runtime. Nothing here decides anything.
"""

from __future__ import annotations

import asyncpg

from workers.runtime.settings import DatabaseSettings


async def connect(settings: DatabaseSettings) -> asyncpg.Connection:
    return await asyncpg.connect(
        settings.url.get_secret_value(),
        command_timeout=settings.command_timeout,
        statement_cache_size=settings.statement_cache_size,
    )


async def create_pool(settings: DatabaseSettings) -> asyncpg.Pool:
    pool = await asyncpg.create_pool(
        settings.url.get_secret_value(),
        min_size=settings.pool_min,
        max_size=settings.pool_max,
        command_timeout=settings.command_timeout,
        statement_cache_size=settings.statement_cache_size,
    )
    assert pool is not None
    return pool
