"""The outbox relay's fast batches on real servers: a round goes out as one batch per
stream (at most `BATCH_FLOW` rows each), every row once and in order; a stream that takes
no batch gets its rows one by one; a row the stream refuses in the middle of a batch is
dead-lettered alone, and the rows around it are published once each; batches left
unanswered in a partition are published again, each row once."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from urllib.parse import urlsplit

import asyncpg
import nats
import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from opentelemetry import trace

from schemas import Zombie
from schemas.events import NodeConnected
from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration.support import OUTBOX_LEFT, stream_messages
from workers.bench.proxy import Mode, TcpProxy
from workers.runtime.base.runtime_settings import DatabaseSettings, OutboxSettings
from workers.runtime.bus import streams
from workers.runtime.bus.acked import BATCH_FLOW
from workers.runtime.effects.batch import OutboxBatch
from workers.runtime.effects.outbox import OutboxPublishError, OutboxRelay
from workers.runtime.observability.metrics import Metrics


def _connected(epoch: int) -> NodeConnected:
    return NodeConnected(
        node_id="n",
        epoch=epoch,
        gateway_id="gw-1",
        boot_id="b1",
        journal_changed=False,
        boot_changed=False,
        duplicate_identity=False,
    )


def _notices_and_events(subjects: Subjects, notices: int, events: int) -> OutboxBatch:
    """Node n's zombie notices of epochs 1..`notices`, each followed by its
    `node.connected` while the epoch is at most `events`: one transaction's messages."""
    batch = OutboxBatch()
    for epoch in range(1, notices + 1):
        batch.add(
            Zombie(node_id="n", epoch=epoch), subjects.notice("gw-1", "zombie"), order_key="n"
        )
        if epoch <= events:
            batch.add(_connected(epoch), subjects.event("node.connected"), order_key="n")
    return batch


async def _relay_all(
    database_url: str, js: JetStreamContext, subjects: Subjects, batch: OutboxBatch | None = None
) -> Metrics:
    """`batch` written (if any), then every message published by one relay (claims of
    1,200), none left; the relay's metrics."""
    metrics = Metrics()
    conn = await asyncpg.connect(database_url)
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    relay = OutboxRelay(
        pool,
        js,
        OutboxSettings(batch_size=1200),
        DatabaseSettings(url=database_url),
        metrics,
        trace.NoOpTracer(),
        subjects,
    )
    try:
        if batch is not None:
            await batch.write(conn)
        await relay.flush(time.monotonic() + 30)
        assert await conn.fetchval(OUTBOX_LEFT) == 0
    finally:
        await pool.close()
        await conn.close()
    return metrics


async def _set(js: JetStreamContext, stream: str, **changes: object) -> None:
    config = (await js.stream_info(stream)).config
    await js.update_stream(dataclasses.replace(config, **changes))


async def test_a_round_goes_out_as_a_batch_per_stream_each_row_once_in_order(
    nc: NATS, subjects: Subjects, database_url: str
) -> None:
    js = nc.jetstream()
    await streams.provision_streams(js, subjects)
    batch = _notices_and_events(subjects, 700, 300)  # two batches for the notices: 500 + 200
    metrics = await _relay_all(database_url, js, subjects, batch)
    assert metrics.outbox_published.value() == metrics.outbox_batched.value() == 1000
    notices = await stream_messages(js, subjects.gateway_stream)
    events = await stream_messages(js, subjects.events_stream)
    assert [Zombie.model_validate_json(m.data).epoch for m in notices] == list(range(1, 701))
    assert [NodeConnected.model_validate_json(m.data).epoch for m in events] == list(range(1, 301))
    assert BATCH_FLOW == 500


async def test_a_stream_that_takes_no_batch_gets_its_rows_one_by_one(
    nc: NATS, subjects: Subjects, database_url: str
) -> None:
    js = nc.jetstream()
    await streams.provision_streams(js, subjects)
    await _set(js, subjects.gateway_stream, allow_batched=False)  # as an operator left it
    metrics = await _relay_all(database_url, js, subjects, _notices_and_events(subjects, 50, 50))
    assert metrics.outbox_published.value() == 100
    assert metrics.outbox_batched.value() == 50  # the events' batch; the notices one by one
    notices = await stream_messages(js, subjects.gateway_stream)
    assert [Zombie.model_validate_json(m.data).epoch for m in notices] == list(range(1, 51))
    assert len(await stream_messages(js, subjects.events_stream)) == 50


