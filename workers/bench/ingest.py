"""`bcw bench ingest`: what each gateway's own facts stream costs (`BCW_NATS_FACTS_GATEWAYS`,
docs/kubernetes.md) against one facts stream shared by every gateway, for the same facts.

Each round provisions both layouts under fresh subject roots, in alternating order, and
publishes N liveness flushes (100 entries each, as a gateway's flush of 100 sessions) from
G gateways, pipelined. It times them until the facts stream (what the workers consume)
holds every one — sourced, in the second layout — and prints, per layout (medians): facts
stored a second, the CPU per fact of the nats-server serving BCW_NATS_URL (when it runs on
this machine), and the bytes stored per fact over every facts stream (the second layout
keeps each fact twice).
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
import uuid
from datetime import UTC, datetime

import nats

from schemas import Liveness
from schemas.facts import LivenessEntry
from schemas.subjects import Subjects
from workers.bench.common import BenchTarget, bench_target, print_table, publish_facts, wire
from workers.bench.costs import cpu_seconds, nats_server_pid
from workers.runtime.bus import streams
from workers.settings import Settings

ENTRIES = 100
LAYOUTS = ("one stream", "own streams")


def _flushes(
    subjects: Subjects, facts: int, gateways: int
) -> list[tuple[str, bytes, dict[str, str]]]:
    """`facts` flushes, gateway by gateway in turn, each of `ENTRIES` sessions."""
    now = datetime.now(UTC)
    out = []
    for i in range(facts):
        gateway = f"gw-{i % gateways}"
        entries = [
            LivenessEntry(node_id=f"{gateway}-node-{n}", epoch=1, age_ms=1000 + n)
            for n in range(ENTRIES)
        ]
        flush = Liveness(fact_id=uuid.uuid4(), gateway_id=gateway, observed_at=now, entries=entries)
        out.append(wire(subjects, flush))
    return out


async def _one_run(
    target: BenchTarget, layout: str, facts: int, gateways: int, tag: str
) -> tuple[float, float, float]:
    """(facts/s until the facts stream holds them all, nats-server CPU µs per fact, bytes
    stored per fact over every facts stream) for one layout, on a fresh subject root."""
    subjects = Subjects(f"{target.subject_root}{tag}")
    ids = tuple(f"gw-{g}" for g in range(gateways)) if layout == "own streams" else ()
    limits = streams.StreamLimits(gateways=ids, per_gateway=2**30)
    nc = await nats.connect(target.nats_url)
    try:
        js = nc.jetstream()
        await streams.provision_streams(js, subjects, limits=limits)
        messages = _flushes(subjects, facts, gateways)
        server = nats_server_pid(target.nats_url)  # None: a server elsewhere, not measured
        before, started = cpu_seconds(server) if server else math.nan, time.monotonic()
        await publish_facts(target.nats_url, messages)
        for _ in range(30_000):  # 10 minutes at most
            if (await js.stream_info(subjects.facts_stream)).state.messages >= facts:
                break
            await asyncio.sleep(0.02)
        else:
            raise RuntimeError(f"{layout}: the facts stream never held the {facts} facts")
        seconds = time.monotonic() - started
        spent = (cpu_seconds(server) if server else math.nan) - before
        names = [subjects.facts_stream, *map(subjects.gateway_facts_stream, ids)]
        stored = sum([(await js.stream_info(name)).state.bytes for name in names])
        for config in streams.stream_configs(subjects, limits=limits):
            await js.delete_stream(str(config.name))
        return facts / seconds, spent / facts * 1e6, stored / facts
    finally:
        await nc.close()


async def run(settings: Settings, facts: int, gateways: int, embedded: bool, rounds: int) -> int:
    print(f"ingest: {facts} flushes of {ENTRIES} entries from {gateways} gateways, {rounds} rounds")
    results: dict[str, list[tuple[float, float, float]]] = {layout: [] for layout in LAYOUTS}
    async with bench_target(settings, embedded) as target:
        for round_ in range(rounds):
            order = LAYOUTS if round_ % 2 == 0 else LAYOUTS[::-1]
            for n, layout in enumerate(order):
                results[layout].append(
                    await _one_run(target, layout, facts, gateways, f"r{round_}l{n}")
                )
    rows = []
    for layout in LAYOUTS:
        rate, cpu, size = (statistics.median(r[i] for r in results[layout]) for i in range(3))
        cpu_text = f"{cpu:,.0f}" if math.isfinite(cpu) else "n/a"
        rows.append((layout, f"{rate:,.0f}", cpu_text, f"{size:,.0f}"))
    print_table("medians", ("layout", "facts/s stored", "nats-server µs/fact", "bytes/fact"), rows)
    one, own = (statistics.median(r[0] for r in results[layout]) for layout in LAYOUTS)
    print(f"each gateway's own stream: {own / one:.2f}x the facts/s of one stream")
    return 0
