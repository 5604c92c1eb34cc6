"""Database roles (DESIGN §9): one NOLOGIN group role per worker, one for gateways, one
for readers, each granted only what its rules read and write.

The mechanism and the runtime's own groups live here; a worker's group is declared in its
own folder (`workers/<worker>/grants.py`, a `WorkerRole`) and the registry composes them
all into the one table (`Roles.of`: `workers.registry.ROLES`), which is handed to what
applies it. `bcw migrate` creates the groups when it may (CREATEROLE) and (re)applies the
grants of every group that exists, after the migrations (`grants.apply`), so a new table
is never left open or closed by mistake; `bcw migrate --print-grants` prints the same SQL
for a DBA. Which rows of a table a group may touch is `policies`. An operator gives each
worker a login role `IN ROLE bcw_<worker>`.

Row locks (`FOR UPDATE`, `FOR SHARE`) need the UPDATE privilege on some column of the
table locked. Where a role locks rows it never writes, it gets UPDATE on one column
that is useless to it: a primary key that every other table references (`node_id` of
`node_sessions`: changing it fails on those references) or a timestamp that only
retention reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from workers.runtime.store.limits import LIMITS, WORKER, LoginLimits


@dataclass(frozen=True)
class Grant:
    privileges: str
    table: str


#: a row policy's (USING, WITH CHECK) expressions (`policies`)
Rule = tuple[str | None, str | None]


#: every table of the schema but those a worker's role names its own (`WorkerRole.tables`):
#: `Roles.TABLES` holds them all (a test keeps it equal to the migrated database's tables)
TABLES = (
    "clock_offset",
    "commands",
    "consumer_watermarks",
    "controller_leases",
    "fleet_policy",
    "gateway_logins",
    "gateways",
    "hello_challenge_key",
    "hello_marks",
    "hello_nonces",
    "hello_seen",
    "node_alternations",
    "node_certs",
    "node_conditions",
    "node_events",
    "node_hello_keys",
    "node_inventory",
    "node_labels",
    "node_sessions",
    "nodes",
    "session_history",
    "session_history_packs",
    "outbox",
    "outbox_dead",
    "outbox_packs",
    "outbox_senders",
    "processed_facts",
    "schema_lock",
    "schema_migrations",
    "session_epochs",
    "wake_channels",
)

#: every view of the schema (a test keeps this equal to the migrated database's views):
#: each runs as its caller (migration 0050), so a group granted one needs the grants of
#: the tables it reads too (a test checks every group's): `Roles.of` grants SELECT on
#: those a worker's role says the view reads (`WorkerRole.behind_views`)
VIEWS = ("node_last_seen",)

#: what readers and operators may read: not the Hello keys (nor their proofs' one-time ids,
#: nor the key the database MACs its challenges with, nor the newest proofs taken), nor the
#: names of the workers' wake-up channels (a login that knows one may NOTIFY it: migration 0057)
SECRET_TABLES = (
    "node_hello_keys",
    "hello_nonces",
    "hello_challenge_key",
    "hello_marks",
    "wake_channels",
)

#: what reading a session's last sight takes, for a group that reads sessions: the view
#: (docs/contract.md's entry point) and, as it runs as its caller, the rows it reads
#: (`Roles.of` grants them after it: `WorkerRole.behind_views`)
LAST_SEEN = (Grant("SELECT", "node_last_seen"),)

#: what a relay may change of a pack it claimed: lock it, and keep only what is left to publish
PACK_UPDATE = "UPDATE (size, msg_ids, subjects, headers, bodies, order_keys, created_at)"

#: what every worker process does besides its rules: the inbox (and its pruning), the
#: outbox and its relay, leases, the gateway binding of facts
RUNTIME = (
    Grant("SELECT, INSERT, DELETE", "processed_facts"),
    Grant("UPDATE (processed_at)", "processed_facts"),  # pruning locks the rows it deletes
    Grant("SELECT, INSERT, DELETE", "outbox"),
    Grant("UPDATE (created_at)", "outbox"),  # the relay's claims lock rows
    Grant("SELECT, INSERT, DELETE", "outbox_packs"),
    Grant(PACK_UPDATE, "outbox_packs"),  # claims lock packs; a partly published one shrinks
    Grant("INSERT", "outbox_dead"),
    Grant("SELECT, INSERT, UPDATE", "controller_leases"),
    Grant("SELECT", "session_epochs"),
    Grant("SELECT", "clock_offset"),
    Grant("SELECT, INSERT, DELETE", "session_history"),  # written with the outbox; pruned
    Grant("UPDATE (at)", "session_history"),  # pruning locks the rows it deletes
    Grant("SELECT, INSERT, DELETE", "session_history_packs"),  # as session_history
    Grant("UPDATE (at)", "session_history_packs"),
    Grant("SELECT", "schema_migrations"),  # `bcw migrate --wait` before a worker starts
    Grant("SELECT", "outbox_senders"),  # an ownerless row's owner (an older release's)
    Grant("SELECT", "wake_channels"),  # the names its listeners LISTEN on
)


def _other_groups(readable: tuple[str, ...]) -> dict[str, tuple[Grant, ...]]:
    """The runtime's own groups (a worker's is its `grants.py`'s `WorkerRole`), given what
    readers may read; besides what the workers' roles lend them (`WorkerRole.lends`)."""
    return {
        "bcw_gateway": (
            Grant("SELECT", "clock_offset"),
            Grant("SELECT, INSERT", "gateways"),
            Grant("UPDATE (lease_epoch, lease_expires_at, draining)", "gateways"),
            Grant("SELECT", "nodes"),
            Grant("SELECT", "node_certs"),
            Grant("SELECT", "node_sessions"),
            Grant(
                "UPDATE (session_epoch, gateway_id, session_id, boot_id, journal_id, role, "
                "daemon_version, proto_max, transport, upgrade_required, trust_version, "
                "approver_set_epoch, approver_set_sha256, acked_event_seq, connected_at, last_seen, "
                "disconnected_at, disconnect_reason, cert_serial, lane_credits, load, node_load, held_epoch, "
                "trace_context)",
                "node_sessions",
            ),
            *LAST_SEEN,
            Grant("SELECT, INSERT", "node_inventory"),
            Grant("UPDATE (hash, body, session_epoch, reported_at)", "node_inventory"),
        ),
        # a gateway's login, bound to its gateway id (`gateway_logins`): no table; it reads and
        # writes through the gateway functions (`EXECUTES`) only, as itself
        "bcw_gateway_bound": (),
        "bcw_reader": tuple(Grant("SELECT", table) for table in readable),
        # a dedicated outbox relay (`bcw run relay`): every worker's outbox rows, nothing else
        "bcw_relay": (
            Grant("SELECT, DELETE", "outbox"),
            Grant("UPDATE (created_at)", "outbox"),  # its claims lock rows
            Grant("SELECT, DELETE", "outbox_packs"),
            Grant(PACK_UPDATE, "outbox_packs"),
            Grant("INSERT", "outbox_dead"),
            Grant("SELECT", "clock_offset"),
            Grant("SELECT", "schema_migrations"),  # `bcw migrate --wait` before it starts
            Grant("SELECT", "wake_channels"),  # the outbox's wake-up channel
        ),
        # a person operating the fleet: reads everything (bcw explain, bcw commands),
        # enqueues commands; writes only what the workers' roles lend it (a breaker's
        # release, a quarantine's)
        "bcw_operator": tuple(
            Grant("SELECT", table) for table in readable if table != "schema_migrations"
        ),
    }


