"""One database role per worker: each worker runs under a login role that is a member of
its group role only, gets ready and does its job; what another worker's rules write, DDL
and the clock's test hook fail with insufficient privilege."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from datetime import timedelta

import asyncpg
import pytest
from nats.aio.client import Client as NATS
from pydantic import SecretStr

from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration import fleet
from tests.integration.streams import RecordingStream
from tests.integration.support import bcw, eventually, make_settings, running, stream_messages
from workers.gateway import HelloRequest
from workers.registry import ROLES, WORKERS
from workers.runtime.bus import streams
from workers.runtime.store import migrate, retention, roles

GROUPS = tuple(ROLES.GROUPS)


# what each role must not do; every worker may do none of COMMON either
COMMON = [
    "CREATE TABLE intruder (a int)",
    "CREATE TEMP TABLE intruder (a int)",  # nothing may shadow our objects
    "ALTER TABLE node_sessions ADD COLUMN intruder int",
    "SELECT set_compute_now_offset(interval '1 hour')",
    "DELETE FROM node_sessions",
    "DROP TABLE outbox",
    "TRUNCATE processed_facts",
]
FORBIDDEN = {
    "bcw_liveness": [
        "UPDATE commands SET state = 'done'",
        "UPDATE node_sessions SET capabilities = '{x}'",
        "UPDATE node_certs SET revoked_at = now(), revocation_reason = 'x'",
        "UPDATE node_sessions SET session_epoch = 99",
    ],
    "bcw_labeler": [
        "UPDATE commands SET state = 'done'",
        "UPDATE node_certs SET revoked_at = now(), revocation_reason = 'x'",
        "UPDATE node_sessions SET session_epoch = 99",
        "UPDATE node_sessions SET gateway_id = NULL",
        "INSERT INTO hello_seen (node_id, seen_epoch) VALUES ('n1', 9)",
    ],
    "bcw_quarantine": [
        "UPDATE commands SET state = 'done'",
        "UPDATE node_sessions SET capabilities = '{x}'",
        "INSERT INTO node_labels VALUES ('n1', 'k', 'v', 'system')",
        "DELETE FROM node_certs",
    ],
    "bcw_replay": [
        "UPDATE node_sessions SET gateway_id = NULL",
        "UPDATE node_certs SET revoked_at = now(), revocation_reason = 'x'",
        "DELETE FROM commands",
        "UPDATE commands SET payload = '{}'",
        "DELETE FROM hello_seen",
    ],
    "bcw_recorder": [
        "UPDATE node_certs SET revoked_at = now(), revocation_reason = 'x'",
        "UPDATE commands SET state = 'done'",
        "UPDATE node_sessions SET capabilities = '{x}'",
        "DELETE FROM node_labels",
    ],
    "bcw_gateway": [
        "UPDATE commands SET state = 'done'",
        "UPDATE node_certs SET revoked_at = now(), revocation_reason = 'x'",
        "INSERT INTO node_labels VALUES ('n1', 'k', 'v', 'system')",
        "INSERT INTO session_epochs VALUES ('n1', 7, 'gw-x')",
        "INSERT INTO outbox (msg_id, subject, body) VALUES (gen_random_uuid(), 'x', '')",
    ],
    "bcw_gateway_bound": [  # writes through the gateway functions only (test_hostile_gateway)
        "UPDATE node_sessions SET gateway_id = 'gw-1'",
        "UPDATE gateways SET lease_expires_at = now()",
        "INSERT INTO gateways (gateway_id, lease_epoch, lease_expires_at) VALUES ('gw-9', 1, now())",
        "INSERT INTO gateway_logins VALUES (session_user, 'gw-2')",
        "INSERT INTO node_inventory (node_id, section, hash, body, session_epoch, reported_at) "
        "VALUES ('n1', 's', 'h', '{}', 1, now())",
        "SELECT count(*) FROM node_sessions",
        "SELECT gateway_as('gw-2')",
    ],
    "bcw_reader": [
        "UPDATE node_sessions SET last_seen = now()",
        "INSERT INTO outbox (msg_id, subject, body) VALUES (gen_random_uuid(), 'x', '')",
        "DELETE FROM processed_facts",
    ],
    "bcw_relay": [  # the outbox's rows to publish and delete, and nothing else
        "INSERT INTO outbox (msg_id, subject, body) VALUES (gen_random_uuid(), 'x', '')",
        "DELETE FROM processed_facts",
        "UPDATE node_sessions SET last_seen = now()",
        "SELECT count(*) FROM commands",
    ],
    "bcw_operator": [
        "UPDATE node_sessions SET last_seen = now()",
        "UPDATE commands SET state = 'done'",
        "INSERT INTO outbox (msg_id, subject, body) VALUES (gen_random_uuid(), 'x', '')",
        "UPDATE liveness_gateways SET last_flush_at = now()",
    ],
}
CASES = [(g, s) for g in GROUPS for s in [*COMMON, *FORBIDDEN[g]]]


@pytest.mark.parametrize(("group", "statement"), CASES, ids=[f"{g}:{s[:40]}" for g, s in CASES])
async def test_what_a_role_may_not_do_fails(
    logins: dict[str, str], db: asyncpg.Connection, group: str, statement: str
) -> None:
    await fleet.session(db, "n1", epoch=1)
    conn = await asyncpg.connect(logins[group])
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            async with conn.transaction():
                await conn.execute(statement)
    finally:
        await conn.close()


async def test_every_security_definer_function_searches_pg_temp_last(
    db: asyncpg.Connection,
) -> None:
    rows = await db.fetch(
        "SELECT p.oid::regprocedure::text AS fn, p.proconfig FROM pg_proc p"
        " WHERE p.prosecdef AND p.pronamespace = current_schema()::regnamespace"
    )
    assert rows, "the schema has SECURITY DEFINER functions (record_session_epoch)"
    schema = await db.fetchval("SELECT current_schema()")
    for row in rows:
        assert f"search_path={schema}, pg_temp" in (row["proconfig"] or []), row["fn"]


async def test_retention_may_lock_and_delete_what_it_prunes(
    logins: dict[str, str], db: asyncpg.Connection
) -> None:
    """Each worker's login prunes its own old inbox rows (row-level security keeps the
    others' from it) and old session history."""
    old = (
        "INSERT INTO processed_facts (consumer, fact_id, processed_at) "
        "SELECT $2, gen_random_uuid(), now() - interval '1 day' FROM generate_series(1, $1)"
    )
    history = (
        "INSERT INTO session_history (node_id, at, what, worker, detail) "
        "SELECT 'n1', now() - interval '8 days', 'node.connected', $2, '{}' FROM generate_series(1, $1)"
    )
    packs = (
        "INSERT INTO session_history_packs (at, worker, node_ids, whats, epochs, gateway_ids, "
        "fact_ids, trace_ids, details) SELECT now() - interval '8 days', $2, '{n1}', "
        "'{node.connected}', '{1}', '{gw-1}', '{NULL}', '{NULL}', '{\"{}\"}' "
        "FROM generate_series(1, $1)"
    )
    await db.execute(old, 2, "someone-else")
    await db.execute(history, 1, "someone-else")
    await db.execute(packs, 1, "someone-else")
    for worker in sorted(WORKERS):
        await db.execute(old, 6, worker)
        await db.execute(history, 3, worker)
        await db.execute(packs, 2, worker)
        pool = await asyncpg.create_pool(logins[f"bcw_{worker}"], min_size=1, max_size=1)
        try:
            for target in (
                retention.Prunable("processed_facts", "processed_at", timedelta(hours=1)),
                retention.Prunable("session_history", "at", timedelta(days=7)),
                retention.Prunable("session_history_packs", "at", timedelta(days=7)),
            ):
                await retention.prune(pool, target, batch=1, lease=None)
        finally:
            await pool.close()
        left = await db.fetch("SELECT consumer, count(*) FROM processed_facts GROUP BY consumer")
        assert {r["consumer"]: r["count"] for r in left} == {"someone-else": 2}, worker
        for table in ("session_history", "session_history_packs"):
            left = await db.fetch(f"SELECT worker, count(*) FROM {table} GROUP BY worker")
            assert {r["worker"]: r["count"] for r in left} == {"someone-else": 1}, (worker, table)


