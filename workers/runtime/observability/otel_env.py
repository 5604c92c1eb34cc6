"""The standard `OTEL_*` variables, checked before anything reads them.

The SDK reads several of these on its own, some at import (`OTEL_PROPAGATORS`: an unknown
name raises from `opentelemetry.propagate`'s import), some when a provider is built (the
span limits and batch processor sizes raise `ValueError`), and it logs a traceback for
others (`OTEL_PYTHON_CONTEXT`, a non-integer `OTEL_BSP_SCHEDULE_DELAY`). `check` refuses
each bad value by name, as a `SettingError` (exit 2), before `bcw` runs any command; the
workers never import `opentelemetry.propagate` (`tracing.propagator` builds the one they
use from `propagators`). Pure: it imports no part of OpenTelemetry.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

from workers.runtime.base.errors import SettingError, redact

#: `OTEL_PROPAGATORS` names the workers ship (B3 and Jaeger: their registry packages)
PROPAGATORS = ("tracecontext", "baggage", "b3", "b3multi", "jaeger")
#: standard names not shipped: refused by name rather than ignored
UNSHIPPED_PROPAGATORS = ("xray", "ottrace")
EXPORTERS = ("otlp", "console", "none")
PROTOCOLS = ("http/protobuf", "grpc")
COMPRESSIONS = ("gzip", "deflate", "none")
#: `OTEL_TRACES_SAMPLER` values the SDK knows, and those that read a ratio from
#: `OTEL_TRACES_SAMPLER_ARG`
SAMPLERS = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)
RATIO_SAMPLERS = ("traceidratio", "parentbased_traceidratio")
#: integers the SDK reads (limits: 0 or more; the batch processor's sizes: 1 or more;
#: its delays, in milliseconds: 0 or more)
COUNTS = (
    "OTEL_ATTRIBUTE_COUNT_LIMIT",
    "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT",
    "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT",
    "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT",
    "OTEL_SPAN_EVENT_COUNT_LIMIT",
    "OTEL_SPAN_LINK_COUNT_LIMIT",
    "OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT",
    "OTEL_LINK_ATTRIBUTE_COUNT_LIMIT",
    "OTEL_BSP_SCHEDULE_DELAY",
    "OTEL_BSP_EXPORT_TIMEOUT",
)
SIZES = ("OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE")
#: files the OTLP exporter reads (per signal or not)
FILES = ("CERTIFICATE", "CLIENT_CERTIFICATE", "CLIENT_KEY")
#: values `bcw config` hides (credentials travel in the exporter's headers)
#: every signal's exporter headers (an API key, a bearer token): shown as `***`
SECRET = tuple(
    f"OTEL_EXPORTER_OTLP{signal}_HEADERS" for signal in ("", "_TRACES", "_METRICS", "_LOGS")
)


def _get(env: Mapping[str, str], name: str) -> str | None:
    """The variable's value, None when unset or blank (as the SDK reads it)."""
    value = env.get(name, "").strip()
    return value or None


def propagators(env: Mapping[str, str]) -> tuple[str, ...]:
    """The propagators `OTEL_PROPAGATORS` names, in order (default: tracecontext,
    baggage; `none`: none). A name not shipped is refused by name. Pure."""
    text = _get(env, "OTEL_PROPAGATORS")
    if text is None:
        return ("tracecontext", "baggage")
    names = [n.strip().lower() for n in text.split(",")]
    if "none" in names:
        return ()
    for name in names:
        if name in UNSHIPPED_PROPAGATORS:
            raise SettingError(
                "OTEL_PROPAGATORS",
                f"{name!r} is not shipped with bc-workers (use {', '.join(PROPAGATORS)} or none)",
            )
        if name not in PROPAGATORS:
            raise SettingError(
                "OTEL_PROPAGATORS", f"{name!r} is not one of {', '.join(PROPAGATORS)}, none"
            )
    return tuple(dict.fromkeys(names))


def carried(env: Mapping[str, str]) -> tuple[str, ...]:
    """The formats the workers write and read: W3C `tracecontext` always (the messages'
    contract), then those `OTEL_PROPAGATORS` names; `none`: none. Pure."""
    names = propagators(env)
    return names if not names or "tracecontext" in names else ("tracecontext", *names)


def exporters(env: Mapping[str, str]) -> tuple[str, ...]:
    """The exporters `OTEL_TRACES_EXPORTER` lists (default: otlp; `none`: none). Pure."""
    text = _get(env, "OTEL_TRACES_EXPORTER") or "otlp"
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    for name in names:
        if name not in EXPORTERS:
            raise SettingError(
                "OTEL_TRACES_EXPORTER", f"{name!r} is not one of {', '.join(EXPORTERS)}"
            )
    if "none" in names and len(names) > 1:
        raise SettingError("OTEL_TRACES_EXPORTER", f"none with others ({text!r})")
    return tuple(dict.fromkeys(n for n in names if n != "none"))


