"""Tracing's pure parts and its configuration from the standard OTEL_* variables."""

from __future__ import annotations

import json
import logging
import os
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http
from opentelemetry.sdk.trace import TracerProvider

from workers.replay.dispatch import Waited, dispatch_cause
from workers.runtime.base.errors import SettingError
from workers.runtime.observability import tracing
from workers.runtime.observability.logs import JsonFormatter


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    return monkeypatch


def exporter_of(provider: trace.TracerProvider) -> Any:
    assert isinstance(provider, TracerProvider)
    [processor] = provider._active_span_processor._span_processors
    return processor.span_exporter  # type: ignore[attr-defined]


def test_no_endpoint_or_disabled_is_a_no_op_provider(env: pytest.MonkeyPatch) -> None:
    assert isinstance(tracing.build_provider("bcw-x"), trace.NoOpTracerProvider)
    env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    env.setenv("OTEL_SDK_DISABLED", "true")
    assert isinstance(tracing.build_provider("bcw-x"), trace.NoOpTracerProvider)
    env.setenv("OTEL_SDK_DISABLED", "false")
    env.setenv("OTEL_TRACES_EXPORTER", "none")
    assert isinstance(tracing.build_provider("bcw-x"), trace.NoOpTracerProvider)


@pytest.mark.parametrize(
    ("variables", "kind"),
    [
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, Http),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, Http),
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            },
            Grpc,
        ),
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
            },
            Grpc,
        ),
    ],
)
def test_the_protocol_picks_the_exporter(
    env: pytest.MonkeyPatch, variables: dict[str, str], kind: type
) -> None:
    for name, value in variables.items():
        env.setenv(name, value)
    provider = tracing.build_provider("bcw-x")
    try:
        assert isinstance(exporter_of(provider), kind)
    finally:
        provider.shutdown()  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
        ("OTEL_TRACES_EXPORTER", "zipkin"),
        ("OTEL_TRACES_SAMPLER", "sometimes"),
        ("OTEL_TRACES_SAMPLER_ARG", "ten percent"),
        ("OTEL_TRACES_SAMPLER_ARG", "1.5"),
    ],
)
def test_an_unsupported_choice_is_a_setting_error_naming_the_variable(
    env: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    if variable == "OTEL_TRACES_SAMPLER_ARG":
        env.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    env.setenv(variable, value)
    with pytest.raises(SettingError) as error:
        tracing.build_provider("bcw-x")
    assert error.value.setting == variable and value in str(error.value)


def test_the_sampler_is_the_parent_based_ratio_the_environment_sets(
    env: pytest.MonkeyPatch,
) -> None:
    env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    provider = tracing.build_provider("bcw-x")
    try:  # by default: every trace (a sampled producer's, and every new one)
        assert isinstance(provider, TracerProvider)
        assert provider.sampler.get_description().startswith("ParentBased{root:AlwaysOnSampler")
    finally:
        provider.shutdown()
    env.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    env.setenv("OTEL_TRACES_SAMPLER_ARG", "0.1")
    provider = tracing.build_provider("bcw-x")
    try:
        assert isinstance(provider, TracerProvider)
        assert "TraceIdRatioBased{0.1}" in provider.sampler.get_description()
    finally:
        provider.shutdown()


def test_the_service_name_defaults_and_yields_to_the_environment(env: pytest.MonkeyPatch) -> None:
    assert tracing.resource("bcw-labeler").attributes["service.name"] == "bcw-labeler"
    env.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=fleet-labeler,k8s.namespace.name=ops")
    attributes = tracing.resource("bcw-labeler").attributes
    assert attributes["service.name"] == "fleet-labeler"
    assert attributes["k8s.namespace.name"] == "ops"
    env.setenv("OTEL_SERVICE_NAME", "labeler-2")
    assert tracing.resource("bcw-labeler").attributes["service.name"] == "labeler-2"


@pytest.mark.parametrize(
    ("subject", "template"),
    [
        ("bc.facts.gw-1.hello", "bc.facts.{gateway_id}.hello"),
        ("bc.gw.gw-1.dispatch", "bc.gw.{gateway_id}.dispatch"),
        ("bc.events.node.connected", "bc.events.node.connected"),
        ("bc.events.security.node.quarantined", "bc.events.security.node.quarantined"),
        ("bc.revocations", "bc.revocations"),
    ],
)
def test_destination_template(subject: str, template: str) -> None:
    assert tracing.destination_template(subject) == template


def test_a_traceparent_round_trips() -> None:
    provider = TracerProvider()
    with provider.get_tracer("t").start_as_current_span("s") as span:
        stored = tracing.traceparent(trace.set_span_in_context(span))
    assert stored is not None
    context = tracing.from_traceparent(stored)
    assert tracing.trace_id(context) == f"{span.get_span_context().trace_id:032x}"
    assert tracing.traceparent(None) is None and tracing.from_traceparent(None) is None


def test_no_context_names_no_trace_even_inside_a_span() -> None:
    """A history row queued without a cause must not take the trace of the batch around it."""
    provider = TracerProvider()
    with provider.get_tracer("t").start_as_current_span("batch"):
        assert tracing.trace_id(None) is None


T0 = datetime(2026, 11, 30, tzinfo=UTC)
SESSION = {"session_epoch": 3, "connected_at": T0, "trace_context": "00-hello-01"}


# one case a row, read down its columns: kept out of the formatter (fmt: skip)
@pytest.mark.parametrize(
    ("waited", "cause"),
    [
        pytest.param(Waited(T0 - timedelta(hours=1), None, None), "00-hello-01", id="waited-for-the-node"),
        pytest.param(Waited(T0 + timedelta(seconds=5), None, None), None, id="made-while-connected"),
        pytest.param(Waited(T0 - timedelta(hours=1), 3, "00-busy-01"), "00-busy-01", id="busy-this-session"),
        pytest.param(Waited(T0 - timedelta(hours=1), 2, "00-busy-01"), "00-hello-01", id="busy-an-older-session"),
    ],
)  # fmt: skip
def test_which_trace_a_dispatch_continues(waited: Waited, cause: str | None) -> None:
    assert dispatch_cause(waited, SESSION) == cause


def test_json_logs_carry_the_active_span_ids() -> None:
    formatter = JsonFormatter()
    record = logging.makeLogRecord({"msg": "hello", "levelname": "INFO", "name": "t"})
    assert "trace_id" not in json.loads(formatter.format(record))
    with TracerProvider().get_tracer("t").start_as_current_span("s") as span:
        entry = json.loads(formatter.format(record))
    context = span.get_span_context()
    assert entry["trace_id"] == f"{context.trace_id:032x}"
    assert entry["span_id"] == f"{context.span_id:016x}"


def test_grpc_without_its_extra_names_the_setting_and_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    from workers.runtime.base.errors import SettingError
    from workers.runtime.observability.tracing import build_provider

    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.grpc.trace_exporter", None)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    with pytest.raises(SettingError) as refused:
        build_provider("bcw-test")
    assert refused.value.setting == "OTEL_EXPORTER_OTLP_PROTOCOL"
    assert "pip install 'bc-workers[grpc]'" in str(refused.value)
