"""What the sweep knows of each gateway's flushes, and says of it: which gateways the
controller can see, how far behind its own facts it is, and each change of sight.

Called by the sweep (`workers.liveness.sweep`), inside its transaction (the sight rows)
and before it (the consumer's lag, from the bus). Every sight is on the bus's clock — when
the bus stored a flush (`bus_time`, migration 0043) — so that a controller behind its
facts sees each gateway as of what it has applied, never as of when it applied it
(docs/workers.md, "One clock for sight"). The rules are `seeing`'s:
`sees`, `sight_change`, `blind_reason`.

The sweep locks the gateways' sight rows in gateway order
(`workers.liveness.lastsight.locks.LOCK_ORDER`); the range rows are read here without a
lock (a flush replacing one now makes the gateway's sight newer, never older).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

import asyncpg

from schemas.events import GatewayBlind, GatewaySeeing
from schemas.facts import Liveness
from schemas.subjects import Subjects
from workers.liveness.decide import Rules
from workers.liveness.seeing import (
    BlindReason,
    GatewaySight,
    RangeSight,
    SightChange,
    gone,
    restarting,
)
from workers.runtime.effects import watermarks
from workers.runtime.effects.batch import OutboxBatch
from workers.runtime.effects.worker import Runtime

log = logging.getLogger(__name__)

#: the liveness worker's durable consumer (its name)
CONSUMER = "liveness"

# Every gateway that is live or within its grace gets a sight row (a gateway that never
# flushed is blind too), but one drained that holds no session (`seeing.gone`: its sight,
# once forgotten, is not made again to be counted blind until it is found gone anew); the
# rows (one per gateway: tens) are locked in gateway order.
ENSURE_SIGHTS = """
INSERT INTO liveness_gateways (gateway_id)
SELECT g.gateway_id FROM gateways g
 WHERE g.lease_expires_at > $1
   AND NOT (g.draining AND NOT EXISTS (SELECT 1 FROM node_sessions s
                                        WHERE s.gateway_id = g.gateway_id))
ON CONFLICT (gateway_id) DO NOTHING
"""
READ_SIGHTS = "SELECT * FROM liveness_gateways ORDER BY gateway_id FOR UPDATE"
# Each gateway's range rows, their bounds and time alone (a few per gateway: not their
# entries, which are the bulk of the table).
RANGE_SIGHTS = """
SELECT gateway_id, range_start, range_end, applied_at FROM liveness_ranges
 WHERE gateway_id = ANY($1::text[])
"""
WRITE_SIGHTS = """
UPDATE liveness_gateways lg
   SET blind_since = t.blind_since, breaker_opened_at = t.opened,
       breaker_released_at = CASE WHEN t.opened IS NULL THEN NULL ELSE lg.breaker_released_at END,
       breaker_released_by = CASE WHEN t.opened IS NULL THEN NULL ELSE lg.breaker_released_by END,
       blind_reason = t.reason, blind_sessions = t.sessions
  FROM unnest($1::text[], $2::timestamptz[], $3::timestamptz[], $4::text[], $5::integer[])
       AS t(gateway_id, blind_since, opened, reason, sessions)
 WHERE lg.gateway_id = t.gateway_id
"""
# Each gateway's state, read in one statement (one snapshot), so that a new lease taken
# or a close committed as the sweep runs is seen with the rest, or not at all: whether it
# is drained, its lease's start and whether that lease was taken after a drained life,
# and its sessions — all of them (`seeing.gone`: a Hello commits before the drain or is
# refused by it, `gateway_hello` locking the gateway's row FOR SHARE, so none it had is
# missed; a crash leaves `draining` false), and those from before its lease
# (`seeing.restarting`) — in one pass over its own (a few gateways a sweep: those whose
# sight changed).
GATEWAY_STATE = """
SELECT g.gateway_id, g.draining, g.lease_acquired_at, g.lease_follows_drain, mine.n,
       mine.earlier
  FROM gateways g,
       LATERAL (SELECT count(*) AS n,
                       count(*) FILTER (WHERE s.connected_at < g.lease_acquired_at) AS earlier
                  FROM node_sessions s WHERE s.gateway_id = g.gateway_id) mine
 WHERE g.gateway_id = ANY($1::text[])
