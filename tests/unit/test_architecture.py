"""docs/architecture.md against the tree: every file and folder it names exists, every
function or class it names is defined where it says, and every room of the runtime and
every package of `workers/` is on the map. Reads files only."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

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


def test_every_test_docs_durability_names_exists() -> None:
    """docs/durability.md backs each repair it claims with a test, named there."""
    page = (ROOT / "docs" / "durability.md").read_text()
    named = set(re.findall(r"`(test_\w+)`", page))
    module = ROOT / "tests" / "integration" / "faults" / "test_lost_facts.py"
    assert len(named) >= 3
    assert named <= _defined(module), named - _defined(module)
    assert page.count("**Repaired") == len(named)  # one test for each repair claimed


def test_no_module_over_400_lines_and_no_folder_over_12_modules() -> None:
    """The house's size limits, for the product and the tests alike."""
    long, crowded = [], []
    for top in ("workers", "schemas", "tests"):
        for folder in [ROOT / top, *(p for p in (ROOT / top).rglob("*") if p.is_dir())]:
            modules = list(folder.glob("*.py"))
            if len(modules) > 12:
                crowded.append(f"{folder.relative_to(ROOT)} ({len(modules)})")
            long += [
                f"{m.relative_to(ROOT)} ({n})"
                for m in modules
                if (n := len(m.read_text().splitlines())) > 400
            ]
    assert not long and not crowded, (long, crowded)


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
