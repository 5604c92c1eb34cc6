"""Typed settings from the environment (`BCW_*`), grouped by concern.

Read once by the entry point (`bcw`) and passed down; nothing else reads the environment.
Secrets are `SecretStr` and never appear in a repr or a log line.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    FilePath,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas.subjects import ROOT_RE


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


def _group(prefix: str) -> SettingsConfigDict:
    return SettingsConfigDict(env_prefix=prefix, extra="ignore", frozen=True)


class DatabaseSettings(BaseSettings):
    """PostgreSQL. `BCW_DATABASE_URL` is a libpq URL; it may carry a password."""

    model_config = _group("BCW_DATABASE_")

    url: SecretStr = Field(
        default=SecretStr("postgresql://postgres@127.0.0.1:5432/postgres"),
        description="libpq connection URL",
    )
    pool_min: int = Field(default=1, ge=0, description="connections kept open")
    pool_max: int = Field(default=8, ge=1, description="at most this many connections per process")
    command_timeout: float = Field(
        default=20.0, gt=0, description="seconds; keep below the consumer's ack_wait"
    )
    connect_timeout: float = Field(
        default=10.0, gt=0, description="seconds one connection attempt may take"
    )
    idle_in_transaction_timeout: float = Field(
        default=30.0,
        ge=0,
        description="seconds PostgreSQL keeps one of our sessions idle in a transaction before "
        "ending it: a worker cut off by a partition must not hold its row locks for hours; "
        "0 sends nothing (e.g. behind a PgBouncer that refuses the startup parameter)",
    )
    statement_cache_size: int = Field(
        default=100, ge=0, description="0 behind PgBouncer (transaction mode) older than 1.21"
    )

    @field_validator("url")
    @classmethod
    def _url_is_postgres(cls, value: SecretStr) -> SecretStr:
        # never echo the URL: it may carry a password
        try:
            parts = urlsplit(value.get_secret_value())
            parts.port  # noqa: B018 - parses the port
        except ValueError as error:
            raise ValueError(f"not a valid URL ({error})") from None
        if parts.scheme not in ("postgresql", "postgres"):
            raise ValueError("must be a postgresql:// URL")
        return value

    @model_validator(mode="after")
    def _pool_bounds(self) -> DatabaseSettings:
        if self.pool_min > self.pool_max:
            raise ValueError(
                f"BCW_DATABASE_POOL_MIN ({self.pool_min}) is above BCW_DATABASE_POOL_MAX ({self.pool_max})"
            )
        return self


class NatsSettings(BaseSettings):
    """NATS and JetStream."""

    model_config = _group("BCW_NATS_")

    url: str = Field(default="nats://127.0.0.1:4222", description="comma-separated server URLs")
    connect_timeout: float = Field(
        default=5.0, gt=0, description="seconds one connection attempt may take"
    )
    creds_file: FilePath | None = Field(default=None, description="NATS credentials (.creds) file")
    nkey_seed_file: FilePath | None = Field(
        default=None,
        description="nkey seed file (`bcw auth nats`); replies then come to `_INBOX.<key>.>`",
    )
    user: str | None = Field(default=None, description="user name, if not using creds")
    password: SecretStr | None = Field(default=None, description="password for `user`")
    token: SecretStr | None = Field(default=None, description="auth token")
    tls_ca_file: FilePath | None = Field(default=None, description="CA bundle for TLS")
    tls_cert_file: FilePath | None = Field(default=None, description="client certificate (mTLS)")
    tls_key_file: FilePath | None = Field(default=None, description="client key (mTLS)")
    stream_replicas: int = Field(default=1, ge=1, le=5, description="3 on a clustered JetStream")

    @field_validator("url")
    @classmethod
    def _urls_are_nats(cls, value: str) -> str:
        servers = [part.strip() for part in value.split(",") if part.strip()]
        if not servers:
            raise ValueError("names no server")
        for server in servers:
            try:
                parts = urlsplit(server if "://" in server else f"nats://{server}")
                port = parts.port
            except ValueError as error:
                raise ValueError(f"{server!r} is not a valid URL ({error})") from None
            if parts.scheme not in ("nats", "tls", "ws", "wss") or not parts.hostname:
                raise ValueError(f"{server!r} is not a nats://host:port URL")
            del port
        return value

    @model_validator(mode="after")
    def _tls_pair(self) -> NatsSettings:
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("BCW_NATS_TLS_CERT_FILE and BCW_NATS_TLS_KEY_FILE go together")
        return self

    @property
    def servers(self) -> list[str]:
        return [part.strip() for part in self.url.split(",") if part.strip()]


class ConsumerSettings(BaseSettings):
    """How a worker consumes its facts."""

    model_config = _group("BCW_CONSUMER_")

    batch_size: int = Field(
        default=256, ge=1, le=1000, description="facts fetched and applied at once"
    )
    lanes: int = Field(
        default=2,
        ge=1,
        le=16,
        description="batches applied at once; one node's facts keep one lane",
    )
    fetch_timeout: float = Field(default=1.0, gt=0, description="seconds a fetch waits for facts")
    ack_wait: float = Field(default=60.0, gt=0, description="seconds before JetStream redelivers")
    max_deliver: int = Field(
        default=10, ge=2, description="deliveries before a fact is dead-lettered"
    )
    max_ack_pending: int = Field(default=4096, ge=1, description="unacked facts per consumer")
    retry_attempts: int = Field(
        default=5, ge=1, description="tries of a transient failure per batch"
    )
    retry_max_seconds: float = Field(
        default=5.0, gt=0, description="largest back-off between tries"
    )
    nak_delay: float = Field(
        default=2.0, ge=0, description="seconds before a failed fact is redelivered"
    )
    drain_seconds: float = Field(default=8.0, gt=0, description="bound on the SIGTERM drain")


class OutboxSettings(BaseSettings):
    """The outbox relay."""

    model_config = _group("BCW_OUTBOX_")

    relay: bool = Field(
        default=True,
        description="run the relay in this process; off where dedicated `bcw run relay` processes relay",
    )
    batch_size: int = Field(default=500, ge=1, description="rows claimed per round")
    poll_seconds: float = Field(default=1.0, gt=0, description="fallback poll when no NOTIFY comes")
    publish_timeout: float = Field(default=5.0, gt=0, description="seconds to wait for a PubAck")


class RetentionSettings(BaseSettings):
    """Pruning of old rows, in bounded batches, by one leased replica."""

    model_config = _group("BCW_RETENTION_")

    node_events: Seconds = Field(
        default=timedelta(days=30), description="keep node events this long"
    )
    processed_facts: Seconds = Field(
        default=timedelta(hours=25),
        description="keep inbox rows this long: longer than the facts stream's max age (24 h)",
    )
    session_history: Seconds = Field(
        default=timedelta(days=7), description="keep session history (bcw explain) this long"
    )
    interval: float = Field(default=60.0, gt=0, description="seconds between pruning passes")
    batch: int = Field(default=5000, ge=1, description="rows deleted per statement")
    lease_ttl: Seconds = Field(
        default=timedelta(seconds=30), description="lease of the pruning loop"
    )


class LivenessSettings(BaseSettings):
    """The liveness controller's periods and thresholds."""

    model_config = _group("BCW_LIVENESS_")

    sweep_interval: float = Field(default=5.0, gt=0, description="seconds between sweeps")
    heartbeat_interval: Seconds = Field(
        default=timedelta(seconds=10), description="daemon heartbeat"
    )
    missed_heartbeats: int = Field(
        default=3, ge=1, description="heartbeats missed before a session is stale"
    )
    flush_period: Seconds = Field(
        default=timedelta(seconds=15), description="gateway liveness flush period"
    )
    gateway_grace: Seconds = Field(
        default=timedelta(seconds=120),
        description="after a gateway's lease expired, before its sessions go",
    )
    outage_threshold: Seconds = Field(
        default=timedelta(seconds=20),
        description="a gap between sweeps longer than this is an outage",
    )
    outage_grace: Seconds = Field(
        default=timedelta(minutes=5),
        description="age-based transitions wait this long after an outage",
    )
    lease_ttl: Seconds = Field(
        default=timedelta(seconds=15), description="the sweep lease; a standby takes over after it"
    )
    blind_after: Seconds | None = Field(
        default=None,
        description="a gateway none of whose flushes was applied for this long is blind "
        "(its sessions are held); default two flush periods",
    )
    breaker_share: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="a sweep that would disconnect more than this share of one gateway's "
        "connected sessions disconnects none of them (the fleet breaker)",
    )
    breaker_minimum: int = Field(
        default=20, ge=1, description="the breaker holds only this many stale sessions or more"
    )

    @property
    def stale_after(self) -> timedelta:
        """3 heartbeat intervals plus one flush period: 45 s by default."""
        return self.heartbeat_interval * self.missed_heartbeats + self.flush_period

    @property
    def blind_after_or_default(self) -> timedelta:
        """`blind_after`, or two flush periods (30 s by default)."""
        return self.blind_after or 2 * self.flush_period


