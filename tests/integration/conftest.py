"""Fixtures of the integration tests. What is real here: everything of tests/conftest.py
(nats-server, PostgreSQL); plus a database with the `tally` table the runtime tests count
effects in."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from tests.integration import fleet
from tests.integration.support import TALLY_DDL


@pytest.fixture
async def tally_db(database_url: str) -> str:
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(TALLY_DDL)
    finally:
        await conn.close()
    return database_url


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    """A pool on this test's database (a module may define its own, sized for it)."""
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=6)
    yield pool
    await pool.close()


@pytest.fixture(autouse=True)
def _daemons_signed_nothing_yet() -> None:
    """Each test's daemons start with no `at` signed (`fleet.rising_at`): the test has a
    database of its own."""
    fleet.SIGNED.clear()