def protocol(env: Mapping[str, str]) -> tuple[str, str]:
    """(the variable that chose it, the OTLP protocol for traces), each set variable
    checked: `http/protobuf` (default) or `grpc`; `http/json` is refused by name (the
    Python exporter has no JSON encoding). Pure."""
    chosen = ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    for variable in ("OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"):
        value = _get(env, variable)
        if value is None:
            continue
        value = value.lower()
        if value == "http/json":
            raise SettingError(
                variable, "http/json is not supported by the Python exporter: use http/protobuf"
            )
        if value not in PROTOCOLS:
            raise SettingError(variable, f"{value!r} is not one of {', '.join(PROTOCOLS)}")
        chosen = (variable, value)
    return chosen


def endpoint(env: Mapping[str, str]) -> str | None:
    """Where traces go (the per-signal variable first), None: nowhere."""
    return _get(env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or _get(
        env, "OTEL_EXPORTER_OTLP_ENDPOINT"
    )


def disabled(env: Mapping[str, str]) -> bool:
    return (_get(env, "OTEL_SDK_DISABLED") or "false").lower() == "true"


def check_sampler(env: Mapping[str, str]) -> None:
    """The sampler variables as the SDK reads them, refused by name where the SDK would
    only warn and fall back (to sampling everything). Pure."""
    sampler = (_get(env, "OTEL_TRACES_SAMPLER") or "parentbased_always_on").lower()
    if sampler not in SAMPLERS:
        raise SettingError(
            "OTEL_TRACES_SAMPLER", f"{sampler!r} is not one of {', '.join(SAMPLERS)}"
        )
    text = _get(env, "OTEL_TRACES_SAMPLER_ARG")
    if sampler in RATIO_SAMPLERS and text is not None:
        try:
            ratio = float(text)
        except ValueError:
            ratio = -1.0
        if not 0.0 <= ratio <= 1.0:
            raise SettingError(
                "OTEL_TRACES_SAMPLER_ARG",
                f"{text!r} is not a ratio from 0 to 1 (0.1: one trace in ten)",
            )


def _integer(env: Mapping[str, str], name: str, least: int) -> int | None:
    text = _get(env, name)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        value = least - 1
    if value < least:
        raise SettingError(name, f"{text!r} is not a whole number of {least} or more")
    return value


def check(env: Mapping[str, str], exists: Callable[[str], bool] = os.path.exists) -> None:
    """Every `OTEL_*` value the workers or the SDK read, refused by name where it cannot
    work (`SettingError`, exit 2). `exists` says whether a file is there."""
    propagators(env)
    exporters(env)
    protocol(env)
    check_sampler(env)
    flag = _get(env, "OTEL_SDK_DISABLED")
    if flag is not None and flag.lower() not in ("true", "false"):
        raise SettingError("OTEL_SDK_DISABLED", f"{flag!r} is not true or false")
    context = _get(env, "OTEL_PYTHON_CONTEXT")
    if context is not None and context != "contextvars_context":
        raise SettingError("OTEL_PYTHON_CONTEXT", f"{context!r} is not contextvars_context")
    for name in COUNTS:
        _integer(env, name, 0)
    queue = _integer(env, "OTEL_BSP_MAX_QUEUE_SIZE", 1) or 2048
    batch = _integer(env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 1) or min(512, queue)
    if batch > queue:
        raise SettingError(
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", f"{batch} is more than the queue's size ({queue})"
        )
    for signal in ("", "TRACES_"):
        prefix = f"OTEL_EXPORTER_OTLP_{signal}"
        url = _get(env, f"{prefix}ENDPOINT")
        if url is not None and (urlsplit(url).scheme not in ("http", "https") or "//" not in url):
            raise SettingError(f"{prefix}ENDPOINT", f"{url!r} is not an http:// or https:// URL")
        text = _get(env, f"{prefix}TIMEOUT")
        if text is not None:
            try:
                seconds = float(text)
            except ValueError:
                seconds = -1.0
            if seconds <= 0:
                raise SettingError(f"{prefix}TIMEOUT", f"{text!r} is not a positive number")
        compression = _get(env, f"{prefix}COMPRESSION")
        if compression is not None and compression.lower() not in COMPRESSIONS:
            raise SettingError(
                f"{prefix}COMPRESSION", f"{compression!r} is not one of {', '.join(COMPRESSIONS)}"
            )
        for file in FILES:
            path = _get(env, f"{prefix}{file}")
            if path is not None and not exists(path):
                raise SettingError(f"{prefix}{file}", f"no file {path!r}")


def shown(env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """What `bcw config` prints of tracing: the effective propagators, exporters, protocol,
    sampler and whether the SDK is on, then every other `OTEL_*` variable set (exporter
    headers hidden, a URL's password redacted; `env`: this process's by default). Assumes
    `check` passed."""
    variable, chosen = protocol(env)
    out = {
        "OTEL_PROPAGATORS": ",".join(carried(env)) or "none",
        "OTEL_TRACES_EXPORTER": ",".join(exporters(env)) or "none",
        (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
            if _get(env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            else "OTEL_EXPORTER_OTLP_ENDPOINT"
        ): redact(endpoint(env) or ""),
        variable: chosen,
        "OTEL_TRACES_SAMPLER": (_get(env, "OTEL_TRACES_SAMPLER") or "parentbased_always_on"),
        "OTEL_SDK_DISABLED": str(disabled(env)).lower(),
    }
    for name, value in sorted(env.items()):
        if name.startswith("OTEL_") and name not in out:
            out[name] = "***" if name in SECRET else redact(value)
    return out