#: The functions that run with their owner's rights and write for a gateway
#: (migrations/core/0026_gateway_functions.sql): each checks the login may act as the
#: gateway it names, its lease epoch and the node's session.
GATEWAY_FUNCTIONS = (
    "gateway_acquire(text,interval)",
    "gateway_renew(text,bigint,interval)",
    "gateway_drain(text,bigint,boolean)",
    "gateway_release(text,bigint)",
    "gateway_hello(text,bigint,text,text,text,text,text,text,integer,text,boolean,bigint,bigint,"
    "text,interval,text,uuid,bigint,text,text,text[])",
    "gateway_hello_desired(text,bigint,text,text,text,text,text,text,integer,text,boolean,"
    "bigint,bigint,text,interval,text,uuid,bigint,text,text,text[])",
    "gateway_admission(text,text,text)",
    "gateway_desired_state(text,text,bigint)",
    "gateway_close(text,bigint,text,bigint,text)",
    "gateway_close_many(text,bigint,text[],bigint[],text)",
    "gateway_write_section(text,bigint,text,bigint,text,text,jsonb)",
    "gateway_hello_verdict(text,text,bigint)",
    "gateway_hello_challenge(text,text)",
)

#: the dispatch loop's wake-up (a secret channel's NOTIFY, with its owner's rights)
WAKE_DISPATCH = "wake_dispatch()"

#: the runtime's groups → the functions only they (and the owner, and the workers' groups
#: whose roles say so) may execute; every other function of the schema runs with its
#: caller's rights, and any group may call it
OTHER_EXECUTES: dict[str, tuple[str, ...]] = {
    "bcw_gateway_bound": GATEWAY_FUNCTIONS,
    # the dispatch loop's wake-up (migration 0057): from the roles whose writes free what
    # it waits for — an operator's (a quarantine lifted), and the workers' that say so
    "bcw_operator": (WAKE_DISPATCH,),
}

