"""The quarantine enforcer's I/O: count alternations under the node's row lock, revoke,
publish the security events and the revocation notice.

Called by the runtime with one transaction per batch. Rows are locked in node order, so
two replicas counting one node's Hellos serialize and count each once.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence

import asyncpg
from pydantic import ValidationError

from schemas.events import DuplicateSession, Quarantined, Revocations, UnprovenHello
from schemas.facts import Fact, Hello
from workers.quarantine import breaker, conditions, record
from workers.quarantine.decide import (
    REASON,
    Alternation,
    Counter,
    Limits,
    blamed,
    judge,
    proven_window,
    serials_to_revoke,
    to_act_on,
    window_of,
)
from workers.quarantine.settings import ALTERNATIONS_KEPT
from workers.runtime.effects import outcome
from workers.runtime.effects.outcome import Outcome
from workers.runtime.effects.worker import Handler, Tx

log = logging.getLogger(__name__)

LOCK_COUNTERS = """
SELECT s.node_id, coalesce(s.alternations_judged_epoch, 0) AS judged
  FROM unnest($1::text[]) AS n(node_id)
 CROSS JOIN LATERAL (SELECT * FROM node_sessions WHERE node_id = n.node_id FOR UPDATE) AS s
"""

LIVE_CERTS = """
SELECT c.node_id, c.serial
  FROM unnest($1::text[]) AS n(node_id)
  JOIN node_certs c ON c.node_id = n.node_id AND c.revoked_at IS NULL
"""

# Each alternation at the time its Hello transaction issued the epoch; one per epoch, with
# the Hello fact it was counted for, whether it was proven, or that it was no alternation
# but a takeover attempt (recorded so that it is said once, never counted). The epochs
# already recorded come back with that fact's id: the same fact again is a redelivery,
# another is a second Hello of the epoch.
RECORD_ALTERNATIONS = """
WITH t AS (SELECT * FROM unnest($1::text[], $2::bigint[], $3::uuid[], $4::text[], $5::boolean[],
                                $6::boolean[])
                   AS t(node_id, epoch, fact_id, gateway_id, proven, takeover)),
inserted AS (
    INSERT INTO node_alternations (node_id, epoch, issued_at, fact_id, gateway_id, proven, takeover)
    SELECT t.node_id, t.epoch, coalesce(e.issued_at, compute_now()), t.fact_id,
           coalesce(e.gateway_id, t.gateway_id), t.proven, t.takeover
      FROM t LEFT JOIN session_epochs e ON e.node_id = t.node_id AND e.epoch = t.epoch
        ON CONFLICT (node_id, epoch) DO NOTHING
    RETURNING node_id, epoch
)
SELECT t.node_id, t.epoch, i.node_id IS NOT NULL AS counted, a.fact_id AS counted_for
  FROM t LEFT JOIN inserted i USING (node_id, epoch)
  LEFT JOIN node_alternations a ON i.node_id IS NULL AND a.node_id = t.node_id AND a.epoch = t.epoch
"""

READ_ALTERNATIONS = """
SELECT a.node_id, a.epoch, a.issued_at, a.gateway_id, a.proven
  FROM node_alternations a WHERE a.node_id = ANY($1::text[]) AND NOT a.takeover
"""

# The nodes held for an operator: a quarantine neither revoked nor dismissed holds every
# session of its node (the dispatch loop and the replay read the same).
HELD_NODES = """
SELECT DISTINCT q.node_id FROM quarantines q
 WHERE q.node_id = ANY($1::text[]) AND q.revoked_at IS NULL AND q.dismissed_at IS NULL
"""

# Older than any fact that can still arrive (a day on the bus), so never counted again.
PRUNE_ALTERNATIONS = f"""
DELETE FROM node_alternations
 WHERE node_id = ANY($1::text[])
   AND issued_at < compute_now() - interval '{ALTERNATIONS_KEPT.days} day'
"""

WRITE_COUNTERS = """
UPDATE node_sessions s SET duplicate_hellos = t.alternations, duplicate_since = t.since,
       alternations_judged_epoch = nullif(t.judged, 0)
  FROM unnest($1::text[], $2::int[], $3::timestamptz[], $4::bigint[])
       AS t(node_id, alternations, since, judged)
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
    """Every Hello: which ones count is what their Hello transaction recorded, read for the
    batch (`record.recorded`), never what the fact says of itself."""
    return isinstance(fact, Hello)


def counts(hello: Hello) -> bool:
    """As its transaction recorded it (`provenance.as_recorded`): a duplicate identity, or
    an unproven Hello of a node that proves its Hellos (a takeover attempt)."""
    return hello.duplicate_identity or is_takeover(hello)


def is_takeover(hello: Hello) -> bool:
    """An unproven Hello of a node that proves its Hellos, as its Hello transaction recorded
    it (`proven = false`: the node has a Hello key and this Hello proved nothing)."""
    return hello.proven is False


