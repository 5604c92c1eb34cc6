"""A compromised gateway, as an attacker would use it: gw-1's own database login (bound to
gw-1) and the reference gateway's code, but no node's key. The honest gateway gw-2 holds
the fleet, its daemons proving their Hellos. Each test is one finding of the issue "a
compromised gateway cannot reach nodes that never connected to it", played on real
servers, asserting what the honest nodes keep:

- the fleet-wide quarantine run: none revoked when proofs are required, the breaker's few
  at most when they are not;
- the rolled-back probe and the takeover with a command in flight: in `test_takeover.py`;
- a forged flush at a huge epoch in the honest flush's batch (the honest one applies);
- a transaction kept open on a node's row (others' flushes and Hellos go on; the Hello of
  that node is refused within the lock timeout, not queued);
- a connection flood (its login's CONNECTION LIMIT).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas.proof import prove
from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.factories import make_fact
from tests.integration import fleet
from tests.integration.fleet import Provisioned
from tests.integration.security.conftest import url_as
from tests.integration.streams import RecordingStream
from tests.integration.support import (
    eventually,
    make_settings,
    publish_fact,
    running,
    stream_messages,
)
from workers import liveness, quarantine
from workers.gateway import Code, Gateway, HelloRequest, Refused, store
from workers.registry import ROLES
from workers.runtime.bus import streams
from workers.runtime.store import limits, migrate

pytestmark = pytest.mark.slow

NODES = [f"n{i}" for i in range(1, 13)]


def _key(node: str) -> bytes:
    return node.encode().ljust(32, b"k")


def _honest(node: str, boot: str | None = None, keyed: bool = True) -> HelloRequest:
    """The node's own daemon, dialling gw-2 and proving its Hello (when it has a key)."""
    boot = boot or f"{node}-boot"
    proof = prove(_key(node), node, boot, "j1", "gw-2", fleet.rising_at(node)) if keyed else None
    return HelloRequest(
        node_id=node,
        cert_serial=f"{node}-serial",
        role="worker",
        boot_id=boot,
        journal_id="j1",
        proof=proof,
    )


def _forged(node: str, boot: str) -> HelloRequest:
    """gw-1 saying Hello for a node it never held: any boot id, no key to prove it."""
    return HelloRequest(
        node_id=node, cert_serial=f"{node}-serial", role="worker", boot_id=boot, journal_id="j1"
    )


@contextlib.asynccontextmanager
async def _gateways(
    logins: dict[str, str],
    nc: NATS,
    subjects: Subjects,
    db: asyncpg.Connection,
    nodes: list[str],
    keyed: bool = True,
) -> AsyncIterator[tuple[Gateway, Gateway]]:
    """(attacker gw-1, honest gw-2), each under its own bound login; `nodes` joined with
    their keys (none unless `keyed`) and connected to gw-2."""
    await streams.provision_streams(nc.jetstream(), subjects)
    with contextlib.suppress(asyncpg.DuplicateObjectError):
        await db.execute("CREATE ROLE gw2_login_t LOGIN IN ROLE bcw_gateway_bound")
    await store.bind(db, "gw2_login_t", "gw-2")
    for node in nodes:
        await fleet.join(db, node, key=False)
        if keyed:
            await db.execute("SELECT enroll_hello_key($1, $2)", node, _key(node))
    async with contextlib.AsyncExitStack() as stack:
        started = []
        for gateway_id, url in (
            ("gw-1", logins["bcw_gateway_bound"]),
            ("gw-2", url_as(logins["bcw_gateway_bound"], "gw2_login_t")),
        ):
            pool = await asyncpg.create_pool(url, min_size=1, max_size=4)
            stack.push_async_callback(pool.close)
            gateway = Provisioned(gateway_id, pool, nc, subjects)
            await gateway.start(autotick=None)
            stack.push_async_callback(gateway.stop, graceful=False)
            started.append(gateway)
        attacker, honest = started
        for node in nodes:
            await honest.hello(_honest(node, keyed=keyed), RecordingStream())
        yield attacker, honest


async def _sessions(db: asyncpg.Connection) -> list[tuple[object, ...]]:
    rows = await db.fetch(
        "SELECT node_id, session_epoch, gateway_id, boot_id, held_epoch FROM node_sessions "
        "ORDER BY node_id"
    )
    return [tuple(r) for r in rows]


async def _hello_as_gw1(conn: asyncpg.Connection, node: str) -> asyncpg.Record:
    """gw-1's Hello transaction for `node`, by hand, with a guessed boot id and no proof."""
    lease = await conn.fetchval("SELECT gateway_acquire('gw-1', '15s')")
    return await conn.fetchrow(
        "SELECT * FROM gateway_hello('gw-1', $1, $2, $2 || '-serial', 'guess', 'j9', 'worker', "
        "'1.0.0', 1, 'grpc', false, 0, 0, '', '90s', NULL, gen_random_uuid(), NULL, NULL, NULL)",
        lease,
        node,
    )


