"""The revocation breaker on real servers: what one gateway's Hellos can revoke — unproven
ones, a few at most; proven ones, what any clones would — an operator's release (`bcw
quarantine release`), the takeover attempts said, and the DuplicateIdentity condition."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas.subjects import Subjects
from tests.conftest import Clock, Servers
from tests.integration import fleet
from tests.integration.driver import Driver, driving
from tests.integration.support import eventually
from tests.integration.workers.test_quarantine import clone_hello
from workers import quarantine
from workers.cli.main import main
from workers.quarantine.metrics import QuarantineMetrics


@pytest.fixture
async def drive(servers: Servers, nc: NATS, subjects: Subjects, database_url: str):  # type: ignore[no-untyped-def]
    async with driving(servers, nc, subjects, database_url, quarantine.build) as driver:
        yield driver


async def _revoked(db: asyncpg.Connection) -> set[str]:
    rows = await db.fetch("SELECT serial FROM node_certs WHERE revoked_at IS NOT NULL")
    return {r["serial"] for r in rows}


async def _hold_as_the_hello_transaction(db: asyncpg.Connection, hello: object) -> None:
    await db.execute(
        "UPDATE node_sessions SET session_epoch = $2, held_epoch = $2, gateway_id = $3 "
        "WHERE node_id = $1",
        hello.node_id,  # type: ignore[attr-defined]
        hello.epoch,  # type: ignore[attr-defined]
        hello.gateway_id,  # type: ignore[attr-defined]
    )


async def test_alternations_through_one_gateway_alert_and_revoke_only_once_released(
    drive: Driver, db: asyncpg.Connection, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four alternations, every one through gw-1 (which may have made both machines up):
    nothing is revoked, the quarantine is held (its session too) and said; an operator's
    release lets the enforcer revoke."""
    await fleet.session(db, "n1", epoch=1)
    for _ in range(4):
        hello = await clone_hello(db, gateways=("gw-1", "gw-1"))
        await _hold_as_the_hello_transaction(db, hello)
        await drive.send(hello)
    assert await _revoked(db) == set()
    assert await db.fetchval("SELECT held_epoch FROM node_sessions") == hello.epoch  # no command
    [held] = await drive.published("security.quarantine.held")
    assert (held["nodeId"], held["reason"], held["gateways"], held["serials"]) == (
        "n1",
        "one-gateway",
        ["gw-1"],
        ["n1-serial"],
    )
    duplicates = await drive.published("security.node.duplicate-session")
    assert [d["quarantined"] for d in duplicates] == [False] * 4
    assert await drive.published("security.node.quarantined") == []
    await eventually(lambda: _gauge(drive, 1.0), what="bcw_quarantines_held says one waits")

    monkeypatch.setenv("BCW_DATABASE_URL", database_url)
    assert (
        await asyncio.to_thread(main, ["quarantine", "release", "--node", "n1", "--by", "al"]) == 0
    )
    await eventually(lambda: _revoked_now(db, {"n1-serial"}), what="the released revocation")
    [quarantined] = await drive.published("security.node.quarantined")
    assert quarantined["revokedSerials"] == ["n1-serial"]
    [notice] = [m for m in await drive.published("revocations")]
    assert notice["serials"] == ["n1-serial"]
    row = await db.fetchrow("SELECT released_by, revoked_at FROM quarantines WHERE node_id = 'n1'")
    assert row["released_by"] == "al" and row["revoked_at"] is not None
    await eventually(lambda: _gauge(drive, 0.0), what="nothing waits any more")
    # a second release finds nothing: exit 1, one line
    assert await asyncio.to_thread(main, ["quarantine", "release", "--all"]) == 1


async def test_the_breaker_holds_a_gateways_fourth_revocation(
    drive: Driver, db: asyncpg.Connection
) -> None:
    """Five nodes whose clones alternate between gw-2 and gw-1, each count begun by a
    duplicate through gw-2 and completed by a Hello through gw-1: each is charged to gw-2
    (the gateway its first duplicate came through, `decide.blamed`) — three are revoked,
    the fourth and fifth held, the breaker said once, for gw-2."""
    nodes = [f"a{i}" for i in range(1, 6)]
    for node in nodes:
        await fleet.session(db, node, epoch=1)
    for _ in range(4):
        for node in nodes:
            await drive.send(
                await clone_hello(db, node, f"{node}-serial", gateways=("gw-2", "gw-1"))
            )
    assert await _revoked(db) == {"a1-serial", "a2-serial", "a3-serial"}
    held = await drive.published("security.quarantine.held")
    assert [(h["nodeId"], h["reason"], h["gatewayId"]) for h in held] == [
        ("a4", "breaker", "gw-2"),
        ("a5", "breaker", "gw-2"),
    ]
    [opened] = await drive.published("security.quarantine.breaker-open")
    assert (opened["gatewayId"], opened["revoked"], opened["windowSeconds"]) == ("gw-2", 3, 600)
    charged = await db.fetch("SELECT DISTINCT gateway_id FROM quarantines")
    assert [r["gateway_id"] for r in charged] == ["gw-2"]
    assert len(await drive.published("security.node.quarantined")) == 3


