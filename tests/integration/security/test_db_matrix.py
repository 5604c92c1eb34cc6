"""Every cell of the database's permissions table, tried: each group role's login runs,
on every table of the schema, a SELECT, an INSERT, a DELETE, a TRUNCATE and an UPDATE of
each column, a SELECT of every view, and calls every function — each in a transaction rolled back, touching no
row (`WHERE false`). What `ROLES.GROUPS` grants passes the privilege check, everything
else fails with insufficient_privilege; the expectation is computed from that table.
Functions: those of `ROLES.EXECUTES` (the gateway functions, which run with their owner's
rights) by their group only, those of `roles.OWNER_ONLY_FUNCTIONS` by none, every other
by every group — these run with the caller's rights, so what one then reads or writes is
checked as the caller, cell by cell above."""

from __future__ import annotations

import re

import asyncpg
import pytest

from workers.registry import ROLES
from workers.runtime.store import roles

pytestmark = pytest.mark.slow


def granted(group: str) -> dict[str, set[str]]:
    """table → what `group` may do: SELECT, INSERT, DELETE, UPDATE (every column), or
    `UPDATE:<column>` for a column-level grant."""
    out: dict[str, set[str]] = {table: set() for table in (*ROLES.TABLES, *roles.VIEWS)}
    for grant in ROLES.GROUPS[group]:
        columns = re.search(r"UPDATE \(([^)]*)\)", grant.privileges)
        if columns:
            out[grant.table] |= {f"UPDATE:{c.strip()}" for c in columns.group(1).split(",")}
        for privilege in re.sub(r"UPDATE \([^)]*\)", "", grant.privileges).split(","):
            if privilege.strip():
                out[grant.table].add(privilege.strip())
    return out


async def _refusal(conn: asyncpg.Connection, statement: str) -> str | None:
    """What the privilege check said of `statement` (None: it passed; its other errors do
    not matter: refused for what it asked, not for who asked)."""
    transaction = conn.transaction()
    await transaction.start()
    try:
        await conn.execute(statement)
    except asyncpg.InsufficientPrivilegeError as refused:
        return str(refused)
    except asyncpg.PostgresError:
        return None
    finally:
        await transaction.rollback()
    return None


async def _allowed(conn: asyncpg.Connection, statement: str) -> bool:
    return await _refusal(conn, statement) is None


async def _executable(conn: asyncpg.Connection, call: str) -> bool:
    """Whether the login may execute the function; what the function then reads or writes
    is checked as the caller (these functions run with the caller's rights): that refusal
    is a table's cell, not this one."""
    refused = await _refusal(conn, call)
    return refused is None or "permission denied for function" not in refused


async def _columns(db: asyncpg.Connection) -> dict[str, list[str]]:
    rows = await db.fetch(
        """SELECT table_name, column_name FROM information_schema.columns
            WHERE table_schema = current_schema() AND table_name = ANY($1)
            ORDER BY table_name, ordinal_position""",
        list(ROLES.TABLES),
    )
    out: dict[str, list[str]] = {}
    for row in rows:
        out.setdefault(row["table_name"], []).append(row["column_name"])
    return out


async def _functions(db: asyncpg.Connection) -> dict[str, str]:
    """Every function of the schema (triggers aside) → a call of it with NULL arguments."""
    rows = await db.fetch(
        """SELECT p.oid::regprocedure::text AS signature, p.proname,
                  coalesce(array_agg(format_type(t, NULL) ORDER BY n)
                           FILTER (WHERE t IS NOT NULL), '{}') AS args
             FROM pg_proc p LEFT JOIN unnest(p.proargtypes) WITH ORDINALITY AS a(t, n) ON true
            WHERE p.pronamespace = current_schema()::regnamespace
              AND p.prorettype <> 'trigger'::regtype AND p.prokind = 'f'
            GROUP BY p.oid, p.proname"""
    )
    return {
        r["signature"]: f"SELECT {r['proname']}({', '.join(f'NULL::{a}' for a in r['args'])})"
        for r in rows
    }


@pytest.mark.parametrize("group", sorted(ROLES.GROUPS))
async def test_every_cell_of_a_groups_row(
    group: str, logins: dict[str, str], db: asyncpg.Connection
) -> None:
    columns = await _columns(db)
    assert sorted(columns) == sorted(ROLES.TABLES)  # the table names every table
    functions = await _functions(db)
    assert "set_compute_now_offset(interval)" in functions
    restricted = set(ROLES.RESTRICTED_FUNCTIONS)
    assert restricted <= set(functions)  # every signature in the table is a real function
    definers = set(
        await db.fetchval(
            "SELECT array_agg(p.oid::regprocedure::text) FROM pg_proc p WHERE p.prosecdef"
            " AND p.pronamespace = current_schema()::regnamespace"
            " AND p.prorettype <> 'trigger'::regtype"
        )
    )
    assert definers <= restricted  # no function with its owner's rights is open to all
    may = granted(group)
    wrong: list[str] = []
    conn = await asyncpg.connect(logins[group])
    try:
        for table in ROLES.TABLES:
            cells = {
                "SELECT": f"SELECT count(*) FROM {table}",
                "INSERT": f"INSERT INTO {table} OVERRIDING SYSTEM VALUE "
                f"SELECT (NULL::{table}).* WHERE false",
                "DELETE": f"DELETE FROM {table} WHERE false",
                "TRUNCATE": f"TRUNCATE {table}",
            }
            cells |= {
                f"UPDATE:{c}": f"UPDATE {table} SET {c} = DEFAULT WHERE false"
                for c in columns[table]
            }
            for cell, statement in cells.items():
                expected = cell in may[table] or (
                    cell.startswith("UPDATE:") and "UPDATE" in may[table]
                )
                if await _allowed(conn, statement) != expected:
                    wrong.append(f"{table} {cell}: expected {'allowed' if expected else 'refused'}")
        # a view: read as granted, and — as it runs as its caller (migration 0050) — only
        # by a group granted what it reads too
        for view in roles.VIEWS:
            expected = "SELECT" in may[view]
            if await _allowed(conn, f"SELECT count(*) FROM {view}") != expected:
                wrong.append(f"{view} SELECT: expected {'allowed' if expected else 'refused'}")
        for signature, call in functions.items():
            expected = ROLES.may_execute(group, signature)
            if await _executable(conn, call) != expected:
                wrong.append(f"{signature}: expected {'allowed' if expected else 'refused'}")
    finally:
        await conn.close()
    assert wrong == [], (group, "\n".join(wrong))
