"""The reference gateway's SQL: its lease, what admission reads, the Hello transaction,
a session's close.

Every write is fenced on the gateway's lease epoch: a gateway whose lease was taken
writes nothing.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from schemas.facts import MAX_INVENTORY_SECTIONS, is_duplicate_identity
from workers.gateway.admission import CertRow, DesiredState, HelloRequest

log = logging.getLogger(__name__)


class LeaseGone(Exception):
    """This gateway no longer holds its lease: it must refuse Hellos and stop writing."""


class Draining(Exception):
    """An operator set this gateway draining: it refuses new Hellos (they go elsewhere)."""


class NotJoined(Exception):
    """The node has no session row: it never joined (or was removed)."""


class Revoked(Exception):
    """The certificate was revoked between admission and the Hello transaction."""


REVOKED = "SELECT revoked_at IS NOT NULL FROM node_certs WHERE serial = $1"


ACQUIRE = """
INSERT INTO gateways AS g (gateway_id, lease_epoch, lease_expires_at)
VALUES ($1, 1, compute_now() + $2::interval)
ON CONFLICT (gateway_id) DO UPDATE
   SET lease_epoch = g.lease_epoch + 1, lease_expires_at = EXCLUDED.lease_expires_at, draining = false
RETURNING lease_epoch
"""

RENEW = """
UPDATE gateways SET lease_expires_at = compute_now() + $3::interval
 WHERE gateway_id = $1 AND lease_epoch = $2 AND lease_expires_at > compute_now()
"""

FENCE = """
SELECT draining FROM gateways
 WHERE gateway_id = $1 AND lease_epoch = $2 AND lease_expires_at > compute_now()
   FOR SHARE
"""

READ_FOR_ADMISSION = """
SELECT compute_now() AS now,
       n.identity_generation AS node_generation, n.role AS node_role,
       n.spec::text AS spec, n.spec_generation, n.spec_signature,
       c.serial, c.node_id, c.identity_generation, c.role, c.not_after, c.revoked_at IS NOT NULL AS revoked,
       c.allowed_kinds
  FROM (SELECT 1) one
  LEFT JOIN nodes n ON n.node_id = $1
  LEFT JOIN node_certs c ON c.serial = $2
"""

PREVIOUS = """
SELECT session_epoch, gateway_id, boot_id, journal_id,
       gateway_id IS NOT NULL AND last_seen > compute_now() - $2::interval AS live
  FROM node_sessions WHERE node_id = $1 FOR UPDATE
"""

BUMP = """
UPDATE node_sessions
   SET session_epoch = session_epoch + 1, gateway_id = $2, session_id = $3, boot_id = $4, journal_id = $5,
       role = $6, daemon_version = $7, proto_max = $8, transport = $9, upgrade_required = $10,
       trust_version = $11, approver_set_epoch = $12, approver_set_sha256 = $13,
       acked_event_seq = CASE WHEN journal_id IS DISTINCT FROM $5 THEN 0 ELSE acked_event_seq END,
       connected_at = compute_now(), last_seen = compute_now(), disconnected_at = NULL,
       disconnect_reason = NULL, cert_serial = $14, lane_credits = NULL, load = NULL, node_load = NULL,
       held_epoch = CASE WHEN $15 THEN session_epoch + 1 END, trace_context = $16
 WHERE node_id = $1
RETURNING session_epoch, acked_event_seq
"""

STORED_HASHES = "SELECT section, hash FROM node_inventory WHERE node_id = $1"

# Fenced on the node's session (epoch and gateway) and this gateway's lease; a section
# from an older session never overwrites a newer one's.
WRITE_SECTION = """
INSERT INTO node_inventory AS i (node_id, section, hash, body, session_epoch, reported_at)
SELECT s.node_id, $3, $4, $5::jsonb, s.session_epoch, compute_now()
  FROM node_sessions s
  JOIN gateways g ON g.gateway_id = s.gateway_id
 WHERE s.node_id = $1 AND s.session_epoch = $2 AND s.gateway_id = $6
   AND g.lease_epoch = $7 AND g.lease_expires_at > compute_now()
   -- at most MAX_INVENTORY_SECTIONS per node: a new section only below it
   AND (EXISTS (SELECT 1 FROM node_inventory x WHERE x.node_id = $1 AND x.section = $3)
        OR (SELECT count(*) FROM node_inventory x WHERE x.node_id = $1) < $8)
