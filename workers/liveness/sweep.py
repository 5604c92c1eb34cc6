"""The liveness sweep: the transitions nobody reports, run by the replica holding the
`liveness` lease.

Each sweep is one transaction fenced on the lease epoch: it reads the sweep state and
what it sees of each gateway, plans with the pure rules (outage grace, blindness, the
fleet breaker), disconnects sessions of lost gateways and stale sessions of the gateways
it can see — with writes fenced on the epoch and gateway it read — records the sweep and
the gateways' sight, and publishes `node.disconnected` for each transition,
`gateway.blind`/`gateway.seeing` for each change of sight, `liveness.breaker-open` when
the breaker opens. Nothing else is touched.

Locks in `workers.liveness.lastsight.locks.LOCK_ORDER`: the sweep state row, then the
gateways' sight rows; the range rows and session rows behind them only with SKIP LOCKED.
So the sweep never waits for a flush, and no cycle can form.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime

import asyncpg
from opentelemetry import trace

from schemas.events import DisconnectReason, NodeDisconnected
from schemas.subjects import Subjects
from workers.liveness import blindness, breaker, ranges
from workers.liveness.apply import disconnect
from workers.liveness.decide import (
    BreakerDecision,
    BreakerView,
    Rules,
    SweepState,
    plan_sweep,
)
from workers.liveness.metrics import HELD_REASONS, SweepMetrics
from workers.liveness.seeing import blind_reason, seen_at, sees, sight_change, stale_before
from workers.liveness.settings import LivenessSettings
from workers.runtime.effects.batch import OutboxBatch
from workers.runtime.effects.worker import Loop, Runtime
from workers.runtime.observability import tracing
from workers.runtime.store import leases

log = logging.getLogger(__name__)

LEASE = "liveness"

READ_STATE = (
    "SELECT last_sweep_at, grace_until, compute_now() AS now FROM liveness_sweeps FOR UPDATE"
)
WRITE_STATE = "UPDATE liveness_sweeps SET last_sweep_at = $1, grace_until = $2"

# The sessions the stale rule would take: only of gateways the controller can see ($3),
# and not of a gateway whose lease has expired (nobody could flush those; the
# gateway-loss rule, with its grace to move, decides). One sequential scan (no index
# holds `last_seen`, so that a flush's update of it stays HOT: migration 0036) for those
# not ranged, and the stale range rows for those ranged (`ranges.STALE_RANGED`), read
# without locking; the breaker counts them per gateway (`breaker.views`), and those it lets
# go are then locked by key (`STALE`).
STALE_CANDIDATES = """
SELECT s.node_id, s.session_epoch, s.gateway_id, s.last_seen AS sight
  FROM node_sessions s
 WHERE s.gateway_id = ANY($3::text[]) AND s.last_seen < $1
   AND (CASE WHEN s.gateway_id IS NOT NULL AND s.ranged_epoch IS DISTINCT FROM s.session_epoch
             THEN true END)  -- node_sessions_unranged's expression (migration 0039)
   AND NOT EXISTS (SELECT 1 FROM gateways g
                    WHERE g.gateway_id = s.gateway_id AND g.lease_expires_at < $2)
"""

# Candidates are locked in node order, skipping rows a Hello holds right now (the next
# sweep sees them); `apply.disconnect` then clears their gateway, re-checking epoch and
# gateway as read.
GATEWAY_LOST = """
SELECT s.node_id, s.session_epoch, s.gateway_id
  FROM gateways g
  JOIN node_sessions s ON s.gateway_id = g.gateway_id
 WHERE g.lease_expires_at < $1
 ORDER BY s.node_id
   FOR UPDATE OF s SKIP LOCKED
"""

# Candidates (`STALE_CANDIDATES`, stale by their gateway's bound, less those the breaker
# holds) locked in node order, by key, at the epoch and gateway read, skipping rows a
# Hello holds right now (the next sweep sees them); a row flushed since the scan is read
# again as locked, and left (its last sight, 0038, not before its bound). `apply.disconnect`
# then clears their gateway.
STALE = """
SELECT s.node_id, s.session_epoch, s.gateway_id
  FROM unnest($1::text[], $2::bigint[], $3::text[], $4::timestamptz[])
       AS c(node_id, epoch, gateway_id, before)
  JOIN node_sessions s
    ON s.node_id = c.node_id AND s.session_epoch = c.epoch AND s.gateway_id = c.gateway_id
 WHERE s.last_seen < c.before AND (s.ranged_epoch IS DISTINCT FROM s.session_epoch
       OR coalesce(range_sight(s.node_id, s.session_epoch, s.gateway_id), '-infinity') < c.before)
 ORDER BY s.node_id
   FOR UPDATE OF s SKIP LOCKED
