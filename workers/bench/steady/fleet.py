"""The steady bench's fleet: N sessions made in bulk, and G simulated gateways that flush
them every flush period exactly as the reference gateway does.

The sessions are what N Hello transactions leave behind (`prepare`): joined nodes, each
at epoch 1 on gateway `gw-<i mod G>` (the `session_epochs` trigger records each epoch's
gateway), connected now, with bcd's capabilities; the gateways hold leases for the run.

A gateway's flush carries one entry per session it holds — its age since the daemon's
last heartbeat (every 10 s, so 0 to 10 s), its epoch, the heartbeat's free credits and load
— cut into facts by ranges of node hashes as the reference gateway cuts them
(`range_cut`: every range, empty ones too). The bodies are spliced from entries encoded
once, so that the harness costs little beside what it measures; `test_the_steady_bench_flushes_what_the_reference_gateway_would`
proves the bytes are the reference gateway's.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime

import asyncpg
from nats.js import JetStreamContext

from schemas import REGISTRY
from schemas.facts import Liveness, node_hash
from schemas.subjects import Subjects
from workers.gateway.facts import range_bits, range_cut
from workers.sim.profiles import BCD_CAPABILITIES

log = logging.getLogger(__name__)

BATCH = 50_000
#: what a bcd heartbeat says, after the entry's age (credits and load: `sim/daemon.py`)
HEARTBEAT = (
    ',"credits":{"default":4},"load":0.25,"node_load":{"load_average":0.25,'
    '"memory_available_bytes":8589934592,"running_commands":0,"pending_events":0}}'
)
#: the daemons' heartbeat interval: an entry's age is below it
HEARTBEAT_MS = 10_000


def gateway_of(i: int, gateways: int) -> str:
    return f"gw-{i % gateways}"


def silenced(i: int, gateways: int, share: float) -> bool:
    """Whether node `i` is one of the `share` that stop being flushed: the same share of
    every gateway's nodes (they are numbered `k = i // gateways` within it). Pure."""
    k = i // gateways
    return math.floor((k + 1) * share) > math.floor(k * share)


def age_ms(i: int, flush: int, heartbeat_ms: int = HEARTBEAT_MS) -> int:
    """Node `i`'s age at its gateway's `flush`-th flush: spread over a heartbeat. Pure."""
    return (i * 7919 + flush * 3331) % heartbeat_ms


async def prepare(
    conn: asyncpg.Connection, nodes: int, gateways: int, ranged: bool = False
) -> None:
    """Join `nodes` nodes and connect each at epoch 1 on its gateway, in batches;
    `ranged`: each as the first range fact to name it leaves it with range sight
    (`ranged_epoch`: marked), so that a run starts in the steady state and not with every
    session's first write at once (what turning range sight on costs: benchmarks.md)."""
    await conn.execute(
        "INSERT INTO gateways (gateway_id, lease_epoch, lease_expires_at) "
        "SELECT 'gw-' || g, 1, compute_now() + interval '1 day' FROM generate_series(0, $1 - 1) g",
        gateways,
    )
    started = time.monotonic()
    for start in range(1, nodes + 1, BATCH):
        end = min(nodes, start + BATCH - 1)
        await conn.execute(
            "SELECT join_node('node-' || i, 'worker', 'node-serial-' || i, NULL) "
            "FROM generate_series($1::int, $2::int) i",
            start,
            end,
        )
        await conn.execute(
            """
            UPDATE node_sessions s
               SET session_epoch = 1, gateway_id = 'gw-' || (t.i % $3), session_id = 's-' || t.i,
                   boot_id = 'boot-1', journal_id = 'journal-1', cert_serial = 'node-serial-' || t.i,
                   daemon_version = '1.0.0', proto_max = 3, transport = 'grpc',
                   capabilities = $4::text[], connected_at = compute_now(), last_seen = compute_now(),
                   ranged_epoch = CASE WHEN $5 THEN 1 END
              FROM generate_series($1::int, $2::int) AS t(i)
             WHERE s.node_id = 'node-' || t.i
            """,
            start,
            end,
            gateways,
            list(BCD_CAPABILITIES),
            ranged,
        )
        print(f"  {end:,} of {nodes:,} sessions ({time.monotonic() - started:.0f} s)", flush=True)


