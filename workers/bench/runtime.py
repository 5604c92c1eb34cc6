"""`bcw bench runtime`: the runtime against a bare floor and a naive loop, same facts.

Publishes N status facts once; each pipeline reads all of them through a durable consumer:
(a) the runtime: decode and validate, one fenced, forward-only single-row write per fact
    applied set-based, one message per fact whose row it moved (every fact here: one
    each), relayed by a relay process beside it, ack; no inbox — a worker whose effects
    are idempotent by construction keeps none (docs/runtime.md);
(a') the same with the relay in the consuming process (the default deployment);
(b) the floor: bare nats-py fetch, one `UPDATE … FROM unnest(…)` per batch, ack — no
    inbox, no validation, no outbox;
(c) naive: one transaction and one ack per fact.
Prints facts/s and the ratios a/b and a/c; then each pipeline's CPU per fact (this process,
the relay process, PostgreSQL, nats-server) and the most facts/s that allows here.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence

import asyncpg
import nats
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from schemas import Fact, Status, Zombie
from schemas.subjects import Subjects
from workers.bench.common import (
    BenchTarget,
    bench_target,
    consume_and_relay,
    join_fleet,
    print_table,
    publish_facts,
    spawn_relay,
    wire,
)
from workers.bench.costs import (
    CpuSpent,
    children_cpu_seconds,
    cost_rows,
    cpu_ratios,
    cpu_ratios_per_round,
    cpu_seconds,
    what_parts_cost,
)
from workers.runtime.base import heap
from workers.runtime.base.runtime_settings import ConsumerSettings
from workers.runtime.bus import streams
from workers.runtime.effects.outcome import Outcome
from workers.runtime.effects.worker import Handler, Tx, Worker
from workers.settings import Settings

NODES = 1000
BATCH = 256

FENCED_WRITE = """
UPDATE node_sessions s
   SET observed_generation = GREATEST(s.observed_generation, f.generation)
  FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS f(node_id, epoch, generation)
 WHERE s.node_id = f.node_id AND s.session_epoch = f.epoch
"""

#: the runtime's write: the same rows, fenced on the epoch and forward only — a row moves
#: only to a newer generation — and the rows that moved come back
MOVING_WRITE = """
UPDATE node_sessions s
   SET observed_generation = f.generation
  FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS f(node_id, epoch, generation)
 WHERE s.node_id = f.node_id AND s.session_epoch = f.epoch
   AND s.observed_generation < f.generation
