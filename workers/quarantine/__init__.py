"""Quarantine enforcer (`bcw run quarantine`): one identity on two machines.

Counts the alternations of Hellos with a duplicate identity per node in a window;
beyond the limit, revokes the presented certificate (or every live one of the node),
publishes `security.node.quarantined` and a `bc.revocations` notice, and resets the
count. Every counted alternation publishes `security.node.duplicate-session`.
"""

from __future__ import annotations

import asyncpg

from workers.quarantine.apply import make_handler, wants
from workers.quarantine.decide import Limits
from workers.runtime.base.settings import Settings
from workers.runtime.effects.worker import Worker


def build(settings: Settings) -> Worker:
    limits = Limits(settings.quarantine.max_alternations, settings.quarantine.window)
    return Worker(
        name="quarantine", fact_types=("hello",), handle=make_handler(limits), wants=wants
    )


async def is_revoked(conn: asyncpg.Connection, serial: str) -> bool:
    """Whether `serial` was revoked (the gateway's admission refuses it)."""
    return bool(await conn.fetchval("SELECT is_revoked($1)", serial))