async def test_a_row_the_stream_refuses_mid_batch_is_dead_lettered_alone(
    nc: NATS, subjects: Subjects, database_url: str
) -> None:
    js = nc.jetstream()
    await streams.provision_streams(js, subjects)
    await _set(js, subjects.gateway_stream, max_msg_size=1000)
    subject = subjects.notice("gw-1", "zombie")
    bodies = [Zombie(node_id="n", epoch=epoch).model_dump_json().encode() for epoch in range(1, 11)]
    bodies[4] = b'{"node_id": "n", "epoch": 5, "pad": "' + b"x" * 2000 + b'"}'
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "INSERT INTO outbox (msg_id, subject, headers, body, order_key)"
            " SELECT unnest($1::uuid[]), $2, '{\"Bc-Type\": \"zombie\"}', unnest($3::bytea[]), 'n'",
            [uuid.uuid4() for _ in bodies],
            subject,
            bodies,
        )
        metrics = await _relay_all(database_url, js, subjects)
        dead = await conn.fetch("SELECT body, reason FROM outbox_dead")
    finally:
        await conn.close()
    assert [bytes(row["body"]) for row in dead] == [bodies[4]]
    assert "exceeds maximum" in dead[0]["reason"]
    notices = await stream_messages(js, subjects.gateway_stream)
    assert [m.data for m in notices] == bodies[:4] + bodies[5:]  # each once, in order
    assert metrics.outbox_published.value() == 9


async def test_batches_unanswered_in_a_partition_are_published_again_each_row_once(
    servers: Servers, nc: NATS, subjects: Subjects, database_url: str
) -> None:
    """The relay's link to NATS goes silent while its batches are in flight: no PubAck
    comes, the rows stay; once the link heals (and the client reconnects) the next rounds
    publish them again, and the stream holds each row once, in order."""
    js = nc.jetstream()
    await streams.provision_streams(js, subjects)
    target = urlsplit(servers.nats_url)
    assert target.hostname and target.port
    proxy = await TcpProxy(target.hostname, target.port).start()
    relay_nc = await nats.connect(
        proxy.url("nats"), max_reconnect_attempts=-1, reconnect_time_wait=0.2
    )
    batch = _notices_and_events(subjects, 800, 0)
    conn = await asyncpg.connect(database_url)
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    metrics = Metrics()
    relay = OutboxRelay(
        pool,
        relay_nc.jetstream(),
        OutboxSettings(batch_size=1000, publish_timeout=1.0),
        DatabaseSettings(url=database_url),
        metrics,
        trace.NoOpTracer(),
        subjects,
    )
    try:
        await batch.write(conn)
        await proxy.set_mode(Mode.BLACKHOLE)
        with pytest.raises(OutboxPublishError, match="800 of 800 rows not acknowledged"):
            await relay.publish_round()
        assert await conn.fetchval(OUTBOX_LEFT) == 800  # every message kept
        await proxy.set_mode(Mode.FORWARD)
        deadline = time.monotonic() + 30
        while await relay.backlog() and time.monotonic() < deadline:
            with contextlib.suppress(Exception):  # reconnecting: the round waits its turn
                await relay.publish_round()
            await asyncio.sleep(0.1)
        assert await conn.fetchval(OUTBOX_LEFT) == 0
        assert await conn.fetchval("SELECT count(*) FROM outbox_dead") == 0
    finally:
        await pool.close()
        await conn.close()
        await relay_nc.close()
        await proxy.stop()
    notices = await stream_messages(js, subjects.gateway_stream)
    assert [Zombie.model_validate_json(m.data).epoch for m in notices] == list(range(1, 801))
    assert metrics.outbox_published.value() == metrics.outbox_batched.value() == 800


async def test_a_pack_partly_published_keeps_only_the_rest_and_they_follow_once(
    nc: NATS, subjects: Subjects, database_url: str
) -> None:
    """A pack of events and notices while the notices' stream is gone (no responder: a
    passing failure): the events go out and leave the pack, the notices stay in it, in
    order; once the stream is back they go out too, each once."""
    js = nc.jetstream()
    await streams.provision_streams(js, subjects)
    await js.delete_stream(subjects.gateway_stream)
    batch = _notices_and_events(subjects, 20, 20)
    conn = await asyncpg.connect(database_url)
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    relay = OutboxRelay(
        pool,
        js,
        OutboxSettings(publish_timeout=2.0),
        DatabaseSettings(url=database_url),
        Metrics(),
        trace.NoOpTracer(),
        subjects,
    )
    try:
        await batch.write(conn)
        with pytest.raises(OutboxPublishError, match="20 of 40"):
            await relay.publish_round()
        [left] = await conn.fetch("SELECT subjects, order_keys FROM outbox_packs")
        assert left["subjects"] == [subjects.notice("gw-1", "zombie")] * 20
        assert left["order_keys"] == ["n"] * 20
        assert len(await stream_messages(js, subjects.events_stream)) == 20
        await streams.provision_streams(js, subjects)
        await relay.flush(time.monotonic() + 10)
        assert await conn.fetchval(OUTBOX_LEFT) == 0
    finally:
        await pool.close()
        await conn.close()
    notices = await stream_messages(js, subjects.gateway_stream)
    assert [Zombie.model_validate_json(m.data).epoch for m in notices] == list(range(1, 21))
    events = await stream_messages(js, subjects.events_stream)
    assert [NodeConnected.model_validate_json(m.data).epoch for m in events] == list(range(1, 21))
