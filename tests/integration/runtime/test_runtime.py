"""The runtime on real servers: exactly-once effects, dead letters, tracing, health.

Each test runs a worker process in-task (its own database and subject root) with the
`tally` worker, whose table counts every effect of every fact.
"""

from __future__ import annotations

import dataclasses
import json
import uuid

import asyncpg
from nats.aio.client import Client as NATS
from opentelemetry import trace

from schemas import REGISTRY, Status
from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration.support import (
    already,
    build_tally,
    count,
    dead_letters_at_least,
    eventually,
    make_settings,
    outbox_empty,
    publish_fact,
    publish_raw,
    running,
    status_fact,
    stream_messages,
    tally_rows,
)
from workers.bench.common import join_fleet
from workers.bench.runtime import publishing_handler
from workers.runtime.bus import deadletter, letters, streams
from workers.runtime.effects.consumer import FactConsumer
from workers.runtime.effects.items import decode
from workers.runtime.effects.worker import Tx, Worker
from workers.runtime.observability.metrics import Metrics


async def _effects(database_url: str) -> list[int]:
    conn = await asyncpg.connect(database_url)
    try:
        return [
            r["effects"] for r in await conn.fetch("SELECT effects FROM tally ORDER BY fact_id")
        ]
    finally:
        await conn.close()


async def test_facts_take_effect_once_and_their_events_are_published(
    servers: Servers, nc: NATS, subjects: Subjects, tally_db: str
) -> None:
    settings = make_settings(servers.nats_url, tally_db, subjects)
    js = nc.jetstream()
    async with running(settings, [build_tally()]):
        for i in range(300):
            await publish_fact(js, subjects, status_fact(node_id=f"node-{i % 7}"))
        await eventually(lambda: tally_rows(tally_db, 300), what="300 effects")
        await eventually(lambda: outbox_empty(tally_db), what="outbox drained")
    assert await _effects(tally_db) == [1] * 300
    events = await stream_messages(js, subjects.events_stream)
    assert len(events) == 300
    assert {m.headers["Bc-Type"] for m in events} == {"node.disconnected"}
    # per node, events keep the order of their facts' outbox rows (order_key = node id)
    assert (
        await count(tally_db, "SELECT count(*) FROM processed_facts WHERE consumer = 'tally'")
        == 300
    )


async def _delivered_three_times(
    servers: Servers, nc: NATS, subjects: Subjects, tally_db: str, worker: Worker, outcome: str
) -> Metrics:
    """One status fact published three times under other Nats-Msg-Ids (as after the
    duplicate window: JetStream stores each): twice before `worker` starts (one batch),
    once after its first effect (a later batch). Returns the worker's metrics once two
    deliveries were settled `outcome`."""
    settings = make_settings(servers.nats_url, tally_db, subjects)
    js = nc.jetstream()
    await streams.provision_streams(js, subjects)
    fact = status_fact()
    await publish_fact(js, subjects, fact, msg_id="first")
    await publish_fact(js, subjects, fact, msg_id="second")  # same fact, same batch
    async with running(settings, [worker]) as (runtime, _port):
        await eventually(lambda: tally_rows(tally_db, 1), what="the effect")
        await publish_fact(js, subjects, fact, msg_id="third")  # same fact, a later batch
        await eventually(
            lambda: already(runtime.metrics.facts.value("tally", "status", outcome) == 2),
            what=f"two deliveries settled {outcome}",
        )
    return runtime.metrics


async def test_a_fact_published_twice_takes_effect_once(
    servers: Servers, nc: NATS, subjects: Subjects, tally_db: str
) -> None:
    """Outside the duplicate window JetStream stores both copies (a different Nats-Msg-Id
    stands for "after the window"); the inbox absorbs the second, in one batch or two."""
    await _delivered_three_times(servers, nc, subjects, tally_db, build_tally(), "duplicate")
    assert await _effects(tally_db) == [1]
    assert len(await stream_messages(nc.jetstream(), subjects.events_stream)) == 1


