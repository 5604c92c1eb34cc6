"""The value types of settings and the configuration of a settings group: durations in
seconds (always positive), log levels. Used by every settings module; no I/O.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Literal

from pydantic import AfterValidator, BeforeValidator
from pydantic_settings import SettingsConfigDict


def _seconds(value: object) -> object:
    """Durations are given in seconds (`45`, `0.5`); ISO 8601 (`PT45S`) works too."""
    if isinstance(value, str):
        try:
            return timedelta(seconds=float(value))
        except ValueError:
            return value
    if isinstance(value, int | float):
        return timedelta(seconds=value)
    return value


def _positive(value: timedelta) -> timedelta:
    if value <= timedelta(0):
        raise ValueError("must be a positive number of seconds")
    return value


#: A duration read from the environment in seconds; every duration here is positive.
Seconds = Annotated[timedelta, BeforeValidator(_seconds), AfterValidator(_positive)]

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LogLevel = Annotated[
    Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
    BeforeValidator(lambda value: value.upper() if isinstance(value, str) else value),
]


def env_group(prefix: str) -> SettingsConfigDict:
    """The configuration of one settings group: its variables start with `prefix`."""
    return SettingsConfigDict(env_prefix=prefix, extra="ignore", frozen=True)
