"""Attacks on the change of issue 58 (delivery history, fences, proof freshness, quarantine
at `require`, no downgrade, node_last_seen), on real servers, one hostile principal at a
time. Each test asserts what the honest participants keep: four were found
failing on the change as first written, and are the fixes' tests now.

gw-1 is the attacker (its own bound login, the reference gateway's code, no node's key);
gw-2 is honest. n1 proves its Hellos (its key enrolled at join).

FOUND, AND FIXED (the attacker got something):
1. `test_a_former_holders_takeover_records_no_event_and_moves_no_ack[warn|off]`: a former
   holder of n1's journal opens a takeover (unproven, held) naming that journal; the row
   then says it holds the journal, so `event_bound` lets it store any seq: forged events
   4-40 stored, the ack raised to 40, and n1's own next Hello told to forget up to 40.
2. `test_a_former_holder_cannot_claim_a_generation_made_after_it_lost_the_node`: at
   `require`, a gateway that held epoch 1 reports `observed_generation` = the spec
   generation made after it lost the node: accepted (only `<= spec_generation` checked).
3. `test_a_held_session_finishes_none_of_the_nodes_commands[running-list|hello-results]`:
   a session held node-wide by a quarantine still finishes the node's commands: its
   Hello's `running_command_ids` "keeps" them at its epoch (then its result counts), and
   its Hello's `results` settle any command delivered at an earlier epoch, elsewhere.
4. `test_one_proof_of_the_node_opens_no_hello_from_another_boot` and
   `test_two_proofs_the_node_gave_a_gateway_do_not_revoke_it`: `hello_proof_message` is
   `concat_ws(E'\n', ...)`, which skips NULLs, and no field is kept free of line feeds:
   a proof the node signed for (b1, j1, gw-1) also proves boot "b1\nj1" with journal
   NULL. Through gw-1's own `gateway_hello` that is a proven Hello from another boot — a
   proven duplicate identity. Two such proofs and n1's own reconnects make four proven
   alternations: at `require` n1 (no clone) is revoked.

HELD: a takeover by a gateway that never held the journal records no event (below); the
challenges and the secrets, in test_held_58.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas.proof import prove
from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration import fleet
from tests.integration.security.gateways.test_takeover import HOLD_MAX, _gateways, five_workers
from tests.integration.streams import RecordingStream
from tests.integration.support import eventually, make_settings, running
from workers.gateway import Gateway, HelloRequest
from workers.registry import WORKERS
from workers.replay.commands import enqueue_command as enqueue
from workers.runtime.store import migrate

pytestmark = pytest.mark.slow


def _hello(
    boot: str, journal: str, gateway: str | None, running: list[str] | None = None
) -> HelloRequest:
    """n1's Hello: proven for `gateway` when given (its own daemon dialled that gateway),
    unproven otherwise (the attacker's, who has no key)."""
    proof = None
    if gateway is not None:
        proof = prove(fleet.hello_key("n1"), "n1", boot, journal, gateway, fleet.rising_at("n1"))
    return HelloRequest(
        node_id="n1",
        cert_serial="n1-serial",
        role="worker",
        boot_id=boot,
        journal_id=journal,
        proof=proof,
        running_command_ids=running or [],
        process_started_at=datetime.now(UTC),
    )


def _events(seqs: range, body: dict[str, Any]) -> list[dict[str, Any]]:
    at = datetime.now(UTC).isoformat()
    return [{"seq": s, "kind": "k", "body": body, "at": at} for s in seqs]


@contextlib.asynccontextmanager
async def _world(
    servers: Servers,
    logins: dict[str, str],
    nc: NATS,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
    policy: str,
) -> AsyncIterator[tuple[Gateway, Gateway]]:
    await migrate.set_hello_proof(db, policy)
    settings = five_workers(make_settings(servers.nats_url, database_url, subjects))
    async with (
        _gateways(logins, nc, subjects, db) as (attacker, honest),
        running(settings, [build(settings) for build in WORKERS.values()]),
    ):
        await fleet.join(db, "n1")
        yield attacker, honest


async def _stored(db: asyncpg.Connection) -> dict[int, Any]:
    rows = await db.fetch(
        "SELECT seq, body::text AS body FROM node_events WHERE node_id = 'n1' AND journal_id = 'j1'"
    )
    return {r["seq"]: r["body"] for r in rows}


async def _acked(db: asyncpg.Connection) -> int:
    return int(await db.fetchval("SELECT acked_event_seq FROM node_sessions WHERE node_id = 'n1'"))


# -- 1. a takeover by a former holder of the journal records events -----------------------


@pytest.mark.parametrize("policy", ["warn", "off"])
async def test_a_former_holders_takeover_records_no_event_and_moves_no_ack(
    servers: Servers,
    logins: dict[str, str],
    nc: NATS,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
    policy: str,
) -> None:
    """n1 once dialled gw-1 (proven, journal j1), then moved to gw-2 and journaled events
    1-3 there. Below `require`, gw-1 says an unproven Hello for n1 naming j1 (a takeover
    attempt: held for good, and docs/kubernetes.md says "its status and events are not
    recorded"), then sends events 4-40 on j1. None may be recorded, and the ack may not
    move: n1's own next Hello must be told the ack it had (3), so that its daemon sends its
    true events 4.. and they are stored."""
    async with _world(servers, logins, nc, subjects, database_url, db, policy) as (gw1, gw2):
        # n1's past: it dialled gw-1 once (proven), left it, and went to gw-2
        await gw1.hello(_hello("b1", "j1", "gw-1"), RecordingStream())
        await gw1.disconnect("n1", 1)
        await gw2.hello(_hello("b1", "j1", "gw-2"), RecordingStream())
        await gw2.events("n1", "j1", _events(range(1, 4), {"true": 1}))
        await eventually(lambda: _ack_is(db, 3), what="n1's events 1-3 stored and acked")

        # the attack: a takeover naming the journal gw-1 once held, then events past its end
        evil = RecordingStream()
        await gw1.hello(_hello("evil-boot", "j1", None), evil)
        await gw1.events("n1", "j1", _events(range(4, 41), {"forged": 1}))
        await asyncio.sleep(2 * HOLD_MAX.total_seconds() + 1)
        forged = {s: b for s, b in (await _stored(db)).items() if "forged" in b}
        ack_after_attack = await _acked(db)

        # n1 says Hello again (proven): what is its daemon told it may forget?
        welcome = await gw2.hello(_hello("b1", "j1", "gw-2"), RecordingStream())
        assert (sorted(forged), ack_after_attack, welcome.acked_event_seq) == ([], 3, 3), (
            f"the takeover stored forged events {sorted(forged)[:3]}..{sorted(forged)[-1:]}, "
            f"ack {ack_after_attack}; n1's daemon told to forget up to {welcome.acked_event_seq}"
        )


async def _ack_is(db: asyncpg.Connection, n: int) -> bool:
    return await _acked(db) == n


async def test_a_takeover_by_a_gateway_that_never_held_the_journal_records_no_event(
    servers: Servers,
    logins: dict[str, str],
    nc: NATS,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
) -> None:
    """The same attack by a gateway that never held n1 (held: it records nothing)."""
    async with _world(servers, logins, nc, subjects, database_url, db, "warn") as (gw1, gw2):
        await gw2.hello(_hello("b1", "j1", "gw-2"), RecordingStream())
        await gw2.events("n1", "j1", _events(range(1, 4), {"true": 1}))
        await eventually(lambda: _ack_is(db, 3), what="n1's events 1-3 stored and acked")
        await gw1.hello(_hello("evil-boot", "j1", None), RecordingStream())
        await gw1.events("n1", "j1", _events(range(4, 41), {"forged": 1}))
        await asyncio.sleep(2 * HOLD_MAX.total_seconds() + 1)
        assert sorted(await _stored(db)) == [1, 2, 3]
        welcome = await gw2.hello(_hello("b1", "j1", "gw-2"), RecordingStream())
        assert welcome.acked_event_seq == 3


# -- 2. a former holder's status claims a generation made after it lost the node ---------


async def _observed(db: asyncpg.Connection) -> int:
    return int(
        await db.fetchval("SELECT observed_generation FROM node_sessions WHERE node_id = 'n1'")
    )


@pytest.mark.parametrize("policy", ["require"])
async def test_a_former_holder_cannot_claim_a_generation_made_after_it_lost_the_node(
    servers: Servers,
    logins: dict[str, str],
    nc: NATS,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
    policy: str,
) -> None:
    """n1 dialled gw-1 (epoch 1, spec generation 1 then), left, and says Hello at gw-2
    (epoch 2), reporting generation 1 applied. The operator then gives n1 generations 2-5
    (a firewall change, a key rotation): n1 has not applied them. docs/kubernetes.md: a
    former holder's facts count for "only what it could have sent while it held it". gw-1
    (which held epoch 1 only) reports generation 5 observed at epoch 1: the control plane
    must not believe n1 applied a spec it was never sent while gw-1 held it."""
    async with _world(servers, logins, nc, subjects, database_url, db, policy) as (gw1, gw2):
        await db.execute("SELECT set_node_spec('n1', '{\"v\": 1}')")
        await gw1.hello(_hello("b1", "j1", "gw-1"), RecordingStream())
        await gw1.status("n1", 1, 1)
        await eventually(lambda: _observed_is(db, 1), what="generation 1 observed")
        await gw1.disconnect("n1", 1)
        await gw2.hello(_hello("b1", "j1", "gw-2"), RecordingStream())
        await gw2.status("n1", 2, 1)
        for v in range(2, 6):
            await db.execute("SELECT set_node_spec('n1', $1::jsonb)", f'{{"v": {v}}}')
        # the attack: its own epoch 1, a fact published with its nkey (no session needed)
        from tests.factories import make_fact
        from tests.integration.support import publish_fact

        forged = make_fact(
            "status",
            node_id="n1",
            epoch=1,
            gateway_id="gw-1",
            observed_generation=5,
            trust_version=0,
        )
        await publish_fact(nc.jetstream(), subjects, forged)
        await asyncio.sleep(3)
        assert await _observed(db) == 1, "n1 reported as having applied generation 5"


async def _observed_is(db: asyncpg.Connection, n: int) -> bool:
    return await _observed(db) == n


# -- 3. a session every quarantine rule holds still finishes the node's commands ---------


async def _state(db: asyncpg.Connection, command: uuid.UUID) -> tuple[Any, ...]:
    row = await db.fetchrow(
        "SELECT state, session_epoch, failure_reason FROM commands WHERE command_id = $1", command
    )
    return tuple(row)


@pytest.mark.parametrize("how", ["running-list", "hello-results"])
async def test_a_held_session_finishes_none_of_the_nodes_commands(
    servers: Servers,
    logins: dict[str, str],
    nc: NATS,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
    how: str,
) -> None:
    """At `require`. n1's command runs at gw-2 (epoch 1). A quarantine of n1 is held for an
    operator (the breaker past the fleet's bound): docs/workers.md, "a held quarantine
    holds every session of its node until it is released or judged", no command reaches
    it. n1's daemon dials gw-1 (proven, epoch 2: held). gw-1 says, in that Hello, that the
    command runs there (`running_command_ids`) and then fails it, or carries a made-up
    done result for it in the Hello itself (`results`): a held session gets nothing of the
    node, so the command must stay n1's, unfinished, for the operator to judge."""
    async with _world(servers, logins, nc, subjects, database_url, db, "require") as (gw1, gw2):
        await gw2.hello(_hello("b1", "j1", "gw-2"), RecordingStream())
        work = await enqueue(db, "n1", "exec", {"secret": "s3"})
        await eventually(lambda: _is(db, work, ("dispatched", 1, None)), what="work at gw-2")
        # held for an operator (as the breaker leaves it past the fleet-wide bound)
        await db.execute(
            "INSERT INTO quarantines (node_id, epoch, gateway_id, alternations, gateways, "
            "serials, held) VALUES ('n1', 1, 'gw-2', 4, '{gw-2}', '{n1-serial}', 'breaker')"
        )
        request = _hello("b1", "j1", "gw-1", running=[str(work)] if how == "running-list" else [])
        if how == "hello-results":
            done = {"command_id": str(work), "outcome": "done", "result": {"forged": True}}
            request = _with_results(request, [done])
        evil = RecordingStream()
        welcome = await gw1.hello(request, evil)
        if how == "running-list":  # not kept running on its word: waits, pending
            await eventually(
                lambda: _is(db, work, ("pending", None, None)),
                what="parked, not kept at the held session",
                within=10,
            )
            await gw1.result("n1", welcome.epoch, work, "failed", None, "forged")
        await asyncio.sleep(3)
        assert evil.delivered == []
        assert (await _state(db, work))[0] not in ("done", "failed"), await _state(db, work)


def _with_results(request: HelloRequest, results: list[Any]) -> HelloRequest:
    import dataclasses

    return dataclasses.replace(request, results=results)


async def _is(db: asyncpg.Connection, command: uuid.UUID, want: tuple[Any, ...]) -> bool:
    return await _state(db, command) == want


# -- 4. one proof the node gave gw-1, read as a Hello from another boot ------------------

SHIFTED_HELLO = """
SELECT * FROM gateway_hello('gw-1', $1, 'n1', 'n1-serial', $2, $3, 'worker', '1.0.0', 3,
       'grpc', false, 0, 0, '', '90s', NULL, $4, $5, $6, $7)
"""


async def _shifted(
    conn: asyncpg.Connection, lease: int, proof: Any
) -> tuple[asyncpg.Record, uuid.UUID]:
    """gw-1's own Hello transaction with a proof n1's daemon signed for (b1, j1, gw-1):
    the boot id "b1\\nj1" and no journal id. `concat_ws` skips a NULL and a field may
    hold a line feed, so the database's message is the very bytes n1 signed."""
    fact_id = uuid.uuid4()
    row = await conn.fetchrow(
        SHIFTED_HELLO, lease, "b1\nj1", None, fact_id, proof.at, proof.nonce, proof.mac
    )
    return row, fact_id


async def test_one_proof_of_the_node_opens_no_hello_from_another_boot(
    servers: Servers,
    logins: dict[str, str],
    nc: NATS,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
) -> None:
    """At `require`. n1 (boot b1) is live at gw-2. gw-1 holds one proof n1's daemon sent it
    (a Hello n1 said to gw-1 within the last 5 minutes). The proof signs boot b1: whatever
    gw-1 does with it, it must not be a proven Hello from another boot (a duplicate
    identity, which at `require` counts toward a revocation through any gateways)."""
    async with _world(servers, logins, nc, subjects, database_url, db, "require") as (_, gw2):
        await gw2.hello(_hello("b1", "j1", "gw-2"), RecordingStream())
        proof = prove(fleet.hello_key("n1"), "n1", "b1", "j1", "gw-1", fleet.rising_at("n1"))
        conn = await asyncpg.connect(logins["bcw_gateway_bound"])
        try:
            lease = await conn.fetchval("SELECT gateway_acquire('gw-1', '60s')")
            row, _ = await _shifted(conn, lease, proof)
        finally:
            await conn.close()
        recorded = await db.fetchrow(
            "SELECT boot_id, journal_id, proven, duplicate FROM session_epochs "
            "WHERE node_id = 'n1' AND epoch = 2"
        )
        assert row["outcome"] != "opened" or not row["duplicate"], (
            f"gw-1 opened a proven duplicate identity from one proof of boot b1: "
            f"{dict(row)} recorded {dict(recorded) if recorded else None}"
        )


async def test_two_proofs_the_node_gave_a_gateway_do_not_revoke_it(
    servers: Servers,
    logins: dict[str, str],
    nc: NATS,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
) -> None:
    """At `require`, all five workers. n1 (one machine, boot b1, no clone) is live at
    gw-2; it said Hello to gw-1 twice in the last 5 minutes (gw-1 kept both proofs). gw-1
    opens each as a Hello from "another boot" (test above) and says it, and n1's daemon —
    its session superseded — says Hello again at gw-2 each time: four proven
    alternations. The seed revokes a clone pair; n1 is no clone, and must keep its
    certificate."""
    from tests.factories import hello as hello_fact
    from tests.integration.support import publish_fact

    async with _world(servers, logins, nc, subjects, database_url, db, "require") as (_, gw2):
        await gw2.hello(_hello("b1", "j1", "gw-2"), RecordingStream())
        kept = [
            prove(fleet.hello_key("n1"), "n1", "b1", "j1", "gw-1", fleet.rising_at("n1"))
            for _ in range(2)
        ]
        conn = await asyncpg.connect(logins["bcw_gateway_bound"])
        refused = []
        try:
            lease = await conn.fetchval("SELECT gateway_acquire('gw-1', '60s')")
            for proof in kept:
                row, fact_id = await _shifted(conn, lease, proof)
                if row["outcome"] != "opened":  # the proof holds for its own Hello only
                    refused.append(f"gw-1's shifted Hello: {row['outcome']}")
                    continue
                fact = hello_fact(
                    "n1",
                    row["epoch"],
                    fact_id=str(fact_id),
                    gateway_id="gw-1",
                    boot_id="b1-other",
                    journal_id="j1",
                    duplicate=True,
                    cert={"serial": "n1-serial"},
                )
                await publish_fact(nc.jetstream(), subjects, fact)
                await asyncio.sleep(1.0)  # the quarantine counts it
                try:  # n1's daemon, superseded, says Hello again at gw-2
                    await gw2.hello(_hello("b1", "j1", "gw-2"), RecordingStream())
                except Exception as error:  # refused: quarantined
                    refused.append(repr(error))
                await asyncio.sleep(1.0)
        finally:
            await conn.close()
        revoked = await db.fetch("SELECT serial FROM node_certs WHERE revoked_at IS NOT NULL")
        alternations = await db.fetch(
            "SELECT epoch, gateway_id, proven FROM node_alternations WHERE node_id = 'n1' "
            "ORDER BY epoch"
        )
        assert revoked == [], (
            f"n1's certificate revoked {[r['serial'] for r in revoked]} after "
            f"{[tuple(a) for a in alternations]}; n1's Hello refused: {refused}"
        )
