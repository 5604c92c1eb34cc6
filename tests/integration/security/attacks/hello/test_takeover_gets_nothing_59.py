"""A takeover attempt gets nothing of the node (issue #59, found on the merged change,
migration 0058): at `warn`, gw-1's login says an unproven Hello for n1, a node with a Hello
key whose proven session is at gw-2 — the session opens, held for good (migration 0049).
Logged in as gw-1, it then

- asks the node's spec (`gateway_admission`, `gateway_desired_state`): nothing, where it
  read the node's `API_TOKEN`;
- writes the node's inventory under the hash the node reported: refused, where the forged
  body stayed under the honest hash and the daemon was never asked again;
- says 65 more Hellos: the node's previous honest epoch is kept, where they pushed it out
  of the newest 64 and its gateway's true late facts became foreign.

At `require` none of it opens at all (`test_revoked_clone_59.py`, `test_fences.py`)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import asyncpg

from schemas.subjects import Subjects
from tests.integration import fleet
from tests.integration.security.conftest import unproven_hello, url_as
from tests.integration.security.gateways.test_proof_freshness import _move
from tests.integration.security.gateways.test_takeover import _gateways
from tests.integration.streams import RecordingStream
from workers.gateway import HelloRequest
from workers.runtime.effects import provenance
from workers.runtime.store import migrate

REQUEST = HelloRequest(
    node_id="n1", cert_serial="n1-serial", role="worker", boot_id="b1", journal_id="j1"
)


async def _unproven_hello(attacker: asyncpg.Connection, lease: int) -> Any:
    """gw-1's Hello for n1 with no proof, as bare SQL: the Hello transaction itself."""
    return await unproven_hello(attacker, "gw-1", lease, "n1", "evil-boot")


async def test_a_takeover_reads_no_spec_and_writes_no_inventory(
    logins: dict[str, str], nc: Any, subjects: Subjects, db: asyncpg.Connection
) -> None:
    await migrate.set_hello_proof(db, "warn")
    async with _gateways(logins, nc, subjects, db) as (gw1, gw2):
        await fleet.join(db, "n1")
        await db.execute(
            """UPDATE nodes SET spec = '{"env": {"API_TOKEN": "tok-s3cr3t"}}'::jsonb,
                                spec_body = NULL WHERE node_id = 'n1'"""
        )
        await fleet.say_hello(gw2, REQUEST, RecordingStream())
        epoch = await db.fetchval("SELECT session_epoch FROM node_sessions WHERE node_id = 'n1'")
        honest = await asyncpg.connect(url_as(logins["bcw_gateway_bound"], "gw2_login_t"))
        attacker = await asyncpg.connect(logins["bcw_gateway_bound"])
        try:
            body = json.dumps({"os": "linux", "pkgs": ["openssl-3.0.13"]})
            assert await honest.fetchval(
                "SELECT gateway_write_section('gw-2', $1, 'n1', $2, 'os', 'h-honest', $3::jsonb)",
                gw2.lease_epoch,
                epoch,
                body,
            )
            held = await _unproven_hello(attacker, gw1.lease_epoch)
            assert held["outcome"] == "opened"
            session = await db.fetchrow("SELECT gateway_id, proven FROM node_sessions")
            assert tuple(session) == ("gw-1", False)  # its session, recorded a takeover
            admitted = await attacker.fetchrow(
                "SELECT spec, spec_generation FROM gateway_admission('gw-1', 'n1', 'n1-serial')"
            )
            assert tuple(admitted) == (None, None)
            desired = await attacker.fetchrow(
                "SELECT * FROM gateway_desired_state('gw-1', 'n1', $1)", held["epoch"]
            )
            assert desired is None or tuple(desired) == (None, None, None)
            forged = json.dumps({"os": "linux", "pkgs": ["openssl-3.0.1-vulnerable"]})
            assert not await attacker.fetchval(
                "SELECT gateway_write_section('gw-1', $1, 'n1', $2, 'os', 'h-honest', $3::jsonb)",
                gw1.lease_epoch,
                held["epoch"],
                forged,
            )
            stored = await db.fetchval("SELECT body::text FROM node_inventory WHERE node_id = 'n1'")
            assert json.loads(stored) == json.loads(body)
            # the node's own proven Hello takes its session back, and its spec with it
            await fleet.say_hello(gw2, REQUEST, RecordingStream())
            back = await db.fetchval("SELECT session_epoch FROM node_sessions WHERE node_id = 'n1'")
            mine = await honest.fetchrow(
                "SELECT spec FROM gateway_desired_state('gw-2', 'n1', $1)", back
            )
            assert mine is not None and "tok-s3cr3t" in mine["spec"]
        finally:
            await attacker.close()
            await honest.close()


async def test_takeover_attempts_never_push_the_nodes_honest_epochs_out(
    logins: dict[str, str], nc: Any, subjects: Subjects, db: asyncpg.Connection
) -> None:
    await migrate.set_hello_proof(db, "warn")
    async with _gateways(logins, nc, subjects, db) as (gw1, gw2):
        await fleet.join(db, "n1")
        await fleet.say_hello(gw2, REQUEST, RecordingStream())  # epoch 1, a long session
        await _move(db, gw2, 300)
        await _move(db, gw1, 300)
        # the quarantine has applied every Hello so far (a running quarantine's watermark)
        await db.execute(
            """INSERT INTO consumer_watermarks (consumer, applied_through, reported_at, moved_at)
               VALUES ('quarantine', compute_now(), compute_now(), compute_now())
               ON CONFLICT (consumer) DO UPDATE SET applied_through = compute_now(),
                   reported_at = compute_now(), moved_at = compute_now()"""
        )
        await fleet.say_hello(gw2, REQUEST, RecordingStream())  # epoch 2: honest reconnect
        attacker = await asyncpg.connect(logins["bcw_gateway_bound"])
        try:
            outcomes = [
                (await _unproven_hello(attacker, gw1.lease_epoch))["outcome"] for _ in range(65)
            ]
        finally:
            await attacker.close()
        assert set(outcomes) == {"opened"}
        kept = await db.fetch(
            "SELECT epoch FROM session_epochs WHERE node_id = 'n1' AND epoch <= 2 ORDER BY epoch"
        )
        assert [r["epoch"] for r in kept] == [1, 2]
        # gw-2's late fact of epoch 1 is still bound: the node's, not a foreign one
        unbound = await db.fetch(
            provenance.UNBOUND, ["n1"], ["gw-2"], [1], ["j1"], [0], [uuid.uuid4()]
        )
        assert [r["bound"] for r in unbound] == []  # only unbound facts come back
