"""`bcw bench soak --minutes N`: the five workers, each in a process of its own, under
continuous churn, watched for what grows with time.

The churn is the simulator's, round after round on a fleet of its own (its clock moved,
on the bench's own database): commands for every node, BUSY daemons, lost journals, a
clone quarantined, a gateway lost and back. Every few seconds each worker process is
sampled: resident memory, open file descriptors, its connections to PostgreSQL and to
NATS. The figures: per process, memory at start, after the warm-up and at the end, its
slope after the warm-up (least squares, MiB per hour), descriptors and connections at
start and end, and the warnings and errors it logged. Exit 1 when a slope after the
warm-up exceeds the bound, or anything was dead-lettered.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import nats

from schemas.subjects import Subjects
from workers.bench.common import (
    bench_target,
    print_table,
    spawn_workers,
    stop_workers,
    wait_until,
    worker_env,
    workers_bound,
)
from workers.bench.costs import memory_mib
from workers.demo.run import fresh_sweep_history
from workers.runtime.base import heap
from workers.settings import Settings
from workers.sim import Simulator
from workers.sim.scenarios import busy, clone, commands_done, gateway_loss, journal_loss, power_on

SAMPLE_SECONDS = 5.0

#: The workers' settings for a fleet whose time runs up to 10x faster (as `bcw demo`'s).
FAST_FLEET = {
    "BCW_LOG_FORMAT": "json",
    "BCW_DATABASE_POOL_MAX": "10",
    "BCW_CONSUMER_ACK_WAIT": "30",
    "BCW_OUTBOX_POLL_SECONDS": "0.5",
    "BCW_LIVENESS_SWEEP_INTERVAL": "0.5",
    "BCW_REPLAY_DISPATCH_INTERVAL": "0.2",
    "BCW_REPLAY_LEASE_TTL": "15",
}


@dataclass(frozen=True)
class Sample:
    at: float  # seconds since the workers were ready
    rss_mib: float
    fds: int
    postgres: int  # connections to PostgreSQL
    nats: int


@dataclass(frozen=True)
class Figures:
    """What one process did over the run. Built by `figures_of`; pure data."""

    name: str
    rss_start: float
    rss_warm: float
    rss_end: float
    slope: float  # MiB per hour after the warm-up
    fds: tuple[int, int]
    postgres: tuple[int, int]
    nats: tuple[int, int]
    warnings: int
    errors: int


def slope_per_hour(points: Sequence[tuple[float, float]]) -> float:
    """The least-squares slope of (seconds, MiB) points, in MiB per hour; 0 with fewer
    than two distinct times. Pure."""
    if len({t for t, _ in points}) < 2:
        return 0.0
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / spread * 3600


def figures_of(
    name: str, samples: Sequence[Sample], warmup: float, logged: Counter[str]
) -> Figures:
    """One process's figures from its samples (in time order) and its log levels. Pure."""
    warm = [s for s in samples if s.at >= warmup] or list(samples[-1:])
    first, last = samples[0], samples[-1]
    return Figures(
        name=name,
        rss_start=first.rss_mib,
        rss_warm=warm[0].rss_mib,
        rss_end=last.rss_mib,
        slope=slope_per_hour([(s.at, s.rss_mib) for s in warm]),
        fds=(first.fds, last.fds),
        postgres=(first.postgres, last.postgres),
        nats=(first.nats, last.nats),
        warnings=logged["warning"],
        errors=logged["error"] + logged["critical"] + logged["unparsed"],
    )


def problems(figures: Sequence[Figures], dead_letters: int, max_slope: float) -> list[str]:
    """Why the run fails, one line each; empty when it passes. Pure."""
    found = [
        f"{f.name}: memory grew {f.slope:+.1f} MiB/h after the warm-up (bound {max_slope:g})"
        for f in figures
        if f.slope > max_slope
    ]
    if dead_letters:
        found.append(f"{dead_letters} message(s) dead-lettered")
    return found


def levels(log: Path) -> Counter[str]:
    """How many lines of each level a worker's JSON log holds (`unparsed`: not JSON, such
    as a traceback written before logging was set up)."""
    counted: Counter[str] = Counter()
    with contextlib.suppress(OSError), log.open() as lines:
        for line in lines:
            if not line.strip():
                continue
            try:
                counted[str(json.loads(line).get("level", "unparsed"))] += 1
            except (ValueError, AttributeError):
                counted["unparsed"] += 1
    return counted


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    return inodes


