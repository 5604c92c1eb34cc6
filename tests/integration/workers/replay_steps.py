"""Steps of the replay tests: the worker as built from default settings, enqueueing
commands, reading their states, one dispatch round, and the Hello of node n1 at an epoch.
Real SQL on the test's database."""

from __future__ import annotations

import json
import uuid
from typing import Any

import asyncpg

from schemas.subjects import Subjects
from tests.integration import fleet
from workers import replay
from workers.replay.dispatch import dispatch_round
from workers.replay.settings import ReplaySettings
from workers.settings import Settings

SETTINGS = Settings()
WORKER = replay.build(SETTINGS)


async def enqueue(
    db: asyncpg.Connection, node: str, kind: str = "exec", lane: str = "default", **payload: Any
) -> uuid.UUID:
    return await db.fetchval(
        "SELECT enqueue_command($1, $2, $3::jsonb, $4)", node, kind, json.dumps(payload), lane
    )


async def states(
    db: asyncpg.Connection, node: str = "n1"
) -> list[tuple[int, str, int | None, int]]:
    rows = await db.fetch(
        "SELECT seq, state, session_epoch, delivery_attempt FROM commands WHERE node_id = $1 ORDER BY seq",
        node,
    )
    return [tuple(r) for r in rows]  # type: ignore[misc]


async def dispatch(pool: asyncpg.Pool, subjects: Subjects, credits: int = 8) -> int:
    result = await dispatch_round(pool, None, subjects, ReplaySettings(credits=credits))
    return result.dispatched


def hello(epoch: int, **kw: Any) -> Any:
    kw.setdefault(
        "previous",
        {
            "epoch": epoch - 1,
            "gateway_id": "gw-1",
            "boot_id": "boot-1",
            "journal_id": "journal-1",
            "live": False,
        },
    )
    kw.setdefault("boot_id", "boot-1")
    kw.setdefault("journal_id", "journal-1")
    return fleet.hello("n1", epoch, **kw)
