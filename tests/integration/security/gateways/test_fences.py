"""Every cell of the fence table (`provenance.FENCES`), on real servers with the five
workers: each fact type, sent by a former holder of the node (gw-old, which held epoch 1
on the node's old journal) and by a stranger (gw-x, which claims the current epoch and
journal), changes nothing — session, liveness, status, events, commands, certificates,
labels; the same facts from the holder of now (gw-cur, epoch 2) do take effect, so each
cell can fail."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas.facts import Fact
from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.factories import make_fact
from tests.integration import fleet
from tests.integration.support import eventually, make_settings, publish_fact, running
from workers.registry import WORKERS
from workers.runtime.bus import streams
from workers.runtime.effects.provenance import FENCES
from workers.runtime.effects.worker import Runtime

pytestmark = pytest.mark.slow

#: who sends: (gateway, epoch, journal)
SENDERS = {
    "former-holder": ("gw-old", 1, "j-old"),
    "stranger": ("gw-x", 2, "j-cur"),
    "holder": ("gw-cur", 2, "j-cur"),
}


def _facts(sender: str, dispatched: uuid.UUID, pending: uuid.UUID) -> dict[str, list[Fact]]:
    """One fact of each type (or a few), as `sender` would send them about n1."""
    gateway, epoch, journal = SENDERS[sender]
    ids = {"node_id": "n1", "epoch": epoch, "gateway_id": gateway}
    hello = make_fact(
        "hello", **ids, boot_id="boot-other", journal_id=journal, capabilities=["evil"],
        running_command_ids=[], cert={"serial": "n1-serial"}, duplicate=True,
        previous={"epoch": epoch - 1, "boot_id": "boot-1", "journal_id": journal, "live": True},
    )  # fmt: skip
    return {
        "hello": [hello],
        "liveness": [
            make_fact(
                "liveness",
                gateway_id=gateway,
                entries=[
                    {"node_id": "n1", "epoch": epoch, "age_ms": 0},
                    # a huge epoch wins nothing over the holder's entries (folded per gateway)
                    *(
                        [{"node_id": "n1", "epoch": 2**40, "age_ms": 0}]
                        if sender != "holder"
                        else []
                    ),
                ],
            ),
        ],
        "closed": [make_fact("closed", **ids, reason="stream-closed")],
        "progress": [make_fact("progress", **ids, command_id=str(dispatched), state="running")],
        "result": [
            make_fact("result", **ids, command_id=str(dispatched), outcome="done", result={}),
            make_fact("result", **ids, command_id=str(pending), outcome="done", result={}),
        ],
        "rejected": [make_fact("rejected", **ids, command_id=str(dispatched), reason="BUSY")],
        "events": [
            make_fact(
                "events",
                node_id="n1",
                gateway_id=gateway,
                journal_id=journal,
                events=[
                    {"seq": 1, "kind": "k", "body": {}, "at": "2026-11-30T00:00:00Z"},
                ],
            ),
        ],
        "status": [make_fact("status", **ids, observed_generation=99, trust_version=99)],
    }


async def _state(db: asyncpg.Connection) -> dict[str, Any]:
    row = await db.fetchrow(
        "SELECT session_epoch, gateway_id, boot_id, journal_id, capabilities, last_seen,"
        " disconnected_at, duplicate_hellos, held_epoch, observed_generation, trust_version"
        " FROM node_sessions WHERE node_id = 'n1'"
    )
    commands = await db.fetch("SELECT seq, state, session_epoch FROM commands ORDER BY seq")
    return {
        "session": dict(row),
        "commands": [tuple(c) for c in commands],
        "events": await db.fetchval("SELECT count(*) FROM node_events"),
        "revoked": await db.fetchval(
            "SELECT count(*) FROM node_certs WHERE revoked_at IS NOT NULL"
        ),
        "labels": await db.fetchval("SELECT count(*) FROM node_labels"),
        "alternations": await db.fetchval("SELECT count(*) FROM node_alternations"),
    }


def _settled(runtime: Runtime) -> int:
    return int(sum(runtime.metrics.facts.by_labels().values()))


#: a former holder's and a stranger's facts of every type go in one run each (none may
#: change anything); the holder's, one type a run (each changes what it should)
CELLS = [
    *(pytest.param(s, None, id=f"{s}-every-type") for s in ("former-holder", "stranger")),
    *(pytest.param("holder", t, id=f"holder-{t}") for t in sorted(k.BC_TYPE for k in FENCES)),
]


@pytest.mark.parametrize(("sender", "fact_type"), CELLS)
async def test_each_fact_type_counts_only_from_its_holder(
    servers: Servers,
    nc: NATS,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
    sender: str,
    fact_type: str | None,
) -> None:
    await streams.provision_streams(nc.jetstream(), subjects)
    await fleet.join(db, "n1")
    await fleet.issued(db, "n1", 1, "gw-old", boot_id="boot-0", journal_id="j-old")
    await fleet.session(
        db, "n1", epoch=2, gateway_id="gw-cur", boot_id="boot-1", journal_id="j-cur",
        seen_ago=timedelta(seconds=60),
    )  # fmt: skip
    await db.execute("UPDATE node_sessions SET observed_generation = 5, trust_version = 3")
    # each epoch's one Hello fact, as the Hello transaction records it
    await db.execute("UPDATE session_epochs SET hello_fact_id = gen_random_uuid()")
    insert = (  # the pending one not due for a day: the dispatch loop leaves it be
        "INSERT INTO commands (node_id, seq, kind, state, session_epoch, delivery_attempt, "
        "not_before) VALUES ('n1', $1, 'exec', $2, $3, $4, compute_now() + interval '1 day') "
        "RETURNING command_id"
    )
    dispatched = await db.fetchval(insert, 1, "dispatched", 2, 1)
    pending = await db.fetchval(insert, 2, "pending", None, 0)
    await db.execute("UPDATE nodes SET last_command_seq = 2")
    facts = _facts(sender, dispatched, pending)
    assert set(facts) == {kind.BC_TYPE for kind in FENCES}  # the test covers the whole table
    before = await _state(db)
    settings = make_settings(servers.nats_url, database_url, subjects)
    workers = [WORKERS[name](settings) for name in sorted(WORKERS)]
    sent = [f for t, fs in facts.items() if fact_type in (None, t) for f in fs]
    async with running(settings, workers) as (runtime, _port):
        for fact in sent:
            await publish_fact(nc.jetstream(), subjects, fact)
        expected = sum(1 for w in workers for f in sent if f.BC_TYPE in w.fact_types)
        await eventually(lambda: _at_least(runtime, expected), what=f"{len(sent)} facts settled")
    after = await _state(db)
    changed = {key for key in before if before[key] != after[key]}
    if sender != "holder":
        assert changed == set(), (sender, fact_type, before, after)
        return
    # the holder's own facts take effect: what each type changes
    assert fact_type is not None
    assert changed >= HOLDER_CHANGES[fact_type], (fact_type, before, after)


#: what the holder's facts of each type change (at least)
HOLDER_CHANGES: dict[str, set[str]] = {
    "hello": set(),  # a second Hello fact of epoch 2 is foreign for everyone: one epoch, one Hello
    "liveness": {"session"},  # last_seen
    "closed": {"session"},  # disconnected
    "progress": {"commands"},
    "result": {"commands"},  # the dispatched command done (the pending one untouched)
    "rejected": {"commands"},  # back to pending
    "events": {"events"},
    "status": {"session"},
}


async def _at_least(runtime: Runtime, n: int) -> bool:
    return _settled(runtime) >= n
