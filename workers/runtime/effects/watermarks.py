"""A worker's watermark: as of when its consumer has applied its facts, read from the bus
(`bus.watermark`) and recorded in `consumer_watermarks` (migration 0044) for the rules of
other workers that conclude from a fact's absence.

Recorded by a worker's loop when other rules read its watermark (another worker's bound
on a hold, the Hello transaction's live window): a worker behind its facts must never
read as one that saw the world go quiet (docs/workers.md, "One clock for sight"). Each
worker's login writes its own row only (`store.policies`).
"""

from __future__ import annotations

import asyncpg
from nats.js import JetStreamContext

from schemas.subjects import Subjects
from workers.runtime.bus.watermark import Unapplied, oldest_unapplied

# `applied_through`: `bus_time` of the oldest fact not applied, or the time it looked when
# none waits; `moved_at`: when that last moved forward
RECORD = """
INSERT INTO consumer_watermarks AS w (consumer, applied_through, reported_at, moved_at)
VALUES ($1, bus_time($2), compute_now(), compute_now())
ON CONFLICT (consumer) DO UPDATE
   SET applied_through = EXCLUDED.applied_through, reported_at = EXCLUDED.reported_at,
       moved_at = CASE WHEN EXCLUDED.applied_through > w.applied_through
                       THEN EXCLUDED.moved_at ELSE w.moved_at END
"""


async def record(
    pool: asyncpg.Pool, js: JetStreamContext, subjects: Subjects, consumer: str, fact_type: str
) -> Unapplied | None:
    """Read what `consumer` has not applied of its `fact_type` facts, and record it; None
    (nothing recorded: its row ages, and who reads it knows it is old) when the bus does
    not say."""
    found = await oldest_unapplied(
        js, subjects.facts_stream, consumer, subjects.fact_filter(fact_type)
    )
    if found is not None:
        await pool.execute(RECORD, consumer, found.oldest)
    return found
