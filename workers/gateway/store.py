"""The reference gateway's SQL: its lease, what admission reads, the Hello transaction,
a session's close, an inventory section.

Every write is a call of a database function that checks the login may act as this
gateway (`gateway_logins`), holds its lease epoch, and holds the node's session: a
gateway whose lease was taken writes nothing, and a gateway's login cannot write as
another, nor write any table directly (the gateway functions, first made in
migrations/core/0026_gateway_functions.sql; a later migration may replace one whole, and
docs/architecture.md, "The SQL functions", names the migration of each current body).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from schemas.facts import sanitize
from workers.gateway.admission import CertRow, DesiredState, HelloRequest
from workers.runtime.store import limits

log = logging.getLogger(__name__)


class LeaseGone(Exception):
    """This gateway no longer holds its lease: it must refuse Hellos and stop writing."""


class Draining(Exception):
    """An operator set this gateway draining: it refuses new Hellos (they go elsewhere)."""


class NotJoined(Exception):
    """The node has no session row: it never joined (or was removed)."""


class Revoked(Exception):
    """The certificate was revoked between admission and the Hello transaction."""


class Unproven(Exception):
    """The Hello's proof is missing where the fleet requires one, or does not hold: the
    MAC is not the node's key's, its time is off, or its one-time id was used before."""


class Busy(Exception):
    """The node's row stayed locked by another transaction past the Hello's lock timeout."""


#: Hellos of one node opened in a minute, at most (counted apart for those that give a
#: proof): `hellos_per_node_minute()` in the database, where the Hello transaction applies
#: it (its body migration 0060's, the Hello's 0054's; a test keeps the two equal). An
#: honest daemon never meets it: after a session that ended at once it redials in 0 to 1 s
#: (the seed's full jitter read from attempt 0) or 0 to 2 s (from attempt 1), 120 or 60 a
#: minute on average.
HELLOS_PER_NODE_MINUTE = 240


class TooMany(Exception):
    """The node has had as many Hellos opened in the last minute as the database bounds
    (`hellos_per_node_minute()`, migrations/core/0060_hello_bound_for_any_reading.sql):
    an honest daemon's redials never reach it."""


# What admission reads, for this node and the serial it presents only (the gateway's login
# reads no certificate or node table): `gateway_admission`, its body
# migrations/core/0058_takeover_gets_nothing.sql's (made in 0030).
READ_FOR_ADMISSION = "SELECT * FROM gateway_admission($1, $2, $3)"

# The Hello transaction, the lease, a close, a section: functions of the database that
# check the login may act as this gateway, its lease, and the node's binding to it; the
# gateway's login writes no table. `gateway_hello`'s body is
# migrations/core/0054_hello_unblockable_and_bounded.sql's (made in 0026, replaced whole
# in 0030, 0038, 0044, 0049 and 0054); `gateway_hello_desired` (0063) runs it and reads
# the node's spec for the session it opened, in one call (a schema before 0063: the two
# calls, `HELLO_ALONE` then `desired_state`).
HELLO = """
SELECT * FROM gateway_hello_desired($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13,
                                    $14, $15, $16, $17, $18, $19, $20, $21)
"""
HELLO_ALONE = """
SELECT * FROM gateway_hello($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15,
                            $16, $17, $18, $19, $20, $21)
"""


#: sessions a statement of `close_sessions` closes at most
CLOSE_CHUNK = 2_000


async def close_session(
    pool: asyncpg.Pool, gateway_id: str, lease: int, node_id: str, epoch: int, reason: str
) -> bool:
    """Write a session's close in a transaction of its own; whether it did. A failure is
    logged, not raised: the `closed` fact still goes out, and the liveness worker writes it."""
    try:
        async with pool.acquire() as conn:
            closed = await conn.fetchval(
                "SELECT gateway_close($1, $2, $3, $4, $5)",
                gateway_id,
                lease,
                node_id,
                epoch,
                reason,
            )
            return bool(closed)
    except Exception as error:  # the database away: the fact is the fallback
        log.warning("gateway %s: close of %s not written (%r)", gateway_id, node_id, error)
        return False


