"""The Hello's proof on real servers (docs/contract.md, "The Hello's proof"): the Hello
transaction takes a Hello only with the MAC of the node's key over what the daemon says,
once, near the fleet's clock, at the gateway it dialled — and, when the fleet requires
proofs, never without one. The gateway's login, gw-1's, reads no key and tests no MAC."""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nats.aio.client import Client as NATS

from schemas.proof import HelloProof, message, prove
from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration import fleet
from tests.integration.fleet import Provisioned
from tests.integration.security.conftest import SUBJECTS, client_as, violated
from tests.integration.streams import RecordingStream
from tests.integration.support import eventually, make_settings, running
from workers import quarantine
from workers.gateway import Code, Gateway, HelloRequest, Refused
from workers.quarantine.metrics import QuarantineMetrics
from workers.runtime.bus import streams
from workers.runtime.store import migrate

KEY = bytes(range(32))


def _request(node: str = "n1", proof: HelloProof | None = None, boot: str = "b1") -> HelloRequest:
    return HelloRequest(
        node_id=node,
        cert_serial=f"{node}-serial",
        role="worker",
        boot_id=boot,
        journal_id="j1",
        proof=proof,
    )


def _proof(
    gateway: str = "gw-1", key: bytes = KEY, at: float | None = None, boot: str = "b1"
) -> HelloProof:
    return prove(key, "n1", boot, "j1", gateway, int(time.time() if at is None else at))


@pytest.fixture
async def gw1(
    logins: dict[str, str], nc: NATS, subjects: Subjects, db: asyncpg.Connection
) -> AsyncIterator[Gateway]:
    """gw-1, the reference gateway under its own bound login; n1 joined, with its key."""
    await streams.provision_streams(nc.jetstream(), subjects)
    await fleet.join(db, "n1")
    await db.execute("SELECT enroll_hello_key('n1', $1)", KEY)
    pool = await asyncpg.create_pool(logins["bcw_gateway_bound"], min_size=1, max_size=2)
    gateway = Provisioned("gw-1", pool, nc, subjects)
    await gateway.start(autotick=None)
    try:
        yield gateway
    finally:
        await gateway.stop(graceful=False)
        await pool.close()


async def _epoch(db: asyncpg.Connection) -> int:
    return int(await db.fetchval("SELECT session_epoch FROM node_sessions WHERE node_id = 'n1'"))


async def _refused(gateway: Gateway, request: HelloRequest) -> Code:
    with pytest.raises(Refused) as refused:
        await gateway.hello(request, RecordingStream())
    return refused.value.code


async def test_a_proven_hello_opens_and_is_recorded_proven(
    gw1: Gateway, db: asyncpg.Connection
) -> None:
    welcome = await gw1.hello(_request(proof=_proof()), RecordingStream())
    assert welcome.epoch == 1
    assert await db.fetchval("SELECT proven FROM session_epochs WHERE node_id = 'n1' AND epoch = 1")
    assert gw1.sessions["n1"].hello is not None and gw1.sessions["n1"].hello.proven is True


@pytest.mark.parametrize(
    "why",
    ["replayed", "another-key", "another-gateway", "ten-minutes-old", "another-boot", "forged-mac"],
)
async def test_a_proof_that_does_not_hold_opens_nothing(
    gw1: Gateway, db: asyncpg.Connection, why: str
) -> None:
    if why == "replayed":
        proof = _proof()
        await gw1.hello(_request(proof=proof), RecordingStream())  # taken once
    else:
        proof = {
            "another-key": _proof(key=b"k" * 32),
            "another-gateway": _proof(gateway="gw-2"),  # the daemon dialled gw-2
            "ten-minutes-old": _proof(at=time.time() - 600),
            "another-boot": _proof(boot="b-other"),
            "forged-mac": HelloProof(at=int(time.time()), nonce="n" * 32, mac="0" * 64),
        }[why]
    before = await _epoch(db)
    assert await _refused(gw1, _request(proof=proof)) is Code.UNAUTHENTICATED
    assert await _epoch(db) == before


async def test_a_new_database_requires_proofs(gw1: Gateway, db: asyncpg.Connection) -> None:
    assert await migrate.hello_proof(db) == "require"  # a new database's
    assert await _refused(gw1, _request()) is Code.UNAUTHENTICATED


