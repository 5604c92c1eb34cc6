"""The replay dispatcher on real servers, rule by rule (the model-based test is in
test_replay_model.py). Handlers run in real transactions; the dispatch round is the one
the leased loop runs."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas.subjects import Subjects
from tests.conftest import Clock, Servers
from tests.factories import make_fact
from tests.integration import fleet
from tests.integration.direct import apply, of_type, take_outbox
from tests.integration.driver import Driver, driving
from tests.integration.support import eventually, make_settings, running
from tests.integration.workers.replay_steps import (
    WORKER,
    dispatch,
    enqueue,
    hello,
    states,
)
from workers import replay
from workers.replay.holds import HoldMetrics
from workers.replay.settings import ReplaySettings
from workers.settings import Settings


async def test_dispatch_in_seq_order_within_credits_to_the_current_route(
    db: asyncpg.Connection, pool: asyncpg.Pool, subjects: Subjects
) -> None:
    await fleet.session(db, "n1", epoch=1, gateway_id="gw-7")
    for _ in range(5):
        await enqueue(db, "n1")
    await enqueue(db, "n1", lane="system")
    assert await dispatch(pool, subjects, credits=3) == 4
    assert await states(db) == [
        (1, "dispatched", 1, 1),
        (2, "dispatched", 1, 1),
        (3, "dispatched", 1, 1),
        (4, "pending", None, 0),
        (5, "pending", None, 0),
        (6, "dispatched", 1, 1),
    ]
    notices = of_type(await take_outbox(db), "dispatch")
    assert [(n["seq"], n["epoch"], n["attempt"], n["_subject"]) for n in notices] == [
        (1, 1, 1, subjects.notice("gw-7", "dispatch")),
        (2, 1, 1, subjects.notice("gw-7", "dispatch")),
        (3, 1, 1, subjects.notice("gw-7", "dispatch")),
        (6, 1, 1, subjects.notice("gw-7", "dispatch")),
    ]
    assert await dispatch(pool, subjects, credits=3) == 0  # no credit left in the default lane


async def test_nothing_is_dispatched_to_a_disconnected_node(
    db: asyncpg.Connection, pool: asyncpg.Pool, subjects: Subjects
) -> None:
    await fleet.session(db, "n1", epoch=1, gateway_id=None)
    await enqueue(db, "n1")
    assert await dispatch(pool, subjects) == 0
    assert await states(db) == [(1, "pending", None, 0)]


async def test_replay_moves_in_flight_commands_and_resends_in_seq_order(
    db: asyncpg.Connection, pool: asyncpg.Pool, subjects: Subjects
) -> None:
    await fleet.session(db, "n1", epoch=1)
    ids = [await enqueue(db, "n1") for _ in range(4)]
    await dispatch(pool, subjects)
    await apply(
        db,
        WORKER,
        subjects,
        make_fact("progress", node_id="n1", epoch=1, command_id=str(ids[1]), state="running"),
    )
    await apply(  # acked, not yet running: in flight, replayed like a dispatched one
        db,
        WORKER,
        subjects,
        make_fact("progress", node_id="n1", epoch=1, command_id=str(ids[2]), state="acked"),
    )
    await take_outbox(db)
    assert [s[1] for s in await states(db)] == ["dispatched", "running", "acked", "dispatched"]
    await fleet.session(db, "n1", epoch=2, gateway_id="gw-2")  # the node reconnects elsewhere
    await apply(
        db, WORKER, subjects, hello(2, gateway_id="gw-2", running_command_ids=[str(ids[1])])
    )
    assert await states(db) == [
        (1, "dispatched", 2, 2),
        (2, "running", 2, 1),
        (3, "dispatched", 2, 2),
        (4, "dispatched", 2, 2),
    ]
    out = await take_outbox(db)
    assert [(n["seq"], n["epoch"], n["attempt"]) for n in of_type(out, "dispatch")] == [
        (1, 2, 2),
        (3, 2, 2),
        (4, 2, 2),
    ]
    assert {n["_subject"] for n in of_type(out, "dispatch")} == {
        subjects.notice("gw-2", "dispatch")
    }
    assert [e["seq"] for e in of_type(out, "command.replayed")] == [1, 3, 4]


async def test_a_newer_command_waits_for_the_replay_of_older_ones_across_a_delayed_hello(
    db: asyncpg.Connection, pool: asyncpg.Pool, subjects: Subjects
) -> None:
    """The Hello transaction bumped the epoch (the node is connected at once), but its fact
    has not reached the replay worker yet: a command enqueued meanwhile must not overtake
    the older one still in flight at the old epoch."""
    await fleet.session(db, "n1", epoch=1)
    older = await enqueue(db, "n1")
    other_lane = await enqueue(db, "n1", lane="system")
    assert await dispatch(pool, subjects) == 2
    await take_outbox(db)
    await fleet.session(db, "n1", epoch=2, gateway_id="gw-2")  # bumped; the fact is late
    newer = await enqueue(db, "n1")
    also = await enqueue(db, "n1", lane="bulk")  # a lane with nothing in flight goes on
    assert await dispatch(pool, subjects) == 1
    sent = [n["command_id"] for n in of_type(await take_outbox(db), "dispatch")]
    assert sent == [str(also)]
    await apply(db, WORKER, subjects, hello(2, gateway_id="gw-2"))  # the Hello fact arrives
    assert await dispatch(pool, subjects) == 1
    out = of_type(await take_outbox(db), "dispatch")
    sent = [(n["command_id"], n["epoch"], n["attempt"]) for n in out]
    assert sorted(sent[:2]) == sorted([(str(older), 2, 2), (str(other_lane), 2, 2)])  # replayed
    assert sent[2:] == [(str(newer), 2, 1)]  # then the newer one, by the dispatch loop


async def test_dispatch_waits_for_a_concurrent_hello_and_routes_to_its_epoch(
    db: asyncpg.Connection, pool: asyncpg.Pool, subjects: Subjects
) -> None:
    await fleet.session(db, "n1", epoch=1)
    await enqueue(db, "n1")
    bump = db.transaction()
    await bump.start()  # a Hello transaction, mid-bump: the row is locked FOR UPDATE
    await db.execute("UPDATE node_sessions SET session_epoch = 2, gateway_id = 'gw-2'")
    round_ = asyncio.create_task(dispatch(pool, subjects))
    await asyncio.sleep(0.5)
    assert not round_.done()  # FOR SHARE waits for the bump
    await bump.commit()
    assert await asyncio.wait_for(round_, 10) == 1
    assert await states(db) == [(1, "dispatched", 2, 1)]
    [notice] = of_type(await take_outbox(db), "dispatch")
    assert (notice["epoch"], notice["_subject"]) == (2, subjects.notice("gw-2", "dispatch"))


async def test_dispatch_honours_the_credits_the_daemons_heartbeats_report(
    db: asyncpg.Connection, pool: asyncpg.Pool, subjects: Subjects
) -> None:
    await fleet.session(db, "n1", epoch=1)
    await db.execute("""UPDATE node_sessions SET lane_credits = '{"default": 2}'""")
    ids = [await enqueue(db, "n1") for _ in range(5)]
    await enqueue(db, "n1", lane="bulk")  # not reported: BCW_REPLAY_CREDITS (8)
    assert await dispatch(pool, subjects) == 3  # 2 of 5 in the default lane, the bulk one
    assert [s for _, s, _, _ in await states(db)][:5] == ["dispatched"] * 2 + ["pending"] * 3
    await apply(
        db,
        WORKER,
        subjects,
        make_fact("progress", node_id="n1", epoch=1, command_id=str(ids[0]), state="running"),
    )
    await db.execute("""UPDATE node_sessions SET lane_credits = '{"default": 1}'""")
    # the daemon holds 1 (running) and has 1 free: capacity 2, both in flight already
    assert await dispatch(pool, subjects) == 0
    await db.execute("""UPDATE node_sessions SET lane_credits = '{"default": 3}'""")
    assert await dispatch(pool, subjects) == 2  # capacity 1 + 3 = 4: two more


async def test_a_session_held_for_the_quarantine_gets_nothing_until_released(
    db: asyncpg.Connection, pool: asyncpg.Pool, subjects: Subjects
) -> None:
    await fleet.session(db, "n1", epoch=1, boot_id="boot-a")
    first = await enqueue(db, "n1")
    await dispatch(pool, subjects)
    await take_outbox(db)
    # another machine says Hello while the first session is live: held (the Hello
    # transaction sets it), and its fact reaches the replay before the quarantine counted it
    await fleet.session(db, "n1", epoch=2, boot_id="boot-b")
    await db.execute("UPDATE node_sessions SET held_epoch = 2")
    second = await enqueue(db, "n1")
    clone = hello(
        2,
        boot_id="boot-b",
        previous={
            "epoch": 1,
            "gateway_id": "gw-1",
            "boot_id": "boot-a",
            "journal_id": "journal-1",
            "live": True,
        },
    )
    await apply(db, WORKER, subjects, clone)
    assert [s for _, s, _, _ in await states(db)] == ["pending", "pending"]
    assert of_type(await take_outbox(db), "dispatch") == []
    assert await dispatch(pool, subjects) == 0  # held: nothing for it
    await db.execute("UPDATE node_sessions SET held_epoch = NULL")  # the quarantine counted it
    assert await dispatch(pool, subjects) == 2
    sent = [n["command_id"] for n in of_type(await take_outbox(db), "dispatch")]
    assert sent == [str(first), str(second)]  # in seq order


async def test_no_dispatch_to_a_gateway_whose_lease_expired(
    db: asyncpg.Connection, pool: asyncpg.Pool, subjects: Subjects
) -> None:
    await fleet.gateway(db, "gw-7", expires_in=timedelta(seconds=-1))
    await fleet.session(db, "n1", epoch=1, gateway_id="gw-7")
    await enqueue(db, "n1")
    assert await dispatch(pool, subjects) == 0
    assert of_type(await take_outbox(db), "dispatch") == []
    await fleet.gateway(db, "gw-7", expires_in=timedelta(seconds=30))  # renewed
    assert await dispatch(pool, subjects) == 1
    assert [n["_subject"] for n in of_type(await take_outbox(db), "dispatch")] == [
        subjects.notice("gw-7", "dispatch")
    ]


async def test_the_worker_dispatches_enqueued_commands_by_itself(
    servers: Servers, nc: NATS, subjects: Subjects, database_url: str, db: asyncpg.Connection
) -> None:
    """End to end: enqueue → NOTIFY → the leased loop → outbox → the gateway's subject."""
    await fleet.session(db, "n1", epoch=1, gateway_id="gw-9")
    async with driving(servers, nc, subjects, database_url, replay.build) as drive:
        ids = [await enqueue(db, "n1") for _ in range(3)]
        await eventually(lambda: _dispatched(db, 3), what="three dispatched")
        notices = await drive.published("dispatch", stream="notices")
        assert [n["command_id"] for n in notices] == [str(i) for i in ids]
        assert {n["_subject"] for n in notices} == {subjects.notice("gw-9", "dispatch")}
        await drive.send(
            make_fact(
                "rejected",
                node_id="n1",
                epoch=1,
                command_id=str(ids[0]),
                reason="BUSY",
                gateway_id="gw-9",
            )
        )
        await eventually(
            lambda: _dispatch_count(drive, 4), what="the BUSY command re-dispatched after 1 s"
        )


