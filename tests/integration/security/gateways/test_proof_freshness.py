"""Proof freshness that does not rest on the daemon's clock (docs/contract.md, "The Hello's
proof"), on real servers through the reference gateway under its own bound login:

- a daemon 10 minutes behind, and one 10 minutes ahead, connects at `require` within 3
  Hellos: the refusal carries the database's time and a challenge, and it signs them;
- a captured proof, replayed at once or later, is refused; a challenge opens one Hello of
  its node, at its gateway, at its time, within 5 minutes, once;
- a gateway that tells a daemon a time to come gets no proof it could use then (the
  daemon signs a told time only with the database's challenge, which a gateway cannot
  make up) — while a proof at that time with a nonce of the daemon's own would open;
- the one-time ids stay bounded over a day of Hellos: those of nodes gone quiet are
  pruned by the others' Hellos.
"""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator
from datetime import timedelta

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas.proof import HelloProof, prove
from schemas.subjects import Subjects
from tests.integration import fleet
from tests.integration.fleet import Provisioned
from tests.integration.streams import RecordingStream
from workers.gateway import Code, Gateway, HelloRequest, Refused, store
from workers.runtime.bus import streams
from workers.runtime.store import migrate
from workers.sim.daemon import FakeDaemon

KEY = bytes(range(32))


@pytest.fixture
async def gw1(
    logins: dict[str, str], nc: NATS, subjects: Subjects, db: asyncpg.Connection
) -> AsyncIterator[Gateway]:
    """gw-1, the reference gateway under its own bound login; n1 and n2 joined with their
    keys; the fleet at `require`."""
    await streams.provision_streams(nc.jetstream(), subjects)
    for node in ("n1", "n2"):
        await fleet.join(db, node)
        await db.execute("SELECT enroll_hello_key($1, $2)", node, KEY)
    await migrate.set_hello_proof(db, "require")
    pool = await asyncpg.create_pool(logins["bcw_gateway_bound"], min_size=1, max_size=2)
    gateway = Provisioned("gw-1", pool, nc, subjects)
    await gateway.start(autotick=None)
    try:
        yield gateway
    finally:
        await gateway.stop(graceful=False)
        await pool.close()


def _request(
    proof: HelloProof | None, node: str = "n1", boot: str = "b1", journal: str = "j1"
) -> HelloRequest:
    return HelloRequest(
        node_id=node,
        cert_serial=f"{node}-serial",
        role="worker",
        boot_id=boot,
        journal_id=journal,
        proof=proof,
    )


def _proof(
    at: int, nonce: str | None = None, gateway: str = "gw-1", node: str = "n1"
) -> HelloProof:
    return prove(KEY, node, "b1", "j1", gateway, at, nonce)


async def _hello(gateway: Gateway, proof: HelloProof | None, node: str = "n1") -> Refused | None:
    """None: welcomed; else the refusal."""
    try:
        await gateway.hello(_request(proof, node), RecordingStream())
    except Refused as refused:
        return refused
    return None


async def _move(db: asyncpg.Connection, gateway: Gateway, seconds: float) -> None:
    """compute_now() moved by `seconds`; the gateway's lease taken again at the new time."""
    await db.execute("SELECT set_compute_now_offset(make_interval(secs => $1))", seconds)
    async with gateway.pool.acquire() as conn:
        gateway.lease_epoch = await store.acquire(conn, gateway.gateway_id, timedelta(seconds=15))


async def _challenge(
    db: asyncpg.Connection, gateway: str = "gw-1", node: str = "n1"
) -> tuple[int, str]:
    row = await db.fetchrow("SELECT * FROM gateway_hello_challenge($1, $2)", gateway, node)
    return int(row["server_time"]), str(row["challenge"])


@pytest.mark.parametrize("skew", [-600, 600], ids=["10-min-behind", "10-min-ahead"])
async def test_a_daemon_ten_minutes_off_connects_at_require_within_three_hellos(
    gw1: Gateway, db: asyncpg.Connection, skew: int
) -> None:
    daemon = FakeDaemon(
        "n1", "n1-serial", lambda: time.time() + skew, random.Random(1), hello_key=KEY
    )
    for _ in range(3):
        daemon.next_try = 0.0
        await daemon.tick([gw1])
        if daemon.connected:
            break
    assert daemon.connected, daemon.refusals
    assert daemon.welcomes + sum(daemon.refusals.values()) <= 3
    assert daemon.refusals == {"UNAUTHENTICATED": 1}  # its own clock's proof, then the server's
    assert await db.fetchval("SELECT proven FROM session_epochs WHERE node_id = 'n1'") is True
    assert abs(daemon.server.offset + skew) < 5  # it keeps the clock offset


