"""NATS and JetStream: the connection, and provisioning of streams and consumers.

Called by the entry point (`bcw provision`, each worker at start) and the tests. Creating
is idempotent; a drifted setting is corrected, or reported clearly when the server
cannot change it in place.
"""

from __future__ import annotations

import contextlib
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from nats.aio.client import Client as NATS
from nats.errors import NoServersError
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import BadRequestError, NotFoundError

from schemas.subjects import Subjects
from workers.runtime.base.errors import (
    RefusedError,
    SettingError,
    UnreachableError,
    is_nats_refusal,
)
from workers.runtime.base.settings import ConsumerSettings, NatsSettings
from workers.runtime.base.waiting import Patience
from workers.runtime.bus import principals

log = logging.getLogger(__name__)

HOUR = 3600.0
DAY = 24 * HOUR
DUPLICATE_WINDOW = 120.0


class ProvisionError(RuntimeError):
    """A stream or consumer exists with a setting the server cannot change in place."""


async def connect(
    settings: NatsSettings,
    name: str,
    on_event: Callable[[str], Awaitable[None]] | None = None,
    on_refused: Callable[[RefusedError], None] | None = None,
) -> NATS:
    """A client that, once connected, never gives up reconnecting.

    The first connection is one bounded round over the servers (nats-py's endless
    reconnect would loop inside the library, deaf to a stop): it raises `UnreachableError`,
    `RefusedError` (credentials or permissions) or `SettingError`. A refusal after that
    (credentials revoked, a permission missing) is handed to `on_refused`.
    """
    connected = False
    seen: list[Exception] = []
    # every failed reconnect reports an error: a line now and then, and one at the end
    outage = Patience("NATS connection", log, every=30.0)

    async def report(event: str) -> None:
        log.info("nats %s", event)
        if on_event is not None:
            await on_event(event)

    async def disconnected() -> None:
        if connected and not client.is_closed:  # not our own close
            await report("disconnected")

    async def reconnected() -> None:
        outage.succeeded()
        await report("reconnected")

    async def error(exc: Exception) -> None:
        if not connected:
            seen.append(exc)  # the first connection reports them itself
            return
        if is_nats_refusal(exc) and on_refused is not None:
            on_refused(RefusedError(credentials_setting(settings), f"NATS refused us: {exc}"))
        outage.failed(exc)

    options: dict[str, object] = {
        "servers": settings.servers,
        "name": name,
        "max_reconnect_attempts": 1,  # the first round only; endless once connected
        "reconnect_time_wait": 1.0,
        "connect_timeout": settings.connect_timeout,
        # a silently dead connection (a partition: no reset) is noticed in about 30 s,
        # not the client's default 4 minutes
        "ping_interval": 10,
        "max_outstanding_pings": 3,
        "allow_reconnect": True,
        "disconnected_cb": disconnected,
        "reconnected_cb": reconnected,
        "error_cb": error,
        "pending_size": 64 * 1024 * 1024,
    }
    if settings.creds_file:
        options["user_credentials"] = str(settings.creds_file)
    if settings.nkey_seed_file:
        options["nkeys_seed"] = str(settings.nkey_seed_file)
        options["inbox_prefix"] = _nkey_inbox(settings)
    if settings.user:
        options["user"] = settings.user
    if settings.password:
        options["password"] = settings.password.get_secret_value()
    if settings.token:
        options["token"] = settings.token.get_secret_value()
    if settings.tls_ca_file or settings.tls_cert_file:
        options["tls"] = _tls_context(settings)
    client = NATS()
    try:
        await client.connect(**options)  # type: ignore[arg-type]
    except BaseException as failure:
        with contextlib.suppress(Exception):
            await client.close()
        if isinstance(failure, Exception):
            raise _named(failure, seen, settings) from failure
        raise
    client.options["max_reconnect_attempts"] = -1
    connected = True
    return client


def _tls_context(settings: NatsSettings) -> ssl.SSLContext:
    try:
        context = ssl.create_default_context(
            cafile=str(settings.tls_ca_file) if settings.tls_ca_file else None
        )
    except (OSError, ssl.SSLError) as error:
        raise SettingError("BCW_NATS_TLS_CA_FILE", f"cannot be used ({error})") from error
    if settings.tls_cert_file and settings.tls_key_file:
        try:
            context.load_cert_chain(str(settings.tls_cert_file), str(settings.tls_key_file))
        except (OSError, ssl.SSLError) as error:
            raise SettingError(
                "BCW_NATS_TLS_CERT_FILE", f"cannot be used with its key ({error})"
            ) from error
    return context


def _nkey_inbox(settings: NatsSettings) -> str:
    """Replies come to an inbox of this principal's own (`principals.inbox_prefix`)."""
    assert settings.nkey_seed_file is not None
    try:
        seed = settings.nkey_seed_file.read_bytes().strip()
        return principals.inbox_prefix(principals.public_key(seed))
    except Exception as error:  # unreadable, or not an nkey seed
        raise SettingError(
            "BCW_NATS_NKEY_SEED_FILE", f"is not a usable nkey seed ({type(error).__name__})"
        ) from None


