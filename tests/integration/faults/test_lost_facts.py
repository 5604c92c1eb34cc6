"""Facts JetStream lost after acknowledging them, as a power loss loses them: the message
is removed from the stream after its PubAck and the server restarted, so it forgets the
message and its id together (a removal alone keeps the id in the duplicate window). Each
repair that docs/durability.md claims is checked here.

What is real: nats-server (restarted), PostgreSQL, the reference gateway, the five
workers in this event loop.
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import timedelta
from typing import Any

import asyncpg
import pytest
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from schemas.subjects import Subjects
from tests.conftest import Clock, Servers
from tests.integration import fleet
from tests.integration.fleet import Provisioned
from tests.integration.gateway.hellos import request
from tests.integration.streams import RecordingStream
from tests.integration.support import eventually, make_settings, running, stream_messages
from workers.demo.run import fresh_sweep_history
from workers.gateway import store
from workers.liveness.settings import LivenessSettings
from workers.registry import WORKERS
from workers.replay import lost
from workers.replay.decide import ASK_AGAIN_FACTOR
from workers.replay.lost import LostHelloSearch
from workers.replay.settings import ReplaySettings
from workers.runtime.base.runtime_settings import ConsumerSettings
from workers.runtime.bus import deadletter, streams
from workers.runtime.bus.streams import ConsumerSpec

pytestmark = pytest.mark.slow


@pytest.fixture
async def js(servers: Servers, nc: NATS, subjects: Subjects) -> JetStreamContext:
    """This test's streams on a server it may restart."""
    if servers.nats is None:
        pytest.skip("the NATS server is given (BCW_TEST_NATS_URL): it cannot be restarted")
    context = nc.jetstream()
    await streams.provision_streams(context, subjects)
    return context


async def _lose_last(js: JetStreamContext, servers: Servers, stream: str, subject: str) -> str:
    """Remove the last message on `subject` and restart the server; its Nats-Msg-Id."""
    msg = await js.get_last_msg(stream, subject)
    await js.delete_msg(stream, msg.seq)
    assert servers.nats is not None
    await asyncio.to_thread(servers.nats.restart)
    return str((msg.headers or {})["Nats-Msg-Id"])


async def _commands(db: asyncpg.Connection) -> list[tuple[Any, ...]]:
    rows = await db.fetch(
        "SELECT state, session_epoch, delivery_attempt FROM commands WHERE node_id = 'n1'"
    )
    return [tuple(r) for r in rows]


async def test_a_lost_hello_is_asked_of_its_gateway_and_everything_it_owes_follows(
    servers: Servers,
    nc: NATS,
    js: JetStreamContext,
    pool: asyncpg.Pool,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
) -> None:
    await fleet.join(db, "n1", serial="n1-serial")
    await fleet.session(db, "n1", epoch=1, gateway_id="gw-a", boot_id="b1", journal_id="j1")
    command = await db.fetchval("SELECT enqueue_command('n1', 'exec', '{}')")
    await db.execute(  # in flight on the previous session
        "UPDATE commands SET state = 'dispatched', session_epoch = 1, delivery_attempt = 1"
    )
    gateway = Provisioned("gw-a", pool, nc, subjects)
    await gateway.start(autotick=0.5)
    daemon = RecordingStream()
    try:
        welcome = await fleet.say_hello(
            gateway, request(boot_id="b1", journal_id="j1", capabilities=["cpu", "nvml"]), daemon
        )
        assert welcome.epoch == 2
        lost = await _lose_last(js, servers, subjects.facts_stream, subjects.fact("gw-a", "hello"))
        assert lost == str(gateway.sessions["n1"].hello.fact_id)  # type: ignore[union-attr]

        settings = make_settings(servers.nats_url, database_url, subjects)
        settings = settings.model_copy(
            update={
                "replay": ReplaySettings(
                    hello_lost_after=timedelta(seconds=2), hello_check_interval=0.5
                )
            }
        )
        async with running(settings, [build(settings) for build in WORKERS.values()]):

            async def replayed() -> bool:
                return await _commands(db) == [("dispatched", 2, 2)] and len(daemon.delivered) == 1

            await eventually(replayed, within=45, what="the in-flight command replayed")

            async def labeled() -> bool:  # the labeler applies the Hello asked again in its turn
                labels = await db.fetchval(
                    "SELECT array_agg(key ORDER BY key) FROM node_labels "
                    "WHERE node_id = 'n1' AND source = 'system'"
                )
                return bool(labels == ["bc.dev/cap.cpu", "bc.dev/cap.nvml"])

            await eventually(labeled, what="the system labels of the Hello asked again")
            asked = await db.fetchrow("SELECT * FROM hello_seen WHERE node_id = 'n1'")
            assert (asked["seen_epoch"], asked["asked_epoch"]) == (2, 2)

            async def announced() -> bool:
                return len(await _events(js, subjects, "node.connected")) == 1

            await eventually(announced, what="node.connected")
            await asyncio.sleep(1.5)  # three more looks: nothing is asked twice
        hellos = await stream_messages(js, subjects.facts_stream, subjects.fact("gw-a", "hello"))
        assert [m.headers["Nats-Msg-Id"] for m in hellos] == [lost]  # the same fact, once
        [replay] = await _events(js, subjects, "command.replayed")
        assert replay["commandId"] == str(command) and replay["attempt"] == 2
        notices = await stream_messages(js, subjects.gateway_stream, None)
        assert [m.subject.rsplit(".", 1)[1] for m in notices] == ["hello-again", "dispatch"]
        assert await deadletter.list_dead_letters(js, subjects) == []
    finally:
        await gateway.stop(graceful=False)