#: what each of the runtime's groups is for, in one line (the docs' table)
OTHER_PURPOSES = {
    "bcw_gateway": "deprecated: gateways of 0.3 (direct writes), until they are upgraded",
    "bcw_gateway_bound": "a gateway's login, bound to its gateway id (`bcw auth db`)",
    "bcw_reader": "dashboards, `bcw commands`",
    "bcw_relay": "a dedicated outbox relay (`bcw run relay`)",
    # and the commands the workers' roles lend it grants for (`Lent.commands`)
    "bcw_operator": "a person: `bcw explain`, `bcw commands`",
}

#: the group of gateways older than 0.4 (direct writes: it may rebind sessions and move
#: leases): created and granted only when asked (`bcw migrate --legacy-gateway-role`)
LEGACY_GATEWAY = "bcw_gateway"


#: the owner's alone: the clock's test hook, the gateway functions' binding and proof
#: checks, the Hello proof's challenges, a node's Hello key, the Hello transaction of 0.4's
#: development builds
OWNER_ONLY_FUNCTIONS = (
    "set_compute_now_offset(interval)",
    "gateway_as(text)",
    "hello_proof_holds(text,text,text,text,bigint,text,text)",
    "hello_proof_fresh(text,bigint,text)",
    "hellos_per_node_minute()",
    "hello_challenge(text,text,bigint,text)",
    "enroll_hello_key(text,bytea)",
    "gateway_hello(text,bigint,text,text,text,text,text,text,integer,text,boolean,bigint,bigint,"
    "text,interval,text,uuid)",
)


@dataclass(frozen=True)
class Lent:
    """What a worker's tables give one of the runtime's groups (an operator's release of
    what the worker holds): grants, and the commands they serve (the group's purpose
    names them)."""

    grants: tuple[Grant, ...]
    commands: tuple[str, ...] = ()