async def close_sessions(
    pool: asyncpg.Pool, gateway_id: str, lease: int, closing: list[tuple[str, int]], reason: str
) -> set[str]:
    """Write the closes of many sessions (node, epoch) in statements of CLOSE_CHUNK (the
    range rows parsed once a statement: `gateway_close_many`, migration 0061); the nodes
    closed. A failure is logged, not raised: the `closed` facts still go out, and the
    liveness worker writes them."""
    closed: set[str] = set()
    for start in range(0, len(closing), CLOSE_CHUNK):
        part = closing[start : start + CLOSE_CHUNK]
        try:
            async with pool.acquire() as conn:
                rows = await conn.fetch(
                    "SELECT gateway_close_many($1, $2, $3, $4, $5) AS node_id",
                    gateway_id,
                    lease,
                    [n for n, _ in part],
                    [e for _, e in part],
                    reason,
                )
            closed |= {r["node_id"] for r in rows}
        except Exception as error:  # the database away: the facts are the fallback
            log.warning("gateway %s: %d closes not written (%r)", gateway_id, len(part), error)
    return closed


async def acquire(conn: asyncpg.Connection, gateway_id: str, ttl: timedelta) -> int:
    """Take this gateway's lease (a new incarnation wins over an older one)."""
    return int(await conn.fetchval("SELECT gateway_acquire($1, $2)", gateway_id, ttl))


async def renew(conn: asyncpg.Connection, gateway_id: str, epoch: int, ttl: timedelta) -> None:
    if not await conn.fetchval("SELECT gateway_renew($1, $2, $3)", gateway_id, epoch, ttl):
        raise LeaseGone(f"gateway {gateway_id} lost its lease (epoch {epoch})")


async def release(conn: asyncpg.Connection, gateway_id: str, epoch: int) -> bool:
    """Give the lease up at once (its sessions closed first); whether it was still held."""
    return bool(await conn.fetchval("SELECT gateway_release($1, $2)", gateway_id, epoch))


async def drain(conn: asyncpg.Connection, gateway_id: str, epoch: int, draining: bool) -> None:
    """Refuse new Hellos from now on (their nodes go elsewhere), or take them again."""
    if not await conn.fetchval("SELECT gateway_drain($1, $2, $3)", gateway_id, epoch, draining):
        raise LeaseGone(f"gateway {gateway_id} lost its lease (epoch {epoch})")


@dataclass(frozen=True)
class AdmissionRows:
    """What admission reads: the database's now, the node (None: never joined), the
    presented serial's record (None: not recorded)."""

    now: datetime
    node_generation: int | None
    node_role: str | None
    cert: CertRow | None
    desired: DesiredState | None = None  # the node's spec (None: it has none)


async def read_for_admission(
    conn: asyncpg.Connection, gateway_id: str, request: HelloRequest
) -> AdmissionRows:
    row = await conn.fetchrow(READ_FOR_ADMISSION, gateway_id, request.node_id, request.cert_serial)
    cert = None
    if row["serial"] is not None:
        kinds = row["allowed_kinds"]
        # another node's serial or a revoked one: its record says no more than that
        # (`gateway_admission` since migration 0057; its body now 0058's), and admission
        # refuses it as such
        cert = CertRow(
            serial=row["serial"],
            node_id=row["node_id"] or "",
            identity_generation=row["identity_generation"] or 0,
            role=row["role"] or "",
            not_after=row["not_after"] or datetime.max.replace(tzinfo=UTC),
            revoked=row["revoked"],
            allowed_kinds=tuple(kinds) if kinds is not None else None,
        )
    return AdmissionRows(row["now"], row["node_generation"], row["node_role"], cert, _desired(row))


def _desired(row: Mapping[str, Any] | None) -> DesiredState | None:
    if row is None or row["spec"] is None:
        return None
    return DesiredState(  # the bytes as stored: what the signature covers
        row["spec_generation"], json.loads(row["spec"]), row["spec_signature"], row["spec"]
    )