async def _events(js: JetStreamContext, subjects: Subjects, kind: str) -> list[Any]:
    messages = await stream_messages(js, subjects.events_stream, subjects.event(kind))
    return [json.loads(m.data) for m in messages]


async def test_a_lost_flush_is_made_good_by_the_next(
    servers: Servers,
    nc: NATS,
    js: JetStreamContext,
    pool: asyncpg.Pool,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
    clock: Clock,
) -> None:
    gateway = Provisioned("gw-a", pool, nc, subjects)
    await gateway.start()
    try:
        await fleet.join(db, "n1", serial="n1-serial")
        await fleet.say_hello(gateway, request())
        # 30 s pass in the database; the gateway has just heard the daemon (age about 0)
        await clock.advance(timedelta(seconds=30))
        await gateway.flush()
        await _lose_last(js, servers, subjects.facts_stream, subjects.fact("gw-a", "liveness"))
        settings = make_settings(servers.nats_url, database_url, subjects)
        async with running(settings, [WORKERS["liveness"](settings)]):
            await asyncio.sleep(1.0)
            stale = await db.fetchval(
                "SELECT compute_now() - last_seen FROM node_sessions WHERE node_id = 'n1'"
            )
            assert stale >= timedelta(seconds=30)  # the lost flush moved nothing
            await gateway.flush()  # the next period's flush carries the age again

            async def fresh() -> bool:
                age = await db.fetchval(
                    "SELECT compute_now() - last_seen FROM node_sessions WHERE node_id = 'n1'"
                )
                return bool(age < timedelta(seconds=10))

            await eventually(fresh, what="last_seen moved by the next flush")
    finally:
        await gateway.stop(graceful=False)