ON CONFLICT (node_id, section) DO UPDATE
   SET hash = EXCLUDED.hash, body = EXCLUDED.body, session_epoch = EXCLUDED.session_epoch,
       reported_at = EXCLUDED.reported_at
 WHERE i.session_epoch <= EXCLUDED.session_epoch
"""


# A normal close, written by the session's gateway at once (fenced on the node's epoch,
# this gateway and its lease): the next Hello on any gateway reads the session as not live.
CLOSE = """
UPDATE node_sessions s
   SET gateway_id = NULL, disconnected_at = compute_now(), disconnect_reason = $4
  FROM gateways g
 WHERE s.node_id = $1 AND s.session_epoch = $2 AND s.gateway_id = $3
   AND g.gateway_id = $3 AND g.lease_epoch = $5 AND g.lease_expires_at > compute_now()
"""


async def close_session(
    pool: asyncpg.Pool, gateway_id: str, lease: int, node_id: str, epoch: int, reason: str
) -> bool:
    """Write a session's close in a transaction of its own; whether it did. A failure is
    logged, not raised: the `closed` fact still goes out, and the liveness worker writes it."""
    try:
        async with pool.acquire() as conn:
            return bool(
                await conn.execute(CLOSE, node_id, epoch, gateway_id, reason, lease) == "UPDATE 1"
            )
    except Exception as error:  # the database away: the fact is the fallback
        log.warning("gateway %s: close of %s not written (%r)", gateway_id, node_id, error)
        return False


async def acquire(conn: asyncpg.Connection, gateway_id: str, ttl: timedelta) -> int:
    """Take this gateway's lease (a new incarnation wins over an older one)."""
    return int(await conn.fetchval(ACQUIRE, gateway_id, ttl))


async def renew(conn: asyncpg.Connection, gateway_id: str, epoch: int, ttl: timedelta) -> None:
    if await conn.execute(RENEW, gateway_id, epoch, ttl) != "UPDATE 1":
        raise LeaseGone(f"gateway {gateway_id} lost its lease (epoch {epoch})")


async def fence(conn: asyncpg.Connection, gateway_id: str, epoch: int) -> bool:
    """Lock the lease row (LeaseGone unless this gateway holds it); whether it is draining."""
    draining = await conn.fetchval(FENCE, gateway_id, epoch)
    if draining is None:
        raise LeaseGone(f"gateway {gateway_id} lost its lease (epoch {epoch})")
    return bool(draining)


@dataclass(frozen=True)
class AdmissionRows:
    """What admission reads: the database's now, the node (None: never joined), the
    presented serial's record (None: not recorded)."""

    now: datetime
    node_generation: int | None
    node_role: str | None
    cert: CertRow | None
    desired: DesiredState | None = None  # the node's spec (None: it has none)


async def read_for_admission(conn: asyncpg.Connection, request: HelloRequest) -> AdmissionRows:
    row = await conn.fetchrow(READ_FOR_ADMISSION, request.node_id, request.cert_serial)
    cert = None
    if row["serial"] is not None:
        kinds = row["allowed_kinds"]
        cert = CertRow(
            serial=row["serial"],
            node_id=row["node_id"],
            identity_generation=row["identity_generation"],
            role=row["role"],
            not_after=row["not_after"],
            revoked=row["revoked"],
            allowed_kinds=tuple(kinds) if kinds is not None else None,
        )
    desired = None
    if row["spec"] is not None:
        desired = DesiredState(
            row["spec_generation"], json.loads(row["spec"]), row["spec_signature"]
        )
    return AdmissionRows(row["now"], row["node_generation"], row["node_role"], cert, desired)


