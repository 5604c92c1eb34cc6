"""What the quarantine counts, from the record only (issue #59, item 4): the Hellos its
transaction recorded as duplicate identities (`session_epochs.duplicate`, migration 0049)
or takeover attempts (`proven = false`) — whatever their facts say, and whether their
facts ever came.

- `recorded`: of a batch's Hello facts, those whose record can count (the runtime's
  `Worker.recorded`, before `provenance`): one query for the batch, one primary-key probe
  of `session_epochs` per Hello, returning only the duplicates, takeover attempts and
  Hellos not bound to their gateway (counted foreign by `provenance`, as by every
  worker). A Hello whose epoch carries no judgement (issued before 0049, or by a writer
  that did not say) is let through on its fact's word, and judged as
  `provenance.as_recorded` has it. Every other Hello — a fleet's reconnects — costs that
  probe and nothing more: no `provenance` lookup, no lock.
- `count_withheld`: a node's duplicates recorded before the Hello being counted whose
  facts the quarantine never had (its gateway never published them, or on a subject the
  quarantine does not read) are counted with it, each as of its epoch's issue time and
  through the gateway it was issued to, for the Hello fact the transaction recorded; one
  range scan of the node's epochs, only for the nodes with a counted duplicate.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from schemas.facts import Fact, Hello
from workers.quarantine.settings import ALTERNATIONS_KEPT

# `duplicate` NULL: no judgement recorded (an epoch before 0049, or none at all): the
# fact's word, or the rule on what was recorded (`provenance.as_recorded`). `proven`
# false means a takeover attempt only from 0049 on (a judgement recorded). A Hello its
# epoch was not issued for (another gateway's epoch, another Hello fact of it, no epoch
# at all) goes on too: `provenance` counts it foreign, as every worker does.
RECORDED = """
SELECT f.fact_id
  FROM unnest($1::text[], $2::bigint[], $3::uuid[], $4::text[], $5::boolean[], $6::text[])
       AS f(node_id, epoch, fact_id, boot_id, says, gateway_id)
  LEFT JOIN session_epochs e ON e.node_id = f.node_id AND e.epoch = f.epoch
 WHERE e.duplicate OR (e.duplicate IS NOT NULL AND e.proven IS FALSE)
    OR (e.duplicate IS NULL
        AND (f.says OR (e.previous_live AND e.previous_boot_id IS DISTINCT FROM f.boot_id
                        AND e.previous_boot_id IS NOT NULL)))
    OR e.gateway_id IS DISTINCT FROM f.gateway_id
    OR e.hello_fact_id <> f.fact_id
"""

# Before each node's counted Hello, its recorded duplicates not counted yet (a day at
# most: older ones were pruned, and are never counted again), with what their events say.
WITHHELD = f"""
WITH counted AS (
    INSERT INTO node_alternations (node_id, epoch, issued_at, fact_id, gateway_id, proven,
                                   takeover)
    SELECT e.node_id, e.epoch, e.issued_at, e.hello_fact_id, e.gateway_id, e.proven IS TRUE,
           false
      FROM unnest($1::text[], $2::bigint[]) AS t(node_id, upto)
      JOIN session_epochs e ON e.node_id = t.node_id AND e.epoch < t.upto
     WHERE e.duplicate
       AND e.issued_at > compute_now() - interval '{ALTERNATIONS_KEPT.days} day'
    ON CONFLICT (node_id, epoch) DO NOTHING
    RETURNING node_id, epoch
)
SELECT c.node_id, c.epoch, e.gateway_id, e.boot_id, e.previous_boot_id, e.issued_at
  FROM counted c JOIN session_epochs e USING (node_id, epoch)
 ORDER BY c.node_id, c.epoch
"""


@dataclass(frozen=True)
class Withheld:
    """A recorded duplicate counted without its fact, as its Hello transaction recorded it."""

    node_id: str
    epoch: int
    gateway_id: str
    boot_id: str | None
    previous_boot_id: str | None
    #: when its Hello transaction issued the epoch (the database's clock): no fact says it
    issued_at: datetime | None = None


def says(hello: Hello) -> bool:
    """What the fact says of itself: a duplicate identity, or a takeover attempt."""
    return hello.duplicate_identity or hello.proven is False


async def recorded(conn: asyncpg.Connection, facts: Sequence[Fact]) -> set[uuid.UUID]:
    """The ids of the Hellos among `facts` whose record can count (see the module)."""
    hellos = [fact for fact in facts if isinstance(fact, Hello)]
    if not hellos:
        return set()
    rows = await conn.fetch(
        RECORDED,
        [h.node_id for h in hellos],
        [h.epoch for h in hellos],
        [h.fact_id for h in hellos],
        [h.boot_id for h in hellos],
        [says(h) for h in hellos],
        [h.gateway_id for h in hellos],
    )
    return {row["fact_id"] for row in rows}


async def count_withheld(conn: asyncpg.Connection, upto: Mapping[str, int]) -> list[Withheld]:
    """Count each node's recorded duplicates before `upto[node]` that were not counted;
    those counted now, in node and epoch order."""
    if not upto:
        return []
    nodes = sorted(upto)
    rows = await conn.fetch(WITHHELD, nodes, [upto[n] for n in nodes])
    return [Withheld(*row.values()) for row in rows]