async def test_without_an_inbox_a_fact_reaches_the_rules_once_per_batch_and_each_delivery(
    servers: Servers, nc: NATS, subjects: Subjects, tally_db: str
) -> None:
    """What the inbox gives, shown by its absence: a worker without one (`inbox=False`,
    for effects idempotent by construction) gets a fact twice in one batch once, but a
    delivery in a later batch reaches its rules again — the tally, whose effect is a
    counter (not idempotent), counts it twice — and no inbox row is written."""
    worker = dataclasses.replace(build_tally(), inbox=False)
    metrics = await _delivered_three_times(servers, nc, subjects, tally_db, worker, "applied")
    assert metrics.facts.value("tally", "status", "duplicate") == 1
    assert await _effects(tally_db) == [2]
    assert await count(tally_db, "SELECT count(*) FROM processed_facts") == 0


async def test_the_bench_runtimes_worker_finds_nothing_to_do_in_a_fact_again(
    database_url: str, db: asyncpg.Connection, subjects: Subjects
) -> None:
    """`bcw bench runtime`'s worker keeps no inbox: its write only moves a row forward and
    it publishes only for a row it moved, so a fact delivered twice, or again after a
    newer one, writes and publishes nothing the second time."""
    await join_fleet(database_url, 1, prefix="bench-")
    published: set[uuid.UUID] = set()
    handle = publishing_handler(published)

    def status(generation: int) -> Status:
        return Status.model_validate(
            {
                "fact_id": uuid.uuid4(),
                "gateway_id": "gw-0",
                "node_id": "bench-1",
                "epoch": 1,
                "observed_at": "2026-12-02T00:00:00Z",
                "observed_generation": generation,
                "trust_version": 0,
            },
            strict=False,
        )

    async def deliver(fact: Status) -> int:
        async with db.transaction():
            tx = Tx(db, subjects, {}, worker="")
            await handle(tx, [fact])
            await tx.outbox.write(db)
            return len(tx.outbox.rows)

    first, newer = status(5), status(7)
    assert [await deliver(f) for f in (first, first, newer, first)] == [1, 0, 1, 0]
    assert published == {first.fact_id, newer.fact_id}
    generation = "SELECT observed_generation FROM node_sessions WHERE node_id = 'bench-1'"
    assert await db.fetchval(generation) == 7
    assert await db.fetchval("SELECT sum(size) FROM outbox_packs") == 2


async def test_a_fact_redelivered_after_a_crash_before_the_ack_takes_effect_once(
    servers: Servers, nc: NATS, subjects: Subjects, tally_db: str
) -> None:
    """Commit the batch but never ack it (the crash window), then let a worker at it."""
    settings = make_settings(servers.nats_url, tally_db, subjects, ack_wait=1.0)
    js = nc.jetstream()
    worker = build_tally()
    await streams.provision_streams(js, subjects)
    await streams.ensure_consumer(
        js, subjects.facts_stream, worker.consumer_spec(subjects), settings.consumer
    )
    facts = [status_fact(node_id=f"n{i}") for i in range(20)]
    for fact in facts:
        await publish_fact(js, subjects, fact)
    pool = await asyncpg.create_pool(tally_db, min_size=1, max_size=2)
    try:
        consumer = FactConsumer(
            worker,
            nc=nc,
            js=js,
            pool=pool,
            subjects=subjects,
            settings=settings.consumer,
            metrics=Metrics(),
            tracer=trace.NoOpTracer(),
        )
        await consumer.bind()
        sub = await js.pull_subscribe_bind(durable="tally", stream=subjects.facts_stream)
        msgs = await sub.fetch(20, timeout=2)
        items = [decode(m, subjects, worker) for m in msgs]
        await consumer._apply(items)  # committed ... and then the process "dies": no ack
    finally:
        await pool.close()
    assert await _effects(tally_db) == [1] * 20
    async with running(settings, [build_tally()]) as (runtime, _port):
        await eventually(
            lambda: already(runtime.metrics.facts.value("tally", "status", "duplicate") == 20),
            what="redeliveries absorbed",
        )
    assert await _effects(tally_db) == [1] * 20


