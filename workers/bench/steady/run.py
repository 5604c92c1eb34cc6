"""`bcw bench steady`: N connected nodes held for M minutes by G simulated gateways
flushing every flush period, the liveness controller in `bcw run liveness` processes.

At minute 2 a share S of the nodes (the same share of every gateway's) stops being
flushed: they, and only they, must be disconnected, within the stale threshold plus two
sweeps. Every minute one line: the flush lag (a flush fact's publish to its commit seen
in the liveness inbox, polled every half second), the slowest sweep (read from each
liveness process's `bcw_liveness_sweep_seconds`, once a second: the sum of a sweep that
ended), gateways reported blind, `node.disconnected` expected and wrong, CPU cores per
process, the session tables' sizes, and every process's RSS. Then one line of what
reading the last sights took (`sightread`: the whole fleet's and one node's, through
`node_last_seen`). The last line is the run's summary; exit 1 when a bound of
`figures.Bounds` is broken.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import socket
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import nats
from nats.aio.msg import Msg

from schemas import REGISTRY
from schemas.subjects import Subjects
from workers.bench.common import (
    bench_target,
    spawn_workers,
    stop_workers,
    wait_until,
    worker_env,
    workers_bound,
)
from workers.bench.costs import (
    cpu_seconds,
    memory_mib,
    nats_server_pid,
    postgres_rss_mib,
    servers_cpu_seconds,
)
from workers.bench.steady import fleet, sightread
from workers.bench.steady.figures import Minute, Starved, problems, summarize
from workers.bench.steady.starve import Starving, starve
from workers.liveness.sight import switched_on
from workers.settings import Settings

#: the facts stream keeps a fact this long in the run (a day of a million nodes' flushes
#: is ~1 TB; docs/capacity.md)
FACTS_MAX_AGE = 300.0
SILENCE_AT_MINUTE = 2
#: the embedded PostgreSQL's shared buffers: the session table whole (~1 KiB a session
#: with its free room, docs/capacity.md), as a primary for a fleet this size is given;
#: with 256 MB the sweep's scan read 400,000 sessions back from the OS and wrote out the
#: pages the flushes had dirtied (0.3 to 0.8 s a scan)
SHARED_BUFFERS = "2GB"
#: the sweep holds age transitions this long after the sessions are made (as after an
#: outage), while every gateway's first flush arrives
START_GRACE = "1 minute"

#: the session tables (the range rows too: a flush's rows since 0.4), their indexes and
#: TOAST (named after their table)
SIZES = """
WITH t(oid) AS (VALUES ('node_sessions'::regclass), ('liveness_gateways'::regclass),
                       ('liveness_ranges'::regclass))
SELECT coalesce((SELECT o.relname || '_toast' FROM pg_class o WHERE o.reltoastrelid = c.oid),
                c.relname) AS relname,
       pg_relation_size(c.oid) AS bytes
  FROM pg_class c
 WHERE c.oid IN (SELECT oid FROM t)
    OR c.oid IN (SELECT reltoastrelid FROM pg_class WHERE oid IN (SELECT oid FROM t))
    OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid IN (SELECT oid FROM t))
 ORDER BY 1
"""
UPDATES = """
SELECT n_tup_upd, n_tup_hot_upd, n_dead_tup, (SELECT wal_bytes FROM pg_stat_wal) AS wal
  FROM pg_stat_user_tables WHERE relname = 'node_sessions'
"""
# the silenced nodes disconnected within `$2` seconds of when the controller could judge
# them: their last sight, when their gateway (`gw-<i mod G>`) was last seen again, the end
# of an outage grace — the latest
IN_TIME = """
SELECT count(*)
  FROM node_sessions s
  LEFT JOIN unnest($3::text[], $4::timestamptz[]) AS g(gateway_id, seen_again)
    ON g.gateway_id = 'gw-' || (substr(s.node_id, 6)::bigint % $5)
 WHERE s.node_id = ANY($1::text[]) AND s.gateway_id IS NULL
   AND s.disconnected_at - greatest(s.last_seen, g.seen_again,
                                    (SELECT grace_until FROM liveness_sweeps))
       <= $2 * interval '1 second'