async def _gauge(drive: Driver, value: float) -> bool:
    return bool(drive.runtime.metrics.of(QuarantineMetrics).quarantines_held.value() == value)


async def _revoked_now(db: asyncpg.Connection, serials: set[str]) -> bool:
    return await _revoked(db) == serials


async def test_proven_alternations_through_one_gateway_revoke_at_the_fourth(
    drive: Driver, db: asyncpg.Connection
) -> None:
    """The same four alternations through gw-1, each Hello proven (and so the session
    before it, as the Hello transaction judged it): no gateway makes up a proven Hello of
    another boot, so nothing waits for an operator — revoked at once."""
    await fleet.session(db, "n1", epoch=1)
    for _ in range(4):
        hello = await clone_hello(db, gateways=("gw-1", "gw-1"))
        await drive.send(hello.model_copy(update={"proven": True}))
    assert await _revoked(db) == {"n1-serial"}
    assert await drive.published("security.quarantine.held") == []
    row = await db.fetchrow("SELECT held, gateways, revoked_at FROM quarantines")
    assert (row["held"], row["gateways"]) == (None, ["gw-1"]) and row["revoked_at"] is not None
    duplicates = await drive.published("security.node.duplicate-session")
    assert [(d["quarantined"], d["held"]) for d in duplicates] == [(False, False)] * 3 + [
        (True, False)
    ]


async def test_a_window_with_one_unproven_alternation_is_held_as_before(
    drive: Driver, db: asyncpg.Connection
) -> None:
    """Three proven, one not (a Hello a gateway could have made up, at warn or off): the
    window is unproven, and through one gateway it waits for an operator."""
    await fleet.session(db, "n1", epoch=1)
    for proven in (True, True, None, True):
        hello = await clone_hello(db, gateways=("gw-1", "gw-1"))
        await drive.send(hello.model_copy(update={"proven": proven}))
    assert await _revoked(db) == set()
    [held] = await drive.published("security.quarantine.held")
    assert held["reason"] == "one-gateway"


async def test_a_takeover_attempt_is_said_once_and_never_counted(
    drive: Driver, db: asyncpg.Connection
) -> None:
    """An unproven Hello of a node that proves its Hellos (`proven` false, as recorded):
    said once (`security.node.unproven-hello`, even delivered again), counted as no
    alternation, revoking nothing."""
    await fleet.session(db, "n1", epoch=1)
    for _ in range(5):
        hello = await clone_hello(db, gateways=("gw-1", "gw-1"))
        taken = hello.model_copy(update={"proven": False, "duplicate": False})
        await drive.send(taken)
        await drive.send(taken, again=True)
    assert await _revoked(db) == set()
    said = await drive.published("security.node.unproven-hello")
    assert [(s["nodeId"], s["gatewayId"], s["serial"]) for s in said] == [
        ("n1", "gw-1", "n1-serial")
    ] * 5
    assert await drive.published("security.node.duplicate-session") == []
    assert await db.fetchval("SELECT duplicate_hellos FROM node_sessions") == 0
    assert await db.fetchval("SELECT count(*) FROM node_conditions") == 0


async def test_the_condition_comes_with_the_first_counted_duplicate_and_goes_a_window_after(
    drive: Driver, db: asyncpg.Connection, clock: Clock
) -> None:
    """One alternation (a reboot faster than the live window, say): DuplicateIdentity from
    it on; the release loop clears it once a whole window passed without another, the
    node's session good (connected, not held, its certificate live)."""
    await fleet.session(db, "n1", epoch=1)
    hello = await clone_hello(db)
    await drive.send(hello)
    row = await db.fetchrow("SELECT condition, epoch FROM node_conditions")
    assert tuple(row) == ("DuplicateIdentity", hello.epoch)
    await asyncio.sleep(2.5)  # a look of the release loop, or more: it stays
    assert await db.fetchval("SELECT count(*) FROM node_conditions") == 1
    await clock.advance(timedelta(minutes=11))

    async def cleared() -> bool:
        return await db.fetchval("SELECT count(*) FROM node_conditions") == 0

    await eventually(cleared, what="the condition cleared a window after")