async def test_under_warn_an_unproven_hello_of_a_node_with_a_key_opens_held_for_good(
    gw1: Gateway, db: asyncpg.Connection
) -> None:
    """No downgrade: n1 has a Hello key, so a Hello of it without a proof is a takeover
    attempt — it opens (warn lets it), recorded `proven = false`, held, with no capability
    stored; a node without a key opens unproven as before (NULL: nothing to prove it by)."""
    await migrate.set_hello_proof(db, "warn")
    await gw1.hello(_request(), RecordingStream())
    row = await db.fetchrow(
        "SELECT s.proven, s.held_epoch, s.capabilities, e.proven AS recorded FROM node_sessions s "
        "JOIN session_epochs e ON e.node_id = s.node_id AND e.epoch = s.session_epoch "
        "WHERE s.node_id = 'n1'"
    )
    assert tuple(row) == (False, 1, [], False)
    await fleet.join(db, "n2", key=False)
    await gw1.hello(_request("n2"), RecordingStream())
    row = await db.fetchrow(
        "SELECT s.proven, s.held_epoch, e.proven AS recorded FROM node_sessions s "
        "JOIN session_epochs e ON e.node_id = s.node_id AND e.epoch = s.session_epoch "
        "WHERE s.node_id = 'n2'"
    )
    assert tuple(row) == (None, None, None)


async def test_under_require_a_hello_without_proof_changes_and_locks_nothing(
    gw1: Gateway, db: asyncpg.Connection
) -> None:
    await migrate.set_hello_proof(db, "require")
    async with db.transaction():  # the node's row locked elsewhere: an unproven Hello never waits
        await db.execute("SELECT 1 FROM node_sessions WHERE node_id = 'n1' FOR UPDATE")
        started = time.monotonic()
        assert await _refused(gw1, _request()) is Code.UNAUTHENTICATED
        assert time.monotonic() - started < 1.0
    assert await _epoch(db) == 0
    await gw1.hello(_request(proof=_proof()), RecordingStream())
    assert await _epoch(db) == 1


async def test_under_off_proofs_are_not_checked_but_for_a_node_with_a_key(
    gw1: Gateway, db: asyncpg.Connection
) -> None:
    """`off` checks no proof of a node without a key; a node with one proves every Hello
    whatever the policy (no downgrade): a proof that does not hold is refused, a Hello
    without one opens held (`proven = false`)."""
    await migrate.set_hello_proof(db, "off")
    bad = HelloProof(at=0, nonce="n" * 32, mac="0" * 64)
    await fleet.join(db, "n2", key=False)
    await gw1.hello(_request("n2", proof=bad), RecordingStream())
    assert await db.fetchval("SELECT proven FROM session_epochs WHERE node_id = 'n2'") is None
    assert await _refused(gw1, _request(proof=bad)) is Code.UNAUTHENTICATED
    await gw1.hello(_request(), RecordingStream())
    assert await db.fetchval("SELECT proven FROM session_epochs WHERE node_id = 'n1'") is False
    await gw1.hello(_request(proof=_proof(boot="b2"), boot="b2"), RecordingStream())
    assert await db.fetchval("SELECT proven FROM node_sessions WHERE node_id = 'n1'") is True


async def test_a_locked_row_answers_busy_within_the_lock_timeout(
    gw1: Gateway, db: asyncpg.Connection
) -> None:
    """Another transaction holds n1's row (as a hostile gateway's open transaction would):
    the Hello waits at most 2 s and is refused UNAVAILABLE with a pushback."""
    async with db.transaction():
        await db.execute("SELECT 1 FROM node_sessions WHERE node_id = 'n1' FOR UPDATE")
        started = time.monotonic()
        with pytest.raises(Refused) as refused:
            await gw1.hello(_request(proof=_proof()), RecordingStream())
        assert time.monotonic() - started < 4.0
    assert refused.value.code is Code.UNAVAILABLE and refused.value.retry_after is not None
    assert await _epoch(db) == 0