async def _revoked(db: asyncpg.Connection) -> int:
    return int(await db.fetchval("SELECT count(*) FROM node_certs WHERE revoked_at IS NOT NULL"))


@pytest.mark.parametrize(("policy", "keyed"), [("require", True), ("warn", True), ("warn", False)])
async def test_a_fleet_wide_quarantine_run_revokes_none_or_the_breakers_few(
    servers: Servers,
    logins: dict[str, str],
    nc: NATS,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
    policy: str,
    keyed: bool,
) -> None:
    """gw-1 says Hello for each of twelve nodes it never held, four boot ids each, and
    each honest daemon, kicked, says Hello again to gw-2 (its alternations then come
    through two gateways). With proofs required, every forged Hello is refused: nothing
    moves, nothing is counted or revoked. Without, nodes that prove their Hellos lose
    nothing either: each forged Hello is a takeover attempt, held and said, never counted;
    and for nodes without a key the breaker revokes three at most (the fleet's floor) and
    holds the rest for an operator."""
    await migrate.set_hello_proof(db, policy)
    async with _gateways(logins, nc, subjects, db, NODES, keyed) as (attacker, honest):
        before = await _sessions(db)
        settings = make_settings(servers.nats_url, database_url, subjects)
        async with running(settings, [quarantine.build(settings)]) as (runtime, _port):
            published = forged = 0
            for round_ in range(4):
                for node in NODES:
                    with contextlib.suppress(Refused):
                        await attacker.hello(_forged(node, f"evil-{round_}"), RecordingStream())
                        published += 1
                        forged += 1
                    if policy == "warn":  # the honest daemon was kicked: it comes back
                        with contextlib.suppress(Refused):  # its certificate revoked
                            await honest.hello(_honest(node, keyed=keyed), RecordingStream())
                            published += 1

            async def settled() -> bool:
                facts = runtime.metrics.facts.by_labels()
                return sum(facts.values()) >= published

            await eventually(settled, what=f"{published} Hellos settled by the quarantine")
            if keyed and policy == "warn":  # (a retried fact counts twice in the metric)

                async def all_said() -> bool:
                    said = await db.fetchval(
                        "SELECT count(*) FROM node_alternations WHERE takeover AND gateway_id = 'gw-1'"
                    )
                    events = await stream_messages(nc.jetstream(), subjects.events_stream)
                    unproven = sum(
                        1 for m in events if m.headers["Bc-Type"] == "security.node.unproven-hello"
                    )
                    return bool(said == forged and unproven == forged)

                await eventually(all_said, what=f"{forged} takeover attempts counted and said")
            await asyncio.sleep(0.5)  # its outbox
        events = [
            m.headers["Bc-Type"]
            for m in await stream_messages(nc.jetstream(), subjects.events_stream)
        ]
        if policy == "require":
            assert published == 0  # every forged Hello refused before it changed anything
            assert await _sessions(db) == before
            assert await _revoked(db) == 0
            assert await db.fetchval("SELECT count(*) FROM node_alternations") == 0
            return
        if keyed:  # no downgrade: every forged Hello held and said, none counted or revoked
            assert forged == len(NODES) * 4
            assert await _revoked(db) == 0
            assert await db.fetchval("SELECT count(*) FROM quarantines") == 0
            assert (
                await db.fetchval(
                    "SELECT count(*) FROM node_alternations WHERE takeover AND gateway_id = 'gw-1'"
                )
                == forged
            )
            assert events.count("security.node.unproven-hello") == forged
            assert "security.node.duplicate-session" not in events
            return
        assert 1 <= await _revoked(db) <= 3
        held = await db.fetchval("SELECT count(*) FROM quarantines WHERE held IS NOT NULL")
        assert held >= 1
        assert "security.quarantine.breaker-open" in events
        assert events.count("security.node.quarantined") == await _revoked(db)


async def test_a_forged_flush_at_a_huge_epoch_wins_nothing_over_the_holders(
    servers: Servers,
    logins: dict[str, str],
    nc: NATS,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
) -> None:
    """In one batch: gw-1's entry for n1 at epoch 2^40, then gw-2's at n1's epoch. The
    liveness worker applies gw-2's (the fold is per gateway), so n1 stays seen."""
    async with _gateways(logins, nc, subjects, db, ["n1"]):
        await db.execute("UPDATE node_sessions SET last_seen = compute_now() - interval '1 hour'")
        for gateway, epoch in (("gw-1", 2**40), ("gw-2", 1)):
            await publish_fact(
                nc.jetstream(),
                subjects,
                make_fact(
                    "liveness",
                    gateway_id=gateway,
                    entries=[{"node_id": "n1", "epoch": epoch, "age_ms": 0}],
                ),
            )
        settings = make_settings(servers.nats_url, database_url, subjects)
        async with running(settings, [liveness.build(settings)]):

            async def seen() -> bool:
                return bool(
                    await db.fetchval(
                        "SELECT last_seen > compute_now() - interval '1 minute' FROM node_sessions"
                    )
                )

            await eventually(seen, what="gw-2's entry applied")


