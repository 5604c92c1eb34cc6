"""`bcw bench herd`: a power-on herd at the specification's admission rate, against the
five workers each in a `bcw run` process of its own.

What the gateways' side leaves behind is made directly, so the harness is never the
bottleneck: N joined nodes (100,000), each with one command in flight from before, have
their epochs bumped in PostgreSQL in batches (as N Hello transactions would: the
`session_epochs` trigger records each epoch's gateway), then their Hello facts are
published exactly as M gateways (20) would, each gateway's paced at its admission rate
(200/s). Prints, per worker: Hellos/s, peak consumer lag, time from the last Hello to its
consumer being idle, peak RSS and CPU seconds; and the time from the last Hello until
every effect is applied (labels, replays, `node.connected` in the session history, the
outbox empty). Then what the herd cost: CPU seconds and milliseconds per Hello of each
worker, of the servers and of this harness, and the cores that much CPU needs to meet
the 30 s target at the specification's rate (`cores_for`).

`bcw bench hello` (`run_hello`, below) measures the other side of a Hello: the Hello
transaction itself, with and without the daemon's proof.
"""

from __future__ import annotations

import asyncio
import math
import os
import statistics
import time
import uuid

import asyncpg
import nats
from nats.js import JetStreamContext

from schemas.proof import prove
from schemas.subjects import Subjects
from workers.bench.common import (
    bench_target,
    consumer_idle,
    hello_fact,
    join_herd,
    print_table,
    spawn_workers,
    stop_workers,
    wait_until,
    wire,
    worker_env,
    workers_bound,
)
from workers.bench.costs import CpuSpent, cpu_seconds, peak_rss_mib
from workers.labeler.apply import ADD_LABELS
from workers.labeler.decide import LABEL_PREFIX
from workers.settings import Settings
from workers.tools.explain import HISTORY

HELLO_WORKERS = ("labeler", "liveness", "quarantine", "replay")
CAPABILITIES = ("cpu", "mem", "nvml", "ib")
BATCH = 10_000
#: the target: every effect applied this long after the last Hello
WITHIN_S = 30.0


def cores_for(cpu_seconds: float, nodes: int, gateways: int, rate: float, within: float) -> float:
    """Cores that `cpu_seconds` of work needs to be done `within` seconds of the last of
    `nodes` Hellos admitted by `gateways` at `rate` each: the work spread, perfectly, over
    the herd's own duration and the time allowed after it. A lower bound."""
    return cpu_seconds / (nodes / (gateways * rate) + within)


async def _prepare(conn: asyncpg.Connection, nodes: int, gateways: int) -> None:
    """Join the fleet, one command in flight each; bump every epoch to 1 on its gateway."""
    await join_herd(conn, nodes)
    for start in range(1, nodes + 1, BATCH):  # as the Hello transactions would, in batches
        await conn.execute(
            """
            UPDATE node_sessions s
               SET session_epoch = 1, gateway_id = 'gw-' || (t.i % $3), session_id = 's-' || t.i,
                   boot_id = 'boot-1', journal_id = 'journal-1', cert_serial = 'node-serial-' || t.i,
                   connected_at = compute_now(), last_seen = compute_now()
              FROM generate_series($1::int, $2::int) AS t(i)
             WHERE s.node_id = 'node-' || t.i
            """,
            start,
            min(nodes, start + BATCH - 1),
            gateways,
        )
    # the bumps took a while: the sweep history starts now again, not with an outage grace
    await conn.execute(
        "UPDATE liveness_sweeps SET last_sweep_at = compute_now(), grace_until = NULL"
    )


def _wire_of(
    subjects: Subjects, g: int, nodes: list[int]
) -> list[tuple[str, bytes, dict[str, str]]]:
    """One gateway's Hello facts as it publishes them (built before the clock starts)."""
    out = []
    for i in nodes:
        fact = hello_fact(
            f"node-{i}",
            gateway_id=f"gw-{g}",
            session_id=f"s-{i}",
            capabilities=[*CAPABILITIES, f"rack{i % 40}"],
            cert={"serial": f"node-serial-{i}", "allowed_kinds": None, "identity_generation": 1},
        )
        out.append(wire(subjects, fact))
    return out


async def _gateway(
    js: JetStreamContext, messages: list[tuple[str, bytes, dict[str, str]]], rate: float
) -> None:
    """One gateway's Hello facts, paced at `rate` per second, PubAcks awaited."""
    started = time.monotonic()
    pending = []
    for k, (subject, body, headers) in enumerate(messages):
        due = started + k / rate
        if (delay := due - time.monotonic()) > 0:
            await asyncio.sleep(delay)
        pending.append(await js.publish_async(subject, body, headers=headers))
        if len(pending) >= 200:
            await asyncio.gather(*pending)
            pending.clear()
    await asyncio.gather(*pending)


