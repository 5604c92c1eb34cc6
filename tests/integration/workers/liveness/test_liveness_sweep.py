"""The liveness controller's sweep on real servers: gateway loss after its grace, stale
sessions, the outage grace, what no transition touches, fencing of a paused ex-leader,
and two replicas of which one sweeps. Time moves with compute_now(), not with sleeps."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from nats.aio.client import Client as NATS
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from schemas.subjects import Subjects
from tests.conftest import Clock, Servers
from tests.integration import fleet
from tests.integration.support import (
    OUTBOX_LEFT,
    OUTBOX_MESSAGES,
    eventually,
    make_settings,
    running,
    stream_messages,
)
from workers import liveness
from workers.liveness.decide import Rules
from workers.liveness.sweep import LEASE, sweep_once
from workers.runtime.store import leases
from workers.tools.explain import HISTORY

S = timedelta(seconds=1)


ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
async def pool(database_url: str):  # type: ignore[no-untyped-def]
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=3)
    yield pool
    await pool.close()


async def _swept_recently(db: asyncpg.Connection, ago: timedelta = timedelta(0)) -> None:
    """As if a sweep ran `ago` before compute_now(), with no grace pending."""
    await db.execute(
        "UPDATE liveness_sweeps SET last_sweep_at = compute_now() - $1::interval, grace_until = NULL",
        ago,
    )


async def _outbox_bodies(db: asyncpg.Connection) -> list[Any]:
    """What the sweep queued for publication (no relay runs in the sweep tests)."""
    return [json.loads(bytes(r["body"])) for r in await db.fetch(OUTBOX_MESSAGES)]


# -- the sweep ---------------------------------------------------------------------------
async def test_gateway_loss_after_120s_not_before_and_not_for_a_moved_session(
    pool: asyncpg.Pool, db: asyncpg.Connection, subjects: Subjects
) -> None:
    await fleet.gateway(db, "gw-119", expires_in=-119 * S)
    await fleet.gateway(db, "gw-121", expires_in=-121 * S)
    await fleet.gateway(db, "gw-live", expires_in=30 * S)
    await fleet.session(db, "on-119", epoch=1, gateway_id="gw-119")
    await fleet.session(db, "on-121", epoch=1, gateway_id="gw-121")
    await fleet.session(
        db, "moved", epoch=2, gateway_id="gw-live"
    )  # was on gw-121, re-homed in the grace
    await _swept_recently(db)
    result = await sweep_once(pool, None, subjects, Rules())
    assert (result.gateway_lost, result.stale) == (1, 0)
    assert await fleet.routing(db, "on-121") == (1, None, "gateway-lost")
    assert await fleet.routing(db, "on-119") == (1, "gw-119", None)
    assert await fleet.routing(db, "moved") == (2, "gw-live", None)


async def test_stale_after_45s_not_at_44s(
    pool: asyncpg.Pool, db: asyncpg.Connection, subjects: Subjects
) -> None:
    await fleet.session(db, "seen-44", epoch=1, seen_ago=44 * S)
    await fleet.session(db, "seen-46", epoch=1, seen_ago=46 * S)
    await fleet.session(
        db, "gone", epoch=1, gateway_id=None, seen_ago=3600 * S
    )  # already disconnected
    await fleet.flushed(db, "gw-1")  # gw-1 keeps flushing; seen-46 is not in its flushes
    await _swept_recently(db)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    result = await sweep_once(pool, None, subjects, Rules(), provider.get_tracer("t"))
    assert result.stale == 1
    assert await fleet.routing(db, "seen-46") == (1, None, "liveness-timeout")
    assert await fleet.routing(db, "seen-44") == (1, "gw-1", None)
    [body] = await _outbox_bodies(db)
    assert (body["nodeId"], body["reason"], body["gatewayId"], body["epoch"]) == (
        "seen-46",
        "liveness-timeout",
        "gw-1",
        1,
    )
    # no fact says it: disconnected when the sweep decided it, as the row says it
    row_at = await db.fetchval(
        "SELECT disconnected_at FROM node_sessions WHERE node_id = 'seen-46'"
    )
    assert datetime.fromisoformat(body["disconnectedAt"]) == row_at
    # the sweep that announced it is a span, and the node's history names its trace
    [sweep] = [s for s in exporter.get_finished_spans() if s.name == "liveness sweep"]
    assert sweep.attributes is not None and sweep.attributes["bcw.sweep.liveness_timeout"] == 1
    history = await db.fetchrow(f"SELECT what, trace_id, worker FROM {HISTORY}")
    assert tuple(history) == ("node.disconnected", f"{sweep.context.trace_id:032x}", "liveness")
    assert (await sweep_once(pool, None, subjects, Rules(), provider.get_tracer("t"))).stale == 0
    assert len([s for s in exporter.get_finished_spans() if s.name == "liveness sweep"]) == 1


async def test_a_dead_gateways_sessions_wait_for_the_gateway_loss_rule(
    pool: asyncpg.Pool, db: asyncpg.Connection, subjects: Subjects
) -> None:
    """Nobody flushes a dead gateway's sessions: their age says nothing, the grace decides."""
    await fleet.gateway(db, "gw-dead", expires_in=-60 * S)
    await fleet.session(db, "n1", epoch=1, gateway_id="gw-dead", seen_ago=75 * S)
    await _swept_recently(db)
    assert (await sweep_once(pool, None, subjects, Rules())).stale == 0
    await db.execute(
        "UPDATE gateways SET lease_expires_at = compute_now() - interval '121 seconds'"
    )
    await _swept_recently(db)
    assert (await sweep_once(pool, None, subjects, Rules())).gateway_lost == 1
    assert await fleet.routing(db, "n1") == (1, None, "gateway-lost")


