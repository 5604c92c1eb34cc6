"""Schema migrations: `bcw migrate` and `bcw migrate --status`.

Applies `migrations/core/NNNN_name.sql` in order under an advisory lock, each once in its
own transaction, recording name and checksum. Refuses to go on when an applied file was
changed. Safe to run twice, or from several processes at once.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import asyncpg

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
    state: str  # "applied" | "pending" | "changed" | "missing"
    applied_at: str | None = None


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


async def _applied(conn: asyncpg.Connection) -> dict[str, asyncpg.Record]:
    rows = await conn.fetch("SELECT name, checksum, applied_at FROM schema_migrations")
    return {row["name"]: row for row in rows}


def _check_unchanged(migrations: list[Migration], applied: dict[str, asyncpg.Record]) -> None:
    for migration in migrations:
        row = applied.get(migration.name)
        if row is not None and row["checksum"] != migration.checksum:
            raise MigrationError(
                f"{migration.name} was changed after it was applied "
                f"(recorded sha256 {row['checksum'][:12]}…, file {migration.checksum[:12]}…); "
                "write a new migration instead of editing an applied one"
            )


async def migrate(conn: asyncpg.Connection, directory: Path | None = None) -> list[str]:
    """Apply pending migrations; returns the names applied by this call."""
    migrations = load(directory or default_directory())
    await conn.execute("SELECT pg_advisory_lock($1)", ADVISORY_LOCK_KEY)
    try:
        await conn.execute(LEDGER_DDL)
        applied = await _applied(conn)
        _check_unchanged(migrations, applied)
        done = []
        for migration in migrations:
            if migration.name in applied:
                continue
            log.info("applying migration %s", migration.name)
            async with conn.transaction():
                await conn.execute(migration.sql)
                await conn.execute(
                    "INSERT INTO schema_migrations (name, checksum) VALUES ($1, $2)",
                    migration.name,
                    migration.checksum,
                )
            done.append(migration.name)
        return done
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", ADVISORY_LOCK_KEY)


async def status(conn: asyncpg.Connection, directory: Path | None = None) -> list[MigrationStatus]:
    """Every migration on disk or in the ledger, with its state."""
    migrations = load(directory or default_directory())
    exists = await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL")
    applied = await _applied(conn) if exists else {}
    out = []
    for migration in migrations:
        row = applied.pop(migration.name, None)
        if row is None:
            out.append(MigrationStatus(migration.name, "pending"))
        else:
            state = "applied" if row["checksum"] == migration.checksum else "changed"
            out.append(MigrationStatus(migration.name, state, row["applied_at"].isoformat()))
    for name, row in sorted(applied.items()):
        out.append(MigrationStatus(name, "missing", row["applied_at"].isoformat()))
    return out


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
