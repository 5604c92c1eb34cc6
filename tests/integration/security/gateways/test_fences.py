"""Every cell of the fence table (`provenance.FENCES`), on real servers with the five
workers, from both sides. gw-old held the node at epoch 1 on its old journal; gw-cur
holds it now (epoch 2); gw-x never held it.

- What only a forger could send changes nothing — session, liveness, status, events,
  commands, certificates, labels: a stranger's facts of every type (it claims the
  current epoch and journal), and a former holder's that speak of what it never saw (an
  answer for a command never delivered at its epoch, a BUSY about a delivery not its,
  events past where its journal stands, a generation the node was never given).
- What an honest former holder sends late is accepted as the seed says ("Facts are not
  fenced"): its result and progress for the command it was delivered (re-sent at epoch 2
  since), its events in the gap its journal left, its status report's generation; its
  late Hello, flush, close and BUSY change nothing, by their fences.
- The holder of now's facts take effect, so each cell can fail.
"""

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

#: who sends: (gateway, epoch, journal); `-true`: what an honest one sends
SENDERS = {
    "former-holder": ("gw-old", 1, "j-old"),
    "former-holder-true": ("gw-old", 1, "j-old"),
    "stranger": ("gw-x", 2, "j-cur"),
    "holder": ("gw-cur", 2, "j-cur"),
}
#: the node's spec generation, and what its row observed so far
SPEC, OBSERVED = 7, 5


def _event(seq: int) -> dict[str, Any]:
    return {"seq": seq, "kind": "k", "body": {}, "at": "2026-11-30T00:00:00Z"}


