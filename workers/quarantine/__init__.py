"""Quarantine enforcer (`bcw run quarantine`): one identity on two machines.

Counts the alternations of Hellos with a duplicate identity per node in a window — the
Hellos their transaction recorded as such, whatever their facts say (`record`);
beyond the limit, revokes the presented certificate (or every live one of the node),
publishes `security.node.quarantined` and a `bc.revocations` notice, and resets the
count. Every counted alternation publishes `security.node.duplicate-session`.

Without an inbox: an epoch is counted at most once (`node_alternations`, keyed by node
and epoch, with the Hello fact it was counted for), and only a counted alternation
publishes, revokes or releases a hold; so a Hello delivered again finds its epoch
counted and does nothing (`DUPLICATE`), and another Hello fact of a counted epoch is
`FOREIGN`.
"""

from __future__ import annotations

import asyncpg

from workers.quarantine import record
from workers.quarantine.apply import make_handler, wants
from workers.quarantine.breaker import release_loop
from workers.quarantine.decide import Breaker, Limits
from workers.quarantine.metrics import QuarantineMetrics, hello_proof_note
from workers.quarantine.settings import Configured
from workers.runtime.effects.worker import Worker


def build(settings: Configured) -> Worker:
    q = settings.quarantine
    limits = Limits(
        q.max_alternations,
        q.window,
        Breaker(q.breaker_quarantines, q.breaker_window, q.breaker_share),
    )
    return Worker(
        name="quarantine",
        fact_types=("hello",),
        handle=make_handler(limits),
        wants=wants,
        recorded=record.recorded,
        inbox=False,
        loops=(release_loop(q.window),),
        metrics=(QuarantineMetrics,),
        notes=(hello_proof_note,),
    )


async def is_revoked(conn: asyncpg.Connection, serial: str) -> bool:
    """Whether `serial` was revoked (the gateway's admission refuses it)."""
    return bool(await conn.fetchval("SELECT is_revoked($1)", serial))
