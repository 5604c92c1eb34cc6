"""The database roles as `docs/kubernetes.md` shows them, generated from
`workers.runtime.store.roles` (`make docs`; a unit test keeps the doc equal to it)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from workers.runtime.base.settings_docs import rewrite_block
from workers.runtime.store.policies import BY_COMMAND, GROUP_RULES, OWNED_ROWS
from workers.runtime.store.roles import EXECUTES, GROUPS, READABLE, worker_of

#: what each group is for, in one line
PURPOSES = {
    "bcw_liveness": "the liveness worker",
    "bcw_labeler": "the capability labeler",
    "bcw_quarantine": "the quarantine enforcer",
    "bcw_replay": "the replay dispatcher",
    "bcw_recorder": "the fact recorder",
    "bcw_gateway": "deprecated: gateways of 0.3 (direct writes), until they are upgraded",
    "bcw_gateway_bound": "a gateway's login, bound to its gateway id (`bcw auth db`)",
    "bcw_reader": "dashboards, `bcw commands`",
    "bcw_relay": "a dedicated outbox relay (`bcw run relay`)",
    "bcw_operator": "a person: `bcw explain`, `bcw commands`, `bcw liveness release`",
}


def _writes(group: str) -> list[str]:
    """`table` or `table (columns)` for every write the group is granted, and how."""
    out: dict[str, list[str]] = {}
    for grant in GROUPS[group]:
        kinds = [k.strip() for k in re.sub(r"\([^)]*\)", "", grant.privileges).split(",")]
        columns = re.search(r"UPDATE \(([^)]*)\)", grant.privileges)
        words = out.setdefault(grant.table, [])
        words += [k.lower() for k in kinds if k and k not in ("SELECT", "UPDATE")]
        if "UPDATE" in kinds and not columns:
            words.append("update")
        if columns:
            words.append(f"update `{columns.group(1).replace(', ', '`, `')}`")
    return [f"`{table}`: {', '.join(words)}" for table, words in out.items() if words]


def _reads(group: str) -> str:
    read = [g.table for g in GROUPS[group] if "SELECT" in g.privileges]
    if set(read) == set(READABLE):
        return "every table but the Hello keys"
    if set(read) >= set(READABLE) - {"schema_migrations"}:
        return "every table but the Hello keys and the migrations' ledger"
    return ", ".join(f"`{t}`" for t in read) or "nothing"


def markdown() -> str:
    rows = ["| group | for | reads | writes | executes |", "|---|---|---|---|---|"]
    for group in GROUPS:
        writes = "; ".join(_writes(group)) or "nothing"
        if worker_of(group):
            owned = ", ".join(f"`{t}`" for t in dict.fromkeys([*OWNED_ROWS, *BY_COMMAND]))
            writes += f" (of {owned}: its own rows only; its session history once, deleted old)"
        for table, rules in GROUP_RULES.items():
            for command, (using, check) in rules.get(group, {}).items():
                if command == "INSERT" and check != "true":
                    writes += f"; `{table}`: inserts only rows where `{check}`"
                elif command in ("UPDATE", "DELETE") and using != "true":
                    writes += f"; `{table}`: {command.lower()}s only rows where `{using}`"
                elif command == "UPDATE" and check != "true":
                    writes += f"; `{table}`: updates only to rows where `{check}`"
        executes = ", ".join(f"`{f.split('(')[0]}`" for f in EXECUTES.get(group, ())) or "—"
        rows.append(f"| `{group}` | {PURPOSES[group]} | {_reads(group)} | {writes} | {executes} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":  # `make docs`
    for name in sys.argv[1:]:
        rewrite_block(Path(name), "roles", markdown())