async def run(
    settings: Settings,
    nodes: int,
    gateways: int,
    rate: float,
    embedded: bool,
    sync_always: bool = False,
) -> int:
    async with bench_target(settings, embedded, sync_always) as target:
        subjects = Subjects(target.subject_root)
        conn = await asyncpg.connect(target.database_url)
        print(f"joining {nodes:,} nodes, one command in flight each, epochs bumped ...")
        await _prepare(conn, nodes, gateways)
        procs = await spawn_workers(worker_env(target))
        nc = await nats.connect(target.nats_url, pending_size=256 * 1024 * 1024)
        js = nc.jetstream()
        peak_lag = dict.fromkeys(HELLO_WORKERS, 0)
        idle_at: dict[str, float] = {}
        publishing = True

        async def watch() -> None:
            """Every half second: each consumer's lag, and when it went idle after the herd."""
            while True:
                for name in HELLO_WORKERS:
                    try:
                        info = await js.consumer_info(subjects.facts_stream, name)
                    except Exception:
                        continue
                    lag = (info.num_pending or 0) + (info.num_ack_pending or 0)
                    peak_lag[name] = max(peak_lag[name], lag)
                    if not publishing and lag == 0 and name not in idle_at:
                        idle_at[name] = time.monotonic()
                await asyncio.sleep(0.5)

        try:
            await wait_until(lambda: workers_bound(js, subjects), within=60)
            watching = asyncio.create_task(watch())
            shares = [
                list(range(g if g else gateways, nodes + 1, gateways)) for g in range(gateways)
            ]
            messages = [_wire_of(subjects, g, share) for g, share in enumerate(shares)]
            print(f"herd: {nodes:,} Hello facts from {gateways} gateways at {rate:.0f}/s each ...")
            before = CpuSpent.now()  # this harness and the servers
            workers_before = {name: cpu_seconds(proc.pid) for name, proc in procs.items()}
            first = time.monotonic()
            await asyncio.gather(*(_gateway(js, batch, rate) for batch in messages))
            last = time.monotonic()
            publishing = False
            for name in HELLO_WORKERS:

                async def idle(name: str = name) -> bool:
                    return name in idle_at or await consumer_idle(js, subjects.facts_stream, name)

                await wait_until(idle)
                idle_at.setdefault(name, time.monotonic())

            async def effects() -> bool:
                return bool(
                    await conn.fetchval(
                        f"""
                        SELECT (SELECT count(*) FROM node_labels WHERE source = 'system') = $1 * 5
                           AND (SELECT count(*) FROM commands WHERE session_epoch = 1
                                   AND delivery_attempt = 2) = $1
                           AND (SELECT count(*) FROM {HISTORY}
                                 WHERE what = 'node.connected') = $1
                           AND NOT EXISTS (SELECT 1 FROM outbox)
                           AND NOT EXISTS (SELECT 1 FROM outbox_packs)
                        """,
                        nodes,
                    )
                )

            settled = await wait_until(effects)
            watching.cancel()
            rss = {name: peak_rss_mib(proc.pid) for name, proc in procs.items()}
            cpu = {
                name: cpu_seconds(proc.pid) - workers_before[name] for name, proc in procs.items()
            }
            others = CpuSpent.now() - before
        finally:
            await stop_workers(procs)
            await nc.close()
            await conn.close()
    publish_s = last - first
    rows = [("Hellos published", f"{nodes / publish_s:,.0f} /s ({publish_s:.1f} s)")]
    for name in HELLO_WORKERS:
        done = idle_at[name]
        rows.append(
            (
                name,
                f"{nodes / (done - first):,.0f} Hellos/s · peak lag {peak_lag[name]:,} · "
                f"idle {done - last:.1f} s after the last Hello",
            )
        )
    rows.append(
        (
            "last Hello → every effect applied",
            f"{settled - last:.1f} s (labels, replays, node.connected, outbox empty)",
        )
    )

    def cost(spent: float) -> str:
        return f"CPU {spent:.1f} s ({1000 * spent / nodes:.2f} ms per Hello)"

    for name in sorted(procs):
        rows.append((f"{name} process", f"peak RSS {rss[name]:.0f} MiB · {cost(cpu[name])}"))
    # on this machine: what the workers waited for
    rows.append(("postgres (all processes)", cost(others.postgres)))
    rows.append(("nats-server (all processes)", cost(others.nats)))
    rows.append(("this harness (publisher, watcher)", cost(others.process)))
    spent = sum(cpu.values()) + others.total
    rows.append(("all of it", cost(spent)))
    rows.append(
        (
            f"cores for ≤ {WITHIN_S:.0f} s at {rate:.0f}/s per gateway",
            f"≥ {cores_for(spent, nodes, gateways, rate, WITHIN_S):.1f} at this cost "
            f"(this machine has {os.cpu_count()})",
        )
    )
    print_table(
        f"bcw bench herd: {nodes:,} nodes, {gateways} gateways at {rate:.0f} Hellos/s each "
        f"({os.cpu_count()} cores){', JetStream sync_interval: always' if sync_always else ''}",
        ("measure", "value"),
        rows,
    )
    return 0


