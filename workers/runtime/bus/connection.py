"""The NATS connection: one bounded first round over the servers, then a client that never
gives up reconnecting; TLS, credentials and nkey inboxes from the settings; a failure
named by the setting an operator would look at.

Called by the entry point, every worker process, the gateway and the tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
from collections.abc import Awaitable, Callable

from nats.aio.client import Client as NATS
from nats.errors import NoServersError

from workers.runtime.base.errors import (
    Reach,
    RefusedError,
    SettingError,
    UnreachableError,
    is_nats_refusal,
    reach,
    refused_publish_subject,
)
from workers.runtime.base.runtime_settings import NatsSettings
from workers.runtime.base.waiting import Patience
from workers.runtime.bus import principals, server

log = logging.getLogger(__name__)


class RefusedSubjects:
    """Subjects the server refused this principal to publish to. Such a refusal is for
    one subject (the connection stays up), so it does not stop the process: the outbox
    relay dead-letters the rows bound there instead of retrying them for ever.

    The client hands the server's error text over lower-cased, so a refusal is kept as
    said (`said`); a subject is known refused once a publish to it failed while a refusal
    of its spelling in any case was said (`confirm`). Subjects are case-sensitive: an
    allowed `bc.events.x` is never taken for a refused `bc.events.X`.
    """

    def __init__(self) -> None:
        self._said: set[str] = set()
        self._subjects: set[str] = set()

    def add(self, subject: str) -> None:
        if subject.lower() not in self._said:
            self._said.add(subject.lower())
            if subject.lower().startswith("$js.api."):  # a request: its caller says what it means
                log.debug("NATS refused us the request %s", subject)
                return
            log.error(
                "NATS refused us to publish to %s: a permission is missing (rows bound there "
                "are dead-lettered; grant it and re-drive them)",
                subject,
            )

    def said(self, subject: str) -> bool:
        """Whether the server refused `subject`, spelled in any case."""
        return subject.lower() in self._said

    def confirm(self, subject: str) -> bool:
        """A publish to `subject` failed: whether that was the refusal (it is then known
        refused, and rows bound there are buried before they are tried)."""
        if self.said(subject):
            self._subjects.add(subject)
            return True
        return False

    def __contains__(self, subject: object) -> bool:
        return subject in self._subjects


async def connect(
    settings: NatsSettings,
    name: str,
    on_event: Callable[[str], Awaitable[None]] | None = None,
    on_refused: Callable[[RefusedError], None] | None = None,
    on_publish_refused: Callable[[str], None] | None = None,
) -> NATS:
    """A client that, once connected, never gives up reconnecting.

    The first connection is one bounded round over the servers (nats-py's endless
    reconnect would loop inside the library, deaf to a stop): it raises `UnreachableError`,
    `RefusedError` (credentials or permissions) or `SettingError`. A refusal after that
    (credentials revoked, a permission missing) is handed to `on_refused` — but a refused
    publish to one subject goes to `on_publish_refused`, when given.
    """
    connected = False
    seen: list[Exception] = []
    never = asyncio.Event()  # the round met TLS that fails (nats-py would wait for ever)
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
            if reach(exc) is Reach.TLS:  # a refusal is one server's: the round goes on
                never.set()
            return
        subject = refused_publish_subject(exc)
        if subject is not None and on_publish_refused is not None:
            on_publish_refused(subject)
            return
        if is_nats_refusal(exc) and on_refused is not None:
            on_refused(RefusedError(credentials_setting(settings), f"NATS refused us: {exc}"))
        outage.failed(exc)

    options: dict[str, object] = {
        "servers": settings.servers,  # each round's own order, below
        "dont_randomize": True,
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
    # TLS that fails at one server ends nats-py's round: the next round may reach another
    # (a pod behind the same Service, not yet given its new certificate); all of them: exit 2
    # Each round starts at the next server of the list (from a random one: the load spread
    # as the client's own shuffle spreads it), so every server is tried first twice.
    rounds = max(3, 2 * len(settings.servers))
    start = random.randrange(len(settings.servers))
    for round_ in range(1, rounds + 1):
        first = (start + round_ - 1) % len(settings.servers)
        options["servers"] = [*settings.servers[first:], *settings.servers[:first]]
        client = NATS()
        never.clear()
        try:
            await _first_round(client.connect(**options), never, _round_bound(settings))  # type: ignore[arg-type]
        except BaseException as failure:
            with contextlib.suppress(Exception):
                await client.close()
            if isinstance(failure, Exception) and never.is_set() and round_ < rounds:
                continue
            if isinstance(failure, Exception):
                raise _named(failure, seen, settings) from failure
            raise
        break
    refusal = server.too_old(server.server_version(client))
    if refusal is not None:  # one floor everywhere (`server.FLOOR`)
        await client.close()
        raise SettingError("BCW_NATS_URL", refusal)
    client.options["max_reconnect_attempts"] = -1
    connected = True
    return client


async def _first_round(connecting: Awaitable[None], never: asyncio.Event, bound: float) -> None:
    """The client's first round, given up as soon as `never` is set (nats-py, told of a
    certificate that does not verify, keeps its connect waiting for ever) or after `bound`
    seconds (a round that hangs is one more failed try: waited on by the caller)."""
    attempt = asyncio.ensure_future(connecting)
    stop = asyncio.ensure_future(never.wait())
    try:
        await asyncio.wait({attempt, stop}, timeout=bound, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
        if not attempt.done():
            attempt.cancel()
            await asyncio.gather(attempt, return_exceptions=True)
    if attempt.cancelled():
        raise NoServersError() if never.is_set() else TimeoutError()
    attempt.result()


def _round_bound(settings: NatsSettings) -> float:
    """The longest a first round may take: each server's connect, then its pause."""
    return len(settings.servers) * (settings.connect_timeout + 1.0) * 2 + 5.0


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


def _tls_setting(settings: NatsSettings, error: BaseException) -> str:
    """The setting behind a TLS failure: the CA for a certificate that does not verify,
    else the client certificate when one is given (refused by the server), else the CA."""
    if isinstance(error, ssl.SSLCertVerificationError) or not settings.tls_cert_file:
        return "BCW_NATS_TLS_CA_FILE"
    return "BCW_NATS_TLS_CERT_FILE"


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
    for error in errors:  # TLS that can never work first: `reach` (a cut handshake waits)
        if reach(error) is Reach.TLS:
            return SettingError(_tls_setting(settings, error), f"TLS failed ({error})")
    for error in errors:
        if reach(error) is Reach.SETTING:
            return SettingError("BCW_NATS_URL", f"cannot be used ({error})")
    last = next((e for e in reversed(errors) if not isinstance(e, NoServersError)), failure)
    detail = f"{type(last).__name__}: {last}".strip().rstrip(":")
    return UnreachableError(
        "BCW_NATS_URL", f"cannot reach {', '.join(settings.servers)} ({detail or 'timed out'})"
    )
