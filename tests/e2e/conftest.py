"""End-to-end fixtures. What is real here: nats-server and PostgreSQL (the session's), the
five workers running in this event loop on the real runtime, reference gateways and fake
daemons of the simulator. Each test has its own database and subject root."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration.support import running
from workers.demo.run import demo_settings, fresh_sweep_history
from workers.registry import WORKERS
from workers.sim import Simulator


@pytest.fixture
async def workers_running(
    servers: Servers, nc: NATS, subjects: Subjects, database_url: str
) -> AsyncIterator[asyncpg.Pool]:
    settings = demo_settings(servers.nats_url, database_url, subjects.root)
    pool = await asyncpg.create_pool(database_url, min_size=2, max_size=8)
    try:
        await fresh_sweep_history(pool)
        async with running(settings, [build(settings) for build in WORKERS.values()]):
            yield pool
    finally:
        await pool.close()


@pytest.fixture
async def simulator(
    workers_running: asyncpg.Pool, nc: NATS, subjects: Subjects
) -> AsyncIterator[Callable[..., Awaitable[Simulator]]]:
    """Makes started simulators (fake daemons over reference gateways); stops them after."""
    made: list[Simulator] = []

    async def make(nodes: int, gateways: int, prefix: str = "sim") -> Simulator:
        sim = Simulator(
            workers_running, nc, subjects, nodes=nodes, gateways=gateways, prefix=prefix
        )
        await sim.start()
        made.append(sim)
        return sim

    yield make
    for sim in made:
        await sim.stop()
