"""What a Hello carries for the replay: the done results the daemon holds, as the
`result` facts they stand for, and whether its node is held for an operator (then what
its Hello says settles nothing: the node's own daemon answers a re-send from its journal)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import asyncpg

from schemas.facts import Hello, Result

# The nodes a quarantine holds for an operator (every session of them held).
HELD_NODES = """
SELECT DISTINCT q.node_id FROM quarantines q
 WHERE q.node_id = ANY($1::text[]) AND q.revoked_at IS NULL AND q.dismissed_at IS NULL
"""


async def held_nodes(conn: asyncpg.Connection, hellos: Sequence[Hello]) -> set[str]:
    """The nodes of `hellos` a quarantine holds for an operator."""
    rows = await conn.fetch(HELD_NODES, sorted({h.node_id for h in hellos}))
    return {r["node_id"] for r in rows}


def results_of(hello: Hello) -> list[Result]:
    """The done results a Hello carries, as the `result` facts they stand for (each with
    an id of its own, derived from the Hello's: the same Hello gives the same ids)."""
    return [
        Result(
            fact_id=uuid.uuid5(hello.fact_id, str(done.command_id)),
            gateway_id=hello.gateway_id,
            observed_at=hello.observed_at,
            node_id=hello.node_id,
            epoch=hello.epoch,
            command_id=done.command_id,
            outcome=done.outcome,
            result=done.result,
            error=done.error,
        )
        for done in hello.results
    ]


def pairs(hellos: Sequence[Hello]) -> list[tuple[Hello, Result]]:
    return [(hello, result) for hello in hellos for result in results_of(hello)]
