"""OpenTelemetry at the boundary: the tracer provider, and W3C context in message headers.

The entry point builds the provider from the standard `OTEL_*` variables; tests inject
their own (an in-memory exporter). Decisions never open spans; only the consumer loop,
the outbox relay and the publishers here do.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from nats.aio.msg import Msg
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

TRACER_NAME = "bc-workers"
MESSAGING_SYSTEM = "nats"  # not a registered value yet: a custom one, as the conventions allow


def build_provider(service_name: str) -> trace.TracerProvider:
    """A provider configured from `OTEL_*`: the SDK exporting over OTLP/HTTP when an endpoint
    is set (or to the console with `OTEL_TRACES_EXPORTER=console`), else a no-op one.

    `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES` win over `service_name`. A no-op
    provider still carries the producer's `traceparent` on to what a fact publishes, at no
    cost per fact.
    """
    exporter_name = os.environ.get("OTEL_TRACES_EXPORTER", "otlp")
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    )
    disabled = os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true"
    if disabled or exporter_name == "none" or (exporter_name == "otlp" and not endpoint):
        return trace.NoOpTracerProvider()
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service_name)})
    provider = TracerProvider(resource=resource)
    if exporter_name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


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


def start_consumer_span(
    tracer: trace.Tracer, msg: Msg, fact_type: str, fact_id: str, group: str
) -> trace.Span:
    """A fact's CONSUMER span, child of the producer's context carried in its headers,
    with the messaging attributes (named by fact type: low cardinality)."""
    meta = msg.metadata
    return tracer.start_span(
        f"{fact_type} process",
        context=extract(msg.headers),
        kind=trace.SpanKind.CONSUMER,
        attributes={
            "messaging.system": MESSAGING_SYSTEM,
            "messaging.operation.type": "process",
            "messaging.destination.name": msg.subject,
            "messaging.consumer.group.name": group,
            "messaging.message.id": fact_id,
            "messaging.nats.stream.sequence": meta.sequence.stream,
            "messaging.nats.delivery_count": meta.num_delivered or 1,
        },
    )