async def test_migrate_grants_again_and_prints_the_same_grants(database_url: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        # every group but the 0.3 gateways' (a login of which could rebind sessions and
        # move any gateway's lease): created and granted only when asked
        assert await migrate.grant(conn, ROLES, legacy_gateway=True) == list(GROUPS)
        legacy = "has_column_privilege('bcw_gateway', 'node_sessions', 'gateway_id', 'UPDATE')"
        assert await conn.fetchval(f"SELECT {legacy}") is True
        assert await migrate.grant(conn, ROLES) == [g for g in GROUPS if g != "bcw_gateway"]
        assert await conn.fetchval(f"SELECT {legacy}") is False  # it exists, and keeps nothing
        for table in (*ROLES.TABLES, *roles.VIEWS):
            assert not await conn.fetchval(
                "SELECT has_table_privilege('bcw_gateway', $1, 'SELECT')", table
            ), table
        code, printed = await bcw("migrate", "--print-grants")
        assert code == 0 and "bcw_gateway;" not in printed and "TO bcw_gateway " not in printed
        code, printed = await bcw("migrate", "--print-grants", "--legacy-gateway-role")
        assert code == 0 and "ON node_sessions TO bcw_gateway;" in printed
        tables = {
            r["tablename"]
            for r in await conn.fetch(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
            )
        }
        assert tables == set(ROLES.TABLES)  # a new table is classified, never forgotten
        views = await conn.fetch(
            "SELECT viewname FROM pg_views WHERE schemaname = current_schema()"
        )
        assert {r["viewname"] for r in views} == set(roles.VIEWS)  # and a new view
        hook = await conn.fetchval(
            "SELECT has_function_privilege('public', 'set_compute_now_offset(interval)', 'EXECUTE')"
        )
        assert hook is False
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def _pool(url: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await asyncpg.create_pool(url, min_size=1, max_size=4)
    try:
        yield pool
    finally:
        await pool.close()


async def test_each_worker_does_its_job_under_its_own_role(
    logins: dict[str, str],
    servers: Servers,
    nc: NATS,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
) -> None:
    await streams.provision_streams(nc.jetstream(), subjects)
    base = make_settings(servers.nats_url, database_url, subjects)
    await fleet.join(db, "n1")
    command = await db.fetchval("SELECT enqueue_command('n1', 'noop', '{}')")
    async with contextlib.AsyncExitStack() as stack:
        for name in sorted(WORKERS):
            database = base.database.model_copy(update={"url": SecretStr(logins[f"bcw_{name}"])})
            settings = base.model_copy(update={"database": database})
            await stack.enter_async_context(running(settings, [WORKERS[name](settings)]))
        pool = await stack.enter_async_context(_pool(logins["bcw_gateway_bound"]))
        gateway = fleet.Provisioned("gw-1", pool, nc, subjects)
        await gateway.start()
        stack.push_async_callback(gateway.stop, False)
        stream = RecordingStream()

        def hello(boot: str) -> HelloRequest:
            return HelloRequest(
                node_id="n1",
                cert_serial="n1-serial",
                role="worker",
                boot_id=boot,
                journal_id="j1",
                capabilities=["gpu"],
            )

        first = await fleet.say_hello(gateway, hello("b1"), stream)
        await eventually(lambda: _delivered(stream), what="replay: the command dispatched")
        assert stream.delivered[0].command_id == command
        await gateway.events(
            "n1", "j1", [{"seq": 1, "kind": "k", "body": {}, "at": "2026-11-30T00:00:00Z"}]
        )
        await eventually(
            lambda: _one(db, "SELECT acked_event_seq FROM node_sessions"),
            what="recorder: the event recorded and acked",
        )
        await eventually(
            lambda: _one(db, "SELECT count(*) FROM node_labels WHERE key = 'bc.dev/cap.gpu'"),
            what="labeler: the capability label",
        )
        await fleet.say_hello(gateway, hello("b2"))  # another machine while b1 is live
        await eventually(
            lambda: _one(db, "SELECT duplicate_hellos FROM node_sessions"),
            what="quarantine: the alternation counted",
        )
        # epoch 2's (epoch 1's too, unless the liveness worker, late, found epoch 2 first:
        # a stale Hello publishes nothing, DESIGN §6)
        await eventually(
            lambda: _connected_at(nc, subjects, 2),
            what="liveness: node.connected of epoch 2, relayed",
        )
        await eventually(
            lambda: _one(db, "SELECT count(*) FROM controller_leases WHERE name LIKE '%liveness%'"),
            what="liveness: its sweep's lease",
        )
        assert first.epoch == 1
    # leaving the block stops every process; one that died of a refused statement raises


async def _delivered(stream: RecordingStream) -> bool:
    return len(stream.delivered) >= 1


async def _one(db: asyncpg.Connection, sql: str) -> bool:
    return bool(await db.fetchval(sql))


async def _connected_at(nc: NATS, subjects: Subjects, epoch: int) -> bool:
    msgs = await stream_messages(nc.jetstream(), subjects.events_stream)
    return any(
        m.headers
        and m.headers.get("Bc-Type") == "node.connected"
        and json.loads(m.data)["epoch"] == epoch
        for m in msgs
    )


async def test_the_printed_grants_run_as_they_are(
    database_url: str, db: asyncpg.Connection
) -> None:
    code, printed = await bcw(
        "migrate", "--print-grants", BCW_DATABASE_URL="postgresql://nowhere:1/x"
    )
    assert code == 0, printed
    assert "CREATE ROLE bcw_labeler NOLOGIN" in printed
    assert "GRANT UPDATE (capabilities) ON node_sessions TO bcw_labeler;" in printed
    await db.execute(printed)  # what a DBA pastes into psql, twice over
    await db.execute(printed)
    allowed = await db.fetchval(
        "SELECT has_column_privilege('bcw_labeler', 'node_sessions', 'capabilities', 'UPDATE')"
    )
    forbidden = await db.fetchval(
        "SELECT has_column_privilege('bcw_labeler', 'node_sessions', 'session_epoch', 'UPDATE')"
    )
    assert (allowed, forbidden) == (True, False)


#: a row of each table a worker owns rows of; $1 names its worker (a lease: its name)
OWN_ROW = {
    "session_history": "INSERT INTO session_history (node_id, at, what, worker, detail) "
    "VALUES ('n1', now(), 'node.connected', $1, '{}')",
    "session_history_packs": "INSERT INTO session_history_packs (at, worker, node_ids, whats, "
    "epochs, gateway_ids, fact_ids, trace_ids, details) VALUES (now(), $1, '{n1}', "
    "'{node.connected}', '{1}', '{gw-1}', '{NULL}', '{NULL}', '{\"{}\"}')",
    "controller_leases": "INSERT INTO controller_leases (name, holder, epoch, expires_at) "
    "VALUES ($1, 'h', 1, now() + interval '1 hour')",
    "processed_facts": "INSERT INTO processed_facts (consumer, fact_id) "
    "VALUES ($1, gen_random_uuid())",
    "outbox": "INSERT INTO outbox (msg_id, subject, body, worker) "
    "VALUES (gen_random_uuid(), 'bc.x', '', $1)",
    "outbox_packs": "INSERT INTO outbox_packs "
    "(worker, size, msg_ids, subjects, headers, bodies, order_keys) "
    "VALUES ($1, 1, ARRAY[gen_random_uuid()], '{bc.x}', '{\"{}\"}', ARRAY[''::bytea], '{NULL}')",
}


async def test_a_worker_sees_and_changes_only_its_own_runtime_rows(
    logins: dict[str, str], db: asyncpg.Connection
) -> None:
    """Row-level security: the labeler's login reads, writes and deletes its own inbox,
    outbox rows and packs, session history and leases only; another worker's are invisible to it
    and cannot be forged or taken. Its own session history it can neither change nor
    delete before a day has passed (then its retention prunes it)."""
    for worker in ("labeler", "replay"):
        for table, row in OWN_ROW.items():
            await db.execute(row, f"{worker}-loop" if table == "controller_leases" else worker)
    conn = await asyncpg.connect(logins["bcw_labeler"])
    try:
        for table, column in (
            ("outbox", "worker"),
            ("outbox_packs", "worker"),
            ("processed_facts", "consumer"),
            ("session_history", "worker"),
            ("session_history_packs", "worker"),
        ):
            seen = await conn.fetch(f"SELECT {column} FROM {table}")
            assert [r[column] for r in seen] == ["labeler"], table
            assert await conn.execute(f"DELETE FROM {table} WHERE {column} = 'replay'") == (
                "DELETE 0"
            )
        assert await conn.fetchval("SELECT array_agg(name) FROM controller_leases") == [
            "labeler-loop"
        ]
        assert (
            await conn.execute(  # another worker's lease: not to be taken
                "UPDATE controller_leases SET holder = 'me', epoch = epoch + 1 "
                "WHERE name = 'replay-loop'"
            )
            == "UPDATE 0"
        )
        for table, row in OWN_ROW.items():  # another worker's row, forged: refused
            with pytest.raises(asyncpg.InsufficientPrivilegeError, match="row-level security"):
                await conn.execute(row, "liveness" if table == "controller_leases" else "replay")
        await conn.execute(OWN_ROW["processed_facts"], "labeler")  # its own: fine
        for history in ("session_history", "session_history_packs"):
            # its own history is insert-only for a day: neither changed nor erased...
            assert await conn.execute(f"DELETE FROM {history}") == "DELETE 0"
            assert (
                await conn.execute(f"UPDATE {history} SET at = now() - interval '30 days'")
                == "UPDATE 0"
            )
            assert await conn.fetchval(f"SELECT count(*) FROM {history}") == 1
            # ...then its retention may prune it (locked, then deleted, as retention does)
            await db.execute(f"UPDATE {history} SET at = compute_now() - interval '25 hours'")
            with pytest.raises(asyncpg.InsufficientPrivilegeError, match="row-level security"):
                await conn.execute(f"UPDATE {history} SET at = at")  # locked, never changed
            pruned = await conn.execute(
                f"DELETE FROM {history} WHERE ctid = ANY(ARRAY("
                f"SELECT ctid FROM {history} FOR UPDATE SKIP LOCKED))"
            )
            assert pruned == "DELETE 1", history  # its own; the replay's old row stays
    finally:
        await conn.close()
    assert await db.fetchval("SELECT array_agg(worker) FROM session_history") == ["replay"]
    assert await db.fetchval("SELECT array_agg(worker) FROM session_history_packs") == ["replay"]
    assert await db.fetchval("SELECT count(*) FROM outbox WHERE worker = 'replay'") == 1
    assert await db.fetchval("SELECT count(*) FROM outbox_packs WHERE worker = 'replay'") == 1
    assert (
        await db.fetchval("SELECT holder FROM controller_leases WHERE name = 'replay-loop'") == "h"
    )
    relay = await asyncpg.connect(logins["bcw_relay"])
    try:  # a dedicated relay publishes every worker's rows and packs
        assert await relay.fetchval("SELECT count(*) FROM outbox") == 2
        assert await relay.fetchval("SELECT count(*) FROM outbox_packs") == 2
    finally:
        await relay.close()