async def test_a_lock_kept_open_on_one_nodes_row_holds_back_only_that_node(
    servers: Servers,
    logins: dict[str, str],
    nc: NATS,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
) -> None:
    """gw-1 opens a Hello transaction for n1 (unproven, allowed under warn) and keeps it
    open. gw-2's flush moves n2 and n3 within seconds, a Hello of n2 goes through, and
    the honest Hello of n1 is refused within the lock timeout instead of queueing; once
    gw-1's transaction ends, n1's next flush moves it."""
    await migrate.set_hello_proof(db, "warn")
    nodes = ["n1", "n2", "n3"]
    async with _gateways(logins, nc, subjects, db, nodes) as (_attacker, honest):
        await db.execute("UPDATE node_sessions SET last_seen = compute_now() - interval '1 hour'")
        settings = make_settings(servers.nats_url, database_url, subjects)
        conn = await asyncpg.connect(logins["bcw_gateway_bound"])
        try:
            async with running(settings, [liveness.build(settings)]):
                tx = conn.transaction()
                await tx.start()
                row = await _hello_as_gw1(conn, "n1")
                assert row["outcome"] == "opened"  # n1's row is now locked by gw-1
                started = time.monotonic()
                await _flush(nc, subjects, nodes)
                await eventually(
                    lambda: _seen(db, {"n2", "n3"}), within=8, what="n2 and n3 flushed meanwhile"
                )
                assert time.monotonic() - started < 8
                await honest.hello(_honest("n2", "n2-boot"), RecordingStream())
                started = time.monotonic()
                with pytest.raises(Refused) as refused:
                    await honest.hello(_honest("n1"), RecordingStream())
                assert refused.value.code is Code.UNAVAILABLE
                assert time.monotonic() - started < 5
                assert "n1" not in await _seen_nodes(db)
                await tx.rollback()
                await _flush(nc, subjects, nodes)  # the next flush
                await eventually(lambda: _seen(db, set(nodes)), what="n1 flushed once free")
        finally:
            await conn.close()


async def _flush(nc: NATS, subjects: Subjects, nodes: list[str]) -> None:
    epochs = {n: 1 for n in nodes}
    await publish_fact(
        nc.jetstream(),
        subjects,
        make_fact(
            "liveness",
            gateway_id="gw-2",
            entries=[{"node_id": n, "epoch": e, "age_ms": 0} for n, e in epochs.items()],
        ),
    )


async def _seen_nodes(db: asyncpg.Connection) -> set[str]:
    rows = await db.fetch(
        "SELECT node_id FROM node_sessions WHERE last_seen > compute_now() - interval '1 minute'"
    )
    return {r["node_id"] for r in rows}


async def _seen(db: asyncpg.Connection, nodes: set[str]) -> bool:
    return nodes <= await _seen_nodes(db)


async def test_a_gateway_login_holds_its_connection_limit_and_timeouts(
    logins: dict[str, str], db: asyncpg.Connection
) -> None:
    """`bcw migrate` (and `bcw auth db --bind`) give each gateway login a CONNECTION LIMIT
    and short statement and idle-in-transaction timeouts: a flood of connections is refused
    past the limit, and a worker's login still connects."""
    await migrate.grant(db, ROLES)  # as `bcw migrate` does, now that the logins exist
    gateway = ROLES.LIMITS["bcw_gateway_bound"]
    opened: list[asyncpg.Connection] = []
    try:
        for _ in range(gateway.connections):
            opened.append(await asyncpg.connect(logins["bcw_gateway_bound"]))
        assert await opened[0].fetchval("SHOW statement_timeout") == gateway.statement_timeout
        assert await opened[0].fetchval("SHOW idle_in_transaction_session_timeout") == (
            gateway.idle_in_transaction
        )
        with pytest.raises(asyncpg.TooManyConnectionsError):
            opened.append(await asyncpg.connect(logins["bcw_gateway_bound"]))
        worker = await asyncpg.connect(logins["bcw_liveness"])
        assert await worker.fetchval("SHOW statement_timeout") == limits.WORKER.statement_timeout
        await worker.close()
    finally:
        await asyncio.gather(*(c.close() for c in opened), return_exceptions=True)
    roles = await db.fetch(
        "SELECT rolname, rolconnlimit FROM pg_roles WHERE rolname LIKE 'bcw_%_login_t'"
    )
    for role in roles:
        group = role["rolname"].removesuffix("_login_t")
        if group == "bcw_gateway":  # not asked for: it keeps no grant, and no limit is set
            continue
        assert role["rolconnlimit"] == ROLES.LIMITS[group].connections, group
