"""Overload never reads as death: a liveness controller behind its facts holds the sessions
its lag hides, says so, and once caught up disconnects the silenced ones — by their true
last sight, never a later one.

What is real: nats-server, PostgreSQL, the liveness worker on the real runtime (its
sweep leased, every 0.5 s), a gateway's flushes published every second exactly as the
reference gateway cuts them (a fact per range of node hashes), 3,000 sessions made in
bulk. What is a test hook: the worker's consumer is held behind — the flushes it is told
to hold are handed back to the bus (a nak with a delay, as a replica that stopped with
them in hand would leave them) until released. Periods are short: heartbeat 3 x 1 s +
flush 1 s, stale after 4 s; blind after 2 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas.facts import Fact, Liveness
from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration import fleet as tfleet
from tests.integration.heartbeats import Fleet
from tests.integration.support import eventually, make_settings, running, stream_messages
from workers import liveness
from workers.bench.steady import fleet
from workers.demo.run import fresh_sweep_history
from workers.gateway.facts import range_bits, range_cut
from workers.liveness.settings import LivenessSettings
from workers.liveness.sight import switched_on
from workers.runtime.bus import streams
from workers.runtime.effects import outcome
from workers.runtime.effects.outcome import Outcome
from workers.runtime.effects.worker import Tx, Worker

S = timedelta(seconds=1)
NODES = 3_000  # one gateway: four ranges of ~750 sessions, each a quarter (the breaker: half)
SWEEP = 0.5
STALE = 4.0  # heartbeat 1 s x 3 + flush 1 s
HOLD = 2 * STALE + 2  # how long one range's flushes are held back


class Hold:
    """The test hook: which flushes the worker's consumer hands back, and until when."""

    def __init__(self) -> None:
        #: (fact, when the bus stored it) → seconds to hold it still (0: apply it)
        self.rule: Callable[[Liveness, datetime | None], float] = lambda _fact, _at: 0.0
        self.held = 0

    def worker(self, worker: Worker) -> Worker:
        inner = worker.handle

        async def handle(tx: Tx, facts: Sequence[Fact]) -> Mapping[Any, Outcome]:
            waits = {
                id(f): wait
                for f in facts
                if isinstance(f, Liveness) and (wait := self.rule(f, tx.stored_at(f))) > 0
            }
            self.held += len(waits)
            outcomes = dict(await inner(tx, [f for f in facts if id(f) not in waits]) or {})
            for fact in facts:
                if id(fact) in waits:
                    outcomes[fact.fact_id] = outcome.retry_after(waits[id(fact)])
            return outcomes

        return dataclasses.replace(worker, handle=handle)


@pytest.fixture(autouse=True)
async def _swept_lately(pool: asyncpg.Pool) -> None:
    """The sweep ran a moment ago (the conftest's pool): no outage grace at the start."""
    await fresh_sweep_history(pool)


@contextlib.asynccontextmanager
async def flushing(nc: NATS, gateway: fleet.Gateway) -> AsyncIterator[None]:
    stopping = asyncio.Event()
    task = asyncio.create_task(
        fleet.flushing(nc.jetstream(), gateway, 1.0, time.monotonic(), stopping, lambda *_: None)
    )
    try:
        yield
    finally:
        stopping.set()
        await asyncio.gather(task, return_exceptions=True)


def _settings(servers: Servers, database_url: str, subjects: Subjects, sight: bool) -> Any:
    base = make_settings(servers.nats_url, database_url, subjects)
    return base.model_copy(
        update={
            "liveness": LivenessSettings(
                sweep_interval=SWEEP,
                heartbeat_interval=1 * S,
                missed_heartbeats=3,
                flush_period=1 * S,
                range_sight=sight,
            )
        }
    )


async def _events(
    nc: NATS, subjects: Subjects, bc_type: str, after: int
) -> list[tuple[datetime, Any]]:
    """The events of `bc_type` stored after sequence `after`, each with when it was stored."""
    return [
        (m.time, json.loads(m.data))
        for m in await stream_messages(nc.jetstream(), subjects.events_stream)
        if m.seq > after and m.headers and m.headers.get("Bc-Type") == bc_type
    ]


async def _last_seq(nc: NATS, subjects: Subjects) -> int:
    return int((await nc.jetstream().stream_info(subjects.events_stream)).state.last_seq)


