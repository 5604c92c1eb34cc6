"""Liveness that knows when it is blind: a bus outage, a stopped controller or a silent
gateway is never a dead fleet; the fleet breaker holds a wholesale disconnect.

What is real: nats-server, PostgreSQL, reference gateways publishing their flushes (every
second here, empty ones included), the liveness worker on the real runtime, TCP proxies
that cut the controller's or a gateway's bus link. Sessions are kept alive by
heartbeats into the gateways, as daemons do. Periods are short through the liveness
settings (heartbeat 3 x 1 s + flush 1 s: stale after 4 s; blind after 2 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import nats
import pytest
from nats.aio.client import Client as NATS

from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration import fleet
from tests.integration.heartbeats import (
    GATEWAY_SETTINGS,
    Fleet,
    HeldStop,
    both_seen,
    liveness_settings,
)
from tests.integration.heartbeats import seen as _seen
from tests.integration.support import (
    OUTBOX_MESSAGES,
    bcw,
    eventually,
    make_settings,
    running,
    stream_messages,
)
from workers import liveness
from workers.bench.proxy import Mode, TcpProxy
from workers.demo.run import fresh_sweep_history
from workers.liveness.decide import Rules
from workers.liveness.sweep import sweep_once

S = timedelta(seconds=1)


async def _events(
    nc: NATS, subjects: Subjects, bc_type: str, after: int = 0
) -> list[dict[str, Any]]:
    """The events of `bc_type` (those stored after sequence `after`)."""
    return [
        json.loads(m.data)
        for m in await stream_messages(nc.jetstream(), subjects.events_stream)
        if m.seq > after and m.headers and m.headers.get("Bc-Type") == bc_type
    ]


async def _last_seq(nc: NATS, subjects: Subjects) -> int:
    return int((await nc.jetstream().stream_info(subjects.events_stream)).state.last_seq)


async def _routed(db: asyncpg.Connection, gateway_id: str) -> int:
    return int(
        await db.fetchval("SELECT count(*) FROM node_sessions WHERE gateway_id = $1", gateway_id)
    )


async def _has(nc: NATS, subjects: Subjects, bc_type: str, n: int = 1, after: int = 0) -> bool:
    return len(await _events(nc, subjects, bc_type, after)) >= n


@contextlib.asynccontextmanager
async def _proxied(url: str) -> AsyncIterator[TcpProxy]:
    target = urlsplit(url)
    assert target.hostname and target.port
    proxy = await TcpProxy(target.hostname, target.port).start()
    try:
        yield proxy
    finally:
        await proxy.stop()


SWEPT = """
SELECT count(*) FROM node_sessions
 WHERE gateway_id IS NULL AND disconnect_reason IN ('liveness-timeout', 'gateway-lost')
"""


async def _watch_for_disconnects(db: asyncpg.Connection, seconds: float) -> int:
    """The most sessions seen disconnected by the controller at once over `seconds`
    (sampled): by its sweep, for a liveness timeout or a lost gateway. A session its gateway
    closed (a heartbeat this loaded test process sent late) is the gateway's word, not the
    controller's."""
    worst = 0
    for _ in range(int(seconds / 0.25)):
        worst = max(worst, await db.fetchval(SWEPT))
        await asyncio.sleep(0.25)
    return worst


@pytest.mark.slow
async def test_the_controllers_bus_cut_for_12s_disconnects_nobody(
    servers: Servers,
    nc: NATS,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
    gateways: Fleet,
) -> None:
    gateway = await gateways.gateway("gw-a", nc)
    async with _proxied(servers.nats_url) as proxy:
        settings = liveness_settings(
            make_settings(servers.nats_url, database_url, subjects), proxy.url("nats")
        )
        async with running(settings, [liveness.build(settings)]):
            await gateways.connect(gateway, 20)
            await eventually(lambda: _has(nc, subjects, "node.connected", 20), what="connected")
            await eventually(lambda: _seen(db, "gw-a"), what="the gateway seen")
            # what the cut says, apart from a start on a loaded machine (a gateway not yet
            # seen for `blind_after` is said blind, then seeing, before the cut)
            before = await _last_seq(nc, subjects)
            cut = asyncio.create_task(proxy.outage(12.0, Mode.REFUSE))
            worst = await _watch_for_disconnects(db, 16.0)  # the cut, and 4 s after it
            await cut
            await eventually(
                lambda: _has(nc, subjects, "gateway.seeing", after=before), what="seeing again"
            )
    assert worst == 0
    assert await _routed(db, "gw-a") == 20
    assert await _events(nc, subjects, "node.disconnected") == []
    # once a blind spell, not once a sweep: on a loaded machine the gateway may be seen,
    # then blind again, as its first flushes after the cut come late; each spell said once
    spells = [
        (m.headers["Bc-Type"], json.loads(m.data))
        for m in await stream_messages(nc.jetstream(), subjects.events_stream)
        if m.seq > before and m.headers["Bc-Type"] in ("gateway.blind", "gateway.seeing")
    ]
    kinds = [kind for kind, _ in spells]
    assert kinds[0] == "gateway.blind" and kinds[-1] == "gateway.seeing", kinds
    assert all(a != b for a, b in itertools.pairwise(kinds)), kinds  # never said twice in a row
    blind = spells[0][1]
    assert blind["gatewayId"] == "gw-a" and blind["sessions"] == 20
    # its own link to the bus cut, the controller cannot read its facts: behind them
    assert blind["reason"] == "lag"


