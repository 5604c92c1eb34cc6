"""What an operator sees when a setting is wrong or a server is away: one line naming the
variable, the documented exit code (1 failed or unreachable, 2 bad setting, 3 refused),
no traceback; and a `bcw run` that waits for its servers answers its probes and stops
on SIGTERM in every phase.

What is real: the `bcw` command in a subprocess, the session's nats-server and
PostgreSQL, an auth-enabled nats-server of this module's own, a TCP proxy that
blackholes. The 20 seconds of waiting are the point of one test.
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import nats
import pytest

from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration.flow import HelloFlow, capabilities
from tests.integration.support import bcw, bcw_process, count, eventually
from workers.bench.proxy import Mode, TcpProxy
from workers.embedded.servers import EmbeddedNats, free_port
from workers.runtime.bus import streams

ROOT = Path(__file__).resolve().parents[3]


def _closed_port() -> int:
    return free_port()  # free now: nothing listens there


@pytest.fixture(scope="module")
def nats_with_users(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = EmbeddedNats(
        tmp_path_factory.mktemp("nats-auth"), extra=["--user", "bcw", "--pass", "right"]
    ).start()
    yield f"nats://127.0.0.1:{server.port}"
    server.stop()


@pytest.fixture(scope="module")
async def nologin_role(servers: Servers) -> str:
    admin = await asyncpg.connect(servers.postgres_url)
    try:
        await admin.execute(
            "DO $$ BEGIN CREATE ROLE bcw_test_nologin NOLOGIN; "
            "EXCEPTION WHEN duplicate_object THEN NULL; END $$"
        )
    finally:
        await admin.close()
    return "bcw_test_nologin"


def _with(url: str, *, user: str | None = None, database: str | None = None) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc if user is None else f"{user}@{parts.hostname}:{parts.port}"
    path = parts.path if database is None else f"/{database}"
    return parts._replace(netloc=netloc, path=path).geturl()


#: (environment, exit code, the variable the line must name, text the line must not show)
# one case a row, read down its columns: kept out of the formatter (fmt: skip)
SETTINGS = {
    "negative duration": ({"BCW_LIVENESS_HEARTBEAT_INTERVAL": "-10"}, 2, "BCW_LIVENESS_HEARTBEAT_INTERVAL", None),
    "log level": ({"BCW_LOG_LEVEL": "LOUD"}, 2, "BCW_LOG_LEVEL", None),
    "not postgres": ({"BCW_DATABASE_URL": "mysql://u:hunter2@db/x"}, 2, "BCW_DATABASE_URL", "hunter2"),
    "bad port": ({"BCW_DATABASE_URL": "postgresql://u:hunter2@db:port/x"}, 2, "BCW_DATABASE_URL", "hunter2"),
    "pool bounds": ({"BCW_DATABASE_POOL_MIN": "9", "BCW_DATABASE_POOL_MAX": "4"}, 2, "BCW_DATABASE_POOL_MIN", None),
    "timeouts": ({"BCW_DATABASE_COMMAND_TIMEOUT": "90"}, 2, "BCW_CONSUMER_ACK_WAIT", None),
    "not nats": ({"BCW_NATS_URL": "http://bus:4222"}, 2, "BCW_NATS_URL", None),
    "no creds file": ({"BCW_NATS_CREDS_FILE": "/nonexistent.creds"}, 2, "BCW_NATS_CREDS_FILE", None),
    "not a number": ({"BCW_CONSUMER_BATCH_SIZE": "many"}, 2, "BCW_CONSUMER_BATCH_SIZE", None),
}  # fmt: skip


def _assert_one_clear_line(out: str, variable: str, hidden: str | None) -> None:
    """One line names the variable; `bcw run` may have logged its start before it."""
    lines = [line for line in out.splitlines() if line.strip()]
    errors = [line for line in lines if " INFO " not in line]
    assert len(errors) == 1, out
    assert errors[0] == lines[-1] and variable in errors[0], out
    assert len(lines) <= 3, out
    assert "Traceback" not in out
    if hidden:
        assert hidden not in out


@pytest.mark.parametrize("command", ["migrate", "provision", "run"])
@pytest.mark.parametrize("case", list(SETTINGS))
async def test_a_bad_setting_is_one_line_naming_it(command: str, case: str) -> None:
    env, code, variable, hidden = SETTINGS[case]
    args = ["run", "labeler"] if command == "run" else [command]
    exit_code, out = await asyncio.wait_for(bcw(*args, **env), 30)
    assert exit_code == code, out
    _assert_one_clear_line(out, variable, hidden)


async def test_servers_that_cannot_be_used(
    servers: Servers, database_url: str, nats_with_users: str, nologin_role: str
) -> None:
    """Each server problem, for the commands that meet it: one line, the right code."""
    closed_pg = f"postgresql://postgres@127.0.0.1:{_closed_port()}/x"
    closed_nats = f"nats://127.0.0.1:{_closed_port()}"
    root = {"BCW_SUBJECT_ROOT": f"t{uuid.uuid4().hex[:10]}", "BCW_HEALTH_PORT": "0"}
    good = {"BCW_DATABASE_URL": database_url, "BCW_NATS_URL": servers.nats_url, **root}
    no_database = _with(database_url, database="no_such_database")
    no_login = _with(database_url, user=nologin_role)
    wrong_password = {**good, "BCW_NATS_USER": "bcw", "BCW_NATS_PASSWORD": "wrong"}
    cases = [
        (["migrate"], {**good, "BCW_DATABASE_URL": closed_pg}, 1, "BCW_DATABASE_URL"),
        (["migrate"], {**good, "BCW_DATABASE_URL": no_database}, 2, "BCW_DATABASE_URL"),
        (["migrate"], {**good, "BCW_DATABASE_URL": no_login}, 3, "BCW_DATABASE_URL"),
        (["provision"], {**good, "BCW_NATS_URL": closed_nats}, 1, "BCW_NATS_URL"),
        (["provision"], {**good, "BCW_NATS_URL": nats_with_users}, 3, "BCW_NATS_URL"),
        (["provision"], {**wrong_password, "BCW_NATS_URL": nats_with_users}, 3, "BCW_NATS_USER"),
        (["commands", "n1"], {**good, "BCW_DATABASE_URL": closed_pg}, 1, "BCW_DATABASE_URL"),
        (["dead-letters", "list"], {**good, "BCW_NATS_URL": closed_nats}, 1, "BCW_NATS_URL"),
        # `bcw run` waits out servers that are away, but not settings that cannot work
        (["run", "labeler"], {**good, "BCW_DATABASE_URL": no_database}, 2, "BCW_DATABASE_URL"),
        (["run", "labeler"], {**good, "BCW_DATABASE_URL": no_login}, 3, "BCW_DATABASE_URL"),
        (["run", "labeler"], {**good, "BCW_NATS_URL": nats_with_users}, 3, "BCW_NATS_URL"),
    ]
    for args, env, code, variable in cases:
        exit_code, out = await asyncio.wait_for(bcw(*args, **env), 30)
        assert exit_code == code, (args, env, out)
        _assert_one_clear_line(out, variable, None)


async def _http_status(port: int, path: str) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        await writer.drain()
        return int((await reader.readline()).split()[1])
    finally:
        writer.close()


async def _spawn_run(env: dict[str, str]) -> asyncio.subprocess.Process:
    return await bcw_process("run", "labeler", output=True, **env)


async def _probes(port: int, within: float = 10.0) -> tuple[int, int]:
    deadline = time.monotonic() + within
    while True:
        try:
            return await _http_status(port, "/healthz"), await _http_status(port, "/readyz")
        except OSError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def _stop_within(process: asyncio.subprocess.Process, seconds: float) -> tuple[int, str]:
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    out, _ = await asyncio.wait_for(process.communicate(), 15)
    assert time.monotonic() - started < seconds, "SIGTERM took too long"
    return process.returncode or 0, out.decode()


@pytest.mark.slow
async def test_run_waiting_for_nats_is_alive_not_ready_quiet_and_stoppable(
    database_url: str,
) -> None:
    port = free_port()
    process = await _spawn_run(
        {
            "BCW_NATS_URL": f"nats://127.0.0.1:{_closed_port()}",
            "BCW_DATABASE_URL": database_url,
            "BCW_HEALTH_PORT": str(port),
            "BCW_SUBJECT_ROOT": f"t{uuid.uuid4().hex[:10]}",
        }
    )
    started = time.monotonic()
    try:
        assert await _probes(port) == (200, 503)
        await asyncio.sleep(max(0.0, 20 - (time.monotonic() - started)))
        assert await _probes(port) == (200, 503)
    finally:
        code, out = await _stop_within(process, 10)
    assert code == 0, out
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) <= 4, out  # a line when the wait starts, not one per try
    assert "waiting for NATS" in out and "BCW_NATS_URL" in out
    assert "Traceback" not in out


@pytest.mark.slow
async def test_run_stops_on_sigterm_while_a_connect_hangs_on_a_blackholed_database(
    servers: Servers, database_url: str
) -> None:
    target = urlsplit(database_url)
    assert target.hostname and target.port
    proxy = await TcpProxy(target.hostname, target.port).start()
    await proxy.set_mode(Mode.BLACKHOLE)
    port = free_port()
    try:
        process = await _spawn_run(
            {
                "BCW_NATS_URL": servers.nats_url,
                "BCW_DATABASE_URL": proxy.url("postgresql", target.path, user="postgres"),
                "BCW_HEALTH_PORT": str(port),
                "BCW_SUBJECT_ROOT": f"t{uuid.uuid4().hex[:10]}",
                "BCW_DATABASE_CONNECT_TIMEOUT": "30",  # the attempt is in flight at SIGTERM
            }
        )
        try:
            assert await _probes(port) == (200, 503)
            await asyncio.sleep(2)
        finally:
            code, out = await _stop_within(process, 10)
    finally:
        await proxy.stop()
    assert code == 0, out
    assert "Traceback" not in out


@pytest.mark.slow
@pytest.mark.timeout(240)  # room for its own bounds: 120 s for the second process alone
async def test_run_stops_on_sigterm_in_the_middle_of_a_database_partition(
    servers: Servers, database_url: str
) -> None:
    """The labeler holds facts it cannot apply (its database partitioned away) when
    SIGTERM comes: it exits 0 within 10 s, and a new process applies every Hello once."""
    subjects = Subjects(f"t{uuid.uuid4().hex[:10]}")
    target = urlsplit(database_url)
    assert target.hostname and target.port
    proxy = await TcpProxy(target.hostname, target.port).start()
    flow = HelloFlow(300)
    await flow.admit(database_url)
    nc = await nats.connect(servers.nats_url)
    await streams.provision_streams(nc.jetstream(), subjects)
    env = {
        "BCW_NATS_URL": servers.nats_url,
        "BCW_HEALTH_PORT": "0",
        "BCW_SUBJECT_ROOT": subjects.root,
        "BCW_DATABASE_CONNECT_TIMEOUT": "2",
        # a fact the server sent at the very moment of the stop is redelivered after this
        "BCW_CONSUMER_ACK_WAIT": "15",
        "BCW_DATABASE_COMMAND_TIMEOUT": "10",
    }
    labeled = "SELECT count(DISTINCT node_id) FROM node_labels WHERE source = 'system'"
    try:
        process = await _spawn_run(
            {
                **env,
                "BCW_DATABASE_URL": proxy.url("postgresql", target.path, user="postgres"),
                # behind the partition its backends hold row locks in open transactions:
                # PostgreSQL ends them after this (30 s by default; short for the test)
                "BCW_DATABASE_IDLE_IN_TRANSACTION_TIMEOUT": "6",
                "BCW_OUTBOX_PUBLISH_TIMEOUT": "5",
            }
        )
        try:
            half = slice(None, flow.size // 2)
            publishing = asyncio.create_task(flow.publish(nc, subjects, 100, half))
            await eventually(lambda: _above(database_url, labeled, 20), what="progress")
            await proxy.set_mode(Mode.BLACKHOLE)
            await publishing
            # the rest only once the partition is up: facts in hand it cannot apply,
            # however fast the labeler took the first half (its batches linger)
            await flow.publish(nc, subjects, 100, slice(flow.size // 2, None))
            await asyncio.sleep(3)  # the lane is waiting out the partition now
        finally:
            code, out = await _stop_within(process, 10)
        assert code == 0, out
        assert await count(database_url, labeled) < flow.size, "nothing was left in hand"
        # A backend the partition cut in the middle of a statement's messages (its Bind
        # arrived, its Sync did not) is not idle: no timeout ends it, and it keeps its row
        # locks until its connection dies — in a real partition when TCP keepalives give
        # up on the exited process, here when the proxy resets what it holds open.
        proxy.cut()
        second = await _spawn_run({**env, "BCW_DATABASE_URL": database_url})
        try:  # a bound for a loaded machine (8 test processes on 2 cores): seconds alone
            await eventually(
                lambda: _equal(database_url, labeled, flow.size), within=120, what="every Hello"
            )
        except AssertionError as error:  # say what the new process was doing meanwhile
            _, out = await _stop_within(second, 10)
            applied = await count(database_url, labeled)
            raise AssertionError(f"{error} ({applied} of {flow.size}); it logged:\n{out}") from None
        code, out = await _stop_within(second, 10)
        assert code == 0, out
        assert await count(database_url, "SELECT count(*) FROM node_labels") == sum(
            len(capabilities(i)) for i in range(flow.size)
        )
    finally:
        await proxy.stop()
        await nc.close()


async def _above(database_url: str, sql: str, n: int) -> bool:
    return await count(database_url, sql) > n


async def _equal(database_url: str, sql: str, n: int) -> bool:
    return await count(database_url, sql) == n


async def test_a_misspelt_setting_exits_2_naming_the_setting_before_any_connection() -> None:
    started = time.monotonic()
    code, out = await bcw(
        "provision", BCW_DATABSE_URL="postgresql://x@db/x", BCW_NATS_URL="nats://10.255.255.1:4222"
    )
    assert code == 2, out
    assert out.strip() == "bcw: BCW_DATABSE_URL is not a setting: did you mean BCW_DATABASE_URL?"
    assert time.monotonic() - started < 10  # refused at once: no connection was tried


async def test_bcw_config_shows_every_setting_with_every_secret_redacted() -> None:
    import json

    secrets = {
        "BCW_DATABASE_URL": "postgresql://bcw:hunter2@db:5432/bcw",
        "BCW_NATS_URL": "nats://user:hunter3@n1:4222,nats://n2:4222",
        "BCW_NATS_PASSWORD": "hunter4",
        "BCW_NATS_TOKEN": "hunter5",
    }
    code, out = await bcw("config", "--json", **secrets)
    assert code == 0, out
    shown = json.loads(out)
    assert "hunter" not in out
    assert shown["BCW_DATABASE_URL"] == "postgresql://bcw:***@db:5432/bcw"
    assert shown["BCW_NATS_URL"] == "nats://user:***@n1:4222,nats://n2:4222"
    assert (shown["BCW_NATS_PASSWORD"], shown["BCW_NATS_TOKEN"]) == ("***", "***")
    assert shown["BCW_QUARANTINE_HOLD_MAX"] == 300.0 and "BCW_LIVENESS_MAX_ZOMBIE_NOTICES" in shown
    code, text = await bcw("config", **secrets)
    assert code == 0 and "hunter" not in text and "BCW_SUBJECT_ROOT" in text


async def test_bcw_version_is_the_package_version() -> None:
    from tests.upgrade.release import current_version

    code, out = await bcw("--version")
    assert (code, out.strip()) == (0, f"bcw {current_version()}")


async def test_a_secret_may_come_from_a_file(tmp_path: Path) -> None:
    import json

    url = tmp_path / "url"
    url.write_text("postgresql://bcw:hunter2@db:5432/bcw\n")  # as a mounted Secret holds it
    token = tmp_path / "token"
    token.write_text("hunter3")
    code, out = await bcw(
        "config", "--json", BCW_DATABASE_URL_FILE=str(url), BCW_NATS_TOKEN_FILE=str(token)
    )
    assert code == 0, out
    shown = json.loads(out)
    assert shown["BCW_DATABASE_URL"] == "postgresql://bcw:***@db:5432/bcw"
    assert shown["BCW_NATS_TOKEN"] == "***" and "hunter" not in out
    code, out = await bcw(
        "config", BCW_DATABASE_URL_FILE=str(url), BCW_DATABASE_URL="postgresql://x@y/z"
    )
    assert (code, out.strip()) == (
        2,
        "bcw: BCW_DATABASE_URL_FILE: BCW_DATABASE_URL is set too: give one of them",
    )
    code, out = await bcw("config", BCW_NATS_PASSWORD_FILE=str(tmp_path / "missing"))
    assert code == 2 and out.startswith("bcw: BCW_NATS_PASSWORD_FILE: cannot read ")
