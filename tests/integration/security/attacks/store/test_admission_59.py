"""Issue 59, finding 15: `gateway_admission` answered any gateway about any node — a node's
desired-state spec (with its `API_TOKEN`) to a gateway that does not hold it, and any
guessed serial's record. Logged in as gw-1's gateway login (`bcw_gateway_bound`), probing
nodes it does not hold: it learns that a serial is refused, nothing more, and a node's
spec only once its own Hello opened the node's session (`gateway_desired_state`,
migration 0057). The proof policy (setups A and B) is not read by admission: both are
run, the answers are the same.
"""

from __future__ import annotations

import json

import asyncpg
import pytest

from tests.integration import fleet
from workers.runtime.store import migrate

pytestmark = pytest.mark.slow

SPEC = {"env": {"API_TOKEN": "s3cr3t-token-of-n2"}}

CERT_FIELDS = ("node_id", "identity_generation", "role", "not_after", "allowed_kinds")


@pytest.fixture(params=["warn", "require"], ids=["A-warn", "B-require"])
async def policy(request: pytest.FixtureRequest, db: asyncpg.Connection) -> str:
    await migrate.set_hello_proof(db, request.param)
    return str(request.param)


async def _admission(conn: asyncpg.Connection, node: str, serial: str) -> asyncpg.Record:
    row = await conn.fetchrow("SELECT * FROM gateway_admission('gw-1', $1, $2)", node, serial)
    assert row is not None
    return row


async def test_a_gateway_learns_nothing_of_a_node_it_does_not_hold(
    policy: str, logins: dict[str, str], db: asyncpg.Connection
) -> None:
    """n2 is held by gw-2 and has a spec with a token; n1 is gw-1's own; n3's certificate
    was revoked. gw-1 probes: n2's spec (by admission, and by asking for the desired state
    at n2's epoch), n2's serial presented for n1 and for a node that never joined, n3's
    revoked serial, a guessed serial. Each answer is "refused" (another node's, revoked)
    or nothing; n1's own record and — once its session is gw-1's — its spec are whole."""
    for node in ("n1", "n2", "n3"):
        await fleet.join(db, node)
    assert await db.fetchval("SELECT set_node_spec('n2', $1::jsonb)", json.dumps(SPEC)) == 1
    assert await db.fetchval("SELECT set_node_spec('n1', $1::jsonb)", json.dumps(SPEC)) == 1
    await fleet.session(db, "n2", epoch=3, gateway_id="gw-2")
    await db.execute(
        "UPDATE node_certs SET revoked_at = compute_now(), revocation_reason = 'test' "
        "WHERE serial = 'n3-serial'"
    )
    conn = await asyncpg.connect(logins["bcw_gateway_bound"])
    try:
        # the spec of a node held by another gateway: none, however asked
        held = await _admission(conn, "n2", "n2-serial")
        assert (held["spec"], held["spec_generation"], held["spec_signature"]) == (None,) * 3
        for epoch in (0, 1, 2, 3, 4):
            row = await conn.fetchrow(
                "SELECT * FROM gateway_desired_state('gw-1', 'n2', $1)", epoch
            )
            assert row is not None and row["spec"] is None, epoch
        with pytest.raises(asyncpg.InsufficientPrivilegeError):  # only as gw-1
            await conn.fetchrow("SELECT * FROM gateway_desired_state('gw-2', 'n2', 3)")
        # another node's serial, for n1 and for a node that never joined: its serial only
        for node in ("n1", "ghost"):
            other = await _admission(conn, node, "n2-serial")
            assert other["serial"] == "n2-serial" and other["revoked"] is False
            assert all(other[f] is None for f in CERT_FIELDS), dict(other)
        # a revoked serial of the node named: revoked, nothing else
        revoked = await _admission(conn, "n3", "n3-serial")
        assert (revoked["serial"], revoked["node_id"], revoked["revoked"]) == (
            "n3-serial",
            "n3",
            True,
        )
        assert all(revoked[f] is None for f in CERT_FIELDS[1:]), dict(revoked)
        # a guessed serial: nothing
        guessed = await _admission(conn, "n1", "n9-serial")
        assert guessed["serial"] is None
        # its own node: the whole record; the spec once the session is gw-1's
        own = await _admission(conn, "n1", "n1-serial")
        assert (own["node_id"], own["role"], own["revoked"]) == ("n1", "worker", False)
        assert own["not_after"] is not None and own["identity_generation"] is not None
        assert own["spec"] is None  # not gw-1's yet
        await fleet.session(db, "n1", epoch=1, gateway_id="gw-1")
        row = await conn.fetchrow("SELECT * FROM gateway_desired_state('gw-1', 'n1', 1)")
        assert json.loads(row["spec"]) == SPEC
        assert (await _admission(conn, "n1", "n1-serial"))["spec"] is not None
        stale = await conn.fetchrow("SELECT * FROM gateway_desired_state('gw-1', 'n1', 0)")
        assert stale["spec"] is None  # another epoch than the one it holds
        # nothing another principal owns changed
        assert await db.fetchval("SELECT gateway_id FROM node_sessions WHERE node_id = 'n2'") == (
            "gw-2"
        )
    finally:
        await conn.close()
