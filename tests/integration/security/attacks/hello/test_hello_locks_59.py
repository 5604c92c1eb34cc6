"""Issue #59, item 1: no lock another login can take stops a Hello.

The Hello transaction held the fleet's policy by a shared advisory lock on
`hashtext('bcw-fleet-policy')`, and `pg_advisory_lock` is PUBLIC's: a reader's login (or a
gateway's) that took that key and sat idle made every Hello of every gateway wait its 2 s
lock timeout and be refused. Now it locks the `fleet_policy` row FOR SHARE inside its
definer function, a lock no other login can take. Tested as the attacker would, each
logged in as itself, at `warn` (a new install's policy before migration 0049) and
`require` (the production layout's):

- a reader's login and a gateway's login take the old key and sit idle: gw-1's Hellos
  open at once, as before the attack;
- a gateway's login keeps a transaction open after one `gateway_hello` (of a node that
  does not exist): the policy's change waits for it (none opens under the old policy once
  it has changed) — and Hellos of the other gateways are not queued behind that waiting
  change (share lockers of a share-locked row never sleep).
"""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas.subjects import Subjects
from tests.integration import fleet
from tests.integration.security.conftest import unproven_hello, url_as
from tests.integration.security.gateways.test_takeover import _gateways
from tests.integration.streams import RecordingStream
from workers.gateway import Gateway, HelloRequest
from workers.runtime.store import migrate

pytestmark = pytest.mark.slow

OLD_KEY = "SELECT pg_advisory_lock(hashtext('bcw-fleet-policy'))"
#: a Hello that waited for a lock took 2 s (its lock timeout) and was refused
QUICK = 1.0


def _request(node: str) -> HelloRequest:
    return HelloRequest(
        node_id=node,
        cert_serial=f"{node}-serial",
        role="worker",
        boot_id=f"{node}-b",
        journal_id=f"{node}-j",
    )


async def _hellos_open_at_once(gateway: Gateway, nodes: list[str]) -> None:
    for node in nodes:
        started = time.monotonic()
        await fleet.say_hello(gateway, _request(node), RecordingStream())
        assert time.monotonic() - started < QUICK, node


@pytest.mark.parametrize("policy", ["warn", "require"])
@pytest.mark.parametrize("holder", ["reader", "gateway"])
async def test_a_login_holding_the_old_policy_key_blocks_no_hello(
    logins: dict[str, str],
    nc: NATS,
    subjects: Subjects,
    db: asyncpg.Connection,
    policy: str,
    holder: str,
) -> None:
    await migrate.set_hello_proof(db, policy)
    async with _gateways(logins, nc, subjects, db) as (gw1, _):
        for node in ("n1", "n2", "n3"):
            await fleet.join(db, node)
        url = (
            logins["bcw_reader"]
            if holder == "reader"
            else url_as(logins["bcw_gateway_bound"], "gw2_login_t")
        )
        attacker = await asyncpg.connect(url)
        try:
            await attacker.execute(OLD_KEY)  # held by the session, idle: no timeout ends it
            await _hellos_open_at_once(gw1, ["n1", "n2", "n3"])
        finally:
            await attacker.close()
        opened = await db.fetchval("SELECT count(*) FROM node_sessions WHERE gateway_id = 'gw-1'")
        assert opened == 3


@pytest.mark.parametrize("policy", ["warn", "require"])
async def test_an_open_hello_transaction_holds_the_policy_and_queues_no_other_hello(
    logins: dict[str, str],
    nc: NATS,
    subjects: Subjects,
    db: asyncpg.Connection,
    database_url: str,
    policy: str,
) -> None:
    await migrate.set_hello_proof(db, policy)
    async with _gateways(logins, nc, subjects, db) as (gw1, gw2):
        for node in ("n1", "n2", "n3"):
            await fleet.join(db, node)
        attacker = await asyncpg.connect(url_as(logins["bcw_gateway_bound"], "gw2_login_t"))
        setter = await asyncpg.connect(database_url)
        try:
            tx = attacker.transaction()
            await tx.start()
            row = await unproven_hello(attacker, "gw-2", gw2.lease_epoch, "ghost", "b")
            assert row["outcome"] in ("not-joined", "unproven")
            # the policy's change (as bcw migrate makes it: an UPDATE of the row) waits
            await setter.execute("SET lock_timeout = '20s'")
            change = asyncio.ensure_future(
                setter.execute("UPDATE fleet_policy SET hello_proof = hello_proof")
            )
            await asyncio.sleep(0.5)
            assert not change.done()  # none opens under the old policy once it changed
            # ... and no other gateway's Hello is queued behind it
            await _hellos_open_at_once(gw1, ["n1", "n2", "n3"])
            assert not change.done()
            await tx.rollback()
            await asyncio.wait_for(change, 5)
        finally:
            await attacker.close()
            await setter.close()
        opened = await db.fetchval("SELECT count(*) FROM node_sessions WHERE gateway_id = 'gw-1'")
        assert opened == 3
