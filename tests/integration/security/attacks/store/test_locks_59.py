"""Issue 59, item 1: no lock another login can take stops `bcw migrate` or the quarantine's
breaker. The attacker logs in as a reader, or as a gateway (bound to gw-1), takes every
advisory key the system serialized on before — the migrations' (exclusive), the
breaker's (exclusive), the fleet policy's (shared: what stopped a change of the policy)
— outside any transaction, where no timeout ends it; the gateway also keeps a
transaction open after one `gateway_hello` call for a node that does not exist. It then
tries the locks that replaced them (`schema_lock`, `quarantine_breaker`): refused, but
for a reader's ACCESS SHARE, which stops nothing.

On the code before, `bcw migrate` waited for the migrations' key until its lock timeout
and failed, and a quarantine's breaker waited for its key with every Hello fact behind it:
no quarantine was decided. The policy's row, which the Hello transaction locks FOR SHARE,
is the one lock such a login holds legitimately: a change of the policy waits for it 5 s
at a time, and succeeds once the login's idle-in-transaction timeout (10 s) cuts its
transaction — or, past its tries, says so in one line (exit 1).

Setups A and B do not enter: these are the database's locks, the same with one facts
stream or one per gateway, with relays in the workers or dedicated; the proof policy
enters only as the change `bcw migrate` makes (`require` to `warn`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from datetime import timedelta

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration import fleet
from tests.integration.driver import driving
from tests.integration.security.conftest import login_of, url_as
from tests.integration.support import bcw
from tests.integration.workers.test_quarantine import clone_hello
from workers import quarantine
from workers.runtime.store import migrate

pytestmark = pytest.mark.slow

#: the advisory keys of the code before (migrate.py's constant, the Hello transaction's
#: and the breaker's `hashtext`s)
MIGRATIONS_KEY = 0x6263_775F_6D69
KEYS = (
    ("SELECT pg_advisory_lock($1::bigint)", MIGRATIONS_KEY),
    ("SELECT pg_advisory_lock(hashtext($1))", "bcw-quarantine-breaker"),
    ("SELECT pg_advisory_lock_shared(hashtext($1))", "bcw-fleet-policy"),
)
#: every way to lock the new locks' rows or tables (a reader's ACCESS SHARE passes: it
#: conflicts only with ACCESS EXCLUSIVE, which nothing takes)
ROW_LOCKS = ("FOR UPDATE", "FOR NO KEY UPDATE", "FOR SHARE", "FOR KEY SHARE")
TABLE_LOCKS = (
    "ROW SHARE",
    "ROW EXCLUSIVE",
    "SHARE UPDATE EXCLUSIVE",
    "SHARE",
    "SHARE ROW EXCLUSIVE",
    "EXCLUSIVE",
    "ACCESS EXCLUSIVE",
)
ATTACKERS = ("bcw_reader", "bcw_gateway_bound")
GHOST_HELLO = (
    "SELECT * FROM gateway_hello('gw-1', $1, 'ghost', 'ghost-serial', 'b1', 'j1', 'worker', "
    "'1.0.0', 1, 'grpc', false, 0, 0, '', '90s', NULL, gen_random_uuid(), NULL, NULL, NULL)"
)


async def _try_new_locks(conn: asyncpg.Connection) -> None:
    """Every row and table lock on `schema_lock` and `quarantine_breaker`: refused."""
    for table in ("schema_lock", "quarantine_breaker"):
        for mode in ROW_LOCKS:
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                async with conn.transaction():
                    await conn.execute(f"SELECT 1 FROM {table} {mode}")
        for mode in TABLE_LOCKS:
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                async with conn.transaction():
                    await conn.execute(f"LOCK TABLE {table} IN {mode} MODE")


@contextlib.asynccontextmanager
async def attacking(logins: dict[str, str], group: str) -> AsyncIterator[list[asyncpg.Connection]]:
    """The attacker, logged in as `group`'s login, holding every old key (and, a gateway,
    a Hello transaction left open) while the body runs."""
    holder = await asyncpg.connect(logins[group])
    opened = [holder]
    try:
        if group == "bcw_gateway_bound":
            hello = await asyncpg.connect(logins[group])
            opened.append(hello)
            lease = await hello.fetchval("SELECT gateway_acquire('gw-1', $1)", timedelta(minutes=5))
            await hello.execute("BEGIN")
            row = await hello.fetchrow(GHOST_HELLO, lease)
            assert row["epoch"] is None  # no such node: nothing opened, the transaction kept
        for sql, key in KEYS:
            await holder.execute(sql, key)
        await _try_new_locks(holder)
        if group == "bcw_reader":  # what it may take: held through the attack, harmless
            await holder.execute("BEGIN")
            await holder.execute("LOCK TABLE schema_lock, quarantine_breaker IN ACCESS SHARE MODE")
        yield opened
    finally:
        for conn in opened:
            await conn.close()


async def _policy(database_url: str) -> str:
    conn = await asyncpg.connect(database_url)
    try:
        return await migrate.hello_proof(conn)
    finally:
        await conn.close()


@pytest.mark.parametrize("group", ATTACKERS)
async def test_no_login_stops_bcw_migrate_nor_its_change_of_the_policy(
    logins: dict[str, str], database_url: str, group: str
) -> None:
    """`bcw migrate` (grants, limits, and the policy from `require` to `warn`) beside the
    attacker: done, or — the policy's row kept locked past its tries — said in one line;
    in a bounded time either way."""
    assert await _policy(database_url) == "require"
    async with attacking(logins, group):
        started = time.monotonic()
        code, out = await bcw("migrate", BCW_DATABASE_URL=database_url, BCW_HELLO_PROOF="warn")
        took = time.monotonic() - started
    assert took < 60, (took, out)
    if code == 0:
        assert "Hello proofs: warn" in out and await _policy(database_url) == "warn"
    else:  # the Hello transaction's row lock outlived every try: said, nothing changed
        assert code == 1, out
        [line] = [x for x in out.splitlines() if x.startswith("bcw migrate:")]
        assert "the policy's row stayed locked" in line and "Traceback" not in out
        assert await _policy(database_url) == "require"
    assert "granted to bcw_liveness" in out


async def test_no_login_stops_the_first_migration(
    logins: dict[str, str], empty_database_url: str
) -> None:
    """On an empty database, where `schema_lock` is not there yet, a reader's login that
    connected first and holds the old key: `bcw migrate` applies every migration."""
    attacker = await asyncpg.connect(url_as(empty_database_url, login_of("bcw_reader")))
    try:
        await attacker.execute("SELECT pg_advisory_lock($1::bigint)", MIGRATIONS_KEY)
        code, out = await bcw("migrate", BCW_DATABASE_URL=empty_database_url)
    finally:
        await attacker.close()
    assert code == 0, out
    assert f"applied {len(migrate.load(migrate.default_directory()))} migration(s)" in out


@pytest.mark.parametrize("group", ATTACKERS)
async def test_no_login_stops_a_quarantine(
    servers: Servers,
    nc: NATS,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
    logins: dict[str, str],
    group: str,
) -> None:
    """Four proven alternations of n1, the quarantine running as its own login, beside the
    attacker: the breaker counts, n1 is revoked at the fourth."""
    await fleet.session(db, "n1", epoch=1)
    async with (
        attacking(logins, group),
        driving(servers, nc, subjects, logins["bcw_quarantine"], quarantine.build) as drive,
    ):
        for _ in range(4):
            hello = await clone_hello(db, gateways=("gw-1", "gw-1"))
            await drive.send(hello.model_copy(update={"proven": True}))
        revoked = await db.fetch("SELECT serial FROM node_certs WHERE revoked_at IS NOT NULL")
        assert {r["serial"] for r in revoked} == {"n1-serial"}
        row = await db.fetchrow("SELECT held, revoked_at FROM quarantines WHERE node_id = 'n1'")
        assert row["held"] is None and row["revoked_at"] is not None


async def test_a_change_of_the_policy_waits_for_the_hellos_in_flight_then_says_it_gave_up(
    database_url: str, db: asyncpg.Connection
) -> None:
    """The policy's row held FOR SHARE, as a Hello transaction holds it: the change waits,
    is done once the holder's transaction ends; held past every try (a login that turned
    its own idle-in-transaction timeout off), `LockBusy`, the policy unchanged."""
    holder = await asyncpg.connect(database_url)
    try:
        await holder.execute("BEGIN")
        await holder.execute("SELECT 1 FROM fleet_policy FOR SHARE")
        started = time.monotonic()
        with pytest.raises(migrate.LockBusy, match="the policy's row stayed locked"):
            await migrate.set_hello_proof(db, "warn", attempts=2)
        assert 2.5 <= time.monotonic() - started < 8  # two tries of 1 s, one pause of 1 s
        assert await migrate.hello_proof(db) == "require"

        async def hello_ends() -> None:
            await asyncio.sleep(3)
            await holder.execute("COMMIT")

        ending = asyncio.create_task(hello_ends())
        await migrate.set_hello_proof(db, "warn", attempts=5)  # a later try gets it
        await ending
        assert await migrate.hello_proof(db) == "warn"
    finally:
        await holder.close()
