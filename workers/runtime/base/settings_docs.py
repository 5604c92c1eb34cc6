"""The settings tables of the docs, generated from the settings themselves (their
variables, defaults and descriptions), so that the docs cannot drift from them.

A doc holds a table between `<!-- settings: Group Group … -->` and `<!-- /settings -->`;
`make docs` rewrites every such block (`python -m workers.settings`, which knows every
group), and a unit test fails while one differs.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping
from datetime import timedelta
from pathlib import Path

from pydantic import SecretStr
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from workers.runtime.base.setting_types import IN_SECONDS, format_duration
from workers.runtime.base.settings import group_variables, is_secret

BLOCK = re.compile(r"(<!-- settings: ([A-Za-z ]+) -->\n)(.*?)(<!-- /settings -->)", re.DOTALL)
HEADER = "| variable | default | meaning |\n|---|---|---|\n"


def table(groups: Iterable[type[BaseSettings]]) -> str:
    """The markdown table of these groups' settings, in their order of declaration."""
    rows = [HEADER]
    for group in groups:
        for variable, field in group_variables(group).items():
            info = group.model_fields[field]
            meaning = (info.description or "").replace("|", "\\|").replace("\n", " ")
            if is_secret(group, field):
                meaning += f"; a secret (or the file `{variable}_FILE` names)"
            rows.append(f"| `{variable}` | {_default(info)} | {meaning} |\n")
    return "".join(rows)


def render(text: str, groups: Mapping[str, type[BaseSettings]]) -> str:
    """`text` with every settings block's table as the settings say it is (`groups`: each
    group by its class name). Raises KeyError naming a group that does not exist."""

    def one(match: re.Match[str]) -> str:
        named = [groups[name] for name in match.group(2).split()]
        return match.group(1) + table(named) + match.group(4)

    return BLOCK.sub(one, text)


def documented(texts: Iterable[str]) -> list[str]:
    """The groups named by the settings blocks of these texts, in order (with repeats)."""
    return [name for text in texts for m in BLOCK.finditer(text) for name in m.group(2).split()]


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        return "—"
    value = info.default
    if value is None or value == "":
        return "—"
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, timedelta):
        return f"`{format_duration(value)}`"
    if isinstance(value, float) and IN_SECONDS in info.metadata:
        return f"`{format_duration(timedelta(seconds=value))}`"
    return f"`{value}`"


def rewrite_block(path: Path, name: str, body: str) -> bool:
    """Put `body` between a doc's `<!-- name:begin -->` and `<!-- name:end -->` (the other
    generated tables: the bus principals, the database roles); whether it changed."""
    text = path.read_text(encoding="utf-8")
    pattern = re.compile(rf"(<!-- {name}:begin -->\n)(.*?)(<!-- {name}:end -->)", re.S)
    wanted = pattern.sub(lambda m: m.group(1) + body + m.group(3), text)
    if wanted != text:
        path.write_text(wanted, encoding="utf-8")
    return wanted != text


def block(text: str, name: str) -> str | None:
    """What a doc holds between its `name` markers (None: it has none)."""
    found = re.search(rf"<!-- {name}:begin -->\n(.*?)<!-- {name}:end -->", text, re.S)
    return found.group(1) if found else None


def main(argv: list[str], groups: Mapping[str, type[BaseSettings]]) -> int:
    """`[--check] FILE…`: rewrite (or, with `--check`, compare) the settings blocks of these
    files, from `groups` (`python -m workers.settings`)."""
    check = "--check" in argv
    stale = []
    for name in (arg for arg in argv if arg != "--check"):
        path = Path(name)
        text = path.read_text(encoding="utf-8")
        wanted = render(text, groups)
        if wanted != text:
            stale.append(name)
            if not check:
                path.write_text(wanted, encoding="utf-8")
    if check and stale:
        print(f"settings tables out of date (make docs): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0