class ReplaySettings(BaseSettings):
    """The replay dispatcher's credits, back-off and dispatch loop."""

    model_config = _group("BCW_REPLAY_")

    credits: int = Field(default=8, ge=1, description="commands in flight per node and lane")
    busy_base: Seconds = Field(default=timedelta(seconds=1), description="first BUSY back-off")
    busy_cap: Seconds = Field(default=timedelta(seconds=30), description="largest BUSY back-off")
    dispatch_interval: float = Field(
        default=1.0, gt=0, description="seconds between dispatch rounds when nothing wakes the loop"
    )
    nodes_per_round: int = Field(
        default=500, ge=1, description="nodes a dispatch round serves at most"
    )
    lease_ttl: Seconds = Field(default=timedelta(seconds=10), description="the dispatch lease")


class QuarantineSettings(BaseSettings):
    """The quarantine enforcer's limits."""

    model_config = _group("BCW_QUARANTINE_")

    max_alternations: int = Field(
        default=3, ge=1, description="alternations allowed in the window; one more quarantines"
    )
    window: Seconds = Field(default=timedelta(minutes=10), description="the counting window")


class Settings(BaseSettings):
    """Everything a `bcw` process reads from its environment."""

    model_config = SettingsConfigDict(env_prefix="BCW_", extra="ignore", frozen=True)

    subject_root: str = Field(default="bc", description="subject root; stream names follow it")
    health_port: int = Field(default=8080, ge=0, le=65535, description="0 picks a free port")
    log_format: Literal["json", "console"] = Field(default="console", description="log line format")
    log_level: LogLevel = Field(
        default="INFO", description="DEBUG, INFO, WARNING, ERROR or CRITICAL"
    )
    instance: str | None = Field(
        default=None, description="this process's name; defaults to host:pid"
    )

    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    nats: NatsSettings = Field(default_factory=NatsSettings)
    consumer: ConsumerSettings = Field(default_factory=ConsumerSettings)
    outbox: OutboxSettings = Field(default_factory=OutboxSettings)
    retention: RetentionSettings = Field(default_factory=RetentionSettings)
    quarantine: QuarantineSettings = Field(default_factory=QuarantineSettings)
    liveness: LivenessSettings = Field(default_factory=LivenessSettings)
    replay: ReplaySettings = Field(default_factory=ReplaySettings)

    @field_validator("subject_root")
    @classmethod
    def _root_is_one_token(cls, value: str) -> str:
        if not ROOT_RE.match(value):
            raise ValueError(f"must match {ROOT_RE.pattern}")
        return value

    @model_validator(mode="after")
    def _idle_timeout_fits(self) -> Settings:
        idle = self.database.idle_in_transaction_timeout
        if idle and idle <= self.outbox.publish_timeout:
            raise ValueError(
                f"BCW_DATABASE_IDLE_IN_TRANSACTION_TIMEOUT ({idle:g}) must be above "
                f"BCW_OUTBOX_PUBLISH_TIMEOUT ({self.outbox.publish_timeout:g}): the relay waits "
                "for PubAcks inside its transaction"
            )
        return self

    @model_validator(mode="after")
    def _timeouts_fit(self) -> Settings:
        if self.database.command_timeout >= self.consumer.ack_wait:
            raise ValueError(
                f"BCW_DATABASE_COMMAND_TIMEOUT ({self.database.command_timeout:g}) must be below "
                f"BCW_CONSUMER_ACK_WAIT ({self.consumer.ack_wait:g}): a slow statement would "
                "outlive the fact's delivery"
            )
        return self


