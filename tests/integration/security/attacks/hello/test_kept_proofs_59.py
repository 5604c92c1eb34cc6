"""Issue #59, item 3: proofs that cannot be kept back.

A gateway the node dialled kept proofs it never used (it refused those Hellos with a
pushback) and opened the node's session with them after the node had said Hello
elsewhere. Now a proof holds only if it is newer than what the node's accepted Hellos
gave: a plain proof's `at` after the newest accepted `at` (the daemon's `at` rises: its
clock, or its last `at` + 1), a challenge only while the node's mark is the one its MAC
covered (no proven Hello of the node accepted since it was issued) — migrations 0053 and
0059 — so a kept proof is dead once the node has said a proven Hello anywhere, in the
same second too. The honest daemon still connects: after its clock stepped back (its
plain proof refused, it signs the refusal's challenge), with two Hellos in the same
second, and with its `at` run more than 5 minutes ahead of its clock.

gw-1 is the attacker (its own bound login, the reference gateway's code); gw-2 is honest.
"""

from __future__ import annotations

import asyncio
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
    return HelloRequest(
        node_id="n1",
        cert_serial="n1-serial",
        role="worker",
        boot_id="b1",
        journal_id="j1",
        proof=proof,
    )


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


async def _start_of_a_second(db: asyncpg.Connection) -> int:
    """The fleet's clock just after a second began (what follows fits in that second)."""
    while True:
        now = float(await db.fetchval("SELECT extract(epoch FROM compute_now())"))
        if now % 1 < 0.3:
            return int(now)
        await asyncio.sleep(1.02 - now % 1)


async def test_proofs_kept_back_in_the_second_the_node_said_hello_elsewhere_are_dead(
    two: tuple[Gateway, Gateway], db: asyncpg.Connection
) -> None:
    """Migration 0053 took them (a plain proof was refused only before the newest `at`, a
    challenge only before the second the last Hello was accepted): gw-1 kept, in second
    T, three plain proofs at T and one signed with a challenge issued at T; n1 said a
    proven Hello at gw-2 in that same second. None of them opens now: a plain proof's `at`
    must be after the newest taken, and the challenge's MAC covered n1's mark, which that
    Hello moved."""
    gw1, gw2 = two
    now = await _start_of_a_second(db)
    kept = [prove(KEY, "n1", "b1", "j1", "gw-1", now) for _ in range(3)]
    challenge = await db.fetchrow("SELECT * FROM gateway_hello_challenge('gw-1', 'n1')")
    kept.append(
        prove(KEY, "n1", "b1", "j1", "gw-1", challenge["server_time"], challenge["challenge"])
    )
    assert await _hello(gw2, prove(KEY, "n1", "b1", "j1", "gw-2", now)) is None
    accepted = await db.fetchval("SELECT extract(epoch FROM accepted_at) FROM hello_marks")
    assert int(accepted) == now == challenge["server_time"]  # all in that one second
    before = await db.fetchrow("SELECT session_epoch, gateway_id FROM node_sessions")
    assert [await _hello(gw1, proof) for proof in kept] == [Code.UNAUTHENTICATED] * len(kept)
    assert await db.fetchrow("SELECT session_epoch, gateway_id FROM node_sessions") == before
    assert await db.fetchval("SELECT count(*) FROM session_epochs WHERE gateway_id = 'gw-1'") == 0
    # a challenge issued after n1's last Hello, used next, holds: the honest path
    fresh = await db.fetchrow("SELECT * FROM gateway_hello_challenge('gw-1', 'n1')")
    signed = prove(KEY, "n1", "b1", "j1", "gw-1", fresh["server_time"], fresh["challenge"])
    assert await _hello(gw1, signed) is None


async def test_a_challenge_is_dead_once_the_node_said_hello_after_it_was_issued(
    two: tuple[Gateway, Gateway], db: asyncpg.Connection
) -> None:
    """Whatever the clock says: the fleet's clock moved back between (a second Hello
    accepted at an earlier database time) still kills a challenge issued before it."""
    gw1, gw2 = two
    assert await _hello(gw2, prove(KEY, "n1", "b1", "j1", "gw-2", int(time.time()))) is None
    challenge = await db.fetchrow("SELECT * FROM gateway_hello_challenge('gw-1', 'n1')")
    await _move(db, gw1, -2)
    assert await _hello(gw2, prove(KEY, "n1", "b1", "j1", "gw-2", int(time.time()) + 1)) is None
    kept = prove(KEY, "n1", "b1", "j1", "gw-1", challenge["server_time"], challenge["challenge"])
    assert await _hello(gw1, kept) is Code.UNAUTHENTICATED
    assert await db.fetchval("SELECT count(*) FROM session_epochs WHERE gateway_id = 'gw-1'") == 0


async def test_two_hellos_in_the_same_second_both_open(
    two: tuple[Gateway, Gateway], db: asyncpg.Connection
) -> None:
    """The honest daemon's reconnect at once, to another gateway, in one second: both
    open — its second proof signs its last `at` + 1 (its `at` rises); a proof at the
    second already taken (another nonce) does not."""
    gw1, gw2 = two
    await _start_of_a_second(db)
    daemon = FakeDaemon("n1", "n1-serial", time.time, random.Random(3), hello_key=KEY)
    daemon.home = 1
    await daemon.tick([gw1, gw2])
    assert daemon.connected and daemon.gateway is gw2, daemon.refusals
    await gw2.disconnect("n1", daemon.epoch)
    daemon.drop("test")
    daemon.home, daemon.next_try = 0, 0.0
    await daemon.tick([gw1, gw2])
    assert daemon.connected and daemon.gateway is gw1, daemon.refusals
    assert not daemon.refusals
    ats = await db.fetchval("SELECT at FROM hello_marks")
    assert await db.fetchval("SELECT count(*) FROM session_epochs WHERE proven") == 2
    taken = prove(KEY, "n1", "b1", "j1", "gw-1", ats)
    assert await _hello(gw1, taken) is Code.UNAUTHENTICATED


async def test_a_daemon_whose_clock_steps_back_within_its_process_connects(
    two: tuple[Gateway, Gateway], db: asyncpg.Connection
) -> None:
    """Its host's clock steps back a minute between two Hellos: its working clock never
    moves back and its `at` rises, so its plain proof holds, at once."""
    gw1, _ = two
    clock = [time.time()]
    daemon = FakeDaemon("n1", "n1-serial", lambda: clock[0], random.Random(4), hello_key=KEY)
    await daemon.tick([gw1])
    assert daemon.connected, daemon.refusals
    await gw1.disconnect("n1", daemon.epoch)
    daemon.drop("test")
    clock[0] -= 60
    daemon.next_try = 0.0
    await daemon.tick([gw1])
    assert daemon.connected and not daemon.refusals, daemon.refusals


async def test_a_daemon_whose_at_ran_past_the_window_connects_by_the_challenge(
    two: tuple[Gateway, Gateway], db: asyncpg.Connection
) -> None:
    """More Hellos than one a second run its `at` ahead of its clock (the 240 a minute
    allow 180 s a minute at most); past 5 minutes ahead its plain proof is refused as
    stale, and it signs the refusal's challenge: in, at the second Hello."""
    gw1, _ = two
    daemon = FakeDaemon("n1", "n1-serial", time.time, random.Random(5), hello_key=KEY)
    daemon.server.signed = int(time.time()) + 400
    for _ in range(2):
        daemon.next_try = 0.0
        await daemon.tick([gw1])
        if daemon.connected:
            break
    assert daemon.connected, daemon.refusals
    assert daemon.refusals == {"UNAUTHENTICATED": 1}
