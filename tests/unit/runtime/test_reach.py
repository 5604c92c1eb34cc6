"""How a failed first connection is taken (`errors.reach`), over every exception type
asyncpg, the socket layer, ssl and nats-py raise at connect; and how `db.named` names it
for the operator: waited on, or one line naming the setting with its exit code."""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

import asyncpg
import asyncpg.exceptions._base as asyncpg_base
import nats.errors
import pytest

from workers.runtime.base.errors import (
    Reach,
    RefusedError,
    SettingError,
    UnreachableError,
    reach,
)
from workers.runtime.base.runtime_settings import DatabaseSettings
from workers.runtime.store import db


def _postgres_errors() -> list[type[asyncpg.PostgresError]]:
    seen, todo = [], [asyncpg.PostgresError]
    while todo:
        cls = todo.pop()
        seen.append(cls)
        todo += cls.__subclasses__()
    return [cls for cls in seen if getattr(cls, "sqlstate", None)]


@pytest.mark.parametrize("cls", _postgres_errors(), ids=lambda cls: cls.__name__)
def test_every_server_error_at_connect_waits_unless_it_refuses_who_we_are(
    cls: type[asyncpg.PostgresError],
) -> None:
    """28 (authorization: a bad password, no such role, no pg_hba entry) and 42 (no
    CONNECT privilege) refuse us; 3D000 names a database that does not exist; every other
    state (starting up, shutting down, too many connections, a crash) is "not yet"."""
    code = cls.sqlstate
    expected = (
        Reach.SETTING
        if code == "3D000"
        else Reach.REFUSED
        if code[:2] in ("28", "42")
        else Reach.NOT_YET
    )
    assert reach(cls("x")) is expected, code


NOT_YET: list[BaseException] = [
    ConnectionRefusedError(111, "Connect call failed"),  # a closed port
    ConnectionResetError(104, "reset by peer"),  # a server shutting down
    ConnectionAbortedError(),
    BrokenPipeError(),
    socket.gaierror(-2, "Name or service not known"),  # DNS not resolving yet
    socket.gaierror(-3, "Temporary failure in name resolution"),
    OSError(101, "Network is unreachable"),
    OSError(113, "No route to host"),
    FileNotFoundError(2, "No such file or directory"),  # a Unix socket not made yet
    TimeoutError(),  # a port that accepts and hangs: the connect timeout
    ssl.SSLEOFError(8, "EOF occurred in violation of protocol"),  # cut mid-handshake
    ssl.SSLZeroReturnError(6, "TLS/SSL connection has been closed"),
    ssl.SSLSyscallError(5, "Some I/O error occurred"),
    asyncpg.CannotConnectNowError("the database system is starting up"),
    asyncpg.AdminShutdownError("terminating connection due to administrator command"),
    asyncpg.TooManyConnectionsError("sorry, too many clients already"),
    asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
    asyncpg.InterfaceError("connection is closed"),
    asyncpg_base.InternalClientError("cannot switch to state 15"),
    nats.errors.NoServersError(),
    nats.errors.TimeoutError(),
    UnreachableError("BCW_DATABASE_URL", "cannot reach db:5432/bcw"),
]

# one error a row beside its reach: kept out of the formatter (fmt: skip)
NEVER: list[tuple[BaseException, Reach]] = [
    (ssl.SSLCertVerificationError(1, "certificate verify failed: unable to get local issuer"), Reach.TLS),
    (ssl.SSLCertVerificationError(1, "certificate verify failed: Hostname mismatch"), Reach.TLS),
    (ssl.SSLError(1, "[SSL: TLSV1_ALERT_UNKNOWN_CA] tlsv1 alert unknown ca"), Reach.TLS),
    (ssl.SSLError(9, "[SSL] PEM lib"), Reach.TLS),  # a certificate or key that does not load
    (ConnectionError('PostgreSQL server at "db:5432" rejected SSL upgrade'), Reach.TLS),
    (asyncpg.InvalidPasswordError("password authentication failed"), Reach.REFUSED),
    (asyncpg.InvalidAuthorizationSpecificationError('role "x" does not exist'), Reach.REFUSED),
    (asyncpg.InsufficientPrivilegeError("permission denied for database bcw"), Reach.REFUSED),
    (asyncpg.InvalidCatalogNameError('database "x" does not exist'), Reach.SETTING),
    (asyncpg.ClientConfigurationError("`sslmode` parameter must be one of"), Reach.SETTING),
    (ValueError("invalid DSN"), Reach.SETTING),
    (TypeError("port must be an int"), Reach.SETTING),
    (nats.errors.AuthorizationError(), Reach.REFUSED),
    (nats.errors.Error("nats: 'authorization violation'"), Reach.REFUSED),
    (SettingError("BCW_DATABASE_URL", "x"), Reach.SETTING),
    (RefusedError("BCW_DATABASE_URL", "x"), Reach.SETTING),
]  # fmt: skip


@pytest.mark.parametrize("error", NOT_YET, ids=lambda e: type(e).__name__)
def test_a_server_away_refusing_or_hanging_is_not_yet(error: BaseException) -> None:
    assert reach(error) is Reach.NOT_YET