"""
# the flush facts not yet seen applied, by the key: never a scan of the minute's inbox
# (in a rollout it holds every Hello's too, and read so it was a tenth of the database's
# CPU a Hello)
INBOX = """
SELECT fact_id FROM processed_facts WHERE consumer = 'liveness' AND fact_id = ANY($1::uuid[])
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: what the run reads of each liveness process's metrics
SCRAPED = (
    "bcw_liveness_sweep_seconds_sum",
    "bcw_liveness_sweep_seconds_count",
    'bcw_liveness_held_sessions{reason="lag"}',
)


async def _scrape(port: int) -> dict[str, float]:
    """The `SCRAPED` samples on a process's metrics port (none, from a stopped process)."""
    try:
        async with asyncio.timeout(2.0):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            body = (await reader.read()).decode(errors="replace")
            writer.close()
    except (OSError, TimeoutError):
        return {}
    found = {}
    for line in body.splitlines():
        name, _, value = line.rpartition(" ")
        if name in SCRAPED:
            found[name] = float(value)
    return found


class Watch:
    """What the run sees as it goes: lags, sweeps, disconnections, sight."""

    def __init__(self) -> None:
        self.published: dict[uuid.UUID, float] = {}
        self.lags: list[float] = []
        self.sweeps: list[float] = []
        self.quiet: set[str] = set()
        self.expected: set[str] = set()
        self.wrong: set[str] = set()
        self.blind: set[str] = set()  # gateways said blind, ever
        self.blind_now: set[str] = set()  # and not said seen again since
        self.seen_again: dict[str, float] = {}  # gateway → when last said seen again
        self.held_for_lag = 0.0  # the most sessions held for lag at once (the sweeper's)

    def publish(self, fact_id: uuid.UUID, at: float) -> None:
        self.published[fact_id] = at

    async def inbox(self, conn: asyncpg.Connection) -> None:
        """Each flush fact's commit, as it becomes visible in the liveness inbox."""
        while True:
            seen = time.time()
            for row in await conn.fetch(INBOX, list(self.published)):
                at = self.published.pop(row["fact_id"], None)
                if at is not None:
                    self.lags.append(max(0.0, seen - at))
            await asyncio.sleep(0.5)

    async def sweeps_of(self, ports: list[int]) -> None:
        last: dict[int, tuple[float, float]] = {}
        while True:
            for port in ports:
                found = await _scrape(port)
                self.held_for_lag = max(self.held_for_lag, found.get(SCRAPED[2], 0.0))
                if SCRAPED[0] not in found or SCRAPED[1] not in found:
                    continue
                now = (found[SCRAPED[0]], found[SCRAPED[1]])
                before = last.get(port)
                if before is not None and now[1] > before[1]:
                    self.sweeps.append(now[0] - before[0])  # one sweep, or an upper bound
                last[port] = now
            await asyncio.sleep(1.0)

    async def event(self, msg: Msg) -> None:
        event = REGISTRY.decode(msg.headers, msg.data)
        if event.BC_TYPE == "gateway.blind":
            self.blind.add(event.gateway_id)  # type: ignore[attr-defined]
            self.blind_now.add(event.gateway_id)  # type: ignore[attr-defined]
            return
        if event.BC_TYPE == "gateway.seeing":
            self.blind_now.discard(event.gateway_id)  # type: ignore[attr-defined]
            self.seen_again[event.gateway_id] = time.time()  # type: ignore[attr-defined]
            return
        node = event.node_id  # type: ignore[attr-defined]
        (self.expected if node in self.quiet else self.wrong).add(node)


