"""Applying the database's permissions: the group roles, their grants (`roles`), their
row rules (`policies`) and their logins' limits (`limits`), as `bcw migrate` does after
the migrations, under their lock (`migrate.grant`, `migrate.schema_lock`). The table it
applies is handed to it (`roles.Roles`: the registry's `ROLES`)."""

from __future__ import annotations

import functools
import logging

import asyncpg

from workers.runtime.store import db, limits, policies, roles

log = logging.getLogger(__name__)


class Granted(list[str]):
    """The groups granted to, and what became of their logins' limits (`limits`)."""

    def __init__(self, groups: tuple[str, ...], applied: limits.Applied) -> None:
        super().__init__(groups)
        self.limits = applied


async def apply(
    conn: asyncpg.Connection, table: roles.Roles, legacy_gateway: bool = False
) -> Granted:
    """Create the groups of `table` when this role may, then grant to every group that exists —
    the legacy gateway group only when asked (`legacy_gateway`): else, if it exists, it
    keeps no grant.

    Returns the groups granted to (and their logins' limits). Each group's grants go in one
    transaction, so a group is never left half-granted.
    """
    wanted = table.groups_for(legacy_gateway)
    may_create = await conn.fetchval(
        "SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user"
    )
    if may_create:
        await conn.execute(table.create_roles_sql(wanted))
    else:
        log.info("this role may not create roles: granting to the bcw_* roles that exist")
    existing = {
        r["rolname"]
        for r in await conn.fetch(
            "SELECT rolname FROM pg_roles WHERE rolname = ANY($1)", list(table.GROUPS)
        )
    }
    granted = tuple(group for group in wanted if group in existing)
    async with conn.transaction():
        await conn.execute(table.grants_sql(granted))
        if roles.LEGACY_GATEWAY in existing and roles.LEGACY_GATEWAY not in wanted:
            await conn.execute(table.strip_sql(roles.LEGACY_GATEWAY))
            log.warning(
                "%s (gateways older than 0.4) keeps no grant: its logins may rebind sessions "
                "and move leases; `bcw migrate --legacy-gateway-role` grants it while such "
                "gateways run",
                roles.LEGACY_GATEWAY,
            )
    for guarded, sql in policies.policies_sql(table, granted).items():
        await db.with_lock_patience(
            conn, f"row-level security of {guarded}", functools.partial(conn.execute, sql)
        )
    await _no_temp_for_public(conn)
    limited = {group: table.LIMITS[group] for group in granted if group in table.LIMITS}
    return Granted(granted, await limits.apply(conn, limited))


async def _no_temp_for_public(conn: asyncpg.Connection) -> None:
    """Revoke TEMP on the database from PUBLIC when this role may (it owns the database):
    no role of ours needs temporary objects, and none can then shadow ours with them."""
    owns = await conn.fetchval(
        "SELECT pg_has_role(current_user, datdba, 'MEMBER') FROM pg_database"
        " WHERE datname = current_database()"
    )
    if owns:
        database = await conn.fetchval("SELECT quote_ident(current_database())")
        await conn.execute(f"REVOKE TEMPORARY ON DATABASE {database} FROM PUBLIC")
    else:
        log.info("this role does not own the database: TEMP left as it is for PUBLIC")
