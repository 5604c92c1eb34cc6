"""The one permission table is what is applied: the grants, functions, row rules and login
limits `bcw migrate` leaves in the database's catalogs are those of the registry's table
(`ROLES`, each worker's `grants.py` and the runtime's own groups; the docs' roles table is
generated from it), no more and no fewer; the users `bcw auth nats` writes carry exactly the
permissions of the docs' generated principals table.

What is real: the `bcw` command in a subprocess, the session's PostgreSQL, the catalogs.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import asyncpg

from tests.integration.support import bcw
from workers.registry import ROLES
from workers.runtime.base.settings_docs import block
from workers.runtime.bus import principals
from workers.runtime.store import policies
from workers.runtime.store.roles import Grant

ROOT = Path(__file__).resolve().parents[3]

TABLE_ACL = """
SELECT c.relname, a.grantee::regrole::text AS grantee, a.privilege_type
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace, aclexplode(c.relacl) a
 WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'v') AND a.grantee <> 0
"""
COLUMN_ACL = """
SELECT c.relname, t.attname, a.grantee::regrole::text AS grantee, a.privilege_type
  FROM pg_attribute t JOIN pg_class c ON c.oid = t.attrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace, aclexplode(t.attacl) a
 WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'v') AND a.grantee <> 0
"""
FUNCTION_ACL = """
SELECT p.oid::regprocedure::text AS signature,
       CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END AS grantee
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace,
       aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
 WHERE n.nspname = current_schema() AND a.privilege_type = 'EXECUTE'
"""


def _privileges(grant: Grant) -> list[tuple[str, tuple[str, ...]]]:
    """(privilege, columns: none for the whole table) of each privilege a grant names."""
    out = []
    for kind, columns in re.findall(r"(\w+)(?:\s*\(([^)]*)\))?", grant.privileges):
        out.append((kind, tuple(c.strip() for c in columns.split(",")) if columns else ()))
    return out


async def test_bcw_migrate_applies_the_permission_table_and_nothing_else(
    empty_database_url: str,
) -> None:
    url = empty_database_url
    code, out = await bcw("migrate", "--legacy-gateway-role", BCW_DATABASE_URL=url)
    assert code == 0, out
    groups = ROLES.groups_for(True)
    conn = await asyncpg.connect(url)
    logins = {group: f"t{uuid.uuid4().hex[:8]}_{group}" for group in groups}
    try:
        for group, login in logins.items():
            await conn.execute(f"CREATE ROLE {login} LOGIN IN ROLE {group}")
        code, out = await bcw("migrate", "--legacy-gateway-role", BCW_DATABASE_URL=url)
        assert code == 0, out

        # table and column privileges: each cell of the table, and no other
        whole, by_column = set(), set()
        for group in groups:
            for grant in ROLES.GROUPS[group]:
                for kind, named in _privileges(grant):
                    if named:
                        by_column |= {(grant.table, c, group, kind) for c in named}
                    else:
                        whole.add((grant.table, group, kind))
        acl = {tuple(r.values()) for r in await conn.fetch(TABLE_ACL)}
        assert {a for a in acl if a[1] in groups} == whole
        acl = {tuple(r.values()) for r in await conn.fetch(COLUMN_ACL)}
        assert {a for a in acl if a[2] in groups} == by_column

        # functions: PUBLIC executes all but the restricted; each group those it is given
        executes = await conn.fetch(FUNCTION_ACL)
        functions = {r["signature"] for r in executes}
        assert set(ROLES.RESTRICTED_FUNCTIONS) <= functions
        given = {(r["signature"], r["grantee"]) for r in executes}
        assert {f for f, g in given if g == "PUBLIC"} == functions - set(ROLES.RESTRICTED_FUNCTIONS)
        assert {(f, g) for f, g in given if g in groups} == {
            (f, g) for g in groups for f in ROLES.EXECUTES.get(g, ())
        }

        # row rules: row-level security on the guarded tables; each group's policies
        secured = await conn.fetch(
            "SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = current_schema() AND relrowsecurity"
        )
        assert {r["relname"] for r in secured} == set(policies.guarded(ROLES))
        wanted = set()
        for table in policies.guarded(ROLES):
            for group in groups:
                if any(g.table == table for g in ROLES.GROUPS[group]):
                    rules = policies.rules_of(ROLES, group, table)
                    wanted |= {
                        (table, group, command, using is not None, check is not None)
                        for command, (using, check) in rules.items()
                    }
        made = await conn.fetch(
            "SELECT tablename, roles, cmd, qual IS NOT NULL AS q, with_check IS NOT NULL AS c"
            " FROM pg_policies WHERE schemaname = current_schema()"
        )
        assert {(r["tablename"], *r["roles"], r["cmd"], r["q"], r["c"]) for r in made} == wanted

        # login limits: each login of a group holds the group's
        for group, login in logins.items():
            row = await conn.fetchrow(
                "SELECT rolconnlimit, rolconfig FROM pg_roles WHERE rolname = $1", login
            )
            limits = ROLES.LIMITS[group]
            assert row["rolconnlimit"] == limits.connections, group
            assert dict(c.split("=", 1) for c in row["rolconfig"]) == limits.settings(), group
    finally:
        for login in logins.values():
            await conn.execute(f"DROP ROLE IF EXISTS {login}")
        await conn.close()


def _documented() -> dict[str, tuple[str, list[str], list[str]]]:
    """principal → (used by, publish, subscribe) as the docs' generated table shows them."""
    rows = block((ROOT / "docs" / "kubernetes.md").read_text(), "principals").splitlines()[2:]
    out = {}
    for row in rows:
        name, does, publish, subscribe = row.strip("| ").split(" | ")
        out[name.strip("`")] = (
            does,
            re.findall(r"`([^`]*)`", publish),
            re.findall(r"`([^`]*)`", subscribe),
        )
    return out


