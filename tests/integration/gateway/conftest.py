"""Fixtures of the gateway tests. What is real here: everything of tests/conftest.py
(nats-server, PostgreSQL), and a started reference gateway `gw-a` on this test's
database and streams."""

from __future__ import annotations

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas.subjects import Subjects
from tests.integration.fleet import Provisioned
from workers.runtime.bus import streams


@pytest.fixture
async def pool(database_url: str):  # type: ignore[no-untyped-def]
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=4)
    yield pool
    await pool.close()


@pytest.fixture
async def gateway(pool: asyncpg.Pool, nc: NATS, subjects: Subjects):  # type: ignore[no-untyped-def]
    await streams.provision_streams(nc.jetstream(), subjects)
    gw = Provisioned("gw-a", pool, nc, subjects)
    await gw.start(autotick=None)  # the tests tick it when time matters
    yield gw
    await gw.stop(graceful=False)  # also after a test stopped it, or its lease did
