"""Two kinds of error: transient (retry, the process never exits on them) and permanent
(dead-letter the fact). Used by the consumer loop, the outbox relay and the leases."""

from __future__ import annotations

import asyncio

import asyncpg
import nats.errors
import nats.js.errors


class PermanentError(Exception):
    """A handler's refusal that retrying cannot fix; the fact is dead-lettered with the message."""


_TRANSIENT_PG = (
    asyncpg.DeadlockDetectedError,
    asyncpg.SerializationError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,  # connection closed / pool closing underneath
    asyncpg.CannotConnectNowError,
    asyncpg.TooManyConnectionsError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    asyncpg.QueryCanceledError,  # includes statement timeouts
    asyncpg.LockNotAvailableError,
)
_TRANSIENT_NATS = (
    nats.errors.ConnectionClosedError,
    nats.errors.NoServersError,
    nats.errors.TimeoutError,
    nats.errors.StaleConnectionError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.OutboundBufferLimitError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
)


def is_transient(error: BaseException) -> bool:
    """True for failures that go away by themselves: lost connections, restarts, deadlocks."""
    if isinstance(error, PermanentError):
        return False
    if isinstance(error, _TRANSIENT_PG + _TRANSIENT_NATS):
        return True
    if isinstance(error, asyncpg.PostgresError):
        # class 08 (connection), 40 (transaction rollback), 53 (resources), 57 (operator
        # intervention, e.g. shutdown), 58 (system error)
        code = getattr(error, "sqlstate", "") or ""
        return code[:2] in {"08", "40", "53", "57", "58"}
    return isinstance(error, (OSError, asyncio.TimeoutError, ConnectionError))
