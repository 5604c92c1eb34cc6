"""What each group's logins may hold of the database: connections, how long one statement
may run, one transaction sit idle, and one session sit idle (docs/kubernetes.md,
"Login limits").

PostgreSQL applies a role's CONNECTION LIMIT and its settings to the login itself, never
through a group it is a member of: so the limits are set on every login member of each
`bcw_*` group — by `bcw migrate` (after the grants), by `bcw auth db --bind` for the
gateway login it binds, and in the SQL `bcw migrate --print-grants` prints. Not on a
superuser, on the role running it, on the database's owner, nor on a role that only
administers the group (PostgreSQL 16 makes a CREATEROLE role that creates a group such a
member of it: the schema's owner is one of every group's). A session may still change its
own timeouts: they end what a client forgot (a psql left in a transaction, a partitioned
worker), not what a hostile login keeps; what bounds the workers' waits on such a
session's locks is their own `lock_timeout`, and what bounds its connections is this
limit, which it cannot change.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

import asyncpg

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoginLimits:
    connections: int  # CONNECTION LIMIT of each login
    statement_timeout: str  # its default statement_timeout
    idle_in_transaction: str  # its default idle_in_transaction_session_timeout
    idle_session: str  # its default idle_session_timeout

    def settings(self) -> dict[str, str]:
        """The role settings, by name (written as PostgreSQL shows them)."""
        return {
            "statement_timeout": self.statement_timeout,
            "idle_in_transaction_session_timeout": self.idle_in_transaction,
            "idle_session_timeout": self.idle_session,
        }


#: a worker's pool (BCW_DATABASE_POOL_MAX, 8) times its processes on one login, with room;
#: a statement above BCW_DATABASE_COMMAND_TIMEOUT (20 s), idle above the relay's PubAcks;
#: a session idle 10 min: above what a worker's connections sit idle (`db.IDLE_LIFETIME`
#: for the pool's, `notify.KEEPALIVE` for its LISTEN connection)
WORKER = LoginLimits(
    connections=64, statement_timeout="1min", idle_in_transaction="1min", idle_session="10min"
)
#: one gateway: its pool, and nothing that runs long
GATEWAY = LoginLimits(
    connections=32, statement_timeout="10s", idle_in_transaction="10s", idle_session="10min"
)

#: the limits of the runtime's own groups (a worker's group's: its `grants.py`, `WORKER`;
#: every group's: the registry's `ROLES.LIMITS`)
LIMITS: dict[str, LoginLimits] = {
    "bcw_relay": WORKER,
    "bcw_gateway_bound": GATEWAY,
    "bcw_gateway": GATEWAY,
    # people and dashboards: a few sessions, queries of a few minutes at most
    "bcw_reader": LoginLimits(
        connections=16, statement_timeout="5min", idle_in_transaction="5min", idle_session="30min"
    ),
    "bcw_operator": LoginLimits(
        connections=8, statement_timeout="5min", idle_in_transaction="5min", idle_session="30min"
    ),
}

#: the login members of group `$1` (or login `$2` alone, when not NULL) that take its
#: limits: a membership that gives the group's rights (PostgreSQL 16's `inherit_option` or
#: `set_option`; every one before it), never a superuser, the role running it or the
#: database's owner
MEMBERS = """
SELECT DISTINCT m.rolname FROM pg_auth_members a
  JOIN pg_roles g ON g.oid = a.roleid JOIN pg_roles m ON m.oid = a.member
 WHERE g.rolname = {group} AND m.rolcanlogin AND NOT m.rolsuper
   AND m.rolname <> current_user
   AND m.oid <> (SELECT datdba FROM pg_database WHERE datname = current_database())
   AND coalesce((to_jsonb(a) ->> 'inherit_option')::boolean
                OR (to_jsonb(a) ->> 'set_option')::boolean, true)
   AND ({login}::text IS NULL OR m.rolname = {login})
 ORDER BY 1
"""


def statements(login: str, limits: LoginLimits, role: str | None = None) -> list[str]:
    """The ALTER ROLE statements that give `login` the limits (`role`: what stands for
    it, quoted by default). Pure."""
    role = role if role is not None else '"' + login.replace('"', '""') + '"'
    out = [f"ALTER ROLE {role} CONNECTION LIMIT {limits.connections}"]
    out += [
        f"ALTER ROLE {role} SET {name} = '{value}'" for name, value in limits.settings().items()
    ]
    return out


def limits_sql(group: str, limits: LoginLimits, login: str | None = None) -> str:
    """A DO block that sets `group`'s `limits` on each of its logins (`MEMBERS`; or on
    `login` alone), saying each login it set and each it may not alter (a warning: the
    others are set all the same)."""
    members = MEMBERS.format(group=_literal(group), login=_literal(login) if login else "NULL")
    alters = " ".join(
        f"EXECUTE format({_literal(s)}, r.rolname);" for s in statements("", limits, "%I")
    )
    return (
        f"DO $$ DECLARE r record; BEGIN FOR r IN {' '.join(members.split())} LOOP "
        f"BEGIN {alters} RAISE NOTICE 'limits of {group} set on %', r.rolname; "
        "EXCEPTION WHEN insufficient_privilege THEN "
        f"RAISE WARNING 'limits of {group} not set on % (%)', r.rolname, SQLERRM; END; "
        "END LOOP; END $$;"
    )


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


@dataclass
class Applied:
    """Which logins took their group's limits, and which this role may not alter."""

    set: list[tuple[str, str]] = field(default_factory=list)  # (login, group)
    refused: list[tuple[str, str, str]] = field(default_factory=list)  # (login, group, why)

    def say(self) -> str:
        """One line for the operator. Pure."""
        done = ", ".join(f"{login} ({group})" for login, group in self.set) or "none"
        line = f"login limits set on: {done}"
        if self.refused:
            line += "; NOT set (not this role's to alter: see bcw migrate --print-grants) on: "
            line += ", ".join(f"{login} ({group})" for login, group, _ in self.refused)
        return line


async def apply(
    conn: asyncpg.Connection, groups: Mapping[str, LoginLimits], login: str | None = None
) -> Applied:
    """Set the limits of `groups` (group → its limits) on their logins (or on `login`),
    each login in a transaction (or savepoint) of its own: one this role may not alter (a
    login a DBA made, on PostgreSQL 16+) is said, never stops the others."""
    out = Applied()
    for group, limits in groups.items():
        members = MEMBERS.format(group="$1", login="$2")
        for row in await conn.fetch(members, group, login):
            name = row["rolname"]
            try:
                async with conn.transaction():
                    for statement in statements(name, limits):
                        await conn.execute(statement)
            except asyncpg.InsufficientPrivilegeError as error:
                out.refused.append((name, group, str(error).splitlines()[0]))
                continue
            out.set.append((name, group))
    if out.refused:
        log.info("%s", out.say())
    return out


async def holds(conn: asyncpg.Connection, login: str, limits: LoginLimits) -> bool:
    """Whether `login` already has `limits` (a DBA set them)."""
    row = await conn.fetchrow(
        "SELECT rolconnlimit, coalesce(rolconfig, '{}') AS config FROM pg_roles WHERE rolname = $1",
        login,
    )
    if row is None:
        return False
    config = dict(item.split("=", 1) for item in row["config"])
    wanted = limits.settings()
    return row["rolconnlimit"] == limits.connections and all(
        config.get(name) == value for name, value in wanted.items()
    )
