"""What the forged-fact tests share: the facts a hostile gateway forges about a node
another gateway holds, how many of each every worker must count foreign, and the state
none of them may change."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

import asyncpg

from schemas.facts import Fact
from tests.factories import make_fact
from workers.runtime.effects.worker import Runtime


def forged_facts(forger: str, holder: str, epoch: int, command: uuid.UUID) -> list[Fact]:
    """`forger`'s facts about n1, which `holder` holds at `epoch`: five alternating Hellos
    at that epoch (another machine, other capabilities), a result and progress for its
    command, a BUSY, a close, events and a status report."""
    forged = [
        make_fact(
            "hello",
            gateway_id=forger,
            node_id="n1",
            epoch=epoch,
            boot_id=f"boot-clone-{i}",
            journal_id="journal-1",
            capabilities=["evil", f"x{i}"],
            running_command_ids=[],
            cert={"serial": "n1-serial"},
            previous={
                "epoch": epoch - 1 if i == 0 else epoch,
                "gateway_id": holder,
                "boot_id": "boot-real" if i % 2 == 0 else "boot-clone",
                "journal_id": "journal-1",
                "live": True,
            },
        )
        for i in range(5)
    ]
    ids = {"node_id": "n1", "epoch": epoch, "gateway_id": forger}
    return [
        *forged,
        make_fact("progress", **ids, command_id=str(command), state="running"),
        make_fact(
            "result", **ids, command_id=str(command), outcome="failed", result={}, error="forged"
        ),
        make_fact("rejected", **ids, command_id=str(command), reason="BUSY"),
        make_fact("closed", **ids, reason="stream-closed"),
        make_fact("status", **ids, observed_generation=99, trust_version=0),
        make_fact(
            "events",
            node_id="n1",
            gateway_id=forger,
            journal_id="journal-1",
            events=[{"seq": 1, "kind": "k", "body": {}, "at": "2026-11-30T00:00:00Z"}],
        ),
    ]


#: (worker, fact type) → how many of `forged_facts` it counts foreign
FOREIGN = {
    ("labeler", "hello"): 5,
    ("liveness", "hello"): 5,
    ("quarantine", "hello"): 5,
    ("replay", "hello"): 5,
    ("replay", "progress"): 1,
    ("replay", "result"): 1,
    ("replay", "rejected"): 1,
    ("liveness", "closed"): 1,
    ("recorder", "status"): 1,
    ("recorder", "events"): 1,
}


def counted(runtimes: Iterable[Runtime], outcome: str) -> dict[tuple[str, str], int]:
    """(worker, fact type) → facts counted with `outcome`, over these processes."""
    out: dict[tuple[str, str], int] = {}
    for runtime in runtimes:
        for (worker, fact_type, result), value in runtime.metrics.facts.by_labels().items():
            if result == outcome and value:
                out[(worker, fact_type)] = out.get((worker, fact_type), 0) + int(value)
    return out


async def state(db: asyncpg.Connection) -> tuple[Any, ...]:
    """n1's session, labels, certificates, commands and events, as stored."""
    session = await db.fetchrow(
        "SELECT session_epoch, gateway_id, boot_id, capabilities, duplicate_hellos, "
        "acked_event_seq, observed_generation FROM node_sessions WHERE node_id = 'n1'"
    )
    labels = await db.fetch("SELECT key, source FROM node_labels ORDER BY key")
    certs = await db.fetch("SELECT serial, revoked_at FROM node_certs ORDER BY serial")
    commands = await db.fetch(
        "SELECT command_id, state, session_epoch, delivery_attempt FROM commands ORDER BY seq"
    )
    events = await db.fetchval("SELECT count(*) FROM node_events")
    return (
        tuple(session),
        [tuple(r) for r in labels],
        [tuple(r) for r in certs],
        [tuple(r) for r in commands],
        events,
    )
