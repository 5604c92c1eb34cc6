"""The simulator beside a running system: each run counts only its own nodes, gateways,
events and dead letters; `bcw sim` moves `compute_now()` only on a simulation database
and otherwise runs in real time, leaving every other session as it was. What is real:
nats-server, PostgreSQL, the five workers in this event loop, `bcw` in a subprocess."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta

import asyncpg
import pytest

from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.e2e.test_scenarios import assert_all_hold
from tests.integration import fleet
from tests.integration.support import bcw
from workers.sim import Simulator
from workers.sim.scenarios import clone, power_on

pytestmark = pytest.mark.slow

Make = Callable[..., Awaitable[Simulator]]


async def test_two_runs_on_one_system_each_count_their_own(simulator: Make) -> None:
    first = await simulator(6, 2, prefix="runa")
    assert_all_hold(await power_on(first))
    assert_all_hold(await clone(first))
    second = await simulator(6, 2, prefix="runb")
    assert_all_hold(await power_on(second))
    assert_all_hold(await clone(second))
    for sim in (first, second):  # the stream holds both runs' events
        events = await sim.events()
        assert events[("security.node.quarantined", "duplicate-identity")] == 1
        assert events[("node.connected", "")] >= 6
        assert await sim.dead_letters() == 0


async def test_bcw_sim_moves_no_clock_but_its_own(
    servers: Servers,
    workers_running: asyncpg.Pool,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
) -> None:
    await fleet.join(db, "real-1")  # a node no simulator created
    before = await db.fetchrow("SELECT * FROM node_sessions WHERE node_id = 'real-1'")
    env = {
        "BCW_NATS_URL": servers.nats_url,
        "BCW_DATABASE_URL": database_url,
        "BCW_SUBJECT_ROOT": subjects.root,
    }
    args = ("sim", "--scenario", "power-on", "--nodes", "5", "--gateways", "1")

    code, out = await bcw(*args, "--own-clock", **env)
    lines = [line for line in out.splitlines() if line.strip()]
    assert code == 2, out
    assert len(lines) == 1 and "--own-clock" in lines[0] and "real-1" in lines[0], out
    assert await db.fetchval("SELECT count(*) FROM nodes") == 1  # refused before joining

    offsets: list[timedelta] = []
    running = asyncio.create_task(bcw(*args, **env))
    while not running.done():
        offsets.append(await db.fetchval("SELECT compute_now() - now()"))
        await asyncio.sleep(0.1)
    code, out = running.result()
    assert code == 0, out
    assert "real time" in out
    assert len(offsets) > 10 and set(offsets) == {timedelta(0)}
    assert await db.fetchrow("SELECT * FROM node_sessions WHERE node_id = 'real-1'") == before
    simulated = await db.fetchval(
        "SELECT count(*) FROM node_labels WHERE key = 'bc.dev/simulated' AND source = 'operator'"
    )
    assert simulated == 5


async def test_bcw_sim_moves_the_clock_of_a_simulation_database(
    servers: Servers, workers_running: asyncpg.Pool, subjects: Subjects, database_url: str
) -> None:
    """Sessions only simulators created: `--own-clock` is allowed, twice in a row."""
    env = {
        "BCW_NATS_URL": servers.nats_url,
        "BCW_DATABASE_URL": database_url,
        "BCW_SUBJECT_ROOT": subjects.root,
    }
    for _ in range(2):
        code, out = await bcw(
            "sim", "--scenario", "clone", "--nodes", "4", "--gateways", "2", "--own-clock", **env
        )
        assert code == 0, out
        assert "real time" not in out and "FAIL" not in out
