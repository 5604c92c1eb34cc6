"""Hidden clones (issue #59, items 3 and 12), the quarantine alone (a driver in place of
the gateways): what it counts is what the Hello transaction recorded for an epoch, not
what the gateway's fact says; a recorded duplicate whose fact never came is counted, and
said, with the node's next one, and its fact arriving at last counts nothing again. The
clones through real gateways: test_hidden_clones_59.py.
"""

from __future__ import annotations

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration import fleet
from tests.integration.driver import Driver, driving
from workers import quarantine

pytestmark = pytest.mark.slow

# what the Hello transaction records for an epoch (migration 0049): its judgement
RECORD = """
INSERT INTO session_epochs (node_id, epoch, gateway_id, boot_id, journal_id, hello_fact_id,
                            previous_epoch, previous_gateway_id, previous_boot_id,
                            previous_live, duplicate)
VALUES ('n1', $1::bigint, $2, $3, 'j1', $4, $1::bigint - 1, $5, $6, true, $7)
"""


@pytest.fixture
async def drive(servers: Servers, nc: NATS, subjects: Subjects, database_url: str):  # type: ignore[no-untyped-def]
    async with driving(servers, nc, subjects, database_url, quarantine.build) as driver:
        yield driver


async def _recorded_hello(
    db: asyncpg.Connection, epoch: int, gateway: str, recorded: bool, says: bool
) -> object:
    """n1's Hello at `epoch` through `gateway`: its transaction recorded it a duplicate
    (`recorded`) or not; its fact says `says`."""
    boot, other = ("boot-a", "boot-b") if epoch % 2 else ("boot-b", "boot-a")
    hello = fleet.hello(
        "n1",
        epoch,
        gateway_id=gateway,
        boot_id=boot,
        cert={"serial": "n1-serial"},
        duplicate=says,
        previous={"epoch": epoch - 1, "live": says},
    )
    other_gateway = "gw-2" if gateway == "gw-1" else "gw-1"
    await db.execute(RECORD, epoch, gateway, boot, hello.fact_id, other_gateway, other, recorded)
    return hello


async def _alternations(db: asyncpg.Connection) -> list[tuple[int, str]]:
    rows = await db.fetch("SELECT epoch, gateway_id FROM node_alternations ORDER BY epoch")
    return [(r["epoch"], r["gateway_id"]) for r in rows]


async def test_the_record_decides_what_is_counted_not_the_fact(
    drive: Driver, db: asyncpg.Connection
) -> None:
    await fleet.session(db, "n1", epoch=1)
    hidden = await _recorded_hello(db, 2, "gw-1", recorded=True, says=False)  # a hidden clone
    made_up = await _recorded_hello(db, 3, "gw-1", recorded=False, says=True)  # no clone at all
    await drive.send(hidden, made_up)
    assert await _alternations(db) == [(2, "gw-1")]
    assert drive.settled("ignored") == 1
    [event] = await drive.published("security.node.duplicate-session")
    assert (event["gatewayId"], event["bootId"], event["alternations"]) == ("gw-1", "boot-b", 1)


async def test_a_duplicate_whose_fact_never_came_is_counted_with_the_next(
    drive: Driver, db: asyncpg.Connection
) -> None:
    """gw-1 never says the clone's Hellos (epochs 2, 4); n1's reconnects through gw-2 (3, 5)
    are said: at the fourth the node is quarantined (two gateways), blamed on gw-1. The
    withheld facts, arriving at last, count nothing again."""
    await fleet.session(db, "n1", epoch=1)
    withheld = [await _recorded_hello(db, e, "gw-1", recorded=True, says=True) for e in (2, 4)]
    said = [await _recorded_hello(db, e, "gw-2", recorded=True, says=True) for e in (3, 5)]
    await drive.send(said[0])
    assert await _alternations(db) == [(2, "gw-1"), (3, "gw-2")]
    await drive.send(said[1])
    assert await _alternations(db) == [(2, "gw-1"), (3, "gw-2"), (4, "gw-1"), (5, "gw-2")]
    events = await drive.published("security.node.duplicate-session")
    assert [(e["gatewayId"], e["alternations"], e["quarantined"]) for e in events] == [
        ("gw-1", 1, False),
        ("gw-2", 2, False),
        ("gw-1", 3, False),
        ("gw-2", 4, True),
    ]
    row = await db.fetchrow("SELECT gateway_id, gateways, held FROM quarantines")
    assert (row["gateway_id"], sorted(row["gateways"]), row["held"]) == (
        "gw-1",
        ["gw-1", "gw-2"],
        None,
    )
    assert await db.fetchval("SELECT is_revoked('n1-serial')")
    await drive.send(*withheld)
    assert drive.settled("duplicate") == 2
    assert len(await drive.published("security.node.duplicate-session")) == 4
