"""The quarantine enforcer's I/O: count alternations under the node's row lock, revoke,
publish the security events and the revocation notice.

Called by the runtime with one transaction per batch. Rows are locked in node order, so
two replicas counting one node's Hellos serialize and count each once.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime

import asyncpg

from schemas.events import DuplicateSession, Quarantined, Revocations
from schemas.facts import Fact, Hello
from workers.quarantine.decide import REASON, Counter, Limits, count, serials_to_revoke
from workers.runtime.effects import outcome
from workers.runtime.effects.outcome import Outcome
from workers.runtime.effects.worker import Handler, Tx

LOCK_COUNTERS = """
SELECT s.node_id, s.duplicate_hellos, s.duplicate_since, compute_now() AS now
  FROM unnest($1::text[]) AS n(node_id)
 CROSS JOIN LATERAL (SELECT * FROM node_sessions WHERE node_id = n.node_id FOR UPDATE) AS s
"""

LIVE_CERTS = """
SELECT c.node_id, c.serial
  FROM unnest($1::text[]) AS n(node_id)
  JOIN node_certs c ON c.node_id = n.node_id AND c.revoked_at IS NULL
"""

WRITE_COUNTERS = """
UPDATE node_sessions s SET duplicate_hellos = t.alternations, duplicate_since = t.since
  FROM unnest($1::text[], $2::int[], $3::timestamptz[]) AS t(node_id, alternations, since)
 WHERE s.node_id = t.node_id
"""

# The quarantine has counted the session's Hello (and not quarantined the node): its
# hold ends, and the dispatch loop may send it what waits.
RELEASE_HOLDS = """
UPDATE node_sessions s SET held_epoch = NULL
  FROM unnest($1::text[], $2::bigint[]) AS t(node_id, epoch)
 WHERE s.node_id = t.node_id AND s.held_epoch <= t.epoch
"""

RECORDED = "SELECT serial FROM node_certs WHERE serial = ANY($1::text[])"

# A serial with no record (admission lets one in) is recorded revoked, so that the
# gateways' Hello transaction refuses it from now on; a recorded one is marked revoked.
# Never another node's certificate.
REVOKE = """
INSERT INTO node_certs AS c
       (serial, node_id, identity_generation, role, allowed_kinds, not_after, revoked_at, revocation_reason)
SELECT r.serial, n.node_id, n.identity_generation, n.role, '{}', compute_now(), compute_now(), $3
  FROM unnest($1::text[], $2::text[]) AS r(serial, node_id)
  JOIN nodes n ON n.node_id = r.node_id
ON CONFLICT (serial) DO UPDATE
   SET revoked_at = compute_now(), revocation_reason = EXCLUDED.revocation_reason
 WHERE c.revoked_at IS NULL AND c.node_id = EXCLUDED.node_id
"""


def wants(fact: Fact) -> bool:
    """Only a Hello with a duplicate identity can have effects here."""
    return isinstance(fact, Hello) and fact.duplicate_identity


def make_handler(limits: Limits) -> Handler:
    async def handle(tx: Tx, facts: Sequence[Fact]) -> Mapping[uuid.UUID, Outcome]:
        hellos = [fact for fact in facts if isinstance(fact, Hello) and fact.duplicate_identity]
        nodes = sorted({hello.node_id for hello in hellos})
        rows = {row["node_id"]: row for row in await tx.conn.fetch(LOCK_COUNTERS, nodes)}
        live: dict[str, set[str]] = {}
        for row in await tx.conn.fetch(LIVE_CERTS, nodes):
            live.setdefault(row["node_id"], set()).add(row["serial"])
        presented = sorted({h.cert.serial for h in hellos if h.cert.serial is not None})
        recorded = {row["serial"] for row in await tx.conn.fetch(RECORDED, presented)}
        counters = {
            node: Counter(row["duplicate_hellos"], row["duplicate_since"])
            for node, row in rows.items()
        }
        revoked: list[tuple[str, str]] = []  # (serial, node)
        released: dict[str, int] = {}  # node → the epoch whose hold ends
        outcomes: dict[uuid.UUID, Outcome] = {}
        for hello in hellos:  # in stream order: each counts
            if hello.node_id not in rows:
                outcomes[hello.fact_id] = outcome.STALE  # never joined, or gone
                continue
            now: datetime = rows[hello.node_id]["now"]
            verdict = count(counters[hello.node_id], now, limits)
            counters[hello.node_id] = verdict.counter
            _publish_duplicate(tx, hello, verdict.alternations, verdict.quarantined, limits)
            if not verdict.quarantined:
                released[hello.node_id] = max(hello.epoch, released.get(hello.node_id, 0))
            else:  # held for good: the clone gets nothing, its revocation closes it
                released.pop(hello.node_id, None)
                serials = serials_to_revoke(
                    hello.cert.serial,
                    live.get(hello.node_id, set()),
                    recorded=hello.cert.serial in recorded,
                )
                live[hello.node_id] = live.get(hello.node_id, set()) - set(serials)
                recorded.update(serials)
                revoked += [(serial, hello.node_id) for serial in serials]
                _publish_quarantine(tx, hello, verdict.alternations, serials)
        await _write(tx.conn, counters, revoked)
        if released:
            nodes_released = sorted(released)
            await tx.conn.execute(
                RELEASE_HOLDS, nodes_released, [released[n] for n in nodes_released]
            )
            await tx.conn.execute("SELECT pg_notify('bcw_dispatch', '')")  # what waits may go
        return outcomes

    return handle


async def _write(
    conn: asyncpg.Connection, counters: Mapping[str, Counter], revoked: list[tuple[str, str]]
) -> None:
    if counters:
        nodes = sorted(counters)
        await conn.execute(
            WRITE_COUNTERS,
            nodes,
            [counters[n].alternations for n in nodes],
            [counters[n].since for n in nodes],
        )
    if revoked:
        await conn.execute(REVOKE, [s for s, _ in revoked], [n for _, n in revoked], REASON)


def _publish_duplicate(
    tx: Tx, hello: Hello, alternations: int, quarantined: bool, limits: Limits
) -> None:
    event = DuplicateSession(
        node_id=hello.node_id,
        gateway_id=hello.gateway_id,
        previous_boot_id=hello.previous.boot_id,
        boot_id=hello.boot_id,
        alternations=alternations,
        window_seconds=int(limits.window.total_seconds()),
        quarantined=quarantined,
    )
    tx.publish(event, tx.subjects.event(event.BC_TYPE), cause=hello, order_key=hello.node_id)


def _publish_quarantine(tx: Tx, hello: Hello, alternations: int, serials: list[str]) -> None:
    event = Quarantined(
        node_id=hello.node_id, reason=REASON, alternations=alternations, revoked_serials=serials
    )
    tx.publish(event, tx.subjects.event(event.BC_TYPE), cause=hello, order_key=hello.node_id)
    notice = Revocations(node_id=hello.node_id, serials=serials, reason=REASON)
    tx.publish(notice, tx.subjects.revocations, cause=hello, order_key=hello.node_id)
