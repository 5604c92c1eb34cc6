"""Row-level security (DESIGN §9): which rows of a table a group's login may see and
write, where its grants (`roles.GROUPS`) say only which tables and columns. Applied by
`bcw migrate` after the grants (`grants.apply`), printed by `bcw migrate --print-grants`.

Three kinds of rule, all in this module's tables, each tried by a test as its login:
- a worker's own rows (`OWNED_ROWS`): its inbox, its outbox, its leases;
- per command for every worker (`BY_COMMAND`): the session history, written once and
  deleted only when old; the buried outbox rows, each its own;
- per command for one group (`GROUP_RULES`): what a worker's rules write of a table
  another principal trusts — the quarantine only revokes certificates and prunes only
  old alternations, the recorder deletes only events past the retention floor.

Any other group granted such a table sees and writes every row. Owners and superusers
are not bound (the gateway functions run as the owner).
"""

from __future__ import annotations

from workers.runtime.base.runtime_settings import HISTORY_FLOOR
from workers.runtime.store.leases import inbox_pruning
from workers.runtime.store.roles import GROUPS, worker_of

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

Rule = tuple[str | None, str | None]  # (USING, WITH CHECK)

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
#: the groups whose logins run `bcw migrate --wait` before they start
LEDGER_READERS = (*(group for group in GROUPS if worker_of(group)), "bcw_relay")

#: table → group → command → rule: what one worker's rules write of a table others trust
GROUP_RULES: dict[str, dict[str, dict[str, Rule]]] = {
    "schema_migrations": {group: {"SELECT": (LEDGER_BEFORE_0_4, None)} for group in LEDGER_READERS},
    # a certificate is recorded or marked revoked, never recorded live nor un-revoked
    "node_certs": {
        "bcw_quarantine": {
            "SELECT": ("true", None),
            "INSERT": (None, "revoked_at IS NOT NULL"),
            "UPDATE": ("true", "revoked_at IS NOT NULL"),
        },
    },
    # alternations are pruned after a day (none older can still arrive), never before
    "node_alternations": {
        "bcw_quarantine": {
            "SELECT": ("true", None),
            "INSERT": (None, "true"),
            "DELETE": ("issued_at < compute_now() - interval '1 day'", None),
        },
    },
    # a worker says as of when it applied its facts, and never for another (the replay
    # worker's hold bound trusts the quarantine's row; the Hello transaction, the
    # liveness controller's)
    "consumer_watermarks": {
        group: {
            "SELECT": ("true", None),
            "INSERT": (None, f"consumer = '{worker}'"),
            "UPDATE": (f"consumer = '{worker}'", f"consumer = '{worker}'"),
        }
        for group, worker in (("bcw_liveness", "liveness"), ("bcw_quarantine", "quarantine"))
    },
    # node events are deleted by retention only (at least `HISTORY_FLOOR` old)
    "node_events": {
        "bcw_recorder": {
            "SELECT": ("true", None),
            "INSERT": (None, "true"),
            "DELETE": (f"recorded_at < {OLDER_THAN_THE_FLOOR}", None),
            "UPDATE": (f"recorded_at < {OLDER_THAN_THE_FLOOR}", "false"),  # a lock only
        },
    },
}

#: every table with row-level security
GUARDED = tuple(dict.fromkeys([*OWNED_ROWS, *BY_COMMAND, *GROUP_RULES]))


def rules_of(group: str, table: str) -> dict[str, Rule]:
    """command → (USING, WITH CHECK) of `group` on `table` (`ALL` for one rule of every
    command), with its worker's name filled in. Pure."""
    worker = worker_of(group)
    if table in GROUP_RULES and group in GROUP_RULES[table]:
        return GROUP_RULES[table][group]
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


def _name(group: str, table: str, command: str) -> str:
    """A policy's name: `{group}_rows` for one of all commands; the session history's
    per-command ones keep the names they had since 0.3."""
    if command == "ALL":
        return f"{group}_rows"
    if table in ("session_history", "session_history_packs") and worker_of(group):
        return f"{group}_history_{command.lower()}"
    return f"{group}_{command.lower()}"


def policies_sql(groups: tuple[str, ...] | None = None) -> dict[str, str]:
    """Per table: the SQL that enables its row-level security and creates each group's
    policies on it — only what is missing, so that a database that has them is not
    locked. A group whose rules went per command loses its one policy of all."""
    names = groups if groups is not None else tuple(GROUPS)
    out = {}
    for table in GUARDED:
        lines = [
            "DO $$ BEGIN",
            f"IF NOT (SELECT relrowsecurity FROM pg_class WHERE oid = '{table}'::regclass) THEN",
            f"    ALTER TABLE {table} ENABLE ROW LEVEL SECURITY; END IF;",
        ]
        for group in names:
            if not any(grant.table == table for grant in GROUPS[group]):
                continue
            rules = rules_of(group, table)
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
                lines += _policy(table, _name(group, table, command), group, command, clauses)
        lines.append("END $$;")
        out[table] = "\n".join(lines) + "\n"
    return out


def _policy(table: str, name: str, group: str, command: str, clauses: str) -> list[str]:
    return [
        "IF NOT EXISTS (SELECT 1 FROM pg_policies WHERE schemaname = current_schema()"
        f" AND tablename = '{table}' AND policyname = '{name}') THEN",
        f"    CREATE POLICY {name} ON {table} FOR {command} TO {group}{clauses}; END IF;",
    ]
