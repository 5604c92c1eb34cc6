"""`bcw demo`: the whole stack on embedded servers, on one machine, with no services.

Starts nats-server and PostgreSQL from their wheels under `directory`, migrates, and
prints where they are. Called by `make demo`; not for production.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path

import asyncpg

from workers.embedded import embedded_servers
from workers.runtime import migrate


async def main(directory: Path, hold: bool = False) -> int:
    with embedded_servers(directory) as (nats_server, postgres):
        conn = await asyncpg.connect(postgres.url)
        try:
            applied = await migrate.migrate(conn)
        finally:
            await conn.close()
        print(f"NATS (JetStream)  {nats_server.url}")
        print(f"PostgreSQL        {postgres.url}")
        print(f"migrations        {len(applied)} applied now")
        print(f"export BCW_NATS_URL={nats_server.url} BCW_DATABASE_URL={postgres.url}")
        if hold:
            print("servers up; Ctrl-C stops them")
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            with contextlib.suppress(asyncio.CancelledError):
                await stop.wait()
    return 0
