"""Issue #59, item 3: proofs that cannot be kept back.

A gateway the node dialled kept proofs it never used (it refused those Hellos with a
pushback) and opened the node's session with them after the node had said Hello
elsewhere. Now a proof holds only if it is not older than the newest the node's accepted
Hellos gave (migration 0053: a plain proof's `at` not before the newest accepted `at`; a
challenge issued no earlier than the second the last proven Hello was accepted), so a kept
proof is dead once the node has said a proven Hello anywhere. The honest daemon still
connects: after its clock stepped back (its plain proof refused, it signs the refusal's
challenge) and with two Hellos in the same second.

gw-1 is the attacker (its own bound login, the reference gateway's code); gw-2 is honest.
"""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas.proof import HelloProof, prove
from schemas.subjects import Subjects
from tests.integration import fleet
from tests.integration.security.gateways.test_proof_freshness import _move
from tests.integration.security.gateways.test_takeover import _gateways
from tests.integration.streams import RecordingStream
from workers.gateway import Code, Gateway, HelloRequest, Refused
from workers.runtime.store import migrate
from workers.sim.daemon import FakeDaemon

pytestmark = pytest.mark.slow

KEY = fleet.hello_key("n1")


def _request(gateway: str, proof: HelloProof) -> HelloRequest:
    return HelloRequest(node_id="n1", cert_serial="n1-serial", role="worker", boot_id="b1",
                        journal_id="j1", proof=proof)  # fmt: skip


async def _hello(gateway: Gateway, proof: HelloProof) -> Code | None:
    """None: welcomed; else the refusal's code."""
    try:
        await gateway.hello(_request(gateway.gateway_id, proof), RecordingStream())
    except Refused as refused:
        return refused.code
    return None


@pytest.fixture(params=["warn", "require"])
async def two(
    request: pytest.FixtureRequest,
    logins: dict[str, str],
    nc: NATS,
    subjects: Subjects,
    db: asyncpg.Connection,
) -> AsyncIterator[tuple[Gateway, Gateway]]:
    """(attacker gw-1, honest gw-2); n1 joined with its key; the fleet at the param's policy."""
    await migrate.set_hello_proof(db, request.param)
    async with _gateways(logins, nc, subjects, db) as gateways:
        await fleet.join(db, "n1")
        yield gateways


async def test_proofs_a_gateway_kept_back_are_dead_once_the_node_said_hello_elsewhere(
    two: tuple[Gateway, Gateway], db: asyncpg.Connection
) -> None:
    gw1, gw2 = two
    # n1 dialled gw-1 a few times: gw-1 refused each Hello (a pushback) and kept its proof —
    # four at n1's clock, and one signed with a challenge the database gave gw-1
    now = int(time.time())
    kept = [prove(KEY, "n1", "b1", "j1", "gw-1", now - 4 + i) for i in range(4)]
    challenge = await db.fetchrow("SELECT * FROM gateway_hello_challenge('gw-1', 'n1')")
    kept.append(
        prove(KEY, "n1", "b1", "j1", "gw-1", challenge["server_time"], challenge["challenge"])
    )
    # seconds later n1 says Hello at gw-2 (proven: its clock, the fleet's)
    await _move(db, gw1, 3)
    await fleet.say_hello(gw2, _request("gw-2", kept[0]))
    before = await db.fetchrow("SELECT session_epoch, gateway_id FROM node_sessions")
    # gw-1 uses what it kept, later
    await _move(db, gw1, 15)
    refused = [await _hello(gw1, proof) for proof in kept]
    assert refused == [Code.UNAUTHENTICATED] * len(kept)
    assert await db.fetchrow("SELECT session_epoch, gateway_id FROM node_sessions") == before
    assert await db.fetchval("SELECT count(*) FROM session_epochs WHERE gateway_id = 'gw-1'") == 0


async def test_the_honest_daemon_connects_after_its_clock_stepped_back(
    two: tuple[Gateway, Gateway], db: asyncpg.Connection
) -> None:
    """Its Hello accepted at its clock; the machine restarts with its clock a minute behind
    (a daemon's working clock never moves back within one process): its plain proof is
    older than the newest taken, refused once; it signs the refusal's challenge (issued
    now) and is in — whatever its clock says."""
    gw1, _ = two
    before = FakeDaemon("n1", "n1-serial", time.time, random.Random(1), hello_key=KEY)
    await before.tick([gw1])
    assert before.connected, before.refusals
    await gw1.disconnect("n1", before.epoch)
    after = FakeDaemon("n1", "n1-serial", lambda: time.time() - 60, random.Random(2), hello_key=KEY)
    for _ in range(2):
        after.next_try = 0.0
        await after.tick([gw1])
        if after.connected:
            break
    assert after.connected, after.refusals
    assert after.refusals == {"UNAUTHENTICATED": 1}
    assert await db.fetchval("SELECT count(*) FROM session_epochs WHERE proven") == 2


async def test_two_hellos_in_the_same_second_both_open(
    two: tuple[Gateway, Gateway], db: asyncpg.Connection
) -> None:
    """Two proofs of one second (a reconnect at once, to another gateway): both hold — and
    one of an earlier second does not, after them."""
    gw1, gw2 = two
    at = int(await db.fetchval("SELECT extract(epoch FROM compute_now())::bigint"))
    assert await _hello(gw2, prove(KEY, "n1", "b1", "j1", "gw-2", at)) is None
    assert await _hello(gw1, prove(KEY, "n1", "b1", "j1", "gw-1", at)) is None
    earlier = prove(KEY, "n1", "b1", "j1", "gw-1", at - 1)
    assert await _hello(gw1, earlier) is Code.UNAUTHENTICATED
