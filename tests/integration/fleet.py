"""Rows of a fleet for worker tests: joined nodes (each with its Hello key, as a join
gives it) with sessions at a given epoch on a given gateway, gateways with leases, Hello
facts that match them, and a node's daemon saying Hello proven. Real SQL on the real
database; the reference gateway does the same through its Hello transaction."""

from __future__ import annotations

import dataclasses
import hashlib
import time
from datetime import timedelta
from typing import Any

import asyncpg

from schemas.proof import prove
from tests.factories import hello
from tests.integration.streams import RecordingStream
from workers.gateway import Gateway, HelloRequest, Welcome
from workers.gateway import notices as gateway_notices
from workers.gateway.gateway import LIVENESS_LOOP

__all__ = [
    "Provisioned",
    "flushed",
    "gateway",
    "hello",
    "hello_key",
    "issued",
    "join",
    "proven",
    "say_hello",
    "session",
]


class Provisioned(Gateway):
    """The reference gateway of an install whose `bcw provision` made its notices consumer
    (BCW_NATS_GATEWAYS), as the chart's Job does before a gateway starts: made here on the
    gateway's own connection (a test's, which may), never by the gateway itself."""

    async def start(self, autotick: float | None = LIVENESS_LOOP) -> None:
        await gateway_notices.provision(self.js, self.subjects, self.gateway_id)
        await super().start(autotick)


def hello_key(node_id: str) -> bytes:
    """The Hello key a test node is given when it joins (`join`), and proves its Hellos by."""
    return hashlib.sha256(f"bcw-test-hello-key:{node_id}".encode()).digest()


async def join(
    conn: asyncpg.Connection,
    node_id: str,
    serial: str | None = None,
    kinds: list[str] | None = None,
    *,
    key: bool = True,
) -> None:
    """Join `node_id` with a certificate `serial`; with its Hello key (`hello_key`), as a
    join gives it, unless `key` is false (a node that never proves: a fleet moving to
    proofs, tests about `warn`)."""
    await conn.execute(
        "SELECT join_node($1, 'worker', $2, $3)", node_id, serial or f"{node_id}-serial", kinds
    )
    if key:
        await conn.execute("SELECT enroll_hello_key($1, $2)", node_id, hello_key(node_id))


#: the last `at` a test's daemons signed, per node: cleared for each test (each has its
#: own database; tests/integration/conftest.py)
SIGNED: dict[str, int] = {}


def rising_at(node_id: str, clock: float | None = None) -> int:
    """The `at` of the node's daemon's next plain proof: its clock (now by default), or the
    last it signed + 1 if that is later — a proof holds only after the newest `at` taken
    (migration 0059)."""
    now = int(time.time() if clock is None else clock)
    SIGNED[node_id] = max(now, SIGNED.get(node_id, -1) + 1)
    return SIGNED[node_id]


def proven(request: HelloRequest, gateway_id: str, at: float | None = None) -> HelloRequest:
    """`request` as the node's daemon sends it to `gateway_id`: proven by its key, at `at`
    (its clock: now by default), with a one-time id of its own."""
    moment = int(time.time() if at is None else at)
    proof = prove(
        hello_key(request.node_id),
        request.node_id,
        request.boot_id,
        request.journal_id,
        gateway_id,
        moment,
    )
    return dataclasses.replace(request, proof=proof)


async def say_hello(
    gateway: Gateway,
    request: HelloRequest,
    stream: RecordingStream | None = None,
    at: float | None = None,
) -> Welcome:
    """The node's daemon saying Hello to `gateway`, proven afresh (`proven`) at `at`: by
    default the fleet's clock (`compute_now()`, which a test may have moved), as a daemon
    whose clock is right would (or its last `at` + 1, if later: its `at` rises)."""
    if at is None:  # the fleet's clock as the gateway's login may read it
        async with gateway.pool.acquire() as conn:
            at = float(
                await conn.fetchval(
                    "SELECT extract(epoch FROM now) FROM gateway_admission($1, $2, $3)",
                    gateway.gateway_id,
                    request.node_id,
                    request.cert_serial,
                )
            )
        at = rising_at(request.node_id, at)
    return await gateway.hello(
        proven(request, gateway.gateway_id, at), stream if stream is not None else RecordingStream()
    )