class Gateway:
    """One simulated gateway: its sessions' entries, encoded once, and its flushes."""

    def __init__(
        self,
        index: int,
        nodes: int,
        gateways: int,
        subjects: Subjects,
        heartbeat_ms: int = HEARTBEAT_MS,
    ):
        self.gateway_id = f"gw-{index}"
        self.heartbeat_ms = heartbeat_ms  # its daemons' heartbeat: an entry's age is below it
        self.subject = subjects.fact(self.gateway_id, Liveness.BC_TYPE)
        numbers = range(index if index else gateways, nodes + 1, gateways)
        by_hash = sorted((node_hash(f"node-{i}"), i) for i in numbers)  # in hash order
        self.hashes = [h for h, _ in by_hash]
        self.nodes = [i for _, i in by_hash]
        self.range_bits = 0
        self.heads = [f'{{"node_id":"node-{i}","epoch":1,"age_ms":'.encode() for i in self.nodes]
        self.flushes = 0
        self.held: list[int] = list(range(len(self.nodes)))  # positions still flushed

    def silence(self, share: float, gateways: int) -> list[str]:
        """Stop flushing this gateway's `share` of nodes; returns their ids."""
        quiet = {p for p, i in enumerate(self.nodes) if silenced(i, gateways, share)}
        self.held = [p for p in self.held if p not in quiet]
        return [f"node-{self.nodes[p]}" for p in sorted(quiet)]

    def flush(self) -> list[tuple[uuid.UUID, bytes]]:
        """This period's liveness facts: (fact id, body), in order."""
        entries = [
            self.heads[p]
            + str(age_ms(self.nodes[p], self.flushes, self.heartbeat_ms)).encode()
            + HEARTBEAT.encode()
            for p in self.held
        ]
        self.flushes += 1
        self.range_bits = range_bits(len(self.held), self.range_bits)
        return spliced(
            self.gateway_id, [self.hashes[p] for p in self.held], entries, self.range_bits
        )


def spliced(
    gateway_id: str, hashes: list[int], entries: list[bytes], bits: int
) -> list[tuple[uuid.UUID, bytes]]:
    """A flush's liveness facts, (fact id, body) in order: `entries` (encoded, in hash
    order) cut into ranges as the reference gateway cuts them, each range's entries
    spliced into an encoded empty fact (cheap: no model per entry)."""
    out = []
    for start, end, lo, hi in range_cut(hashes, [len(e) for e in entries], bits):
        fact_id = uuid.uuid4()
        empty = Liveness(
            fact_id=fact_id,
            gateway_id=gateway_id,
            observed_at=datetime.now(UTC),
            entries=[],
            range_start=start,
            range_end=end,
        )
        body, _ = REGISTRY.encode(empty)
        head, tail = body.rsplit(b"[]", 1)
        out.append((fact_id, head + b"[" + b",".join(entries[lo:hi]) + b"]" + tail))
    return out


HEADERS = {"Bc-Type": Liveness.BC_TYPE, "Bc-Schema": "1"}


async def flushing(
    js: JetStreamContext,
    gateway: Gateway,
    period: float,
    first: float,
    stopping: asyncio.Event,
    published: Callable[[uuid.UUID, float], None],
) -> int:
    """Flush `gateway` every `period` from monotonic time `first` until `stopping`, each
    fact's PubAck awaited as the reference gateway awaits it; a flush still publishing
    when the next is due makes that one skipped, as there. Returns the flushes skipped."""
    skipped, due = 0, first
    while not stopping.is_set():
        if (delay := due - time.monotonic()) > 0:
            try:
                await asyncio.wait_for(stopping.wait(), delay)
                break
            except TimeoutError:
                pass
        for fact_id, body in gateway.flush():
            headers = {**HEADERS, "Nats-Msg-Id": str(fact_id)}
            published(fact_id, time.time())
            await js.publish(gateway.subject, body, headers=headers, timeout=30)
        due += period
        while due < time.monotonic():
            due += period
            skipped += 1
    return skipped
