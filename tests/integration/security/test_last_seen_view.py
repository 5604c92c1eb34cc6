"""`node_last_seen` runs as its caller (migration 0050, `security_invoker`): a row a
login may not read in `node_sessions` or `liveness_ranges` — by a row rule or by a
missing grant — is not read through the view either. Its owner's rights would let a
view read around every row rule a later release puts on either table."""

from __future__ import annotations

from datetime import timedelta

import asyncpg
import pytest

from schemas.facts import HASH_SPACE
from tests.integration import fleet

pytestmark = pytest.mark.slow

ROW = """
INSERT INTO liveness_ranges
       (gateway_id, range_start, range_end, stream_seq, applied_at, oldest_at, sessions, entries)
VALUES ($1, 0, $2, 1, compute_now(), compute_now(), 1, $3::json)
"""
VIEW = "SELECT node_id, last_seen FROM node_last_seen WHERE session_epoch > 0 ORDER BY node_id"


async def test_a_row_a_login_may_not_read_is_not_read_through_the_view(
    logins: dict[str, str], db: asyncpg.Connection
) -> None:
    for node, gateway in (("mine", "gw-1"), ("theirs", "gw-2")):
        await fleet.session(db, node, epoch=1, gateway_id=gateway, seen_ago=timedelta(hours=1))
        await db.execute(ROW, gateway, HASH_SPACE, f'[["{node}", 1, 0]]')
    owner = {r["node_id"]: r["last_seen"] for r in await db.fetch(VIEW)}
    # a reader whose row rules let it see one session, and the other gateway's range row
    await db.execute(
        "ALTER TABLE node_sessions ENABLE ROW LEVEL SECURITY;"
        "CREATE POLICY t_mine ON node_sessions FOR SELECT TO bcw_reader USING (node_id = 'mine');"
        "ALTER TABLE liveness_ranges ENABLE ROW LEVEL SECURITY;"
        "CREATE POLICY t_other ON liveness_ranges FOR SELECT TO bcw_reader"
        " USING (gateway_id = 'gw-2')"
    )
    reader = await asyncpg.connect(logins["bcw_reader"])
    relay = await asyncpg.connect(logins["bcw_relay"])
    try:
        seen = {r["node_id"]: r["last_seen"] for r in await reader.fetch(VIEW)}
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await relay.fetch(VIEW)  # no grant on the view, nor on the sessions
    finally:
        await reader.close()
        await relay.close()
    assert sorted(owner) == ["mine", "theirs"]
    assert list(seen) == ["mine"]  # not the session it may not read
    # nor the range row it may not read: its session's row's sight, an hour old
    row_seen = await db.fetchval("SELECT last_seen FROM node_sessions WHERE node_id = 'mine'")
    assert seen["mine"] == row_seen < owner["mine"] - timedelta(minutes=59)
