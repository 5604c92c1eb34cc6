"""The fleet breaker: what each sweep asks and says of it, and its operator side.

In a sweep (`workers.liveness.sweep`, inside its transaction): each gateway's view and
the breaker's decision (`views`, by `decide.decide_breaker`), the breakers that open or
close (`changes`, written with the gateways' sight rows), and what is said of them
(`say`: `liveness.breaker-open`; `log_decisions`). For the CLI: `bcw liveness status`
and `bcw liveness release`, which records who released which open breaker and when; the
next sweep honours it, logs it, and closes the breaker. Nothing is disconnected here.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from datetime import datetime

import asyncpg

from schemas.events import BreakerOpen
from schemas.subjects import Subjects
from workers.liveness.decide import BreakerDecision, BreakerView, Rules, decide_breaker
from workers.runtime.effects.batch import OutboxBatch

log = logging.getLogger(__name__)

RELEASE = """
UPDATE liveness_gateways
   SET breaker_released_at = compute_now(), breaker_released_by = $2
 WHERE gateway_id = $1 AND breaker_opened_at IS NOT NULL
RETURNING breaker_released_at
"""


async def release(conn: asyncpg.Connection, gateway_id: str, who: str) -> datetime | None:
    """Release the open breaker of `gateway_id`; when, or None if none was open."""
    released: datetime | None = await conn.fetchval(RELEASE, gateway_id, who)
    if released is not None:
        log.warning("breaker of gateway %s released by %s at %s", gateway_id, who, released)
    return released


# Each gateway's connected sessions and the oldest of their last sights, as the rest of
# the control plane reads a sight (`node_last_seen`, migration 0050: with range sight a
# session's `last_seen` is only a lower bound) — for one gateway, read through its keys
# (`{only}` names it inside the view's query); for every gateway, every range row parsed
# once.
STATUS = """
SELECT g.gateway_id, coalesce(c.connected, 0) AS connected, l.last_flush_at,
       extract(epoch FROM compute_now() - l.last_flush_at)::float8 AS last_flush_age_seconds,
       c.oldest_sight,
       extract(epoch FROM compute_now() - c.oldest_sight)::float8 AS oldest_sight_age_seconds,
       l.blind_since, l.blind_reason, l.breaker_opened_at, l.breaker_released_at,
       l.breaker_released_by,
       gw.lease_expires_at, coalesce(gw.lease_expires_at > compute_now(), false) AS lease_live,
       coalesce(gw.draining, false) AS draining
  FROM (SELECT gateway_id FROM gateways UNION SELECT gateway_id FROM liveness_gateways) g
  LEFT JOIN liveness_gateways l USING (gateway_id)
  LEFT JOIN gateways gw USING (gateway_id)
  LEFT JOIN (SELECT gateway_id, count(*) AS connected, min(last_seen) AS oldest_sight
               FROM node_last_seen
              WHERE gateway_id IS NOT NULL {only}
              GROUP BY gateway_id) c USING (gateway_id)
 WHERE $1::text IS NULL OR g.gateway_id = $1
 ORDER BY g.gateway_id
