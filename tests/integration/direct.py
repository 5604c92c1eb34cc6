"""Apply facts with a worker's handler in one transaction on the real database, without
the bus: for rule tests that need many small steps (the replay model). The consumer
loop adds decoding, the inbox and acks around exactly this call."""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Sequence
from typing import Any

import asyncpg

from schemas import Fact
from schemas.subjects import Subjects
from tests.integration.support import OUTBOX_MESSAGES
from workers.runtime.effects.outcome import Outcome
from workers.runtime.effects.worker import Tx, Worker, handle_bound

#: the facts' "stream sequences": increasing in the order they are applied, as the
#: stream's would be in the order they were published
_PUBLISHED = itertools.count(1)


async def apply(
    conn: asyncpg.Connection, worker: Worker, subjects: Subjects, *facts: Fact
) -> dict[uuid.UUID, Outcome]:
    sequences = {fact.fact_id: next(_PUBLISHED) for fact in facts}
    async with conn.transaction():
        tx = Tx(conn, subjects, {}, sequence=lambda fact: sequences.get(fact.fact_id))
        outcomes = await handle_bound(tx, worker, list(facts))
        await tx.outbox.write(conn)
    return dict(outcomes)


async def take_outbox(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    """The messages queued so far (and remove them): type, subject and body of each."""
    async with conn.transaction():
        rows = await conn.fetch(OUTBOX_MESSAGES)
        await conn.execute("DELETE FROM outbox; DELETE FROM outbox_packs")
    out = []
    for row in rows:
        body = json.loads(bytes(row["body"]))
        body["_type"] = json.loads(row["headers"])["Bc-Type"]
        body["_subject"] = row["subject"]
        out.append(body)
    return out


def of_type(messages: Sequence[dict[str, Any]], bc_type: str) -> list[dict[str, Any]]:
    return [m for m in messages if m["_type"] == bc_type]
