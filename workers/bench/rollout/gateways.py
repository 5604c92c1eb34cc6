"""The rollout's fleet: N sessions made in bulk as `bcw bench steady` makes them (what N
Hello transactions leave behind, with each node's Hello key, inventory and system labels
stored, as an established fleet has them), and G reference gateways
(`workers.gateway.Gateway`) that hold them — each Hello the real one — and flush them
every flush period as the steady bench's simulated gateways do: a session's age spread
over a heartbeat, its epoch, the heartbeat's credits and load, cut by ranges of node
hashes as the reference gateway cuts them."""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Callable
from typing import NamedTuple

import asyncpg
from nats.aio.client import Client as NATS

from schemas.facts import Liveness
from schemas.subjects import Subjects
from workers.bench.rollout.daemons import RolloutDaemon
from workers.bench.steady import fleet
from workers.gateway import Gateway, GatewaySettings
from workers.gateway import notices as gateway_notices
from workers.gateway.facts import range_bits
from workers.gateway.inventory import section_hashes
from workers.gateway.types import Session
from workers.labeler.decide import LABEL_PREFIX
from workers.runtime.base.runtime_settings import DatabaseSettings
from workers.runtime.store import db, migrate
from workers.sim.profiles import BCD_CAPABILITIES

BATCH = 50_000
#: a connected daemon's heartbeats are said by its gateway's flush: its session is never
#: timed out for silence (its age, in the flush, stays below a heartbeat)
NEVER_SILENT = 10**9


async def pool(database_url: str, size: int = 16, name: str = "bench: gateways") -> asyncpg.Pool:
    """The pool the gateways run on: the runtime's, as a deployed gateway's and `bcw sim`'s
    (a connection handed back is not reset with a round trip of its own: nothing a
    gateway does outlives its transaction)."""
    return await db.create_pool(
        DatabaseSettings(url=database_url, pool_min=2, pool_max=size, application_name=name)
    )


def settings(max_streams: int = 5_000, rate: float = 200.0) -> GatewaySettings:
    return GatewaySettings(
        missed_heartbeats=NEVER_SILENT, max_streams=max_streams, handshakes_per_second=rate
    )


