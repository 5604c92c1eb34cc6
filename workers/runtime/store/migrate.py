"""Schema migrations: `bcw migrate` and `bcw migrate --status`.

Applies `migrations/core/NNNN_name.sql` in order under an advisory lock, each once in its
own transaction, recording name, checksum and the release that applied it. Refuses to go
on when an applied file was changed, or when the schema holds a migration this release
does not know — unless a newer release of the same major recorded it: within a major,
migrations only expand, so a rolled-back release runs on the schema its successor left
(docs/contract.md, "Compatibility"). Safe to run twice, or from several processes at once.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import asyncpg

from workers.runtime.base.release import parse, release
from workers.runtime.store import db

log = logging.getLogger(__name__)

#: Any constant works; it only has to be the same for every `bcw migrate`.
ADVISORY_LOCK_KEY = 0x6263_775F_6D69  # "bcw_mi"
FILE_RE = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")

LEDGER_DDL = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    name       text        PRIMARY KEY,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""
#: Which release applied each migration (NULL: one before 0.4.0, which did not record it).
LEDGER_RELEASE_DDL = "ALTER TABLE schema_migrations ADD COLUMN IF NOT EXISTS release text"
#: Read whether or not the ledger has its `release` column yet (a release before 0.4.0
#: made it without; `bcw migrate --wait` reads before this release's `bcw migrate` ran).
LEDGER_SELECT = (
    "SELECT name, checksum, applied_at, to_jsonb(m) ->> 'release' AS release "
    "FROM schema_migrations m"
)


class MigrationError(RuntimeError):
    """A migration cannot be applied safely; the message says which and why."""


@dataclass(frozen=True)
class Migration:
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


@dataclass(frozen=True)
class MigrationStatus:
    name: str
    #: "applied" | "pending" | "changed" | "missing" (in the ledger, not on disk, not a
    #: newer release's of this major) | "newer" (a newer release of this major applied
    #: it: a rollback runs on it) | "newer-major" (a release of a later major applied it)
    state: str
    applied_at: str | None = None
    release: str | None = None  # the release that applied it, when recorded

    @property
    def refused(self) -> bool:
        """Whether this release may not run on a schema with this migration in this state."""
        return self.state in REFUSED


#: States of a migration on which this release does not run.
REFUSED = ("changed", "missing", "newer-major")


def classify(
    on_disk: list[Migration], ledger: dict[str, dict[str, object]], this_release: str
) -> list[MigrationStatus]:
    """Every migration on disk or in the ledger (`name` → `checksum`, `applied_at`,
    `release`), with its state as this release sees it. Pure.

    One not on disk is `newer` only when the release that recorded it is of this release's
    major and later than it; of a later major, `newer-major`; otherwise (no release
    recorded, this release's own or an earlier one's, or a version that does not parse)
    `missing`: a file this release should have and has not.
    """
    ledger = dict(ledger)
    out = []
    for migration in on_disk:
        row = ledger.pop(migration.name, None)
        if row is None:
            out.append(MigrationStatus(migration.name, "pending"))
            continue
        state = "applied" if row["checksum"] == migration.checksum else "changed"
        out.append(MigrationStatus(migration.name, state, _when(row), _release(row)))
    mine = parse(this_release)
    for name, row in sorted(ledger.items()):
        theirs = parse(_release(row))
        if mine is None or theirs is None or theirs <= mine:
            state = "missing"
        elif theirs[0] == mine[0]:
            state = "newer"
        else:
            state = "newer-major"
        out.append(MigrationStatus(name, state, _when(row), _release(row)))
    return out


def _when(row: dict[str, object]) -> str | None:
    applied_at = row.get("applied_at")
    return applied_at.isoformat() if hasattr(applied_at, "isoformat") else None


def _release(row: dict[str, object]) -> str | None:
    value = row.get("release")
    return value if isinstance(value, str) else None


def refusal(statuses: list[MigrationStatus], this_release: str) -> str | None:
    """Why this release may not run on the schema these statuses describe, or None. Pure."""
    odd = [s for s in statuses if s.refused]
    if not odd:
        return None
    later = sorted({s.release or "" for s in odd if s.state == "newer-major"})
    parts = [f"{s.name} ({s.state}{', ' + s.release if s.release else ''})" for s in odd]
    why = f"not release {this_release}'s schema: {', '.join(parts)}"
    if later:
        why += (
            f"; release {', '.join(later)} is a later major, whose schema an earlier major "
            "cannot run on: roll forward, or restore the database from before its migration"
        )
    return why


def default_directory() -> Path:
    """The migrations shipped in the wheel, else the repository's `migrations/core`."""
    package = Path(str(resources.files("workers")))  # wherever this module sits inside it
    packaged = package / "_migrations" / "core"
    if packaged.is_dir():
        return packaged
    return package.parent / "migrations" / "core"