def make_handler(limits: Limits) -> Handler:
    async def handle(tx: Tx, facts: Sequence[Fact]) -> Mapping[uuid.UUID, Outcome]:
        hellos = [fact for fact in facts if isinstance(fact, Hello) and counts(fact)]
        nodes = sorted({hello.node_id for hello in hellos})
        judged_up_to = {
            row["node_id"]: int(row["judged"]) for row in await tx.conn.fetch(LOCK_COUNTERS, nodes)
        }
        outcomes: dict[uuid.UUID, Outcome] = {}
        fresh = _fresh(hellos, judged_up_to, outcomes)
        recorded = {
            (row["node_id"], row["epoch"]): (row["counted"], row["counted_for"])
            for row in await tx.conn.fetch(
                RECORD_ALTERNATIONS,
                [h.node_id for h in fresh],
                [h.epoch for h in fresh],
                [h.fact_id for h in fresh],
                [h.gateway_id for h in fresh],
                [h.proven is True for h in fresh],
                [is_takeover(h) for h in fresh],
            )
        }
        counted = []
        for hello in fresh:
            now_counted, counted_for = recorded[(hello.node_id, hello.epoch)]
            if now_counted and is_takeover(hello):
                await _publish_takeover(tx, hello)  # held by its Hello transaction, for good
            elif now_counted:
                counted.append(hello)
            elif counted_for == hello.fact_id:  # this very fact again: nothing to do
                outcomes[hello.fact_id] = outcome.DUPLICATE
            else:  # its epoch was counted already: a second Hello fact of one epoch
                outcomes[hello.fact_id] = outcome.FOREIGN
        if counted:
            await _judge(tx, counted, judged_up_to, limits)
        return outcomes

    return handle


def _fresh(
    hellos: Sequence[Hello], judged_up_to: Mapping[str, int], outcomes: dict[uuid.UUID, Outcome]
) -> list[Hello]:
    """The first Hello of each (node, epoch) of a joined node, in stream order."""
    fresh: list[Hello] = []
    seen: set[tuple[str, int]] = set()
    for hello in hellos:
        key = (hello.node_id, hello.epoch)
        if hello.node_id not in judged_up_to:
            outcomes[hello.fact_id] = outcome.STALE  # never joined, or gone
        elif key in seen:
            outcomes[hello.fact_id] = outcome.FOREIGN  # one epoch, one alternation
        else:
            seen.add(key)
            fresh.append(hello)
    return fresh


async def _judge(
    tx: Tx, counted: Sequence[Hello], judged_up_to: dict[str, int], limits: Limits
) -> None:
    """Count the batch's new alternations among each node's others, as of their Hellos;
    publish each one's event; quarantine where the count says so."""
    nodes = sorted({hello.node_id for hello in counted})
    upto: dict[str, int] = {}
    for hello in counted:
        upto[hello.node_id] = max(hello.epoch, upto.get(hello.node_id, 0))
    # the node's duplicates before them whose facts never came count too (`record`)
    withheld = await record.count_withheld(tx.conn, upto)
    alternations: dict[str, list[Alternation]] = {}
    for row in await tx.conn.fetch(READ_ALTERNATIONS, nodes):
        alternations.setdefault(row["node_id"], []).append(
            Alternation(row["epoch"], row["issued_at"], row["gateway_id"], row["proven"])
        )
    live: dict[str, set[str]] = {}
    for row in await tx.conn.fetch(LIVE_CERTS, nodes):
        live.setdefault(row["node_id"], set()).add(row["serial"])
    presented = sorted({h.cert.serial for h in counted if h.cert.serial is not None})
    recorded = {row["serial"] for row in await tx.conn.fetch(RECORDED, presented)}
    held_nodes = {row["node_id"] for row in await tx.conn.fetch(HELD_NODES, nodes)}
    counters: dict[str, Counter] = {}
    revoked: list[tuple[str, str]] = []  # (serial, node)
    # (node, epoch): each counted one, its condition
    duplicates = [(w.node_id, w.epoch) for w in withheld]
    released: dict[str, int] = {}  # node → the epoch whose hold ends
    mine: dict[str, list[Hello]] = {}  # each node's, in stream order (one per epoch)
    for hello in counted:
        mine.setdefault(hello.node_id, []).append(hello)
        duplicates.append((hello.node_id, hello.epoch))
    for node in nodes:
        judged, counters[node] = judge(alternations.get(node, []), limits)
        for one in withheld:  # said as every counted one is, from its record
            if one.node_id == node and one.epoch in judged:
                _publish_withheld(tx, one, judged[one.epoch].number, node in held_nodes, limits)
        act = to_act_on(judged, judged_up_to[node], [hello.epoch for hello in mine[node]])
        for hello in mine[node]:
            # not the Hello that acts on a quarantine (a late one of a window acted on: none)
            if act is None or hello.epoch != act[1]:
                number = judged[hello.epoch].number
                await _publish_duplicate(tx, hello, number, False, node in held_nodes, limits)
                released[node] = max(hello.epoch, released.get(node, 0))
                continue
            first = act[0]
            serials = serials_to_revoke(
                hello.cert.serial, live.get(node, set()), recorded=hello.cert.serial in recorded
            )
            window = window_of(alternations.get(node, []), first)
            through = sorted({a.gateway_id for a in window if a.gateway_id})
            held = await breaker.hold(
                tx,
                node,
                hello.epoch,
                blamed(window, hello.gateway_id),
                through,
                serials,
                first.number,
                limits.breaker,
                proven=proven_window(window),
                at=await tx.fact_time(hello),
            )
            if held is not None:
                held_nodes.add(node)
            await _publish_duplicate(
                tx, hello, first.number, held is None, node in held_nodes, limits
            )
            if held is None:
                live[node] = live.get(node, set()) - set(serials)
                recorded.update(serials)
                revoked += [(serial, node) for serial in serials]
                await _publish_quarantine(tx, hello, first.number, serials)
            judged_up_to[node] = max(first.epoch, hello.epoch)
        # held for good: the clone gets nothing, its revocation closes it (or, held for an
        # operator, no session of the node gets anything until one acts)
        if act is not None:
            released.pop(node, None)
    await _write(tx.conn, counters, {n: judged_up_to[n] for n in nodes}, revoked)
    # the node carries the condition from its first counted duplicate until the release
    # loop's rules clear it (`conditions.clear_recovered`)
    await conditions.set_duplicate_identity(tx.conn, duplicates, REASON)
    if released:
        nodes_released = sorted(released)
        await tx.conn.execute(RELEASE_HOLDS, nodes_released, [released[n] for n in nodes_released])
        await tx.conn.execute("SELECT wake_dispatch()")  # what waits may go


