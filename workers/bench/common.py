"""What the benchmarks share: servers (given, or embedded for the run), a fresh migrated
database, a fresh subject root, and a printed table."""

from __future__ import annotations

import contextlib
import tempfile
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from workers.embedded import EmbeddedNats, EmbeddedPostgres
from workers.runtime import migrate
from workers.runtime.settings import Settings


@dataclass(frozen=True)
class BenchTarget:
    nats_url: str
    database_url: str
    subject_root: str


@contextlib.asynccontextmanager
async def bench_target(settings: Settings, embedded: bool) -> AsyncIterator[BenchTarget]:
    """Servers for one benchmark run, and a scratch database dropped afterwards."""
    stack = contextlib.ExitStack()
    if embedded:
        base = Path(tempfile.mkdtemp(prefix="bcw-bench-"))
        nats = stack.enter_context(_started(EmbeddedNats(base / "nats")))
        postgres = stack.enter_context(_started(EmbeddedPostgres(base / "postgres")))
        nats_url, admin_url = nats.url, postgres.url
    else:
        nats_url, admin_url = settings.nats.url, settings.database.url.get_secret_value()
    name = f"bcw_bench_{uuid.uuid4().hex[:8]}"
    with stack:
        admin = await asyncpg.connect(admin_url)
        await admin.execute(f'CREATE DATABASE "{name}"')
        database_url = admin_url.rsplit("/", 1)[0] + "/" + name
        try:
            conn = await asyncpg.connect(database_url)
            try:
                await migrate.migrate(conn)
            finally:
                await conn.close()
            yield BenchTarget(nats_url, database_url, f"bench{uuid.uuid4().hex[:6]}")
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            await admin.close()


@contextlib.contextmanager
def _started(server: EmbeddedNats | EmbeddedPostgres):  # type: ignore[no-untyped-def]
    server.start()
    try:
        yield server
    finally:
        server.stop()


def print_table(title: str, header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    print(title)
    for row in [header, *rows]:
        print(
            "  "
            + "  ".join(str(cell).rjust(width) for cell, width in zip(row, widths, strict=True))
        )
