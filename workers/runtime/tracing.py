"""OpenTelemetry at the boundary: the tracer provider, and W3C context in message headers.

The entry point builds the provider from the standard `OTEL_*` variables; tests inject
their own (an in-memory exporter). Decisions never open spans; only the consumer loop,
the outbox relay and the publishers here do.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

TRACER_NAME = "bc-workers"
MESSAGING_SYSTEM = "nats"  # not a registered value yet: a custom one, as the conventions allow


def build_provider(service_name: str) -> TracerProvider:
    """A provider configured from `OTEL_*`; exports over OTLP/HTTP only when an endpoint is set.

    `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES` win over `service_name`. Without an
    endpoint, spans are still made (so `traceparent` propagates) but not exported.
    """
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service_name)})
    provider = TracerProvider(resource=resource)
    exporter_name = os.environ.get("OTEL_TRACES_EXPORTER", "otlp")
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    )
    if (
        os.environ.get("OTEL_SDK_DISABLED", "").lower() != "true"
        and exporter_name == "otlp"
        and endpoint
    ):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    elif exporter_name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    return provider


def inject(headers: dict[str, str], context: Context | None = None) -> dict[str, str]:
    """Add `traceparent`/`tracestate` of `context` (default: the current one) to `headers`."""
    propagate.inject(headers, context=context)
    return headers


def extract(headers: Mapping[str, str] | None) -> Context:
    return propagate.extract(dict(headers or {}))


def tracer(provider: trace.TracerProvider) -> trace.Tracer:
    return provider.get_tracer(TRACER_NAME)
