"""Leases for singleton loops (`controller_leases`): acquire, renew, lose, and the fence.

A loop that must run in one replica at a time (a worker's sweep, retention) holds a
named lease with an epoch that rises with each new holder. Every transaction such a
loop writes in calls `fence()` first: it locks the lease row FOR SHARE and fails unless
this holder's epoch is current and unexpired, so a paused ex-leader's writes match
nothing, and a new leader's takeover waits for an in-flight transaction to end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta

import asyncpg

from workers.runtime.base.errors import Severity, as_setting_error, classify
from workers.runtime.base.waiting import Patience, sleep_or_stop
from workers.runtime.observability.metrics import Gauge

log = logging.getLogger(__name__)


class LeaseLost(Exception):
    """The lease is no longer ours; the transaction must not write."""


@dataclass(frozen=True)
class Lease:
    name: str
    holder: str
    epoch: int


def inbox_pruning(workers: list[str]) -> str:
    """The lease under which one replica of these workers prunes their inbox (a worker's
    login may hold it: `policies.OWNED_ROWS`)."""
    return "inbox-retention-" + "+".join(sorted(workers))


async def try_acquire(
    conn: asyncpg.Connection, name: str, holder: str, ttl: timedelta
) -> Lease | None:
    """Take the lease if it is free or expired (new epoch), or renew it if we hold it."""
    row = await conn.fetchrow(
        """
        INSERT INTO controller_leases AS l (name, holder, epoch, expires_at)
        VALUES ($1, $2, 1, compute_now() + $3::interval)
        ON CONFLICT (name) DO UPDATE
            SET holder = EXCLUDED.holder,
                epoch = CASE WHEN l.holder = EXCLUDED.holder AND l.expires_at > compute_now()
                             THEN l.epoch ELSE l.epoch + 1 END,
                expires_at = EXCLUDED.expires_at
          WHERE l.holder = EXCLUDED.holder OR l.expires_at <= compute_now()
        RETURNING epoch
        """,
        name,
        holder,
        ttl,
    )
    return Lease(name, holder, int(row["epoch"])) if row else None


async def renew(conn: asyncpg.Connection, lease: Lease, ttl: timedelta) -> bool:
    """Extend our lease; False when it expired or someone else took it."""
    status = await conn.execute(
        """
        UPDATE controller_leases SET expires_at = compute_now() + $4::interval
         WHERE name = $1 AND holder = $2 AND epoch = $3 AND expires_at > compute_now()
        """,
        lease.name,
        lease.holder,
        lease.epoch,
        ttl,
    )
    return status == "UPDATE 1"


async def release(conn: asyncpg.Connection, lease: Lease) -> None:
    """Let a standby take over at once (a clean shutdown)."""
    await conn.execute(
        "UPDATE controller_leases SET expires_at = compute_now() - interval '1 microsecond' "
        "WHERE name = $1 AND holder = $2 AND epoch = $3",
        lease.name,
        lease.holder,
        lease.epoch,
    )


async def fence(conn: asyncpg.Connection, lease: Lease) -> None:
    """Inside a transaction: raise `LeaseLost` unless `lease` is current; hold it till commit."""
    held = await conn.fetchval(
        """
        SELECT true FROM controller_leases
         WHERE name = $1 AND holder = $2 AND epoch = $3 AND expires_at > compute_now()
           FOR SHARE
        """,
        lease.name,
        lease.holder,
        lease.epoch,
    )
    if not held:
        raise LeaseLost(
            f"lease {lease.name} epoch {lease.epoch} is no longer held by {lease.holder}"
        )


async def run_leased(
    pool: asyncpg.Pool,
    name: str,
    holder: str,
    body: Callable[[Lease], Awaitable[None]],
    *,
    period: float,
    ttl: timedelta,
    stopping: asyncio.Event,
    held: Gauge | None = None,
    on_lost: Callable[[], None] | None = None,
) -> None:
    """Run `body(lease)` every `period` seconds while this process holds `name`;
    `on_lost()` whenever it stops holding it (taken over, lost, or stopping): what only
    the holder may say (a leader's gauges) is withdrawn then.

    Standby replicas try to acquire every period; a leader that cannot renew steps down.
    `body` must call `fence()` in each transaction it writes in. Failures are retried
    with capped back-off (an outage is logged now and then, not every period); the loop
    never exits before `stopping`, except on a fatal error (grants, credentials).
    """
    lease: Lease | None = None
    patience = Patience(f"lease {name} loop", log, base=max(period, 0.2), cap=5.0)
    while not stopping.is_set():
        pause = period
        try:
            async with pool.acquire() as conn:
                current = await try_acquire(conn, name, holder, ttl)
            if current != lease:
                log.info(
                    "lease %s: %s", name, f"held, epoch {current.epoch}" if current else "standby"
                )
            if lease is not None and current is None and on_lost is not None:
                on_lost()
            lease = current
            if held is not None:
                held.set(1.0 if lease is not None else 0.0, name)
            if lease is not None:
                await body(lease)
            patience.succeeded()
        except LeaseLost as lost:
            log.info("%s", lost)
            lease = None
            if held is not None:
                held.set(0.0, name)
            if on_lost is not None:
                on_lost()
        except Exception as error:
            severity = classify(error)
            if severity is Severity.FATAL:
                raise as_setting_error(error, f"lease {name}") from error
            if severity is Severity.PERMANENT:
                log.exception("lease %s loop failed (will retry)", name)
            pause = patience.failed(error)  # an outage: back off, and log it now and then
        await sleep_or_stop(stopping, pause)
    if held is not None:
        held.set(0.0, name)
    if on_lost is not None:
        on_lost()
    if lease is not None:
        with contextlib.suppress(Exception):
            async with pool.acquire() as conn:
                await release(conn, lease)
