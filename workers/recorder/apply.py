"""The fact recorder's I/O: store event batches and status reports set-based.

Called by the runtime with one transaction per batch. Node rows are locked in node order
before they are written, and each fact counts for what its gateway could have seen
(`provenance.FENCES`, `workers.recorder.decide`): events from the gateway holding their
journal now, any seq; from a former holder of the journal, only seqs the journal has
reached without it; a status report from any session its gateway held, never above the
node's spec generation, its trust version and approver set only from the session of
now. A fact of which nothing counts is STALE and changes nothing.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence

import asyncpg

from schemas.facts import Events, Fact, Status
from schemas.notices import EventAck
from workers.recorder.decide import (
    StoredStatus,
    apply_reports,
    counted_status,
    event_bound,
    events_within,
    from_current_session,
    highest_contiguous,
    unique_events,
)
from workers.runtime.effects import outcome
from workers.runtime.effects.outcome import Outcome
from workers.runtime.effects.worker import Tx

# Key-by-key LATERAL lookups on the primary key (see workers/labeler/apply.py); the
# caller passes the keys sorted, so rows are locked in a stable order.
# `holder`: the gateway of the node's session of now, or of its last one once it closed
# (a close clears `gateway_id`; what the daemon sent before it is still its session's)
LOCK_SESSIONS = """
SELECT s.node_id, s.session_epoch, s.gateway_id, s.journal_id, s.acked_event_seq,
       s.observed_generation, s.trust_version, s.approver_set_epoch, s.approver_set_sha256,
       s.proven,
       coalesce(s.gateway_id, (SELECT e.gateway_id FROM session_epochs e
                                WHERE e.node_id = s.node_id AND e.epoch = s.session_epoch)) AS holder,
       (SELECT spec_generation FROM nodes WHERE node_id = s.node_id) AS spec_generation
  FROM unnest($1::text[]) AS n(node_id)
 CROSS JOIN LATERAL (SELECT * FROM node_sessions WHERE node_id = n.node_id FOR UPDATE) AS s
"""

# The highest seq stored on each (node, journal): the end of an older journal as far as
# it is known (a former holder's events fill its gaps, never pass it). The primary key
# answers each from its last entry.
HIGHEST_STORED = """
SELECT t.n AS node_id, t.j AS journal_id,
       (SELECT max(e.seq) FROM node_events e WHERE e.node_id = t.n AND e.journal_id = t.j) AS seq
  FROM unnest($1::text[], $2::text[]) AS t(n, j)
"""

INSERT_EVENTS = """
INSERT INTO node_events (node_id, journal_id, seq, kind, body, at, recorded_at)
SELECT n, j, s, k, b::jsonb, a, (SELECT compute_now())  -- the default, evaluated once
  FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::timestamptz[])
       AS t(n, j, s, k, b, a)
    -- an event of a node that never joined is dropped with the node (FK), not an error
 WHERE EXISTS (SELECT 1 FROM nodes WHERE node_id = t.n)
ON CONFLICT (node_id, journal_id, seq) DO NOTHING
"""

STORED_AFTER = """
SELECT t.n AS node_id, t.j AS journal_id, t.base,
       coalesce((SELECT array_agg(e.seq ORDER BY e.seq) FROM node_events e
                  WHERE e.node_id = t.n AND e.journal_id = t.j AND e.seq > t.base), '{}') AS seqs
  FROM unnest($1::text[], $2::text[], $3::bigint[]) AS t(n, j, base)
"""

RAISE_ACKED = """
UPDATE node_sessions s SET acked_event_seq = GREATEST(s.acked_event_seq, t.seq)
  FROM unnest($1::text[], $2::text[], $3::bigint[]) AS t(n, j, seq)
 WHERE s.node_id = t.n AND s.journal_id = t.j
"""

WRITE_STATUS = """
UPDATE node_sessions s
   SET observed_generation = t.generation, trust_version = t.trust,
       approver_set_epoch = t.epoch, approver_set_sha256 = t.digest
  FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[], $5::text[])
       AS t(n, generation, trust, epoch, digest)
 WHERE s.node_id = t.n
"""


# The facts (their positions) whose gateway held the node only in takeover attempts: an
# unproven session of a node that proves its Hellos (`session_epochs.proven` false) —
# on the events' journal, at the status's epoch. Such a session is held for good: what it
# says of the node is not the node's (docs/kubernetes.md, "What a compromised gateway can
# still do").
TAKEOVERS_ONLY = """
SELECT t.i FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[])
                WITH ORDINALITY AS t(n, g, e, j, i)
 WHERE NOT EXISTS (SELECT 1 FROM session_epochs s
                    WHERE s.node_id = t.n AND s.gateway_id = t.g
                      AND CASE WHEN t.j IS NULL THEN s.epoch = t.e ELSE s.journal_id = t.j END
                      AND s.proven IS DISTINCT FROM false)