@pytest.mark.parametrize(("outage", "transitions"), [(19, True), (21, False)])
async def test_an_outage_over_20s_holds_age_transitions(
    pool: asyncpg.Pool, db: asyncpg.Connection, subjects: Subjects, outage: int, transitions: bool
) -> None:
    await fleet.session(db, "n1", epoch=1, seen_ago=60 * S)
    await fleet.flushed(db, "gw-1")
    await _swept_recently(db, ago=outage * S)
    result = await sweep_once(pool, None, subjects, Rules())
    assert result.age_transitions is transitions
    assert (await fleet.routing(db, "n1"))[1] == (None if transitions else "gw-1")


async def test_the_five_minute_grace_holds_and_then_ends(
    pool: asyncpg.Pool, db: asyncpg.Connection, subjects: Subjects, clock: Clock
) -> None:
    await fleet.session(db, "n1", epoch=1, seen_ago=60 * S)
    await fleet.gateway(db, "gw-dead", expires_in=-600 * S)
    await fleet.session(db, "n2", epoch=1, gateway_id="gw-dead", seen_ago=0 * S)
    await _swept_recently(db, ago=60 * S)  # the controller was down for a minute
    elapsed = timedelta(0)
    while elapsed < timedelta(minutes=5):  # sweeping every 10 s: no new outage
        result = await sweep_once(pool, None, subjects, Rules())
        assert not result.age_transitions and result.stale == result.gateway_lost == 0, elapsed
        await clock.advance(10 * S)
        elapsed += 10 * S
    await fleet.flushed(db, "gw-1")  # gw-1 flushes (n1 is not in them)
    result = await sweep_once(pool, None, subjects, Rules())
    assert result.age_transitions and (result.gateway_lost, result.stale) == (1, 1)


async def test_no_transition_touches_commands_or_labels(
    pool: asyncpg.Pool, db: asyncpg.Connection, subjects: Subjects
) -> None:
    await fleet.gateway(db, "gw-dead", expires_in=-600 * S)
    await fleet.session(db, "n1", epoch=1, seen_ago=600 * S)
    await fleet.session(db, "n2", epoch=1, gateway_id="gw-dead")
    for node in ("n1", "n2"):
        await db.execute("SELECT enqueue_command($1, 'exec', '{}')", node)
        await db.execute(
            "UPDATE commands SET state = 'running', session_epoch = 1 WHERE node_id = $1 AND seq = 1",
            node,
        )
        await db.execute("SELECT enqueue_command($1, 'exec', '{}')", node)
        await db.execute(
            "INSERT INTO node_labels VALUES ($1, 'bc.dev/cap.x', '1', 'system'), ($1, 'team', 'a', 'operator')",
            node,
        )
    await db.execute("UPDATE node_sessions SET capabilities = '{x}'")
    snapshot = "SELECT (SELECT json_agg(c ORDER BY command_id) FROM commands c)::text, (SELECT json_agg(l ORDER BY node_id, key) FROM node_labels l)::text, (SELECT json_agg(s.capabilities ORDER BY node_id) FROM node_sessions s)::text"
    before = await db.fetchrow(snapshot)
    await fleet.flushed(db, "gw-1")
    await _swept_recently(db)
    result = await sweep_once(pool, None, subjects, Rules())
    assert (result.gateway_lost, result.stale) == (1, 1)
    assert await db.fetchrow(snapshot) == before