async def test_poison_messages_are_dead_lettered_and_do_not_block(
    servers: Servers, nc: NATS, subjects: Subjects, tally_db: str
) -> None:
    settings = make_settings(servers.nats_url, tally_db, subjects)
    js = nc.jetstream()
    await streams.provision_streams(js, subjects)
    good_before = status_fact(node_id="before")
    await publish_fact(js, subjects, good_before)
    fact_subject = subjects.fact("gw-1", "status")
    await publish_raw(js, fact_subject, b"{not json", {"Bc-Type": "status", "Bc-Schema": "1"})
    wrong = json.loads(REGISTRY.encode(status_fact())[0])
    wrong["epoch"] = "seven"
    await publish_raw(
        js, fact_subject, json.dumps(wrong).encode(), {"Bc-Type": "status", "Bc-Schema": "1"}
    )
    await publish_raw(js, fact_subject, b"{}", {"Bc-Type": "telepathy", "Bc-Schema": "1"})
    huge = json.loads(REGISTRY.encode(status_fact(node_id="huge"))[0])
    huge["observed_generation"] = 2**63  # one more than a bigint holds
    await publish_raw(
        js, fact_subject, json.dumps(huge).encode(), {"Bc-Type": "status", "Bc-Schema": "1"}
    )
    mismatched = status_fact(gateway_id="gw-2")
    await publish_raw(
        js, fact_subject, REGISTRY.encode(mismatched)[0], {"Bc-Type": "status", "Bc-Schema": "1"}
    )
    good_after = [status_fact(node_id=f"after-{i}") for i in range(10)]
    for fact in good_after:
        await publish_fact(js, subjects, fact)

    async with running(settings, [build_tally()]):
        await eventually(lambda: tally_rows(tally_db, 11), what="the good facts")
        await eventually(lambda: dead_letters_at_least(js, subjects, 5), what="five dead letters")
    letters = await deadletter.list_dead_letters(js, subjects, "tally")
    reasons = sorted(letter.reason for letter in letters)
    assert len(letters) == 5
    assert any("field 'observed_generation'" in r and "less than or equal" in r for r in reasons)
    assert any("Invalid JSON" in r for r in reasons)
    assert any("field 'epoch'" in r for r in reasons)
    assert any("unknown message type 'telepathy'" in r for r in reasons)
    assert any("gateway mismatch" in r and "gw-2" in r for r in reasons)
    assert {letter.subject for letter in letters} == {fact_subject}
    assert all(letter.stream_seq > 0 and letter.cause == "invalid" for letter in letters)


async def test_a_handler_failure_dead_letters_only_its_fact_and_redrive_applies_it_once(
    servers: Servers, nc: NATS, subjects: Subjects, tally_db: str
) -> None:
    conn = await asyncpg.connect(tally_db)
    await conn.execute("INSERT INTO tally_broken VALUES ('boom')")
    settings = make_settings(servers.nats_url, tally_db, subjects)
    js = nc.jetstream()
    await streams.provision_streams(js, subjects)
    facts = [status_fact(node_id="boom" if i == 5 else f"ok-{i}") for i in range(12)]
    for fact in facts:
        await publish_fact(js, subjects, fact)
    try:
        async with running(settings, [build_tally()]):
            await eventually(lambda: tally_rows(tally_db, 11), what="the other facts")
            await eventually(lambda: dead_letters_at_least(js, subjects, 1), what="one dead letter")
            [letter] = await deadletter.list_dead_letters(js, subjects, "tally")
            assert letter.cause == "handler" and "PermanentError" in letter.reason
            # the bug is fixed: re-drive it, it takes effect once
            await conn.execute("DELETE FROM tally_broken")
            await letters.redrive(js, subjects, letter)
            await eventually(lambda: tally_rows(tally_db, 12), what="the re-driven fact")
        assert await deadletter.list_dead_letters(js, subjects, "tally") == []
        assert await _effects(tally_db) == [1] * 12
    finally:
        await conn.close()