# -- `bcw bench hello`: the Hello transaction with and without a proof -----------------------
HELLO_TRANSACTION = """
SELECT outcome FROM gateway_hello('gw-bench', $1, $2, $3, 'boot', 'journal', 'worker', '1.0.0', 1,
    'grpc', false, 0, 0, '', '45s', NULL, $4, $5, $6, $7)
"""


async def run_hello(settings: Settings, nodes: int, embedded: bool, rounds: int) -> int:
    """`bcw bench hello`: what a Hello's proof costs the Hello transaction — the same
    number of `gateway_hello` calls for fresh nodes, without a proof and with one
    (HMAC-SHA256 checked in SQL, its one-time id recorded), in alternating rounds on one
    connection."""
    per_round = max(100, nodes // (2 * rounds))
    async with bench_target(settings, embedded) as target:
        conn = await asyncpg.connect(target.database_url)
        try:
            keys = await _keyed_fleet(conn, per_round * 2 * rounds)
            # the nodes said Hello to without a proof have no key (with one, such a Hello
            # would be a takeover attempt): rounds alternate, without first
            await conn.execute(
                "DELETE FROM node_hello_keys WHERE node_id = ANY($1::text[])",
                [
                    f"h{r * 2 * per_round + i}"
                    for r in range(rounds)
                    for i in range(1, per_round + 1)
                ],
            )
            lease = await conn.fetchval("SELECT gateway_acquire('gw-bench', '1 hour')")
            took: dict[bool, list[float]] = {False: [], True: []}
            node = 0
            for _ in range(rounds):
                for proven in (False, True):
                    started = time.perf_counter()
                    for _ in range(per_round):
                        node += 1
                        await _hello_transaction(
                            conn, lease, node, keys[node - 1] if proven else None
                        )
                    took[proven].append((time.perf_counter() - started) / per_round * 1e6)
            labels = await _first_labels(conn, node)
        finally:
            await conn.close()
    without, with_ = statistics.median(took[False]), statistics.median(took[True])
    print_table(
        f"bcw bench hello: {per_round:,} Hello transactions a round, {rounds} rounds each way "
        "(medians; one connection, a round trip each)",
        ("Hello transaction", "µs each"),
        [
            ("without a proof", f"{without:,.0f}"),
            ("with a proof (HMAC-SHA256 in SQL, its one-time id taken)", f"{with_:,.0f}"),
            ("what the proof adds", f"{with_ - without:,.0f}"),
            (
                f"a first power-on's labels ({len(CAPABILITIES) + 1} a node, the labeler's "
                f"upsert, {LABELED_AT_ONCE} nodes a statement): the backend's CPU",
                labels,
            ),
        ],
    )
    return 0


#: nodes a labeler's batch labels at once in a herd (its batches merge to about this)
LABELED_AT_ONCE = 350


async def _first_labels(conn: asyncpg.Connection, nodes: int) -> str:
    """The labeler's write of `nodes` nodes' first labels (none before: a fleet's first
    power-on), as a herd's batches make it: µs of the PostgreSQL backend's CPU a node —
    read from /proc, so only where the server runs on this machine."""
    backend = await conn.fetchval("SELECT pg_backend_pid()")
    before = cpu_seconds(backend)
    if math.isnan(before):  # not a process of this machine
        return "not measured (PostgreSQL is not on this machine)"
    keys = [LABEL_PREFIX + c for c in (*CAPABILITIES, "rack1")]
    for start in range(1, nodes + 1, LABELED_AT_ONCE):
        ids = [f"h{i}" for i in range(start, min(nodes, start + LABELED_AT_ONCE - 1) + 1)]
        async with conn.transaction():
            await conn.execute(
                ADD_LABELS, [n for n in ids for _ in keys], [k for _ in ids for k in keys]
            )
    return f"{(cpu_seconds(backend) - before) / nodes * 1e6:,.0f} µs a node"


async def _keyed_fleet(conn: asyncpg.Connection, nodes: int) -> list[bytes]:
    """`nodes` joined, each with a Hello key; the keys."""
    await conn.execute(
        "SELECT join_node('h' || i, 'worker', 'h-serial-' || i, NULL) FROM generate_series(1, $1) i",
        nodes,
    )
    keys = [i.to_bytes(4, "big") * 8 for i in range(1, nodes + 1)]
    await conn.execute(
        "SELECT enroll_hello_key('h' || i, k) FROM unnest($1::bytea[]) WITH ORDINALITY AS t(k, i)",
        keys,
    )
    return keys


async def _hello_transaction(
    conn: asyncpg.Connection, lease: int, node: int, key: bytes | None
) -> None:
    node_id = f"h{node}"
    proof = prove(key, node_id, "boot", "journal", "gw-bench", int(time.time())) if key else None
    outcome = await conn.fetchval(
        HELLO_TRANSACTION,
        lease,
        node_id,
        f"h-serial-{node}",
        uuid.uuid4(),
        proof.at if proof else None,
        proof.nonce if proof else None,
        proof.mac if proof else None,
    )
    if outcome != "opened":
        raise RuntimeError(f"the Hello transaction of {node_id} answered {outcome!r}")
