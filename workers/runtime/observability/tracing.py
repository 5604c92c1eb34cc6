"""OpenTelemetry at the boundary: the tracer provider, and W3C context in message headers.

The entry point builds the provider from the standard `OTEL_*` variables; tests inject
their own (an in-memory exporter). Decisions never open spans; only the consumer loop,
the outbox relay and the publishers here do.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import time
from collections.abc import Mapping
from typing import Any

from nats.aio.msg import Msg
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

from schemas.subjects import split_gateway_subject
from workers.runtime.base.errors import SettingError
from workers.runtime.base.release import release

TRACER_NAME = "bc-workers"
MESSAGING_SYSTEM = "nats"  # not a registered value yet: a custom one, as the conventions allow


PROTOCOLS = ("http/protobuf", "grpc")
#: `OTEL_TRACES_SAMPLER` values the SDK knows, and those that read a ratio from
#: `OTEL_TRACES_SAMPLER_ARG`
SAMPLERS = (
    "always_on", "always_off", "traceidratio",
    "parentbased_always_on", "parentbased_always_off", "parentbased_traceidratio",
)  # fmt: skip
RATIO_SAMPLERS = ("traceidratio", "parentbased_traceidratio")


def check_sampler(env: Mapping[str, str]) -> None:
    """The sampler variables as the SDK reads them, refused by name where the SDK would
    only warn and fall back (to sampling everything). Pure."""
    sampler = env.get("OTEL_TRACES_SAMPLER", "parentbased_always_on").strip().lower()
    if sampler not in SAMPLERS:
        raise SettingError(
            "OTEL_TRACES_SAMPLER", f"{sampler!r} is not one of {', '.join(SAMPLERS)}"
        )
    if sampler in RATIO_SAMPLERS and "OTEL_TRACES_SAMPLER_ARG" in env:
        text = env["OTEL_TRACES_SAMPLER_ARG"].strip()
        try:
            ratio = float(text)
        except ValueError:
            ratio = -1.0
        if not 0.0 <= ratio <= 1.0:
            raise SettingError(
                "OTEL_TRACES_SAMPLER_ARG",
                f"{text!r} is not a ratio from 0 to 1 (0.1: one trace in ten)",
            )


def build_provider(service_name: str) -> trace.TracerProvider:
    """A provider configured from the standard `OTEL_*` variables.

    - `OTEL_SDK_DISABLED=true`, `OTEL_TRACES_EXPORTER=none`, or no OTLP endpoint
      (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`): a no-op
      provider, which still carries a producer's `traceparent` on to what a fact publishes,
      at no cost per fact.
    - `OTEL_TRACES_EXPORTER=console`: spans printed to stdout.
    - Otherwise OTLP over `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` or
      `OTEL_EXPORTER_OTLP_PROTOCOL`: `http/protobuf` (the default) or `grpc`. The exporter
      itself reads the endpoint, headers, timeout and certificates (`OTEL_EXPORTER_OTLP_*`,
      per signal or not).

    The resource comes from `OTEL_RESOURCE_ATTRIBUTES` and `OTEL_SERVICE_NAME`;
    `service_name` (`bcw-<worker>`) is the default only when neither names the service.
    The sampler is the SDK's, from `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG`
    (default: every trace the producer sampled, and every new one).
    A protocol, exporter or sampler that is not supported is a SettingError naming the
    variable.
    """
    env = os.environ
    exporter_name = env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if exporter_name not in ("otlp", "console", "none"):
        raise SettingError(
            "OTEL_TRACES_EXPORTER", f"{exporter_name!r} is not otlp, console or none"
        )
    protocol_variable = (
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
        if env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        else "OTEL_EXPORTER_OTLP_PROTOCOL"
    )
    protocol = env.get(protocol_variable, "http/protobuf").strip().lower() or "http/protobuf"
    if protocol not in PROTOCOLS:
        raise SettingError(protocol_variable, f"{protocol!r} is not one of {', '.join(PROTOCOLS)}")
    check_sampler(env)
    disabled = env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
    if disabled or exporter_name == "none" or (exporter_name == "otlp" and not endpoint):
        return trace.NoOpTracerProvider()
    provider = TracerProvider(resource=resource(service_name))
    exporter: SpanExporter
    if exporter_name == "console":
        exporter = ConsoleSpanExporter()
    elif protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcExporter,
            )
        except ImportError:  # an extra: grpcio is large, and HTTP is the default
            raise SettingError(
                protocol_variable,
                "grpc needs the gRPC exporter: pip install 'bc-workers[grpc]' "
                "(or use http/protobuf, the default)",
            ) from None
        exporter = GrpcExporter()
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpExporter,
        )

        exporter = HttpExporter()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def resource(default_service_name: str) -> Resource:
    """The process's resource: `OTEL_RESOURCE_ATTRIBUTES` and `OTEL_SERVICE_NAME` (read by
    the SDK), with `default_service_name` only where they name no service, and
    `service.version` the running release's unless they name one."""
    detected = Resource.create({})
    if SERVICE_VERSION not in detected.attributes:  # the running release, unless told
        detected = detected.merge(Resource({SERVICE_VERSION: release()}))
    if str(detected.attributes.get(SERVICE_NAME, "unknown_service")).startswith("unknown_service"):
        return detected.merge(Resource({SERVICE_NAME: default_service_name}))
    return detected


def is_recording(tracer: trace.Tracer) -> bool:
    """False for a no-op tracer: the consume loop then skips building span attributes."""
    return not isinstance(tracer, trace.NoOpTracer)


def inject(headers: dict[str, str], context: Context | None = None) -> dict[str, str]:
    """Add `traceparent`/`tracestate` of `context` (default: the current one) to `headers`."""
    if trace.get_current_span(context).get_span_context().is_valid:
        propagate.inject(headers, context=context)
    return headers


def extract(headers: Mapping[str, str] | None) -> Context | None:
    if not headers or "traceparent" not in headers:
        return None
    return propagate.extract(dict(headers))


def tracer(provider: trace.TracerProvider) -> trace.Tracer:
    return provider.get_tracer(TRACER_NAME)


def traceparent(context: Context | None) -> str | None:
    """The W3C traceparent of `context` (stored with work that waits), None without one."""
    if context is None:
        return None
    carrier = inject({}, context)
    return carrier.get("traceparent")


def from_traceparent(value: str | None) -> Context | None:
    """The context a stored traceparent names (None: none stored)."""
    return extract({"traceparent": value}) if value else None


def trace_id(context: Context | None) -> str | None:
    """32 hex digits of the trace `context` belongs to, None without a valid one."""
    if context is None:  # not the span current here: the caller has no cause to name
        return None
    span = trace.get_current_span(context).get_span_context()
    return trace.format_trace_id(span.trace_id) if span.is_valid else None


# -- messaging spans (OpenTelemetry messaging conventions) ------------------------------
def destination_template(subject: str) -> str:
    """The subject with its variable part named, for span names (low cardinality):
    `bc.facts.gw-1.hello` → `bc.facts.{gateway_id}.hello`, `bc.gw.gw-1.dispatch` →
    `bc.gw.{gateway_id}.dispatch`; events and revocations are their own template."""
    split = split_gateway_subject(subject)
    if split is None:
        return subject
    kind, _gateway, type_ = split
    return f"{subject.rsplit('.', 3)[0]}.{kind}.{{gateway_id}}.{type_}"


def server_attributes(nc: Any) -> dict[str, Any]:
    """`server.address` and `server.port` of the NATS server client `nc` is connected to."""
    url = getattr(nc, "connected_url", None)
    found: dict[str, Any] = {}
    if url is None:
        return found
    if url.hostname:
        found["server.address"] = url.hostname
    if url.port:
        found["server.port"] = url.port
    return found


def messaging_attributes(
    operation: str, subject: str, message_id: str | None, nc: Any
) -> dict[str, Any]:
    """The attributes every messaging span has; `operation` is `publish` (type `send`),
    `process` or `receive`."""
    attributes: dict[str, Any] = {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.operation.name": operation,
        "messaging.operation.type": "send" if operation == "publish" else operation,
        "messaging.destination.name": subject,
        "messaging.destination.template": destination_template(subject),
        **server_attributes(nc),
    }
    if message_id:
        attributes["messaging.message.id"] = message_id
    return attributes


def start_producer_span(
    tracer: trace.Tracer,
    subject: str,
    message_id: str | None,
    nc: Any,
    context: Context | None = None,
) -> trace.Span:
    """A PRODUCER span `publish <template>` for one message; its context goes in the
    message's headers (`inject`). Its attributes are built only when the sampler kept it
    (the samplers of the SDK decide without them)."""
    span = tracer.start_span(
        f"publish {destination_template(subject)}", context=context, kind=trace.SpanKind.PRODUCER
    )
    if span.is_recording():
        span.set_attributes(messaging_attributes("publish", subject, message_id, nc))
    return span


def start_consumer_span(
    tracer: trace.Tracer,
    msg: Msg,
    message_id: str | None,
    group: str,
    nc: Any = None,
    fact_type: str | None = None,
) -> trace.Span:
    """A message's CONSUMER span `process <template>`, child of the producer's context
    carried in its headers; its attributes built only when the sampler kept it."""
    span = tracer.start_span(
        f"process {destination_template(msg.subject)}",
        context=extract(msg.headers),
        kind=trace.SpanKind.CONSUMER,
    )
    if not span.is_recording():
        return span
    attributes = messaging_attributes("process", msg.subject, message_id, nc)
    attributes["messaging.consumer.group.name"] = group
    if fact_type:
        attributes["bcw.fact.type"] = fact_type
    try:
        meta = msg.metadata
        attributes["messaging.nats.stream.sequence"] = meta.sequence.stream
        attributes["messaging.nats.delivery_count"] = meta.num_delivered or 1
    except Exception:  # not a JetStream message
        pass
    span.set_attributes(attributes)
    return span


def batch_span(
    tracer: trace.Tracer, group: str, spans: list[trace.Span]
) -> contextlib.AbstractContextManager[object]:
    """The span a batch's statements belong to: its one fact's; for several facts a span
    of the batch, linked to each fact's (a statement serves them all); none untraced."""
    if not spans:
        return contextlib.nullcontext()
    if len(spans) == 1:
        return trace.use_span(spans[0], end_on_exit=False)
    return tracer.start_as_current_span(
        f"process {group} batch",
        kind=trace.SpanKind.INTERNAL,
        links=[trace.Link(span.get_span_context()) for span in spans],
        attributes={
            "messaging.batch.message_count": len(spans),
            "messaging.consumer.group.name": group,
        },
    )


# -- database spans (OpenTelemetry database conventions) ---------------------------------
_IDENT = r"([a-z_][a-z0-9_]*)"
_WRITES = re.compile(
    rf"\b(?:INSERT\s+INTO\s+{_IDENT}|UPDATE\s+{_IDENT}|DELETE\s+FROM\s+{_IDENT})", re.IGNORECASE
)
_READ = re.compile(rf"\b(?:FROM|JOIN)\s+{_IDENT}", re.IGNORECASE)
_NOT_TABLES = {"unnest", "lateral", "only", "select", "generate_series"}


@functools.lru_cache(maxsize=512)
def summarize(query: str) -> tuple[str, str | None]:
    """(operation, table) of a statement, for a span name such as `UPDATE node_sessions`:
    a statement that writes is named by its last write (the one a `WITH` ends in), one
    that reads by its first table. Never a value. Pure."""
    words = query.split(None, 1)
    first = words[0].upper().rstrip(";") if words else "QUERY"
    writes = [
        (
            "INSERT" if m.group(1) else "UPDATE" if m.group(2) else "DELETE",
            m.group(m.lastindex or 1),
        )
        for m in _WRITES.finditer(query)
    ]
    if first in ("INSERT", "UPDATE", "DELETE", "WITH") and writes:
        return writes[-1]
    if first in ("SELECT", "WITH"):
        tables = [t for t in _READ.findall(query) if t.lower() not in _NOT_TABLES]
        return "SELECT", tables[0] if tables else None
    return first, None


class SqlSpans:
    """An asyncpg query logger that turns each statement run inside a recording span into
    a CLIENT span: `<operation> <table>`, `db.system.name=postgresql`, the operation and
    table, the server, the error; no parameters, no query text. Statements outside a
    span (idle loops) make none. Installed on every connection of a pool (`install`)."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self._tracer = tracer

    async def install(self, conn: Any) -> None:
        conn.add_query_logger(self)

    def __call__(self, record: Any) -> None:
        parent = trace.get_current_span()
        if not parent.is_recording():
            return
        end = time.time_ns()
        operation, table = summarize(record.query)
        attributes: dict[str, Any] = {
            "db.system.name": "postgresql",
            "db.operation.name": operation,
        }
        if table:
            attributes["db.collection.name"] = table
        address = record.conn_addr
        if isinstance(address, tuple) and len(address) >= 2:
            attributes["server.address"], attributes["server.port"] = address[0], address[1]
        database = getattr(record.conn_params, "database", None)
        if database:
            attributes["db.namespace"] = database
        span = self._tracer.start_span(
            f"{operation} {table}" if table else operation,
            kind=trace.SpanKind.CLIENT,
            start_time=end - int(record.elapsed * 1e9),
            attributes=attributes,
        )
        if record.exception is not None:
            span.record_exception(record.exception)
            span.set_status(trace.StatusCode.ERROR, type(record.exception).__name__)
            sqlstate = getattr(record.exception, "sqlstate", None)
            if sqlstate:
                span.set_attribute("db.response.status_code", sqlstate)
        span.end(end_time=end)