async def _write(
    conn: asyncpg.Connection,
    counters: Mapping[str, Counter],
    judged_up_to: Mapping[str, int],
    revoked: list[tuple[str, str]],
) -> None:
    if counters:
        nodes = sorted(counters)
        await conn.execute(
            WRITE_COUNTERS,
            nodes,
            [counters[n].alternations for n in nodes],
            [counters[n].since for n in nodes],
            [judged_up_to[n] for n in nodes],
        )
        await conn.execute(PRUNE_ALTERNATIONS, nodes)
    if revoked:
        await conn.execute(REVOKE, [s for s, _ in revoked], [n for _, n in revoked], REASON)


async def _publish_duplicate(
    tx: Tx, hello: Hello, alternations: int, quarantined: bool, held: bool, limits: Limits
) -> None:
    event = DuplicateSession(
        node_id=hello.node_id,
        gateway_id=hello.gateway_id,
        previous_boot_id=hello.previous.boot_id,
        boot_id=hello.boot_id,
        alternations=alternations,
        window_seconds=int(limits.window.total_seconds()),
        quarantined=quarantined,
        held=held,
        at=await tx.fact_time(hello),
    )
    tx.publish(event, tx.subjects.event(event.BC_TYPE), cause=hello, order_key=hello.node_id)


def _publish_withheld(
    tx: Tx, one: record.Withheld, alternations: int, held: bool, limits: Limits
) -> None:
    try:  # what a gateway gave its Hello transaction, never trusted to fit
        event = DuplicateSession(
            node_id=one.node_id,
            gateway_id=one.gateway_id,
            previous_boot_id=one.previous_boot_id,
            boot_id=one.boot_id or "",  # none recorded: not said
            alternations=alternations,
            window_seconds=int(limits.window.total_seconds()),
            quarantined=False,
            held=held,
            at=one.issued_at,
        )
    except ValidationError:
        log.warning("node %s's duplicate at epoch %d counted, not said", one.node_id, one.epoch)
        return
    tx.publish(event, tx.subjects.event(event.BC_TYPE), order_key=one.node_id)


async def _publish_takeover(tx: Tx, hello: Hello) -> None:
    log.warning(
        "gateway %s said an unproven Hello for node %s (epoch %d), which proves its Hellos: "
        "a takeover attempt, held",
        hello.gateway_id,
        hello.node_id,
        hello.epoch,
    )
    event = UnprovenHello(
        node_id=hello.node_id,
        gateway_id=hello.gateway_id,
        epoch=hello.epoch,
        boot_id=hello.boot_id,
        serial=hello.cert.serial,
        at=await tx.fact_time(hello),
    )
    tx.publish(event, tx.subjects.event(event.BC_TYPE), cause=hello, order_key=hello.node_id)


async def _publish_quarantine(tx: Tx, hello: Hello, alternations: int, serials: list[str]) -> None:
    at = await tx.fact_time(hello)
    event = Quarantined(
        node_id=hello.node_id,
        reason=REASON,
        alternations=alternations,
        revoked_serials=serials,
        at=at,
    )
    tx.publish(event, tx.subjects.event(event.BC_TYPE), cause=hello, order_key=hello.node_id)
    notice = Revocations(node_id=hello.node_id, serials=serials, reason=REASON, at=at)
    tx.publish(notice, tx.subjects.revocations, cause=hello, order_key=hello.node_id)
