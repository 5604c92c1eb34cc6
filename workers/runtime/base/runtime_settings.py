"""The settings groups of the runtime: PostgreSQL, NATS, the consumer, the outbox relay and
retention (`BCW_DATABASE_*`, `BCW_NATS_*`, `BCW_CONSUMER_*`, `BCW_OUTBOX_*`,
`BCW_RETENTION_*`). Gathered by `settings.Settings`; nothing here reads the environment
by itself.
"""

from __future__ import annotations

from datetime import timedelta
from urllib.parse import urlsplit

from pydantic import Field, FilePath, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings

from schemas.base import check_gateway_ids
from workers.runtime.base.libpq import database_hosts
from workers.runtime.base.setting_types import Duration, Seconds, env_group, format_duration


class DatabaseSettings(BaseSettings):
    """PostgreSQL. `BCW_DATABASE_URL` is a libpq URL; it may carry a password."""

    model_config = env_group("BCW_DATABASE_")

    url: SecretStr = Field(
        default=SecretStr("postgresql://postgres@127.0.0.1:5432/postgres"),
        description="libpq connection URL",
    )
    pool_min: int = Field(default=1, ge=0, description="connections kept open")
    pool_max: int = Field(
        default=8,
        ge=1,
        description="connections per process at most (times the processes: below PostgreSQL's max_connections)",
    )
    command_timeout: Seconds = Field(
        default=20.0, gt=0, description="a statement's bound; below BCW_CONSUMER_ACK_WAIT"
    )
    connect_timeout: Seconds = Field(
        default=10.0, gt=0, description="one connection attempt's bound (a blackholed host)"
    )
    idle_in_transaction_timeout: Seconds = Field(
        default=30.0,
        ge=0,
        description="PostgreSQL ends one of our sessions idle in a transaction this long "
        "(idle_in_transaction_session_timeout): a worker cut off by a partition must not hold its row locks for hours; "
        "0 sends nothing (e.g. behind a PgBouncer that refuses the startup parameter)",
    )
    lock_timeout: Seconds = Field(
        default=15.0,
        ge=0,
        description="the longest one of our statements waits for a row lock (lock_timeout): a "
        "transaction kept open on a node's row elsewhere (a hostile gateway's) holds back "
        "that node's fact only, retried later; 0 sends nothing. A few waits keep their own, "
        "whatever this is: a gateway's Hello waits 2s (its SQL function), a flush 3s for the "
        "session rows it skipped, `bcw migrate` 5s at a time for its schema lock and 1s at a "
        "time for a table's",
    )
    statement_cache_size: int = Field(
        default=100, ge=0, description="0 behind PgBouncer (transaction mode) older than 1.21"
    )
    application_name: str = Field(
        default="",
        max_length=63,
        pattern=r"^[ -~]*$",
        description="how this process's sessions appear in pg_stat_activity and the server's "
        "log (empty: bcw-<worker> for `bcw run <worker>`, else bcw-<command>, e.g. "
        "bcw-migrate)",
    )

    @field_validator("url")
    @classmethod
    def _url_is_postgres(cls, value: SecretStr) -> SecretStr:
        # never echo the URL: it may carry a password
        database_hosts(value.get_secret_value())
        return value

    @model_validator(mode="after")
    def _pool_bounds(self) -> DatabaseSettings:
        if self.pool_min > self.pool_max:
            raise ValueError(
                f"BCW_DATABASE_POOL_MIN ({self.pool_min}) is above BCW_DATABASE_POOL_MAX ({self.pool_max})"
            )
        return self


