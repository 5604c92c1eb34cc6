"""Under batching, each Hello's trace still leads to the SQL that applied it: a power-on of
many nodes through one gateway, the five workers in a `bcw run all` process exporting over
OTLP/HTTP to a real receiver. Where a worker applied several Hellos in one transaction,
each Hello's CONSUMER span (in that Hello's trace) links to the batch's CONSUMER span,
whose children are the statements, and which links back to each message's creation
(the messaging conventions' batch receiving)."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration import fleet
from tests.integration.otlp import HttpReceiver, Received
from tests.integration.support import eventually
from tests.integration.traces.conftest import traced_gateway
from tests.integration.traces.test_traces import (
    HELLO_WORKERS,
    _consumers,
    _spawn,
    named_by_conventions,
)
from workers.gateway import HelloRequest
from workers.runtime.bus import streams

NODES = [f"p{i:02d}" for i in range(24)]


def _processed(spans: list[Received], hellos: set[str]) -> list[Received]:
    """Each worker's span of the Hellos whose traces are `hellos`."""
    return [
        s
        for s in spans
        if s.kind == "CONSUMER"
        and s.name.endswith(".hello")
        and "bcw.outcome" in s.attributes
        and s.trace_id in hellos
    ]


def _hellos(spans: list[Received]) -> set[str]:
    return {s.trace_id for s in spans if s.name == "Hello"}


@pytest.mark.slow
async def test_under_batching_each_hello_reaches_the_sql_that_applied_it(
    otel_env: pytest.MonkeyPatch,
    servers: Servers,
    nc: NATS,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
) -> None:
    with HttpReceiver() as receiver:
        await streams.provision_streams(nc.jetstream(), subjects)
        for node in NODES:
            await fleet.join(db, node)
        otel = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
        process = await _spawn(["all"], database_url, servers, subjects, otel)
        hellos: set[str] = set()
        try:
            traced = traced_gateway(otel_env, otel, database_url, nc, subjects, pool_size=8)
            async with traced as (gateway, provider):
                await eventually(lambda: _consumers(nc, subjects), within=60, what="five consumers")
                for round_ in range(4):  # until some worker applied several Hellos at once
                    provider.force_flush()  # the earlier rounds' Hellos are in
                    before = _hellos(receiver.spans())
                    await asyncio.gather(
                        *(
                            fleet.say_hello(
                                gateway,
                                HelloRequest(
                                    node_id=node,
                                    cert_serial=f"{node}-serial",
                                    role="worker",
                                    boot_id=f"b{round_}",
                                    journal_id="j1",
                                ),
                            )
                            for node in NODES
                        )
                    )
                    provider.force_flush()
                    hellos = _hellos(receiver.spans()) - before
                    assert len(hellos) == len(NODES)

                    async def arrived(hellos: set[str] = hellos) -> bool:
                        processed = _processed(receiver.spans(), hellos)
                        return len(processed) >= len(NODES) * len(HELLO_WORKERS)

                    await eventually(arrived, within=60, what="every worker's span of every Hello")
                    if any(s.links for s in _processed(receiver.spans(), hellos)):
                        break
        finally:
            process.terminate()
            await process.wait()

    spans = receiver.spans()
    assert [s.name for s in spans if not named_by_conventions(s)] == []
    index = {(s.trace_id, s.span_id): s for s in spans}
    children: dict[tuple[str, str], list[Received]] = {}
    for span in spans:
        children.setdefault((span.trace_id, span.parent_id), []).append(span)
    # no span of any process without its parent, in any trace (the batches' own too)
    assert [s for s in spans if s.parent_id and (s.trace_id, s.parent_id) not in index] == []
    processed = _processed(spans, hellos)
    linked = [s for s in processed if s.links]
    assert linked, "no batch formed in four power-ons"
    for span in processed:
        trace = [s for s in spans if s.trace_id == span.trace_id]
        ids = {s.span_id for s in trace}
        assert [s for s in trace if s.parent_id and s.parent_id not in ids] == []  # no orphans
        assert [s.name for s in trace if not s.parent_id] == ["Hello"]
        group = span.attributes["messaging.consumer.group.name"]
        if span.attributes["bcw.outcome"] != "applied" or group == "labeler":  # no inbox
            continue
        # its statements: its own children, or (batched) those of the span it links to
        reached = list(children.get((span.trace_id, span.span_id), []))
        for link in span.links:
            batch = index[link]
            assert (
                batch.kind == "CONSUMER" and batch.attributes["messaging.batch.message_count"] > 1
            )
            assert batch.attributes["messaging.consumer.group.name"] == group
            reached += children.get(link, [])
            # and the batch links back to this message's creation, in the Hello's trace
            assert any(
                t == span.trace_id
                and index.get((t, p)) is not None
                and index[(t, p)].kind == "PRODUCER"
                for t, p in batch.links
            )
        assert ("INSERT", "processed_facts") in {
            (s.attributes.get("db.operation.name"), s.attributes.get("db.collection.name"))
            for s in reached
            if s.kind == "CLIENT"
        }, span