"""
# a gone gateway forgotten once its lease is given up or run out (one that keeps it may
# take Hellos again, `gateway_drain(false)`: its sight is kept, nothing written, and it is
# blind as ever, said at once, when it holds a session); back, it is a gateway that just
# appeared (`sight_change`); its range rows (earlier in the lock order than the sight rows
# held) skipped if locked
AWAY = """
SELECT gateway_id FROM gateways WHERE gateway_id = ANY($1::text[]) AND lease_expires_at <= $2
"""
FORGET_RANGES = """
DELETE FROM liveness_ranges WHERE ctid IN (
    SELECT ctid FROM liveness_ranges WHERE gateway_id = ANY($1::text[]) FOR UPDATE SKIP LOCKED)
"""
FORGET_SIGHTS = "DELETE FROM liveness_gateways WHERE gateway_id = ANY($1::text[])"


async def read_sights(
    conn: asyncpg.Connection, live_after: datetime
) -> tuple[dict[str, asyncpg.Record], dict[str, GatewaySight]]:
    """Every gateway's sight row (made for each gateway whose lease expired after
    `live_after`), locked; and what the controller knows of its flushes."""
    await conn.execute(ENSURE_SIGHTS, live_after)
    rows = {r["gateway_id"]: r for r in await conn.fetch(READ_SIGHTS)}
    ranges: dict[str, list[RangeSight]] = {}
    for r in await conn.fetch(RANGE_SIGHTS, sorted(rows)):
        ranges.setdefault(r["gateway_id"], []).append(
            (r["range_start"], r["range_end"], r["applied_at"])
        )
    sights = {gw: _sight(r, tuple(ranges.get(gw, ()))) for gw, r in rows.items()}
    return rows, sights


def _sight(row: asyncpg.Record, ranges: tuple[RangeSight, ...]) -> GatewaySight:
    return GatewaySight(
        row["gateway_id"],
        row["last_flush_at"],
        row["blind_since"],
        row["known_since"],
        ranges=ranges,
        whole_flush_at=row["whole_flush_at"],
    )


async def consumer_lag(runtime: Runtime) -> float | None:
    """Seconds since the bus stored the oldest flush the liveness consumer has not applied
    (0.0 when none waits; None when the bus does not say), recorded as the controller's
    watermark (`watermarks.record`: the Hello transaction's live window reads it)."""
    found = await watermarks.record(
        runtime.pool, runtime.js, runtime.subjects, CONSUMER, Liveness.BC_TYPE
    )
    if found is None:
        return None
    if found.oldest is None:
        return 0.0
    return max(0.0, (datetime.now(UTC) - found.oldest).total_seconds())


async def worth_saying(
    conn: asyncpg.Connection, changes: Sequence[SightChange], now: datetime, rules: Rules
) -> tuple[list[SightChange], dict[str, int], list[str]]:
    """The changes worth saying, how many sessions each of their gateways holds now, and
    the gateways `gone` (drained, no session): nothing said of them, and their sight
    forgotten (`forget`). Nor is a gateway's blindness said while it is `restarting`
    (back under a lease taken after a drained life, within `blind_after` of it, holding
    nothing from before): its sight is kept, and judged again at the next sweep."""
    if not changes:
        return [], {}, []
    gateways = sorted(c.gateway_id for c in changes)
    state = {r["gateway_id"]: r for r in await conn.fetch(GATEWAY_STATE, gateways)}
    held = {gw: int(r["n"]) for gw, r in state.items() if r["n"]}
    away, quiet = set(), set()
    for c in changes:
        row = state.get(c.gateway_id)
        if row is None:  # it never took a lease: blind as ever
            continue
        if gone(c, int(row["n"]), bool(row["draining"])):
            away.add(c.gateway_id)
        since, after_drain = row["lease_acquired_at"], row["lease_follows_drain"]
        if restarting(c, since, after_drain, int(row["earlier"]), now, rules):
            quiet.add(c.gateway_id)
    said = [c for c in changes if c.gateway_id not in away | quiet]
    return said, held, sorted(away)


async def forget(conn: asyncpg.Connection, gone: Sequence[str], now: datetime) -> None:
    """Gone gateways' sight rows and range rows removed once their lease is given up or
    run out (before `now`): one that comes back is new, its start not news until
    `blind_after` (a returning gateway was called blind until its first flush was
    applied), and one that never comes back is not counted blind. A gone gateway that
    keeps its lease keeps its sight: neither said nor counted while it is gone (each sweep
    finds it so), and said blind at once if it takes Hellos again and holds a session."""
    if not gone:
        return
    away = [r["gateway_id"] for r in await conn.fetch(AWAY, sorted(gone), now)]
    if away:
        await conn.execute(FORGET_RANGES, away)
        await conn.execute(FORGET_SIGHTS, away)


async def write_sights(
    conn: asyncpg.Connection,
    rows: dict[str, asyncpg.Record],
    changes: Sequence[SightChange],
    sessions: dict[str, int],
    reasons: dict[str, BlindReason],
    breakers: dict[str, datetime | None],
    now: datetime,
) -> None:
    """Record each change of sight (blind since now, why, and how many sessions it held
    then; or seeing), why each gateway that stays blind is now (`reasons`: the controller
    caught up, say — logged, not said again), and each breaker opened or closed
    (`breakers`: gateway → opened at, None: closed)."""
    changed = {c.gateway_id: c for c in changes}
    moved = {gw for gw, why in reasons.items() if why != rows[gw]["blind_reason"]}
    for gw in sorted(moved):
        log.info(
            "gateway %s is still blind, now for %s (was %s)",
            gw,
            reasons[gw],
            rows[gw]["blind_reason"],
        )
    touched = sorted((set(changed) | set(breakers) | moved) & set(rows))
    if not touched:
        return

    def blind(gw: str) -> tuple[datetime | None, str | None, int | None]:
        row, change = rows[gw], changed.get(gw)
        if change is None:
            return row["blind_since"], reasons.get(gw, row["blind_reason"]), row["blind_sessions"]
        if not change.blind:
            return None, None, None
        return now, change.reason, sessions.get(gw, 0)

    kept = [blind(gw) for gw in touched]
    await conn.execute(
        WRITE_SIGHTS,
        touched,
        [since for since, _, _ in kept],
        [breakers[gw] if gw in breakers else rows[gw]["breaker_opened_at"] for gw in touched],
        [reason for _, reason, _ in kept],
        [held for _, _, held in kept],
    )


def say_sights(
    outbox: OutboxBatch,
    subjects: Subjects,
    changes: Sequence[SightChange],
    sessions: dict[str, int],
    now: datetime,
) -> None:
    """A WARNING line and `gateway.blind` (with why) or `gateway.seeing` for each change,
    seen `now` (the sweep's time)."""
    for change in changes:
        age = None if change.last_flush_age is None else change.last_flush_age.total_seconds()
        held = sessions.get(change.gateway_id, 0)
        event: GatewayBlind | GatewaySeeing
        if change.blind:
            event = GatewayBlind(
                gateway_id=change.gateway_id,
                sessions=held,
                last_flush_age_seconds=age,
                reason=change.reason,
                at=now,
            )
        else:
            event = GatewaySeeing(
                gateway_id=change.gateway_id, sessions=held, last_flush_age_seconds=age, at=now
            )
        log.warning(
            "gateway %s %s: %d session(s), its flushes seen as of %s",
            change.gateway_id,
            f"is blind ({_why(change)}), its sessions are held"
            if change.blind
            else "is seen again",
            held,
            "never" if age is None else f"{age:.1f}s ago",
        )
        outbox.add(event, subjects.event(event.BC_TYPE), order_key=f"gateway:{change.gateway_id}")


def _why(change: SightChange) -> str:
    if change.reason == "lag":
        return "lag: the controller is behind its facts"
    return "no flush of it reaches the controller"


def held_sessions(
    rows: dict[str, asyncpg.Record],
    changes: Iterable[SightChange],
    sessions: dict[str, int],
    reasons: dict[str, BlindReason],
) -> dict[str, int]:
    """Sessions held because their gateway is blind after this sweep, by why it is now
    (`lag`, `no-flush`), as counted when each went blind. Pure."""
    changed = {c.gateway_id: c for c in changes}
    held = {"lag": 0, "no-flush": 0}
    for gw, row in rows.items():
        change = changed.get(gw)
        if change is not None:
            if change.blind:
                held[change.reason or "no-flush"] += sessions.get(gw, 0)
        elif row["blind_since"] is not None:
            held[reasons.get(gw) or row["blind_reason"] or "no-flush"] += row["blind_sessions"] or 0
    return held


def lag_gauge(lag: float | None) -> float:
    """The lag as the gauge shows it: +Inf when not known (its consumer cannot be read:
    the controller is behind whatever it cannot read, and BcwLivenessBehind says so)."""
    return math.inf if lag is None else lag
