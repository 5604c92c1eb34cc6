"""The runtime on real servers, seen from outside and at its edges: a fact's span tree in
the producer's trace, the health port and metrics, stream order across lanes, the
max-deliveries advisory, a schema that does not fit, and a pooled connection's reset."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import asyncpg
import pytest
from nats.aio.client import Client as NATS
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration.support import (
    TALLY_DDL,
    already,
    bcw_process,
    build_tally,
    dead_letters_at_least,
    eventually,
    make_settings,
    outbox_empty,
    publish_fact,
    running,
    status_fact,
    stream_messages,
    tally_rows,
)
from workers.runtime.bus import deadletter, streams
from workers.runtime.observability import tracing


async def test_a_handled_fact_is_a_span_tree_in_the_producers_trace(
    servers: Servers, nc: NATS, subjects: Subjects, tally_db: str
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test-gateway")
    settings = make_settings(servers.nats_url, tally_db, subjects)
    js = nc.jetstream()
    async with running(settings, [build_tally()], provider=provider):
        with tracer.start_as_current_span(
            "gateway publish", kind=trace.SpanKind.PRODUCER
        ) as producer:
            headers = tracing.inject({})
            await publish_fact(js, subjects, status_fact(), headers=headers)
        trace_id = producer.get_span_context().trace_id
        event_span = f"publish {subjects.root}.events.node.disconnected"
        await eventually(lambda: already(_has_span(exporter, event_span)), what="event span")

    spans = [s for s in exporter.get_finished_spans() if s.context.trace_id == trace_id]
    by_name = {s.name: s for s in spans}
    process = by_name[f"process {subjects.root}.facts.{{gateway_id}}.status"]
    assert process.kind is trace.SpanKind.CONSUMER
    assert (
        process.parent is not None and process.parent.span_id == producer.get_span_context().span_id
    )
    attributes = dict(process.attributes or {})
    assert attributes["messaging.system"] == "nats"
    assert (
        attributes["messaging.operation.type"]
        == attributes["messaging.operation.name"]
        == "process"
    )
    assert attributes["messaging.destination.name"] == subjects.fact("gw-1", "status")
    assert attributes["messaging.consumer.group.name"] == "tally"
    assert attributes["messaging.message.id"] and attributes["server.port"]
    assert attributes["messaging.batch.message_count"] == 1
    # the batch's statements are CLIENT spans of the fact's span, without their values
    statements = [s for s in spans if s.kind is trace.SpanKind.CLIENT]
    assert {
        (s.attributes["db.operation.name"], s.attributes.get("db.collection.name"))
        for s in statements
        if s.attributes is not None
    } >= {("INSERT", "processed_facts"), ("INSERT", "outbox_packs")}
    for statement in statements:
        assert statement.parent is not None and statement.parent.span_id == process.context.span_id
        assert statement.attributes is not None
        assert statement.attributes["db.system.name"] == "postgresql"
        assert statement.attributes["db.operation.name"] == statement.name.split()[0]
        assert statement.attributes["db.query.summary"] == statement.name
        assert "db.query.text" not in statement.attributes  # off by default
    publish = by_name[event_span]
    assert publish.kind is trace.SpanKind.PRODUCER
    assert (
        publish.attributes is not None and publish.attributes["messaging.operation.type"] == "send"
    )
    assert publish.parent is not None and publish.parent.span_id == process.context.span_id
    # the published event carries the trace on to its subscribers
    [event] = await stream_messages(js, subjects.events_stream)
    assert f"{trace_id:032x}" in event.headers["traceparent"]


async def test_health_readiness_and_metrics(
    servers: Servers, nc: NATS, subjects: Subjects, tally_db: str
) -> None:
    settings = make_settings(servers.nats_url, tally_db, subjects)
    js = nc.jetstream()
    async with running(settings, [build_tally()]) as (_runtime, port):
        await publish_fact(js, subjects, status_fact())
        await eventually(lambda: tally_rows(tally_db, 1), what="the fact")
        assert await _get(port, "/healthz") == (200, "ok\n")
        status, body = await _get(port, "/readyz")
        assert status == 200 and "consumers ok" in body
        status, body = await _get(port, "/metrics")
        assert status == 200
        samples = {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(body)
            for sample in family.samples
        }
        applied = (("outcome", "applied"), ("type", "status"), ("worker", "tally"))
        assert samples[("bcw_facts_total", applied)] == 1
        assert samples[("bcw_batch_seconds_count", (("worker", "tally"),))] >= 1
        assert samples[("bcw_lease_held", (("loop", "inbox-retention-tally"),))] in (0, 1)
        assert ("bcw_outbox_oldest_seconds", ()) in samples
        assert (await _get(port, "/nope"))[0] == 404


async def test_each_process_names_itself_to_postgresql(
    servers: Servers, subjects: Subjects, database_url: str
) -> None:
    """`bcw run labeler` is `bcw-labeler` in pg_stat_activity (and the server's log)."""
    import signal

    worker = await bcw_process(
        "run",
        "labeler",
        BCW_NATS_URL=servers.nats_url,
        BCW_DATABASE_URL=database_url,
        BCW_SUBJECT_ROOT=subjects.root,
        BCW_HEALTH_PORT="0",
    )

    async def named() -> bool:
        conn = await asyncpg.connect(database_url)
        try:
            names = await conn.fetch(
                "SELECT application_name FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
                "AND datname = current_database()"
            )
        finally:
            await conn.close()
        return {"bcw-labeler"} <= {r["application_name"] for r in names}

    try:
        await eventually(named, what="the labeler's sessions named bcw-labeler")
    finally:
        worker.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(worker.wait(), 30) == 0


# -- helpers ---------------------------------------------------------------------------
def _has_span(exporter: InMemorySpanExporter, name: str) -> bool:
    return any(s.name == name for s in exporter.get_finished_spans())


async def _get(port: int, path: str) -> tuple[int, str]:
    def fetch() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    return await asyncio.to_thread(fetch)


async def test_one_nodes_facts_apply_in_stream_order_across_lanes(
    servers: Servers, nc: NATS, subjects: Subjects, tally_db: str
) -> None:
    settings = make_settings(servers.nats_url, tally_db, subjects, lanes=3, batch_size=16)
    js = nc.jetstream()
    await streams.provision_streams(js, subjects)
    nodes = [f"node-{i}" for i in range(9)]
    for generation in range(1, 61):
        for node in nodes:
            await publish_fact(
                js, subjects, status_fact(node_id=node, observed_generation=generation)
            )
    async with running(settings, [build_tally()]):
        await eventually(lambda: tally_rows(tally_db, 540), what="every fact")
    conn = await asyncpg.connect(tally_db)
    try:
        for node in nodes:
            order = await conn.fetch(
                "SELECT generation FROM tally WHERE node_id = $1 ORDER BY applied", node
            )
            assert [r["generation"] for r in order] == list(range(1, 61)), node
    finally:
        await conn.close()


async def test_without_an_exporter_the_producers_trace_still_reaches_the_events(
    servers: Servers, nc: NATS, subjects: Subjects, tally_db: str
) -> None:
    """A no-op provider (no OTEL endpoint set) costs nothing per fact and still carries
    the producer's traceparent on to what the fact publishes."""
    settings = make_settings(servers.nats_url, tally_db, subjects)
    js = nc.jetstream()
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    async with running(settings, [build_tally()], provider=trace.NoOpTracerProvider()):
        await publish_fact(js, subjects, status_fact(), headers={"traceparent": traceparent})
        await eventually(lambda: _outbox_empty_and_rows(tally_db), what="the event")
    [event] = await stream_messages(js, subjects.events_stream)
    assert event.headers["traceparent"].split("-")[1] == "0af7651916cd43dd8448eb211c80319c"


async def _outbox_empty_and_rows(database_url: str) -> bool:
    return await tally_rows(database_url, 1) and await outbox_empty(database_url)


async def test_a_fact_the_server_stopped_redelivering_is_dead_lettered_from_the_advisory(
    nc: NATS, subjects: Subjects
) -> None:
    """A process that crashes on a fact at every delivery never settles it: JetStream stops
    after max_deliver and says so in an advisory, which the runtime turns into a dead letter."""
    from workers.runtime.base.runtime_settings import ConsumerSettings
    from workers.runtime.bus.deadletter import watch_max_deliveries

    js = nc.jetstream()
    tally = streams.StreamLimits(dead_publishers=("tally",))  # its own dead letters' stream
    await streams.provision_streams(js, subjects, limits=tally)
    spec = build_tally().consumer_spec(subjects)
    await streams.ensure_consumer(
        js, subjects.facts_stream, spec, ConsumerSettings(max_deliver=2, ack_wait=1)
    )
    await watch_max_deliveries(nc, js, subjects, "tally")
    fact = status_fact(node_id="crasher")
    await publish_fact(js, subjects, fact)
    sub = await js.pull_subscribe_bind(durable="tally", stream=subjects.facts_stream)
    for _ in range(2):  # delivered, never acked (the process died), twice
        [msg] = await sub.fetch(1, timeout=5)
        assert msg.metadata.num_delivered in (1, 2)
    with pytest.raises(TimeoutError):  # a replica asks again: nothing more comes
        await sub.fetch(1, timeout=3)
    await eventually(
        lambda: dead_letters_at_least(js, subjects, 1), what="the dead letter from the advisory"
    )
    [letter] = await deadletter.list_dead_letters(js, subjects, "tally")
    assert letter.cause == "max-deliveries" and "max deliveries" in letter.reason
    assert json.loads(letter.data)["fact_id"] == str(fact.fact_id)


async def test_a_schema_that_does_not_fit_stops_the_process_and_dead_letters_nothing(
    servers: Servers, nc: NATS, subjects: Subjects, tally_db: str
) -> None:
    """A table gone (or a grant revoked) while running is no fact's fault: the process stops
    with one error naming BCW_DATABASE_URL (exit 3 from `bcw run`), and the fact stays in
    the stream for a process whose database fits."""
    from opentelemetry.sdk.trace import TracerProvider

    from workers.runtime.base.errors import RefusedError
    from workers.runtime.process import run_process

    settings = make_settings(servers.nats_url, tally_db, subjects)
    js = nc.jetstream()
    await streams.provision_streams(js, subjects)
    conn = await asyncpg.connect(tally_db)
    try:
        await conn.execute("DROP TABLE tally")
        await publish_fact(js, subjects, status_fact(node_id="n1"))
        process = asyncio.create_task(
            run_process(
                settings, [build_tally()], stopping=asyncio.Event(), provider=TracerProvider()
            )
        )
        with pytest.raises(RefusedError) as refused:
            await asyncio.wait_for(process, 30)
        assert refused.value.exit_code == 3
        assert refused.value.setting == "BCW_DATABASE_URL"
        assert "UndefinedTableError" in str(refused.value)
        assert await deadletter.list_dead_letters(js, subjects, "tally") == []
        await conn.execute(TALLY_DDL)  # the database fits again: the fact takes effect
        async with running(settings, [build_tally()]):
            await eventually(lambda: tally_rows(tally_db, 1), what="the fact, applied after all")
    finally:
        await conn.close()


async def test_a_pooled_connection_comes_back_without_its_open_transaction(
    database_url: str,
) -> None:
    """The pool skips asyncpg's reset query; a connection released inside a transaction
    (a handler that began one by hand, say) is still rolled back, and its writes are gone."""
    from workers.runtime.base.runtime_settings import DatabaseSettings
    from workers.runtime.store import db

    pool = await db.create_pool(DatabaseSettings(url=database_url, pool_min=1, pool_max=1))
    try:
        async with pool.acquire() as conn:
            await conn.execute("BEGIN")
            await conn.execute(
                "INSERT INTO gateways (gateway_id, lease_expires_at) VALUES ('gw-left-open', now())"
            )
        async with pool.acquire() as conn:  # the same connection: the pool has one
            assert not conn.is_in_transaction()
            assert (
                await conn.fetchval(
                    "SELECT count(*) FROM gateways WHERE gateway_id = 'gw-left-open'"
                )
                == 0
            )
    finally:
        await pool.close()