"""


@dataclass(frozen=True)
class SweepResult:
    age_transitions: bool
    gateway_lost: int
    stale: int
    blind: tuple[str, ...] = ()  # gateways the controller cannot see now
    held: tuple[str, ...] = ()  # gateways whose stale sessions the breaker holds
    #: sessions held because their gateway is blind, by why (`blindness.held_sessions`)
    held_sessions: dict[str, int] = field(default_factory=dict)


def rules_of(settings: LivenessSettings) -> Rules:
    return Rules(
        stale_after=settings.stale_after,
        silent_after=settings.heartbeat_interval * settings.missed_heartbeats,
        gateway_grace=settings.gateway_grace,
        outage_threshold=settings.outage_threshold,
        outage_grace=settings.outage_grace,
        blind_after=settings.blind_after_or_default,
        breaker_share=settings.breaker_share,
        breaker_minimum=settings.breaker_minimum,
    )


async def sweep_once(
    pool: asyncpg.Pool,
    lease: leases.Lease | None,
    subjects: Subjects,
    rules: Rules,
    tracer: trace.Tracer | None = None,
    lag: float | None = 0.0,
) -> SweepResult:
    """One sweep in one transaction; `LeaseLost` when `lease` is no longer current.
    `lag`: how far behind its facts the controller's consumer is (`blindness.consumer_lag`;
    None: not known), which says why the gateways it cannot see are blind.

    A sweep that announces something (a transition, a gateway seen or blind, a breaker)
    is a span `liveness sweep`, the parent of what it publishes: the transitions nobody
    reported have a trace too. A sweep that changes nothing makes no span."""
    started = time.time_ns()
    span: trace.Span | None = None
    try:
        async with pool.acquire() as conn, conn.transaction():
            if lease is not None:
                await leases.fence(conn, lease)
            state = await conn.fetchrow(READ_STATE)
            now: datetime = state["now"]
            plan = plan_sweep(SweepState(state["last_sweep_at"], state["grace_until"]), now, rules)
            rows, sights = await blindness.read_sights(conn, plan.gateway_expired_before)
            seeing = sorted(gw for gw, sight in sights.items() if sees(sight, now, rules))
            changes = [
                c for sight in sights.values() if (c := sight_change(sight, now, rules, lag))
            ]
            # why each gateway that stays blind is: the controller may have caught up since
            reasons = {
                gw: blind_reason(sight, now, rules, lag)
                for gw, sight in sights.items()
                if gw not in seeing and rows[gw]["blind_since"] is not None
            }
            outbox = OutboxBatch("liveness")
            lost: list[asyncpg.Record] = []
            stale: list[asyncpg.Record] = []
            breakers: dict[str, tuple[BreakerView, BreakerDecision]] = {}
            if plan.age_transitions:
                lost = await conn.fetch(GATEWAY_LOST, plan.gateway_expired_before)
                lost = await disconnect(conn, lost, now, ["gateway-lost"] * len(lost))
                # each seen gateway's bound, by what its applied flushes cover
                before = {
                    gw: stale_before(at, now, rules)
                    for gw in seeing
                    if (at := seen_at(sights[gw])) is not None
                }
                found = await conn.fetch(STALE_CANDIDATES, plan.stale_before, now, seeing)
                found += await conn.fetch(ranges.STALE_RANGED, plan.stale_before, now, seeing)
                candidates = [c for c in found if c["sight"] < before[c["gateway_id"]]]
                breakers = await breaker.views(conn, candidates, rows, rules)
                held = {gw for gw, (_, decision) in breakers.items() if decision.hold}
                going = [c for c in candidates if c["gateway_id"] not in held]
                stale = await conn.fetch(
                    STALE,
                    [c["node_id"] for c in going],
                    [c["session_epoch"] for c in going],
                    [c["gateway_id"] for c in going],
                    [before[c["gateway_id"]] for c in going],
                )
                stale = await disconnect(conn, stale, now, ["liveness-timeout"] * len(stale))
            changes, sessions, gone = await blindness.worth_saying(conn, changes, now, rules)
            await blindness.forget(conn, gone, now)
            await blindness.write_sights(
                conn, rows, changes, sessions, reasons, breaker.changes(breakers, rows, now), now
            )
            await conn.execute(WRITE_STATE, plan.state.last_sweep_at, plan.state.grace_until)
            if tracer is not None and (lost or stale or changes or breakers):
                span = tracer.start_span(
                    "liveness sweep",
                    start_time=started,
                    attributes={
                        "bcw.sweep.gateway_lost": len(lost),
                        "bcw.sweep.liveness_timeout": len(stale),
                        "bcw.sweep.blind_gateways": sorted(set(sights) - set(seeing)),
                        "bcw.sweep.breakers": sorted(breakers),
                    },
                )
                outbox.context = trace.set_span_in_context(span)
            current = tracing.active(span) if span is not None else contextlib.nullcontext()
            with current:  # the statements that announce are the span's children
                blindness.say_sights(outbox, subjects, changes, sessions, now)
                _announce(outbox, subjects, lost, "gateway-lost", now)
                _announce(outbox, subjects, stale, "liveness-timeout", now)
                breaker.say(outbox, subjects, breakers, rows, now)
                await outbox.write(conn)
    finally:
        if span is not None:
            span.end()
    if lost or stale:
        log.info("sweep: %d gateway-lost, %d liveness-timeout", len(lost), len(stale))
    breaker.log_decisions(breakers, rows)
    return SweepResult(
        plan.age_transitions,
        len(lost),
        len(stale),
        blind=tuple(sorted(set(sights) - set(seeing) - set(gone))),
        held=tuple(sorted(gw for gw, (_, d) in breakers.items() if d.open)),
        held_sessions=blindness.held_sessions(rows, changes, sessions, reasons),
    )


def _announce(
    outbox: OutboxBatch,
    subjects: Subjects,
    rows: list[asyncpg.Record],
    reason: DisconnectReason,
    now: datetime,
) -> None:
    for row in rows:
        event = NodeDisconnected(
            node_id=row["node_id"],
            epoch=row["session_epoch"],
            gateway_id=row["gateway_id"],
            reason=reason,
            disconnected_at=now,  # as its row says (`disconnect` at `now`)
        )
        outbox.add(event, subjects.event(event.BC_TYPE), order_key=row["node_id"])


def _withdraw(runtime: Runtime) -> None:
    """The leader's gauges go back to 0 when it stops leading: a former leader must not
    keep saying gateways are blind, or a breaker open, that it no longer sweeps."""
    metrics = runtime.metrics.of(SweepMetrics)
    metrics.blind_gateways.set(0.0)
    metrics.breakers_open.set(0.0)
    metrics.lag_seconds.set(0.0)
    for reason in HELD_REASONS:
        metrics.held_sessions.set(0.0, reason)


def sweep_loop(settings: LivenessSettings) -> Loop:
    rules = rules_of(settings)

    async def sweep(runtime: Runtime, stopping: asyncio.Event) -> None:
        async def body(lease: leases.Lease) -> None:
            lag = await blindness.consumer_lag(runtime)
            started = time.perf_counter()
            result = await sweep_once(
                runtime.pool, lease, runtime.subjects, rules, runtime.tracer, lag
            )
            metrics = runtime.metrics.of(SweepMetrics)
            metrics.sweep_seconds.observe(time.perf_counter() - started)
            metrics.blind_gateways.set(float(len(result.blind)))
            metrics.breakers_open.set(float(len(result.held)))
            metrics.lag_seconds.set(blindness.lag_gauge(lag))
            for reason, held in result.held_sessions.items():
                metrics.held_sessions.set(float(held), reason)
            await ranges.prune(runtime.pool)  # not the sweep's: its own, after it
            runtime.wake_outbox()

        await leases.run_leased(
            runtime.pool,
            LEASE,
            runtime.instance,
            body,
            period=settings.sweep_interval,
            ttl=settings.lease_ttl,
            stopping=stopping,
            held=runtime.metrics.lease_held,
            on_lost=lambda: _withdraw(runtime),
        )

    return sweep