def _remote_ports(inodes: set[str]) -> Counter[int]:
    """Remote ports of the established TCP connections among `inodes`."""
    ports: Counter[int] = Counter()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as rows:
            next(rows, None)
            for row in rows:
                fields = row.split()
                if len(fields) > 9 and fields[9] in inodes and fields[3] == "01":
                    ports[int(fields[2].rsplit(":", 1)[1], 16)] += 1
    return ports


def sample(pid: int, at: float, postgres_port: int, nats_port: int) -> Sample | None:
    """One reading of a live process from /proc; None once it is gone."""
    rss = memory_mib(pid, "VmRSS")
    try:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    if math.isnan(rss):
        return None
    ports = _remote_ports(_socket_inodes(pid))
    return Sample(at, rss, fds, ports[postgres_port], ports[nats_port])


async def _churn(sim: Simulator, until: float) -> tuple[int, Counter[str]]:
    """Rounds of what fleets do, until the monotonic time `until`: (rounds, the checks that
    failed, by name)."""
    rounds, failed = 0, Counter[str]()
    nodes = len(sim.daemons)
    busy_nodes, lost_journals = max(1, nodes // 50), max(1, nodes // 100)
    # clones come from the nodes neither the BUSY nor the journal-loss rounds use: a
    # quarantined node's commands never finish, and those rounds wait for theirs
    clonable = sim.daemons[busy_nodes : nodes - lost_journals - 1]
    while time.monotonic() < until:
        await sim.enqueue(sim.daemons, 1)
        checks = await busy(sim, nodes=busy_nodes)
        checks += await journal_loss(sim, nodes=lost_journals)
        checks += await clone(sim, clonable[rounds % len(clonable)])
        checks += await gateway_loss(sim)
        for gateway in [g for g in sim.gateways if not g.alive]:  # the one it lost: back
            await sim.revive(gateway)
        await commands_done(sim, within=60)
        rounds += 1
        failed.update(c.name for c in checks if not c.ok)
        if not all(gateway.alive for gateway in sim.gateways):
            failed["every gateway up after the round"] += 1
    return rounds, failed


async def run(
    settings: Settings,
    minutes: float,
    nodes: int,
    gateways: int,
    embedded: bool,
    max_slope: float,
    warmup_minutes: float | None,
    heap: bool = False,
) -> int:
    warmup = 60 * (minutes / 3 if warmup_minutes is None else warmup_minutes)
    logs = Path(tempfile.mkdtemp(prefix="bcw-soak-"))
    every = max(1.0, min(60.0, minutes * 3))  # a minute; 20 snapshots in a short run
    traced = {"BCW_HEAP_SNAPSHOTS": str(logs / "heap"), "BCW_HEAP_SNAPSHOT_EVERY": f"{every:g}"}
    async with bench_target(settings, embedded) as target:
        subjects = Subjects(target.subject_root)
        ports = (urlsplit(target.database_url).port or 5432, urlsplit(target.nats_url).port or 4222)
        procs = await spawn_workers(
            {**worker_env(target), **FAST_FLEET, **(traced if heap else {})}, logs
        )
        nc = await nats.connect(target.nats_url)
        pool = await asyncpg.create_pool(target.database_url, min_size=2, max_size=8)
        samples: dict[str, list[Sample]] = {name: [] for name in procs}
        sim = Simulator(pool, nc, subjects, nodes=nodes, gateways=gateways, prefix="soak")
        try:
            await wait_until(lambda: workers_bound(nc.jetstream(), subjects), within=60)
            ready = time.monotonic()

            async def watch() -> None:
                while True:
                    for name, proc in procs.items():
                        reading = sample(proc.pid, time.monotonic() - ready, *ports)
                        if reading is not None:
                            samples[name].append(reading)
                    await asyncio.sleep(SAMPLE_SECONDS)

            watching = asyncio.create_task(watch())
            await fresh_sweep_history(pool)
            await sim.start()
            print(f"soak: {nodes} nodes over {gateways} gateways for {minutes:g} min ...")
            power_checks = await power_on(sim)
            rounds, failed = await _churn(sim, ready + 60 * minutes)
            failed.update(c.name for c in power_checks if not c.ok)
            await asyncio.sleep(SAMPLE_SECONDS)  # a last reading after the churn
            watching.cancel()
            dead = await sim.dead_letters()
        finally:
            await sim.stop()
            await stop_workers(procs)
            await pool.close()
            await nc.close()
    figures = [
        figures_of(name, samples[name], warmup, levels(logs / f"{name}.log"))
        for name in sorted(procs)
        if samples[name]
    ]
    _print(figures, minutes, warmup, rounds, sum(failed.values()), dead, logs)
    _print_memory(samples, minutes)
    if heap:
        _print_heap({name: proc.pid for name, proc in procs.items()}, logs / "heap", warmup)
    for name, times in sorted(failed.items()):
        print(f"failed check: {name} ({times} round(s))")
    found = problems(figures, dead, max_slope)
    for line in found:
        print(f"FAIL {line}")
    return 1 if found else 0


def _print(
    figures: Sequence[Figures],
    minutes: float,
    warmup: float,
    rounds: int,
    failed: int,
    dead: int,
    logs: Path,
) -> None:
    rows = [
        (
            f.name,
            f"{f.rss_start:.1f} / {f.rss_warm:.1f} / {f.rss_end:.1f}",
            f"{f.slope:+.1f}",
            f"{f.fds[0]} -> {f.fds[1]}",
            f"{f.postgres[0]} -> {f.postgres[1]}",
            f"{f.nats[0]} -> {f.nats[1]}",
            f"{f.warnings} / {f.errors}",
        )
        for f in figures
    ]
    print_table(
        f"bcw bench soak: {minutes:g} min, warm-up {warmup / 60:.1f} min, {rounds} churn rounds "
        f"({failed} failed checks), {dead} dead-lettered; logs in {logs}",
        (
            "process",
            "RSS MiB start / warm / end",
            "MiB/h after warm-up",
            "fds",
            "PostgreSQL conns",
            "NATS conns",
            "warnings / errors",
        ),
        rows,
    )


def _print_memory(samples: dict[str, list[Sample]], minutes: float) -> None:
    """Each process's memory at every sixth of the run: whether growth slows or goes on."""
    marks = [minutes * 60 * i / 6 for i in range(7)]
    rows = []
    for name in sorted(samples):
        if not samples[name]:
            continue
        at = [_nearest(samples[name], mark) for mark in marks]
        rows.append((name, *(f"{s.rss_mib:.1f}" for s in at)))
    print_table(
        "RSS MiB over the run",
        ("process", *(f"{mark / 60:.0f} min" for mark in marks)),
        rows,
    )


def _nearest(samples: Sequence[Sample], at: float) -> Sample:
    return min(samples, key=lambda sample: abs(sample.at - at))


def _print_heap(pids: dict[str, int], snapshots: Path, warmup: float) -> None:
    """Per worker, what its traced heap gained from the first snapshot after the warm-up
    to its last one (`bcw heap diff`)."""
    files = heap.snapshot_files(snapshots)
    for name, pid in sorted(pids.items()):
        taken = files.get(pid, [])
        warm = [path for path in taken if heap.snapshot_age(path) >= warmup]
        if len(warm) < 2:
            print(f"{name}: fewer than two heap snapshots after the warm-up")
            continue
        total, places = heap.growth(warm[0], warm[-1], top=5)
        hours = (heap.snapshot_age(warm[-1]) - heap.snapshot_age(warm[0])) / 3600
        print(
            f"{name}: traced heap {total / 1024 / hours:+,.0f} KiB/h after the warm-up "
            f"({warm[0].name} → {warm[-1].name})"
        )
        for place in places:
            at = max(i for i, frame in enumerate(place.stack) if frame == place.where)
            inner = f" -> {place.stack[-1]}" if at < len(place.stack) - 1 else ""
            callers = "".join(
                f" <- {frame}" for frame in reversed(place.stack[max(0, at - 3) : at])
            )
            print(
                f"  {place.size_diff / 1024:+9,.1f} KiB {place.count_diff:+7,d} blocks  "
                f"{place.where}{inner}{callers}"
            )
