"""Schema migrations: `bcw migrate` and `bcw migrate --status`.

Applies `migrations/core/NNNN_name.sql` in order, each once in its own transaction, recording name, checksum and the release that applied it. Refuses to go
on when an applied file was changed, or when the schema holds a migration this release
does not know — unless a newer release of the same major recorded it: within a major,
migrations only expand, so a rolled-back release runs on the schema its successor left
(docs/contract.md, "Compatibility"). Safe to run twice, or from several processes at once:
`bcw migrate` runs under `schema_lock`, a row only the schema's owner can lock (an
advisory key, which any login may take, stopped every `bcw migrate` while one held it).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import asyncpg

from workers.runtime.base.release import parse, release
from workers.runtime.store import db

if TYPE_CHECKING:
    from workers.runtime.store import grants, roles

log = logging.getLogger(__name__)

#: `bcw migrate`'s lock: its one row, locked FOR UPDATE for the whole run. The same
#: statement as migration 0055's, which makes it for a database migrated without the lock.
SCHEMA_LOCK_DDL = """
CREATE TABLE IF NOT EXISTS schema_lock (
    one       boolean     PRIMARY KEY DEFAULT true CHECK (one),
    locked_at timestamptz NOT NULL DEFAULT now()
)
"""
SCHEMA_LOCK_ROW = "INSERT INTO schema_lock DEFAULT VALUES ON CONFLICT DO NOTHING"
#: how long one try waits for the schema lock (tried again until its patience is out; named
#: in BCW_DATABASE_LOCK_TIMEOUT's description)
SCHEMA_LOCK_WAIT = "5s"
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

#: This release reads every row of the ledger: a login of a worker otherwise sees only the
#: migrations of releases before 0.4 (`policies.LEDGER_BEFORE_0_4`), which read every row
#: they see. In a transaction of its own (SET LOCAL), so PgBouncer keeps it on one backend.
LEDGER_READ = "SET LOCAL bcw.ledger = 'releases'"


class MigrationError(RuntimeError):
    """A migration cannot be applied safely; the message says which and why."""


class LockBusy(RuntimeError):
    """A lock `bcw migrate` needs stayed taken past its patience; the message says which."""


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
        elif theirs.major == mine.major:
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


async def read_ledger(conn: asyncpg.Connection) -> dict[str, dict[str, object]]:
    """Every row of the ledger by name, whichever login reads it (`LEDGER_READ`)."""
    async with conn.transaction():
        await conn.execute(LEDGER_READ)
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
    """Apply pending migrations; returns the names applied by this call. Beside another
    `bcw migrate`, run it under `schema_lock`."""
    migrations = load(directory or default_directory())
    await conn.execute(LEDGER_DDL)
    if not await conn.fetchval(
        "SELECT EXISTS (SELECT 1 FROM information_schema.columns WHERE "
        "table_name = 'schema_migrations' AND column_name = 'release' "
        "AND table_schema = current_schema())"
    ):
        await conn.execute(LEDGER_RELEASE_DDL)
    applied = await read_ledger(conn)
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


@contextlib.asynccontextmanager
async def schema_lock(
    connect: Callable[[], Awaitable[asyncpg.Connection]], patience: float = 600.0
) -> AsyncIterator[None]:
    """Hold `bcw migrate`'s lock while the body runs: the one row of `schema_lock`, locked
    FOR UPDATE in a transaction kept open on a connection of its own (`connect()`), which
    only a role with UPDATE on it — the schema's owner — can take. On an empty database the
    table is made first. Another `bcw migrate` holding it is waited for 5 s at a time, for
    `patience` seconds at most (`LockBusy`); the lock goes with the connection, also when
    this process dies. A migration must never alter `schema_lock` (it would wait for this)."""
    conn = await connect()
    try:
        await _take_schema_lock(conn, patience)
        yield
    finally:
        await conn.close()


async def _take_schema_lock(conn: asyncpg.Connection, patience: float) -> None:
    deadline = time.monotonic() + patience
    while True:
        try:
            async with contextlib.AsyncExitStack() as stack:
                if not await conn.fetchval("SELECT to_regclass('schema_lock') IS NOT NULL"):
                    # an empty database: table and row made here, at once (one statement)
                    await conn.execute(f"{SCHEMA_LOCK_DDL}; {SCHEMA_LOCK_ROW}")
                transaction = conn.transaction()
                await transaction.start()
                stack.push_async_callback(transaction.rollback)
                await conn.execute(f"SET LOCAL lock_timeout = '{SCHEMA_LOCK_WAIT}'")
                # the body's migrations may take long: this transaction waits for them idle
                await conn.execute("SET LOCAL idle_in_transaction_session_timeout = 0")
                if await conn.fetchval("SELECT one FROM schema_lock FOR UPDATE"):
                    stack.pop_all()  # held until the connection closes
                    return
            await conn.execute(SCHEMA_LOCK_ROW)  # its row deleted by hand: made again
        except (asyncpg.UniqueViolationError, asyncpg.DuplicateTableError):
            continue  # another `bcw migrate` made the table at the same moment
        except asyncpg.InsufficientPrivilegeError as error:
            raise MigrationError(
                f"the schema lock ({error}): run bcw migrate as the schema's owner"
            ) from error
        except asyncpg.LockNotAvailableError:
            if time.monotonic() >= deadline:
                raise LockBusy(
                    f"another bcw migrate held the schema lock for {patience:.0f} s "
                    "(schema_lock; see pg_stat_activity): nothing was applied, try again"
                ) from None
            log.info("another bcw migrate holds the schema lock: waiting for it")


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
    applied = await read_ledger(conn) if exists else {}
    return classify(migrations, applied, release())


async def grant(
    conn: asyncpg.Connection, table: roles.Roles, legacy_gateway: bool = False
) -> grants.Granted:
    """Create the bcw_* group roles of `table` (the registry's `ROLES`) when this role may,
    and (re)apply their grants and their logins' limits (`grants`; `bcw migrate` runs it
    under `schema_lock`). Returns the groups granted to."""
    from workers.runtime.store import grants

    return await grants.apply(conn, table, legacy_gateway)


#: how many times the policy's change waits 1 s for the Hellos in flight (about a minute
#: in all, with the pauses between)
POLICY_ATTEMPTS = 20


async def set_hello_proof(
    conn: asyncpg.Connection, policy: str, attempts: int = POLICY_ATTEMPTS
) -> None:
    """Set the fleet's Hello proof policy (`off`, `warn`, `require`). Every Hello
    transaction holds the policy's row FOR SHARE (`gateway_hello`), so the UPDATE waits for
    those in flight and none opens under the policy being replaced once this returns. It
    waits 1 s at a time (`db.with_lock_patience`): a login that keeps a Hello transaction
    open holds it until its idle-in-transaction timeout ends it; past `attempts`, `LockBusy`
    (the policy unchanged)."""
    update = functools.partial(
        conn.execute,
        "UPDATE fleet_policy SET hello_proof = $1, changed_at = now() "
        "WHERE hello_proof IS DISTINCT FROM $1",
        policy,
    )
    try:
        await db.with_lock_patience(conn, "the Hello proof policy", update, attempts)
    except asyncpg.LockNotAvailableError:
        raise LockBusy(
            f"BCW_HELLO_PROOF={policy}: the policy's row stayed locked by an open Hello "
            f"transaction through {attempts} tries (a gateway login keeping one open: see "
            "pg_stat_activity); the policy is unchanged, try again"
        ) from None


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
