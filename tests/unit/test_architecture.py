"""docs/architecture.md against the tree: every file and folder it names exists, every
function or class it names is defined where it says, every room of the runtime and
every package of `workers/` is on the map, and every SQL function is named with the
migration holding its current body. Reads files only."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from workers.runtime.store.migrate import Migration, default_directory, load

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"

# `workers/x/y.py`, `workers/x/`, `migrations/core/0001_clock.sql`, optionally `: name, name`
NAMED = re.compile(r"`((?:workers|schemas|migrations|tests)/[\w./]*)(?::\s*([\w., ]+))?`")


def _named() -> list[tuple[str, tuple[str, ...]]]:
    found = []
    for path, names in NAMED.findall(PAGE.read_text()):
        wanted = tuple(n.strip() for n in names.split(",") if n.strip()) if names else ()
        found.append((path, wanted))
    return found


def _defined(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
    return names


def test_the_page_names_paths() -> None:
    assert len(_named()) > 40


@pytest.mark.parametrize(("path", "names"), _named(), ids=lambda value: str(value))
def test_every_named_path_exists_with_its_names(path: str, names: tuple[str, ...]) -> None:
    target = ROOT / path
    assert target.exists(), f"docs/architecture.md names {path}, which does not exist"
    if path.endswith("/"):
        assert target.is_dir()
    if names:
        missing = set(names) - _defined(target)
        assert not missing, f"{path} defines no {sorted(missing)}"


#: `CREATE [OR REPLACE] FUNCTION name(` (the parameters follow, to the matching parenthesis)
CREATE_FUNCTION = re.compile(r"\bCREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+([\w.]+)\s*\(", re.I)
SQL_COMMENT = re.compile(r"--[^\n]*")
#: a row of the page's table: | `name` | arguments | `migrations/core/NNNN_x.sql` | earlier |
FUNCTION_ROW = re.compile(
    r"^\| `(\w+)` \| (\d+) \| `migrations/core/([\w.]+\.sql)` \| ([\d, —]+) \|$", re.M
)

#: (name, input arguments) → every migration that creates it, in order
Bodies = dict[tuple[str, int], list[str]]


def _inputs(sql: str, start: int) -> int:
    """How many input parameters the list opening at `start` (after its parenthesis) has."""
    depth, at, parts, part = 1, start, [], ""
    while depth:
        char = sql[at]
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 1 and char == ",":
            parts.append(part)
            part = ""
        elif depth:
            part += char
        at += 1
    parts.append(part)
    return sum(1 for p in parts if p.strip() and p.split()[0].upper() != "OUT")


def function_bodies(migrations: list[Migration]) -> Bodies:
    """Each SQL function the migrations make (by name and count of input arguments), with
    the migrations that create it, in order: the last holds its current body."""
    bodies: Bodies = {}
    for migration in migrations:
        sql = SQL_COMMENT.sub("", migration.sql)
        for made in CREATE_FUNCTION.finditer(sql):
            key = (made.group(1), _inputs(sql, made.end()))
            bodies.setdefault(key, []).append(migration.name)
    return bodies


def page_bodies(page: str) -> Bodies:
    """The page's table read back as `function_bodies` says it: earlier bodies by number."""
    named: Bodies = {}
    for name, arguments, current, earlier in FUNCTION_ROW.findall(page):
        numbers = [n.strip() for n in earlier.split(",") if n.strip() not in ("", "—")]
        assert (name, int(arguments)) not in named, f"{name} ({arguments}) named twice"
        named[(name, int(arguments))] = [*numbers, current]
    return named


def wrong_rows(page: str, bodies: Bodies) -> list[str]:
    """What the page's table says that the migrations do not (an empty list: all true)."""
    named = page_bodies(page)
    wrong = []
    for key in sorted(bodies.keys() | named.keys()):
        made = bodies.get(key)
        said = named.get(key)
        if made is None:
            wrong.append(f"{key} is named, but no migration makes it")
            continue
        right = f"| `{key[0]}` | {key[1]} | `migrations/core/{made[-1]}` | "
        right += (", ".join(m[:4] for m in made[:-1]) or "—") + " |"
        if said is None:
            wrong.append(f"{key} is missing; its row: {right}")
        elif said[-1] != made[-1] or said[:-1] != [m[:4] for m in made[:-1]]:
            wrong.append(f"{key} is named wrongly; its row: {right}")
    return wrong


def test_every_sql_function_is_named_with_the_migration_of_its_current_body() -> None:
    bodies = function_bodies(load(default_directory()))
    assert len(bodies) >= 40
    assert wrong_rows(PAGE.read_text(), bodies) == []