async def run(
    settings: Settings,
    nodes: int,
    gateways: int,
    minutes: int,
    share: float,
    replicas: int,
    embedded: bool,
    starve_fraction: float = 1.0,
    starve_seconds: float = 150.0,
) -> int:
    period = settings.liveness.flush_period.total_seconds()
    server = {"shared_buffers": SHARED_BUFFERS}
    async with bench_target(
        settings, embedded, facts_max_age=FACTS_MAX_AGE, postgres=server
    ) as target:
        subjects = Subjects(target.subject_root)
        conn = await asyncpg.connect(target.database_url)
        print(f"making {nodes:,} sessions on {gateways} gateways ...", flush=True)
        ranged = await switched_on(conn, settings.liveness.range_sight)  # as its workers will
        await fleet.prepare(conn, nodes, gateways, ranged)
        await conn.execute("VACUUM (ANALYZE) node_sessions")
        await conn.execute("CHECKPOINT")
        await conn.execute(
            "UPDATE liveness_sweeps SET last_sweep_at = compute_now(), "
            f"grace_until = compute_now() + interval '{START_GRACE}'"
        )
        logs = Path(tempfile.mkdtemp(prefix="bcw-steady-"))
        ports = [_free_port() for _ in range(replicas)]
        procs: dict[str, asyncio.subprocess.Process] = {}
        for k, port in enumerate(ports):
            env = {**worker_env(target), "BCW_HEALTH_PORT": str(port)}
            name = f"liveness-{k + 1}"
            spawned = await spawn_workers(env, logs, names=["liveness"], tag=f"{k + 1}-")
            procs[name] = spawned["liveness"]
        nc = await nats.connect(target.nats_url, pending_size=256 * 2**20)
        js = nc.jetstream()
        watch = Watch()
        for kind in ("node.disconnected", "gateway.blind", "gateway.seeing"):
            await nc.subscribe(subjects.event(kind), cb=watch.event)
        stopping = asyncio.Event()
        tasks: list[asyncio.Task[object]] = []
        try:
            await wait_until(lambda: workers_bound(js, subjects, ["liveness"]), within=60)
            sims = [fleet.Gateway(g, nodes, gateways, subjects) for g in range(gateways)]
            start = time.monotonic()
            tasks += [
                asyncio.create_task(
                    fleet.flushing(
                        js, gw, period, start + period * g / gateways, stopping, watch.publish
                    )
                )
                for g, gw in enumerate(sims)
            ]
            watcher = await asyncpg.connect(target.database_url)
            tasks += [
                asyncio.create_task(watch.inbox(watcher)),
                asyncio.create_task(watch.sweeps_of(ports)),
            ]
            starving = Starving(starve_fraction, starve_seconds, start + 60 * SILENCE_AT_MINUTE)
            pids = [proc.pid for proc in procs.values()]
            tasks.append(asyncio.create_task(starve(pids, starving)))
            print(
                f"holding {nodes:,} nodes: {gateways} gateways flushing every {period:g} s, "
                f"{replicas} liveness process(es)"
                f"{', sight by range rows' if ranged else ''}; "
                f"{share:.1%} silenced at minute "
                f"{SILENCE_AT_MINUTE} (logs: {logs})",
                flush=True,
            )
            streams = (js, subjects.facts_stream)
            lines = await _minutes(
                conn, procs, target.nats_url, streams, watch, sims, share, gateways, minutes, start
            )
            read = await sightread.measure(conn, nodes, settings.liveness.stale_after)
            print(read.line(), flush=True)  # a line of its own: the last line's format is fixed
        finally:
            stopping.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await stop_workers(procs)
            await nc.close()
        bound = settings.liveness.stale_after.total_seconds() + 2 * settings.liveness.sweep_interval
        # judged from its last sight, or from when its gateway was seen again after being
        # blind (the controller could not judge it before), or from the end of an outage
        # grace the starving started: whichever came last
        seen_again = sorted(watch.seen_again.items())
        in_time = await conn.fetchval(
            IN_TIME,
            sorted(watch.quiet),
            bound,
            [gw for gw, _ in seen_again],
            [datetime.fromtimestamp(at, UTC) for _, at in seen_again],
            gateways,
        )
        wrong = await conn.fetchval(
            "SELECT count(*) FROM node_sessions WHERE gateway_id IS NULL AND node_id <> ALL($1::text[])",
            sorted(watch.quiet),
        )
        await conn.close()
    summary = summarize(
        nodes,
        lines,
        in_time,
        len(watch.quiet),
        held_for_lag=int(watch.held_for_lag),
        starved=_starved(starve_fraction, watch, starving),
    )
    if wrong > summary.wrong:  # a disconnect the events did not say (or not yet)
        summary = dataclasses.replace(summary, wrong=wrong)
    broken = problems(summary)
    for line in broken:
        print(f"BOUND BROKEN: {line}")
    for line in summary.notes:
        print(line)
    print(summary.last_line())
    return 1 if broken else 0