async def test_stale_outcome_acks_and_keeps_going(
    servers: Servers, nc: NATS, subjects: Subjects, tally_db: str
) -> None:
    settings = make_settings(servers.nats_url, tally_db, subjects)
    js = nc.jetstream()
    async with running(settings, [build_tally()]) as (runtime, _port):
        await publish_fact(js, subjects, status_fact(node_id="stale-1"))
        await publish_fact(js, subjects, status_fact(node_id="fresh-1"))
        await eventually(lambda: tally_rows(tally_db, 1), what="the fresh fact")
        await eventually(
            lambda: already(runtime.metrics.facts.value("tally", "status", "stale") == 1),
            what="stale settled",
        )


async def test_a_fact_failing_while_the_servers_answer_is_dead_lettered_after_its_retries(
    servers: Servers, nc: NATS, subjects: Subjects, tally_db: str
) -> None:
    """A transient failure that repeats while PostgreSQL and NATS both answer (a statement
    that always times out) is the fact's: after `retry_attempts` tries it is dead-lettered,
    in its first delivery (no nak spent a delivery on it)."""
    settings = make_settings(servers.nats_url, tally_db, subjects, retry_attempts=3)
    js = nc.jetstream()
    conn = await asyncpg.connect(tally_db)
    try:
        # every statement touching tally waits on this lock and is cancelled: transient
        await conn.execute(
            "ALTER DATABASE " + tally_db.rsplit("/", 1)[1] + " SET statement_timeout = '200ms'"
        )
        async with running(settings, [build_tally()]) as (runtime, _port), conn.transaction():
            await conn.execute("LOCK TABLE tally IN ACCESS EXCLUSIVE MODE")
            await publish_fact(js, subjects, status_fact(node_id="stuck"))
            await eventually(
                lambda: dead_letters_at_least(js, subjects, 1), what="dead letter", within=30
            )
        [letter] = await deadletter.list_dead_letters(js, subjects, "tally")
        assert letter.cause == "retries"
        assert "failed 3 times while PostgreSQL and NATS answered" in letter.reason
        assert "QueryCanceledError" in letter.reason
        assert runtime.metrics.dead_letters.value("tally", "retries") == 1
        info = await js.consumer_info(subjects.facts_stream, "tally")
        assert info.num_redelivered == 0
    finally:
        await conn.close()


async def test_a_fact_whose_rows_another_session_keeps_locked_waits_and_is_not_dead_lettered(
    servers: Servers, nc: NATS, subjects: Subjects, tally_db: str
) -> None:
    """Another session (a gateway's transaction kept open) holds what the fact must lock:
    each try waits at most BCW_DATABASE_LOCK_TIMEOUT, then the fact is handed back for a
    later delivery — never dead-lettered for it — and applies once the lock is gone."""
    base = make_settings(servers.nats_url, tally_db, subjects, retry_attempts=3)
    settings = base.model_copy(
        update={"database": base.database.model_copy(update={"lock_timeout": 0.2})}
    )
    js = nc.jetstream()
    conn = await asyncpg.connect(tally_db)
    try:
        async with running(settings, [build_tally()]) as (runtime, _port):
            async with conn.transaction():
                await conn.execute("LOCK TABLE tally IN ACCESS EXCLUSIVE MODE")
                await publish_fact(js, subjects, status_fact(node_id="held"))
                await eventually(
                    lambda: already(runtime.metrics.facts.value("tally", "status", "retry") >= 1),
                    what="handed back for later",
                )
            await eventually(
                lambda: already(runtime.metrics.facts.value("tally", "status", "applied") == 1),
                what="applied once the lock is gone",
                within=30,
            )
        assert await deadletter.list_dead_letters(js, subjects, "tally") == []
    finally:
        await conn.close()


# -- helpers ---------------------------------------------------------------------------