async def _disconnected(db: asyncpg.Connection) -> dict[str, asyncpg.Record]:
    rows = await db.fetch(
        "SELECT node_id, last_seen, disconnected_at, disconnect_reason FROM node_sessions"
        " WHERE gateway_id IS NULL"
    )
    return {r["node_id"]: r for r in rows}


async def _watch_disconnects(db: asyncpg.Connection, seconds: float) -> set[str]:
    """Every session seen disconnected over `seconds` (sampled)."""
    seen: set[str] = set()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        seen |= set(await _disconnected(db))
        await asyncio.sleep(0.2)
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("sight", [True, False], ids=["range-sight", "rows"])
async def test_one_range_of_a_gateway_held_behind_disconnects_nobody_and_is_said(
    servers: Servers,
    nc: NATS,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
    pool: asyncpg.Pool,
    sight: bool,
) -> None:
    """The busy day's failure: a controller behind applies a gateway's range facts unevenly.
    One range's flushes wait past the stale threshold while the other three are applied:
    the gateway is not seen (what was applied does not cover it), its sessions are held,
    `gateway.blind` says why (lag) — and none of the range's ~750 healthy sessions, a
    quarter of the gateway (under the breaker's half), is disconnected. Then the range is
    released: the gateway is seen again, and the 1 % silenced meanwhile go, each within the
    stale threshold plus two sweeps of it."""
    await streams.provision_streams(nc.jetstream(), subjects)
    await fleet.prepare(db, NODES, 1, ranged=await switched_on(db, sight))
    gateway = fleet.Gateway(0, NODES, 1, subjects, heartbeat_ms=1_000)
    cut = range_cut(gateway.hashes, [1] * NODES, range_bits(NODES, 0))
    assert len(cut) == 4
    held_range = cut[2][0]
    hold = Hold()
    settings = _settings(servers, database_url, subjects, sight)
    async with running(settings, [hold.worker(liveness.build(settings))]), flushing(nc, gateway):
        await eventually(lambda: _seen(db), what="the gateway seen")
        await asyncio.sleep(2 * STALE)  # steady: every range applied each second
        assert await _disconnected(db) == {}
        mark = await _last_seq(nc, subjects)  # a start on a loaded machine may say blind
        released_at = time.monotonic() + HOLD
        hold.rule = lambda fact, _at: (
            max(0.2, released_at - time.monotonic())
            if fact.range_start == held_range and time.monotonic() < released_at
            else 0.0
        )
        quiet = set(gateway.silence(0.01, 1))  # silenced as the hold starts: 1 %, 30 nodes
        gone = await _watch_disconnects(db, HOLD)
        assert hold.held > 0
        assert gone == set(), f"{len(gone)} session(s) disconnected while the controller was behind"
        # caught up, the silenced go: each within the stale threshold and two sweeps of
        # the gateway seen again (`bound`, below); a machine the whole suite shares may
        # leave the controller behind, and blind, a while longer — the wait allows it
        await eventually(lambda: _all_gone(db, quiet), within=60, what="the silenced gone")
        assert set(await _disconnected(db)) == quiet  # nobody else, ever
    blind = [e for _, e in await _events(nc, subjects, "gateway.blind", mark)]
    assert blind and all(e["reason"] == "lag" for e in blind), blind
    seeing = [at for at, _ in await _events(nc, subjects, "gateway.seeing", mark)]
    assert seeing, "the gateway was never said seen again"
    bound = timedelta(seconds=STALE + 2 * SWEEP + 1)  # and a second of the bus's and relay's
    for node, row in (await _disconnected(db)).items():
        assert row["disconnect_reason"] == "liveness-timeout", node
        # judged by its true last sight, once the controller could see its gateway again
        assert row["disconnected_at"] - max(row["last_seen"], seeing[-1]) <= bound, row