_GROUPS: dict[str, type[BaseSettings]] = {
    cls.__name__: cls
    for cls in (
        Settings,
        DatabaseSettings,
        NatsSettings,
        ConsumerSettings,
        OutboxSettings,
        RetentionSettings,
        LivenessSettings,
        ReplaySettings,
        QuarantineSettings,
    )
}


def describe(error: ValidationError) -> list[str]:
    """One line per bad setting, named as the operator sets it: `BCW_X_Y: what is wrong`.

    Values are shown only for settings that are not secrets.
    """
    group = _GROUPS.get(error.title)
    prefix = str(group.model_config.get("env_prefix", "BCW_")) if group else "BCW_"
    lines = []
    for item in error.errors(include_url=False):
        location = [str(part) for part in item["loc"]]
        message = str(item["msg"]).removeprefix("Value error, ")
        if not location:  # a rule across settings names them itself
            lines.append(message)
            continue
        field = location[0]
        variable = prefix + field.upper()
        secret = group is not None and _is_secret(group, field)
        shown = "" if secret or item.get("input") is None else f" (got {_short(item['input'])})"
        lines.append(f"{variable}: {message}{shown}")
    return lines


def _is_secret(group: type[BaseSettings], field: str) -> bool:
    info = group.model_fields.get(field)
    return info is not None and "SecretStr" in repr(info.annotation)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
