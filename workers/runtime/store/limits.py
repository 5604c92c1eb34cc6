"""What each group's logins may hold of the database: connections, and how long one
statement may run and one transaction may sit idle (docs/kubernetes.md, "Database roles").

PostgreSQL applies a role's CONNECTION LIMIT and its settings to the login itself, never
through a group it is a member of: so the limits are set on every login member of each
`bcw_*` group — by `bcw migrate` (after the grants), by `bcw auth db --bind` for the
gateway login it binds, and in the SQL `bcw migrate --print-grants` prints. A session may
still change its own `statement_timeout`; what bounds the workers' waits on a hostile
session's locks is their own `lock_timeout` (`BCW_DATABASE_LOCK_TIMEOUT`), and what
bounds its connections is this limit, which it cannot change.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import asyncpg

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoginLimits:
    connections: int  # CONNECTION LIMIT of each login
    statement_timeout: str  # its default statement_timeout
    idle_in_transaction: str  # its default idle_in_transaction_session_timeout


#: a worker's pool (BCW_DATABASE_POOL_MAX, 8) times its processes on one login, with room;
#: a statement above BCW_DATABASE_COMMAND_TIMEOUT (20 s), idle above the relay's PubAcks
#: (written as PostgreSQL shows them)
WORKER = LoginLimits(connections=64, statement_timeout="1min", idle_in_transaction="1min")

LIMITS: dict[str, LoginLimits] = {
    "bcw_liveness": WORKER,
    "bcw_labeler": WORKER,
    "bcw_quarantine": WORKER,
    "bcw_replay": WORKER,
    "bcw_recorder": WORKER,
    "bcw_relay": WORKER,
    # one gateway: its pool, and nothing that runs long
    "bcw_gateway_bound": LoginLimits(
        connections=32, statement_timeout="10s", idle_in_transaction="10s"
    ),
    "bcw_gateway": LoginLimits(connections=32, statement_timeout="10s", idle_in_transaction="10s"),
    # people and dashboards: a few sessions, queries of a few minutes at most
    "bcw_reader": LoginLimits(connections=16, statement_timeout="5min", idle_in_transaction="5min"),
    "bcw_operator": LoginLimits(
        connections=8, statement_timeout="5min", idle_in_transaction="5min"
    ),
}


def limits_sql(group: str, login: str | None = None) -> str:
    """A DO block that sets `group`'s limits on each of its login members (or on `login`
    alone), superusers excepted."""
    limits = LIMITS[group]
    which = f"AND m.rolname = {_literal(login)}" if login is not None else ""
    return (
        "DO $$ DECLARE r record; BEGIN FOR r IN "
        "SELECT m.rolname FROM pg_auth_members a JOIN pg_roles g ON g.oid = a.roleid "
        "JOIN pg_roles m ON m.oid = a.member "
        f"WHERE g.rolname = '{group}' AND m.rolcanlogin AND NOT m.rolsuper {which} LOOP "
        f"EXECUTE format('ALTER ROLE %I CONNECTION LIMIT {limits.connections}', r.rolname); "
        f"EXECUTE format('ALTER ROLE %I SET statement_timeout = %L', r.rolname, "
        f"'{limits.statement_timeout}'); "
        f"EXECUTE format('ALTER ROLE %I SET idle_in_transaction_session_timeout = %L', "
        f"r.rolname, '{limits.idle_in_transaction}'); "
        "END LOOP; END $$;"
    )


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


async def apply(
    conn: asyncpg.Connection, groups: tuple[str, ...], login: str | None = None
) -> bool:
    """Set the limits of `groups` on their logins (or on `login`); False when this role
    may not alter them (a DBA runs `bcw migrate --print-grants`'s SQL instead)."""
    try:
        for group in groups:
            if group in LIMITS:
                await conn.execute(limits_sql(group, login))
        return True
    except asyncpg.InsufficientPrivilegeError as error:
        log.info(
            "the bcw_* logins' limits were not set (%s): see bcw migrate --print-grants", error
        )
        return False
