"""Three kinds of error, classified in one place: transient (wait and retry, the process
never exits on them), permanent (this input can never succeed: dead-letter it) and
fatal (this process is misconfigured or not allowed: stop it with a clear line).

Used by the consumer loop, the outbox relay, the leases, the connection helpers and the
entry point. Nothing here does I/O.
"""

from __future__ import annotations

import asyncio
import enum
import re
import ssl

import asyncpg
import asyncpg.exceptions._base as asyncpg_base
import nats.errors
import nats.js.errors


class Severity(enum.Enum):
    TRANSIENT = "transient"
    """Goes away by itself: a lost connection, a restart, a failover, a deadlock."""
    PERMANENT = "permanent"
    """This input cannot succeed however often it is tried: dead-letter it."""
    FATAL = "fatal"
    """The process's settings, credentials or grants are wrong: no fact can succeed."""


class PermanentError(Exception):
    """A handler's refusal that retrying cannot fix; the fact is dead-lettered with the message."""


class SettingError(Exception):
    """A setting that cannot work, named for the operator: `BCW_DATABASE_URL: …`.

    `exit_code` is what `bcw` exits with: 2 for a bad setting, 3 for credentials or
    permissions the server refused, 1 for a server that cannot be reached.
    """

    exit_code = 2

    def __init__(self, setting: str, message: str) -> None:
        super().__init__(f"{setting}: {message}")
        self.setting = setting
        self.message = message


class RefusedError(SettingError):
    """The server refused our credentials or permissions (exit 3)."""

    exit_code = 3


class UnreachableError(SettingError):
    """The server named by the setting cannot be reached now (transient for `bcw run`)."""

    exit_code = 1


_TRANSIENT_PG = (
    asyncpg.DeadlockDetectedError,
    asyncpg.SerializationError,
    asyncpg.PostgresConnectionError,
    asyncpg.CannotConnectNowError,
    asyncpg.TooManyConnectionsError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    asyncpg.QueryCanceledError,  # includes statement timeouts
    asyncpg.LockNotAvailableError,
)
_FATAL_PG = (
    asyncpg.InvalidAuthorizationSpecificationError,  # 28000, 28P01: who we are is refused
    asyncpg.InvalidCatalogNameError,  # 3D000: the database does not exist
    asyncpg.ClientConfigurationError,  # a malformed DSN or option
)
_TRANSIENT_NATS = (
    nats.errors.ConnectionClosedError,
    nats.errors.NoServersError,
    nats.errors.TimeoutError,
    nats.errors.StaleConnectionError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.NoRespondersError,  # JetStream not there (yet): a server restarting
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
)
_PERMANENT_NATS = (nats.errors.MaxPayloadError,)
#: what a NATS server says when it refuses who we are or what we may do
NATS_REFUSALS = ("authorization violation", "authentication", "permissions violation")


def classify(error: BaseException) -> Severity:
    """Which kind of error this is. Pure."""
    if isinstance(error, SettingError):
        return Severity.TRANSIENT if isinstance(error, UnreachableError) else Severity.FATAL
    if isinstance(error, PermanentError):
        return Severity.PERMANENT
    if isinstance(error, _FATAL_PG) or is_nats_refusal(error):
        return Severity.FATAL
    # asyncpg's client-side DataError (a value the column type cannot carry, e.g. an
    # integer over 2^63) is an InterfaceError too: it must not read as a lost connection
    if isinstance(error, (asyncpg_base.DataError, *_PERMANENT_NATS)):
        return Severity.PERMANENT
    if isinstance(error, _TRANSIENT_PG + _TRANSIENT_NATS):
        return Severity.TRANSIENT
    if isinstance(error, asyncpg.PostgresError):
        return _classify_sqlstate(getattr(error, "sqlstate", "") or "")
    if isinstance(error, asyncpg.InterfaceError):
        # the connection closed or the pool closing underneath: passes; anything else
        # asyncpg's client refuses (a wrong number of arguments) is a bug: it does not
        text = str(error).lower()
        closed = "closed" in text or "closing" in text or "released" in text
        return Severity.TRANSIENT if closed else Severity.PERMANENT
    # asyncpg's client state machine confused by a connection lost mid-operation ("cannot
    # switch to state 15"), or a statement cache outdated by a migration: a fresh try works
    if isinstance(error, asyncpg_base.InternalClientError):
        return Severity.TRANSIENT
    if isinstance(error, nats.js.errors.APIError):
        code = getattr(error, "code", None) or 0
        return Severity.TRANSIENT if code >= 500 or code in (408, 429) else Severity.PERMANENT
    if isinstance(error, OSError | asyncio.TimeoutError | ConnectionError):
        return Severity.TRANSIENT
    return Severity.PERMANENT


def _classify_sqlstate(code: str) -> Severity:
    # class 08 connection, 40 transaction rollback, 53 resources, 55 object not in
    # prerequisite state (lock not available), 57 operator intervention (shutdown,
    # statement timeout), 58 system error: all pass
    if code[:2] in {"08", "40", "53", "55", "57", "58"}:
        return Severity.TRANSIENT
    # class 28 authorization, 3D catalog, 42 syntax or access rule (a missing grant, a
    # schema this version does not know: `bcw migrate` was not run): nothing can succeed
    if code[:2] in {"28", "3D", "42"}:
        return Severity.FATAL
    # 22 data exception, 23 integrity, P0 raised by a function, and the rest: this input
    return Severity.PERMANENT