def credentials_setting(settings: NatsSettings) -> str:
    """The setting an operator would look at when NATS refuses who we are."""
    if settings.creds_file:
        return "BCW_NATS_CREDS_FILE"
    if settings.nkey_seed_file:
        return "BCW_NATS_NKEY_SEED_FILE"
    if settings.token:
        return "BCW_NATS_TOKEN"
    if settings.user:
        return "BCW_NATS_USER"
    return "BCW_NATS_URL"


def _named(failure: Exception, seen: list[Exception], settings: NatsSettings) -> Exception:
    errors = [*seen, failure]
    for error in errors:
        if is_nats_refusal(error):
            return RefusedError(credentials_setting(settings), f"NATS refused us: {error}")
    for error in errors:
        if isinstance(error, ValueError | TypeError):
            return SettingError("BCW_NATS_URL", f"cannot be used ({error})")
        if isinstance(error, ssl.SSLError):
            return SettingError("BCW_NATS_TLS_CA_FILE", f"TLS failed ({error})")
    last = next((e for e in reversed(errors) if not isinstance(e, NoServersError)), failure)
    detail = f"{type(last).__name__}: {last}".strip().rstrip(":")
    return UnreachableError(
        "BCW_NATS_URL", f"cannot reach {', '.join(settings.servers)} ({detail or 'timed out'})"
    )


def stream_configs(subjects: Subjects, replicas: int = 1) -> list[StreamConfig]:
    """The four streams of the contract (DESIGN §3)."""

    def stream(name: str, subject_list: list[str], max_age: float) -> StreamConfig:
        return StreamConfig(
            name=name,
            subjects=subject_list,
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            discard=DiscardPolicy.OLD,
            max_age=max_age,
            num_replicas=replicas,
            # every stream: the outbox relay and the dead-letter path re-publish with the
            # same Nats-Msg-Id after a failure, and rely on JetStream to drop the double
            duplicate_window=DUPLICATE_WINDOW,
        )

    return [
        stream(subjects.facts_stream, [subjects.all_facts], DAY),
        stream(subjects.events_stream, [subjects.all_events, subjects.revocations], 7 * DAY),
        stream(subjects.gateway_stream, [subjects.all_notices], HOUR),
        stream(subjects.dead_stream, [subjects.all_dead], 14 * DAY),
    ]


_UPDATABLE = ("subjects", "max_age", "duplicate_window", "num_replicas", "discard")
_FIXED = ("retention", "storage")


async def ensure_stream(js: JetStreamContext, wanted: StreamConfig) -> str:
    """Create the stream, or correct its drift. Returns `created`, `updated` or `unchanged`."""
    assert wanted.name is not None
    try:
        info = await js.stream_info(wanted.name)
    except NotFoundError:
        await js.add_stream(wanted)
        log.info("stream %s created", wanted.name)
        return "created"
    current = info.config
    for field in _FIXED:
        if getattr(current, field) != getattr(wanted, field):
            raise ProvisionError(
                f"stream {wanted.name}: {field} is {getattr(current, field)}, the contract wants "
                f"{getattr(wanted, field)}; the server cannot change it in place (recreate the stream)"
            )
    drift = {
        field: (getattr(current, field), getattr(wanted, field))
        for field in _UPDATABLE
        if _differs(getattr(current, field), getattr(wanted, field))
    }
    if not drift:
        return "unchanged"
    log.warning("stream %s drifted, correcting: %s", wanted.name, drift)
    await js.update_stream(wanted)
    return "updated"


def _differs(current: object, wanted: object) -> bool:
    if isinstance(current, float) or isinstance(wanted, float):
        return abs(float(current or 0) - float(wanted or 0)) > 1e-6  # type: ignore[arg-type]
    if isinstance(current, list) and isinstance(wanted, list):
        return sorted(current) != sorted(wanted)
    return current != wanted


async def provision_streams(
    js: JetStreamContext, subjects: Subjects, replicas: int = 1
) -> dict[str, str]:
    return {
        str(config.name): await ensure_stream(js, config)
        for config in stream_configs(subjects, replicas)
    }


@dataclass(frozen=True)
class ConsumerSpec:
    """A worker's durable pull consumer on the facts stream."""

    durable: str
    filter_subjects: tuple[str, ...]

    def config(self, settings: ConsumerSettings) -> ConsumerConfig:
        return ConsumerConfig(
            name=self.durable,
            durable_name=self.durable,
            deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=settings.ack_wait,
            max_deliver=settings.max_deliver,
            max_ack_pending=settings.max_ack_pending,
            max_waiting=512,
            # one filter goes in `filter_subject`: the create request's subject then names
            # it, so a permission can pin a principal's consumer to its own filter
            filter_subject=self.filter_subjects[0] if len(self.filter_subjects) == 1 else None,
            filter_subjects=list(self.filter_subjects) if len(self.filter_subjects) > 1 else None,
        )


async def ensure_consumer(
    js: JetStreamContext, stream: str, spec: ConsumerSpec, settings: ConsumerSettings
) -> None:
    """Create or update the durable consumer (a bound `pull_subscribe` would ignore changes)."""
    try:
        await js.add_consumer(stream, spec.config(settings))
    except BadRequestError as error:
        raise ProvisionError(
            f"consumer {spec.durable} on {stream} cannot take the configured settings: {error}; "
            "delete it (`nats consumer rm`) to recreate it"
        ) from error
