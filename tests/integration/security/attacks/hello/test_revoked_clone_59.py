"""Issue #59, item 2: no takeover at any policy for a node that proves its Hellos — not
even by a clone holding its stolen key after its certificate was revoked.

A revocation of the node's current identity generation retires its Hello key (migration
0053): the node still proves its Hellos (an unproven Hello is a takeover attempt, held for
good, at `warn`; refused at `require`), but no proof by the old key holds until the control
plane enrolls a new one — and no unrecorded serial is admitted for it until a certificate
is recorded (a new generation). The attacker is gw-1 (its own bound login, the reference
gateway's code) holding n1's stolen key; gw-2 is honest; all five workers run, for longer
than the hold bound. Before the fix the clone's proven Hello with a fresh serial opened at
`require` and received n1's commands.
"""

from __future__ import annotations

import asyncio
import hashlib

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas.proof import prove
from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration import fleet
from tests.integration.security.gateways.test_takeover import (
    HOLD_MAX,
    _gateways,
    _notices_to,
    five_workers,
)
from tests.integration.streams import RecordingStream
from tests.integration.support import eventually, make_settings, running
from workers.gateway import Code, Gateway, HelloRequest, Refused
from workers.quarantine import apply, breaker
from workers.registry import WORKERS
from workers.replay.commands import enqueue_command as enqueue
from workers.runtime.store import migrate

pytestmark = pytest.mark.slow

STOLEN = fleet.hello_key("n1")
NEW_KEY = hashlib.sha256(b"n1's key after its revocation").digest()


def _hello(serial: str, gateway: str, key: bytes | None, boot: str) -> HelloRequest:
    proof = None
    if key is not None:
        proof = prove(key, "n1", boot, "j1", gateway, fleet.rising_at("n1"))
    return HelloRequest(
        node_id="n1", cert_serial=serial, role="worker", boot_id=boot, journal_id="j1", proof=proof
    )


async def _clone(gateway: Gateway, serial: str, key: bytes | None) -> RecordingStream | Code:
    """The clone's Hello through gw-1: its stream if it opened, else the refusal's code."""
    stream = RecordingStream()
    try:
        await gateway.hello(_hello(serial, "gw-1", key, "clone-boot"), stream)
    except Refused as refused:
        return refused.code
    return stream


@pytest.mark.parametrize("policy", ["warn", "require"])
async def test_a_clone_with_the_stolen_key_gets_nothing_after_a_revocation(
    servers: Servers,
    logins: dict[str, str],
    nc: NATS,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
    policy: str,
) -> None:
    await migrate.set_hello_proof(db, policy)
    settings = five_workers(make_settings(servers.nats_url, database_url, subjects))
    async with (
        _gateways(logins, nc, subjects, db) as (attacker, honest),
        running(settings, [build(settings) for build in WORKERS.values()]),
    ):
        await fleet.join(db, "n1")
        await honest.hello(_hello("n1-serial", "gw-2", STOLEN, "b1"), RecordingStream())
        # the operator revokes n1's certificate (its key was stolen with it); its session ends
        await db.execute(
            "UPDATE node_certs SET revoked_at = compute_now(), "
            "revocation_reason = 'stolen' WHERE serial = 'n1-serial'"
        )
        await honest.disconnect("n1", 1)
        command = await enqueue(db, "n1", "exec", {"secret": "n1-s3cr3t"})

        # the clone: a fresh serial (no record), proven by the stolen key or not at all
        tried = [await _clone(attacker, "clone-serial", key) for key in (STOLEN, None)]
        assert tried == [Code.UNAUTHENTICATED] * 2
        # the node re-joined (a new certificate, recorded), its new key not enrolled yet:
        # the serial is public, the old key proves nothing
        await db.execute("SELECT join_node('n1', 'worker', 'n1-serial-2', NULL)")
        proven_by_old = await _clone(attacker, "n1-serial-2", STOLEN)
        assert proven_by_old is Code.UNAUTHENTICATED
        unproven = await _clone(attacker, "n1-serial-2", None)  # a takeover attempt
        if policy == "require":
            assert unproven is Code.UNAUTHENTICATED
        else:
            assert isinstance(unproven, RecordingStream)
        # the new key enrolled with the new certificate: still nothing for the old one
        await db.execute("SELECT enroll_hello_key('n1', $1)", NEW_KEY)
        assert await _clone(attacker, "n1-serial-2", STOLEN) is Code.UNAUTHENTICATED

        # the honest node, re-enrolled, gets its command
        mine = RecordingStream()
        await honest.hello(_hello("n1-serial-2", "gw-2", NEW_KEY, "b2"), mine)
        await eventually(lambda: _got(mine), what="n1's command at its own daemon")
        assert [d.command_id for d in mine.delivered] == [command]
        await asyncio.sleep(2 * HOLD_MAX.total_seconds() + 1)  # past the hold bound
        if isinstance(unproven, RecordingStream):
            assert unproven.delivered == [] and unproven.dropped == []
        assert await _notices_to(nc, subjects, "gw-1") == []
        opened_by_gw1 = await db.fetch(
            "SELECT proven FROM session_epochs WHERE node_id = 'n1' AND gateway_id = 'gw-1'"
        )
        assert [r["proven"] for r in opened_by_gw1] == ([] if policy == "require" else [False])


async def _got(stream: RecordingStream) -> bool:
    return bool(stream.delivered)


@pytest.mark.parametrize(
    "path", ["operator", "quarantine", "quarantine-release", "older-generation"]
)
async def test_every_revocation_of_the_nodes_generation_retires_its_key(
    logins: dict[str, str], db: asyncpg.Connection, path: str
) -> None:
    """Each path that revokes, as the login that does it: the quarantine worker's (a
    recorded serial, and one with no record recorded revoked), `bcw quarantine release`'s
    and the operator's. A certificate of an older generation (an honest rotation's
    leftover) retires nothing; an enrolment clears the retirement."""
    await fleet.join(db, "n1")
    retired = "SELECT retired_at IS NOT NULL FROM node_hello_keys WHERE node_id = 'n1'"
    if path == "operator":
        await db.execute(
            "UPDATE node_certs SET revoked_at = compute_now(), "
            "revocation_reason = 'lost' WHERE node_id = 'n1'"
        )
    elif path == "older-generation":
        await db.execute("SELECT join_node('n1', 'worker', 'n1-serial-2', NULL)")  # rotation
        await db.execute(
            "UPDATE node_certs SET revoked_at = compute_now(), revocation_reason = 'rotated' "
            "WHERE serial = 'n1-serial'"
        )
    else:
        conn = await asyncpg.connect(logins["bcw_quarantine"])
        try:
            if path == "quarantine":
                await conn.execute(apply.REVOKE, ["n1-serial", "clone"], ["n1", "n1"], "clone")
            else:
                await conn.execute(breaker.REVOKE_RELEASED, ["unrecorded"], "n1", "released")
        finally:
            await conn.close()
    assert await db.fetchval(retired) is (path != "older-generation")
    await db.execute("SELECT enroll_hello_key('n1', $1)", NEW_KEY)
    assert await db.fetchval(retired) is False