async def _dispatched(db: asyncpg.Connection, n: int) -> bool:
    return await db.fetchval("SELECT count(*) FROM commands WHERE state = 'dispatched'") == n


async def _dispatch_count(drive: Any, n: int) -> bool:
    return len(await drive.published("dispatch", stream="notices")) >= n


async def test_enqueue_is_safe_under_concurrent_callers_and_listed_by_bcw_commands(
    database_url: str, db: asyncpg.Connection
) -> None:
    import asyncio
    import os
    import sys

    from workers.replay.commands import enqueue_command, list_commands

    await fleet.session(db, "n1", epoch=1)
    pool = await asyncpg.create_pool(database_url, min_size=4, max_size=8)
    try:

        async def one(i: int) -> uuid.UUID:
            async with pool.acquire() as conn:
                return await enqueue_command(conn, "n1", "exec", {"i": i}, lane="l" + str(i % 2))

        ids = await asyncio.gather(*(one(i) for i in range(40)))
    finally:
        await pool.close()
    rows = await list_commands(db, "n1")
    assert [r["seq"] for r in rows] == list(range(1, 41))
    assert {r["command_id"] for r in rows} == set(ids)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "workers.cli",
        "commands",
        "n1",
        "--limit",
        "3",
        env={**os.environ, "BCW_DATABASE_URL": database_url},
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    lines = out.decode().splitlines()
    assert proc.returncode == 0 and len(lines) == 4
    assert lines[1].split()[:3] == ["38", "pending", "-"]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "workers.cli",
        "commands",
        "n1",
        "--limit",
        "2",
        "--json",
        env={**os.environ, "BCW_DATABASE_URL": database_url},
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    parsed = [json.loads(line) for line in out.decode().splitlines()]
    assert [(c["seq"], c["state"], c["session_epoch"]) for c in parsed] == [
        (39, "pending", None),
        (40, "pending", None),
    ]
    assert {c["command_id"] for c in parsed} <= {str(i) for i in ids}


