"""Fixtures of the integration tests. What is real here: everything of tests/conftest.py
(nats-server, PostgreSQL); plus a database with the `tally` table the runtime tests count
effects in."""

from __future__ import annotations

import asyncpg
import pytest

from tests.integration.support import TALLY_DDL


@pytest.fixture
async def tally_db(database_url: str) -> str:
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(TALLY_DDL)
    finally:
        await conn.close()
    return database_url