def load(directory: Path) -> list[Migration]:
    """The migration files in order; a file with a malformed name is an error, not skipped."""
    if not directory.is_dir():
        raise MigrationError(f"migrations directory not found: {directory}")
    migrations = []
    numbers: dict[str, str] = {}
    for path in sorted(directory.iterdir()):
        if path.suffix != ".sql":
            continue
        match = FILE_RE.match(path.name)
        if not match:
            raise MigrationError(f"{path.name}: migration files are named NNNN_lowercase_name.sql")
        if match.group(1) in numbers:
            raise MigrationError(f"{path.name} and {numbers[match.group(1)]} share a number")
        numbers[match.group(1)] = path.name
        migrations.append(Migration(path.name, path.read_text(encoding="utf-8")))
    return migrations


async def _applied(conn: asyncpg.Connection) -> dict[str, dict[str, object]]:
    rows = await conn.fetch(LEDGER_SELECT)
    return {row["name"]: dict(row) for row in rows}


def _check(migrations: list[Migration], applied: dict[str, dict[str, object]]) -> None:
    for migration in migrations:
        row = applied.get(migration.name)
        if row is not None and row["checksum"] != migration.checksum:
            raise MigrationError(
                f"{migration.name} was changed after it was applied "
                f"(recorded sha256 {str(row['checksum'])[:12]}…, file {migration.checksum[:12]}…); "
                "write a new migration instead of editing an applied one"
            )
    why = refusal(classify(migrations, applied, release()), release())
    if why is not None:
        raise MigrationError(why)


async def migrate(conn: asyncpg.Connection, directory: Path | None = None) -> list[str]:
    """Apply pending migrations; returns the names applied by this call."""
    migrations = load(directory or default_directory())
    await conn.execute("SELECT pg_advisory_lock($1)", ADVISORY_LOCK_KEY)
    try:
        await conn.execute(LEDGER_DDL)
        if not await conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM information_schema.columns WHERE "
            "table_name = 'schema_migrations' AND column_name = 'release' "
            "AND table_schema = current_schema())"
        ):
            await conn.execute(LEDGER_RELEASE_DDL)
        applied = await _applied(conn)
        _check(migrations, applied)
        done = []
        for migration in migrations:
            if migration.name in applied:
                continue
            log.info("applying migration %s", migration.name)
            # beside running workers (a rolling upgrade), tried again when it meets their locks
            await db.with_lock_patience(
                conn, f"migration {migration.name}", functools.partial(_apply, conn, migration)
            )
            done.append(migration.name)
        return done
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", ADVISORY_LOCK_KEY)


async def _apply(conn: asyncpg.Connection, migration: Migration) -> None:
    await conn.execute(migration.sql)
    await conn.execute(
        "INSERT INTO schema_migrations (name, checksum, release) VALUES ($1, $2, $3)",
        migration.name,
        migration.checksum,
        release(),
    )


async def status(conn: asyncpg.Connection, directory: Path | None = None) -> list[MigrationStatus]:
    """Every migration on disk or in the ledger, with its state."""
    migrations = load(directory or default_directory())
    exists = await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL")
    applied = await _applied(conn) if exists else {}
    return classify(migrations, applied, release())


async def grant(conn: asyncpg.Connection, legacy_gateway: bool = False) -> list[str]:
    """Create the bcw_* group roles when this role may, and (re)apply their grants, under
    the migrations' advisory lock (`grants`). Returns the groups granted to."""
    from workers.runtime.store import grants

    await conn.execute("SELECT pg_advisory_lock($1)", ADVISORY_LOCK_KEY)
    try:
        return await grants.apply(conn, legacy_gateway)
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", ADVISORY_LOCK_KEY)


async def set_hello_proof(conn: asyncpg.Connection, policy: str) -> None:
    """Set the fleet's Hello proof policy (`off`, `warn`, `require`). Taken exclusively
    against every Hello transaction in flight (each holds the lock shared), so that none
    opens under the policy being replaced once this returns."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext('bcw-fleet-policy'))")
        await conn.execute(
            "UPDATE fleet_policy SET hello_proof = $1, changed_at = now() "
            "WHERE hello_proof IS DISTINCT FROM $1",
            policy,
        )


async def hello_proof(conn: asyncpg.Connection) -> str:
    """The fleet's Hello proof policy."""
    return str(await conn.fetchval("SELECT hello_proof FROM fleet_policy"))


# Connected sessions whose Hello was not proven: the row's `proven` (migration 0049), or,
# for a session opened before it, its epoch's record.
UNPROVEN_SESSIONS = """
SELECT count(*) FROM node_sessions s
 WHERE s.gateway_id IS NOT NULL AND s.proven IS NOT TRUE
   AND NOT EXISTS (SELECT 1 FROM session_epochs e
                    WHERE e.node_id = s.node_id AND e.epoch = s.session_epoch AND e.proven)
"""


async def unproven_sessions(conn: asyncpg.Connection) -> int:
    """How many connected sessions' Hellos were not proven."""
    return int(await conn.fetchval(UNPROVEN_SESSIONS))


def proof_warning(policy: str, unproven: int) -> str:
    """The one line said when the fleet's Hellos need no proof. Pure."""
    return (
        f"Hello proofs are not required (BCW_HELLO_PROOF={policy}): {unproven} connected "
        "session(s) unproven; a gateway's credentials can open the session of any node "
        "without a Hello key and get its commands — give daemons that sign their keys, then "
        "BCW_HELLO_PROOF=require"
    )
