"""The value types of settings and the configuration of a settings group: durations,
log levels. Used by every settings module and by the CLI's duration and time arguments
(`parse_since`, `parse_start`: how far back, when from); no I/O.

Every duration — a setting, `--since`, `--idle-exit` — is written one way: a number and a
unit (`500ms`, `45s`, `5m`, `2h`, `7d`, `1w`); a plain number is seconds (`45`, `0.5`).
It is said back the way it was written (`bcw config`: `90s` is `90s`), and a refusal names
its bound in a unit (`must be more than 0s`), never a bare float of seconds.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Annotated, Literal

from pydantic import AfterValidator, BeforeValidator
from pydantic.fields import FieldInfo
from pydantic_settings import SettingsConfigDict

_DURATION = re.compile(r"^\s*(-?)\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d|w)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
#: the units a duration is shown in, largest first (`bcw config`, the settings tables)
_SHOWN = (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60), ("s", 1))


def parse_duration(text: str) -> timedelta:
    """`500ms`, `45s`, `5m`, `2h`, `7d`, `1w`, or a plain number of seconds → a duration
    (a `-` before it makes it negative: refused by the bound of what reads it, in words).
    Pure; the one parser of durations. Raises ValueError."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(
            f"{text!r} is not a duration such as 45s, 5m, 2h or 7d (a plain number is seconds)"
        )
    sign = -1.0 if match.group(1) else 1.0
    return timedelta(seconds=sign * float(match.group(2)) * _UNITS[match.group(3) or "s"])


def parse_since(text: str) -> timedelta:
    """How far back: a positive duration in the one syntax of durations (`90s`, `30m`,
    `1h`, `2d`, `1w`, or plain seconds; `parse_duration`). Pure; for `bcw explain` and
    `bcw events` alike."""
    since = parse_duration(text)
    if since <= timedelta(0):
        raise ValueError(f"{text!r} is not a duration back: give more than 0 (30m, 1h, 2d)")
    return since


def parse_start(text: str, now: datetime | None = None) -> datetime:
    """A duration back from `now` (`parse_since`), or an ISO 8601 time (UTC when it names
    no zone) → when to start. Pure."""
    try:
        return (now or datetime.now(UTC)) - parse_since(text)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"{text!r} is neither a duration such as 30m, 1h or 2d nor an ISO 8601 time"
        ) from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def format_duration(value: timedelta) -> str:
    """A duration as `parse_duration` reads it, in the largest unit that shows it whole
    (`90000 s` → `25h`, `0.5 s` → `500ms`). Pure."""
    micro = value // timedelta(microseconds=1)
    if micro == 0:
        return "0s"
    for unit, size in _SHOWN:
        if micro >= size * 1_000_000 and micro % (size * 1_000_000) == 0:
            return f"{micro // (size * 1_000_000)}{unit}"
    if micro % 1000 == 0:
        return f"{micro // 1000}ms"
    return f"{micro / 1_000_000}s"


def format_seconds(seconds: float) -> str:
    """`format_duration` of a float of seconds (a `Seconds` setting's value). Pure."""
    if seconds < 0:
        return f"-{format_duration(timedelta(seconds=-seconds))}"
    return format_duration(timedelta(seconds=seconds))


def said_back(value: timedelta | float, written: str | None = None) -> str:
    """A duration setting's value as its operator reads it: as `written` (the variable's
    text) when that is what it holds — `90s` stays `90s`, `1.5m` stays `1.5m` — else in
    the largest unit that shows it whole (a default: `1m`). Pure."""
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if written is not None:
        try:
            if parse_duration(written).total_seconds() == seconds:
                return written.strip()
        except ValueError:
            pass
    return format_seconds(seconds)


def is_duration(info: FieldInfo) -> bool:
    """Whether a settings field holds a duration (`Duration` or `Seconds`, optional or not)."""
    return (
        IN_SECONDS in info.metadata
        or "timedelta" in repr(info.annotation)
        or any(
            IN_SECONDS in getattr(arg, "__metadata__", ())
            for arg in getattr(info.annotation, "__args__", ())
        )
    )


def _to_timedelta(value: object) -> object:
    if isinstance(value, str):
        return parse_duration(value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return timedelta(seconds=value)
    return value


def _to_seconds(value: object) -> object:
    if isinstance(value, str):
        return parse_duration(value).total_seconds()
    if isinstance(value, timedelta):
        return value.total_seconds()
    return value


def _positive(value: timedelta) -> timedelta:
    if value <= timedelta(0):
        raise ValueError("must be a positive duration (45s, 5m, 2h, 7d)")
    return value


#: A positive duration, as a timedelta (rules that compare times).
Duration = Annotated[timedelta, BeforeValidator(_to_timedelta), AfterValidator(_positive)]

#: What makes a float setting a duration (the settings tables show its default as one).
IN_SECONDS = BeforeValidator(_to_seconds)

#: A duration as a float of seconds (timeouts and intervals handed to libraries); its
#: bounds (`gt=0`, `ge=0`) are the field's.
Seconds = Annotated[float, IN_SECONDS]

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LogLevel = Annotated[
    Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
    BeforeValidator(lambda value: value.upper() if isinstance(value, str) else value),
]


def env_group(prefix: str) -> SettingsConfigDict:
    """The configuration of one settings group: its variables start with `prefix`, but for
    a field with an alias (a variable that kept its name when its setting changed group),
    which code gives by the field's name."""
    return SettingsConfigDict(env_prefix=prefix, extra="ignore", frozen=True, validate_by_name=True)
