"""Database client spans (OpenTelemetry database conventions) from a statement's text.

`summarize` reads the operations and the tables a statement names, in the order they
appear, as the conventions' "Generating a summary of the query" says: `INSERT
processed_facts SELECT`, `SELECT node_sessions`, `UPDATE commands SELECT commands`. Clauses
that only look like operations are not: `ON CONFLICT … DO UPDATE SET`, `FOR UPDATE OF s`,
`FOR NO KEY UPDATE`, `IS DISTINCT FROM`, `EXTRACT(… FROM …)`, a `WITH` query's own name.
`SqlSpans` is the asyncpg query logger that makes the spans.
"""

from __future__ import annotations

import functools
import re
import time
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace

#: the conventions' bound on a summary's length (cut between words)
SUMMARY_MAX = 255
OPERATIONS = frozenset({"SELECT", "INSERT", "UPDATE", "DELETE", "MERGE"})
#: keywords that, read after FROM or JOIN, are not a table
_NOT_TABLES = frozenset(
    {
        "LATERAL",
        "ONLY",
        "SELECT",
        "UNNEST",
        "ROWS",
        "VALUES",
        "WHERE",
        "ON",
        "USING",
    }
)
#: functions whose arguments use FROM without naming a table
_FROM_FUNCTIONS = frozenset({"EXTRACT", "SUBSTRING", "TRIM", "OVERLAY", "POSITION"})
_TOKEN = re.compile(
    r"""(?P<skip>--[^\n]*|/\*.*?\*/|'(?:[^']|'')*'|\$(?P<tag>[a-z_]*)\$.*?\$(?P=tag)\$)
      | (?P<word>"(?:[^"]|"")+"|[a-z_][a-z0-9_$]*(?:\.(?:"(?:[^"]|"")+"|[a-z_][a-z0-9_$]*))*)
      | (?P<punct>[(),;])
      | (?P<other>\S)""",
    re.IGNORECASE | re.DOTALL | re.VERBOSE,
)


@dataclass(frozen=True)
class Summary:
    """What a statement does: its summary (the span's name), its main operation (its
    first outside parentheses: a `WITH`'s statement, not its queries'), that operation's one table (None
    when it names none or several), and the function a lone `SELECT f(…)` calls."""

    text: str
    operation: str
    collection: str | None
    procedure: str | None = None


def _tokens(query: str) -> list[str]:
    return [m.group() for m in _TOKEN.finditer(query) if m.lastgroup != "skip"]


def _word(token: str) -> str:
    return token.upper() if token[:1] != '"' else token


@functools.lru_cache(maxsize=512)
def summarize(query: str) -> Summary:
    """The statement's summary, main operation and table. Never a value. Pure."""
    tokens = _tokens(query)
    if not tokens:
        return Summary("QUERY", "QUERY", None)
    words = [_word(t) for t in tokens]
    n = len(tokens)
    parts: list[tuple[str, list[str], int]] = []  # (operation, tables, depth), in order
    pieces: list[str] = []  # operations and tables as they appear
    stack: list[list[str]] = []  # the tables of the operations open at this point
    depths: list[int] = []
    ctes: set[str] = set()
    naming_ctes = False  # after a top-level WITH, before its statement
    depth = 0
    in_function: list[bool] = []  # per open parenthesis: inside EXTRACT(…) and the like

    def table_at(i: int, target: bool) -> str | None:
        """The table named at token i: after INTO or UPDATE (`target`) whatever follows;
        after FROM or JOIN not a subquery, a function or LATERAL."""
        while i < n and words[i] == "ONLY":
            i += 1
        if i >= n or not re.match(r'[a-z_"]', tokens[i], re.IGNORECASE):
            return None
        if not target and (words[i] in _NOT_TABLES or (i + 1 < n and tokens[i + 1] == "(")):
            return None
        return None if tokens[i].lower() in ctes else tokens[i]

    for i, (token, word) in enumerate(zip(tokens, words, strict=True)):
        before = words[i - 1] if i else ""
        after = words[i + 1] if i + 1 < n else ""
        if token == "(":
            in_function.append(before in _FROM_FUNCTIONS)
            depth += 1
        elif token == ")":
            depth -= 1
            if in_function:
                in_function.pop()
            while depths and depths[-1] > depth:
                depths.pop()
                stack.pop()
        elif depth == 0 and (
            (word == "WITH" and after not in ("ORDINALITY", "CHECK"))
            or (token == "," and naming_ctes)
        ):  # a WITH query's name (`WITH name AS (`, `, name AS (`) is not a table
            naming_ctes = True
            j = i + 2 if after == "RECURSIVE" else i + 1
            k = j + 1
            if k < n and tokens[k] == "(":  # `name(column, …) AS`
                while k < n and tokens[k] != ")":
                    k += 1
                k += 1
            if k < n and words[k] == "AS":
                ctes.add(tokens[j].lower())
        elif word in OPERATIONS and before not in ("DO", "FOR", "KEY", "ON"):
            if depth == 0:
                naming_ctes = False
            tables: list[str] = []
            parts.append((token, tables, depth))
            pieces.append(token)
            stack.append(tables)
            depths.append(depth)
            if word == "UPDATE" and (name := table_at(i + 1, target=True)):
                tables.append(name)
                pieces.append(name)
        elif word == "INTO" and stack and parts[-1][0].upper() in ("INSERT", "MERGE"):
            if name := table_at(i + 1, target=True):
                stack[-1].append(name)
                pieces.append(name)
        elif word in ("FROM", "JOIN", "USING") and stack and before != "DISTINCT":
            if in_function and in_function[-1]:
                continue
            j = i + 1
            while (name := table_at(j, target=False)) is not None:
                if name not in stack[-1]:
                    stack[-1].append(name)
                    pieces.append(name)
                j += 1  # past the name and an alias, to a comma naming another table
                if j < n and words[j] == "AS":
                    j += 1
                if (
                    j < n
                    and re.match(r"[a-z_]", tokens[j], re.IGNORECASE)
                    and not _keyword(words[j])
                ):
                    j += 1
                if j < n and tokens[j] == ",":
                    j += 1
                    continue
                break
    if not parts:  # BEGIN, SET, LISTEN …: the command itself
        return Summary(tokens[0], tokens[0].upper(), None)
    procedure = None
    if len(parts) == 1 and parts[0][0].upper() == "SELECT" and not parts[0][1]:
        # a function called for its work (`SELECT gateway_hello(…)`): the procedure
        calls = [
            tokens[k]
            for k in range(1, n - 1)
            if tokens[k + 1] == "(" and not _keyword(words[k]) and words[k] not in _BUILTINS
        ]
        if calls:
            procedure = calls[0]
            pieces.append(procedure)
    # the statement's own: its first at the top (a WITH's queries are in parentheses)
    main = next((p for p in parts if p[2] == 0), parts[0])
    text = ""
    for piece in pieces:  # cut between words at the conventions' bound
        if len(text) + len(piece) + 1 > SUMMARY_MAX:
            break
        text = f"{text} {piece}" if text else piece
    collection = main[1][0] if len(main[1]) == 1 else None
    return Summary(text, main[0].upper(), collection, procedure)


