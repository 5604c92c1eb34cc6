"""The standard OTEL_* variables: each value works or is refused by name, before the SDK
reads it (`otel_env.check`, pure), and `bcw` says so in one line with exit 2, for every
command, `bcw --version` included (subprocesses of the real command)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from workers.runtime.base.errors import SettingError
from workers.runtime.observability import otel_env, tracing

ROOT = Path(__file__).resolve().parents[3]

#: (variable, value) pairs that cannot work: each refused naming its variable
BAD = [
    ("OTEL_PROPAGATORS", "xray"),
    ("OTEL_PROPAGATORS", "ottrace"),
    ("OTEL_PROPAGATORS", "tracecontext,w3c"),
    ("OTEL_TRACES_EXPORTER", "zipkin"),
    ("OTEL_TRACES_EXPORTER", "jaeger"),
    ("OTEL_TRACES_EXPORTER", "otlp,none"),
    ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
    ("OTEL_EXPORTER_OTLP_PROTOCOL", "udp"),
    ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json"),
    ("OTEL_TRACES_SAMPLER", "sometimes"),
    ("OTEL_SDK_DISABLED", "maybe"),
    ("OTEL_PYTHON_CONTEXT", "threadlocal"),
    ("OTEL_BSP_SCHEDULE_DELAY", "soon"),
    ("OTEL_BSP_EXPORT_TIMEOUT", "-1"),
    ("OTEL_BSP_MAX_QUEUE_SIZE", "0"),
    ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "9999"),
    ("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "-3"),
    ("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "long"),
    ("OTEL_SPAN_LINK_COUNT_LIMIT", "many"),
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318"),
    ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "ftp://collector/v1/traces"),
    ("OTEL_EXPORTER_OTLP_TIMEOUT", "ten"),
    ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "brotli"),
    ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/nonexistent/ca.pem"),
    ("OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY", "/nonexistent/key.pem"),
]
GOOD = [
    {},
    {"OTEL_PROPAGATORS": "b3"},
    {"OTEL_PROPAGATORS": "tracecontext,baggage,b3multi,jaeger"},
    {"OTEL_PROPAGATORS": "none"},
    {"OTEL_PROPAGATORS": " B3 , Jaeger "},
    {"OTEL_TRACES_EXPORTER": "otlp,console"},
    {"OTEL_TRACES_EXPORTER": "none"},
    {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"},
    {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"},
    {"OTEL_BSP_MAX_QUEUE_SIZE": "100", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "100"},
    {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector:4318", "OTEL_EXPORTER_OTLP_TIMEOUT": "2.5"},
    {"OTEL_EXPORTER_OTLP_COMPRESSION": "gzip", "OTEL_SDK_DISABLED": "TRUE"},
    {"OTEL_PYTHON_CONTEXT": "contextvars_context", "OTEL_PROPAGATORS": ""},
]


@pytest.mark.parametrize(("variable", "value"), BAD)
def test_a_value_that_cannot_work_is_refused_by_name(variable: str, value: str) -> None:
    with pytest.raises(SettingError) as refused:
        otel_env.check({variable: value}, exists=lambda path: False)
    assert refused.value.setting == variable
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("env", GOOD)
def test_a_standard_value_is_taken(env: dict[str, str]) -> None:
    otel_env.check(env, exists=lambda path: True)


@pytest.mark.parametrize(
    ("value", "carried"),
    [
        (None, ("tracecontext", "baggage")),
        ("b3", ("tracecontext", "b3")),
        ("b3multi,tracecontext", ("b3multi", "tracecontext")),
        ("jaeger,baggage,jaeger", ("tracecontext", "jaeger", "baggage")),
        ("tracecontext,none", ()),
    ],
)
def test_the_formats_carried(value: str | None, carried: tuple[str, ...]) -> None:
    env = {} if value is None else {"OTEL_PROPAGATORS": value}
    assert otel_env.carried(env) == carried


def test_config_shows_what_is_used_and_hides_the_headers() -> None:
    shown = otel_env.shown(
        {
            "OTEL_PROPAGATORS": "b3",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://u:pw@c:4318/v1/traces",
            "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer s3cret",
            "OTEL_SERVICE_NAME": "x",
        }
    )
    assert shown["OTEL_PROPAGATORS"] == "tracecontext,b3"
    assert shown["OTEL_TRACES_EXPORTER"] == "otlp"
    assert shown["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf"
    assert shown["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] == "http://u:***@c:4318/v1/traces"
    assert shown["OTEL_EXPORTER_OTLP_HEADERS"] == "***" and shown["OTEL_SERVICE_NAME"] == "x"
    assert "s3cret" not in repr(shown) and "pw" not in repr(shown)


@pytest.mark.parametrize(
    ("propagators", "header"),
    [("b3", "b3"), ("b3multi", "x-b3-traceid"), ("jaeger", "uber-trace-id"), ("none", None)],
)
def test_a_context_travels_in_each_format(
    monkeypatch: pytest.MonkeyPatch, propagators: str, header: str | None
) -> None:
    """Written in W3C and the format named, read back from that format alone."""
    monkeypatch.setenv("OTEL_PROPAGATORS", propagators)
    with TracerProvider().get_tracer("t").start_as_current_span("s") as span:
        headers = tracing.inject({})
    if header is None:
        assert (
            headers == {}
            and tracing.extract({"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}) is None
        )
        return
    assert "traceparent" in headers and header in headers
    alone = {k: v for k, v in headers.items() if k != "traceparent"}
    context = tracing.extract(alone)
    read = trace.get_current_span(context).get_span_context()
    assert read.trace_id == span.get_span_context().trace_id
    # what a dispatch stores is W3C whatever is carried
    assert tracing.traceparent(trace.set_span_in_context(span)) == headers["traceparent"]


def _bcw(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "BCW_"))}
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", *args],
        env={**clean, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(("variable", "value"), BAD)
def test_bcw_refuses_each_bad_value_in_one_line(variable: str, value: str) -> None:
    result = _bcw("config", **{variable: value})
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(f"bcw: {variable}: ")
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("value", ["b3", "b3multi", "jaeger", "tracecontext,baggage,b3", "none"])
def test_a_shipped_propagator_runs_every_command(value: str) -> None:
    assert _bcw("--version", OTEL_PROPAGATORS=value).returncode == 0
    result = _bcw("config", OTEL_PROPAGATORS=value)
    assert result.returncode == 0 and result.stderr == ""
    [line] = [x for x in result.stdout.splitlines() if x.startswith("OTEL_PROPAGATORS")]
    assert line.split()[1] == ",".join(otel_env.carried({"OTEL_PROPAGATORS": value})) or "none"


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("OTEL_PROPAGATORS", "xray"),
        ("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "-3"),
        ("OTEL_PYTHON_CONTEXT", "threadlocal"),
    ],
)
def test_even_the_version_is_refused_before_the_sdk_reads_a_bad_value(
    variable: str, value: str
) -> None:
    """The SDK reads these as it is imported: `bcw --version` too says one line."""
    result = _bcw("--version", **{variable: value})
    assert result.returncode == 2 and result.stderr.startswith(f"bcw: {variable}: ")
    assert result.stderr.count("\n") == 1