@pytest.mark.slow
async def test_a_controller_stopped_for_8s_disconnects_nobody_after_its_restart(
    servers: Servers,
    nc: NATS,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
    gateways: Fleet,
) -> None:
    gateway = await gateways.gateway("gw-a", nc)
    settings = liveness_settings(make_settings(servers.nats_url, database_url, subjects))
    async with running(settings, [liveness.build(settings)]):
        await gateways.connect(gateway, 20)
        await eventually(lambda: _has(nc, subjects, "node.connected", 20), what="connected")
    await asyncio.sleep(8)  # stopped; the gateway keeps flushing into the stream
    async with running(settings, [liveness.build(settings)]):
        worst = await _watch_for_disconnects(db, 6.0)
    assert worst == 0
    assert await _routed(db, "gw-a") == 20
    assert await _events(nc, subjects, "node.disconnected") == []


@pytest.mark.slow
async def test_a_silent_gateway_is_held_while_its_lease_holds_then_lost_after_the_grace(
    servers: Servers,
    nc: NATS,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
    gateways: Fleet,
) -> None:
    """gw-b's link to the bus breaks while its lease in PostgreSQL stays alive: its
    sessions are held whatever their ages; when its lease expires, the gateway-loss rule
    takes them after its grace. gw-a, flushing as usual, is the control: a node it does
    not hold (missing from its flushes) goes `liveness-timeout` in the stale period."""
    seeing = await gateways.gateway("gw-a", nc)
    async with _proxied(servers.nats_url) as proxy:
        silent_nc = await nats.connect(proxy.url("nats"), max_reconnect_attempts=-1)
        try:
            silent = await gateways.gateway("gw-b", silent_nc)
            settings = liveness_settings(make_settings(servers.nats_url, database_url, subjects))
            async with running(settings, [liveness.build(settings)]):
                await gateways.connect(seeing, 5)
                await gateways.connect(silent, 10)
                await eventually(lambda: _has(nc, subjects, "node.connected", 15), what="connected")
                await fleet.session(db, "orphan", epoch=1, gateway_id="gw-a", join_first=True)
                await eventually(lambda: _seen(db, "gw-b"), what="gw-b seen")

                # (on a loaded machine gw-b may have been blind a moment before its first
                # flush was applied: only what follows the break counts)
                mark = (await nc.jetstream().stream_info(subjects.events_stream)).state.last_seq
                await proxy.set_mode(Mode.REFUSE)  # gw-b's flushes stop; its lease does not

                async def blind_now() -> bool:
                    return bool(await _events(nc, subjects, "gateway.blind", after=mark))

                await eventually(blind_now, what="blind")
                assert await _watch_for_disconnects(db, 6.0) == 1  # the orphan only
                assert await _routed(db, "gw-b") == 10
                [blind] = await _events(nc, subjects, "gateway.blind", after=mark)
                assert (blind["gatewayId"], blind["sessions"]) == ("gw-b", 10)
                assert blind["lastFlushAgeSeconds"] >= 2
                assert blind["reason"] == "no-flush"  # the controller is not behind: gw-b is
                [state] = await _status(database_url, "gw-b")  # and an operator reads why
                assert (state["blind"], state["blind_reason"]) == (True, "no-flush")

                await silent.stop(graceful=False)  # its lease now runs out
                await eventually(
                    lambda: _gone(db, "gw-b", 10), within=15, what="gateway-lost after the grace"
                )
                reasons = {
                    r["node_id"]: r["disconnect_reason"]
                    for r in await db.fetch("SELECT node_id, disconnect_reason FROM node_sessions")
                }
        finally:
            with contextlib.suppress(Exception):  # it may be mid-reconnect to the refusing proxy
                await silent_nc.close()
    assert {n: r for n, r in reasons.items() if n.startswith("gw-b")} == {
        f"gw-b-n{i:02d}": "gateway-lost" for i in range(10)
    }
    assert reasons["orphan"] == "liveness-timeout"
    assert all(reasons[f"gw-a-n{i:02d}"] is None for i in range(5))


