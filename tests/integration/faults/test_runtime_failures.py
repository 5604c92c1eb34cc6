"""The runtime survives what production does to it: `kill -9` mid-batch, SIGTERM,
PostgreSQL and nats-server restarts while facts flow. Every fact takes effect exactly
once afterwards, and every event is published exactly once.

These tests restart the session's own servers, so they need the embedded ones.
"""

from __future__ import annotations

import asyncio
import signal
import time
from asyncio.subprocess import Process
from collections.abc import Awaitable

import pytest
from nats.aio.client import Client as NATS

from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration.support import (
    OUTBOX_LEFT,
    build_tally,
    count,
    eventually,
    make_settings,
    publish_fact,
    publish_through_outages,
    running,
    spawn_tally,
    status_fact,
    stream_messages,
    tally_effects,
    tally_pulling,
)
from workers.runtime.bus import streams


def _spawn(servers: Servers, database_url: str, subjects: Subjects) -> Awaitable[Process]:
    """A tally process whose deliveries are redelivered 2 s after, its statements bounded
    at 1.5 s."""
    return spawn_tally(
        servers.nats_url,
        database_url,
        subjects,
        BCW_CONSUMER_ACK_WAIT="2",
        BCW_DATABASE_COMMAND_TIMEOUT="1.5",
    )


async def _tally(database_url: str) -> int:
    return await count(database_url, "SELECT count(*) FROM tally")


@pytest.mark.slow
async def test_kill_9_mid_batch_loses_nothing_and_duplicates_nothing(
    servers: Servers, nc: NATS, subjects: Subjects, tally_db: str
) -> None:
    js = nc.jetstream()
    await streams.provision_streams(js, subjects)
    total = 4000
    for i in range(total):
        await publish_fact(js, subjects, status_fact(node_id=f"node-{i % 50}"))

    first = await _spawn(servers, tally_db, subjects)
    await eventually(lambda: _above(tally_db, 200), what="the first process to make progress")
    first.kill()  # SIGKILL: no drain, no flush, batches in flight
    await first.wait()
    done_at_kill = await _tally(tally_db)
    assert done_at_kill < total, "the process finished before it was killed; nothing was tested"

    second = await _spawn(servers, tally_db, subjects)
    try:
        await eventually(lambda: _exactly(tally_db, total), within=60, what="every fact")
        await eventually(lambda: _outbox_empty(tally_db), what="outbox drained")
    finally:
        second.send_signal(signal.SIGTERM)
        await asyncio.wait_for(second.wait(), 15)
    assert await tally_effects(tally_db) == {1: total}
    events = await stream_messages(js, subjects.events_stream)
    assert len(events) == total  # the relay's re-publishes were deduplicated by Nats-Msg-Id


@pytest.mark.slow
async def test_sigterm_drains_and_exits_zero_within_10_seconds(
    servers: Servers, nc: NATS, subjects: Subjects, tally_db: str
) -> None:
    js = nc.jetstream()
    await streams.provision_streams(js, subjects)
    for _ in range(2000):
        await publish_fact(js, subjects, status_fact())
    process = await _spawn(servers, tally_db, subjects)
    await eventually(lambda: _above(tally_db, 100), what="progress")
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    code = await asyncio.wait_for(process.wait(), 15)
    assert code == 0
    assert time.monotonic() - started < 10
    # what it did was committed and its outbox flushed or left for the next process
    restarted = await _spawn(servers, tally_db, subjects)
    try:
        # up and pulling before it is told to stop: the first may have left it nothing to
        # do, and a SIGTERM while the interpreter itself boots ends any Python process
        await eventually(lambda: tally_pulling(js, subjects), within=30, what="the restart pulling")
        await eventually(lambda: _exactly(tally_db, 2000), within=60, what="every fact")
        await eventually(lambda: _outbox_empty(tally_db), what="outbox drained")
    finally:
        restarted.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(restarted.wait(), 15) == 0
    assert await tally_effects(tally_db) == {1: 2000}
    assert len(await stream_messages(js, subjects.events_stream)) == 2000


async def _publish_steadily(nc: NATS, subjects: Subjects, total: int, per_second: float) -> None:
    """Publish facts at a steady rate; through an outage, retry each until JetStream has it."""
    js = nc.jetstream()
    for i in range(total):
        await publish_through_outages(js, subjects, status_fact(node_id=f"node-{i % 20}"))
        await asyncio.sleep(1 / per_second)


@pytest.mark.slow
@pytest.mark.parametrize("server", ["postgres", "nats"])
async def test_a_server_restart_while_facts_flow(
    servers: Servers, nc: NATS, subjects: Subjects, tally_db: str, server: str
) -> None:
    """PostgreSQL (or nats-server) stopped for 1.5 s and started again while facts keep
    coming: the worker survives and every fact takes effect exactly once afterwards."""
    restartable = servers.postgres if server == "postgres" else servers.nats
    if restartable is None:
        pytest.skip(f"{server} given by the environment cannot be restarted here")
    settings = make_settings(servers.nats_url, tally_db, subjects)
    await streams.provision_streams(nc.jetstream(), subjects)
    total = 1500
    async with running(settings, [build_tally()]):
        publisher = asyncio.create_task(_publish_steadily(nc, subjects, total, per_second=300))
        await eventually(lambda: _above(tally_db, 150), what="progress before the restart")
        await asyncio.to_thread(restartable.stop)
        await asyncio.sleep(1.5)  # facts keep coming while it is down
        await asyncio.to_thread(restartable.start)
        await publisher
        await eventually(
            lambda: _exactly(tally_db, total), within=60, what="every fact after the restart"
        )
        await eventually(lambda: _outbox_empty(tally_db), what="outbox drained")
    assert await tally_effects(tally_db) == {1: total}
    assert len(await stream_messages(nc.jetstream(), subjects.events_stream)) == total


async def _above(database_url: str, n: int) -> bool:
    return await _tally(database_url) > n


async def _exactly(database_url: str, n: int) -> bool:
    return await _tally(database_url) == n


async def _outbox_empty(database_url: str) -> bool:
    return await count(database_url, OUTBOX_LEFT) == 0