def test_a_wrong_or_missing_row_of_the_sql_functions_is_found() -> None:
    made = [
        Migration("0001_a.sql", "CREATE FUNCTION f(p_a text, OUT o int) AS $$ x $$;"),
        Migration(
            "0002_b.sql",
            "-- CREATE FUNCTION g(\nCREATE OR REPLACE FUNCTION f(p_a text) AS $$ y $$;",
        ),
        Migration(
            "0003_c.sql", "CREATE FUNCTION f(p_a text, p_b numeric(10, 2) DEFAULT 0) AS $$ z $$;"
        ),
    ]
    bodies = function_bodies(made)
    assert bodies == {("f", 1): ["0001_a.sql", "0002_b.sql"], ("f", 2): ["0003_c.sql"]}
    right = (
        "| `f` | 1 | `migrations/core/0002_b.sql` | 0001 |\n"
        "| `f` | 2 | `migrations/core/0003_c.sql` | — |"
    )
    assert wrong_rows(right, bodies) == []
    old = right.replace("0002_b.sql` | 0001", "0001_a.sql` | —")
    assert [w.split(";")[0] for w in wrong_rows(old, bodies)] == ["('f', 1) is named wrongly"]
    assert [w.split(";")[0] for w in wrong_rows(right.split("\n")[0], bodies)] == [
        "('f', 2) is missing"
    ]
    extra = right + "\n| `g` | 0 | `migrations/core/0002_b.sql` | — |"
    assert wrong_rows(extra, bodies) == ["('g', 0) is named, but no migration makes it"]


def test_every_room_is_on_the_map() -> None:
    page = PAGE.read_text()
    rooms = [p for p in (ROOT / "workers" / "runtime").iterdir() if (p / "__init__.py").exists()]
    packages = [p for p in (ROOT / "workers").iterdir() if (p / "__init__.py").exists()]
    assert len(rooms) >= 5
    for room in rooms + packages:
        assert f"{room.relative_to(ROOT)}/" in page, f"{room.relative_to(ROOT)}/ is not on the map"


