"""Where PostgreSQL's time goes during the rollout, by statement (`pg_stat_statements`,
nested statements too: a function's own queries are named beside its call), so the cost
of a Hello is found in the statement that spends it, not guessed."""

from __future__ import annotations

import asyncpg

#: what the embedded PostgreSQL loads for it (`bench_target(postgres=...)`)
SERVER = {"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "all"}
TOP = """
SELECT toplevel, calls, total_exec_time AS ms, rows,
       regexp_replace(left(query, 400), '\\s+', ' ', 'g') AS query
  FROM pg_stat_statements
 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
 ORDER BY total_exec_time DESC
 LIMIT $1
"""


async def start(conn: asyncpg.Connection) -> bool:
    """Counting from now; False where the server has not loaded the extension."""
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        await conn.execute("SELECT pg_stat_statements_reset()")
    except asyncpg.PostgresError:
        return False
    return True


async def top(conn: asyncpg.Connection, hellos: int, limit: int = 15) -> list[str]:
    """The statements that took the most time since `start`, each with its share of a
    Hello (ms of execution per Hello)."""
    per = max(1, hellos)
    lines = [f"PostgreSQL's time by statement ({hellos:,} Hellos; * nested in a function):"]
    for row in await conn.fetch(TOP, limit):
        mark = " " if row["toplevel"] else "*"
        lines.append(
            f" {mark}{row['ms'] / 1000:8.1f} s {row['ms'] / per:7.3f} ms/Hello "
            f"{row['calls']:>9,} calls  {row['query'][:160]}"
        )
    return lines