@pytest.mark.parametrize(("error", "kind"), NEVER, ids=lambda e: type(e).__name__)
def test_a_setting_that_can_never_work_is_named_at_once(error: BaseException, kind: Reach) -> None:
    assert reach(error) is kind


def _settings(url: str) -> DatabaseSettings:
    return DatabaseSettings(url=url)  # type: ignore[arg-type]


@pytest.mark.parametrize("error", NOT_YET[:-1], ids=lambda e: type(e).__name__)
def test_db_named_makes_not_yet_an_unreachable_error(error: BaseException) -> None:
    named = db.named(error, _settings("postgresql://u:hunter2@db:5432/bcw"))
    assert isinstance(named, UnreachableError) and named.exit_code == 1
    assert "hunter2" not in str(named)


def test_db_named_names_the_ca_of_a_certificate_that_does_not_verify(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("x")
    failed = ssl.SSLCertVerificationError(1, "certificate verify failed")
    url = f"postgresql://u:hunter2@db:5432/bcw?sslmode=verify-full&sslrootcert={ca}"
    named = db.named(failed, _settings(url))
    assert type(named) is SettingError and named.exit_code == 2
    assert named.setting == f"BCW_DATABASE_URL (sslrootcert {ca})"
    monkeypatch.setenv("PGSSLROOTCERT", str(ca))  # the chart's way: the libpq variable
    named = db.named(failed, _settings("postgresql://u@db:5432/bcw?sslmode=verify-full"))
    assert named.setting == f"PGSSLROOTCERT (sslrootcert {ca})"  # type: ignore[attr-defined]
    assert "\n" not in str(named)


@pytest.mark.parametrize(
    ("error", "cls", "code"),
    [
        (asyncpg.InvalidPasswordError("password authentication failed"), RefusedError, 3),
        (asyncpg.InvalidCatalogNameError('database "x" does not exist'), SettingError, 2),
        (ConnectionError('server at "db:5432" rejected SSL upgrade'), SettingError, 2),
    ],
    ids=lambda v: getattr(v, "__name__", type(v).__name__),
)
def test_db_named_gives_settings_their_exit_code(
    error: BaseException, cls: type[SettingError], code: int
) -> None:
    named = db.named(error, _settings("postgresql://u:hunter2@db:5432/bcw"))
    assert type(named) is cls and named.exit_code == code
    assert named.setting == "BCW_DATABASE_URL" and "hunter2" not in str(named)


def test_nats_names_tls_that_can_never_work_and_waits_for_a_cut_handshake() -> None:
    from workers.runtime.base.runtime_settings import NatsSettings
    from workers.runtime.bus.connection import _named

    settings = NatsSettings(url="tls://n1:4222")
    unverified = ssl.SSLCertVerificationError(1, "certificate verify failed")
    named = _named(nats.errors.NoServersError(), [unverified], settings)
    assert type(named) is SettingError and named.setting == "BCW_NATS_TLS_CA_FILE"
    cut = ssl.SSLEOFError(8, "EOF occurred in violation of protocol")
    assert type(_named(nats.errors.NoServersError(), [cut], settings)) is UnreachableError
    assert type(_named(TimeoutError(), [], settings)) is UnreachableError


async def test_a_first_nats_round_is_given_up_when_it_can_never_work_or_hangs() -> None:
    import asyncio

    from workers.runtime.bus.connection import _first_round

    never = asyncio.Event()
    never.set()  # told of a certificate that does not verify: nats-py would wait for ever
    with pytest.raises(nats.errors.NoServersError):
        await asyncio.wait_for(_first_round(asyncio.sleep(3600), never, 3600), 5)
    with pytest.raises(TimeoutError):  # a round that hangs: a failed try, waited on
        await asyncio.wait_for(_first_round(asyncio.sleep(3600), asyncio.Event(), 0.1), 5)


def _subclasses(cls: type[BaseException]) -> list[type[BaseException]]:
    out, todo = [], [cls]
    while todo:
        cls = todo.pop()
        out.append(cls)
        todo += cls.__subclasses__()
    return out


def _made(cls: type[BaseException]) -> bool:
    try:
        cls(1, "x")
    except TypeError:  # urllib's HTTPError and the like: not raised at connect
        return False
    return True


@pytest.mark.parametrize(
    "cls",
    # those of the modules a connection goes through: the same in every xdist worker
    [c for c in _subclasses(OSError) if c.__module__ in ("builtins", "socket", "ssl") and _made(c)],
    ids=lambda cls: cls.__name__,
)
def test_every_os_error_waits_but_tls_that_can_never_work(cls: type[OSError]) -> None:
    """Every OSError the socket layer, asyncio or ssl raise: "not
    yet" — but an ssl error that is not a cut handshake: TLS that cannot work."""
    error = cls(1, "x")
    cut = ssl.SSLEOFError | ssl.SSLZeroReturnError | ssl.SSLSyscallError | ssl.SSLWantReadError
    if issubclass(cls, ssl.SSLError):
        expected = Reach.NOT_YET if issubclass(cls, cut | ssl.SSLWantWriteError) else Reach.TLS
    elif issubclass(cls, ValueError):  # io.UnsupportedOperation: a client's misuse
        expected = Reach.SETTING
    else:
        expected = Reach.NOT_YET
    assert reach(error) is expected
