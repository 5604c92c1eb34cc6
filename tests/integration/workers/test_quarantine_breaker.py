"""The revocation breaker on real servers: what one gateway's Hellos can revoke, and an
operator's release (`bcw quarantine release`)."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration import fleet
from tests.integration.driver import Driver, driving
from tests.integration.support import eventually
from tests.integration.workers.test_quarantine import clone_hello
from workers import quarantine
from workers.cli.main import main


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
        "n1", "one-gateway", ["gw-1"], ["n1-serial"],
    )  # fmt: skip
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
    """Five nodes each quarantined by a Hello through gw-1 (their clones alternate between
    gw-2 and gw-1): three are revoked, the fourth and fifth held, the breaker said once."""
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
        ("a4", "breaker", "gw-1"), ("a5", "breaker", "gw-1"),
    ]  # fmt: skip
    [opened] = await drive.published("security.quarantine.breaker-open")
    assert (opened["gatewayId"], opened["revoked"], opened["windowSeconds"]) == ("gw-1", 3, 600)
    assert len(await drive.published("security.node.quarantined")) == 3


async def _gauge(drive: Driver, value: float) -> bool:
    return bool(drive.runtime.metrics.quarantines_held.value() == value)


async def _revoked_now(db: asyncpg.Connection, serials: set[str]) -> bool:
    return await _revoked(db) == serials