async def _status(database_url: str, gateway_id: str) -> list[dict[str, object]]:
    """`bcw liveness status --gateway G --json`, parsed: one object per gateway."""
    code, out = await bcw(
        "liveness", "status", "--gateway", gateway_id, "--json", BCW_DATABASE_URL=database_url
    )
    assert code == 0, out
    return [json.loads(line) for line in out.splitlines()]


async def _gone(db: asyncpg.Connection, gateway_id: str, n: int) -> bool:
    return (
        await db.fetchval(
            "SELECT count(*) FROM node_sessions WHERE disconnect_reason = 'gateway-lost'"
        )
        == n
    )


async def test_the_breaker_holds_30_of_40_and_a_release_lets_the_next_sweep_go(
    database_url: str, db: asyncpg.Connection, subjects: Subjects
) -> None:
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    try:
        for i in range(40):
            await fleet.session(db, f"n{i:02d}", epoch=1, seen_ago=(60 if i < 30 else 0) * S)
        await fleet.flushed(db, "gw-1")
        await fresh_sweep_history(pool)
        first = await sweep_once(pool, None, subjects, Rules())
        second = await sweep_once(pool, None, subjects, Rules())
        assert (first.stale, first.held, second.stale, second.held) == (0, ("gw-1",), 0, ("gw-1",))
        assert await _routed(db, "gw-1") == 40
        opened = [
            json.loads(bytes(r["body"]))
            for r in await db.fetch(OUTBOX_MESSAGES)
            if json.loads(r["headers"])["Bc-Type"] == "liveness.breaker-open"
        ]
        [at] = [o.pop("at") for o in opened]  # when the sweep decided it (its database clock)
        assert opened == [{"gatewayId": "gw-1", "wouldDisconnect": 30, "connected": 40}]  # once
        assert datetime.fromisoformat(at) <= await db.fetchval("SELECT compute_now()")
        [state] = await _status(database_url, "gw-1")  # what an operator reads first
        assert state["gateway_id"] == "gw-1" and state["connected"] == 40
        assert (state["breaker_open"], state["blind"], state["breaker_released_by"]) == (
            True,
            False,
            None,
        )
        assert isinstance(state["last_flush_age_seconds"], float)
        assert state["oldest_sight_age_seconds"] >= 60  # its 30 sessions seen a minute ago
        code, out = await bcw("liveness", "status", BCW_DATABASE_URL=database_url)
        gateway, connected, oldest, _age, blind, breaker, _lease = out.split("\n")[1].split()
        assert code == 0 and (gateway, connected, blind, breaker) == ("gw-1", "40", "no", "open")
        assert int(oldest.removesuffix("s")) >= 60

        code, out = await bcw(
            "liveness",
            "release",
            "--gateway",
            "gw-1",
            "--by",
            "oncall",
            BCW_DATABASE_URL=database_url,
        )
        assert code == 0 and "released by oncall" in out, out
        [state] = await _status(database_url, "gw-1")
        assert (state["breaker_open"], state["breaker_released_by"]) == (True, "oncall")
        released = await sweep_once(pool, None, subjects, Rules())
        assert (released.stale, released.held) == (30, ())
        assert await _routed(db, "gw-1") == 10
        [state] = await _status(database_url, "gw-1")
        assert (state["breaker_open"], state["connected"]) == (False, 10)
        row = await db.fetchrow("SELECT * FROM liveness_gateways WHERE gateway_id = 'gw-1'")
        assert row["breaker_opened_at"] is None and row["breaker_released_by"] is None
        code, out = await bcw(
            "liveness", "release", "--gateway", "gw-1", BCW_DATABASE_URL=database_url
        )
        assert code == 1 and "no open breaker" in out
    finally:
        await pool.close()