#: functions of PostgreSQL itself: never the procedure a statement calls
_BUILTINS = frozenset(
    {
        "COUNT",
        "UNNEST",
        "NOW",
        "MIN",
        "MAX",
        "SUM",
        "AVG",
        "ARRAY_AGG",
        "STRING_AGG",
        "JSONB_BUILD_OBJECT",
        "JSON_BUILD_OBJECT",
        "CARDINALITY",
        "EXTRACT",
        "TO_REGCLASS",
        "CURRENT_SETTING",
        "SET_CONFIG",
        "VERSION",
        "QUOTE_IDENT",
        "QUOTE_LITERAL",
        "FORMAT",
        "CURRENT_DATABASE",
        "CURRENT_SCHEMA",
        "CURRENT_USER",
    }
)
_KEYWORDS = frozenset(
    {
        "WHERE",
        "JOIN",
        "LEFT",
        "RIGHT",
        "INNER",
        "OUTER",
        "FULL",
        "CROSS",
        "NATURAL",
        "ON",
        "USING",
        "GROUP",
        "ORDER",
        "LIMIT",
        "OFFSET",
        "FOR",
        "RETURNING",
        "SET",
        "VALUES",
        "UNION",
        "EXCEPT",
        "INTERSECT",
        "HAVING",
        "WINDOW",
        "AS",
        "SELECT",
        "INSERT",
        "UPDATE",
        "DELETE",
        "DEFAULT",
        "FETCH",
        "TABLESAMPLE",
        "WITH",
        "AND",
        "OR",
        "NOT",
        "EXISTS",
        "CASE",
        "WHEN",
        "THEN",
        "ELSE",
        "END",
        "IN",
        "IS",
        "NULL",
        "ANY",
        "ALL",
        "ARRAY",
        "COALESCE",
        "GREATEST",
        "LEAST",
        "NULLIF",
        "CAST",
        "ROW",
        "LATERAL",
        "DISTINCT",
    }
)


def _keyword(word: str) -> bool:
    return word in _KEYWORDS


class SqlSpans:
    """An asyncpg query logger that turns each statement run inside a recording span into
    a CLIENT span named by its summary: `db.system.name=postgresql`, `db.query.summary`,
    `db.operation.name`, `db.collection.name` (where one table), the server and the
    database; a failed one its `error.type` (the SQLSTATE, else the error's class) and
    `db.response.status_code`. The statement's text (parameterized: asyncpg sends values
    apart) as `db.query.text` only when `query_text` (`BCW_TRACE_QUERY_TEXT`); never a
    value. Statements outside a span (idle loops) make none. Installed on every
    connection of a pool (`install`)."""

    def __init__(self, tracer: trace.Tracer, query_text: bool = False) -> None:
        self._tracer = tracer
        self._query_text = query_text

    async def install(self, conn: Any) -> None:
        conn.add_query_logger(self)

    def __call__(self, record: Any) -> None:
        parent = trace.get_current_span()
        if not parent.is_recording():
            return
        end = time.time_ns()
        summary = summarize(record.query)
        attributes: dict[str, Any] = {
            "db.system.name": "postgresql",
            "db.operation.name": summary.operation,
            "db.query.summary": summary.text,
        }
        if summary.collection:
            attributes["db.collection.name"] = summary.collection
        if summary.procedure:
            attributes["db.stored_procedure.name"] = summary.procedure
        if self._query_text:
            attributes["db.query.text"] = record.query
        address = record.conn_addr
        if isinstance(address, tuple) and len(address) >= 2:
            attributes["server.address"], attributes["server.port"] = address[0], address[1]
        database = getattr(record.conn_params, "database", None)
        if database:
            attributes["db.namespace"] = database
        span = self._tracer.start_span(
            summary.text,
            kind=trace.SpanKind.CLIENT,
            start_time=end - int(record.elapsed * 1e9),
            attributes=attributes,
        )
        if record.exception is not None:
            error = record.exception
            sqlstate = getattr(error, "sqlstate", None)
            span.record_exception(error)
            span.set_status(trace.StatusCode.ERROR, type(error).__name__)
            span.set_attribute("error.type", sqlstate or type(error).__qualname__)
            if sqlstate:
                span.set_attribute("db.response.status_code", sqlstate)
        span.end(end_time=end)
