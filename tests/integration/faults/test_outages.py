"""Outages longer than any retry budget, injected for real: the worker process reaches
PostgreSQL (or NATS) through a TCP proxy that, for 90 seconds, partitions PostgreSQL
away (open connections go silent, new ones hang: the case that waits out every
timeout) or refuses NATS (every connection reset, reconnects refused), while Hellos
(and the tally's status facts) keep arriving. Afterwards
every effect is there exactly once, in each node's stream order, and nothing healthy
was dead-lettered.

What is real: nats-server, PostgreSQL, the five workers and the runtime; the proxy is a
real TCP hop. The length of the outage is the point of these tests, so they sleep.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from urllib.parse import urlsplit

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration.flow import HelloFlow
from tests.integration.support import (
    build_tally,
    count,
    eventually,
    make_settings,
    publish_through_outages,
    running,
    status_fact,
)
from workers.bench.proxy import Mode, TcpProxy
from workers.liveness.settings import LivenessSettings
from workers.registry import WORKERS
from workers.runtime.base.runtime_settings import DatabaseSettings, NatsSettings
from workers.runtime.bus import streams

OUTAGE_SECONDS = 90.0
NODES = 20  # of the tally's status facts


async def _publish_statuses(nc: NATS, subjects: Subjects, total: int, per_second: float) -> None:
    """Status facts with a rising generation per node; retried with the same id through outages."""
    js = nc.jetstream()
    for i in range(total):
        fact = status_fact(node_id=f"tally-{i % NODES}", observed_generation=i // NODES + 1)
        await publish_through_outages(js, subjects, fact)
        await asyncio.sleep(1 / per_second)


async def _tally_in_order(database_url: str, total: int) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch("SELECT node_id, effects, generation FROM tally ORDER BY applied")
    finally:
        await conn.close()
    assert len(rows) == total
    assert {r["effects"] for r in rows} == {1}, "a fact took effect twice"
    last: dict[str, int] = {}
    for row in rows:  # each node's facts applied in the order they were published
        assert row["generation"] > last.get(row["node_id"], 0), row
        last[row["node_id"]] = row["generation"]


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize(("server", "mode"), [("postgres", Mode.BLACKHOLE), ("nats", Mode.REFUSE)])
async def test_a_90_second_outage_under_a_flow_of_hellos(
    servers: Servers, nc: NATS, subjects: Subjects, tally_db: str, server: str, mode: Mode
) -> None:
    target = urlsplit(servers.postgres_url if server == "postgres" else servers.nats_url)
    assert target.hostname and target.port
    proxy = await TcpProxy(target.hostname, target.port).start()
    settings = make_settings(servers.nats_url, tally_db, subjects)
    if server == "postgres":
        url = proxy.url("postgresql", urlsplit(tally_db).path, user="postgres")
        database = DatabaseSettings(url=url, pool_max=4, command_timeout=4.0, connect_timeout=2.0)
        settings = settings.model_copy(update={"database": database})
    else:
        nats_settings = NatsSettings(url=proxy.url("nats"), connect_timeout=2.0)
        settings = settings.model_copy(update={"nats": nats_settings})
    # no session may age out while nobody flushes in this test (that rule has tests of its own)
    quiet = LivenessSettings(heartbeat_interval=timedelta(hours=1))
    settings = settings.model_copy(update={"liveness": quiet})
    flow = HelloFlow(600)
    await flow.admit(tally_db)
    await streams.provision_streams(nc.jetstream(), subjects)
    statuses = 1200
    workers = [build_tally(), *(WORKERS[name](settings) for name in sorted(WORKERS))]
    try:
        async with running(settings, workers) as (runtime, _port):
            publishing = asyncio.gather(
                flow.publish(nc, subjects, per_second=12),
                _publish_statuses(nc, subjects, statuses, per_second=24),
            )
            await eventually(
                lambda: _above(tally_db, 50), what="progress before the outage", within=30
            )
            await proxy.outage(OUTAGE_SECONDS, mode)
            await publishing
            await eventually(lambda: flow.done(tally_db), within=90, what="every Hello handled")
            await eventually(
                lambda: _exactly(tally_db, statuses), within=60, what="every status applied"
            )
            consumers = {
                name: await nc.jetstream().consumer_info(subjects.facts_stream, name)
                for name in ("tally", "liveness", "labeler", "replay")
            }
            dead = {k: v for k, v in runtime.metrics.dead_letters.by_labels().items() if v}
    finally:
        await proxy.stop()
    await flow.assert_exact(tally_db, nc, subjects)
    await _tally_in_order(tally_db, statuses)
    assert dead == {}
    if server == "postgres":  # in-hand facts were kept alive: none was delivered twice
        assert {name: info.num_redelivered for name, info in consumers.items()} == dict.fromkeys(
            consumers, 0
        )


async def _above(database_url: str, n: int) -> bool:
    return await count(database_url, "SELECT count(*) FROM tally") > n


async def _exactly(database_url: str, n: int) -> bool:
    return await count(database_url, "SELECT count(*) FROM tally") == n
