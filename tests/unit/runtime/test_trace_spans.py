"""The spans the runtime makes, read from an in-memory exporter: a batch's span and its
links both ways, `error.type` on a failure, the producer attributes of a delivery."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import asyncpg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from workers.runtime.observability import sql, tracing


@dataclass
class FakeMsg:
    """What `batch_span` reads of a message: its subject and headers."""

    subject: str
    headers: dict[str, str] = field(default_factory=dict)


@pytest.fixture
def spans() -> tuple[trace.Tracer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("t"), exporter


def _named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def test_a_batch_s_statements_are_one_click_from_each_message(
    spans: tuple[trace.Tracer, InMemorySpanExporter],
) -> None:
    tracer, exporter = spans
    producers, consumers, messages = [], [], []  # type: list[trace.Span], list[trace.Span], list[Any]
    for n in range(3):  # three Hellos, three traces
        with tracer.start_as_current_span(f"publish {n}", kind=trace.SpanKind.PRODUCER) as p:
            headers = tracing.inject({})
        producers.append(p)
        msg = FakeMsg(f"bc.facts.gw-{n}.hello", headers)
        messages.append(msg)
        consumers.append(tracer.start_span("process", context=tracing.extract(headers)))
    with (
        tracing.batch_span(tracer, "liveness", consumers, messages),
        tracer.start_as_current_span("INSERT processed_facts", kind=trace.SpanKind.CLIENT),
    ):
        pass
    for span in consumers:
        span.end()
    [batch] = _named(exporter, "process bc.facts.{gateway_id}.hello")
    [statement] = _named(exporter, "INSERT processed_facts")
    assert statement.parent is not None and statement.parent.span_id == batch.context.span_id
    assert batch.kind is trace.SpanKind.CONSUMER
    assert batch.attributes is not None
    assert batch.attributes["messaging.batch.message_count"] == 3
    assert batch.attributes["messaging.operation.type"] == "process"
    assert batch.attributes["messaging.consumer.group.name"] == "liveness"
    # the conventions' batch receiving: a link to each message's creation context
    assert [link.context.span_id for link in batch.links] == [
        p.get_span_context().span_id for p in producers
    ]
    # and each message's span, in its Hello's trace, links to the batch (one click)
    finished = {s.context.span_id: s for s in exporter.get_finished_spans()}
    for span in consumers:
        ended = finished[span.get_span_context().span_id]
        assert ended.context.trace_id != batch.context.trace_id
        assert [link.context.span_id for link in ended.links] == [batch.context.span_id]


def test_one_message_s_statements_are_its_span_s_children(
    spans: tuple[trace.Tracer, InMemorySpanExporter],
) -> None:
    tracer, exporter = spans
    consumer = tracer.start_span("process")
    one: list[Any] = [FakeMsg("bc.facts.g.hello")]
    with (
        tracing.batch_span(tracer, "labeler", [consumer], one),
        tracer.start_as_current_span("SELECT nodes"),
    ):
        pass
    consumer.end()
    [statement] = _named(exporter, "SELECT nodes")
    assert statement.parent is not None
    assert statement.parent.span_id == consumer.get_span_context().span_id


def test_a_failed_batch_says_its_error_type(
    spans: tuple[trace.Tracer, InMemorySpanExporter],
) -> None:
    tracer, exporter = spans
    consumers = [tracer.start_span("process"), tracer.start_span("process")]
    messages: list[Any] = [FakeMsg("bc.facts.a.hello"), FakeMsg("bc.facts.b.closed")]
    with pytest.raises(TimeoutError), tracing.batch_span(tracer, "replay", consumers, messages):
        raise TimeoutError("statement timeout")
    [batch] = _named(exporter, "process")  # two destinations: the operation alone
    assert batch.status.status_code is trace.StatusCode.ERROR
    assert batch.attributes is not None and batch.attributes["error.type"] == "TimeoutError"


def test_active_marks_a_failure_once_and_keeps_a_named_one(
    spans: tuple[trace.Tracer, InMemorySpanExporter],
) -> None:
    tracer, exporter = spans
    with pytest.raises(KeyError), tracing.active(tracer.start_span("a"), end=True):
        raise KeyError("x")
    with pytest.raises(ValueError), tracing.active(tracer.start_span("b"), end=True) as span:
        tracing.failed(span, "RESOURCE_EXHAUSTED", "too many Hellos")
        raise ValueError("refused")
    with tracing.active(tracer.start_span("c"), end=True):
        pass
    [a], [b], [c] = (_named(exporter, n) for n in "abc")
    assert a.attributes is not None and a.attributes["error.type"] == "KeyError"
    assert b.attributes is not None and b.attributes["error.type"] == "RESOURCE_EXHAUSTED"
    assert b.status.description == "too many Hellos"
    assert c.attributes is not None and "error.type" not in c.attributes
    assert c.status.status_code is trace.StatusCode.UNSET


def test_a_delivery_is_a_producer_span_with_the_messaging_attributes(
    spans: tuple[trace.Tracer, InMemorySpanExporter],
) -> None:
    tracer, exporter = spans
    tracing.start_delivery_span(tracer, "n1", "c-1").end()
    [span] = _named(exporter, "deliver daemon.{node_id}")
    assert span.kind is trace.SpanKind.PRODUCER
    assert span.attributes is not None
    assert {
        k: span.attributes[k]
        for k in (
            "messaging.system",
            "messaging.operation.type",
            "messaging.destination.name",
            "messaging.message.id",
        )
    } == {
        "messaging.system": "bc.daemon_stream",
        "messaging.operation.type": "send",
        "messaging.destination.name": "daemon.n1",
        "messaging.message.id": "c-1",
    }


@pytest.mark.parametrize("query_text", [False, True])
def test_a_statement_s_span_and_its_text_only_when_asked(
    spans: tuple[trace.Tracer, InMemorySpanExporter], query_text: bool
) -> None:
    tracer, exporter = spans
    logger = sql.SqlSpans(tracer, query_text)
    query = "INSERT INTO node_labels (k) VALUES ($1) ON CONFLICT (k) DO UPDATE SET v = $2"
    failure = asyncpg.exceptions.UniqueViolationError("duplicate key")
    with tracer.start_as_current_span("process"):
        logger(
            SimpleNamespace(
                query=query,
                elapsed=0.002,
                conn_addr=("db", 5432),
                conn_params=SimpleNamespace(database="bc"),
                exception=None,
            )
        )
        logger(
            SimpleNamespace(
                query="SELECT 1 FROM nodes",
                elapsed=0.001,
                conn_addr=None,
                conn_params=None,
                exception=failure,
            )
        )
    logger(
        SimpleNamespace(
            query="SELECT 1", elapsed=0.0, conn_addr=None, conn_params=None, exception=None
        )
    )  # outside a span: none
    [upsert] = _named(exporter, "INSERT node_labels")
    assert upsert.kind is trace.SpanKind.CLIENT and upsert.attributes is not None
    assert upsert.attributes["db.collection.name"] == "node_labels"
    assert upsert.attributes["db.query.summary"] == "INSERT node_labels"
    assert upsert.attributes["server.address"] == "db" and upsert.attributes["db.namespace"] == "bc"
    assert upsert.attributes.get("db.query.text") == (query if query_text else None)
    [failed] = _named(exporter, "SELECT nodes")
    assert failed.status.status_code is trace.StatusCode.ERROR and failed.attributes is not None
    assert (
        failed.attributes["error.type"] == failed.attributes["db.response.status_code"] == "23505"
    )
    assert len(exporter.get_finished_spans()) == 3  # the two statements and their parent
