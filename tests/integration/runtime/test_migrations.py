"""Migrations against a real PostgreSQL: from empty, idempotent, tamper-evident, safe
when two `bcw migrate` processes race; and `compute_now()` moves and resets."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import shutil
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from tests.conftest import Clock
from tests.integration.support import bcw
from workers.registry import ROLES
from workers.runtime.store import migrate

ALL = [m.name for m in migrate.load(migrate.default_directory())]


async def _bcw(database_url: str, *args: str) -> tuple[int, str]:
    return await bcw(*args, BCW_DATABASE_URL=database_url)


async def test_applies_from_empty_then_nothing(empty_database_url: str) -> None:
    conn = await asyncpg.connect(empty_database_url)
    try:
        assert await migrate.migrate(conn) == ALL
        assert await migrate.migrate(conn) == []
        tables = {
            r["tablename"]
            for r in await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        }
        assert {
            "node_sessions",
            "node_certs",
            "node_labels",
            "gateways",
            "commands",
            "node_events",
            "processed_facts",
            "outbox",
            "controller_leases",
            "schema_migrations",
        } <= tables
        states = await migrate.status(conn)
        assert [(s.name, s.state) for s in states] == [(name, "applied") for name in ALL]
    finally:
        await conn.close()


async def test_status_lists_pending_before_migrating(empty_database_url: str) -> None:
    code, out = await _bcw(empty_database_url, "migrate", "--status")
    assert code == 0
    assert out.split() == [word for name in ALL for word in ("pending", name)]


async def test_tampered_file_is_refused(empty_database_url: str, tmp_path: Path) -> None:
    directory = tmp_path / "core"
    shutil.copytree(migrate.default_directory(), directory)
    conn = await asyncpg.connect(empty_database_url)
    try:
        await migrate.migrate(conn, directory)
        first = directory / ALL[0]
        first.write_text(first.read_text() + "\n-- edited after the fact\n")
        extra = directory / "9999_later.sql"
        extra.write_text("CREATE TABLE later (x int);")
        with pytest.raises(migrate.MigrationError, match=f"{ALL[0]} was changed"):
            await migrate.migrate(conn, directory)
        # nothing after the check ran: the later migration is still pending
        assert await conn.fetchval("SELECT to_regclass('later')") is None
        states = {s.name: s.state for s in await migrate.status(conn, directory)}
        assert states[ALL[0]] == "changed" and states["9999_later.sql"] == "pending"
    finally:
        await conn.close()


async def test_cli_exits_non_zero_on_a_tampered_ledger(empty_database_url: str) -> None:
    assert (await _bcw(empty_database_url, "migrate"))[0] == 0
    conn = await asyncpg.connect(empty_database_url)
    try:
        await conn.execute("UPDATE schema_migrations SET checksum = 'x' WHERE name = $1", ALL[1])
    finally:
        await conn.close()
    code, out = await _bcw(empty_database_url, "migrate")
    assert code == 2 and f"{ALL[1]} was changed" in out
    code, out = await _bcw(empty_database_url, "migrate", "--status")
    assert code == 1 and f"changed  {ALL[1]}" in out


async def test_malformed_file_name_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "1_bad.sql").write_text("SELECT 1;")
    with pytest.raises(migrate.MigrationError, match="NNNN_lowercase_name"):
        migrate.load(tmp_path)


async def test_two_concurrent_migrates_apply_each_file_once(empty_database_url: str) -> None:
    results = await asyncio.gather(*(_bcw(empty_database_url, "migrate") for _ in range(2)))
    assert [code for code, _ in results] == [0, 0], results
    applied_counts = sorted(out.count(".sql") for _, out in results)
    assert applied_counts == [0, len(ALL)]
    conn = await asyncpg.connect(empty_database_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM schema_migrations") == len(ALL)
    finally:
        await conn.close()


async def test_a_failing_migration_leaves_nothing_half_applied(
    empty_database_url: str, tmp_path: Path
) -> None:
    directory = tmp_path / "core"
    shutil.copytree(migrate.default_directory(), directory)
    (directory / "9998_broken.sql").write_text(
        "CREATE TABLE half (x int); SELECT no_such_function();"
    )
    conn = await asyncpg.connect(empty_database_url)
    try:
        with pytest.raises(asyncpg.UndefinedFunctionError):
            await migrate.migrate(conn, directory)
        assert await conn.fetchval("SELECT to_regclass('half')") is None
        assert await conn.fetchval("SELECT count(*) FROM schema_migrations") == len(ALL)
    finally:
        await conn.close()


async def test_compute_now_moves_and_resets(db: asyncpg.Connection, clock: Clock) -> None:
    drift = await db.fetchval("SELECT compute_now() - now()")
    assert drift == timedelta(0)
    await clock.advance(timedelta(minutes=5))
    await clock.advance(timedelta(seconds=30))
    assert await db.fetchval("SELECT compute_now() - now()") == timedelta(minutes=5, seconds=30)
    returned = await db.fetchval("SELECT set_compute_now_offset(interval '1 hour') - now()")
    assert returned == timedelta(hours=1)
    await clock.reset()
    assert await db.fetchval("SELECT compute_now() - now()") == timedelta(0)


async def test_wait_returns_once_another_process_migrated(empty_database_url: str) -> None:
    """A worker pod's init container: `bcw migrate --wait` applies nothing and returns as
    soon as the migration Job has migrated."""
    import os
    import sys

    waiter = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "workers.cli",
        "migrate",
        "--wait",
        "1m",
        env={**os.environ, "BCW_DATABASE_URL": empty_database_url},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    await asyncio.sleep(3)  # it has looked at least once and found everything pending
    assert waiter.returncode is None
    conn = await asyncpg.connect(empty_database_url)
    try:
        assert await conn.fetchval("SELECT to_regclass('schema_migrations')") is None
        await migrate.migrate(conn)
    finally:
        await conn.close()
    out, _ = await asyncio.wait_for(waiter.communicate(), 30)
    assert waiter.returncode == 0, out
    assert f"schema current: {len(ALL)} migrations applied" in out.decode()


async def test_wait_gives_up_after_its_duration(empty_database_url: str) -> None:
    code, out = await _bcw(empty_database_url, "migrate", "--wait", "1s")
    assert code == 1, out
    assert f"{len(ALL)} pending migration(s): {ALL[0]}" in out
    assert "Traceback" not in out
    code, out = await _bcw(empty_database_url, "migrate", "--wait", "soon")
    assert code == 2 and "not a duration" in out  # before any connection


async def test_a_worker_login_may_wait_for_the_schema(database_url: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        await migrate.grant(conn, ROLES)
        with contextlib.suppress(asyncpg.DuplicateObjectError, asyncpg.UniqueViolationError):
            await conn.execute("CREATE ROLE bcw_waiter_t LOGIN IN ROLE bcw_labeler")
    finally:
        await conn.close()
    parts = urlsplit(database_url)
    as_labeler = urlunsplit(parts._replace(netloc="bcw_waiter_t@" + parts.netloc.rsplit("@")[-1]))
    code, out = await _bcw(as_labeler, "migrate", "--wait", "10s")
    assert code == 0, out


async def test_a_new_database_requires_proofs_and_one_with_a_fleet_keeps_its_policy(
    empty_database_url: str, tmp_path: Path
) -> None:
    """Migration 0049 starts a new database at `require`; a database that already has a
    node keeps its policy (`warn`, as 0030 made it), and `bcw migrate` says so loudly, in
    one line, with its unproven sessions."""
    older = tmp_path / "core"
    older.mkdir()
    for path in sorted(migrate.default_directory().glob("*.sql")):
        if path.name < "0048":
            shutil.copy(path, older / path.name)
    conn = await asyncpg.connect(empty_database_url)
    try:
        await migrate.migrate(conn, older)
        await conn.execute("SELECT join_node('n1', 'worker', 'n1-serial', NULL)")
        await conn.execute(
            "UPDATE node_sessions SET session_epoch = 1, gateway_id = 'gw-1' WHERE node_id = 'n1'"
        )
        await migrate.migrate(conn)
        assert await migrate.hello_proof(conn) == "warn"  # kept: a fleet runs on it
    finally:
        await conn.close()
    code, out = await _bcw(empty_database_url, "migrate")
    assert code == 0 and "Hello proofs: warn" in out
    [warning] = [line for line in out.splitlines() if line.startswith("WARNING:")]
    assert "BCW_HELLO_PROOF=warn" in warning and "1 connected session(s) unproven" in warning
    code, out = await bcw("migrate", BCW_DATABASE_URL=empty_database_url, BCW_HELLO_PROOF="require")
    assert code == 0 and "Hello proofs: require" in out and "WARNING" not in out


async def test_a_database_migrated_at_once_starts_at_require(empty_database_url: str) -> None:
    code, out = await _bcw(empty_database_url, "migrate")
    assert code == 0 and "Hello proofs: require" in out and "WARNING" not in out


async def test_the_schema_lock_is_made_on_an_empty_database_and_held_for_the_run(
    empty_database_url: str,
) -> None:
    """The first `schema_lock` makes its table; a second waits for the first, and past its
    patience says so (`LockBusy`); once the first is gone, the second has it."""
    connect = functools.partial(asyncpg.connect, empty_database_url)
    async with migrate.schema_lock(connect):
        with pytest.raises(migrate.LockBusy, match="another bcw migrate held the schema lock"):
            async with migrate.schema_lock(connect, patience=1.0):
                pass
    async with migrate.schema_lock(connect, patience=1.0):
        conn = await connect()
        try:  # the migration that makes it for a database migrated without the lock agrees
            assert await migrate.migrate(conn) == ALL
            assert await conn.fetchval("SELECT count(*) FROM schema_lock") == 1
        finally:
            await conn.close()
