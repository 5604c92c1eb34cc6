"""SQL span names: each statement's operations and tables as the database conventions
summarize them, checked over every statement the project's code holds (collected from its
source) and over statements built from the shapes it uses."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workers.runtime.observability.sql import OPERATIONS, SUMMARY_MAX, Summary, summarize

ROOT = Path(__file__).resolve().parents[3]
_START = re.compile(r"\s*(?:--[^\n]*\n\s*)*(SELECT|INSERT|UPDATE|DELETE|WITH)\b", re.IGNORECASE)
#: words of SQL that a summary must never take for a table
_NEVER = {
    "SET",
    "OF",
    "UPDATE",
    "SELECT",
    "FROM",
    "WHERE",
    "ON",
    "DO",
    "NOTHING",
    "LOCKED",
    "SKIP",
    "SHARE",
    "KEY",
    "NO",
    "LATERAL",
    "UNNEST",
    "AS",
    "VALUES",
    "INTO",
}


def _text(node: ast.AST) -> str | None:
    """A string constant, or an f-string with its holes filled by a placeholder value."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(
            v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else "1"
            for v in node.values
        )
    return None


def _statements() -> list[str]:
    found = set()
    for path in sorted((ROOT / "workers").rglob("*.py")) + sorted((ROOT / "schemas").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            text = _text(node)
            if text is None or not _START.match(text) or "\n\n" in text.strip():
                continue
            words = text.split()
            if len(words) >= 2 and re.search(r"\b(FROM|INTO|SET|\()", text, re.IGNORECASE):
                found.add(text)
    return sorted(found)


STATEMENTS = _statements()


def _relations() -> set[str]:
    """Every table, view and function the migrations (or the code) create."""
    names: set[str] = set()
    pattern = re.compile(
        r"CREATE\s+(?:OR\s+REPLACE\s+)?(?:UNLOGGED\s+)?(?:TABLE|VIEW|FUNCTION|MATERIALIZED\s+VIEW)"
        r"\s+(?:IF\s+NOT\s+EXISTS\s+)?([a-z_.]+)",
        re.IGNORECASE,
    )
    sources = [*(ROOT / "migrations").rglob("*.sql"), *(ROOT / "workers").rglob("*.py")]
    for path in sources:  # the benchmarks create tables of their own
        names |= {m.lower().split(".")[-1] for m in pattern.findall(path.read_text())}
    return names


RELATIONS = _relations()


def test_the_collection_finds_the_project_s_statements() -> None:
    assert len(STATEMENTS) >= 60  # the workers, the gateway, the store, the CLI
    joined = "\n".join(STATEMENTS)
    assert "ON CONFLICT" in joined and "FOR UPDATE OF" in joined and "WITH locked" in joined


@pytest.mark.parametrize("query", STATEMENTS)
def test_every_statement_is_named_by_its_real_operations_and_tables(query: str) -> None:
    summary = summarize(query)
    pieces = summary.text.split()
    assert pieces[0].upper() in OPERATIONS, summary
    assert summary.operation in OPERATIONS
    assert len(summary.text) <= SUMMARY_MAX
    named = [p for p in pieces if p.upper() not in OPERATIONS]
    assert not {p.upper() for p in named} & _NEVER, summary
    for name in named:  # a table or function the migrations create, or the catalog's
        bare = name.lower().split(".")[-1]
        catalog = name.lower().startswith(("pg_", "information_schema."))
        assert bare in RELATIONS or catalog, (name, query)
    if summary.collection is not None:
        assert summary.collection in named
        assert re.search(rf"\b{re.escape(summary.collection)}\b", query)


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("SELECT 1", Summary("SELECT", "SELECT", None)),
        ("BEGIN;", Summary("BEGIN", "BEGIN", None)),
        (
            "INSERT INTO outbox (msg_id) SELECT 1",
            Summary("INSERT outbox SELECT", "INSERT", "outbox"),
        ),
        (
            "DELETE FROM processed_facts WHERE consumer = $1",
            Summary("DELETE processed_facts", "DELETE", "processed_facts"),
        ),
        # the issue's: an upsert is an INSERT of its table, not `UPDATE SET`
        (
            "INSERT INTO node_labels (node_id) VALUES ($1) ON CONFLICT (node_id) DO UPDATE SET value = '1'",
            Summary("INSERT node_labels", "INSERT", "node_labels"),
        ),
        (
            "INSERT INTO hello_seen (node_id) VALUES ($1) ON CONFLICT (node_id) DO UPDATE SET a = EXCLUDED.a "
            "WHERE hello_seen.a < EXCLUDED.a",
            Summary("INSERT hello_seen", "INSERT", "hello_seen"),
        ),
        # a row lock is a SELECT of its table, not `UPDATE OF`
        (
            "SELECT s.node_id FROM node_sessions s JOIN nodes n USING (node_id) FOR UPDATE OF s SKIP LOCKED",
            Summary("SELECT node_sessions nodes", "SELECT", None),
        ),
        (
            "SELECT one FROM schema_lock FOR NO KEY UPDATE",
            Summary("SELECT schema_lock", "SELECT", "schema_lock"),
        ),
        (
            "WITH locked AS (SELECT 1 FROM commands FOR UPDATE) UPDATE commands c SET x = 1 FROM locked l",
            Summary("SELECT commands UPDATE commands", "UPDATE", "commands"),
        ),
        (
            "SELECT c.* FROM unnest($1::text[]) AS n(node_id) JOIN commands c USING (node_id)",
            Summary("SELECT commands", "SELECT", "commands"),
        ),
        (
            "SELECT order_date FROM (SELECT * FROM orders o JOIN customers c ON o.id = c.id) x",
            Summary("SELECT SELECT orders customers", "SELECT", None),
        ),
        (
            "SELECT * FROM songs, artists WHERE songs.artist_id = artists.id",
            Summary("SELECT songs artists", "SELECT", None),
        ),
        (
            "SELECT extract(epoch FROM at) FROM gateways WHERE a IS DISTINCT FROM b",
            Summary("SELECT gateways", "SELECT", "gateways"),
        ),
        (
            "SELECT gateway_hello($1, $2)",
            Summary("SELECT gateway_hello", "SELECT", None, "gateway_hello"),
        ),
        ("select x from 'quoted -- FROM fake' -- FROM fake\n", Summary("select", "SELECT", None)),
    ],
)
def test_a_statement_s_summary(query: str, expected: Summary) -> None:
    assert summarize(query) == expected


