"""The outbox relay and provisioning on real servers: rows published once, in order per
key across concurrent relays; streams and consumers created idempotently, drift
corrected or refused clearly (`bcw provision` and `bcw dead-letters` from the command
line: tests/integration/cli/test_provision_and_dead_letters.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import defaultdict

import asyncpg
import pytest
from nats.aio.client import Client as NATS
from opentelemetry import trace

from schemas import Zombie
from schemas.notices import HelloAgain
from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration.support import OUTBOX_LEFT, stream_messages
from workers.runtime.base.runtime_settings import ConsumerSettings, DatabaseSettings, OutboxSettings
from workers.runtime.bus import streams
from workers.runtime.bus.streams import ConsumerSpec
from workers.runtime.effects.batch import OutboxBatch
from workers.runtime.effects.outbox import OutboxRelay
from workers.runtime.observability.metrics import Metrics


async def test_concurrent_relays_publish_each_row_once_in_order_per_key(
    nc: NATS, subjects: Subjects, database_url: str
) -> None:
    """Three relays at once over 950 messages of 4 keys: the first 30 epochs of a, b and
    c as an older release writes them (`outbox` rows), the rest as packs of 1 to 7
    epochs, each pack mixing keys, so that one relay holds a pack while the others claim
    the next ones. Every message once; each key's in order."""
    js = nc.jetstream()
    await streams.provision_streams(js, subjects)
    conn = await asyncpg.connect(database_url)
    old = OutboxBatch()
    for epoch in range(1, 31):
        for node in ("a", "b", "c"):
            old.add(
                Zombie(node_id=node, epoch=epoch), subjects.notice("gw-1", "zombie"), order_key=node
            )
    await conn.execute(
        "INSERT INTO outbox (msg_id, subject, headers, body, order_key)"
        " SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[]::jsonb[], $4::bytea[], $5::text[])",
        *(list(column) for column in zip(*old.rows, strict=True)),
    )
    epoch, size = 31, 1
    while epoch <= 300:
        batch = OutboxBatch("liveness")  # the owner the older rows get from their type
        for e in range(epoch, min(301, epoch + size)):
            for node in ("a", "b", "c"):
                batch.add(
                    Zombie(node_id=node, epoch=e), subjects.notice("gw-1", "zombie"), order_key=node
                )
        await batch.write(conn)
        epoch, size = epoch + size, size % 7 + 1
    for start in range(1, 51, 10):
        batch = OutboxBatch("liveness")  # the owner the older rows get from their type
        for e in range(start, start + 10):
            batch.add(Zombie(node_id="free", epoch=e), subjects.notice("gw-1", "zombie"))
        await batch.write(conn)
    assert await conn.fetchval("SELECT count(*) FROM outbox_packs") > 60
    pool = await asyncpg.create_pool(database_url, min_size=2, max_size=6)
    settings = OutboxSettings(batch_size=37)  # small claims force interleaving
    relays = [
        OutboxRelay(
            pool,
            js,
            settings,
            DatabaseSettings(url=database_url),
            Metrics(),
            trace.NoOpTracer(),
            subjects,
        )
        for _ in range(3)
    ]
    try:
        deadline = time.monotonic() + 30
        await asyncio.gather(*(relay.flush(deadline) for relay in relays))
        assert await conn.fetchval(OUTBOX_LEFT) == 0
    finally:
        await pool.close()
        await conn.close()
    messages = await stream_messages(js, subjects.gateway_stream)
    assert len(messages) == 950
    seen: dict[str, list[int]] = defaultdict(list)
    for msg in messages:
        notice = Zombie.model_validate_json(msg.data)
        seen[notice.node_id].append(notice.epoch)
    for node in ("a", "b", "c"):
        assert seen[node] == list(range(1, 301)), f"{node} out of order"
    assert sorted(seen["free"]) == list(range(1, 51))


