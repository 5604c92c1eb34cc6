"""Issue 60, item 1 (the rollback runbook), attacked: `schema_migrations` has row-level
security now — the worker and relay logins see the migrations to 0.3.0's last (0024)
unless they say `SET LOCAL bcw.ledger = 'releases'` (`policies.LEDGER_BEFORE_0_4`).

Logged in as each group's login in turn, with the setting and without: the setting shows
rows, and that is all it does — no login of any group inserts, changes or deletes a row of
the ledger (a forged row would make `bcw migrate` skip a migration, a deleted one re-apply
it), nor sees more than its policy says; the ledger is as it was."""

from __future__ import annotations

import asyncpg
import pytest

from tests.integration.security.conftest import GROUPS
from workers.registry import LEDGER_READERS

pytestmark = pytest.mark.slow

WRITES = {
    "forge a row": "INSERT INTO schema_migrations (name, checksum) VALUES ('9999_forged', 'x')",
    "retire a row": "DELETE FROM schema_migrations WHERE name > '0024'",
    "rewrite a row": "UPDATE schema_migrations SET checksum = 'x' WHERE name > '0024'",
    "empty it": "TRUNCATE schema_migrations",
}


async def _ledger(conn: asyncpg.Connection, releases: bool) -> list[tuple[str, str]] | None:
    """The ledger as `conn` sees it (None: not readable at all)."""
    try:
        async with conn.transaction():
            if releases:
                await conn.execute("SET LOCAL bcw.ledger = 'releases'")
            rows = await conn.fetch("SELECT name, checksum FROM schema_migrations ORDER BY name")
    except asyncpg.InsufficientPrivilegeError:
        return None
    return [(r["name"], r["checksum"]) for r in rows]


async def test_the_ledgers_setting_shows_rows_and_does_nothing_else(
    logins: dict[str, str], db: asyncpg.Connection
) -> None:
    whole = [
        (r["name"], r["checksum"])
        for r in await db.fetch("SELECT name, checksum FROM schema_migrations ORDER BY name")
    ]
    assert any(name[:4] > "0024" for name, _ in whole)
    before_0_4 = [(n, c) for n, c in whole if n[:4] <= "0024"]
    seen: dict[str, tuple[int | None, int | None]] = {}
    for group in GROUPS:
        conn = await asyncpg.connect(logins[group])
        try:
            plain, said = await _ledger(conn, False), await _ledger(conn, True)
            if group in LEDGER_READERS:  # its `bcw migrate --wait`: as a 0.3 one reads it
                assert (plain, said) == (before_0_4, whole), group
            else:  # the setting changes nothing for any other
                assert plain == said and plain in (None, whole), group
            for what, sql in WRITES.items():
                for releases in (False, True):
                    with pytest.raises(asyncpg.InsufficientPrivilegeError):
                        async with conn.transaction():
                            if releases:
                                await conn.execute("SET LOCAL bcw.ledger = 'releases'")
                            await conn.execute(sql)
                    assert what  # named for the failure's context
            seen[group] = (
                None if plain is None else len(plain),
                None if said is None else len(said),
            )
        finally:
            await conn.close()
    after = [
        (r["name"], r["checksum"])
        for r in await db.fetch("SELECT name, checksum FROM schema_migrations ORDER BY name")
    ]
    assert after == whole
    # who reads the ledger, and how much of it (None: refused)
    readers = {g: v for g, v in seen.items() if v != (None, None)}
    assert readers == {
        **{g: (len(before_0_4), len(whole)) for g in LEDGER_READERS},
        "bcw_reader": (len(whole), len(whole)),
    }
