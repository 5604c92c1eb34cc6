"""Migrations only expand within a major (docs/contract.md, "Compatibility"): nothing the
previous release's workers use is dropped, renamed, narrowed or made stricter, so they keep
running while `bcw migrate` runs beside them. Every migration file is read and each
statement checked; a sample of each breaking statement is refused."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from workers.runtime.store.migrate import Migration, default_directory, load

#: (what a statement may not do, why the previous release's workers would break)
# one pattern a row beside its reason: kept out of the formatter (fmt: skip)
BREAKING: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE | re.DOTALL), why)
    for pattern, why in [
        (r"\bDROP\s+(TABLE|VIEW|MATERIALIZED\s+VIEW|FUNCTION|PROCEDURE|TYPE|SCHEMA|SEQUENCE)\b",
         "drops what the previous release may use"),
        (r"\bDROP\s+COLUMN\b", "drops a column the previous release may read or write"),
        (r"\bRENAME\b", "renames what the previous release names"),
        (r"\bALTER\s+COLUMN\s+\S+\s+(SET\s+DATA\s+)?TYPE\b", "changes a column's type"),
        (r"\bALTER\s+COLUMN\s+\S+\s+SET\s+NOT\s+NULL\b", "makes a column required"),
        (r"\bALTER\s+COLUMN\s+\S+\s+DROP\s+DEFAULT\b", "takes away a default old writers rely on"),
        (r"\bADD\s+CONSTRAINT\b", "a new constraint on existing columns may refuse old writers"),
        (r"\bADD\s+(COLUMN\s+)?(IF\s+NOT\s+EXISTS\s+)?\S+\s+[^,;]*\bNOT\s+NULL\b(?![^,;]*\bDEFAULT\b)",
         "a new NOT NULL column without a default refuses the previous release's inserts"),
    ]
)  # fmt: skip

FUNCTION_RE = re.compile(
    r"\bCREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+([\w.]+)\s*\((.*?)\)\s*RETURNS\s+(\S+(?:\s+OF\s+\S+)?)",
    re.IGNORECASE | re.DOTALL,
)
DOLLAR_RE = re.compile(r"\$(\w*)\$.*?\$\1\$", re.DOTALL)
COMMENT_RE = re.compile(r"--[^\n]*")


@dataclass(frozen=True)
class Breaking:
    migration: str
    statement: str
    why: str


def statements(sql: str) -> list[str]:
    """The statements of a file, without comments and with function bodies blanked (a body
    may say DELETE or DROP about its own rows; it is code, not schema)."""
    text = DOLLAR_RE.sub("$$ $$", COMMENT_RE.sub("", sql))
    return [" ".join(s.split()) for s in text.split(";") if s.strip()]


def check(migrations: list[Migration]) -> list[Breaking]:
    """Every breaking statement of `migrations`, taken in order (a function is breaking
    when a later file changes the parameters or result of one an earlier file made)."""
    found: list[Breaking] = []
    signatures: dict[str, tuple[str, str]] = {}
    for migration in migrations:
        for statement in statements(migration.sql):
            for pattern, why in BREAKING:
                if pattern.search(statement):
                    found.append(Breaking(migration.name, statement[:120], why))
            for name, params, returns in FUNCTION_RE.findall(statement):
                signature = (" ".join(params.lower().split()), returns.lower())
                earlier = signatures.setdefault(name.lower(), signature)
                if earlier != signature:
                    found.append(
                        Breaking(migration.name, statement[:120], "changes a function's signature")
                    )
    return found


def test_every_migration_only_expands() -> None:
    assert check(load(default_directory())) == []


@pytest.mark.parametrize(
    "sql",
    [
        "ALTER TABLE node_sessions DROP COLUMN load;",
        "alter table commands drop column if exists trace_context",
        "DROP TABLE hello_seen;",
        "DROP FUNCTION nodes_with_capability(text);",
        "ALTER TABLE nodes RENAME COLUMN role TO kind;",
        "ALTER TABLE node_labels RENAME TO labels;",
        "ALTER TABLE commands ALTER COLUMN kind TYPE varchar(32);",
        "ALTER TABLE commands ALTER COLUMN lane SET DATA TYPE text;",
        "ALTER TABLE commands ALTER COLUMN payload SET NOT NULL;",
        "ALTER TABLE commands ALTER COLUMN lane DROP DEFAULT;",
        "ALTER TABLE commands ADD CONSTRAINT lane_short CHECK (length(lane) < 8);",
        "ALTER TABLE node_sessions ADD COLUMN zone text NOT NULL;",
        "ALTER TABLE node_sessions ADD zone text NOT NULL CHECK (zone <> '');",
    ],
)
def test_a_breaking_statement_is_refused(sql: str) -> None:
    [breaking] = check([Migration("0999_sample.sql", sql)])
    assert breaking.migration == "0999_sample.sql"


@pytest.mark.parametrize(
    "sql",
    [
        "ALTER TABLE node_sessions ADD COLUMN zone text;",
        "ALTER TABLE node_sessions ADD COLUMN zone text NOT NULL DEFAULT 'none';",
        "CREATE TABLE zones (name text NOT NULL PRIMARY KEY);",
        "CREATE INDEX node_sessions_zone ON node_sessions (zone);",
        "ALTER TABLE commands ALTER COLUMN lane SET DEFAULT 'default';",
        # a body is code: its DELETE and its word DROP are about rows, not the schema
        "CREATE FUNCTION f() RETURNS void LANGUAGE sql AS $$ DELETE FROM t WHERE what = 'DROP TABLE' $$;",
        "-- DROP COLUMN in a comment\nSELECT 1;",
    ],
)
def test_an_expanding_statement_passes(sql: str) -> None:
    assert check([Migration("0999_sample.sql", sql)]) == []


def test_a_function_whose_signature_changes_is_refused() -> None:
    made = Migration(
        "0998_f.sql", "CREATE FUNCTION f(p_a text) RETURNS int LANGUAGE sql AS $$ SELECT 1 $$;"
    )
    same = Migration(
        "0999_f.sql",
        "CREATE OR REPLACE FUNCTION f(p_a text) RETURNS int LANGUAGE sql AS $body$ SELECT 2 $body$;",
    )
    other = Migration(
        "0999_f.sql",
        "CREATE OR REPLACE FUNCTION f(p_a text, p_b int) RETURNS int LANGUAGE sql AS $$ SELECT 2 $$;",
    )
    assert check([made, same]) == []
    assert [b.why for b in check([made, other])] == ["changes a function's signature"]
