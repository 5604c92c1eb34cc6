"""The capability labeler's I/O: read a batch's rows, apply its labelings set-based.

Called by the runtime with one transaction per batch. Rows are locked in node order;
every write is fenced on the epoch the rules were decided against.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence

from schemas.events import CapabilitiesChanged
from schemas.facts import Fact, Hello
from workers.labeler.decide import LABEL_PREFIX, Labeling, SessionRow, decide_batch
from workers.runtime.effects import outcome
from workers.runtime.effects.outcome import Outcome
from workers.runtime.effects.worker import Tx

# Set lookups go key by key through a LATERAL subquery on the primary key: a join with
# `unnest($1)` or `= ANY($1)` is planned as a sequential scan of the table once the fleet
# is large and the prepared statement's plan is generic. A node's labels are found by its
# id alone and sorted out in the aggregate's FILTER: with `source = 'system'` and the
# key's prefix in the WHERE, a plan made while `node_labels` was empty (a fleet's first
# power-on) searched the placement index (key, node_id) key by key — 30 times the reads,
# and PostgreSQL's largest cost in a herd until autovacuum's first ANALYZE.
READ_ROWS = """
SELECT s.node_id, s.session_epoch,
       coalesce((SELECT array_agg(substr(l.key, $2::int))
                         FILTER (WHERE l.source = 'system' AND l.key LIKE 'bc.dev/cap.%')
                   FROM node_labels l WHERE l.node_id = s.node_id),
                '{}') AS labels
  FROM unnest($1::text[]) AS n(node_id)
 CROSS JOIN LATERAL (SELECT * FROM node_sessions WHERE node_id = n.node_id) AS s
 ORDER BY s.node_id
"""

LOCK_ROWS = """
SELECT s.node_id
  FROM unnest($1::text[]) AS n(node_id)
 CROSS JOIN LATERAL (SELECT node_id FROM node_sessions WHERE node_id = n.node_id FOR UPDATE) AS s
 ORDER BY s.node_id
"""

WRITE_CAPABILITIES = """
UPDATE node_sessions s SET capabilities = string_to_array(f.caps, ',')
  FROM unnest($1::text[], $2::bigint[], $3::text[]) AS f(node_id, epoch, caps)
 WHERE s.node_id = f.node_id AND s.session_epoch = f.epoch
"""

ADD_LABELS = """
INSERT INTO node_labels (node_id, key, value, source)
SELECT node_id, key, '1', 'system' FROM unnest($1::text[], $2::text[]) AS t(node_id, key)
ON CONFLICT (node_id, source, key) DO UPDATE SET value = '1' WHERE node_labels.value <> '1'
"""

REMOVE_LABELS = """
DELETE FROM node_labels l
 USING unnest($1::text[], $2::text[]) AS t(node_id, key)
 WHERE l.node_id = t.node_id AND l.key = t.key AND l.source = 'system'
"""


async def handle(tx: Tx, facts: Sequence[Fact]) -> Mapping[uuid.UUID, Outcome]:
    hellos = [fact for fact in facts if isinstance(fact, Hello)]
    nodes = sorted({hello.node_id for hello in hellos})
    await tx.conn.execute(LOCK_ROWS, nodes)
    rows = {
        row["node_id"]: SessionRow(
            session_epoch=row["session_epoch"],
            system_cap_labels=frozenset(row["labels"]),
        )
        for row in await tx.conn.fetch(READ_ROWS, nodes, len(LABEL_PREFIX) + 1)
    }
    labelings = decide_batch(hellos, rows)
    await _write(tx, list(labelings.values()))
    applied = {labeling.node_id: labeling for labeling in labelings.values()}
    outcomes: dict[uuid.UUID, Outcome] = {}
    for hello in hellos:
        labeling = applied.get(hello.node_id)
        if labeling is None or labeling.epoch != hello.epoch:
            outcomes[hello.fact_id] = outcome.STALE
            continue
        if labeling.changed:
            event = CapabilitiesChanged(
                node_id=hello.node_id,
                epoch=hello.epoch,
                added=list(labeling.added),
                removed=list(labeling.removed),
                at=await tx.fact_time(hello),
            )
            tx.publish(
                event, tx.subjects.event(event.BC_TYPE), cause=hello, order_key=hello.node_id
            )
            applied.pop(hello.node_id)  # one event even if the batch held the Hello twice
    return outcomes


async def _write(tx: Tx, labelings: list[Labeling]) -> None:
    if not labelings:
        return
    # also where the Hello transaction stored them: the write marks the session labeled
    # (`labeled_epoch`, a trigger), and a gateway older than 0.4 stores none
    await tx.conn.execute(
        WRITE_CAPABILITIES,
        [x.node_id for x in labelings],
        [x.epoch for x in labelings],
        [",".join(x.capabilities) for x in labelings],
    )
    additions = [(x.node_id, LABEL_PREFIX + c) for x in labelings for c in x.labels_to_add]
    removals = [(x.node_id, LABEL_PREFIX + c) for x in labelings for c in x.labels_to_remove]
    if additions:
        await tx.conn.execute(ADD_LABELS, [n for n, _ in additions], [k for _, k in additions])
    if removals:
        await tx.conn.execute(REMOVE_LABELS, [n for n, _ in removals], [k for _, k in removals])