def _facts(sender: str, commands: dict[str, uuid.UUID]) -> dict[str, list[Fact]]:
    """One fact of each type (or a few), as `sender` would send them about n1.
    `commands`: `dispatched` (delivered at epoch 2 only), `pending` (never delivered),
    `resent` (delivered at epoch 1, re-sent at epoch 2)."""
    gateway, epoch, journal = SENDERS[sender]
    ids = {"node_id": "n1", "epoch": epoch, "gateway_id": gateway}
    true = sender == "former-holder-true"
    # a forger's answers are about a command not delivered at its epoch (the stranger's
    # epoch 2 it was delivered at: its binding stops it); an honest one's, about its own
    answered = commands["resent"] if true else commands["dispatched"]
    hello = make_fact(
        "hello",
        **ids,
        boot_id="boot-other",
        journal_id=journal,
        capabilities=["evil"],
        running_command_ids=[],
        cert={"serial": "n1-serial"},
        duplicate=True,
        previous={"epoch": epoch - 1, "boot_id": "boot-1", "journal_id": journal, "live": True},
    )
    if true:  # its own, the one Hello fact of epoch 1, late
        hello = make_fact(
            "hello",
            **ids,
            boot_id="boot-0",
            journal_id=journal,
            capabilities=["nvml"],
            running_command_ids=[],
            cert={"serial": "n1-serial"},
            previous={"epoch": 0, "live": False},
        )
    generation = SPEC - 1 if true or sender == "holder" else SPEC + 92
    huge = (
        [{"node_id": "n1", "epoch": 2**40, "age_ms": 0}] if sender != "holder" and not true else []
    )
    return {
        "hello": [hello],
        "liveness": [
            make_fact(
                "liveness",
                gateway_id=gateway,
                # a huge epoch wins nothing over the holder's entries (folded per gateway)
                entries=[{"node_id": "n1", "epoch": epoch, "age_ms": 0}, *huge],
            ),
        ],
        "closed": [make_fact("closed", **ids, reason="stream-closed")],
        "progress": [make_fact("progress", **ids, command_id=str(answered), state="running")],
        "result": [
            make_fact("result", **ids, command_id=str(answered), outcome="done", result={}),
            make_fact(
                "result", **ids, command_id=str(commands["pending"]), outcome="done", result={}
            ),
        ],
        # an honest former holder's BUSY is about delivery 1 of the command re-sent since
        "rejected": [
            make_fact(
                "rejected",
                **ids,
                command_id=str(commands["resent" if true else "dispatched"]),
                reason="BUSY",
            )
        ],
        "events": [
            make_fact(
                "events",
                node_id="n1",
                gateway_id=gateway,
                journal_id=journal,
                # j-old holds 1, 2 and 4: 3 is its gap, 5 and 6 past its end
                events=[_event(3)] if true else [_event(s) for s in (1, 5, 6)],
            ),
        ],
        # a forger's generation was never given to the node
        "status": [make_fact("status", **ids, trust_version=99, observed_generation=generation)],
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


#: a forger's facts of every type go in one run each (none may change anything); an
#: honest former holder's and the holder's, one type a run (each changes what it should)
CELLS = [
    *(pytest.param(s, None, id=f"{s}-every-type") for s in ("former-holder", "stranger")),
    *(
        pytest.param(s, t, id=f"{s}-{t}")
        for s in ("former-holder-true", "holder")
        for t in sorted(k.BC_TYPE for k in FENCES)
    ),
]


@pytest.mark.parametrize(("sender", "fact_type"), CELLS)
async def test_each_fact_type_counts_for_what_its_gateway_saw(
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
        db,
        "n1",
        epoch=2,
        gateway_id="gw-cur",
        boot_id="boot-1",
        journal_id="j-cur",
        seen_ago=timedelta(seconds=60),
    )
    await db.execute(
        "UPDATE node_sessions SET observed_generation = $1, trust_version = 3", OBSERVED
    )
    await db.execute("UPDATE nodes SET spec_generation = $1", SPEC)
    insert = (  # the pending one not due for a day: the dispatch loop leaves it be
        "INSERT INTO commands (node_id, seq, kind, state, session_epoch, delivery_attempt, "
        "delivered_epochs, not_before) VALUES ('n1', $1, 'exec', $2, $3, $4, $5, "
        "compute_now() + interval '1 day') RETURNING command_id"
    )
    commands = {
        "dispatched": await db.fetchval(insert, 1, "dispatched", 2, 1, [2]),
        "pending": await db.fetchval(insert, 2, "pending", None, 0, []),
        "resent": await db.fetchval(insert, 3, "dispatched", 2, 2, [1, 2]),
    }
    await db.execute("UPDATE nodes SET last_command_seq = 3")
    # what gw-old's session stored of its journal: 1, 2 and 4 (3 still on its way)
    await db.execute(
        "INSERT INTO node_events (node_id, journal_id, seq, kind, body, at) "
        "SELECT 'n1', 'j-old', s, 'k', '{}', compute_now() FROM unnest('{1,2,4}'::bigint[]) s"
    )
    facts = _facts(sender, commands)
    assert set(facts) == {kind.BC_TYPE for kind in FENCES}  # the test covers the whole table
    # each epoch's one Hello fact, as the Hello transaction records it (epoch 1's is the
    # honest former holder's own Hello)
    await db.execute("UPDATE session_epochs SET hello_fact_id = gen_random_uuid()")
    if sender == "former-holder-true":
        await db.execute(
            "UPDATE session_epochs SET hello_fact_id = $1 WHERE epoch = 1",
            facts["hello"][0].fact_id,
        )
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
    if fact_type is None:
        assert changed == set(), (sender, before, after)
        return
    if sender == "former-holder-true":
        assert changed == FORMER_HOLDER_CHANGES[fact_type], (fact_type, before, after)
        assert after == _expected(before, fact_type)
        return
    # the holder's own facts take effect: what each type changes
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

#: what an honest former holder's late facts of each type change (exactly)
FORMER_HOLDER_CHANGES: dict[str, set[str]] = {
    "hello": set(),  # its epoch is past: stale everywhere
    "liveness": set(),  # not the row's epoch and gateway: a zombie notice, no sight
    "closed": set(),  # not the row's: the session of now stays connected
    "progress": set(),  # about delivery 1; the command was re-sent since (its BUSY reaches it)
    "result": {"commands"},  # its delivery finished: done, re-sent since or not
    "rejected": set(),  # about delivery 1; the command was re-sent since
    "events": {"events"},  # the gap its journal left
    "status": set(),  # an earlier session's word: the node reports again after its Welcome
}


def _expected(before: dict[str, Any], fact_type: str) -> dict[str, Any]:
    """The state after an honest former holder's `fact_type`, from `before`."""
    after = {**before, "session": dict(before["session"])}
    resent = next(c for c in before["commands"] if c[0] == 3)
    others = [c for c in before["commands"] if c[0] != 3]
    if fact_type == "result":
        after["commands"] = sorted([*others, (3, "done", resent[2])])
    elif fact_type == "events":
        after["events"] = before["events"] + 1
    return after


async def _at_least(runtime: Runtime, n: int) -> bool:
    return _settled(runtime) >= n