async def test_bcw_auth_nats_writes_the_permissions_the_generated_table_shows(
    tmp_path: Path,
) -> None:
    """The docs' table names one gateway (`<id>`), one subscriber application (`<app>`)
    and each principal's inbox by `<key>`: written for such a fleet, every user's
    permissions are its row's, in order, and every row is a user."""
    code, out = await bcw(
        "auth",
        "nats",
        "--gateways",
        "gw-1",
        "--subscribers",
        "siem",
        "--out",
        str(tmp_path),
        BCW_SUBJECT_ROOT="bc",
    )
    assert code == 0, out
    conf = (tmp_path / "auth.conf").read_text()
    users = re.findall(
        r'# ([\w-]+): (.*)\n\s*\{ nkey: "(\w+)", permissions: \{\n'
        r"\s*publish: \{ allow: \[(.*)\] \},\n\s*subscribe: \{ allow: \[(.*)\] \}",
        conf,
    )
    written = {
        name: (does, key, re.findall(r'"([^"]*)"', publish), re.findall(r'"([^"]*)"', sub))
        for name, does, key, publish, sub in users
    }
    assert len(written) == conf.count("nkey:")  # every user parsed

    def concrete(text: str, key: str) -> str:
        inbox = f"{principals.INBOX}.{principals.INBOX_PLACEHOLDER}"
        text = text.replace(inbox, principals.inbox_prefix(key))
        return text.replace("<id>", "gw-1").replace("<app>", "siem")

    documented = {
        concrete(name, ""): (does, publish, subscribe)
        for name, (does, publish, subscribe) in _documented().items()
    }
    assert set(written) == set(documented)
    for name, (does, key, publish, subscribe) in written.items():
        shown_does, shown_publish, shown_subscribe = documented[name]
        assert does == concrete(shown_does, key), name
        assert publish == [concrete(s, key) for s in shown_publish], name
        assert subscribe == [concrete(s, key) for s in shown_subscribe], name