def _starved(fraction: float, watch: Watch, starving: Starving) -> Starved | None:
    """What the starving did, once it is over (None: there was none)."""
    if fraction >= 1.0:
        return None
    ended = time.time() - (time.monotonic() - starving.until)  # on the wall clock
    again = [watch.seen_again.get(gw, math.inf) for gw in watch.blind]
    recovered = max(again, default=ended) - ended
    return Starved(
        fraction=fraction,
        seconds=starving.seconds,
        blind_during=len(watch.blind),
        blind_at_end=len(watch.blind_now),
        recovered=max(0.0, recovered) if math.isfinite(recovered) else None,
    )


async def _stream_bytes(js: nats.js.JetStreamContext, stream: str) -> float:
    try:
        return float((await js.stream_info(stream)).state.bytes)
    except Exception:
        return math.nan


async def _minutes(
    conn: asyncpg.Connection,
    procs: dict[str, asyncio.subprocess.Process],
    nats_url: str,
    streams: tuple[nats.js.JetStreamContext, str],
    watch: Watch,
    sims: list[fleet.Gateway],
    share: float,
    gateways: int,
    minutes: int,
    start: float,
) -> list[Minute]:
    nats_pid = nats_server_pid(nats_url)

    def cpu() -> dict[str, float]:
        servers = servers_cpu_seconds()
        spent = {"postgres": servers["postgres"], "nats-server": servers["nats-server"]}
        spent |= {name: cpu_seconds(proc.pid) for name, proc in procs.items()}
        return spent | {"gateways": time.process_time()}

    lines: list[Minute] = []
    before, updates_before = cpu(), await conn.fetchrow(UPDATES)
    for minute in range(1, minutes + 1):
        await asyncio.sleep(max(0.0, start + 60 * minute - time.monotonic()))
        if minute == SILENCE_AT_MINUTE and share > 0:
            for gw in sims:
                watch.quiet.update(gw.silence(share, gateways))
        now, updates = cpu(), await conn.fetchrow(UPDATES)
        moved = updates["n_tup_upd"] - updates_before["n_tup_upd"]
        hot = updates["n_tup_hot_upd"] - updates_before["n_tup_hot_upd"]
        rss = {name: memory_mib(proc.pid, "VmRSS") for name, proc in procs.items()}
        rss |= {"postgres": postgres_rss_mib(), "gateways": memory_mib(os.getpid(), "VmRSS")}
        if nats_pid is not None:
            rss["nats-server"] = memory_mib(nats_pid, "VmRSS")
        lags, watch.lags = watch.lags, []
        sweeps, watch.sweeps = watch.sweeps, []
        line = Minute(
            minute=minute,
            lags=lags,
            sweep_max=max(sweeps, default=math.nan),
            blind=len(watch.blind),
            expected=len(watch.expected),
            wrong=len(watch.wrong),
            cores={k: (now[k] - before.get(k, now[k])) / 60 for k in now},
            sizes={r["relname"]: r["bytes"] for r in await conn.fetch(SIZES)},
            rss=rss,
            hot=hot / moved if moved else math.nan,
            dead=updates["n_dead_tup"],
            wal=float(updates["wal"] - updates_before["wal"]) / 60,
            stream=await _stream_bytes(*streams),
        )
        print(line.line(), flush=True)
        lines.append(line)
        before, updates_before = now, updates
    return lines