async def test_a_drained_gateway_away_is_gone_not_blind_and_back_is_new_but_a_crash_is_blind(
    nc: NATS, subjects: Subjects, database_url: str, db: asyncpg.Connection, gateways: Fleet
) -> None:
    """A rolling restart: gw-b is drained and stops — its sessions closed, its lease given
    up — and stays away longer than `blind_after`. Nothing of it is held, so it is not
    called blind (every gateway of a rollout was), nor counted blind, and its sight is
    forgotten: back, it is a gateway that just appeared, not blind until its first flush
    is applied (it was). gw-a, which keeps its session, is seen throughout. gw-c, empty
    too, crashes undrained: its lease runs out, and it is blind as DESIGN §9 has it (a
    gateway that keeps its lease, or a session, is: `test_a_silent_gateway_is_held_...`)."""
    seeing = await gateways.gateway("gw-a", nc)
    stopping = await gateways.gateway("gw-b", nc)
    crashing = await gateways.gateway("gw-c", nc)
    settings = liveness_settings(make_settings(nc.connected_url.geturl(), database_url, subjects))
    async with running(settings, [liveness.build(settings)]):
        await gateways.connect(seeing, 1)
        await gateways.connect(stopping, 3)
        for gw in ("gw-b", "gw-c"):
            await eventually(lambda gw=gw: _seen(db, gw), what=f"{gw} seen")  # type: ignore[misc]
        mark = await _last_seq(nc, subjects)
        await stopping.drain()
        await stopping.stop()  # graceful: its sessions closed, its lease released
        await crashing.stop(graceful=False)  # undrained: its lease runs out (3 s)
        assert await _routed(db, "gw-b") == 0
        await asyncio.sleep(3 * 2.0)  # blind_after (2 s here), three times over: it is away
        said = await _events(nc, subjects, "gateway.blind", after=mark)
        assert [e["gatewayId"] for e in said] == ["gw-c"]
        known = {
            r["gateway_id"] for r in await db.fetch("SELECT gateway_id FROM liveness_gateways")
        }
        assert "gw-b" not in known and {"gw-a", "gw-c"} <= known
        assert await _seen(db, "gw-a") and await _routed(db, "gw-a") == 1

        await gateways.gateway("gw-b", nc)  # back, empty, taking sessions
        await eventually(lambda: _seen(db, "gw-b"), what="gw-b seen again")
    said = await _events(nc, subjects, "gateway.blind", after=mark)
    assert [e["gatewayId"] for e in said] == ["gw-c"]


async def test_a_drained_gateway_still_stopping_holds_nothing_and_is_not_called_blind(
    nc: NATS, subjects: Subjects, database_url: str, db: asyncpg.Connection, gateways: Fleet
) -> None:
    """A rolling restart's gateway of thousands stops slowly: drained, its sessions closed
    and their `closed` facts published, its flush stopped — and only then its lease given
    up. Held open here (the `ended` hook) for longer than `blind_after` with its lease, it
    holds no session and takes no Hello: it is gone, not blind (a rollout of 100,000 nodes
    called one such gateway blind). gw-a, seen throughout, is not touched."""
    held_open = dataclasses.replace(GATEWAY_SETTINGS, lease_ttl=30.0)
    gw_b = await gateways.gateway("gw-b", nc, settings=held_open)
    stopping = HeldStop(gw_b)
    settings = liveness_settings(make_settings(nc.connected_url.geturl(), database_url, subjects))
    async with running(settings, [liveness.build(settings)]):
        await both_seen(gateways, nc, gw_b, db)
        mark = await _last_seq(nc, subjects)
        await stopping.drain_and_stop()
        assert await _routed(db, "gw-b") == 0
        assert await db.fetchval(
            "SELECT lease_expires_at > compute_now() FROM gateways WHERE gateway_id = 'gw-b'"
        )
        await asyncio.sleep(3 * 2.0)  # blind_after (2 s here), three times over
        await stopping.go()
        assert await _seen(db, "gw-a")
    assert await _events(nc, subjects, "gateway.blind", after=mark) == []


async def test_a_gateway_back_before_it_was_called_gone_flushes_at_once_and_is_never_blind(
    nc: NATS, subjects: Subjects, database_url: str, db: asyncpg.Connection, gateways: Fleet
) -> None:
    """A rolling restart's fast wave: gw-b is drained, stops and is back sooner than
    `blind_after` (2 s here), so the controller never saw it gone and keeps the sight of
    its last life. Back, it flushes at its first tick: had it waited a flush period (1.5 s
    here, as 15 s of 30 in production) it was called blind meanwhile — seen in a rollout,
    an empty gateway's false alarm."""
    slow = dataclasses.replace(GATEWAY_SETTINGS, flush_period=1.5)
    gw_b = await gateways.gateway("gw-b", nc, settings=slow)
    settings = liveness_settings(make_settings(nc.connected_url.geturl(), database_url, subjects))
    async with running(settings, [liveness.build(settings)]):
        await gateways.connect(gw_b, 2)
        await eventually(lambda: _seen(db, "gw-b"), what="gw-b seen")
        mark = await _last_seq(nc, subjects)
        await gw_b.flush()  # its last flush of this life, just before the drain
        await asyncio.sleep(0.3)  # applied
        await gw_b.drain()
        await gw_b.stop()
        await asyncio.sleep(1.0)  # away: since its last flush, less than blind_after
        await gateways.gateway("gw-b", nc, settings=slow)
        await asyncio.sleep(3 * 1.5)  # its next flushes, and sweeps every 0.5 s
        assert await _seen(db, "gw-b")
    assert await _events(nc, subjects, "gateway.blind", after=mark) == []
