"""A rollback within a major, on real servers (docs/contract.md, "Compatibility"): this
release on a schema a newer release of the same major expanded — one more table, its
migration recorded as that release's — migrates, waits and runs as on its own schema; a
later major's migration, a file missing, a changed file are each refused (exit 2, named).

The previous release cannot learn this rule: the rolling-upgrade test rolls back to it on
this release's schema (it never checks the ledger at start); this test is the rule
itself, and the next release's rolling-upgrade test covers both."""

from __future__ import annotations

from pathlib import Path

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration.support import bcw, hellos_applied_by_workers
from workers.registry import WORKERS
from workers.runtime.base.release import parse, release
from workers.runtime.store import migrate

pytestmark = [pytest.mark.timeout(300)]

MAJOR = parse(release()).major  # type: ignore[union-attr]
NEWER = f"{MAJOR}.999.0"  # a later release of this major
LATER_MAJOR = f"{MAJOR + 1}.0.0"


async def _record(database_url: str, name: str, by: str | None, sql: str = "") -> None:
    """A migration `name` applied by release `by` (None: a release that recorded none)."""
    conn = await asyncpg.connect(database_url)
    try:
        async with conn.transaction():
            if sql:
                await conn.execute(sql)
            await conn.execute(
                "INSERT INTO schema_migrations (name, checksum, release) VALUES ($1, 'x', $2)",
                name,
                by,
            )
    finally:
        await conn.close()


async def test_a_schema_a_newer_release_of_this_major_expanded_is_run_on(
    servers: Servers, empty_database_url: str, subjects: Subjects, nc: NATS, tmp_path: Path
) -> None:
    env = {"BCW_DATABASE_URL": empty_database_url}
    code, out = await bcw("migrate", **env)
    assert code == 0, out
    await _record(
        empty_database_url,
        "9990_a_later_table.sql",
        NEWER,
        "CREATE TABLE a_later_table (node_id text PRIMARY KEY REFERENCES nodes (node_id))",
    )
    code, out = await bcw("migrate", "--wait", "10s", **env)
    assert code == 0, out
    assert f"1 migration(s) of release {NEWER}, newer within this major" in out
    code, out = await bcw("migrate", **env)
    assert code == 0 and "applied 0 migration(s)" in out, out
    code, out = await bcw("migrate", "--status", **env)
    assert code == 0, out
    assert "newer    9990_a_later_table.sql" in out and f"(release {NEWER})" in out

    # and its workers apply Hellos on it
    nodes = [f"rb-{i:03d}" for i in range(60)]
    run_env = {
        "BCW_NATS_URL": servers.nats_url,
        "BCW_DATABASE_URL": empty_database_url,
        "BCW_SUBJECT_ROOT": subjects.root,
        "BCW_HEALTH_PORT": "0",
        "BCW_LOG_LEVEL": "WARNING",
        "BCW_LIVENESS_HEARTBEAT_INTERVAL": "3600",
    }
    code, out = await bcw("provision", **run_env)
    assert code == 0, out
    codes = await hellos_applied_by_workers(
        run_env, tmp_path, nc, subjects, empty_database_url, nodes
    )
    assert codes == [0] * len(WORKERS)


@pytest.mark.parametrize(
    ("by", "state"),
    [(LATER_MAJOR, "newer-major"), (None, "missing"), ("0.1.0", "missing")],
    ids=["a-later-major", "no-release-recorded", "an-earlier-release"],
)
async def test_a_migration_this_release_may_not_run_on_is_refused_by_name(
    empty_database_url: str, by: str | None, state: str
) -> None:
    env = {"BCW_DATABASE_URL": empty_database_url}
    assert (await bcw("migrate", **env))[0] == 0
    await _record(empty_database_url, "9991_unknown_here.sql", by)
    for args in (("migrate",), ("migrate", "--wait", "10s")):
        code, out = await bcw(*args, **env)
        assert code == 2, out
        assert f"9991_unknown_here.sql ({state}" in out and "Traceback" not in out
        if state == "newer-major":
            assert f"release {LATER_MAJOR} is a later major" in out
    code, out = await bcw("migrate", "--status", **env)
    assert code == 1 and f"{state:<8} 9991_unknown_here.sql" in out, out


async def test_a_changed_file_is_still_refused_beside_a_newer_releases_migration(
    empty_database_url: str,
) -> None:
    env = {"BCW_DATABASE_URL": empty_database_url}
    assert (await bcw("migrate", **env))[0] == 0
    await _record(empty_database_url, "9990_a_later_table.sql", NEWER)
    first = migrate.load(migrate.default_directory())[0].name
    conn = await asyncpg.connect(empty_database_url)
    try:
        await conn.execute("UPDATE schema_migrations SET checksum = 'x' WHERE name = $1", first)
        recorded = await conn.fetchval(
            "SELECT count(*) FROM schema_migrations WHERE release = $1", release()
        )
    finally:
        await conn.close()
    assert recorded == len(migrate.load(migrate.default_directory()))  # each records its release
    code, out = await bcw("migrate", **env)
    assert code == 2 and f"{first} was changed" in out, out
    code, out = await bcw("migrate", "--wait", "10s", **env)
    assert code == 2 and f"{first} (changed" in out, out