async def test_a_lost_close_ends_its_session_when_the_silence_is_swept(
    servers: Servers,
    nc: NATS,
    js: JetStreamContext,
    pool: asyncpg.Pool,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
    clock: Clock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worst case: the gateway's own write of the close failed (the database away at
    that moment) and its `closed` fact is lost too."""

    async def not_written(*_args: object) -> bool:
        return False

    monkeypatch.setattr(store, "close_session", not_written)
    now = [time.time()]
    gateway = Provisioned("gw-a", pool, nc, subjects, clock=lambda: now[0])
    await gateway.start(autotick=None)
    try:
        await fleet.join(db, "n1", serial="n1-serial")
        await fleet.say_hello(gateway, request())
        await gateway.disconnect("n1", 1)  # the stream closed; its `closed` fact is lost
        await _lose_last(js, servers, subjects.facts_stream, subjects.fact("gw-a", "closed"))
        settings = make_settings(servers.nats_url, database_url, subjects)
        settings = settings.model_copy(update={"liveness": LivenessSettings(sweep_interval=0.2)})
        await fresh_sweep_history(pool)
        async with running(settings, [WORKERS["liveness"](settings)]):
            await asyncio.sleep(1.0)
            assert await fleet.routing(db, "n1") == (1, "gw-a", None)  # still connected
            # 46 s of silence from the node; its gateway renews its lease and flushes (the
            # liveness controller sees it) all along
            for step in (5,) * 9 + (1,):
                await clock.advance(timedelta(seconds=step))
                now[0] += step
                await gateway.tick()
                await gateway.flush()
                await asyncio.sleep(0.3)

            async def swept() -> bool:
                return await fleet.routing(db, "n1") == (1, None, "liveness-timeout")

            await eventually(swept, what="the silent session swept")
    finally:
        await gateway.stop(graceful=False)


async def test_the_search_for_lost_hellos_reads_what_changed_since_its_last_look(
    js: JetStreamContext,
    subjects: Subjects,
    pool: asyncpg.Pool,
    db: asyncpg.Connection,
    clock: Clock,
) -> None:
    """A fleet at rest costs the search nothing: after a process's first look (every
    session), a look reads the sessions that became old enough since the last one and the
    asks that came due again — through their indexes, not 2,000 sessions at rest — and
    still finds each lost Hello: one of a session that connected after the last look, and
    one asked before it whose time to be asked again came."""
    await streams.ensure_consumer(
        js,
        subjects.facts_stream,
        ConsumerSpec("replay", (subjects.fact_filter("hello"),)),
        ConsumerSettings(),
    )
    await fleet.gateway(db, "gw-1", expires_in=timedelta(days=1))
    await db.execute(
        "SELECT join_node('r' || i, 'worker', 'r-serial-' || i, NULL) FROM generate_series(1, 2000) i"
    )
    await db.execute(
        "UPDATE node_sessions SET session_epoch = 1, gateway_id = 'gw-1', "
        "connected_at = compute_now() - interval '1 day'"
    )
    await db.execute("INSERT INTO hello_seen (node_id, seen_epoch) SELECT node_id, 1 FROM nodes")
    await fleet.session(db, "unseen", epoch=1, gateway_id="gw-1", seen_ago=timedelta(hours=1))
    settings = ReplaySettings()  # lost after 60 s, asked again after 5 min
    search = LostHelloSearch()

    async def look() -> list[str]:
        before = set(await _asked(db))
        await search.ask(pool, js, None, subjects, settings)
        return sorted(node for node, _ in set(await _asked(db)) - before)

    assert await look() == ["unseen"]  # the first look reads every session
    await fleet.session(db, "late", epoch=1, gateway_id="gw-1")
    await clock.advance(timedelta(minutes=2))
    assert await look() == ["late"]  # connected since: in the window
    await clock.advance(timedelta(minutes=4))
    assert await look() == ["unseen"]  # its ask came due again (asked 6 min ago)
    # while a fact waits for the replay worker, looks are skipped and move nothing: a
    # session that connects then is found once the consumer is drained, however late
    await js.publish(subjects.fact("gw-1", "hello"), b"{}")
    since = search.since
    await fleet.session(db, "meanwhile", epoch=1, gateway_id="gw-1")
    await clock.advance(timedelta(hours=1))
    assert await look() == [] and search.since == since
    await js.purge_stream(subjects.facts_stream)
    assert await look() == ["late", "meanwhile", "unseen"]  # the two asked again, and it
    await db.execute("SET plan_cache_mode = force_generic_plan")
    explain = await db.prepare(f"EXPLAIN (ANALYZE, BUFFERS) {lost.CANDIDATES}")
    plan = "\n".join(
        row[0]
        for row in await explain.fetch(
            settings.hello_lost_after, settings.nodes_per_round, search.since, ASK_AGAIN_FACTOR
        )
    )
    assert "node_sessions_connected_at" in plan and "hello_seen_asked_at" in plan, plan
    assert "Seq Scan on node_sessions" not in plan and "Seq Scan on hello_seen" not in plan, plan


async def _asked(db: asyncpg.Connection) -> list[tuple[str, Any]]:
    """(node, when it was asked) of every session asked for its Hello."""
    rows = await db.fetch("SELECT node_id, asked_at FROM hello_seen WHERE asked_at IS NOT NULL")
    return [(r["node_id"], r["asked_at"]) for r in rows]