async def session(
    conn: asyncpg.Connection,
    node_id: str,
    *,
    epoch: int,
    gateway_id: str | None = "gw-1",
    boot_id: str = "boot-1",
    journal_id: str = "journal-1",
    seen_ago: timedelta = timedelta(0),
    join_first: bool = True,
) -> None:
    """The node's session row as a gateway's Hello transaction leaves it."""
    if join_first:
        exists = await conn.fetchval("SELECT 1 FROM nodes WHERE node_id = $1", node_id)
        if not exists:
            await join(conn, node_id)
    await conn.execute(
        """
        UPDATE node_sessions
           SET session_epoch = $2::bigint, gateway_id = $3, boot_id = $4, journal_id = $5,
               session_id = 's-' || $2::text, connected_at = compute_now() - $6::interval,
               last_seen = compute_now() - $6::interval, disconnected_at = NULL, disconnect_reason = NULL
         WHERE node_id = $1
        """,
        node_id,
        epoch,
        gateway_id,
        boot_id,
        journal_id,
        seen_ago,
    )
    # its earlier epochs (and this one, when the row is disconnected) were issued to the
    # same gateway, as far as the gateway binding of facts is concerned (`provenance`)
    await conn.execute(
        """
        INSERT INTO session_epochs (node_id, epoch, gateway_id, boot_id, journal_id)
        SELECT $1, e, $3, $4, $5 FROM generate_series(1, $2::bigint) e
        ON CONFLICT (node_id, epoch) DO NOTHING
        """,
        node_id,
        epoch,
        gateway_id or "gw-1",
        boot_id,
        journal_id,
    )


async def issued(
    conn: asyncpg.Connection,
    node_id: str,
    epoch: int,
    gateway_id: str = "gw-1",
    *,
    boot_id: str = "boot-1",
    journal_id: str = "journal-1",
) -> None:
    """Record that `epoch` of the node was issued to `gateway_id` (what a Hello transaction
    leaves in `session_epochs`), without touching its session row."""
    await conn.execute(
        """
        INSERT INTO session_epochs (node_id, epoch, gateway_id, boot_id, journal_id)
        VALUES ($1, $2, $3, $4, $5)
        ON CONFLICT (node_id, epoch) DO UPDATE
           SET gateway_id = EXCLUDED.gateway_id, boot_id = EXCLUDED.boot_id,
               journal_id = EXCLUDED.journal_id
        """,
        node_id,
        epoch,
        gateway_id,
        boot_id,
        journal_id,
    )


async def gateway(conn: asyncpg.Connection, gateway_id: str, *, expires_in: timedelta) -> None:
    await conn.execute(
        """
        INSERT INTO gateways (gateway_id, lease_epoch, lease_expires_at) VALUES ($1, 1, compute_now() + $2::interval)
        ON CONFLICT (gateway_id) DO UPDATE SET lease_expires_at = EXCLUDED.lease_expires_at
        """,
        gateway_id,
        expires_in,
    )


async def flushed(conn: asyncpg.Connection, gateway_id: str = "gw-1") -> None:
    """As if the liveness controller had just applied a whole flush of `gateway_id` (one
    that names no range: the gateway keeps flushing, with or without a given node in it):
    it can see that gateway, whatever its range rows say."""
    await conn.execute(
        """
        INSERT INTO liveness_gateways (gateway_id, last_flush_at, whole_flush_at)
        VALUES ($1, compute_now(), compute_now())
        ON CONFLICT (gateway_id) DO UPDATE
           SET last_flush_at = EXCLUDED.last_flush_at, whole_flush_at = EXCLUDED.whole_flush_at
        """,
        gateway_id,
    )


async def routing(db: asyncpg.Connection, node: str) -> tuple[Any, ...]:
    """Where a node's session is routed: (epoch, gateway, disconnect reason)."""
    row = await db.fetchrow(
        "SELECT session_epoch, gateway_id, disconnect_reason FROM node_sessions WHERE node_id = $1",
        node,
    )
    return tuple(row)