TABLES = st.sampled_from(["node_sessions", "commands", "outbox", "gateways", "node_labels"])


@given(
    table=TABLES,
    other=TABLES,
    upsert=st.booleans(),
    lock=st.sampled_from(
        ["", " FOR UPDATE", " FOR UPDATE OF t SKIP LOCKED", " FOR SHARE", " FOR NO KEY UPDATE"]
    ),
    cte=st.booleans(),
)
def test_the_shapes_the_project_uses(
    table: str, other: str, upsert: bool, lock: str, cte: bool
) -> None:
    """An INSERT (an upsert or not) of `table` from a locking SELECT of `other`, inside a
    WITH or not: the summary names exactly those, and the INSERT is the statement's."""
    conflict = (
        " ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v" if upsert else " ON CONFLICT DO NOTHING"
    )
    if cte:
        query = (
            f"WITH picked AS (SELECT k FROM {other} t WHERE k = $1{lock}) "
            f"INSERT INTO {table} (k) SELECT k FROM picked{conflict}"
        )
        expected = f"SELECT {other} INSERT {table} SELECT"
    else:
        query = f"INSERT INTO {table} (k) SELECT k FROM {other} t WHERE k = $1{conflict}"
        expected = f"INSERT {table} SELECT {other}"
        assert summarize(f"SELECT k FROM {other} t{lock}") == Summary(
            f"SELECT {other}", "SELECT", other
        )
    assert summarize(query) == Summary(expected, "INSERT", table)


@given(st.text(max_size=300))
def test_any_text_is_summarized_without_failing(query: str) -> None:
    summary = summarize(query)
    assert len(summary.text) <= SUMMARY_MAX and summary.operation


@given(st.lists(TABLES, min_size=1, max_size=80))
def test_a_long_summary_is_cut_between_words(tables: list[str]) -> None:
    query = " UNION ".join(f"SELECT k FROM {t}" for t in tables)
    text = summarize(query).text
    assert len(text) <= SUMMARY_MAX
    assert all(piece in ("SELECT", *tables) for piece in text.split())