async def test_a_refusal_tells_the_databases_time_and_a_challenge_and_nothing_else(
    gw1: Gateway, db: asyncpg.Connection
) -> None:
    """A stale proof and a forged MAC are refused alike (nothing says which, nor whether the
    node has a key); both carry the database's time and a fresh challenge. A Hello without
    a proof gets neither (its daemon does not sign)."""
    now = await db.fetchval("SELECT extract(epoch FROM compute_now())::bigint")
    stale = await _hello(gw1, _proof(int(time.time()) - 600))
    forged = await _hello(gw1, HelloProof(at=int(time.time()), nonce="n" * 32, mac="0" * 64))
    assert stale is not None and forged is not None
    assert stale.code is forged.code is Code.UNAUTHENTICATED and stale.reason == forged.reason
    for refused in (stale, forged):
        assert refused.server_time is not None and abs(refused.server_time - now) <= 2
        assert refused.challenge is not None and refused.challenge.startswith("srv-")
    assert stale.challenge != forged.challenge
    bare = await _hello(gw1, None)
    assert bare is not None and (bare.server_time, bare.challenge) == (None, None)


async def test_a_captured_proof_is_refused_when_replayed_at_once_or_later(
    gw1: Gateway, db: asyncpg.Connection
) -> None:
    daemon = FakeDaemon(
        "n1", "n1-serial", lambda: time.time() - 600, random.Random(1), hello_key=KEY
    )
    for _ in range(2):
        daemon.next_try = 0.0
        await daemon.tick([gw1])
    assert daemon.connected
    hello = gw1.sessions["n1"].hello
    assert hello is not None and hello.proof is not None
    captured = hello.proof  # the Hello fact carries it: anyone who reads the facts has it
    request = _request(captured, "n1", daemon.boot_id, daemon.journal_id)
    epoch = await db.fetchval("SELECT session_epoch FROM node_sessions WHERE node_id = 'n1'")
    with pytest.raises(Refused) as at_once:
        await gw1.hello(request, RecordingStream())
    await _move(db, gw1, 11 * 60)  # its one-time id pruned by then: its time refuses it
    await _hello(gw1, _proof(int(time.time()) + 11 * 60))  # a Hello that prunes
    with pytest.raises(Refused) as later:
        await gw1.hello(request, RecordingStream())
    assert at_once.value.code is later.value.code is Code.UNAUTHENTICATED
    ids = await db.fetchval("SELECT count(*) FROM hello_nonces WHERE nonce = $1", captured.nonce)
    assert ids == 0
    assert (
        await db.fetchval("SELECT session_epoch FROM node_sessions WHERE node_id = 'n1'")
        == epoch + 1
    )  # the pruning Hello's only


@pytest.mark.parametrize(
    "use",
    [
        "as-issued",
        "twice",
        "six-minutes-later",
        "another-gateway",
        "another-node",
        "another-time",
        "another-salt",
    ],
)
async def test_a_challenge_opens_one_hello_of_its_node_at_its_gateway_at_its_time_once(
    gw1: Gateway, db: asyncpg.Connection, use: str
) -> None:
    at, challenge = await _challenge(db)
    node, gateway, signed_at, nonce = "n1", "gw-1", at, challenge
    if use == "twice":
        assert await _hello(gw1, _proof(at, challenge)) is None
    elif use == "six-minutes-later":
        await _move(db, gw1, 6 * 60)
    elif use == "another-gateway":  # issued for gw-2: its daemon dialled gw-2
        at, nonce = await _challenge(db, gateway="gw-2")
        signed_at = at
    elif use == "another-node":
        node = "n2"
    elif use == "another-time":
        signed_at = at - 1
    elif use == "another-salt":
        nonce = challenge[:4] + ("0" if challenge[4] != "0" else "1") + challenge[5:]
    refused = await _hello(gw1, _proof(signed_at, nonce, gateway, node), node)
    if use == "as-issued":
        assert refused is None
    else:
        assert refused is not None and refused.code is Code.UNAUTHENTICATED


