"""Row-level security (DESIGN §9): which rows of a table a group's login may see and
write, where its grants (`Roles.GROUPS`) say only which tables and columns. Applied by
`bcw migrate` after the grants (`grants.apply`), printed by `bcw migrate --print-grants`.

Three kinds of rule, each tried by a test as its login:
- a worker's own rows (`OWNED_ROWS`): its inbox, its outbox, its leases;
- per command for every worker (`BY_COMMAND`): the session history, written once and
  deleted only when old; the buried outbox rows, each its own;
- per command for one group (`group_rules`): what a worker's rules write of a table
  another principal trusts, as its `grants.py` says (`WorkerRole.rules`) — e.g.
  certificates only revoked, alternations pruned only when old, events deleted only past
  the retention floor — and the migrations' ledger as the
  workers' and the relay's logins read it (`LEDGER_BEFORE_0_4`).

Any other group granted such a table sees and writes every row. Owners and superusers
are not bound (the gateway functions run as the owner).
"""

from __future__ import annotations

from workers.runtime.base.runtime_settings import HISTORY_FLOOR
from workers.runtime.store.leases import inbox_pruning
from workers.runtime.store.roles import Roles, Rule

#: table → which rows are worker `{w}`'s: a worker's login sees, writes and deletes only
#: its own rows — its inbox, its outbox rows, the session history it wrote, its leases
#: (its loops' and its inbox pruning's). Applied one table per transaction
#: (`grants.apply`): a policy takes its table's strongest lock, and two tables in one
#: transaction could deadlock with the workers running beside it.
OWNED_ROWS = {
    "outbox": "worker = '{w}'",
    "outbox_packs": "worker = '{w}'",
    "processed_facts": "consumer = '{w}'",
    "session_history": "worker = '{w}'",
    "session_history_packs": "worker = '{w}'",
    "controller_leases": "(name = '{w}' OR name LIKE '{w}-%' OR name = '{inbox_pruning}')",
}

#: The session history is written once: a worker inserts and reads its own rows, and may
#: delete (or lock, to delete) only those older than `HISTORY_FLOOR` — its retention's
#: pruning — so no login of a worker can change or erase what `bcw explain` shows of the
#: last day. (Policies per command, `{group}_history_<command>`.)
OLDER_THAN_THE_FLOOR = f"compute_now() - interval '{HISTORY_FLOOR.total_seconds():g} seconds'"
HISTORY_OLD = f"at < {OLDER_THAN_THE_FLOOR}"
_HISTORY_POLICIES: dict[str, Rule] = {
    "SELECT": ("worker = '{w}'", None),
    "INSERT": (None, "worker = '{w}'"),
    "DELETE": (f"worker = '{{w}}' AND {HISTORY_OLD}", None),
    "UPDATE": (f"worker = '{{w}}' AND {HISTORY_OLD}", "false"),  # a lock, never a change
}
#: table → command → rule, for every worker group (`{w}` its worker)
BY_COMMAND: dict[str, dict[str, Rule]] = {
    "session_history": _HISTORY_POLICIES,
    "session_history_packs": _HISTORY_POLICIES,
    # a worker's relay buries its own rows only: none an operator takes for another's
    "outbox_dead": {"INSERT": (None, "worker = '{w}'")},
}

#: The migrations' ledger as a release before 0.4 reads it: its `bcw migrate --wait` (a
#: worker's or the relay's init container, as its login) reads every row and calls a
#: migration it does not know `missing` (exit 2), so its pods would never start on this
#: release's schema after a `helm rollback`. Such a login sees the migrations of those
#: releases only (to 0.3.0's last, 0024), unless it reads the ledger as releases since
#: 0.4 do (`migrate.LEDGER_READ`: `SET LOCAL bcw.ledger = 'releases'`); owners see it all.
#: A view for compatibility, not a secret: any login of these groups may say so too.
LEDGER_BEFORE_0_4 = "current_setting('bcw.ledger', true) = 'releases' OR left(name, 4) <= '0024'"


def ledger_readers(roles: Roles) -> tuple[str, ...]:
    """The groups whose logins run `bcw migrate --wait` before they start."""
    return (*(group for group in roles.GROUPS if roles.worker_of(group)), "bcw_relay")


