"""OpenTelemetry at the boundary: the tracer provider, the trace context in message
headers (W3C, and the formats `OTEL_PROPAGATORS` adds), and the messaging spans.

The entry point builds the provider from the standard `OTEL_*` variables (checked by
`otel_env`); tests inject their own (an in-memory exporter). Decisions never open spans;
only the consumer loop, the outbox relay, the sweeps and the publishers here do. SQL
spans: `sql`.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator, Mapping
from typing import Any

from nats.aio.msg import Msg
from opentelemetry import trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from schemas.subjects import split_gateway_subject
from workers.runtime.base.errors import SettingError
from workers.runtime.base.release import release
from workers.runtime.observability import otel_env

TRACER_NAME = "bc-workers"
MESSAGING_SYSTEM = "nats"  # not a registered value yet: a custom one, as the conventions allow


def build_provider(service_name: str) -> trace.TracerProvider:
    """A provider configured from the standard `OTEL_*` variables (`otel_env.check`
    first: a bad value is a SettingError naming it).

    - `OTEL_SDK_DISABLED=true`, `OTEL_TRACES_EXPORTER=none`, or only `otlp` without an
      endpoint (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`): a
      no-op provider, which still carries a producer's context on to what a fact
      publishes, at no cost per fact.
    - Each exporter `OTEL_TRACES_EXPORTER` lists (`otlp,console`): `console` prints spans
      to stdout; `otlp` sends them over `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` or
      `OTEL_EXPORTER_OTLP_PROTOCOL`: `http/protobuf` (the default) or `grpc`. The exporter
      itself reads the endpoint, headers, timeout and certificates (`OTEL_EXPORTER_OTLP_*`,
      per signal or not).

    The resource comes from `OTEL_RESOURCE_ATTRIBUTES` and `OTEL_SERVICE_NAME`;
    `service_name` (`bcw-<worker>`) is the default only when neither names the service.
    The sampler is the SDK's, from `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG`
    (default: every trace the producer sampled, and every new one).
    """
    env = os.environ
    otel_env.check(env)
    names = otel_env.exporters(env)
    protocol_variable, protocol = otel_env.protocol(env)
    endpoint = otel_env.endpoint(env)
    if "otlp" in names and not endpoint:
        names = tuple(n for n in names if n != "otlp")
    if otel_env.disabled(env) or not names:
        return trace.NoOpTracerProvider()
    provider = TracerProvider(resource=resource(service_name))
    for name in names:
        exporter: SpanExporter
        if name == "console":
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


_W3C = TraceContextTextMapPropagator()


@functools.cache
def _propagator(value: str) -> tuple[TextMapPropagator, frozenset[str]]:
    """The propagator `OTEL_PROPAGATORS=value` asks for, and its fields (once per value:
    every fact passes here)."""
    chosen: list[TextMapPropagator] = []
    for name in otel_env.carried({"OTEL_PROPAGATORS": value}):
        if name == "tracecontext":
            chosen.append(_W3C)
        elif name == "baggage":
            chosen.append(W3CBaggagePropagator())
        elif name == "b3":
            from opentelemetry.propagators.b3 import B3SingleFormat

            chosen.append(B3SingleFormat())
        elif name == "b3multi":
            from opentelemetry.propagators.b3 import B3MultiFormat

            chosen.append(B3MultiFormat())
        elif name == "jaeger":
            from opentelemetry.propagators.jaeger import JaegerPropagator

            chosen.append(JaegerPropagator())
    composite = CompositePropagator(chosen)
    return composite, frozenset(composite.fields)


def propagator() -> TextMapPropagator:
    """The process's propagator, from `OTEL_PROPAGATORS` (`otel_env.propagators`): W3C
    `traceparent` always (the messages' contract), then each format named (`b3`,
    `b3multi`, `jaeger`, `baggage`); `none`: none. Built here, never by
    `opentelemetry.propagate`, whose import fails on a name it cannot load."""
    return _propagator(os.environ.get("OTEL_PROPAGATORS", ""))[0]


def inject(headers: dict[str, str], context: Context | None = None) -> dict[str, str]:
    """Add the trace context of `context` (default: the current one) to `headers`, in
    the formats of `propagator()`."""
    if trace.get_current_span(context).get_span_context().is_valid:
        propagator().inject(headers, context=context)
    return headers


def extract(headers: Mapping[str, str] | None) -> Context | None:
    """The context `headers` carry in any format of `propagator()`, None without one."""
    if not headers:
        return None
    chosen, fields = _propagator(os.environ.get("OTEL_PROPAGATORS", ""))
    if not any(field in headers for field in fields):
        return None
    return chosen.extract(dict(headers))


def tracer(provider: trace.TracerProvider) -> trace.Tracer:
    return provider.get_tracer(TRACER_NAME)


def traceparent(context: Context | None) -> str | None:
    """The W3C traceparent of `context` (stored with work that waits), None without one."""
    if context is None or not trace.get_current_span(context).get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _W3C.inject(carrier, context=context)
    return carrier.get("traceparent")


def from_traceparent(value: str | None) -> Context | None:
    """The context a stored traceparent names (None: none stored)."""
    return _W3C.extract({"traceparent": value}) if value else None


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


#: the reference gateway's delivery of a command onto a daemon's session stream (not NATS)
DAEMON_SYSTEM = "bc.daemon_stream"
DAEMON_TEMPLATE = "daemon.{node_id}"


def start_delivery_span(tracer: trace.Tracer, node_id: str, command_id: str) -> trace.Span:
    """A PRODUCER span `deliver daemon.{node_id}` for a command sent down a daemon's
    stream, with the messaging attributes every producer span has (`messaging.system`
    `bc.daemon_stream`, the node's stream as the destination, the command as the message)."""
    span = tracer.start_span(f"deliver {DAEMON_TEMPLATE}", kind=trace.SpanKind.PRODUCER)
    if span.is_recording():
        span.set_attributes(
            {
                "messaging.system": DAEMON_SYSTEM,
                "messaging.operation.name": "deliver",
                "messaging.operation.type": "send",
                "messaging.destination.name": DAEMON_TEMPLATE.format(node_id=node_id),
                "messaging.destination.template": DAEMON_TEMPLATE,
                "messaging.message.id": command_id,
                "bc.node.id": node_id,
            }
        )
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
    tracer: trace.Tracer, group: str, spans: list[trace.Span], messages: list[Msg]
) -> contextlib.AbstractContextManager[object]:
    """The span a batch's statements belong to: its one message's; for several, a
    CONSUMER span `process <template>` of the batch (the messaging conventions' batch
    receiving), linked to each message's creation context (`messages`' headers), and
    linked from each message's span (`spans`): from a Hello's trace, its fact's span
    leads to the statements that applied it in one click. None untraced."""
    if not spans:
        return contextlib.nullcontext()
    if len(spans) == 1:
        return trace.use_span(spans[0], end_on_exit=False)
    return _batch(tracer, group, spans, messages)


@contextlib.contextmanager
def _batch(
    tracer: trace.Tracer, group: str, spans: list[trace.Span], messages: list[Msg]
) -> Iterator[trace.Span]:
    templates = {destination_template(m.subject) for m in messages}
    subjects = {m.subject for m in messages}
    links = []
    for msg in messages:
        created = extract(msg.headers)
        span_context = trace.get_current_span(created).get_span_context()
        if created is not None and span_context.is_valid:
            links.append(trace.Link(span_context))
    attributes: dict[str, Any] = {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.operation.name": "process",
        "messaging.operation.type": "process",
        "messaging.batch.message_count": len(spans),
        "messaging.consumer.group.name": group,
    }
    if len(subjects) == 1:
        attributes["messaging.destination.name"] = next(iter(subjects))
    if len(templates) == 1:
        attributes["messaging.destination.template"] = next(iter(templates))
    name = f"process {next(iter(templates))}" if len(templates) == 1 else "process"
    with tracer.start_as_current_span(
        name, kind=trace.SpanKind.CONSUMER, links=links, attributes=attributes
    ) as batch:
        for span in spans:  # each message's span leads to the batch's statements
            span.add_link(batch.get_span_context(), {"messaging.batch.message_count": len(spans)})
        try:
            yield batch
        except BaseException as error:
            failed(batch, error)
            raise


@contextlib.contextmanager
def active(span: trace.Span, end: bool = False) -> Iterator[trace.Span]:
    """`span` current (`trace.use_span`), ended on leaving when `end`; an exception
    through it marks it failed (`failed`: `error.type` too, which `use_span` omits),
    unless the code inside already did (a refusal names its own `error.type`)."""
    with trace.use_span(
        span, end_on_exit=end, record_exception=False, set_status_on_exception=False
    ):
        try:
            yield span
        except Exception as error:
            if "error.type" not in (getattr(span, "attributes", None) or {}):  # else said
                failed(span, error)
            raise


def failed(span: trace.Span, error: BaseException | str, description: str | None = None) -> None:
    """Mark `span` failed as the conventions say: status ERROR and `error.type` (an
    exception's class name, or the low-cardinality cause given), the exception recorded."""
    if isinstance(error, BaseException):
        span.record_exception(error)
        kind = type(error).__qualname__
        description = description or f"{kind}: {error}"
    else:
        kind = error
    span.set_attribute("error.type", kind)
    span.set_status(trace.StatusCode.ERROR, description)