@dataclass(frozen=True)
class Opened:
    """What the Hello transaction returns: the new epoch and the row as it was before."""

    epoch: int
    session_id: str
    previous_epoch: int
    previous_gateway_id: str | None
    previous_boot_id: str | None
    previous_journal_id: str | None
    previous_live: bool
    acked_event_seq: int = 0  # what the control plane holds of the daemon's journal
    #: the node's inventory hashes as stored (section → hash), read in the transaction
    inventory: Mapping[str, str] = field(default_factory=dict)


#: what a Hello fact is checked with before the transaction (the real values come from it)
PLACEHOLDER = Opened(
    epoch=1,
    session_id="0" * 32,
    previous_epoch=0,
    previous_gateway_id=None,
    previous_boot_id=None,
    previous_journal_id=None,
    previous_live=False,
)


async def open_session(
    conn: asyncpg.Connection,
    gateway_id: str,
    lease_epoch: int,
    request: HelloRequest,
    upgrade_required: bool,
    live_window: timedelta,
    trace_context: str | None = None,
    hello_fact_id: uuid.UUID | None = None,
) -> Opened:
    """The Hello transaction: fenced on the lease, the node's row locked, its epoch bumped
    (and, with `hello_fact_id`, the id of the one Hello fact of that epoch recorded)."""
    async with conn.transaction():
        if hello_fact_id is not None:  # read by the epoch's trigger (session_epochs)
            await conn.execute(
                "SELECT set_config('bcw.hello_fact_id', $1, true)", str(hello_fact_id)
            )
        if await fence(conn, gateway_id, lease_epoch):
            raise Draining(f"gateway {gateway_id} is draining")
        previous = await conn.fetchrow(PREVIOUS, request.node_id, live_window)
        if previous is None:
            raise NotJoined(f"node {request.node_id} has no session row")
        if await conn.fetchval(REVOKED, request.cert_serial):  # a quarantine just committed
            raise Revoked(f"certificate {request.cert_serial} was revoked")
        # another machine while the previous session is live: held for the quarantine
        duplicate = is_duplicate_identity(
            bool(previous["live"]), previous["boot_id"], request.boot_id
        )
        session_id = uuid.uuid4().hex
        digest = request.approver_set_sha256 or None
        bumped = await conn.fetchrow(
            BUMP,
            request.node_id,
            gateway_id,
            session_id,
            request.boot_id,
            request.journal_id,
            request.role,
            request.daemon_version,
            request.proto_max,
            request.transport,
            upgrade_required,
            request.trust_version,
            request.approver_set_epoch if digest else None,
            digest,
            request.cert_serial,
            duplicate,
            trace_context,
        )
        stored = {r["section"]: r["hash"] for r in await conn.fetch(STORED_HASHES, request.node_id)}
    return Opened(
        inventory=stored,
        epoch=int(bumped["session_epoch"]),
        acked_event_seq=int(bumped["acked_event_seq"]),
        session_id=session_id,
        previous_epoch=previous["session_epoch"],
        previous_gateway_id=previous["gateway_id"],
        previous_boot_id=previous["boot_id"],
        previous_journal_id=previous["journal_id"],
        previous_live=bool(previous["live"]),
    )


async def write_section(
    conn: asyncpg.Connection,
    gateway_id: str,
    lease_epoch: int,
    node_id: str,
    epoch: int,
    section: str,
    digest: str,
    body: Mapping[str, Any],
) -> bool:
    """Store one inventory section the daemon sent; False when its session or this
    gateway's lease is no longer current, or the node already has as many sections as it
    may (`MAX_INVENTORY_SECTIONS`) and this one is new (nothing written)."""
    status = await conn.execute(
        WRITE_SECTION, node_id, epoch, section, digest, json.dumps(body), gateway_id, lease_epoch,
        MAX_INVENTORY_SECTIONS,
    )  # fmt: skip
    return bool(status == "INSERT 0 1")
