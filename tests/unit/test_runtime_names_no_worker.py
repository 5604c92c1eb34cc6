"""`workers/runtime/` names no worker (issue #62): the runtime keeps the mechanisms, each
worker its own rule, and where a mechanism needs a worker's value the worker hands it in.

Read with `tokenize`: a worker's name (a key of `workers.registry.WORKERS`, or its
plural) is a hit wherever it is a word of an identifier (`liveness_lag`,
`LivenessSettings`, `BCW_LIVENESS_X`) or of a string — docstrings included: they are the
module's text a reader gets (`help()`), not comments. Comments are not read: they may
point a reader at a worker. A name imported from `schemas`, and a name read from one
(`events.QuarantineHeld`), is the wire's (the `liveness` fact type), not a worker's.
Reads files only."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

from workers.registry import WORKERS

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ROOT / "workers" / "runtime"

NAMES = frozenset({*WORKERS, *(f"{name}s" for name in WORKERS)})
#: the words of an identifier or a text: `BCW_LIVENESS_LAG`, `LivenessSettings`, `a b-c`
WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+")
#: the tokens that say something (3.12 splits an f-string into parts)
READ = {tokenize.NAME, tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}


def _from_schemas(tree: ast.Module) -> set[str]:
    """The names a module imports from `schemas` (the wire's types)."""
    return {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "schemas"
        for alias in node.names
    }


def hits(source: str, where: str = "<source>") -> list[str]:
    """`where:line: name (token)` for each worker's name in `source` outside comments."""
    wire = _from_schemas(ast.parse(source))
    found: list[str] = []
    said: list[str] = ["", ""]  # the two tokens before, for `events.QuarantineHeld`
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        before, said = said, [said[1], token.string]
        if token.type not in READ:
            continue
        if token.type == tokenize.NAME and (
            token.string in wire or (before[1] == "." and before[0] in wire)
        ):
            continue
        named = sorted({word.lower() for word in WORD.findall(token.string)} & NAMES)
        if named:
            text = token.string if len(token.string) <= 60 else f"{token.string[:57]}..."
            found.append(f"{where}:{token.start[0]}: {', '.join(named)} in {text!r}")
    return found


@pytest.mark.parametrize(
    ("source", "named"),
    [
        ("liveness_lag = 1\n", True),
        ("class LivenessSettings: ...\n", True),
        ("x = 'BCW_QUARANTINE_HOLD_MAX'\n", True),
        ("x = f'bcw_{y}_replay'\n", True),
        ('def f():\n    """Used by the recorder."""\n', True),
        ("x = 'what the labelers say'\n", True),
        ("x = 1  # the liveness sweep reads it\n", False),
        ("#: set by the replay worker's loop\nx = 1\n", False),
        ("from schemas.facts import Liveness\n\nKINDS = (Liveness,)\n", False),
        ("from schemas import events\n\nKINDS = (events.QuarantineHeld,)\n", False),
        ("from schemas.facts import Hello\n\nreplay = Hello\n", True),
        ("x = 'quarantined'\n", False),  # a state, not the worker
        ("sweep_seconds = 'bcw_sweep_seconds'\n", False),
    ],
)
def test_a_workers_name_is_found_outside_comments(source: str, named: bool) -> None:
    assert bool(hits(source)) is named, hits(source)


def test_the_runtime_names_no_worker() -> None:
    modules = sorted(RUNTIME.rglob("*.py"))
    assert len(modules) > 40
    found = [hit for m in modules for hit in hits(m.read_text(), str(m.relative_to(ROOT)))]
    assert not found, "the runtime names a worker:\n" + "\n".join(found)