async def test_a_gateway_cannot_get_a_proof_for_a_time_to_come(
    gw1: Gateway, db: asyncpg.Connection
) -> None:
    """A hostile gateway tells the daemon a day ahead, with a challenge of its own making:
    the daemon signs it, and a day later the proof opens nothing. Had the daemon signed that
    time with a nonce of its own, the proof would open then: it never does."""
    day = 86_400
    daemon = FakeDaemon("n1", "n1-serial", time.time, random.Random(1), hello_key=KEY)
    lie = Refused(
        Code.UNAUTHENTICATED,
        "?",
        server_time=float(int(time.time()) + day),
        challenge="srv-0123456789abcdef-" + "a" * 40,
    )
    daemon.server.refused("gw-1", lie.server_time, lie.challenge, daemon.now())
    harvested = daemon.proof(gw1)
    assert harvested is not None and harvested.at == int(time.time()) + day
    own_nonce = _proof(harvested.at, gateway="gw-1")  # what the daemon never signs
    await _move(db, gw1, day)
    request = _request(harvested, "n1", daemon.boot_id, daemon.journal_id)
    with pytest.raises(Refused) as refused:
        await gw1.hello(request, RecordingStream())
    assert refused.value.code is Code.UNAUTHENTICATED
    assert await _hello(gw1, own_nonce) is None  # the danger the daemon's rule avoids


async def test_the_one_time_ids_stay_bounded_over_a_day_of_hellos(db: asyncpg.Connection) -> None:
    """40 nodes say proven Hellos through a day of compute_now() in 5-minute steps; 30 of
    them go quiet after the first hour. At every step the ids held are at most those of the
    last 10 minutes' Hellos plus what expired since a pruning Hello (one in 16 prunes any
    node's); the quiet nodes' ids are gone by the end (migration 0030 pruned a node's ids
    only at its own next Hello: they stayed for good, the table grew with the fleet)."""
    nodes = [f"q{i:02d}" for i in range(40)]
    for node in nodes:
        await fleet.join(db, node)
        await db.execute("SELECT enroll_hello_key($1, $2)", node, KEY)
    rng, step, start = random.Random(58), 300, int(time.time())
    hellos: list[tuple[int, str]] = []  # (its time, node)
    most = backlog = 0
    pruned_at = start - 10 * step  # when a Hello last pruned any node's ids (none yet)
    for i in range(24 * 3600 // step):
        await db.execute("SELECT set_compute_now_offset(make_interval(secs => $1))", i * step)
        now = start + i * step
        speaking = nodes if i < 12 else nodes[:10]
        for node in (n for n in speaking if rng.random() < 0.5):
            nonce = f"{rng.getrandbits(128):032x}"  # seeded: which Hellos prune is too
            proof = prove(KEY, node, "b1", "j1", "gw-1", now, nonce)
            assert await db.fetchval(
                "SELECT hello_proof_holds($1, 'b1', 'j1', 'gw-1', $2, $3, $4)",
                node,
                proof.at,
                proof.nonce,
                proof.mac,
            )
            hellos.append((now, node))
            if proof.mac.startswith("0"):  # one in 16 prunes any node's expired ids
                pruned_at = now
        held = int(await db.fetchval("SELECT count(*) FROM hello_nonces"))
        recent = sum(1 for at, _ in hellos if at > now - 600 - step)
        backlog = max(backlog, held - recent)
        # beyond the last 10 minutes', only ids that expired since the last pruning Hello
        since = sum(1 for at, _ in hellos if pruned_at - 600 - step < at <= now - 600 - step)
        assert held <= recent + since, (i, held, recent, since)
        most = max(most, held)
    quiet = await db.fetchval(
        "SELECT count(*) FROM hello_nonces WHERE node_id = ANY($1)", nodes[10:]
    )
    assert quiet == 0
    print(
        f"\n{len(hellos)} proven Hellos of 40 nodes over a day: at most {most} one-time ids held, "
        f"{backlog} beyond the last 10 minutes'"
    )
