"""Typed settings from the environment (`BCW_*`), grouped by concern: the process's own
and the runtime's (`RuntimeSettings`, its groups in `runtime_settings`); each worker's
groups are its own (`workers/<name>/settings.py`), composed with these in
`workers/settings.py`. Here too what every setting is to an operator, whatever composes
them (`Catalog`: the variables, their secrets, `bcw config`, one line per refusal).

Read once by the entry point (`bcw`) and passed down; nothing else reads the environment.
Secrets are `SecretStr` and never appear in a repr or a log line.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping, MutableMapping
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas.subjects import ROOT_RE
from workers.runtime.base import libpq
from workers.runtime.base.errors import SettingError, redact
from workers.runtime.base.runtime_settings import (
    ConsumerSettings,
    DatabaseSettings,
    NatsSettings,
    OutboxSettings,
    RetentionSettings,
)
from workers.runtime.base.setting_types import (
    LogLevel,
    Seconds,
    format_seconds,
    is_duration,
    said_back,
)


class RuntimeSettings(BaseSettings):
    """What the runtime of a `bcw` process reads from its environment: its own settings
    and its groups (the workers' groups are composed beside them: `workers.settings`)."""

    model_config = SettingsConfigDict(env_prefix="BCW_", extra="ignore", frozen=True)

    subject_root: str = Field(
        default="bc", description="subject root; stream names follow it (`bc` → `BC_FACTS`)"
    )
    health_port: int = Field(
        default=8080,
        ge=0,
        le=65535,
        description="`/healthz`, `/readyz`, `/metrics`; 0 picks a free port",
    )
    log_format: Literal["json", "console"] = Field(
        default="console", description="`json` (one object per line) or `console`"
    )
    log_level: LogLevel = Field(
        default="INFO", description="DEBUG, INFO, WARNING, ERROR or CRITICAL"
    )
    instance: str | None = Field(
        default=None,
        description="this process's name (the lease holder it writes); default host:pid",
    )
    trace_query_text: bool = Field(
        default=False,
        description="traced SQL spans carry `db.query.text`, the statement as sent (parameterized: "
        "`$1`, never a value; the statements are the project's own); off: the summary only",
    )

    hello_proof: Literal["off", "warn", "require"] | None = Field(
        default=None,
        description="the fleet's Hello proofs, set in the database by `bcw migrate`: `off` (not "
        "checked), `warn` (checked when given; a Hello without one opens, recorded unproven), "
        "`require` (a Hello without a valid proof is refused); a node with a Hello key proves "
        "every Hello at any of them (without a proof: held, gets nothing); unset: left as it "
        "is (a new database starts at `require`)",
    )
    heap_snapshots: str | None = Field(
        default=None,
        description="a directory: trace allocations and write a snapshot of the heap there "
        "every BCW_HEAP_SNAPSHOT_EVERY, for `bcw heap diff` (finding what grows; slower, "
        "and more memory); unset: off",
    )
    heap_snapshot_every: Seconds = Field(
        default=600.0, gt=0, description="how often BCW_HEAP_SNAPSHOTS writes one"
    )
    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    nats: NatsSettings = Field(default_factory=NatsSettings)
    consumer: ConsumerSettings = Field(default_factory=ConsumerSettings)
    outbox: OutboxSettings = Field(default_factory=OutboxSettings)
    retention: RetentionSettings = Field(default_factory=RetentionSettings)

    @field_validator("subject_root")
    @classmethod
    def _root_is_one_token(cls, value: str) -> str:
        if not ROOT_RE.match(value):
            raise ValueError(f"must match {ROOT_RE.pattern}")
        return value

    @model_validator(mode="after")
    def _idle_timeout_fits(self) -> RuntimeSettings:
        idle = self.database.idle_in_transaction_timeout
        if idle and idle <= self.outbox.publish_timeout:
            raise ValueError(
                f"BCW_DATABASE_IDLE_IN_TRANSACTION_TIMEOUT ({format_seconds(idle)}) must be above "
                f"BCW_OUTBOX_PUBLISH_TIMEOUT ({format_seconds(self.outbox.publish_timeout)}): the relay waits "
                "for PubAcks inside its transaction"
            )
        return self

    @model_validator(mode="after")
    def _inbox_outlives_the_facts(self) -> RuntimeSettings:
        kept = self.retention.processed_facts.total_seconds()
        if kept <= self.nats.facts_max_age:
            raise ValueError(
                f"BCW_RETENTION_PROCESSED_FACTS ({format_seconds(kept)}) must be above BCW_NATS_FACTS_MAX_AGE "
                f"({format_seconds(self.nats.facts_max_age)}): a fact redelivered after its inbox row was "
                "pruned would be applied twice"
            )
        return self

    @model_validator(mode="after")
    def _database_tls_files_readable(self) -> RuntimeSettings:
        # a CA, a client certificate or key that is not there never will be: refused now,
        # not waited on as if the server were away
        why = libpq.unreadable(database_tls(self.database))
        if why is not None:
            raise ValueError(why)
        return self

    @model_validator(mode="after")
    def _timeouts_fit(self) -> RuntimeSettings:
        if self.database.command_timeout >= self.consumer.ack_wait:
            raise ValueError(
                f"BCW_DATABASE_COMMAND_TIMEOUT ({format_seconds(self.database.command_timeout)}) must be below "
                f"BCW_CONSUMER_ACK_WAIT ({format_seconds(self.consumer.ack_wait)}): a slow statement would "
                "outlive the fact's delivery"
            )
        return self


def database_tls(database: DatabaseSettings) -> libpq.Tls:
    """The TLS of the database's connections: the URL's parameters, else the libpq
    variables (`PGSSLMODE`, `PGSSLROOTCERT`, …), else ~/.postgresql, as asyncpg reads them."""
    try:
        home: Path | None = Path.home()
    except (RuntimeError, KeyError):
        home = None
    return libpq.tls(database.url.get_secret_value(), os.environ, home, os.path.exists)


#: environment variables of the BCW_ prefix that are not settings of a process: the test
#: harness's servers (tests/conftest.py)
_NOT_SETTINGS_PREFIXES = ("BCW_TEST_",)


def nested_groups(root: type[BaseSettings]) -> list[type[BaseSettings]]:
    """The groups nested in `root` (each with its own prefix), in their order of declaration."""
    return [
        info.default_factory
        for info in root.model_fields.values()
        if isinstance(info.default_factory, type) and issubclass(info.default_factory, BaseSettings)
    ]


def group_variables(group: type[BaseSettings]) -> dict[str, str]:
    """A group's own settings, in their order of declaration: variable → field (the
    groups nested in it have their own prefixes). A field's variable is its prefix and
    name, or its alias (a setting that kept the name it had in another group)."""
    prefix = str(group.model_config.get("env_prefix", "BCW_"))
    nested = set(nested_groups(group))
    return {
        (
            info.validation_alias
            if isinstance(info.validation_alias, str)
            else prefix + field.upper()
        ): field
        for field, info in group.model_fields.items()
        if info.default_factory not in nested
    }


class Catalog:
    """Every variable of a composed settings class (`root` and the groups nested in it):
    what `bcw` reads from files, refuses, says back and documents — the same machinery
    whichever groups compose it (`workers.settings` binds it to the process's)."""

    def __init__(self, root: type[BaseSettings]) -> None:
        self.root = root
        #: class name → group: `root` first, then its groups
        self.groups: dict[str, type[BaseSettings]] = {
            group.__name__: group for group in (root, *nested_groups(root))
        }
        #: every setting's variable → (its group, its field)
        self.variables: dict[str, tuple[type[BaseSettings], str]] = {
            variable: (group, field)
            for group in self.groups.values()
            for variable, field in group_variables(group).items()
        }

    def secret_files(self) -> dict[str, str]:
        """`<SECRET>_FILE` → `<SECRET>`, for every secret setting: its value may be given as
        the content of a file (a mounted Kubernetes Secret) instead of in the environment."""
        return {
            f"{variable}_FILE": variable
            for variable, (group, field) in self.variables.items()
            if is_secret(group, field)
        }

    def read_secret_files(self, environ: MutableMapping[str, str]) -> None:
        """Put each `<SECRET>_FILE`'s content (trailing whitespace dropped) in `environ` as
        `<SECRET>`. Raises SettingError naming the variable: both given, or unreadable."""
        for file_variable, variable in self.secret_files().items():
            path = environ.get(file_variable)
            if not path:
                continue
            if environ.get(variable):
                raise SettingError(file_variable, f"{variable} is set too: give one of them")
            try:
                environ[variable] = Path(path).read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError) as error:
                reason = getattr(error, "strerror", None) or str(error)
                raise SettingError(file_variable, f"cannot read {path}: {reason}") from None

    def unknown_variables(self, environ: Mapping[str, str]) -> list[str]:
        """One line per `BCW_*` variable that is no setting (a misspelling is otherwise
        silently ignored), with the nearest known name."""
        known = {**self.variables, **dict.fromkeys(self.secret_files())}
        lines = []
        for name in sorted(environ):
            if not name.startswith("BCW_") or name in known:
                continue
            if name.startswith(_NOT_SETTINGS_PREFIXES):
                continue
            near = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
            hint = f": did you mean {near[0]}?" if near else " (`bcw config` lists them all)"
            lines.append(f"{name} is not a setting{hint}")
        return lines

    def effective(
        self, settings: BaseSettings, environ: Mapping[str, str] | None = None
    ) -> dict[str, object]:
        """Every setting's variable → its effective value, secrets shown as `***` (a URL's
        password and a NATS token redacted too). What `bcw config` prints: a duration in
        seconds (a number), or with `environ`, as text the way it was written there
        (`said_back`: `90s` is `90s`; a default in its largest whole unit)."""
        out: dict[str, object] = {}
        groups: dict[type[BaseSettings], BaseSettings] = {self.root: settings}
        for name in self.root.model_fields:  # each group's values, from the settings themselves
            value = getattr(settings, name)
            if isinstance(value, BaseSettings):
                groups[type(value)] = value
        for variable, (group, field) in sorted(self.variables.items()):
            value = getattr(groups[group], field)
            if environ is not None and value is not None and is_duration(group.model_fields[field]):
                value = said_back(value, environ.get(variable))
            elif isinstance(value, SecretStr):
                secret = value.get_secret_value()
                value = redact(secret) if "://" in secret else ("***" if secret else "")
            elif isinstance(value, str):
                value = redact(value)  # a NATS URL may carry a user's password
            elif isinstance(value, timedelta):
                value = value.total_seconds()
            elif value is not None and not isinstance(value, bool | int | float | str):
                value = str(value)
            out[variable] = value
        return out

    def describe(
        self, error: ValidationError, environ: Mapping[str, str] | None = None
    ) -> list[str]:
        """One line per bad setting, named as the operator sets it: `BCW_X_Y: what is wrong`.

        Values are shown only for settings that are not secrets: as written in `environ`
        when given (`'0'`, not `0.0`); a duration's bound in a unit (`more than 0s`).
        """
        group = self.groups.get(error.title)
        prefix = str(group.model_config.get("env_prefix", "BCW_")) if group else "BCW_"
        named = group_variables(group) if group else {}  # variable → field
        lines = []
        for item in error.errors(include_url=False):
            location = [str(part) for part in item["loc"]]
            message = str(item["msg"]).removeprefix("Value error, ")
            if not location:  # a rule across settings names them itself
                lines.append(message)
                continue
            # a field's name, or the variable itself when the field has an alias
            field = named.get(location[0], location[0])
            variable = next((v for v, f in named.items() if f == field), prefix + field.upper())
            secret = group is not None and is_secret(group, field)
            info = group.model_fields.get(field) if group is not None else None
            if info is not None and is_duration(info):
                message = _duration_bound(item) or message
            given = item.get("input")
            if environ is not None and variable in environ:
                given = environ[variable]
            shown = "" if secret or given is None else f" (got {_short(given)})"
            lines.append(f"{variable}: {message}{shown}")
        return lines


_BOUNDS = {
    "greater_than": ("gt", "more than"),
    "greater_than_equal": ("ge", "at least"),
    "less_than": ("lt", "less than"),
    "less_than_equal": ("le", "at most"),
}


def _duration_bound(item: Any) -> str | None:
    """A duration's bound said in a unit (`must be more than 0s`), for pydantic's
    `Input should be greater than 0`; None for any other error."""
    bound = _BOUNDS.get(item.get("type", ""))
    if bound is None or bound[0] not in (item.get("ctx") or {}):
        return None
    return f"must be {bound[1]} {format_seconds(float(item['ctx'][bound[0]]))}"


def is_secret(group: type[BaseSettings], field: str) -> bool:
    """Whether a group's field is a secret (`SecretStr`: never shown)."""
    info = group.model_fields.get(field)
    return info is not None and "SecretStr" in repr(info.annotation)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