async def desired_state(
    conn: asyncpg.Connection, gateway_id: str, node_id: str, epoch: int
) -> DesiredState | None:
    """The node's spec, read once this gateway's Hello opened its session at `epoch`
    (admission says it to the node's gateway only: `gateway_desired_state`, migration
    0058's body); None: it has none, or
    the session is no longer this gateway's."""
    row = await conn.fetchrow(
        "SELECT * FROM gateway_desired_state($1, $2, $3)", gateway_id, node_id, epoch
    )
    return _desired(row)


@dataclass(frozen=True)
class Opened:
    """What the Hello transaction returns: the new epoch, whether the Hello is a duplicate
    identity, whether its proof was taken — and nothing of the session before it."""

    epoch: int
    session_id: str
    duplicate: bool = False
    proven: bool | None = None  # None: the fleet's policy is `off`
    acked_event_seq: int = 0  # what the control plane holds of the daemon's journal
    #: the node's inventory hashes as stored (section → hash), read in the transaction
    inventory: Mapping[str, str] = field(default_factory=dict)
    #: the node's spec, read in the Hello transaction's call for the session it opened
    #: (None: it has none, or an upgrade is required); `desired_read` False: not read (a
    #: schema before migration 0063), `desired_state` reads it
    desired: DesiredState | None = None
    desired_read: bool = False


#: what a Hello fact is checked with before the transaction (the real values come from it)
PLACEHOLDER = Opened(epoch=1, session_id="0" * 32)


async def open_session(
    conn: asyncpg.Connection,
    gateway_id: str,
    lease_epoch: int,
    request: HelloRequest,
    upgrade_required: bool,
    live_window: timedelta,
    trace_context: str | None,
    hello_fact_id: uuid.UUID,
) -> Opened:
    """The Hello transaction: fenced on the lease, the proof checked, the node's row locked
    (2 s at most: else `Busy`), its epoch bumped with the session's fields (its
    capabilities the Hello's valid names), the id of the one Hello fact of that epoch
    recorded."""
    proof = request.proof
    try:
        args = (
            gateway_id,
            lease_epoch,
            request.node_id,
            request.cert_serial,
            request.boot_id,
            request.journal_id,
            request.role,
            request.daemon_version,
            request.proto_max,
            request.transport,
            upgrade_required,
            request.trust_version,
            request.approver_set_epoch,
            request.approver_set_sha256,
            live_window,
            trace_context,
            hello_fact_id,
            proof.at if proof is not None else None,
            proof.nonce if proof is not None else None,
            proof.mac if proof is not None else None,
            list(sanitize(request.capabilities)),  # the session's, from this Hello on
        )
        try:
            row = await conn.fetchrow(HELLO, *args)
        except asyncpg.UndefinedFunctionError:  # a schema before migration 0063
            row = await conn.fetchrow(HELLO_ALONE, *args)
    except asyncpg.LockNotAvailableError as busy:
        raise Busy(f"node {request.node_id}: its row is locked elsewhere") from busy
    outcome = row["outcome"]
    if outcome == "lease-gone":
        raise LeaseGone(f"gateway {gateway_id} lost its lease (epoch {lease_epoch})")
    if outcome == "draining":
        raise Draining(f"gateway {gateway_id} is draining")
    if outcome == "not-joined":
        raise NotJoined(f"node {request.node_id} has no session row")
    if outcome == "revoked":  # a quarantine just committed, or the generation is revoked
        raise Revoked(f"certificate {request.cert_serial} is revoked or of a revoked generation")
    if outcome == "unproven":
        raise Unproven(f"node {request.node_id}: the Hello's proof is missing or does not hold")
    if outcome == "too-many":
        raise TooMany(f"node {request.node_id}: too many Hellos in the last minute")
    return Opened(
        inventory=json.loads(row["inventory"]),
        epoch=int(row["epoch"]),
        acked_event_seq=int(row["acked_event_seq"]),
        session_id=row["session_id"],
        duplicate=bool(row["duplicate"]),
        proven=row["proven"],
        desired=_desired(row) if "spec" in row else None,
        desired_read="spec" in row,
    )


