"""Issue 62: `gateway_close_many` (migration 0061), the stopping gateway's batch of closes,
attacked as a bound gateway's login (gw-1's) and as every other group's."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta

import asyncpg
import pytest

from tests.integration import fleet
from tests.integration.security.conftest import GROUPS

pytestmark = pytest.mark.slow

TTL = timedelta(seconds=30)
CLOSE = "SELECT gateway_close_many($1, $2, $3::text[], $4::bigint[], $5) AS n"


@contextlib.asynccontextmanager
async def _connected(url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(url)
    try:
        yield conn
    finally:
        await conn.close()


async def _open(db: asyncpg.Connection, node: str, gateway: str, epoch: int) -> None:
    """`node` joined and holding a session of `gateway` at `epoch` (as its Hello leaves it)."""
    await fleet.join(db, node)
    await db.execute(
        "UPDATE node_sessions SET gateway_id = $2, session_epoch = $3, last_seen = compute_now(),"
        " connected_at = compute_now(), disconnected_at = NULL WHERE node_id = $1",
        node,
        gateway,
        epoch,
    )


async def _holder(db: asyncpg.Connection, node: str) -> tuple[str | None, int]:
    row = await db.fetchrow(
        "SELECT gateway_id, session_epoch FROM node_sessions WHERE node_id = $1", node
    )
    return row["gateway_id"], row["session_epoch"]


async def test_no_group_but_the_bound_gateways_may_call_it(
    logins: dict[str, str], db: asyncpg.Connection
) -> None:
    await db.execute(
        "INSERT INTO gateways (gateway_id, lease_epoch, lease_expires_at) "
        "VALUES ('gw-2', 7, compute_now() + interval '1 minute')"
    )
    await _open(db, "n2", "gw-2", 3)
    through = []
    for group in GROUPS:
        if group == "bcw_gateway_bound":
            continue
        async with _connected(logins[group]) as conn:
            try:
                await conn.fetch(CLOSE, "gw-2", 7, ["n2"], [3], "x")
            except asyncpg.InsufficientPrivilegeError:
                continue
            through.append(group)
    assert through == []
    assert await _holder(db, "n2") == ("gw-2", 3)


async def test_odd_arrays_close_only_its_own_sessions_at_their_epochs(
    logins: dict[str, str], db: asyncpg.Connection
) -> None:
    await db.execute(
        "INSERT INTO gateways (gateway_id, lease_epoch, lease_expires_at) "
        "VALUES ('gw-2', 7, compute_now() + interval '1 minute')"
    )
    await _open(db, "n1", "gw-1", 4)
    await _open(db, "n2", "gw-2", 3)
    async with _connected(logins["bcw_gateway_bound"]) as conn:
        lease = await conn.fetchval("SELECT gateway_acquire('gw-1', $1)", TTL)
        for nodes, epochs in [
            (None, None),
            (None, [4]),
            (["n1"], None),
            ([None, "n2"], [4, None]),
            (["n1"], [3]),  # another epoch
            (["n2"], [3]),  # another gateway's
            (["n1", "n1"], [5, 3]),
        ]:
            try:
                rows = await conn.fetch(CLOSE, "gw-1", lease, nodes, epochs, "x")
            except asyncpg.InvalidParameterValueError:
                continue
            assert rows == [], (nodes, epochs)
        with pytest.raises(asyncpg.PostgresError):
            await conn.fetch(CLOSE, None, lease, ["n1"], [4], "x")
        # a stale lease closes nothing
        assert await conn.fetch(CLOSE, "gw-1", lease - 1, ["n1"], [4], "x") == []
        assert await conn.fetch(CLOSE, "gw-1", None, ["n1"], [4], "x") == []
        # duplicates: one close, one row back
        rows = await conn.fetch(CLOSE, "gw-1", lease, ["n1"] * 5000, [4] * 5000, "x")
        assert [r["n"] for r in rows] == ["n1"]
    assert await _holder(db, "n1") == (None, 4)
    assert await _holder(db, "n2") == ("gw-2", 3)


async def test_a_lease_taken_while_it_waits_for_a_row_fences_it(
    logins: dict[str, str], db: asyncpg.Connection
) -> None:
    """The old incarnation's batch checked its lease, then waits for a session row another
    transaction holds (a flush); meanwhile a new incarnation takes the lease. As
    `gateway_close` with a stale lease, the old one's batch must close nothing."""
    await _open(db, "n1", "gw-1", 4)
    await _open(db, "n3", "gw-1", 2)
    async with (
        _connected(logins["bcw_gateway_bound"]) as old,
        _connected(logins["bcw_gateway_bound"]) as new,
        _connected(logins["bcw_liveness"]) as flush,
    ):
        stale = await old.fetchval("SELECT gateway_acquire('gw-1', $1)", TTL)
        tx = flush.transaction()
        await tx.start()
        await flush.execute("SELECT 1 FROM node_sessions WHERE node_id = 'n3' FOR UPDATE")
        closing = asyncio.ensure_future(old.fetch(CLOSE, "gw-1", stale, ["n1", "n3"], [4, 2], "x"))
        await asyncio.sleep(0.5)
        assert not closing.done()
        acquiring = asyncio.ensure_future(new.fetchval("SELECT gateway_acquire('gw-1', $1)", TTL))
        await asyncio.sleep(0.5)
        taken_meanwhile = acquiring.done()  # the new lease did not wait for the batch
        await tx.commit()
        rows = await asyncio.wait_for(closing, timeout=5)
        assert await asyncio.wait_for(acquiring, timeout=5) == stale + 1
    # the fence (as `gateway_hello`'s FOR SHARE): either the new lease waits for the batch,
    # or a batch its lease was taken from before it wrote closes nothing
    assert not taken_meanwhile or rows == []
    if taken_meanwhile:
        assert await _holder(db, "n1") == ("gw-1", 4)
        assert await _holder(db, "n3") == ("gw-1", 2)