def rules_for(roles: Roles, group: str) -> dict[str, dict[str, Rule]]:
    """table → command → rule of `group`'s own: the migrations' ledger as a worker's or the
    relay's login reads it, then what a worker's rules write of a table others trust, as
    its `grants.py` says (`WorkerRole.rules`). Pure."""
    out: dict[str, dict[str, Rule]] = {}
    if group in ledger_readers(roles):
        out["schema_migrations"] = {"SELECT": (LEDGER_BEFORE_0_4, None)}
    return out | {table: dict(rules) for table, rules in roles.RULES.get(group, {}).items()}


def group_rules(roles: Roles) -> dict[str, dict[str, dict[str, Rule]]]:
    """table → group → command → rule: every group's own (`rules_for`). Pure."""
    out: dict[str, dict[str, dict[str, Rule]]] = {}
    for group in roles.GROUPS:
        for table, rules in rules_for(roles, group).items():
            out.setdefault(table, {})[group] = rules
    return out


def guarded(roles: Roles) -> tuple[str, ...]:
    """Every table with row-level security."""
    return tuple(dict.fromkeys([*OWNED_ROWS, *BY_COMMAND, *group_rules(roles)]))


def rules_of(roles: Roles, group: str, table: str) -> dict[str, Rule]:
    """command → (USING, WITH CHECK) of `group` on `table` (`ALL` for one rule of every
    command), with its worker's name filled in. Pure."""
    worker = roles.worker_of(group)
    rules = group_rules(roles)
    if table in rules and group in rules[table]:
        return rules[table][group]
    if worker and table in BY_COMMAND:
        return {
            command: (
                None if using is None else using.format(w=worker),
                None if check is None else check.format(w=worker),
            )
            for command, (using, check) in BY_COMMAND[table].items()
        }
    if worker and table in OWNED_ROWS:
        rows = OWNED_ROWS[table].format(w=worker, inbox_pruning=inbox_pruning([worker]))
        return {"ALL": (rows, rows)}
    return {"ALL": ("true", "true")}


def _name(roles: Roles, group: str, table: str, command: str) -> str:
    """A policy's name: `{group}_rows` for one of all commands; the session history's
    per-command ones keep the names they had since 0.3."""
    if command == "ALL":
        return f"{group}_rows"
    if table in ("session_history", "session_history_packs") and roles.worker_of(group):
        return f"{group}_history_{command.lower()}"
    return f"{group}_{command.lower()}"


def policies_sql(roles: Roles, groups: tuple[str, ...] | None = None) -> dict[str, str]:
    """Per table: the SQL that enables its row-level security and creates each group's
    policies on it (`roles`' of `groups`, all by default) — only what is missing, so that
    a database that has them is not locked. A group whose rules went per command loses its
    one policy of all."""
    names = groups if groups is not None else tuple(roles.GROUPS)
    out = {}
    for table in guarded(roles):
        lines = [
            "DO $$ BEGIN",
            f"IF NOT (SELECT relrowsecurity FROM pg_class WHERE oid = '{table}'::regclass) THEN",
            f"    ALTER TABLE {table} ENABLE ROW LEVEL SECURITY; END IF;",
        ]
        for group in names:
            if not any(grant.table == table for grant in roles.GROUPS[group]):
                continue
            rules = rules_of(roles, group, table)
            if "ALL" not in rules:
                lines += [  # one for all commands (before) would allow them all
                    "IF EXISTS (SELECT 1 FROM pg_policies WHERE schemaname = current_schema()"
                    f" AND tablename = '{table}' AND policyname = '{group}_rows') THEN",
                    f"    DROP POLICY {group}_rows ON {table}; END IF;",
                ]
            for command, (using, check) in rules.items():
                clauses = "".join(
                    f" {word} ({expression})"
                    for word, expression in (("USING", using), ("WITH CHECK", check))
                    if expression is not None
                )
                name = _name(roles, group, table, command)
                lines += _policy(table, name, group, command, clauses)
        lines.append("END $$;")
        out[table] = "\n".join(lines) + "\n"
    return out


def _policy(table: str, name: str, group: str, command: str, clauses: str) -> list[str]:
    return [
        "IF NOT EXISTS (SELECT 1 FROM pg_policies WHERE schemaname = current_schema()"
        f" AND tablename = '{table}' AND policyname = '{name}') THEN",
        f"    CREATE POLICY {name} ON {table} FOR {command} TO {group}{clauses}; END IF;",
    ]
