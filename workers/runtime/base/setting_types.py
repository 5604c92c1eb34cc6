"""The value types of settings and the configuration of a settings group: durations,
log levels. Used by every settings module and by the CLI's duration arguments; no I/O.

Every duration — a setting, `--since`, `--idle-exit` — is written one way: a number and a
unit (`500ms`, `45s`, `5m`, `2h`, `7d`, `1w`); a plain number is seconds (`45`, `0.5`).
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Literal

from pydantic import AfterValidator, BeforeValidator
from pydantic_settings import SettingsConfigDict

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h|d|w)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
#: the units a duration is shown in, largest first (`bcw config`, the settings tables)
_SHOWN = (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60), ("s", 1))


def parse_duration(text: str) -> timedelta:
    """`500ms`, `45s`, `5m`, `2h`, `7d`, `1w`, or a plain number of seconds → a duration
    (zero or more). Pure; the one parser of durations. Raises ValueError."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(
            f"{text!r} is not a duration such as 45s, 5m, 2h or 7d (a plain number is seconds)"
        )
    return timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2) or "s"])


def format_duration(value: timedelta) -> str:
    """A duration as `parse_duration` reads it, in the largest unit that shows it whole
    (`90000 s` → `25h`, `0.5 s` → `500ms`). Pure."""
    micro = value // timedelta(microseconds=1)
    for unit, size in _SHOWN:
        if micro >= size * 1_000_000 and micro % (size * 1_000_000) == 0:
            return f"{micro // (size * 1_000_000)}{unit}"
    if micro % 1000 == 0:
        return f"{micro // 1000}ms"
    return f"{micro / 1_000_000}s"


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
    """The configuration of one settings group: its variables start with `prefix`."""
    return SettingsConfigDict(env_prefix=prefix, extra="ignore", frozen=True)
