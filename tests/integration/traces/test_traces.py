"""One Hello is one trace, on the wire: the reference gateway and the five workers, each
worker its own `bcw run` process, export over OTLP (HTTP/protobuf, then gRPC) to a real
receiver in the test, which decodes what arrives with `opentelemetry-proto`.

For the Hello of a node with a command waiting for it, every span of every process must
sit in the Hello's trace with no orphan parent: the gateway's Hello and its SQL, its fact
publish, each worker's process span and SQL, the event and notice publishes, the dispatch
of the waiting command, and the gateway's receipt and delivery of it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
from pathlib import Path

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration import fleet
from tests.integration.otlp import GrpcReceiver, HttpReceiver, Received
from tests.integration.streams import RecordingStream
from tests.integration.support import eventually, stream_messages
from tests.integration.traces.conftest import traced_gateway
from workers.gateway import HelloRequest, Refused
from workers.runtime.bus import streams

ROOT = Path(__file__).resolve().parents[3]
WORKERS = ("labeler", "liveness", "quarantine", "recorder", "replay")
#: the workers a Hello goes through (the recorder reads events and status only)
HELLO_WORKERS = {"labeler", "liveness", "quarantine", "replay"}


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
async def test_one_hello_is_one_trace_from_the_gateway_to_the_dispatch(
    protocol: str,
    otel_env: pytest.MonkeyPatch,
    servers: Servers,
    nc: NATS,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
) -> None:
    receiver = HttpReceiver() if protocol == "http/protobuf" else GrpcReceiver()
    with receiver:
        await streams.provision_streams(nc.jetstream(), subjects)
        await fleet.join(db, "n1")
        command = await db.fetchval("SELECT enqueue_command('n1', 'noop', '{}')")
        otel = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
        # HTTP: each worker its own process; gRPC: the five in one (both are deployments)
        commands = [[w] for w in WORKERS] if protocol == "http/protobuf" else [["all"]]
        processes = [
            await _spawn(names, database_url, servers, subjects, otel) for names in commands
        ]
        # the gateway, from the same variables; the resource names the service
        gateway_otel = {
            **otel,
            "OTEL_RESOURCE_ATTRIBUTES": "service.name=gateway-a,deployment.environment=test",
        }
        try:
            async with traced_gateway(
                otel_env, gateway_otel, database_url, nc, subjects, pool_size=4
            ) as (gateway, provider):
                await eventually(lambda: _consumers(nc, subjects), within=60, what="five consumers")
                stream = RecordingStream()
                request = HelloRequest(
                    node_id="n1",
                    cert_serial="n1-serial",
                    role="worker",
                    boot_id="b1",
                    journal_id="j1",
                    capabilities=["gpu"],
                )
                await fleet.say_hello(gateway, request, stream)
                await eventually(lambda: _delivered(stream), within=30, what="the waiting command")
                assert [d.command_id for d in stream.delivered] == [command]
                with pytest.raises(Refused):  # a node never joined: a failed span
                    await fleet.say_hello(gateway, dataclasses.replace(request, node_id="ghost"))
                provider.force_flush()

                async def arrived() -> bool:
                    return _complete(receiver.spans())

                await eventually(arrived, within=30, what="every process's spans")
        finally:
            for process in processes:
                if process.returncode is None:
                    process.terminate()
                    await process.wait()

        spans = receiver.spans()
        [hello] = [s for s in spans if s.name == "Hello" and s.attributes["bc.node.id"] == "n1"]
        trace = [s for s in spans if s.trace_id == hello.trace_id]
        ids = {s.span_id for s in trace}
        assert [s for s in trace if s.parent_id and s.parent_id not in ids] == []  # no orphans
        assert [s.name for s in trace if not s.parent_id] == ["Hello"]
        assert hello.kind == "SERVER" and hello.service == "gateway-a"
        by_id = {s.span_id: s for s in trace}

        def parent(span: Received) -> Received:
            return by_id[span.parent_id]

        root = subjects.root
        assert [s.name for s in spans if not named_by_conventions(s)] == []
        [fact] = [s for s in trace if s.name == f"publish {root}.facts.{{gateway_id}}.hello"]
        assert fact.kind == "PRODUCER" and parent(fact) is hello
        assert fact.attributes["messaging.system"] == "nats"
        assert fact.attributes["messaging.operation.type"] == "send"
        assert fact.attributes["messaging.destination.name"] == subjects.fact("gw-a", "hello")
        assert fact.attributes["server.address"] == "127.0.0.1"
        gateway_sql = [s for s in trace if s.kind == "CLIENT" and parent(s) is hello]
        # the Hello transaction (its function, with the node's spec: migration 0063)
        assert "gateway_hello_desired" in {
            s.attributes.get("db.stored_procedure.name") for s in gateway_sql
        }
        processed = [s for s in trace if s.name == f"process {root}.facts.{{gateway_id}}.hello"]
        assert {s.attributes["messaging.consumer.group.name"] for s in processed} == HELLO_WORKERS
        assert all(s.kind == "CONSUMER" and parent(s) is fact for s in processed)
        if protocol == "http/protobuf":  # one process per worker, each its own service
            assert {s.service for s in processed} == {f"bcw-{w}" for w in HELLO_WORKERS}
        outcomes = {
            s.attributes["messaging.consumer.group.name"]: s.attributes["bcw.outcome"]
            for s in processed
        }
        # the quarantine saw the Hello and skipped it (no duplicate identity): its span says so
        assert outcomes == {
            "labeler": "applied",
            "liveness": "applied",
            "replay": "applied",
            "quarantine": "ignored",
        }
        for span in processed:
            # applied alone, its statements are its children; in a batch of several (the
            # consumer lingers for them), the batch span's, which its span links to
            batch = {span_id for _trace, span_id in span.links}
            statements = [
                s
                for s in spans
                if s.kind == "CLIENT" and (s.parent_id == span.span_id or s.parent_id in batch)
            ]
            inbox = span.attributes["messaging.consumer.group.name"] != "labeler"  # it has none
            if span.attributes["bcw.outcome"] == "applied" and inbox:
                assert ("INSERT", "processed_facts") in {
                    (s.attributes["db.operation.name"], s.attributes.get("db.collection.name"))
                    for s in statements
                }, span
            assert all(s.attributes["db.system.name"] == "postgresql" for s in statements)
        events = {s.name: s for s in trace if s.name.startswith(f"publish {root}.events.")}
        for event in ("node.connected", "node.capabilities-changed"):
            published = events[f"publish {root}.events.{event}"]
            assert published.kind == "PRODUCER" and parent(published) in processed
        [dispatch] = [s for s in trace if s.name == f"publish {root}.gw.{{gateway_id}}.dispatch"]
        assert parent(dispatch) is hello  # the dispatch loop continued the Hello's trace
        [receipt] = [s for s in trace if s.name == f"process {root}.gw.{{gateway_id}}.dispatch"]
        assert receipt.kind == "CONSUMER" and parent(receipt) is dispatch
        assert receipt.service == "gateway-a"
        [deliver] = [s for s in trace if s.name == "deliver daemon.{node_id}"]
        assert parent(deliver) is receipt and deliver.kind == "PRODUCER"
        assert deliver.attributes["messaging.destination.name"] == "daemon.n1"
        assert deliver.attributes["messaging.message.id"] == str(command)
        assert deliver.attributes["bc.command.kind"] == "noop"
        # every producer span carries the messaging attributes
        for producer in (s for s in spans if s.kind == "PRODUCER"):
            assert {
                "messaging.system",
                "messaging.destination.name",
                "messaging.operation.type",
            } <= producer.attributes.keys(), producer
            assert producer.attributes["messaging.operation.type"] == "send"
            assert "messaging.message.id" in producer.attributes, producer
        # the refused Hello: its span failed, and says why
        [ghost] = [s for s in spans if s.name == "Hello" and s.attributes["bc.node.id"] == "ghost"]
        assert ghost.status == "ERROR" and ghost.attributes["error.type"] == "PERMISSION_DENIED"
        assert all("error.type" in s.attributes for s in spans if s.status == "ERROR")

        # every event and notice about the node carries the Hello's trace on the wire
        js = nc.jetstream()
        published = await stream_messages(js, subjects.events_stream)
        published += await stream_messages(js, subjects.gateway_stream)
        about = [m for m in published if _node(m.data) == "n1"]
        assert len(about) >= 3
        assert all(hello.trace_id in m.headers["traceparent"] for m in about)


def named_by_conventions(span: Received) -> bool:
    """A span named as the OpenTelemetry conventions say for its kind: a database call by
    its query summary, a messaging span by its operation and destination template."""
    a = span.attributes
    if span.kind == "CLIENT":
        return span.name == a.get("db.query.summary") and a.get("db.system.name") == "postgresql"
    if span.kind in ("PRODUCER", "CONSUMER"):
        template = a.get("messaging.destination.template")
        operation = a.get("messaging.operation.name")
        return span.name == (f"{operation} {template}" if template else operation)
    if span.kind == "SERVER":
        return span.name == "Hello"  # the gateway's RPC
    return span.name == "liveness sweep"


async def _spawn(
    names: list[str], database_url: str, servers: Servers, subjects: Subjects, otel: dict[str, str]
) -> asyncio.subprocess.Process:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
        "BCW_DATABASE_URL": database_url,
        "BCW_NATS_URL": servers.nats_url,
        "BCW_SUBJECT_ROOT": subjects.root,
        "BCW_HEALTH_PORT": "0",
        "BCW_REPLAY_DISPATCH_INTERVAL": "0.2",
        **otel,
    }
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "workers.cli",
        "run",
        *names,
        env=env,
        cwd=ROOT,
        stderr=asyncio.subprocess.DEVNULL,
    )


async def _consumers(nc: NATS, subjects: Subjects) -> bool:
    js = nc.jetstream()
    try:
        for name in WORKERS:
            await js.consumer_info(subjects.facts_stream, name)
    except Exception:
        return False
    return True


async def _delivered(stream: RecordingStream) -> bool:
    return bool(stream.delivered)


def _complete(spans: list[Received]) -> bool:
    """Every process has exported its part of the Hello's trace."""
    names = {s.name for s in spans}
    groups = {
        s.attributes.get("messaging.consumer.group.name")
        for s in spans
        if s.name.startswith("process ") and s.name.endswith(".hello")
    }
    return (
        groups >= HELLO_WORKERS
        and "deliver daemon.{node_id}" in names
        and any(n.endswith("events.node.connected") for n in names)
        and any(n.endswith("events.node.capabilities-changed") for n in names)
        and any(n.startswith("publish ") and n.endswith(".dispatch") for n in names)
    )


def _node(data: bytes) -> str | None:
    body = json.loads(data)
    return body.get("nodeId") or body.get("node_id")