async def test_a_relay_claims_and_counts_only_its_own_workers_rows(
    nc: NATS, subjects: Subjects, database_url: str
) -> None:
    """A process's relay publishes its own workers' rows and leaves the others'; its
    gauges count the same rows its backlog does, whichever rows its login may see."""
    js = nc.jetstream()
    await streams.provision_streams(js, subjects)
    conn = await asyncpg.connect(database_url)
    liveness, replay = OutboxBatch("liveness"), OutboxBatch("replay")
    for epoch in (1, 2, 3):
        liveness.add(Zombie(node_id="n", epoch=epoch), subjects.notice("gw-1", "zombie"))
    for epoch in (1, 2):
        replay.add(HelloAgain(node_id="n", epoch=epoch), subjects.notice("gw-1", "hello-again"))
    for batch in (liveness, replay):
        await batch.write(conn)
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    metrics = Metrics()
    relay = OutboxRelay(
        pool,
        js,
        OutboxSettings(),
        DatabaseSettings(url=database_url),
        metrics,
        trace.NoOpTracer(),
        subjects,
        owners=["liveness"],
    )
    try:
        await relay.observe()
        assert (metrics.outbox_backlog.value(), await relay.backlog()) == (3.0, 3)
        assert await relay.publish_round() == 3
        await relay.observe()
        assert (metrics.outbox_backlog.value(), await relay.backlog()) == (0.0, 0)
        assert await conn.fetchval("SELECT array_agg(DISTINCT worker) FROM outbox_packs") == [
            "replay"
        ]
    finally:
        await pool.close()
        await conn.close()
    assert len(await stream_messages(js, subjects.gateway_stream)) == 3


async def test_a_relay_wakes_on_notify(nc: NATS, subjects: Subjects, database_url: str) -> None:
    js = nc.jetstream()
    await streams.provision_streams(js, subjects)
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=3)
    relay = OutboxRelay(
        pool,
        js,
        OutboxSettings(poll_seconds=60),
        DatabaseSettings(url=database_url),
        Metrics(),
        trace.NoOpTracer(),
        subjects,
    )
    stopping = asyncio.Event()
    task = asyncio.create_task(relay.run(stopping))
    conn = await asyncpg.connect(database_url)
    try:
        for _ in range(50):
            if relay.listening:
                break
            await asyncio.sleep(0.05)
        batch = OutboxBatch()
        batch.add(Zombie(node_id="n", epoch=1), subjects.notice("gw-1", "zombie"))
        await batch.write(conn)  # autocommit: NOTIFY fires; the 60 s poll would be too late
        for _ in range(100):
            if not await conn.fetchval(OUTBOX_LEFT):
                break
            await asyncio.sleep(0.05)
        assert await conn.fetchval(OUTBOX_LEFT) == 0
    finally:
        stopping.set()
        await task
        await conn.close()
        await pool.close()


async def test_provisioning_is_idempotent_and_corrects_drift(nc: NATS, subjects: Subjects) -> None:
    js = nc.jetstream()
    first = await streams.provision_streams(js, subjects)
    assert set(first.values()) == {"created"}
    assert set((await streams.provision_streams(js, subjects)).values()) == {"unchanged"}
    info = await js.stream_info(subjects.events_stream)
    await js.update_stream(dataclasses.replace(info.config, max_age=3600.0))  # someone edits it
    again = await streams.provision_streams(js, subjects)
    assert again[subjects.events_stream] == "updated"
    assert (await js.stream_info(subjects.events_stream)).config.max_age == pytest.approx(7 * 86400)
    facts = await js.stream_info(subjects.facts_stream)
    assert facts.config.duplicate_window == pytest.approx(120)
    assert facts.config.subjects == [f"{subjects.root}.facts.>"]


