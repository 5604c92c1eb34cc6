"""A hostile gateway, logged in to the database as itself: gw-1's login (`bcw_gateway_bound`,
bound to gw-1) tries, with bare SQL and with the gateway functions, everything that is
not its job — writing as gw-2, taking, renewing, draining or releasing gw-2's lease,
closing gw-2's sessions, writing their inventory, acting on a stale lease, binding itself
to another gateway. Each is refused or finds nothing, and gw-2's rows are byte for byte
what they were. A login of the group bound to no gateway may do nothing at all."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas.subjects import Subjects
from tests.factories import make_fact
from tests.integration import fleet
from tests.integration.security.conftest import (
    SUBJECTS,
    client_as,
    login_of,
    nats_as,
    provision_consumers,
    url_as,
    violated,
)
from tests.integration.security.gateways.forgery import FOREIGN, counted, forged_facts, state
from tests.integration.streams import RecordingStream
from tests.integration.support import (
    already,
    bcw,
    eventually,
    make_settings,
    publish_fact,
    running,
    stream_messages,
)
from workers.gateway import Gateway, HelloRequest, store
from workers.registry import WORKERS
from workers.runtime.bus import connection, streams

pytestmark = pytest.mark.slow

TTL = timedelta(seconds=15)


def _hello(node: str, boot: str = "b1") -> HelloRequest:
    return HelloRequest(
        node_id=node,
        cert_serial=f"{node}-serial",
        role="worker",
        boot_id=boot,
        journal_id="j1",
        inventory_hashes={"cpu": "c1"},
    )


async def _snapshot(db: asyncpg.Connection) -> tuple[object, ...]:
    """gw-2's lease and n2's session and inventory, as stored."""
    return (
        tuple(await db.fetchrow("SELECT * FROM gateways WHERE gateway_id = 'gw-2'")),
        tuple(await db.fetchrow("SELECT * FROM node_sessions WHERE node_id = 'n2'")),
        tuple(tuple(r) for r in await db.fetch("SELECT * FROM node_inventory ORDER BY 1, 2")),
        tuple(tuple(r) for r in await db.fetch("SELECT * FROM gateway_logins ORDER BY 1")),
    )


@contextlib.asynccontextmanager
async def _connected(url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(url)
    try:
        yield conn
    finally:
        await conn.close()


@pytest.fixture
async def gw2(
    logins: dict[str, str], nc: NATS, subjects: Subjects, db: asyncpg.Connection
) -> AsyncIterator[Gateway]:
    """gw-2, run by the reference gateway under a login of its own, holding node n2."""
    await streams.provision_streams(nc.jetstream(), subjects)
    await _bind(db, "gw2_login_t", "gw-2")
    await fleet.join(db, "n2")
    pool = await asyncpg.create_pool(
        url_as(logins["bcw_gateway_bound"], "gw2_login_t"), min_size=1, max_size=2
    )
    gateway = fleet.Provisioned("gw-2", pool, nc, subjects)
    await gateway.start(autotick=None)
    welcome = await fleet.say_hello(gateway, _hello("n2"))
    await gateway.inventory("n2", welcome.epoch, "cpu", "c1", {"cores": 8})
    try:
        yield gateway
    finally:
        await gateway.stop(graceful=False)
        await pool.close()


async def test_gw1s_login_can_neither_write_nor_act_as_gw2(
    logins: dict[str, str], gw2: Gateway, db: asyncpg.Connection
) -> None:
    before = await _snapshot(db)
    lease2 = gw2.lease_epoch
    epoch2 = await db.fetchval("SELECT session_epoch FROM node_sessions WHERE node_id = 'n2'")
    as_gw2 = [
        ("SELECT gateway_acquire('gw-2', $1)", (TTL,)),
        ("SELECT gateway_renew('gw-2', $1, $2)", (lease2, TTL)),
        ("SELECT gateway_drain('gw-2', $1, true)", (lease2,)),
        ("SELECT gateway_release('gw-2', $1)", (lease2,)),
        ("SELECT gateway_close('gw-2', $1, 'n2', $2, 'x')", (lease2, epoch2)),
        ("SELECT gateway_close_many('gw-2', $1, '{n2}', ARRAY[$2::bigint], 'x')", (lease2, epoch2)),
        ("SELECT gateway_write_section('gw-2', $1, 'n2', $2, 'cpu', 'h', '{}')", (lease2, epoch2)),
        (
            "SELECT * FROM gateway_hello('gw-2', $1, 'n2', 'n2-serial', 'b9', 'j1', 'worker', "
            "'1.0.0', 1, 'grpc', false, 0, 0, '', '90s', NULL, gen_random_uuid(), NULL, NULL, NULL)",
            (lease2,),
        ),
    ]
    bare = [
        "UPDATE node_sessions SET gateway_id = 'gw-1' WHERE node_id = 'n2'",
        "UPDATE node_sessions SET session_epoch = session_epoch + 1 WHERE node_id = 'n2'",
        "UPDATE gateways SET lease_expires_at = compute_now() WHERE gateway_id = 'gw-2'",
        "DELETE FROM gateways WHERE gateway_id = 'gw-2'",
        "UPDATE gateway_logins SET gateway_id = 'gw-2' WHERE login = session_user",
        "INSERT INTO gateway_logins VALUES (session_user, 'gw-2')",
        "DELETE FROM node_inventory",
        "UPDATE node_certs SET revoked_at = NULL",
        "SELECT set_compute_now_offset(interval '1 hour')",
    ]
    async with _connected(logins["bcw_gateway_bound"]) as conn:
        for sql, args in as_gw2:
            with pytest.raises(asyncpg.InsufficientPrivilegeError, match="acts as gateway gw-1"):
                await conn.fetchval(sql, *args)
        for sql in bare:
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute(sql)
        # as itself: gw-1 holds no session of n2, so its close and its section find nothing
        lease1 = await conn.fetchval("SELECT gateway_acquire('gw-1', $1)", TTL)
        assert not await conn.fetchval(
            "SELECT gateway_close('gw-1', $1, 'n2', $2, 'x')", lease1, epoch2
        )
        assert not await conn.fetch(  # nor its batch of closes (the stop's)
            "SELECT gateway_close_many('gw-1', $1, '{n2}', ARRAY[$2::bigint], 'x')", lease1, epoch2
        )
        with pytest.raises(asyncpg.InvalidParameterValueError):  # bounded: no endless statement
            await conn.fetch(
                "SELECT gateway_close_many('gw-1', $1, array_fill('n'::text, ARRAY[10001]), "
                "array_fill(1::bigint, ARRAY[10001]), 'x')",
                lease1,
            )
        assert not await conn.fetchval(
            "SELECT gateway_write_section('gw-1', $1, 'n2', $2, 'cpu', 'forged', '{}')",
            lease1,
            epoch2,
        )
        # a lease the function caps: no lease of a year to outlive a crash
        await conn.fetchval("SELECT gateway_renew('gw-1', $1, interval '365 days')", lease1)
    assert await db.fetchval(
        "SELECT lease_expires_at <= compute_now() + interval '5 minutes' FROM gateways "
        "WHERE gateway_id = 'gw-1'"
    )
    assert await _snapshot(db) == before
    assert gw2.alive and "n2" in gw2.sessions


async def test_a_stale_lease_writes_nothing_and_a_new_incarnation_fences_the_old(
    logins: dict[str, str], db: asyncpg.Connection
) -> None:
    await fleet.join(db, "n1")
    async with (
        _connected(logins["bcw_gateway_bound"]) as old,
        _connected(logins["bcw_gateway_bound"]) as new,
    ):
        stale = await old.fetchval("SELECT gateway_acquire('gw-1', $1)", TTL)
        fresh = await new.fetchval("SELECT gateway_acquire('gw-1', $1)", TTL)
        assert fresh == stale + 1
        row = await old.fetchrow(
            "SELECT * FROM gateway_hello('gw-1', $1, 'n1', 'n1-serial', 'b1', 'j1', 'worker', "
            "'1.0.0', 1, 'grpc', false, 0, 0, '', '90s', NULL, gen_random_uuid(), NULL, NULL, NULL)",
            stale,
        )
        assert row["outcome"] == "lease-gone" and row["epoch"] is None
        assert not await old.fetchval("SELECT gateway_renew('gw-1', $1, $2)", stale, TTL)
        assert not await old.fetchval("SELECT gateway_drain('gw-1', $1, true)", stale)
        assert not await old.fetchval("SELECT gateway_release('gw-1', $1)", stale)
        proof = fleet.proven(_hello("n1"), "gw-1").proof  # n1's daemon proves its Hello
        assert proof is not None
        row = await new.fetchrow(
            "SELECT * FROM gateway_hello('gw-1', $1, 'n1', 'n1-serial', 'b1', 'j1', 'worker', "
            "'1.0.0', 1, 'grpc', false, 0, 0, '', '90s', NULL, gen_random_uuid(), $2, $3, $4)",
            fresh,
            proof.at,
            proof.nonce,
            proof.mac,
        )
        assert (row["outcome"], row["epoch"]) == ("opened", 1)
        assert not await old.fetchval(
            "SELECT gateway_close('gw-1', $1, 'n1', 1, 'x')", stale
        )  # the old incarnation cannot end the new one's session
    assert await db.fetchval("SELECT gateway_id FROM node_sessions WHERE node_id = 'n1'") == "gw-1"
    assert await db.fetchval("SELECT draining FROM gateways WHERE gateway_id = 'gw-1'") is False


async def test_a_login_bound_to_no_gateway_may_do_nothing(
    logins: dict[str, str], db: asyncpg.Connection
) -> None:
    await db.execute("DELETE FROM gateway_logins WHERE login = $1", login_of("bcw_gateway_bound"))
    async with _connected(logins["bcw_gateway_bound"]) as conn:
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="bound to no gateway"):
            await conn.fetchval("SELECT gateway_acquire('gw-1', $1)", TTL)
    assert await db.fetchval("SELECT count(*) FROM gateways") == 0


async def test_bcw_auth_db_binds_and_unbinds_logins(
    database_url: str, logins: dict[str, str], db: asyncpg.Connection
) -> None:
    login = login_of("bcw_gateway_bound")
    code, out = await bcw(
        "auth",
        "db",
        "--bind",
        f"{login}=gw-7",
        "--bind",
        f"{login_of('bcw_reader')}=gw-8",
        BCW_DATABASE_URL=database_url,
    )
    assert code == 0, out
    assert f"{login:<24} acts as gw-7\n" in out
    assert "acts as gw-8  (not IN ROLE bcw_gateway_bound: cannot act)" in out
    async with _connected(logins["bcw_gateway_bound"]) as conn:
        assert await conn.fetchval("SELECT gateway_acquire('gw-7', $1)", TTL) == 1
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.fetchval("SELECT gateway_acquire('gw-1', $1)", TTL)
    code, out = await bcw("auth", "db", "--unbind", login, BCW_DATABASE_URL=database_url)
    assert code == 0 and login not in out, out
    for bad in ("nobody_t=gw-1", f"{login}=not a gateway", "no-equals"):
        code, out = await bcw("auth", "db", "--bind", bad, BCW_DATABASE_URL=database_url)
        assert code == 2 and len(out.strip().splitlines()) == 1, out
    assert (
        "CREATE ROLE nobody_t"
        in (await bcw("auth", "db", "--bind", "nobody_t=gw-1", BCW_DATABASE_URL=database_url))[1]
    )
    rows = await db.fetch("SELECT login, gateway_id FROM gateway_logins ORDER BY 1")
    assert [tuple(r) for r in rows] == [(login_of("bcw_reader"), "gw-8")]
    code, out = await bcw(
        "auth", "db", "--bind", f"{login}=gw-1", BCW_DATABASE_URL=logins["bcw_gateway_bound"]
    )
    assert code != 0 and "Traceback" not in out, out  # only the owner binds


async def test_gw2_with_its_own_key_and_login_changes_nothing_of_gw1s(
    keys: Path, secured: str, logins: dict[str, str], database_url: str, db: asyncpg.Connection
) -> None:
    """The whole attacker: gw-2 with its own nkey (on a server that admits only the
    principals) and its own database login. gw-1 holds n1; gw-2 forges every kind of fact
    about it on its own subjects (each counted foreign by the workers, each changing
    nothing; its flush naming n1 earns gw-2 a zombie notice, not a fresher n1), tries gw-1's subjects (refused by the server) and, in the database, gw-1's
    lease and session (refused), and closes n1 as itself (finds nothing)."""
    code, output = await bcw(
        "provision",
        BCW_NATS_URL=secured,
        BCW_NATS_NKEY_SEED_FILE=str(keys / "admin.nk"),
        BCW_NATS_GATEWAYS="gw-1,gw-2",  # their notices consumers: a gateway makes none
    )
    assert code == 0, output
    await _bind(db, "gw2_login_t", "gw-2")
    await fleet.join(db, "n1")
    base = make_settings(secured, database_url, SUBJECTS)
    await provision_consumers(keys, secured, base)  # the workers' settings: they bind
    async with contextlib.AsyncExitStack() as stack:
        runtimes = []
        for name in sorted(WORKERS):
            settings = base.model_copy(update={"nats": nats_as(keys, secured, f"worker-{name}")})
            runtime, _port = await stack.enter_async_context(
                running(settings, [WORKERS[name](settings)])
            )
            runtimes.append(runtime)
        gw1 = await _gateway(stack, "gw-1", logins["bcw_gateway_bound"], keys, secured)
        gw2 = await _gateway(
            stack, "gw-2", url_as(logins["bcw_gateway_bound"], "gw2_login_t"), keys, secured
        )
        stream = RecordingStream()
        welcome = await fleet.say_hello(gw1, _hello("n1"), stream)
        command = await db.fetchval("SELECT enqueue_command('n1', 'noop', '{}')")
        await eventually(lambda: already(len(stream.delivered) >= 1), what="the dispatch")

        async def hello_applied() -> bool:  # applied, or nothing to do (the quarantine's)
            settled = {**counted(runtimes, "applied"), **counted(runtimes, "ignored")}
            return sum(1 for (_w, t) in settled if t == "hello") == 4

        await eventually(hello_applied, what="gw-1's Hello applied by the four Hello workers")
        before = await state(db)
        seen = await db.fetchval("SELECT last_seen FROM node_sessions WHERE node_id = 'n1'")

        async with client_as(keys, secured, "gateway-gw-2") as (nc, errors):
            js = nc.jetstream(timeout=5.0)
            for fact in forged_facts("gw-2", "gw-1", welcome.epoch, command):
                await publish_fact(js, SUBJECTS, fact)
            flush = make_fact(  # "n1 was seen just now", by a gateway that does not hold it
                "liveness",
                gateway_id="gw-2",
                entries=[{"node_id": "n1", "epoch": welcome.epoch, "age_ms": 0}],
            )
            await publish_fact(js, SUBJECTS, flush)
            await nc.publish(SUBJECTS.fact("gw-1", "closed"), b"{}")  # gw-1's own subject
            await nc.flush()
            await eventually(lambda: violated(errors, "Publish"), what="gw-1's subject refused")
        await eventually(
            lambda: already(counted(runtimes, "foreign") == FOREIGN), what="all foreign"
        )
        await eventually(  # the flush matched nothing: gw-2 is told it holds no n1
            lambda: _notices(secured, keys, "gw-2"), what="a zombie notice to gw-2"
        )

        lease1, lease2 = gw1.lease_epoch, gw2.lease_epoch
        async with _connected(url_as(logins["bcw_gateway_bound"], "gw2_login_t")) as conn:
            for sql, args in [
                ("SELECT gateway_close('gw-1', $1, 'n1', $2, 'x')", (lease1, welcome.epoch)),
                ("SELECT gateway_renew('gw-1', $1, '1 hour')", (lease1,)),
                ("SELECT gateway_acquire('gw-1', '15 s')", ()),
            ]:
                with pytest.raises(asyncpg.InsufficientPrivilegeError, match="gw-2 only"):
                    await conn.fetchval(sql, *args)
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute("UPDATE node_sessions SET gateway_id = 'gw-2'")
            assert not await conn.fetchval(
                "SELECT gateway_close('gw-2', $1, 'n1', $2, 'x')", lease2, welcome.epoch
            )
        assert await state(db) == before  # session, labels, certificates, commands, events
        assert await db.fetchval("SELECT last_seen FROM node_sessions WHERE node_id = 'n1'") == seen
        assert not await _notices(secured, keys, "gw-1")  # nothing told gw-1 to drop n1
        assert len(stream.delivered) == 1 and gw1.alive and "n1" in gw1.sessions
        assert counted(runtimes, "foreign") == FOREIGN  # nothing more, nothing less


async def _bind(db: asyncpg.Connection, login: str, gateway: str) -> None:
    with contextlib.suppress(asyncpg.DuplicateObjectError):
        await db.execute(f"CREATE ROLE {login} LOGIN IN ROLE bcw_gateway_bound")
    await store.bind(db, login, gateway)


async def _gateway(
    stack: contextlib.AsyncExitStack, gateway_id: str, database: str, keys: Path, url: str
) -> Gateway:
    """A started reference gateway logged in as itself, to the database and the bus."""
    pool = await asyncpg.create_pool(database, min_size=1, max_size=2)
    stack.push_async_callback(pool.close)
    nc = await connection.connect(nats_as(keys, url, f"gateway-{gateway_id}"), name=gateway_id)
    stack.push_async_callback(nc.close)
    gateway = Gateway(gateway_id, pool, nc, SUBJECTS)
    await gateway.start(autotick=None)
    stack.push_async_callback(gateway.stop, False)
    return gateway


async def _notices(url: str, keys: Path, gateway: str) -> bool:
    """Whether a zombie notice was sent to `gateway` (read as admin)."""
    nc = await connection.connect(nats_as(keys, url, "admin"), name="reader")
    try:
        messages = await stream_messages(nc.jetstream(), SUBJECTS.gateway_stream)
    finally:
        await nc.close()
    return any(m.subject == SUBJECTS.notice(gateway, "zombie") for m in messages)
