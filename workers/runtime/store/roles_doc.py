"""The database roles as `docs/kubernetes.md` shows them, generated from the table the
registry composes (`workers.registry.ROLES`; `make docs`; a unit test keeps the doc equal
to it)."""

from __future__ import annotations

import re
from pathlib import Path

from workers.runtime.base.settings_docs import rewrite_block
from workers.runtime.store.policies import BY_COMMAND, OWNED_ROWS, rules_for
from workers.runtime.store.roles import Roles


def _writes(roles: Roles, group: str) -> list[str]:
    """`table` or `table (columns)` for every write the group is granted, and how."""
    out: dict[str, list[str]] = {}
    for grant in roles.GROUPS[group]:
        kinds = [k.strip() for k in re.sub(r"\([^)]*\)", "", grant.privileges).split(",")]
        columns = re.search(r"UPDATE \(([^)]*)\)", grant.privileges)
        words = out.setdefault(grant.table, [])
        words += [k.lower() for k in kinds if k and k not in ("SELECT", "UPDATE")]
        if "UPDATE" in kinds and not columns:
            words.append("update")
        if columns:
            words.append(f"update `{columns.group(1).replace(', ', '`, `')}`")
    return [f"`{table}`: {', '.join(words)}" for table, words in out.items() if words]


def _reads(roles: Roles, group: str) -> str:
    read = [g.table for g in roles.GROUPS[group] if "SELECT" in g.privileges]
    if set(read) == set(roles.READABLE):
        return "every table but the Hello keys"
    if set(read) >= set(roles.READABLE) - {"schema_migrations"}:
        return "every table but the Hello keys and the migrations' ledger"
    return ", ".join(f"`{t}`" for t in read) or "nothing"


def markdown(roles: Roles) -> str:
    """The table of every group of `roles`, one row each."""
    rows = ["| group | for | reads | writes | executes |", "|---|---|---|---|---|"]
    for group in roles.GROUPS:
        writes = "; ".join(_writes(roles, group)) or "nothing"
        if roles.worker_of(group):
            owned = ", ".join(f"`{t}`" for t in dict.fromkeys([*OWNED_ROWS, *BY_COMMAND]))
            writes += f" (of {owned}: its own rows only; its session history once, deleted old)"
        for table, rules in rules_for(roles, group).items():
            for command, (using, check) in rules.items():
                if command == "INSERT" and check != "true":
                    writes += f"; `{table}`: inserts only rows where `{check}`"
                elif command in ("UPDATE", "DELETE") and using != "true":
                    writes += f"; `{table}`: {command.lower()}s only rows where `{using}`"
                elif command == "UPDATE" and check != "true":
                    writes += f"; `{table}`: updates only to rows where `{check}`"
        executes = ", ".join(f"`{f.split('(')[0]}`" for f in roles.EXECUTES.get(group, ())) or "—"
        purpose = roles.PURPOSES[group]
        rows.append(f"| `{group}` | {purpose} | {_reads(roles, group)} | {writes} | {executes} |")
    return "\n".join(rows) + "\n"


def rewrite_doc(path: Path, roles: Roles) -> bool:
    """Put the generated table between a doc's roles markers; whether it changed."""
    return rewrite_block(path, "roles", markdown(roles))
