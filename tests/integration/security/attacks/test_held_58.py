"""What held of the attacks on the change of issue 58 (test_found_58.py has what did not,
and its fixes): challenges write no row, open nothing without the node's key, cannot be
asked as another gateway or used by another; no login reads a Hello key, the challenge key
or the one-time ids, and only gateways may ask for a challenge."""

from __future__ import annotations

import uuid

import asyncpg
import pytest
from nats.aio.client import Client as NATS

from schemas.proof import prove
from schemas.subjects import Subjects
from tests.conftest import Servers
from tests.integration import fleet
from tests.integration.security.attacks.test_found_58 import SHIFTED_HELLO, _hello, _world
from tests.integration.security.conftest import url_as
from tests.integration.streams import RecordingStream

pytestmark = pytest.mark.slow


# -- what held (kept as tests: each passes) ----------------------------------------------


async def test_a_challenge_opens_no_hello_without_the_nodes_key_and_costs_no_row(
    servers: Servers,
    logins: dict[str, str],
    nc: NATS,
    subjects: Subjects,
    database_url: str,
    db: asyncpg.Connection,
) -> None:
    """gw-1 asks the database for 2,000 challenges for n1 (any gateway may ask for any
    node): none writes a row; a challenge with a made-up MAC, or gw-2's challenge
    presented by gw-1, opens nothing at `require`, and changes n1's session in nothing."""
    async with _world(servers, logins, nc, subjects, database_url, db, "require") as (_, gw2):
        await gw2.hello(_hello("b1", "j1", "gw-2"), RecordingStream())
        session = (
            "SELECT session_epoch, gateway_id, boot_id, journal_id, held_epoch, proven, "
            "acked_event_seq FROM node_sessions WHERE node_id = 'n1'"
        )
        before = await db.fetchrow(session)
        gw2_conn = await asyncpg.connect(url_as(logins["bcw_gateway_bound"], "gw2_login_t"))
        conn = await asyncpg.connect(logins["bcw_gateway_bound"])
        try:
            for _ in range(2000):
                await conn.fetchrow("SELECT * FROM gateway_hello_challenge('gw-1', 'n1')")
            with pytest.raises(asyncpg.PostgresError):  # not as another gateway
                await conn.fetchrow("SELECT * FROM gateway_hello_challenge('gw-2', 'n1')")
            mine = await conn.fetchrow("SELECT * FROM gateway_hello_challenge('gw-1', 'n1')")
            theirs = await gw2_conn.fetchrow("SELECT * FROM gateway_hello_challenge('gw-2', 'n1')")
            lease = await conn.fetchval("SELECT gateway_acquire('gw-1', '60s')")
            outcomes = []
            for challenge in (mine, theirs):
                mac = prove(
                    b"not-the-key",
                    "n1",
                    "b1",
                    "j1",
                    "gw-1",
                    challenge["server_time"],
                    challenge["challenge"],
                ).mac
                row = await conn.fetchrow(
                    SHIFTED_HELLO,
                    lease,
                    "evil",
                    "j1",
                    uuid.uuid4(),
                    challenge["server_time"],
                    challenge["challenge"],
                    mac,
                )
                outcomes.append(row["outcome"])
        finally:
            await conn.close()
            await gw2_conn.close()
        assert outcomes == ["unproven", "unproven"]
        assert await db.fetchval("SELECT count(*) FROM hello_nonces") == 1  # gw-2's Hello's
        after = await db.fetchrow(session)
        assert dict(after) == dict(before)


SECRETS = (
    "SELECT * FROM node_hello_keys",
    "SELECT * FROM hello_challenge_key",
    "SELECT * FROM hello_nonces",
    "SELECT hello_challenge('n1', 'gw-1', 1, '0123456789abcdef')",
    "SELECT hello_proof_holds('n1', 'b', 'j', 'gw-1', 1, 'x', 'y')",
    "SELECT * FROM gateway_hello_challenge('gw-1', 'n1')",
)


async def test_no_login_but_a_gateways_reads_a_secret_or_asks_for_a_challenge(
    logins: dict[str, str], db: asyncpg.Connection
) -> None:
    """Every group's login (workers, reader, relay, operator, both gateway groups) tries the
    Hello keys, the challenge key, the one-time ids and the challenge functions; only a
    gateway may ask for a challenge (as itself), and nobody reads a key."""
    await fleet.join(db, "n1")
    got: list[tuple[str, str]] = []
    for group, url in logins.items():
        conn = await asyncpg.connect(url)
        try:
            for sql in SECRETS:
                try:
                    async with conn.transaction():
                        await conn.fetch(sql)
                    got.append((group, sql))
                except asyncpg.PostgresError:
                    pass
        finally:
            await conn.close()
    assert got == [("bcw_gateway_bound", SECRETS[-1])] or sorted(got) == sorted(
        [("bcw_gateway", SECRETS[-1]), ("bcw_gateway_bound", SECRETS[-1])]
    ), got