"""
STATUS_ALL = STATUS.format(only="")
STATUS_ONE = STATUS.format(only="AND gateway_id = $1")


async def status(
    conn: asyncpg.Connection, gateway_id: str | None = None
) -> list[dict[str, object]]:
    """What the liveness controller knows of each gateway (or of one): its connected
    sessions and the oldest of their last sights, its last applied flush and how old it
    is (on the bus's clock), whether it is blind and why (`lag`, `no-flush`), whether its
    breaker is open or was released (by whom), its lease. Read-only: `bcw liveness
    status`."""
    rows = await conn.fetch(STATUS_ALL if gateway_id is None else STATUS_ONE, gateway_id)
    return [
        {
            **dict(row),
            "blind": row["blind_since"] is not None,
            "breaker_open": row["breaker_opened_at"] is not None,
        }
        for row in rows
    ]


# The breaker's other question, asked cheaply: a gateway's connected sessions counted up
# to a bound (`k` = just over what would trip it): exact when it trips, and a few
# hundred index entries instead of a whole gateway's when it does not.
CONNECTED_UP_TO = """
SELECT t.gateway_id,
       (SELECT count(*) FROM (SELECT 1 FROM node_sessions s
                               WHERE s.gateway_id = t.gateway_id LIMIT t.k) AS x) AS n
  FROM unnest($1::text[], $2::bigint[]) AS t(gateway_id, k)
"""


async def views(
    conn: asyncpg.Connection,
    candidates: list[asyncpg.Record],
    rows: dict[str, asyncpg.Record],
    rules: Rules,
) -> dict[str, tuple[BreakerView, BreakerDecision]]:
    """The breaker's view and decision for every gateway with stale sessions (`candidates`)
    or an open breaker."""
    would = Counter(c["gateway_id"] for c in candidates)
    opened = {gw for gw, r in rows.items() if r["breaker_opened_at"] is not None}
    asked = sorted(gw for gw, n in would.items() if n >= rules.breaker_minimum)
    bounds = [math.floor(would[gw] / rules.breaker_share) + 1 for gw in asked]
    connected = {r["gateway_id"]: r["n"] for r in await conn.fetch(CONNECTED_UP_TO, asked, bounds)}
    out: dict[str, tuple[BreakerView, BreakerDecision]] = {}
    for gw in sorted(set(would) | opened):
        row = rows.get(gw)
        released = bool(
            row is not None
            and row["breaker_released_at"] is not None
            and row["breaker_opened_at"] is not None
            and row["breaker_released_at"] >= row["breaker_opened_at"]
        )
        view = BreakerView(gw, would.get(gw, 0), connected.get(gw, 0), gw in opened, released)
        out[gw] = (view, decide_breaker(view, rules))
    return out


def changes(
    breakers: dict[str, tuple[BreakerView, BreakerDecision]],
    rows: dict[str, asyncpg.Record],
    now: datetime,
) -> dict[str, datetime | None]:
    """Each breaker that opens or closes in this sweep: gateway → opened at (None: closed).
    Every such gateway has a sight row."""
    return {
        gw: (rows[gw]["breaker_opened_at"] or now) if decision.open else None
        for gw, (_, decision) in breakers.items()
        if decision.opened or decision.closed
    }


def log_decisions(
    breakers: dict[str, tuple[BreakerView, BreakerDecision]], rows: dict[str, asyncpg.Record]
) -> None:
    for gw, (view, decision) in breakers.items():
        row = rows.get(gw)
        if decision.closed and view.released and row is not None:
            log.warning(
                "breaker of gateway %s: released by %s at %s; %d stale session(s) go",
                gw,
                row["breaker_released_by"],
                row["breaker_released_at"],
                view.would_disconnect,
            )
        elif decision.closed:
            log.warning(
                "breaker of gateway %s closed: %d stale session(s)", gw, view.would_disconnect
            )


def say(
    outbox: OutboxBatch,
    subjects: Subjects,
    breakers: dict[str, tuple[BreakerView, BreakerDecision]],
    rows: dict[str, asyncpg.Record],
    now: datetime,
) -> None:
    for gw, (view, decision) in breakers.items():
        if not decision.opened:
            continue
        log.warning(
            "breaker of gateway %s open: %d of %d connected session(s) look stale; none is "
            "disconnected (`bcw liveness release --gateway %s` lets them go)",
            gw,
            view.would_disconnect,
            view.connected,
            gw,
        )
        event = BreakerOpen(
            gateway_id=gw, would_disconnect=view.would_disconnect, connected=view.connected, at=now
        )
        outbox.add(event, subjects.event(event.BC_TYPE), order_key=f"gateway:{gw}")
