"""`helm rollback` to the previous release (0.3, before the ledger recorded releases), on
real servers: the previous release's own `bcw migrate --wait` — its pods' init container
— run as a worker's and the relay's login against a schema this release migrated, after
the previous one (an upgraded database) or alone (one this release installed). It reads
every row of `schema_migrations` and refuses one it does not know; the ledger's row rule
(`policies.LEDGER_BEFORE_0_4`) shows such a login only the migrations it knows, while
this release, reading as `migrate.LEDGER_READ` says, still sees every row."""

from __future__ import annotations

import contextlib

import asyncpg
import pytest

from tests.integration.security.conftest import url_as
from tests.integration.support import bcw
from tests.upgrade.conftest import run_bcw
from tests.upgrade.release import Release, _git
from workers.runtime.store import migrate, policies

pytestmark = [pytest.mark.timeout(600)]

GROUPS = ("bcw_labeler", "bcw_relay")


async def _old_bcw(release: Release, *args: str, **env: str) -> tuple[int, str]:
    return await run_bcw([str(release.bcw)], env, *args)


def test_the_rule_shows_the_migrations_the_previous_release_has(old: Release) -> None:
    files = _git("ls-tree", "--name-only", old.commit, "migrations/core/").split()
    last = max(f.rsplit("/", 1)[-1][:4] for f in files if f.endswith(".sql"))
    assert f"left(name, 4) <= '{last}'" in policies.LEDGER_BEFORE_0_4


@pytest.mark.parametrize("first", ["previous-then-this", "this-alone"])
async def test_the_previous_releases_init_container_starts_on_this_releases_schema(
    old: Release, empty_database_url: str, first: str
) -> None:
    owner = {"BCW_DATABASE_URL": empty_database_url}
    if first == "previous-then-this":
        code, out = await _old_bcw(old, "migrate", **owner)
        assert code == 0, out
    code, out = await bcw("migrate", **owner)
    assert code == 0, out
    conn = await asyncpg.connect(empty_database_url)
    try:
        for group in GROUPS:
            with contextlib.suppress(asyncpg.DuplicateObjectError, asyncpg.UniqueViolationError):
                await conn.execute(f"CREATE ROLE {group}_rollback_t LOGIN IN ROLE {group}")
        everything = await conn.fetchval("SELECT count(*) FROM schema_migrations")
    finally:
        await conn.close()
    assert everything == len(migrate.load(migrate.default_directory()))
    for group in GROUPS:
        login = {"BCW_DATABASE_URL": url_as(empty_database_url, f"{group}_rollback_t")}
        code, out = await _old_bcw(old, "migrate", "--wait", "5s", **login)
        assert code == 0 and "schema current" in out, (group, out)
        # this release, as the same login, still sees every row
        code, out = await bcw("migrate", "--wait", "5s", **login)
        assert code == 0, (group, out)
        code, out = await bcw("migrate", "--status", **login)
        states = [line.split()[0] for line in out.splitlines() if line.strip()]
        assert code == 0 and states == ["applied"] * everything, (group, out)