RETURNING s.node_id
"""


async def _write(tx: Tx, facts: Sequence[Fact]) -> dict[str, Status]:
    """The fenced, forward-only write of a batch; the newest status fact of each node
    whose row it moved."""
    # fold per node (stream order): an UPDATE … FROM with a repeated key applies one row
    latest: dict[str, Status] = {}
    for fact in facts:
        if isinstance(fact, Status):
            latest[fact.node_id] = fact
    moved = await tx.conn.fetch(
        MOVING_WRITE,
        list(latest),
        [f.epoch for f in latest.values()],
        [f.observed_generation for f in latest.values()],
    )
    return {row["node_id"]: latest[row["node_id"]] for row in moved}


async def _write_only(tx: Tx, facts: Sequence[Fact]) -> Mapping[uuid.UUID, Outcome]:
    await _write(tx, facts)
    return {}


def publishing_handler(published: set[uuid.UUID]) -> Handler:
    """The runtime's handler: the write, and a notice for each node whose row it moved —
    published only when the state changed, so a fact delivered again (even after a newer
    one) finds nothing to do, and the worker needs no inbox (docs/runtime.md, "Exactly
    once, worker by worker"). Keeps the facts it published for in `published`."""

    async def handle(tx: Tx, facts: Sequence[Fact]) -> Mapping[uuid.UUID, Outcome]:
        for fact in (await _write(tx, facts)).values():
            tx.publish(
                Zombie(node_id=fact.node_id, epoch=fact.epoch),
                tx.subjects.notice(fact.gateway_id, "zombie"),
                cause=fact,
            )
            published.add(fact.fact_id)
        return {}

    return handle


async def _prepare(target: BenchTarget, subjects: Subjects, facts: int) -> None:
    await join_fleet(target.database_url, NODES, prefix="bench-")
    statuses = (
        Status.model_validate(
            {
                "fact_id": uuid.uuid4(),
                "gateway_id": "gw-0",  # the gateway `join_fleet` routes them to
                "observed_at": "2026-11-30T00:00:00Z",
                "node_id": f"bench-{i % NODES + 1}",
                "epoch": 1,
                "observed_generation": i + 1,  # each moves its row (reset to 0)
                "trust_version": 0,
            },
            strict=False,
        )
        for i in range(facts)
    )
    await publish_facts(target.nats_url, [wire(subjects, fact) for fact in statuses])


async def _bare_consumer(
    js: JetStreamContext, subjects: Subjects, name: str
) -> JetStreamContext.PullSubscription:
    spec = streams.ConsumerSpec(name, (subjects.fact_filter("status"),))
    await streams.ensure_consumer(
        js, subjects.facts_stream, spec, ConsumerSettings(max_ack_pending=4096)
    )
    return await js.pull_subscribe_bind(durable=name, stream=subjects.facts_stream)


async def _run_floor(target: BenchTarget, subjects: Subjects, facts: int, name: str) -> float:
    nc = await nats.connect(target.nats_url)
    pool = await asyncpg.create_pool(target.database_url, min_size=1, max_size=2)
    try:
        sub = await _bare_consumer(nc.jetstream(), subjects, name)
        done = 0
        started = time.perf_counter()
        while done < facts:
            msgs = await sub.fetch(BATCH, timeout=1.0)
            rows = [json.loads(m.data) for m in msgs]
            async with pool.acquire() as conn:
                await conn.execute(
                    FENCED_WRITE,
                    [r["node_id"] for r in rows],
                    [r["epoch"] for r in rows],
                    [r["observed_generation"] for r in rows],
                )
            for msg in msgs:
                await msg.ack()
            done += len(msgs)
        await nc.flush()
        return facts / (time.perf_counter() - started)
    finally:
        await pool.close()
        await nc.close()


async def _run_naive(target: BenchTarget, subjects: Subjects, facts: int, name: str) -> float:
    nc = await nats.connect(target.nats_url)
    conn = await asyncpg.connect(target.database_url)
    try:
        sub = await _bare_consumer(nc.jetstream(), subjects, name)
        done = 0
        started = time.perf_counter()
        while done < facts:
            msgs: list[Msg] = await sub.fetch(BATCH, timeout=1.0)
            for msg in msgs:
                row = json.loads(msg.data)
                async with conn.transaction():
                    await conn.execute(
                        "UPDATE node_sessions SET observed_generation = GREATEST(observed_generation, $3) "
                        "WHERE node_id = $1 AND session_epoch = $2",
                        row["node_id"],
                        row["epoch"],
                        row["observed_generation"],
                    )
                await msg.ack_sync()
            done += len(msgs)
        return facts / (time.perf_counter() - started)
    finally:
        await conn.close()
        await nc.close()


async def _run_runtime(
    target: BenchTarget,
    subjects: Subjects,
    facts: int,
    name: str,
    relay_in_process: bool,
    publishes: bool = True,
    inbox: bool = False,
) -> tuple[float, float, float]:
    """Facts/s until the last fact is acked, and until its outbox rows are published too;
    and the CPU seconds the relay process spent outside the run — starting and stopping
    (0 for a relay in this process).

    The relay runs in this process (as in a default deployment) or in a `bcw run relay`
    process of its own (the deployment for the highest throughput).
    """
    published: set[uuid.UUID] = set()
    handle = publishing_handler(published) if publishes else _write_only
    worker = Worker(name=name, fact_types=("status",), handle=handle, inbox=inbox)
    settings = ConsumerSettings(batch_size=BATCH, max_ack_pending=4096)
    before = children_cpu_seconds()
    relay_process = None if relay_in_process else await spawn_relay(target)
    starting = at_end = 0.0 if relay_process is None else cpu_seconds(relay_process.pid)
    try:
        consumed, relayed = await consume_and_relay(
            target, worker, facts, settings, drain=True, relay=relay_in_process
        )
        if relay_process is not None:
            at_end = cpu_seconds(relay_process.pid)
    finally:
        if relay_process is not None:
            relay_process.send_signal(signal.SIGTERM)
            await relay_process.wait()
    if publishes and len(published) != facts:  # else the pipelines would not compare
        raise RuntimeError(f"{len(published)} of {facts} facts published a message, not each")
    # the relay's whole life, less its work during the run: its start and its stop
    outside = children_cpu_seconds() - before - (at_end - starting) if relay_process else 0.0
    return facts / consumed, facts / relayed, outside


async def _settle_database(target: BenchTarget) -> None:
    conn = await asyncpg.connect(target.database_url)
    try:
        # every pipeline moves every row forward from the same start
        await conn.execute(
            "UPDATE node_sessions SET observed_generation = 0 WHERE node_id LIKE 'bench-%'"
        )
        await conn.execute("VACUUM ANALYZE node_sessions")
        await conn.execute("CHECKPOINT")
    finally:
        await conn.close()


#: (`--parts`) the runtime of (a') taken apart: with an inbox as well (as a worker whose
#: effects are not idempotent by themselves keeps), and its write without the message
PARTS = {
    "a1i": ("(a') with an inbox as well", {"inbox": True}),
    "a1n": ("(a') writing only: no message", {"publishes": False}),
}


async def run(
    settings: Settings,
    facts: int,
    embedded: bool,
    rounds: int = 3,
    sync_always: bool = False,
    parts: bool = False,
) -> int:
    """Each pipeline `rounds` times (each round a fresh durable consumer over the same
    facts, the pipelines' order rotated, the table vacuumed before each); medians are
    printed, so one noisy round on a shared machine does not decide. `parts`: (a') taken
    apart too (`PARTS`)."""
    results: dict[str, list[float]] = {
        k: [] for k in ("a", "a_relayed", "a1", "a1_relayed", "b", "c", *(PARTS if parts else ()))
    }
    spent: dict[str, list[CpuSpent]] = {
        k: [] for k in ("a", "a1", "b", "c", *(PARTS if parts else ()))
    }
    async with bench_target(settings, embedded, sync_always) as target:
        subjects = Subjects(target.subject_root)
        print(f"publishing {facts} status facts over {NODES} nodes ...")
        await _prepare(target, subjects, facts)
        heap.settle()  # (a') runs here as in a worker process: `bcw run` does the same

        async def a(i: int) -> float:
            rate, relayed, outside = await _run_runtime(
                target, subjects, facts, f"bench-a-{i}", False
            )
            results["a"].append(rate)
            results["a_relayed"].append(relayed)
            return outside

        async def a1(i: int) -> float:
            rate, relayed, _ = await _run_runtime(target, subjects, facts, f"bench-a1-{i}", True)
            results["a1"].append(rate)
            results["a1_relayed"].append(relayed)
            return 0.0

        async def b(i: int) -> float:
            results["b"].append(await _run_floor(target, subjects, facts, f"bench-b-{i}"))
            return 0.0

        async def c(i: int) -> float:
            results["c"].append(await _run_naive(target, subjects, facts, f"bench-c-{i}"))
            return 0.0

        def part(key: str) -> Callable[[int], Awaitable[float]]:
            async def one(i: int) -> float:
                rate, _, _ = await _run_runtime(
                    target, subjects, facts, f"bench-{key}-{i}", True, **PARTS[key][1]
                )
                results[key].append(rate)
                return 0.0

            return one

        pipelines: list[tuple[str, Callable[[int], Awaitable[float]]]]
        pipelines = [("a", a), ("a1", a1), ("b", b), ("c", c)]
        pipelines += [(key, part(key)) for key in PARTS if parts]
        for i in range(rounds):
            turn = i % len(pipelines)
            for key, pipeline in pipelines[turn:] + pipelines[:turn]:
                await _settle_database(target)  # each pipeline starts on a vacuumed table
                before = CpuSpent.now()
                outside = await pipeline(i)  # a relay process's start and stop: not its work
                spent[key].append(CpuSpent.now() - before - CpuSpent(0.0, outside, 0.0, 0.0))
            print(
                f"round {i + 1}/{rounds}: "
                + "  ".join(f"{k}={v[-1]:,.0f}" for k, v in results.items())
            )
    m = {k: statistics.median(v) for k, v in results.items()}
    floor = m["b"]
    print_table(
        f"bcw bench runtime: {facts} facts, fetch batch {BATCH}, median of {rounds} rounds"
        + (", JetStream sync_interval: always" if sync_always else ""),
        ("pipeline", "facts/s", "vs (b)"),
        [
            (
                "(a) runtime, relay process beside it: acked",
                f"{m['a']:,.0f}",
                f"{m['a'] / floor:.2f}",
            ),
            (
                "    ... and its events published",
                f"{m['a_relayed']:,.0f}",
                f"{m['a_relayed'] / floor:.2f}",
            ),
            (
                "(a') runtime, relay in the same process: acked",
                f"{m['a1']:,.0f}",
                f"{m['a1'] / floor:.2f}",
            ),
            (
                "    ... and its events published",
                f"{m['a1_relayed']:,.0f}",
                f"{m['a1_relayed'] / floor:.2f}",
            ),
            ("(b) floor: fetch, one UPDATE per batch, ack", f"{floor:,.0f}", "1.00"),
            (
                "(c) naive: a transaction and an ack per fact",
                f"{m['c']:,.0f}",
                f"{m['c'] / floor:.2f}",
            ),
        ],
    )
    # throughput beside the floor is bound by CPU on a small machine: the target is the CPU
    # a fact costs (below), and against the naive pipeline, throughput (a/c)
    print(
        f"a/b = {m['a'] / floor:.2f}   a'/b = {m['a1'] / floor:.2f}   "
        f"a/c = {m['a'] / m['c']:.2f} (target >= 4)"
    )
    per_round = [a / b for a, b in zip(results["a"], results["b"], strict=True)]
    print("a/b per round (same round, same load): " + ", ".join(f"{r:.2f}" for r in per_round))
    per_fact = _print_costs(spent, facts, floor)
    print(cpu_ratios(per_fact))
    print(cpu_ratios_per_round(spent))
    if parts:
        print(what_parts_cost(per_fact))
    return 0


def _print_costs(spent: Mapping[str, list[CpuSpent]], facts: int, floor: float) -> dict[str, float]:
    """Each pipeline's CPU per fact (medians of its rounds) and the rate it allows here;
    returns each pipeline's CPU seconds per fact, all processes together."""
    labels = [("a", "(a)"), ("a1", "(a')"), ("b", "(b)"), ("c", "(c)")]
    labels += [(key, PARTS[key][0]) for key in PARTS if key in spent]
    cores = os.cpu_count() or 1
    header, rows, totals = cost_rows(spent, facts, floor, labels, cores)
    print_table(
        f"CPU µs per fact (medians) and the most facts/s that allows on {cores} cores",
        header,
        rows,
    )
    return totals
