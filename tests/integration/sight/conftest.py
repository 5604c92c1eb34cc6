"""Fixtures of the sight tests (a module may define its own of the same name)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas.subjects import Subjects
from tests.integration.heartbeats import Fleet
from workers.demo.run import fresh_sweep_history
from workers.runtime.bus import streams


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    """The test's pool, with a fresh sweep history (no outage grace from the template's
    clock)."""
    made = await asyncpg.create_pool(database_url, min_size=1, max_size=8)
    await fresh_sweep_history(made)
    yield made
    await made.close()


@pytest.fixture
async def gateways(pool: asyncpg.Pool, nc: NATS, subjects: Subjects) -> AsyncIterator[Fleet]:
    """Reference gateways whose sessions heartbeat, on the test's pool; the streams made."""
    await streams.provision_streams(nc.jetstream(), subjects)
    made = Fleet(pool, subjects)
    yield made
    await made.stop()