def _with_hold_bound(settings: Settings) -> Settings:
    """Holds bounded at 5 minutes, looked for every 0.2 s."""
    return settings.model_copy(
        update={
            "replay": ReplaySettings(hello_check_interval=0.2, hold_max=timedelta(minutes=5)),
        }
    )


async def test_a_hold_the_quarantine_never_counts_is_released_after_its_bound(
    servers: Servers,
    nc: NATS,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
    clock: Clock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """As of the Hello (docs/contract.md): with the quarantine worker down, a session held
    for it gets its commands once BCW_QUARANTINE_HOLD_MAX has passed since it connected,
    with a WARNING, a security.node.hold-expired event and a counter."""
    await fleet.session(db, "n1", epoch=1, gateway_id="gw-9")
    await db.execute("UPDATE node_sessions SET held_epoch = 1")  # the Hello transaction held it
    settings = _with_hold_bound(make_settings(servers.nats_url, database_url, subjects))
    async with running(settings, [replay.build(settings)]) as (runtime, _port):
        drive = Driver(nc, subjects, runtime, "replay", database_url)
        command = await enqueue(db, "n1")
        await asyncio.sleep(1)  # several looks: held, and under its bound
        assert await db.fetchval("SELECT state FROM commands") == "pending"
        await clock.advance(timedelta(minutes=5, seconds=1))
        await eventually(lambda: _dispatched(db, 1), what="the released session's command")
        [expired] = await drive.published("security.node.hold-expired")
        assert expired == {
            **expired,
            "nodeId": "n1",
            "epoch": 1,
            "gatewayId": "gw-9",
        }
        assert expired["heldSeconds"] >= 300
        # released on the database's clock (the test's five minutes on), not the host's
        released = datetime.fromisoformat(expired["at"])
        now = await db.fetchval("SELECT compute_now()")
        assert now - timedelta(seconds=30) < released <= now
        [sent] = await drive.published("dispatch", stream="notices")
        assert sent["command_id"] == str(command)
        assert runtime.metrics.of(HoldMetrics).holds_expired.value() == 1
    assert await db.fetchval("SELECT held_epoch FROM node_sessions") is None
    [warning] = [r for r in caplog.records if "BCW_QUARANTINE_HOLD_MAX" in r.getMessage()]
    assert warning.levelname == "WARNING" and "released n1 (epoch 1)" in warning.getMessage()


@pytest.mark.parametrize("why", ["quarantined", "held-for-an-operator", "certificate-revoked"])
async def test_the_hold_bound_never_releases_what_the_quarantine_decided(
    servers: Servers,
    nc: NATS,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
    clock: Clock,
    why: str,
) -> None:
    """The quarantine judged the held session (it quarantined the node, or held the
    revocation for an operator), or its certificate was revoked: past the bound, the
    session stays held and gets nothing; another node's held session is released as
    usual. A revoked certificate's session gets nothing even when not held."""
    await fleet.session(db, "n1", epoch=4, gateway_id="gw-9")
    await fleet.session(db, "n2", epoch=1, gateway_id="gw-9")
    await db.execute("UPDATE node_sessions SET held_epoch = session_epoch")
    await db.execute("UPDATE node_sessions SET cert_serial = node_id || '-serial'")
    if why == "certificate-revoked":
        await db.execute(
            "UPDATE node_certs SET revoked_at = now(), revocation_reason = 'duplicate-identity' "
            "WHERE node_id = 'n1'"
        )
    else:  # the quarantine counted epoch 4's Hello and acted on it (revoking, or holding)
        await db.execute(
            "UPDATE node_sessions SET alternations_judged_epoch = 4 WHERE node_id = 'n1'"
        )
    settings = _with_hold_bound(make_settings(servers.nats_url, database_url, subjects))
    async with running(settings, [replay.build(settings)]) as (runtime, _port):
        mine = await enqueue(db, "n1")
        await enqueue(db, "n2")
        await clock.advance(timedelta(minutes=30))
        await eventually(lambda: _dispatched(db, 1), what="n2's command, its hold expired")
        if why == "certificate-revoked":  # not held any more, still nobody's to send to
            await db.execute("UPDATE node_sessions SET held_epoch = NULL WHERE node_id = 'n1'")
            await db.execute("SELECT wake_dispatch()")
        await asyncio.sleep(1.5)  # several looks and dispatch rounds
        assert await db.fetchval("SELECT state FROM commands WHERE command_id = $1", mine) == (
            "pending"
        )
        assert runtime.metrics.of(HoldMetrics).holds_expired.value() == 1  # n2's only
    held = await db.fetchval("SELECT held_epoch FROM node_sessions WHERE node_id = 'n1'")
    assert held == (None if why == "certificate-revoked" else 4)