def test_every_room_says_what_it_is_for() -> None:
    for init in (ROOT / "workers" / "runtime").glob("*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and "use" in doc, f"{init.relative_to(ROOT)} says nothing of what it may use"


def test_every_floor_of_workers_says_what_it_may_use() -> None:
    """Each package of `workers/` but the five workers (whose bounds are one rule for
    all, on the map) says in its docstring what it may use."""
    from workers.registry import WORKERS

    floors = [p for p in (ROOT / "workers").iterdir() if (p / "__init__.py").exists()]
    floors = [p for p in floors if p.name not in WORKERS]
    assert {"cli", "tools", "demo", "embedded", "runtime"} <= {p.name for p in floors}
    for floor in floors:
        doc = ast.get_docstring(ast.parse((floor / "__init__.py").read_text())) or ""
        assert "may use" in doc.lower(), f"{floor.relative_to(ROOT)} says not what it may use"


def test_no_loose_module_at_the_root_but_the_registry_and_the_settings() -> None:
    """The root of `workers/` holds the map of worker kinds and the composed settings;
    every other module has a room of its own (docs/architecture.md)."""
    kept = {"__init__.py", "registry.py", "settings.py"}
    loose = sorted(p.name for p in (ROOT / "workers").glob("*.py") if p.name not in kept)
    assert not loose, f"loose modules at workers/: {loose}"


def test_no_import_cycle() -> None:
    """No module of `workers/` or `schemas/` imports itself back through others (lazy and
    type-checking imports included); `lint-imports` keeps the arrows between the floors
    and rooms pointing down."""
    import grimp

    graph = grimp.build_graph("workers", "schemas")
    imports = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            pytest.fail("an import cycle: " + " -> ".join([*path[path.index(module) :], module]))
        if module in done:
            return
        for imported in sorted(imports[module]):
            visit(imported, [*path, module])
        done.add(module)

    for module in sorted(imports):
        visit(module, [])


def test_every_test_docs_durability_names_exists() -> None:
    """docs/durability.md backs each repair it claims with a test, named there."""
    page = (ROOT / "docs" / "durability.md").read_text()
    named = set(re.findall(r"`(test_\w+)`", page))
    module = ROOT / "tests" / "integration" / "faults" / "test_lost_facts.py"
    assert len(named) >= 3
    assert named <= _defined(module), named - _defined(module)
    assert page.count("**Repaired") == len(named)  # one test for each repair claimed


#: The house's sizes (docs/architecture.md, "Sizes"), for the product and the tests alike.
SOFT_CAP, HARD_CAP, FOLDER_CAP = 400, 600, 12
#: the modules past SOFT_CAP, each with the one idea it holds (split one that holds two)
ONE_IDEA = {
    "workers/runtime/effects/outbox.py": "the relay: claim, publish in key order, bury",
    "workers/gateway/store.py": "the gateway's calls of its SQL functions, one wrapper each",
    "workers/runtime/effects/consumer.py": "a worker's facts: pulled, in lanes, applied, settled",
    "workers/runtime/base/runtime_settings.py": "the runtime's settings, a group a server",
    "tests/integration/sight/test_blindness.py": "a gateway's sight: blind, seen again, gone",
    "tests/integration/workers/test_replay.py": "the replay dispatcher, rule by rule",
    "tests/integration/model/test_seed_and_attacker.py": "one state machine and its steps",
    "tests/integration/security/attacks/test_found_58.py": "the attacks on one change, numbered",
    "tests/integration/security/test_db_roles.py": "every cell of the database roles' table",
    "tests/integration/security/test_bus_principals.py": "every cell of the principals' table",
}


def _modules() -> dict[str, list[str]]:
    """Every module of the product and the tests, by path, with its lines."""
    return {
        str(m.relative_to(ROOT)): m.read_text().splitlines()
        for top in ("workers", "schemas", "tests")
        for m in (ROOT / top).rglob("*.py")
    }


def test_a_module_past_400_lines_is_one_idea_named_here_and_none_passes_600() -> None:
    long = {path: len(lines) for path, lines in _modules().items() if len(lines) > SOFT_CAP}
    unnamed = sorted(f"{path} ({n})" for path, n in long.items() if path not in ONE_IDEA)
    assert not unnamed, f"split by meaning, or name the module's one idea in ONE_IDEA: {unnamed}"
    huge = sorted(f"{path} ({n})" for path, n in long.items() if n > HARD_CAP)
    assert not huge, f"one idea or not, split these: {huge}"
    stale = sorted(set(ONE_IDEA) - set(long))
    assert not stale, f"no longer past {SOFT_CAP} lines (or gone): drop from ONE_IDEA: {stale}"
    assert all(0 < len(idea) <= 60 for idea in ONE_IDEA.values())  # an idea, not an essay


def test_no_folder_over_12_modules() -> None:
    crowded = []
    for top in ("workers", "schemas", "tests"):
        for folder in [ROOT / top, *(p for p in (ROOT / top).rglob("*") if p.is_dir())]:
            if (n := len(list(folder.glob("*.py")))) > FOLDER_CAP:
                crowded.append(f"{folder.relative_to(ROOT)} ({n})")
    assert not crowded, crowded


def test_every_fmt_skip_says_why() -> None:
    """`# fmt: skip` only where the layout carries meaning (a table read down its columns),
    said in a comment above the statement that names the mark; lines merely packed are the
    formatter's to lay out."""
    unexplained = []
    for path, lines in _modules().items():
        for number, line in enumerate(lines):
            if not line.rstrip().endswith("# fmt: skip"):
                continue
            start = number  # the paragraph the mark ends: its statement and the comment on it
            while start > 0 and lines[start - 1].strip():
                start -= 1
            said = [x for x in lines[start:number] if x.lstrip().startswith("#")]
            if not any("fmt: skip" in x for x in said):
                unexplained.append(f"{path}:{number + 1}")
    assert not unexplained, unexplained


def test_every_test_the_contract_names_exists() -> None:
    """docs/contract.md states its rules with the names of the tests that prove them."""
    page = (ROOT / "docs" / "contract.md").read_text()
    named = set(re.findall(r"`(test_\w+)`", page))
    defined: set[str] = set()
    for module in (ROOT / "tests").rglob("test_*.py"):
        defined |= _defined(module)
    assert len(named) >= 6
    assert named <= defined, named - defined


def test_the_readme_diagram_names_the_real_processes_and_streams() -> None:
    readme = (ROOT / "README.md").read_text()
    diagram = re.search(r"```mermaid\n(.*?)```", readme, re.S)
    assert diagram is not None
    from schemas.subjects import Subjects
    from workers.registry import WORKERS

    names = Subjects()
    for name in (
        *WORKERS,
        names.facts_stream,
        names.events_stream,
        names.gateway_stream,
        names.dead_stream,
        "PostgreSQL",
        "gateways",
    ):
        assert name in diagram.group(1), name