@dataclass(frozen=True)
class WorkerRole:
    """What a worker's group role, `bcw_<worker>`, holds of the database: the runtime's
    grants (`RUNTIME`) and its own (its `grants.py`; the registry composes them)."""

    purpose: str  # what the group is for, in one line (the docs' table)
    grants: tuple[Grant, ...]  # besides `RUNTIME`
    #: the functions only it (and the groups whose roles say so) may execute
    executes: tuple[str, ...] = ()
    #: table → command → rule: which rows of a table another principal trusts its rules
    #: may write (`policies`; its own name written out)
    rules: Mapping[str, Mapping[str, Rule]] = field(default_factory=dict)
    limits: LoginLimits = WORKER  # its logins' (`limits`)
    #: the schema's tables it names its own (`TABLES` holds the others)
    tables: tuple[str, ...] = ()
    #: a view → the tables of its own it reads: a group granted SELECT on the view is
    #: granted SELECT on them too, right after it (the view runs as its caller)
    behind_views: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: a runtime group → what its tables give it (grants after the group's own)
    lends: Mapping[str, Lent] = field(default_factory=dict)


@dataclass(frozen=True)
class Roles:
    """The database's permission table, one for a reader: every group's grants, the
    functions only it may execute, the row rules of the tables others trust, its logins'
    limits and what it is for — the workers' groups (`of`) and the runtime's own: what
    `bcw migrate` applies and prints, the docs show and the matrix tests try cell by
    cell."""

    GROUPS: Mapping[str, tuple[Grant, ...]]
    EXECUTES: Mapping[str, tuple[str, ...]]
    #: group → table → command → rule, of the workers' groups (`policies.group_rules`)
    RULES: Mapping[str, Mapping[str, Mapping[str, Rule]]]
    LIMITS: Mapping[str, LoginLimits]
    PURPOSES: Mapping[str, str]
    #: every function PUBLIC may not execute: the owner's alone, or some group's only
    RESTRICTED_FUNCTIONS: tuple[str, ...]
    #: every table of the schema: the runtime's (`TABLES`) and those the workers' roles
    #: name their own (a test keeps it equal to the migrated database's tables)
    TABLES: tuple[str, ...]
    #: what readers and operators may read: every table but `SECRET_TABLES`, every view
    READABLE: tuple[str, ...]

    @classmethod
    def of(cls, workers: Mapping[str, WorkerRole]) -> Roles:
        """The table of `workers` (worker → its role, in the order `bcw migrate` grants
        them) and of the runtime's own groups. Pure."""
        mine = {f"bcw_{worker}": role for worker, role in workers.items()}
        executes = {group: r.executes for group, r in mine.items() if r.executes}
        executes |= OTHER_EXECUTES
        restricted = (*OWNER_ONLY_FUNCTIONS, *GATEWAY_FUNCTIONS)
        tables = (*TABLES, *(table for role in workers.values() for table in role.tables))
        readable = (*(table for table in tables if table not in SECRET_TABLES), *VIEWS)
        groups = {g: (*RUNTIME, *r.grants) for g, r in mine.items()} | _other_groups(readable)
        purposes = {g: r.purpose for g, r in mine.items()} | OTHER_PURPOSES
        behind: dict[str, tuple[str, ...]] = {}
        for role in workers.values():
            for group, lent in role.lends.items():
                groups[group] = (*groups[group], *lent.grants)
                purposes[group] += "".join(f", `{command}`" for command in lent.commands)
            for view, read in role.behind_views.items():
                behind[view] = (*behind.get(view, ()), *read)
        return cls(
            GROUPS={group: _with_views(grants, behind) for group, grants in groups.items()},
            EXECUTES=executes,
            RULES={group: role.rules for group, role in mine.items() if role.rules},
            LIMITS={**{g: r.limits for g, r in mine.items()}, **LIMITS},
            PURPOSES=purposes,
            RESTRICTED_FUNCTIONS=tuple(
                dict.fromkeys((*restricted, *(f for fs in executes.values() for f in fs)))
            ),
            TABLES=tables,
            READABLE=readable,
        )

    def worker_of(self, group: str) -> str | None:
        """The worker a group role is the role of (it has the runtime's grants), if any."""
        return group.removeprefix("bcw_") if set(RUNTIME) <= set(self.GROUPS[group]) else None

    def groups_for(self, legacy_gateway: bool) -> tuple[str, ...]:
        """The groups `bcw migrate` creates and grants: every one but the legacy gateway
        group, unless asked for."""
        return tuple(g for g in self.GROUPS if legacy_gateway or g != LEGACY_GATEWAY)

    def may_execute(self, group: str, function: str) -> bool:
        """Whether `group` may execute `function` (a signature, `name(type,…)`). Pure."""
        if function in OWNER_ONLY_FUNCTIONS:
            return False
        return function not in self.RESTRICTED_FUNCTIONS or function in self.EXECUTES.get(group, ())

    def grants_sql(self, groups: tuple[str, ...] | None = None) -> str:
        """The SQL that (re)applies the grants of `groups` (all by default): everything on
        the schema's tables revoked first, then granted as `GROUPS` says."""
        names = groups if groups is not None else tuple(self.GROUPS)
        lines = [
            "-- bc-workers: least-privilege grants of its group roles (bcw migrate --print-grants)",
            "-- Run as the owner of the schema's tables, in the database, after `bcw migrate`.",
        ]
        lines += [f"REVOKE EXECUTE ON FUNCTION {f} FROM PUBLIC;" for f in self.RESTRICTED_FUNCTIONS]
        lines.append(
            "DO $$ BEGIN EXECUTE format('REVOKE CREATE ON SCHEMA %I FROM PUBLIC', "
            "current_schema()); END $$;"
        )
        for group in names:
            lines.append(f"-- {group}")
            lines.append(self.strip_sql(group))
            lines.append(
                f"DO $$ BEGIN EXECUTE format('GRANT USAGE ON SCHEMA %I TO {group}', "
                "current_schema()); END $$;"
            )
            lines += [f"GRANT {g.privileges} ON {g.table} TO {group};" for g in self.GROUPS[group]]
            lines += [
                f"GRANT EXECUTE ON FUNCTION {f} TO {group};" for f in self.EXECUTES.get(group, ())
            ]
        return "\n".join(lines) + "\n"

    def create_roles_sql(self, groups: tuple[str, ...] | None = None) -> str:
        """The SQL that creates the missing group roles (NOLOGIN) of `groups` (all by default)."""
        lines = []
        for group in groups if groups is not None else tuple(self.GROUPS):
            lines.append(
                "DO $$ BEGIN "
                f"IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{group}') THEN "
                f"CREATE ROLE {group} NOLOGIN; END IF; "
                "EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$;"
            )
        return "\n".join(lines) + "\n"

    def strip_sql(self, group: str) -> str:
        """The SQL that takes every grant of `group` on the schema's tables away (the first
        step of `grants_sql`; alone, for a group no longer granted)."""
        return f"REVOKE ALL ON {', '.join((*self.TABLES, *VIEWS))} FROM {group};"


def _with_views(
    grants: tuple[Grant, ...], behind: Mapping[str, tuple[str, ...]]
) -> tuple[Grant, ...]:
    """`grants`, each SELECT on a view followed by SELECT on the tables `behind` says it
    reads that `grants` do not let it read already. Pure."""
    reads = {grant.table for grant in grants if "SELECT" in grant.privileges}
    out: list[Grant] = []
    for grant in grants:
        out.append(grant)
        if "SELECT" in grant.privileges:
            out += [Grant("SELECT", t) for t in behind.get(grant.table, ()) if t not in reads]
    return tuple(out)