"""


async def _of_takeovers(tx: Tx, facts: Sequence[Events | Status]) -> set[int]:
    if not facts:
        return set()
    found = await tx.conn.fetch(
        TAKEOVERS_ONLY,
        [f.node_id for f in facts],
        [f.gateway_id for f in facts],
        [f.epoch if isinstance(f, Status) else None for f in facts],
        [f.journal_id if isinstance(f, Events) else None for f in facts],
    )
    return {id(facts[r["i"] - 1]) for r in found}


def _of_a_takeover(row: asyncpg.Record | None, fact: Events | Status) -> bool:
    return row is not None and row["proven"] is False and row["holder"] == fact.gateway_id


async def handle(tx: Tx, facts: Sequence[Fact]) -> Mapping[uuid.UUID, Outcome]:
    said = [fact for fact in facts if isinstance(fact, Events | Status)]
    takeovers = await _of_takeovers(tx, said)
    events = [fact for fact in said if isinstance(fact, Events) and id(fact) not in takeovers]
    statuses = [fact for fact in said if isinstance(fact, Status) and id(fact) not in takeovers]
    nodes = sorted({fact.node_id for fact in (*events, *statuses)})
    rows = {row["node_id"]: row for row in await tx.conn.fetch(LOCK_SESSIONS, nodes)}
    # the takeover attempt holding the node now says nothing of it either, whatever
    # session its gateway held before
    events = [f for f in events if not _of_a_takeover(rows.get(f.node_id), f)]
    statuses = [f for f in statuses if not _of_a_takeover(rows.get(f.node_id), f)]
    counted = await _counted_events(tx, events, rows)
    reports = [(f, c) for f in statuses if (c := _counted_status(rows.get(f.node_id), f))]
    kept = {id(f) for f in (*(f for f, _, _ in counted), *(f for f, _ in reports))}
    outcomes = {f.fact_id: outcome.STALE for f in said if id(f) not in kept}
    if counted:
        await _record_events(tx, counted, rows)
    if reports:
        await _record_statuses(tx, [c for _, c in reports], rows)
    return outcomes


async def _counted_events(
    tx: Tx, facts: list[Events], rows: Mapping[str, asyncpg.Record]
) -> list[tuple[Events, Events, bool]]:
    """Each events fact of which something counts: the fact, what counts of it, and
    whether its gateway holds the journal now (`decide.event_bound`)."""
    known = [f for f in facts if f.node_id in rows]
    older = sorted(
        {(f.node_id, f.journal_id) for f in known if rows[f.node_id]["journal_id"] != f.journal_id}
    )
    highest: dict[tuple[str, str], int | None] = {}
    if older:
        found = await tx.conn.fetch(HIGHEST_STORED, [n for n, _ in older], [j for _, j in older])
        highest = {(r["node_id"], r["journal_id"]): r["seq"] for r in found}
    counted = []
    for fact in known:
        row = rows[fact.node_id]
        bound = event_bound(
            row["holder"],
            row["journal_id"],
            int(row["acked_event_seq"]),
            fact.gateway_id,
            fact.journal_id,
            highest.get((fact.node_id, fact.journal_id)),
        )
        within = events_within(fact, bound)
        if within:
            counted.append((fact, fact.model_copy(update={"events": within}), bound is None))
    return counted


def _counted_status(row: asyncpg.Record | None, fact: Status) -> Status | None:
    if row is None:
        return None
    current = from_current_session(row["session_epoch"], row["holder"], fact.epoch, fact.gateway_id)
    return counted_status(fact, current, int(row["spec_generation"] or 0))


async def _record_events(
    tx: Tx, counted: list[tuple[Events, Events, bool]], rows: Mapping[str, asyncpg.Record]
) -> None:
    """What counts of each events fact stored (a seq once); for those from the holder of
    their journal (the node's journal of now), the ack raised and the gateway told."""
    by_journal = unique_events([within for _, within, _ in counted])
    flat = [
        (node, journal, e) for (node, journal), seqs in by_journal.items() for e in seqs.values()
    ]
    await tx.conn.execute(
        INSERT_EVENTS,
        [n for n, _, _ in flat],
        [j for _, j, _ in flat],
        [e.seq for _, _, e in flat],
        [e.kind for _, _, e in flat],
        [json.dumps(e.body) for _, _, e in flat],
        [e.at for _, _, e in flat],
    )
    held = [fact for fact, _, holder in counted if holder]
    if not held:
        return  # a former holder's events move no ack (they are at or below it, or on an older journal)
    # the ack counts from the journal's ack (every journal here is its node's of now)
    keys = sorted({(fact.node_id, fact.journal_id) for fact in held})
    bases = [int(rows[node]["acked_event_seq"]) for node, _ in keys]
    stored = await tx.conn.fetch(STORED_AFTER, [n for n, _ in keys], [j for _, j in keys], bases)
    contiguous = {
        (r["node_id"], r["journal_id"]): highest_contiguous(r["base"], r["seqs"]) for r in stored
    }
    await tx.conn.execute(
        RAISE_ACKED,
        [n for n, _ in contiguous],
        [j for _, j in contiguous],
        list(contiguous.values()),
    )
    acked: set[tuple[str, str, str]] = set()
    for fact in held:
        key = (fact.node_id, fact.journal_id, fact.gateway_id)
        if key in acked:
            continue
        acked.add(key)
        notice = EventAck(
            node_id=fact.node_id,
            journal_id=fact.journal_id,
            seq=contiguous[(fact.node_id, fact.journal_id)],
        )
        tx.publish(
            notice,
            tx.subjects.notice(fact.gateway_id, notice.BC_TYPE),
            cause=fact,
            order_key=fact.node_id,
        )


async def _record_statuses(tx: Tx, facts: list[Status], rows: Mapping[str, asyncpg.Record]) -> None:
    by_node: dict[str, list[Status]] = {}
    for fact in facts:
        by_node.setdefault(fact.node_id, []).append(fact)
    updates = []
    for node, reports in by_node.items():
        row = rows.get(node)
        if row is None:
            continue
        stored = StoredStatus(
            row["observed_generation"],
            row["trust_version"],
            row["approver_set_epoch"],
            row["approver_set_sha256"],
        )
        after = apply_reports(stored, reports)
        if after != stored:
            updates.append((node, after))
    if updates:
        await tx.conn.execute(
            WRITE_STATUS,
            [n for n, _ in updates],
            [a.observed_generation for _, a in updates],
            [a.trust_version for _, a in updates],
            [a.approver_set_epoch for _, a in updates],
            [a.approver_set_sha256 for _, a in updates],
        )