class Reach(enum.Enum):
    """What a failed first connection to a server says about waiting for it."""

    NOT_YET = "not yet"
    """Out of reach, refusing, hanging, starting up, shutting down, full: wait (to a bound)."""
    SETTING = "setting"
    """A setting that can never work (a malformed URL, a database that does not exist)."""
    TLS = "tls"
    """TLS that can never work: a CA that does not verify the server, a certificate or key
    that does not load, a server that offers no TLS where the mode requires it."""
    REFUSED = "refused"
    """The server refused who we are (a bad password, no such role, not allowed)."""


#: a TLS handshake cut short by the peer or the network: a server restarting, not a setting
_TLS_CUT = (
    ssl.SSLEOFError,
    ssl.SSLZeroReturnError,
    ssl.SSLSyscallError,
    ssl.SSLWantReadError,
    ssl.SSLWantWriteError,
)


def reach(error: BaseException) -> Reach:
    """How a failed first connection (PostgreSQL or NATS) is taken: waited on, or a
    setting named at once. A database that does not exist is a setting: the operators
    that provision one make it before its server answers. Pure."""
    if isinstance(error, SettingError):
        return Reach.NOT_YET if isinstance(error, UnreachableError) else Reach.SETTING
    if isinstance(error, ssl.SSLError):
        return Reach.NOT_YET if isinstance(error, _TLS_CUT) else Reach.TLS
    if isinstance(error, ConnectionError) and "rejected SSL upgrade" in str(error):
        return Reach.TLS  # asyncpg's word for a server without TLS under sslmode=require
    if isinstance(error, asyncpg.InvalidCatalogNameError | asyncpg.ClientConfigurationError):
        return Reach.SETTING
    if is_nats_refusal(error):
        return Reach.REFUSED
    if isinstance(error, asyncpg.PostgresError):
        return Reach.REFUSED if classify(error) is Severity.FATAL else Reach.NOT_YET
    if isinstance(error, ValueError | TypeError):  # a URL or option the client refuses
        return Reach.SETTING
    # OSError (refused, reset, no route, DNS not resolving yet), a connect timeout, the
    # client's own confusion at a connection lost: all pass
    return Reach.NOT_YET


def is_transient(error: BaseException) -> bool:
    """True for failures that go away by themselves: lost connections, restarts, deadlocks."""
    return classify(error) is Severity.TRANSIENT


_PUBLISH_REFUSED = re.compile(r'permissions violation for publish to "([^"]+)"', re.IGNORECASE)


# scheme://userinfo@ : a password after a colon, or a NATS token (userinfo alone)
_URL_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<info>[^@/\s'\"]+)@")


#: a libpq URL's secret parameters (`?password=…`, `&sslpassword=…`)
_URL_SECRET_PARAMETER = re.compile(r"(?P<key>[?&](?:ssl)?password=)[^&#\s'\"]*", re.IGNORECASE)


def redact(text: str) -> str:
    """`text` with the secrets a URL can carry replaced by `***`: a password
    (`user:***@`, `?password=***`, `&sslpassword=***`) and a NATS token (`nats://***@`).
    Every log line and every error line goes through it. Pure."""

    def hide(match: re.Match[str]) -> str:
        scheme, info = match["scheme"], match["info"]
        if ":" in info:
            return f"{scheme}{info.split(':', 1)[0]}:***@"
        if scheme.lower().startswith(("nats", "tls", "ws")):
            return f"{scheme}***@"
        return match.group()

    return _URL_SECRET_PARAMETER.sub(r"\g<key>***", _URL_USERINFO.sub(hide, text))


def refused_publish_subject(error: BaseException) -> str | None:
    """The subject a NATS server refused us to publish to (a publish permission that is
    missing for that subject only: the connection stays up), else None. Pure."""
    if isinstance(error, nats.errors.Error):
        match = _PUBLISH_REFUSED.search(str(error))
        if match is not None:
            return match.group(1)
    return None


def is_nats_refusal(error: BaseException) -> bool:
    """The NATS server refused our credentials or a permission."""
    if isinstance(error, nats.errors.AuthorizationError):
        return True
    if isinstance(error, nats.errors.Error) and not isinstance(error, nats.js.errors.APIError):
        text = str(error).lower()
        return any(refusal in text for refusal in NATS_REFUSALS)
    return False


def as_setting_error(error: BaseException, what: str) -> SettingError:
    """A fatal error met while running, named for the operator (exit 3)."""
    if isinstance(error, SettingError):
        return error
    if is_nats_refusal(error):
        return RefusedError("BCW_NATS_URL", f"{what}: NATS refused us: {error}")
    return RefusedError(
        "BCW_DATABASE_URL",
        f"{what}: PostgreSQL refused: {type(error).__name__}: {error} "
        "(does the role have its grants, and was `bcw migrate` run for this version?)",
    )