async def test_a_worker_started_after_an_operators_edit_leaves_the_stream_as_edited(
    servers: Servers,
    nc: NATS,
    subjects: Subjects,
    database_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Only `bcw provision` changes a stream: a worker's start creates a missing one
    (a development server) and reports, never reverts, one an operator edited."""
    from tests.integration.support import make_settings, running
    from workers import labeler

    js = nc.jetstream()
    await streams.provision_streams(js, subjects)
    info = await js.stream_info(subjects.events_stream)
    await js.update_stream(dataclasses.replace(info.config, max_age=3 * 86400.0))  # the operator
    await js.delete_stream(subjects.dead_stream_of("labeler"))  # and one missing
    settings = make_settings(servers.nats_url, database_url, subjects)
    async with running(settings, [labeler.build(settings)]):
        pass
    assert (await js.stream_info(subjects.events_stream)).config.max_age == pytest.approx(
        3 * 86400
    )  # as edited
    own = await js.stream_info(subjects.dead_stream_of("labeler"))
    assert own.config.max_age == pytest.approx(14 * 86400)
    assert any(
        "differs from these settings, left as it is" in r.getMessage() for r in caplog.records
    )


async def test_consumer_settings_reach_an_existing_durable(nc: NATS, subjects: Subjects) -> None:
    js = nc.jetstream()
    await streams.provision_streams(js, subjects)
    spec = ConsumerSpec("probe", (subjects.fact_filter("hello"),))
    await streams.ensure_consumer(
        js, subjects.facts_stream, spec, ConsumerSettings(ack_wait=30, max_deliver=5)
    )
    await streams.ensure_consumer(
        js, subjects.facts_stream, spec, ConsumerSettings(ack_wait=45, max_deliver=7)
    )
    info = await js.consumer_info(subjects.facts_stream, "probe")
    assert (info.config.ack_wait, info.config.max_deliver) == (45, 7)
    assert info.config.filter_subjects == [
        subjects.fact_filter("hello")
    ] or info.config.filter_subject == subjects.fact_filter("hello")


async def test_a_row_that_can_never_be_published_does_not_jam_the_relay(
    nc: NATS, subjects: Subjects, database_url: str
) -> None:
    """A row over the bus's max payload between good rows: the good ones are published,
    the bad one moves to outbox_dead with a dead letter saying why (its body too large to
    travel with it, so the letter says so and cannot be re-driven); no publish slot leaks."""
    from workers.runtime.bus import deadletter, letters

    js = nc.jetstream()
    await streams.provision_streams(js, subjects)
    conn = await asyncpg.connect(database_url)
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    try:
        batch = OutboxBatch()
        for epoch in (1, 2):
            batch.add(
                Zombie(node_id="a", epoch=epoch), subjects.notice("gw-1", "zombie"), order_key="a"
            )
        too_big = batch.add(
            Zombie(node_id="a", epoch=3), subjects.notice("gw-1", "zombie"), order_key="a"
        )
        for epoch in (4, 5):
            batch.add(
                Zombie(node_id="a", epoch=epoch), subjects.notice("gw-1", "zombie"), order_key="a"
            )
        await batch.write(conn)
        oversize = nc.max_payload + 1
        await conn.execute(
            "UPDATE outbox_packs SET bodies[array_position(msg_ids, $1)] ="
            " convert_to(repeat('x', $2), 'UTF8')",
            too_big,
            oversize,
        )
        metrics = Metrics()
        relay = OutboxRelay(
            pool,
            js,
            OutboxSettings(batch_size=10),
            DatabaseSettings(url=database_url),
            metrics,
            trace.NoOpTracer(),
            subjects,
        )
        assert await relay.flush(time.monotonic() + 10) == 5
        assert await conn.fetchval(OUTBOX_LEFT) == 0
        [buried] = await conn.fetch("SELECT msg_id, reason, length(body) AS n FROM outbox_dead")
    finally:
        await pool.close()
        await conn.close()
    assert buried["msg_id"] == too_big and buried["n"] == oversize
    assert "over the bus's max payload" in buried["reason"]
    published = [
        Zombie.model_validate_json(m.data).epoch
        for m in await stream_messages(js, subjects.gateway_stream)
    ]
    assert published == [1, 2, 4, 5]
    [letter] = await deadletter.list_dead_letters(js, subjects, "relay")
    assert letter.cause == "unpublishable" and letter.subject == subjects.notice("gw-1", "zombie")
    assert letter.headers[deadletter.TRUNCATED] == str(oversize) and letter.data == b""
    with pytest.raises(letters.RedriveError, match="carries no body"):
        await letters.redrive(js, subjects, letter)
    assert metrics.dead_letters.value("relay", "unpublishable") == 1
    assert js.publish_async_pending() == 0  # every publish slot was given back


async def test_each_message_type_has_the_owner_the_principals_table_names(
    db: asyncpg.Connection,
) -> None:
    """An ownerless row (an older release's) is given the one worker that emits its type:
    the database's table of senders is `principals.EMITS`."""
    from workers.runtime.bus.principals import EMITTED_TYPES

    rows = await db.fetch("SELECT bc_type, worker FROM outbox_senders")
    assert {(r["bc_type"], r["worker"]) for r in rows} == {
        (bc_type, worker) for worker, types in EMITTED_TYPES.items() for bc_type in types
    }