async def test_a_paused_ex_leaders_sweep_is_fenced_out(
    pool: asyncpg.Pool, db: asyncpg.Connection, subjects: Subjects, clock: Clock
) -> None:
    await fleet.session(db, "n1", epoch=1, seen_ago=600 * S)
    await _swept_recently(db)
    old = await leases.try_acquire(db, LEASE, "a", 15 * S)
    assert old is not None
    await clock.advance(16 * S)  # a paused past its lease; b takes over
    new = await leases.try_acquire(db, LEASE, "b", 15 * S)
    assert new is not None and new.epoch == old.epoch + 1
    await fleet.flushed(db, "gw-1")
    with pytest.raises(leases.LeaseLost):
        await sweep_once(pool, old, subjects, Rules())
    assert (await fleet.routing(db, "n1"))[1] == "gw-1"  # a's writes matched nothing
    assert await db.fetchval(OUTBOX_LEFT) == 0
    await sweep_once(pool, new, subjects, Rules())
    assert (await fleet.routing(db, "n1"))[1] is None


async def test_two_replicas_sweep_once_and_the_standby_takes_over_when_the_leader_is_killed(
    servers: Servers, nc: NATS, subjects: Subjects, database_url: str, db: asyncpg.Connection
) -> None:
    env = {
        **os.environ,
        "BCW_DATABASE_URL": database_url,
        "BCW_NATS_URL": servers.nats_url,
        "BCW_SUBJECT_ROOT": subjects.root,
        "BCW_HEALTH_PORT": "0",
        "BCW_LIVENESS_SWEEP_INTERVAL": "0.2",
        "BCW_LIVENESS_LEASE_TTL": "2",
        "BCW_INSTANCE": "leader",
        # 20 sessions of one gateway going stale at once would trip the fleet breaker
        "BCW_LIVENESS_BREAKER_SHARE": "1",
    }
    await fleet.flushed(db, "gw-1")
    await _swept_recently(db)
    leader = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "workers.cli",
        "run",
        "liveness",
        env=env,
        cwd=ROOT,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        await eventually(lambda: _holder(db, "leader"), what="the leader holding the lease")
        settings = make_settings(servers.nats_url, database_url, subjects).model_copy(
            update={
                "instance": "standby",
                "liveness": make_settings(
                    servers.nats_url, database_url, subjects
                ).liveness.model_copy(
                    update={"sweep_interval": 0.2, "lease_ttl": 2 * S, "breaker_share": 1.0}
                ),
            }
        )
        async with running(settings, [liveness.build(settings)]) as (runtime, _port):
            for i in range(20):
                await fleet.session(db, f"a{i}", epoch=1, seen_ago=600 * S)
            await eventually(lambda: _disconnected(db, 20), what="the leader's transitions")
            leader.send_signal(signal.SIGKILL)
            await leader.wait()
            for i in range(20):
                await fleet.session(db, f"b{i}", epoch=1, seen_ago=600 * S)
            await eventually(
                lambda: _holder(db, "standby"), within=10, what="the standby taking over"
            )
            await eventually(
                lambda: _disconnected(db, 40), within=10, what="the standby's transitions"
            )
            await eventually(lambda: _outbox_empty(db), what="outbox drained")
            swept = [  # the sweeps it led, each timed (bcw_liveness_sweep_seconds)
                sample.value
                for family in text_string_to_metric_families(runtime.metrics.render())
                for sample in family.samples
                if sample.name == "bcw_liveness_sweep_seconds_count"
            ]
            assert swept and swept[0] >= 1
        events = await stream_messages(nc.jetstream(), subjects.events_stream)
        assert sorted(m.data for m in events) == sorted(set(m.data for m in events))  # each once
        assert len(events) == 40
    finally:
        if leader.returncode is None:
            leader.kill()
            await leader.wait()


async def _holder(db: asyncpg.Connection, name: str) -> bool:
    holder = await db.fetchval(
        "SELECT holder FROM controller_leases WHERE name = $1 AND expires_at > compute_now()", LEASE
    )
    return holder == name


async def _disconnected(db: asyncpg.Connection, n: int) -> bool:
    return (
        await db.fetchval(
            "SELECT count(*) FROM node_sessions WHERE disconnect_reason = 'liveness-timeout'"
        )
        == n
    )


async def _outbox_empty(db: asyncpg.Connection) -> bool:
    return await db.fetchval("SELECT count(*) FROM outbox") == 0
