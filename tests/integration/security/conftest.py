"""What the security tests share: a login role per database group, member of that group
only, and its URL to the test's database (the `bcw_gateway_bound` login acts as gw-1)."""

from __future__ import annotations

import contextlib
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from tests.conftest import Servers
from workers.runtime.store import migrate, roles

GROUPS = tuple(roles.GROUPS)


def _login(group: str) -> str:
    return f"{group}_login_t"


def _as(url: str, user: str) -> str:
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{user}@{host}"))


@pytest.fixture
async def logins(servers: Servers, database_url: str) -> dict[str, str]:
    """A login role per group, member of that group only; its URL to this test's database.
    The `bcw_gateway_bound` login is bound to gateway gw-1."""
    conn = await asyncpg.connect(database_url)
    try:
        await migrate.grant(conn)  # as `bcw migrate` does on this very database
        for group in GROUPS:
            with contextlib.suppress(asyncpg.DuplicateObjectError, asyncpg.UniqueViolationError):
                await conn.execute(f"CREATE ROLE {_login(group)} LOGIN IN ROLE {group}")
        # the gateway login acts as gw-1 (bcw auth db --bind)
        await conn.execute(
            "INSERT INTO gateway_logins (login, gateway_id) VALUES ($1, 'gw-1') "
            "ON CONFLICT (login) DO NOTHING",
            _login("bcw_gateway_bound"),
        )
        members = await conn.fetch(
            """
            SELECT r.rolname AS login, g.rolname AS grp FROM pg_auth_members m
              JOIN pg_roles r ON r.oid = m.member JOIN pg_roles g ON g.oid = m.roleid
             WHERE r.rolname = ANY($1)
            """,
            [_login(g) for g in GROUPS],
        )
    finally:
        await conn.close()
    assert sorted((m["login"], m["grp"]) for m in members) == sorted((_login(g), g) for g in GROUPS)
    return {group: _as(database_url, _login(group)) for group in GROUPS}