@pytest.mark.slow
async def test_a_controller_steadily_behind_is_blind_for_lag_and_keeps_no_node_alive_by_it(
    servers: Servers,
    nc: NATS,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
    pool: asyncpg.Pool,
) -> None:
    """The slow day's failure: a controller applying every flush 6 s after the bus stored
    it (three times the blind threshold) — at a steady pace, so that each gateway's facts
    keep arriving — never said it was blind, and aged sessions from when it applied their
    flushes: a late flush made a node look fresher than it was. Now: blind for lag while
    behind, nobody disconnected, seeing once caught up; and each silenced node's last
    sight is the last flush that named it, as the bus stored it."""
    await streams.provision_streams(nc.jetstream(), subjects)
    await fleet.prepare(db, NODES, 1, ranged=True)
    gateway = fleet.Gateway(0, NODES, 1, subjects, heartbeat_ms=1_000)
    hold = Hold()
    settings = _settings(servers, database_url, subjects, True)
    lag = 6.0
    async with running(settings, [hold.worker(liveness.build(settings))]), flushing(nc, gateway):
        await eventually(lambda: _seen(db), what="the gateway seen")
        await asyncio.sleep(STALE)
        mark = await _last_seq(nc, subjects)
        behind_until = time.monotonic() + 3 * lag
        hold.rule = lambda _fact, at: (
            max(0.0, lag - (_bus_now(at) - at).total_seconds())
            if at is not None and time.monotonic() < behind_until
            else 0.0
        )
        silenced_at = await db.fetchval("SELECT now()")
        quiet = set(gateway.silence(0.01, 1))
        gone = await _watch_disconnects(db, 3 * lag)
        assert gone == set(), f"{len(gone)} session(s) disconnected while the controller was behind"
        # caught up: the silenced go within the stale threshold and two sweeps; the budget
        # is twice that, for a machine the whole suite shares
        await eventually(lambda: _all_gone(db, quiet), within=6 * STALE, what="the silenced gone")
        assert set(await _disconnected(db)) == quiet
    [(_, blind)] = await _events(nc, subjects, "gateway.blind", mark)
    assert blind["reason"] == "lag" and blind["sessions"] == NODES, blind
    assert await _events(nc, subjects, "gateway.seeing", mark)
    for node, row in (await _disconnected(db)).items():
        # no later than the last flush that named it was stored (it was silenced then)
        assert row["last_seen"] <= silenced_at, (node, row["last_seen"], silenced_at)


@pytest.mark.slow
@pytest.mark.parametrize("skew", [-600, 600], ids=["10-min-behind", "10-min-ahead"])
async def test_a_gateway_whose_clock_is_minutes_off_fakes_no_liveness(
    servers: Servers,
    nc: NATS,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
    pool: asyncpg.Pool,
    skew: int,
) -> None:
    """The seed: ages, not timestamps, so a gateway's clock skew cannot fake liveness. A
    reference gateway whose clock is ten minutes off (its facts' `observed_at` with it)
    keeps its heartbeating sessions connected, and a session it does not hold (missing
    from its flushes) goes `liveness-timeout` in the stale period: its sight is the bus's
    time less the ages the gateway measured, never the gateway's own time."""
    await streams.provision_streams(nc.jetstream(), subjects)
    gateways = Fleet(pool, subjects)
    settings = _settings(servers, database_url, subjects, True)
    try:
        gateway = await gateways.gateway("gw-a", nc, wall=lambda: time.time() + skew)
        async with running(settings, [liveness.build(settings)]):
            await gateways.connect(gateway, 10)
            await tfleet.session(db, "orphan", epoch=1, gateway_id="gw-a", join_first=True)
            await eventually(lambda: _all_gone(db, {"orphan"}), within=3 * STALE, what="orphan")
            gone = await _watch_disconnects(db, 2 * STALE)
    finally:
        await gateways.stop()
    assert gone == {"orphan"}
    row = await db.fetchrow("SELECT * FROM node_sessions WHERE node_id = 'orphan'")
    assert row["disconnect_reason"] == "liveness-timeout"
    assert row["disconnected_at"] - row["last_seen"] <= timedelta(seconds=STALE + 2 * SWEEP + 1)


def _bus_now(at: datetime) -> datetime:
    return datetime.now(at.tzinfo)


async def _seen(db: asyncpg.Connection) -> bool:
    return bool(
        await db.fetchval(
            "SELECT count(*) FROM liveness_gateways WHERE gateway_id = 'gw-0'"
            " AND last_flush_at IS NOT NULL AND blind_since IS NULL"
        )
    )


async def _all_gone(db: asyncpg.Connection, nodes: set[str]) -> bool:
    return nodes <= set(await _disconnected(db))