async def test_the_gateway_login_reads_no_key_and_tests_no_mac(
    gw1: Gateway, logins: dict[str, str], db: asyncpg.Connection
) -> None:
    conn = await asyncpg.connect(logins["bcw_gateway_bound"])
    try:
        for sql in (
            "SELECT * FROM node_hello_keys",
            "SELECT * FROM hello_nonces",
            "SELECT serial FROM node_certs",  # reconnaissance: every serial
            "SELECT * FROM nodes",
            "SELECT enroll_hello_key('n1', '\\x00112233445566778899aabbccddeeff')",
            "SELECT hello_proof_holds('n1', 'b1', 'j1', 'gw-1', 0, 'nnnnnnnnnnnnnnnn', 'x')",
            "SELECT * FROM hello_challenge_key",  # a challenge for a time to come: none
            "SELECT hello_challenge('n1', 'gw-1', 4102444800, '0123456789abcdef')",
            "SELECT * FROM gateway_hello_challenge('gw-2', 'n1')",  # only as gw-1
            "SELECT * FROM gateway_hello('gw-1', 1, 'n1', 'n1-serial', 'b1', 'j1', 'worker', "
            "'1.0.0', 1, 'grpc', false, 0, 0, '', '90s', NULL, gen_random_uuid())",  # the old one
        ):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute(sql)
        # admission answers for the one serial it names, as gw-1 only
        row = await conn.fetchrow("SELECT * FROM gateway_admission('gw-1', 'n1', 'n1-serial')")
        assert (row["serial"], row["node_id"], row["revoked"]) == ("n1-serial", "n1", False)
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.fetchrow("SELECT * FROM gateway_admission('gw-2', 'n1', 'n1-serial')")
        # a Hello transaction without its Hello fact's id is refused outright
        with pytest.raises(asyncpg.NullValueNotAllowedError):
            await conn.fetchrow(
                "SELECT * FROM gateway_hello('gw-1', 1, 'n1', 'n1-serial', 'b1', 'j1', 'worker', "
                "'1.0.0', 1, 'grpc', false, 0, 0, '', '90s', NULL, NULL, NULL, NULL, NULL)"
            )
    finally:
        await conn.close()


TEXT = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40
)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(node=TEXT, boot=TEXT, journal=TEXT, gateway=TEXT, at=st.integers(0, 2**40), nonce=TEXT)
async def test_the_sql_signs_the_bytes_the_contract_gives(
    db: asyncpg.Connection, node: str, boot: str, journal: str, gateway: str, at: int, nonce: str
) -> None:
    sql = await db.fetchval(
        "SELECT hello_proof_message($1, $2, $3, $4, $5, $6)",
        node,
        boot,
        journal,
        gateway,
        at,
        nonce,
    )
    assert sql == message(node, boot, journal, gateway, at, nonce)


async def test_a_gateways_nkey_cannot_list_the_other_gateways(keys: Path, secured: str) -> None:
    """Reconnaissance on the bus: STREAM.INFO of the notices stream with a subject filter
    would list every gateway's notice subjects (so every gateway id); a gateway may not
    ask it, and its own consumer still works without it (tests/integration/security/
    test_bus_principals.py)."""
    async with client_as(keys, secured, "gateway-gw-1") as (nc, errors):
        subject = f"$JS.API.STREAM.INFO.{SUBJECTS.gateway_stream}"
        with contextlib.suppress(Exception):
            await nc.request(subject, b'{"subjects_filter": ">"}', timeout=1.0)
        await nc.flush()
        await eventually(lambda: violated(errors, "Publish"), what="the server refused it")


@pytest.mark.parametrize("policy", ["warn", "require"])
async def test_below_require_the_quarantine_worker_says_it_and_counts_the_unproven(
    gw1: Gateway,
    db: asyncpg.Connection,
    servers: Servers,
    nc: NATS,
    subjects: Subjects,
    database_url: str,
    policy: str,
) -> None:
    """Its metrics (`bcw_hello_proof_policy`, `bcw_unproven_sessions`) and a line of its
    `/readyz`, which stays ready: at `warn`, the session of a node without a key and a
    takeover attempt of one with a key, both unproven; at `require`, neither opens."""
    await migrate.set_hello_proof(db, policy)
    await fleet.join(db, "n2", key=False)
    for request in (_request(), _request("n2")):
        with contextlib.suppress(Refused):
            await gw1.hello(request, RecordingStream())
    settings = make_settings(servers.nats_url, database_url, subjects)
    async with running(settings, [quarantine.build(settings)]) as (runtime, port):

        async def looked() -> bool:
            return runtime.metrics.of(QuarantineMetrics).hello_proof_policy.value(policy) == 1.0

        await eventually(looked, what="the policy read")
        unproven = 2 if policy == "warn" else 0
        assert runtime.metrics.of(QuarantineMetrics).unproven_sessions.value() == unproven
        status, body = await _get(port, "/readyz")
    assert status == 200
    notes = [line for line in body.splitlines() if line.startswith("hello-proof")]
    assert [note.split(";")[0] for note in notes] == (
        [f"hello-proof warn: {unproven} session(s) unproven"] if unproven else []
    )


async def _get(port: int, path: str) -> tuple[int, str]:
    def fetch() -> tuple[int, str]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()

    return await asyncio.to_thread(fetch)