class RolloutGateway(Gateway):
    """The reference gateway, its flush spliced from entries (cheap, as the steady
    bench's) and each flush fact's publish told to `on_publish`."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.on_publish: Callable[[uuid.UUID, float], None] = lambda _id, _at: None
        self._bits = 0
        self._flushes = 0
        self._subject = self.subjects.fact(self.gateway_id, Liveness.BC_TYPE)

    async def flush(self) -> None:
        self._flushed_at = self.clock()
        self._flushes += 1
        sessions = sorted(self.sessions.values(), key=lambda s: s.hash)
        entries = [
            f'{{"node_id":"{s.node_id}","epoch":{s.epoch},"age_ms":'
            f"{(s.hash + self._flushes * 3331) % fleet.HEARTBEAT_MS}{fleet.HEARTBEAT}".encode()
            for s in sessions
        ]
        self._bits = range_bits(len(sessions), self._bits)
        hashes = [s.hash for s in sessions]
        for fact_id, body in fleet.spliced(self.gateway_id, hashes, entries, self._bits):
            headers = {**fleet.HEADERS, "Nats-Msg-Id": str(fact_id)}
            self.on_publish(fact_id, time.time())
            await self.js.publish(self._subject, body, headers=headers, timeout=30)


class Pools(NamedTuple):
    """The bench's gateways' connections: their calls' (shared, as no deployed gateway's
    is), and their leases' (a renewal never queues behind a wave's Hellos)."""

    calls: asyncpg.Pool
    leases: asyncpg.Pool

    async def close(self) -> None:
        for each in self:
            await each.close()


async def pools(database_url: str) -> Pools:
    return Pools(await pool(database_url), await pool(database_url, 4, "bench: gateway leases"))


async def made(
    pools: Pools, nc: NATS, subjects: Subjects, gateway_id: str, gw: GatewaySettings
) -> RolloutGateway:
    """A gateway not started yet: its notices consumer made (as `bcw provision` would)."""
    await gateway_notices.provision(nc.jetstream(timeout=5.0), subjects, gateway_id)
    return RolloutGateway(
        gateway_id, pools.calls, nc, subjects, settings=gw, lease_pool=pools.leases
    )


async def started(
    pools: Pools, nc: NATS, subjects: Subjects, gateway_id: str, gw: GatewaySettings
) -> RolloutGateway:
    """A gateway up: its notices consumer made, its lease taken; it ticks itself (lease,
    flush)."""
    gateway = await made(pools, nc, subjects, gateway_id, gw)
    await gateway.start()
    return gateway


def daemons(nodes: int, seed: int, work: tuple[float, float]) -> list[RolloutDaemon]:
    """The fleet's daemons, `node-<i>`, each with its Hello key, the boot and journal the
    bulk sessions record (`prepare`)."""
    rng = random.Random(seed)
    out = []
    for i in range(1, nodes + 1):
        daemon = RolloutDaemon(
            f"node-{i}",
            f"node-serial-{i}",
            time.time,
            rng,
            work_seconds=work,
            boot_id="boot-1",
            journal_id="journal-1",
            hello_key=rng.randbytes(32),
        )
        daemon.process_started = time.time() - 3600.0  # up before its session
        out.append(daemon)
    return out


async def enroll(conn: asyncpg.Connection, fleet_: list[RolloutDaemon]) -> None:
    """Each node's Hello key, and the fleet's proof at `require` (a production fleet's)."""
    for start in range(0, len(fleet_), BATCH):
        part = fleet_[start : start + BATCH]
        await conn.execute(
            "SELECT enroll_hello_key(n, k) FROM unnest($1::text[], $2::bytea[]) AS t(n, k)",
            [d.node_id for d in part],
            [d.hello_key for d in part],
        )
    await migrate.set_hello_proof(conn, "require")


async def established(conn: asyncpg.Connection, nodes: int, sample: RolloutDaemon) -> None:
    """What an established node has stored: its inventory (the daemons' own, the same for
    all) and its system labels (one a capability), so that a reconnect is a reconnect."""
    hashes = section_hashes(sample.inventory)
    for start in range(1, nodes + 1, BATCH):
        end = min(nodes, start + BATCH - 1)
        for section, body in sample.inventory.items():
            await conn.execute(
                "INSERT INTO node_inventory (node_id, section, hash, body, session_epoch, reported_at) "
                "SELECT 'node-' || i, $3, $4, $5::jsonb, 1, compute_now() "
                "FROM generate_series($1::int, $2::int) i",
                start,
                end,
                section,
                hashes[section],
                json.dumps(body),
            )
        await conn.execute(
            "INSERT INTO node_labels (node_id, key, value, source) "
            "SELECT 'node-' || i, k, '1', 'system' FROM generate_series($1::int, $2::int) i, "
            "unnest($3::text[]) k",
            start,
            end,
            [LABEL_PREFIX + c for c in BCD_CAPABILITIES],
        )


def attach(gateways: list[RolloutGateway], fleet_: list[RolloutDaemon], credits: int) -> None:
    """Each daemon connected at epoch 1 to its gateway (`gw-<i mod G>`), as `prepare`
    wrote it: the gateway holds its session, the daemon its stream. Before the gateways
    start: at a million it holds the event loop for seconds, which a gateway holding its
    lease would not survive (renewed every 5 s, lost after 15)."""
    told = fleet_[0].inventory_hashes() if fleet_ else {}  # the same inventory for all
    for i, daemon in enumerate(fleet_, start=1):
        gateway = gateways[i % len(gateways)]
        gateway.sessions[daemon.node_id] = Session(
            daemon.node_id, 1, f"s-{i}", daemon.serial, daemon, gateway.clock()
        )
        daemon.gateway, daemon.epoch = gateway, 1
        daemon.welcome_credits = credits
        daemon.told = dict(told)