async def hello_challenge(
    conn: asyncpg.Connection, gateway_id: str, node_id: str
) -> tuple[float, str] | tuple[None, None]:
    """The database's time (whole Unix seconds) and a challenge for this node, this gateway
    and that time, for the refusal of a Hello whose proof did not hold: the daemon signs its
    next Hello with them (migrations/core/0047_proof_freshness.sql). (None, None) when the
    database cannot issue one (its schema is older than this gateway: refused without)."""
    try:
        row = await conn.fetchrow(
            "SELECT * FROM gateway_hello_challenge($1, $2)", gateway_id, node_id
        )
    except asyncpg.UndefinedFunctionError:
        return None, None
    return float(row["server_time"]), str(row["challenge"])


async def hello_verdict(conn: asyncpg.Connection, gateway_id: str, node_id: str, epoch: int) -> str:
    """What the quarantine made of a duplicate identity's session: `revoked`, `released`,
    `held` (not decided yet, or held for an operator) or `gone`."""
    return str(
        await conn.fetchval("SELECT gateway_hello_verdict($1, $2, $3)", gateway_id, node_id, epoch)
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
    written = await conn.fetchval(
        "SELECT gateway_write_section($1, $2, $3, $4, $5, $6, $7::jsonb)",
        gateway_id,
        lease_epoch,
        node_id,
        epoch,
        section,
        digest,
        json.dumps(body),
    )
    return bool(written)


# -- which login acts as which gateway (`bcw auth db`, as the schema's owner) -------------


class BindingError(ValueError):
    """A binding that cannot be made: the login is not a role of this cluster."""


class LimitsRefused(PermissionError):
    """A login this role may not give its group's limits (one a DBA made, on PostgreSQL
    16+), and that does not have them yet: it is not bound."""


@dataclass(frozen=True)
class Binding:
    login: str
    gateway_id: str
    bound_at: datetime
    in_group: bool  # a member of bcw_gateway_bound (else it cannot call the functions)


BINDINGS = """
SELECT b.login, b.gateway_id, b.bound_at,
       EXISTS (SELECT 1 FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.member
                 JOIN pg_roles g ON g.oid = m.roleid
                WHERE r.rolname = b.login AND g.rolname = 'bcw_gateway_bound') AS in_group
  FROM gateway_logins b
 ORDER BY b.gateway_id, b.login
"""


async def bind(conn: asyncpg.Connection, login: str, gateway_id: str) -> None:
    """Let `login` act as `gateway_id` (and as no other: a login acts as one gateway)."""
    if not await conn.fetchval("SELECT count(*) FROM pg_roles WHERE rolname = $1", login):
        raise BindingError(
            f"no role {login!r}: CREATE ROLE {login} LOGIN PASSWORD '…' IN ROLE bcw_gateway_bound"
        )
    await conn.execute(
        "INSERT INTO gateway_logins (login, gateway_id) VALUES ($1, $2) ON CONFLICT (login) DO "
        "UPDATE SET gateway_id = EXCLUDED.gateway_id, bound_at = now()",
        login,
        gateway_id,
    )
    # its connections and statements bounded as the group's (`limits`); a login we may not
    # alter is bound only when it has them already (a DBA set them)
    group = "bcw_gateway_bound"
    wanted = limits.LIMITS[group]
    applied = await limits.apply(conn, {group: wanted}, login)
    if applied.refused and not await limits.holds(conn, login, wanted):
        why = applied.refused[0][2]
        sql = "; ".join(limits.statements(login, wanted))
        raise LimitsRefused(
            f"{login}: not bound: its limits cannot be set by this role ({why}); create the "
            f"login as this role, or have a DBA run: {sql}"
        )


async def unbind(conn: asyncpg.Connection, login: str) -> bool:
    """The login acts as no gateway any more; whether it was bound."""
    return bool(
        await conn.execute("DELETE FROM gateway_logins WHERE login = $1", login) != "DELETE 0"
    )


async def bindings(conn: asyncpg.Connection) -> list[Binding]:
    return [Binding(**dict(row)) for row in await conn.fetch(BINDINGS)]
