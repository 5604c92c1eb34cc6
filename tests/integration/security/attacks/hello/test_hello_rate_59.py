"""Issue #59, item 8 (the Hello's part): Hellos per node and minute bounded in the Hello
transaction. 10,000 Hello transactions from one gateway's login in 13 s grew
`session_epochs` by 10,000 rows; now a node opens at most `HELLOS_PER_NODE_MINUTE` a minute
(counted apart for Hellos that give a proof), and beyond it the Hello is refused before
anything is written (the gateway says UNAVAILABLE with a pushback). The unproven Hellos a
gateway says for a node that proves its Hellos never stop that node's proven ones.

gw-1 is the attacker (its own bound login, by hand and through the reference gateway);
gw-2 is honest.
"""

from __future__ import annotations

import time

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas.subjects import Subjects
from tests.integration import fleet
from tests.integration.security.conftest import unproven_hello
from tests.integration.security.gateways.test_proof_freshness import _move
from tests.integration.security.gateways.test_takeover import _gateways
from tests.integration.streams import RecordingStream
from workers.gateway import Code, HelloRequest, Refused, store
from workers.runtime.store import migrate

pytestmark = pytest.mark.slow

FLOOD = 1000


async def _flood(conn: asyncpg.Connection, lease: int, node: str) -> dict[str, int]:
    """gw-1's Hello transactions for `node`, by hand, unproven, each from a new boot."""
    outcomes: dict[str, int] = {}
    for i in range(FLOOD):
        row = await unproven_hello(conn, "gw-1", lease, node, f"boot-{i}")
        outcomes[row["outcome"]] = outcomes.get(row["outcome"], 0) + 1
    return outcomes


async def _rows(db: asyncpg.Connection, node: str) -> int:
    return int(await db.fetchval("SELECT count(*) FROM session_epochs WHERE node_id = $1", node))


@pytest.mark.parametrize("policy", ["warn", "require"])
async def test_a_gateways_hello_flood_opens_a_bounded_number_and_the_node_still_gets_in(
    logins: dict[str, str], nc: NATS, subjects: Subjects, db: asyncpg.Connection, policy: str
) -> None:
    assert await db.fetchval("SELECT hellos_per_node_minute()") == store.HELLOS_PER_NODE_MINUTE
    bound = store.HELLOS_PER_NODE_MINUTE
    await migrate.set_hello_proof(db, policy)
    async with _gateways(logins, nc, subjects, db) as (gw1, gw2):
        await fleet.join(db, "k1", key=False)  # a node without a key: warn opens its Hellos
        await fleet.join(db, "n1")  # one that proves its Hellos
        conn = await asyncpg.connect(logins["bcw_gateway_bound"])
        try:
            started = time.monotonic()
            keyless = await _flood(conn, gw1.lease_epoch, "k1")
            keyed = await _flood(conn, gw1.lease_epoch, "n1")  # takeover attempts at warn
            took = time.monotonic() - started
        finally:
            await conn.close()
        opened = bound if policy == "warn" else 0
        assert keyless.get("opened", 0) == keyed.get("opened", 0) == opened
        if policy == "warn":
            assert keyless["too-many"] == keyed["too-many"] == FLOOD - bound
        assert await _rows(db, "k1") == await _rows(db, "n1") == opened
        # the node's own proven Hello opens: the unproven ones are counted apart
        await fleet.say_hello(
            gw2,
            HelloRequest(
                node_id="n1", cert_serial="n1-serial", role="worker", boot_id="b1", journal_id="j1"
            ),
        )
        assert await db.fetchval("SELECT proven FROM node_sessions WHERE node_id = 'n1'") is True
        if policy == "warn":  # through the reference gateway: UNAVAILABLE, with a pushback
            with pytest.raises(Refused) as refused:
                await gw1.hello(
                    HelloRequest(
                        node_id="k1",
                        cert_serial="k1-serial",
                        role="worker",
                        boot_id="again",
                        journal_id="j",
                    ),
                    RecordingStream(),
                )
            assert refused.value.code is Code.UNAVAILABLE
            assert refused.value.retry_after is not None and 30 <= refused.value.retry_after < 60
            await _move(db, gw1, 61)  # a minute later the node's Hellos open again
            await gw1.hello(
                HelloRequest(
                    node_id="k1",
                    cert_serial="k1-serial",
                    role="worker",
                    boot_id="later",
                    journal_id="j",
                ),
                RecordingStream(),
            )
        print(
            f"\n{policy}: {2 * FLOOD} Hello transactions from one login in {took:.1f} s; "
            f"{2 * opened} rows of session_epochs"
        )