def _listed(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


class NatsSettings(BaseSettings):
    """NATS and JetStream."""

    model_config = env_group("BCW_NATS_")

    url: str = Field(default="nats://127.0.0.1:4222", description="comma-separated server URLs")
    connect_timeout: Seconds = Field(
        default=5.0, gt=0, description="one connection attempt's bound (a blackholed host)"
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
    stream_max_bytes: int = Field(
        default=-1,
        ge=-1,
        description="bytes each stream keeps at most (-1: no bound but its age; the chart sets "
        "8 GiB): the events, notices and dead letters drop their oldest beyond it; the facts "
        "stream refuses new facts (gateways retry) rather than drop unapplied ones. JetStream "
        "reserves it on disk for each stream",
    )
    stream_max_msgs: int = Field(
        default=50_000_000, ge=1000, description="messages each stream keeps at most (likewise)"
    )
    max_msg_size: int = Field(
        default=2**20, ge=4096, description="bytes a message on any stream may have at most"
    )
    gateways: str = Field(
        default="",
        description="comma-separated ids of the gateways: `bcw provision` makes each one's "
        "notices consumer `gw-<id>` (with those of BCW_NATS_FACTS_GATEWAYS), which a gateway "
        "only pulls from: it makes none, and waits while its own is missing",
    )
    subscribers: str = Field(
        default="",
        description="comma-separated subscriber applications (`bcw auth nats --subscribers`): "
        "`bcw provision` makes each one's durable consumer `sub-<app>` of the events stream, "
        "which only its own principal `subscriber-<app>` may pull from",
    )
    dead_letters_per_source: int = Field(
        default=10_000,
        ge=100,
        description="dead letters kept per worker, cause and source (a gateway, or the outbox): "
        "a flood of one gateway's junk evicts only its own oldest letters, never another's nor a "
        "parked fact",
    )
    facts_gateways: str = Field(
        default="",
        description="comma-separated gateway ids whose facts each go to a stream of their own, "
        "bounded by BCW_NATS_FACTS_BYTES_PER_GATEWAY, that the facts stream sources: one "
        "gateway's flood then fills only its own (empty: one facts stream takes every "
        "gateway's facts, and one gateway can fill it for all). Every gateway must be listed "
        "(`bcw provision` creates the streams); see docs/kubernetes.md",
    )
    facts_bytes_per_gateway: int = Field(
        default=4 * 2**30,
        ge=2**20,
        description="bytes each listed gateway's facts stream keeps at most (24 h of its facts: "
        "its flushes alone are about 1.6 GB a day for 5,000 sessions); beyond it that "
        "gateway's new facts are refused, and only its own",
    )
    facts_msgs_per_gateway: int = Field(
        default=5_000_000,
        ge=1000,
        description="messages one gateway's facts take at most: its own facts stream's bound "
        "(with BCW_NATS_FACTS_GATEWAYS), or, in the one facts stream, its subjects' together "
        "(an eighth a fact type); beyond it that gateway's new facts are refused, and only its "
        "own. At most a tenth of BCW_NATS_STREAM_MAX_MSGS",
    )
    stream_max_consumers: int = Field(
        default=64,
        ge=8,
        description="consumers a stream may have at most (`bcw provision` changes an existing "
        "stream's on nats-server 2.12 and later)",
    )
    notices_max_consumers: int = Field(
        default=4096,
        ge=8,
        le=100_000,
        description="consumers the gateways' notices stream may have at most: one durable a "
        "gateway (`bcw provision`), so above the gateways the fleet will run — "
        "BCW_NATS_STREAM_MAX_CONSUMERS (64) allowed about 60. `bcw provision` changes an "
        "existing stream's (nats-server 2.12 and later; one before refuses: recreate the stream)",
    )
    fast_path: bool = Field(
        default=True,
        description="write a batch's acks and the relay's fast batches as one write through "
        "nats-py's internals, checked by a probe at start (false: one publish and one ack "
        "a message through its public API, about twice the CPU a message; for a nats-py "
        "upgrade that has not been tested, docs/runtime.md)",
    )
    # each stream's retention: at least the 2-minute duplicate window (JetStream's rule)
    facts_max_age: Seconds = Field(
        default=86400.0,
        ge=120,
        description="how long the facts stream (and each gateway's own) keeps a fact: a worker "
        "stopped longer loses what it has not read, and a parked fact can be re-driven only "
        "this long; below BCW_RETENTION_PROCESSED_FACTS (the inbox must outlive a redelivery)",
    )
    events_max_age: Seconds = Field(
        default=7 * 86400.0,
        ge=120,
        description="how long the events stream keeps an event: how far back a subscriber can "
        "resume (bcw events --start-seq, --since)",
    )
    notices_max_age: Seconds = Field(
        default=3600.0,
        ge=120,
        description="how long the notices stream keeps a notice for a gateway that is away",
    )
    dead_max_age: Seconds = Field(
        default=14 * 86400.0,
        ge=120,
        description="how long each dead-letter stream keeps a letter (to list and re-drive)",
    )
    events_max_bytes: int = Field(
        default=0,
        ge=-1,
        description="bytes the events stream keeps at most, its oldest dropped beyond (0: "
        "BCW_NATS_STREAM_MAX_BYTES; -1: no bound but its age)",
    )
    dead_max_bytes: int = Field(
        default=0,
        ge=-1,
        description="bytes each publisher's dead-letter stream (each worker's, the relay's) "
        "keeps at most, its oldest dropped beyond: one's junk evicts only its own letters (0: "
        "BCW_NATS_STREAM_MAX_BYTES; -1: no bound but its age)",
    )

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

    @field_validator("facts_gateways")
    @classmethod
    def _gateway_ids(cls, value: str) -> str:
        check_gateway_ids(_listed(value))
        return value

    @field_validator("gateways", "subscribers")
    @classmethod
    def _names(cls, value: str) -> str:
        check_gateway_ids(_listed(value))
        return value

    @property
    def notices_gateways(self) -> tuple[str, ...]:
        """The gateways whose notices consumers `bcw provision` makes: `gateways`, then
        those of `facts_gateways` not among them."""
        listed = _listed(self.gateways)
        return (*listed, *(g for g in _listed(self.facts_gateways) if g not in listed))

    @property
    def subscriber_apps(self) -> tuple[str, ...]:
        return tuple(_listed(self.subscribers))

    @property
    def gateways_with_own_facts(self) -> tuple[str, ...]:
        """`facts_gateways`, in the order given."""
        return tuple(_listed(self.facts_gateways))

    @model_validator(mode="after")
    def _one_gateway_under_the_total(self) -> NatsSettings:
        if self.facts_msgs_per_gateway * 10 > self.stream_max_msgs:
            raise ValueError(
                f"BCW_NATS_FACTS_MSGS_PER_GATEWAY ({self.facts_msgs_per_gateway}) must be at most "
                f"a tenth of BCW_NATS_STREAM_MAX_MSGS ({self.stream_max_msgs}): one gateway "
                "must not fill the facts stream for the others"
            )
        return self

    @model_validator(mode="after")
    def _every_gateway_a_notices_consumer(self) -> NatsSettings:
        if len(self.notices_gateways) > self.notices_max_consumers:
            raise ValueError(
                f"BCW_NATS_NOTICES_MAX_CONSUMERS ({self.notices_max_consumers}) is below the "
                f"{len(self.notices_gateways)} gateways listed: each needs a notices consumer"
            )
        return self

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

    model_config = env_group("BCW_CONSUMER_")

    batch_size: int = Field(
        default=256, ge=1, le=1000, description="facts fetched and applied at once"
    )
    batch_bytes: int = Field(
        default=4 * 2**20,
        ge=65536,
        description="bytes of facts fetched and applied at once, at most (but one fact); no more "
        "is fetched while twice this is in hand: a worker's memory stays bounded whatever "
        "its facts carry (10,000-entry flushes)",
    )
    lanes: int = Field(
        default=2,
        ge=1,
        le=16,
        description="batches applied at once; one node's facts keep one lane",
    )
    fetch_timeout: Seconds = Field(
        default=1.0, gt=0, description="a pull's wait for facts before it looks at the stop flag"
    )
    linger: Seconds = Field(
        default=0.05,
        ge=0,
        le=1.0,
        description="a batch not yet full waits this long at most after its first fact for more "
        "(0: at once): facts that trickle in are applied in a few full transactions, not one "
        "each; an effect comes this much later",
    )
    ack_wait: Seconds = Field(
        default=60.0, gt=0, description="JetStream redelivers an unacked fact after this"
    )
    max_deliver: int = Field(
        default=10, ge=2, description="deliveries before a fact is dead-lettered"
    )
    max_ack_pending: int = Field(
        default=4096, ge=1, description="unacked facts per consumer (all its replicas together)"
    )
    retry_attempts: int = Field(
        default=5,
        ge=1,
        description="tries of a transient failure while both servers answer, before the fact "
        "behind it is dead-lettered (outages are waited out without counting)",
    )
    retry_max_seconds: Seconds = Field(
        default=5.0, gt=0, description="largest back-off between tries"
    )
    nak_delay: Seconds = Field(
        default=2.0, ge=0, description="a fact a handler asked to retry is redelivered after this"
    )
    drain_seconds: Seconds = Field(default=8.0, gt=0, description="bound on the SIGTERM drain")


class OutboxSettings(BaseSettings):
    """The outbox relay."""

    model_config = env_group("BCW_OUTBOX_")

    relay: bool = Field(
        default=True,
        description="run the relay in this process; off where dedicated `bcw run relay` processes relay",
    )
    batch_size: int = Field(
        default=500, ge=1, description="messages claimed per round (at least a whole pack)"
    )
    poll_seconds: Seconds = Field(
        default=1.0, gt=0, description="fallback poll when no NOTIFY comes"
    )
    publish_timeout: Seconds = Field(default=5.0, gt=0, description="the relay's wait for a PubAck")


#: The youngest session history a worker's login may delete (its retention's pruning):
#: younger rows are insert-only (row-level security, workers.runtime.store.roles).
HISTORY_FLOOR = timedelta(days=1)


class RetentionSettings(BaseSettings):
    """Pruning of old rows, in bounded batches, by one leased replica."""

    model_config = env_group("BCW_RETENTION_")

    node_events: Duration = Field(
        default=timedelta(days=30),
        description="keep node events this long; at least 1 day (their writer's login may "
        "not delete a younger event)",
    )
    processed_facts: Duration = Field(
        default=timedelta(hours=25),
        description="keep inbox rows this long: longer than the facts stream's max age (24 h)",
    )
    session_history: Duration = Field(
        default=timedelta(days=7),
        description="keep session history (bcw explain) this long; at least 1 day (a "
        "worker's login may not delete a younger row)",
    )
    interval: Seconds = Field(default=60.0, gt=0, description="between pruning passes")

    @field_validator("session_history", "node_events")
    @classmethod
    def _history_kept_a_day(cls, value: timedelta) -> timedelta:
        if value < HISTORY_FLOOR:
            raise ValueError(
                f"must be at least {format_duration(HISTORY_FLOOR)}: "
                "a worker's login may not delete a younger row"
            )
        return value

    batch: int = Field(default=5000, ge=1, description="rows deleted per statement")
    lease_ttl: Duration = Field(
        default=timedelta(seconds=30), description="lease of the pruning loop"
    )
