"""PostgreSQL connections: the pool every worker process shares, and one-off connections.

Called by the entry point and the runtime. Each attempt is bounded by
`BCW_DATABASE_CONNECT_TIMEOUT` (asyncpg waits 60 s on a blackholed host by default), and
its failure is named for the operator (`errors.reach`): a setting that cannot work, TLS
that does not verify or load included (`SettingError`, exit 2), credentials refused
(`RefusedError`, exit 3) or a server out of reach, refusing, hanging or starting up
(`UnreachableError`: waited on by `bcw run` and `bcw migrate --wait`). Nothing here
decides anything.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import asyncpg

from workers.runtime.base.errors import (
    Reach,
    RefusedError,
    SettingError,
    Severity,
    UnreachableError,
    classify,
    reach,
)
from workers.runtime.base.libpq import database_hosts
from workers.runtime.base.runtime_settings import DatabaseSettings

log = logging.getLogger(__name__)

URL_SETTING = "BCW_DATABASE_URL"
#: how long a change beside running workers waits for a table's lock at a time
#: (`with_lock_patience`; named in BCW_DATABASE_LOCK_TIMEOUT's description)
TABLE_LOCK_WAIT = "1s"
#: a pooled connection idle this long (seconds) is closed, and made again when wanted:
#: below the worker logins' `idle_session_timeout` (`limits`), which would end it first
IDLE_LIFETIME = 300.0


def server_settings(settings: DatabaseSettings) -> dict[str, str]:
    """Settings of our own sessions, sent at connect.

    `idle_in_transaction_session_timeout`: a worker cut off by a network partition leaves
    its backends waiting, in a transaction, for commands that never come; PostgreSQL
    would keep them (and their row locks, blocking every other replica) until TCP
    keepalive gives up — hours by default. This ends them after the configured time.

    `lock_timeout`: no statement of ours waits longer than this for a lock another
    session holds (a gateway may keep a transaction open on a node's row); the fact
    behind it is tried again later, alone (`consumer`). The few that set a wait of their
    own are named in BCW_DATABASE_LOCK_TIMEOUT's description.
    """
    out = {}
    if settings.application_name:  # who a backend is, in pg_stat_activity
        out["application_name"] = settings.application_name
    if settings.idle_in_transaction_timeout:
        out["idle_in_transaction_session_timeout"] = (
            f"{int(settings.idle_in_transaction_timeout * 1000)}"
        )
    if settings.lock_timeout:
        out["lock_timeout"] = f"{int(settings.lock_timeout * 1000)}"
    return out


def _options(settings: DatabaseSettings) -> dict[str, Any]:
    """What every connection of ours is opened with, one or pooled."""
    return {
        "command_timeout": settings.command_timeout,
        "statement_cache_size": settings.statement_cache_size,
        "timeout": settings.connect_timeout,
        "server_settings": server_settings(settings),
    }


async def connect(settings: DatabaseSettings) -> asyncpg.Connection:
    try:
        return await asyncpg.connect(settings.url.get_secret_value(), **_options(settings))
    except Exception as error:
        raise named(error, settings) from error


async def _nothing_to_reset(_conn: asyncpg.Connection) -> None:
    """A released connection's reset, beyond the rollback of an open transaction that
    asyncpg always does: none. The default reset query (`RESET ALL`, `UNLISTEN *`,
    `CLOSE ALL`, advisory unlocks) is a round trip on every release, once per batch; the
    pool's connections hold no session state for it to clear — server settings are given
    at connect, LISTEN has a connection of its own (`notify`), and the migrations' lock is
    taken on a connection outside the pool (`migrate.schema_lock`). Keep it so: a `SET` or a LISTEN on a
    pooled connection would outlive its `acquire()`."""


class _TimedPool(asyncpg.Pool):
    """asyncpg's pool, telling `on_acquire` how long each `acquire()` waited for a
    connection (asyncpg has no hook for it: its one acquire path, `_acquire`, is timed;
    `test_pool_metrics` fails if an asyncpg upgrade moves it)."""

    __slots__ = ("_on_acquire",)

    def __init__(self, *args: Any, on_acquire: Callable[[float], None], **kwargs: Any) -> None:
        self._on_acquire = on_acquire
        super().__init__(*args, **kwargs)

    async def _acquire(self, timeout: float | None) -> Any:  # noqa: ASYNC109 - asyncpg's
        started = time.perf_counter()
        try:
            return await super()._acquire(timeout)
        finally:
            self._on_acquire(time.perf_counter() - started)


async def create_pool(
    settings: DatabaseSettings,
    init: Callable[[asyncpg.Connection], Awaitable[None]] | None = None,
    on_acquire: Callable[[float], None] | None = None,
) -> asyncpg.Pool:
    """The process's pool; `init` runs on each new connection (tracing's query logger),
    `on_acquire` is told how long each acquire waited (seconds: the pool metrics)."""
    options: dict[str, Any] = {
        "min_size": settings.pool_min,
        "max_size": settings.pool_max,
        "init": init,
        "reset": _nothing_to_reset,
        "max_inactive_connection_lifetime": IDLE_LIFETIME,
        **_options(settings),
    }
    url = settings.url.get_secret_value()
    try:
        if on_acquire is None:
            pool = await asyncpg.create_pool(url, **options)
        else:  # as `asyncpg.create_pool` makes it, its defaults given
            pool = await _TimedPool(
                url,
                on_acquire=on_acquire,
                max_queries=50000,
                loop=None,
                connection_class=asyncpg.Connection,
                record_class=asyncpg.Record,
                **options,
            )
    except Exception as error:
        raise named(error, settings) from error
    assert pool is not None
    return pool


async def usable(pool: asyncpg.Pool, within: float = 1.0) -> bool:
    """True when the pool can give a connection that answers a query `within` seconds."""
    try:
        async with asyncio.timeout(within):
            async with pool.acquire() as conn:
                return bool(await conn.fetchval("SELECT true"))
    except Exception:
        return False


def where(settings: DatabaseSettings) -> str:
    """host:port/database of the URL (each host of a multi-host one), without user or
    password."""
    url = settings.url.get_secret_value()
    servers = ",".join(f"{host}:{port}" for host, port in database_hosts(url))
    return f"{servers}{urlsplit(url).path or '/'}"


def named(error: BaseException, settings: DatabaseSettings) -> Exception:
    """The operator's reading of a connection failure (the URL's secret never shown), as
    `errors.reach` takes it: `UnreachableError` (waited on), else a setting at once."""
    if isinstance(error, SettingError):
        return error
    detail = f"{type(error).__name__}: {error}".strip().rstrip(":")
    at = where(settings)
    kind = reach(error)
    if kind is Reach.REFUSED:
        if isinstance(error, asyncpg.InvalidAuthorizationSpecificationError):
            return RefusedError(URL_SETTING, f"{at} refused the credentials ({detail})")
        return RefusedError(URL_SETTING, f"{at} refused us ({detail})")
    if kind is Reach.TLS:  # a CA that does not verify the server is the CA's setting's
        setting = (
            _ca_setting(settings)
            if isinstance(error, ssl.SSLCertVerificationError)
            else URL_SETTING
        )
        return SettingError(setting, f"TLS with {at} cannot work ({detail})")
    if kind is Reach.SETTING:
        if isinstance(error, asyncpg.InvalidCatalogNameError):
            return SettingError(URL_SETTING, f"{at}: the database does not exist ({detail})")
        return SettingError(URL_SETTING, f"cannot be used ({error})")
    if isinstance(error, OSError | TimeoutError) or classify(error) is Severity.TRANSIENT:
        return UnreachableError(URL_SETTING, f"cannot reach {at} ({detail or 'timed out'})")
    return UnreachableError(URL_SETTING, f"cannot connect to {at} ({detail})")


def _ca_setting(settings: DatabaseSettings) -> str:
    """The setting that names the CA the server's certificate was checked against (with its
    file), or the URL's sslmode when none is given."""
    from workers.runtime.base.settings import database_tls

    try:
        ca = database_tls(settings).ca
    except ValueError:
        ca = None
    if ca is None:
        return URL_SETTING
    origin = URL_SETTING if ca.origin == "default" else ca.origin
    return f"{origin} (sslrootcert {ca.path})"


async def with_lock_patience(
    conn: asyncpg.Connection, what: str, work: Callable[[], Awaitable[object]], attempts: int = 20
) -> None:
    """Run `work` in a transaction of its own, waiting for its locks 1 s at a time. Beside
    running workers (whose transactions are short), a change that locks tables they use
    may meet one that holds a lock it wants: PostgreSQL ends one of the two (a deadlock),
    or the change waits past its lock timeout. Either rolls `work` back whole, so it is
    tried again after a pause (2 s at most), `attempts` times in all; `what` names it in
    the log. While it waits for a table, every other statement on that table queues
    behind it — the Hellos too, when a login keeps a transaction open on a table a
    migration alters — so it never waits long at a time: they wait 1 s at most."""
    for attempt in range(1, attempts + 1):
        try:
            async with conn.transaction():
                await conn.execute(f"SET LOCAL lock_timeout = '{TABLE_LOCK_WAIT}'")
                await work()
            return
        except (asyncpg.DeadlockDetectedError, asyncpg.LockNotAvailableError) as error:
            if attempt == attempts:
                raise
            log.info("%s met a worker's locks (%s): trying again", what, type(error).__name__)
            await asyncio.sleep(min(attempt, 2))
